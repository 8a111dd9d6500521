"""Operations API (issue 8): hosts by verdict for schedulers, drains, the drain audit trail,
per-key rate limits, ``/healthz``, ``/metrics`` and the archived weekly reports."""

from __future__ import annotations

import hmac

from django.contrib.auth.decorators import login_required
from django.db import connection
from django.http import FileResponse, Http404, HttpResponse, JsonResponse
from django.shortcuts import get_object_or_404, render
from django.views.decorators.http import require_GET
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import generics, serializers
from rest_framework.exceptions import ValidationError
from rest_framework.response import Response
from rest_framework.views import APIView

from analysis.api.serializers import HostHealthSerializer
from analysis.models import DrainAction, WeeklyReport
from fleet import drain
from fleet.models import Host
from ingest.auth import CanOperate, CanRead
from ingest.models import AgentKey

VERDICTS = ("ok", "watch", "drain")


def _by(request) -> str:
    if isinstance(request.auth, AgentKey):
        return f"key:{request.auth.prefix}"
    return getattr(request.user, "username", "") if request.user else ""


# --- hosts by verdict ------------------------------------------------------------------------


class HostHealthListSerializer(serializers.Serializer):
    count = serializers.IntegerField()
    verdicts = serializers.DictField(child=serializers.IntegerField())
    results = HostHealthSerializer(many=True)


class HealthListView(APIView):
    """Every host's verdict, or only those with ``?verdict=drain`` (or ``watch``, ``ok``):
    what a scheduler polls to keep jobs off bad nodes."""

    permission_classes = [CanRead]

    @extend_schema(
        parameters=[
            OpenApiParameter("verdict", OpenApiTypes.STR, enum=list(VERDICTS), required=False)
        ],
        responses={200: HostHealthListSerializer},
    )
    def get(self, request):
        verdict = request.query_params.get("verdict", "")
        if verdict and verdict not in VERDICTS:
            raise ValidationError({"verdict": [f"one of {', '.join(VERDICTS)}"]})
        every = drain.hosts_health_shared()
        counts = {v: sum(1 for h in every if h.verdict == v) for v in VERDICTS}
        chosen = [h for h in every if not verdict or h.verdict == verdict]
        return Response(
            {
                "count": len(chosen),
                "verdicts": counts,
                "results": [
                    {
                        "hostname": h.hostname,
                        "verdict": h.verdict,
                        "score": h.score,
                        "reasons": h.reasons,
                        "incidents": h.incidents,
                        "since": h.since,
                    }
                    for h in chosen
                ],
            }
        )


# --- drains ----------------------------------------------------------------------------------


class DrainActionSerializer(serializers.ModelSerializer):
    host = serializers.SlugRelatedField(slug_field="hostname", read_only=True)

    class Meta:
        model = DrainAction
        fields = [
            "id",
            "host",
            "action",
            "adapter",
            "dry_run",
            "command",
            "result",
            "output",
            "reason",
            "by",
            "at",
        ]


class DrainRequestSerializer(serializers.Serializer):
    reason = serializers.CharField(max_length=200)


class HostDrainView(APIView):
    """Drain a host through the configured scheduler adapter (dry run unless configured).
    Nodes drained by someone else are left alone; the answer says what happened."""

    permission_classes = [CanOperate]

    @extend_schema(request=DrainRequestSerializer, responses={200: DrainActionSerializer})
    def post(self, request, hostname: str):
        host = get_object_or_404(Host, hostname=hostname)
        form = DrainRequestSerializer(data=request.data)
        form.is_valid(raise_exception=True)
        action = drain.host_drain(host, reason=form.validated_data["reason"], by=_by(request))
        return Response(DrainActionSerializer(action).data)


class DrainActionListView(generics.ListAPIView):
    """The audit trail of drains and resumes, newest first; ``?host=`` narrows it."""

    permission_classes = [CanRead]
    serializer_class = DrainActionSerializer
    filterset_fields = {"action": ["exact"], "result": ["exact"], "dry_run": ["exact"]}

    def get_queryset(self):
        rows = DrainAction.objects.select_related("host")
        host = self.request.query_params.get("host")
        return rows.filter(host__hostname=host) if host else rows

    @extend_schema(
        parameters=[OpenApiParameter("host", OpenApiTypes.STR, required=False)],
    )
    def get(self, request, *args, **kwargs):
        return super().get(request, *args, **kwargs)


