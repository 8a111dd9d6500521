from django.db.models import Count, Prefetch
from django.shortcuts import get_object_or_404
from drf_spectacular.utils import extend_schema
from rest_framework import viewsets
from rest_framework.response import Response
from rest_framework.views import APIView

from analysis import memory
from analysis.api.serializers import (
    CulpritScoreSerializer,
    HostHealthSerializer,
    HostRepairSerializer,
    IncidentSerializer,
)
from analysis.filtersets import IncidentFilterSet
from analysis.models import CulpritScore, Incident
from fleet.models import Host
from ingest.auth import CanOperate
from ingest.models import AgentKey, Upload


class IncidentViewSet(viewsets.ReadOnlyModelViewSet):
    queryset = Incident.objects.select_related("job", "attempt").prefetch_related(
        Prefetch("attempt__uploads", queryset=Upload.objects.select_related("host")),
        "revisions",
    )
    serializer_class = IncidentSerializer
    filterset_class = IncidentFilterSet

    def get_serializer_context(self):
        context = super().get_serializer_context()
        if self.action == "list":
            # One query for the whole page instead of one per incident.
            context["fingerprint_counts"] = dict(
                Incident.objects.exclude(fingerprint="")
                .values_list("fingerprint")
                .annotate(n=Count("id"))
            )
        return context


def _health(host: Host) -> dict:
    health = memory.host_health(host)
    return {
        "hostname": health.hostname,
        "verdict": health.verdict,
        "score": health.score,
        "reasons": health.reasons,
        "incidents": health.incidents,
        "since": health.since,
    }


class HostHealthView(APIView):
    """Is this host healthy? ok / watch / drain, with the reasons and incidents behind it."""

    @extend_schema(responses={200: HostHealthSerializer})
    def get(self, request, hostname: str):
        return Response(_health(get_object_or_404(Host, hostname=hostname)))


class HostRepairedView(APIView):
    """An operator repaired the host: health starts afresh, history is kept."""

    permission_classes = [CanOperate]

    @extend_schema(request=HostRepairSerializer, responses={200: HostHealthSerializer})
    def post(self, request, hostname: str):
        host = get_object_or_404(Host, hostname=hostname)
        form = HostRepairSerializer(data=request.data)
        form.is_valid(raise_exception=True)
        by = (
            f"key:{request.auth.prefix}"
            if isinstance(request.auth, AgentKey)
            else getattr(request.user, "username", "")
        )
        memory.host_repaired(host, note=form.validated_data.get("note", ""), by=by)
        # Undo a drain Fleetwatch set (dry-run by default; never a drain someone else set).
        from fleet.drain import drain_resume

        drain_resume(host, by=by)
        return Response(_health(host))


class CulpritScoreViewSet(viewsets.ReadOnlyModelViewSet):
    """Recurring culprits, highest score first; `?flagged=true` for the accused only."""

    queryset = CulpritScore.objects.select_related("entity").order_by("-flagged", "-score")
    serializer_class = CulpritScoreSerializer
    filterset_fields = {"flagged": ["exact"], "culprit": ["exact"], "entity__kind": ["exact"]}