# --- load balancers and Prometheus -----------------------------------------------------------


@require_GET
def healthz(request):
    """200 when the database answers, 503 when it does not — nothing else, so it stays cheap."""
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
            cursor.fetchone()
    except Exception as exc:  # any database error means: take this instance out
        return JsonResponse({"status": "error", "database": str(exc)[:200]}, status=503)
    return JsonResponse({"status": "ok", "database": "ok"})


@require_GET
def metrics(request):
    from django.conf import settings

    from fleet.metrics import render

    token = getattr(settings, "FLEETWATCH_METRICS_TOKEN", "")
    if token:
        given = request.headers.get("Authorization", "").removeprefix("Bearer ").strip()
        if not hmac.compare_digest(given.encode(), token.encode()):
            return HttpResponse("metrics need the bearer token\n", status=401)
    body, content_type = render()
    return HttpResponse(body, content_type=content_type)


# --- weekly reports --------------------------------------------------------------------------


@login_required
def report_list(request):
    """The archived weekly reports, newest first, each with its headline and its PDF."""
    rows = WeeklyReport.objects.filter(status=WeeklyReport.Status.READY).defer("html")
    reports = [
        {
            "week": r.week,
            "starts_at": r.starts_at,
            "ends_at": r.ends_at,
            "built_at": r.built_at,
            "rebuilt": len(r.rebuilds or []),
            "incidents": (r.numbers or {}).get("incidents"),
            "gpu_hours_lost": (r.numbers or {}).get("gpu_hours_lost"),
            "headline": ((r.numbers or {}).get("summary") or [""])[0],
            "has_pdf": bool(r.pdf),
        }
        for r in rows
    ]
    return render(request, "fleet/report_list.html", {"reports": reports})


@login_required
def report_page(request, week: str):
    """The archived HTML, exactly as built and mailed (never re-rendered on view)."""
    report = get_object_or_404(WeeklyReport, week=week, status=WeeklyReport.Status.READY)
    return HttpResponse(report.html)


@login_required
def report_pdf(request, week: str):
    report = get_object_or_404(WeeklyReport, week=week, status=WeeklyReport.Status.READY)
    if not report.pdf:
        raise Http404("This report has no PDF")
    return FileResponse(
        report.pdf.open("rb"), content_type="application/pdf", filename=f"{week}.pdf"
    )


# --- OpenAPI: the error answers every endpoint can give ------------------------------------

ERRORS = {
    "400": "Invalid request: fields or filters that do not validate",
    "401": "No key, or an unknown, revoked or expired one",
    "403": "The key lacks the scope this endpoint needs",
    "404": "No such object (or page)",
    "429": "Rate limit for this key exceeded; see Retry-After",
    "503": "The database is unavailable (restarting or unreachable): nothing was done; see "
    "Retry-After",
}
# Any operation with a body: form fields or a JSON body over DATA_UPLOAD_MAX_MEMORY_SIZE.
TOO_LARGE = "Request body (or, for uploads, the file) larger than the limit"


def schema_document_errors(result, generator, request, public):
    """drf-spectacular postprocessing hook: every API operation documents the error answers
    authentication, scopes, rate limits, validation and lookups really give (JSON ``detail``),
    so clients and schemathesis can hold the API to its schema."""
    components = result.setdefault("components", {}).setdefault("schemas", {})
    components.setdefault(
        "ErrorDetail",
        {
            "type": "object",
            "properties": {"detail": {"type": "string"}, "errors": {"type": "object"}},
            "required": ["detail"],
        },
    )
    body = {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorDetail"}}}
    for path, operations in result.get("paths", {}).items():
        if not path.startswith("/api/v1/"):
            continue
        for operation in operations.values():
            responses = operation.setdefault("responses", {})
            for code, description in ERRORS.items():
                responses.setdefault(code, {"description": description, "content": body})
            if "requestBody" in operation:
                responses.setdefault("413", {"description": TOO_LARGE, "content": body})
    return result
