from django.db.models import Count, Prefetch
from django.shortcuts import get_object_or_404
from drf_spectacular.utils import OpenApiResponse, extend_schema, extend_schema_view
from rest_framework import status, viewsets
from rest_framework.decorators import action
from rest_framework.exceptions import ValidationError
from rest_framework.response import Response
from rest_framework.views import APIView

from analysis import memory, services
from analysis.api.serializers import (
    AssignSerializer,
    CulpritScoreSerializer,
    HostHealthSerializer,
    HostRepairSerializer,
    IncidentSerializer,
    WorkflowSerializer,
)
from analysis.filtersets import CulpritFilterSet, IncidentFilterSet
from analysis.models import CulpritScore, Incident
from fleet.models import Host
from ingest.auth import CanOperate, actor_of
from ingest.models import Upload


class WorkflowMixin:
    """``POST …/{id}/acknowledge|assign|resolve|snooze|reopen`` (and what else ``steps`` names),
    scope ``operate``, each journaled with the key or user that took it. 200 with the object
    after the step; 409 when it no longer applies (someone moved it first)."""

    steps: dict = {}  # name -> service(row, by=, note=) -> bool
    assign_step = snooze_step = None  # services taking assignee= / until=

    def _respond(self, row, done: bool, what: str):
        row = self.get_queryset().get(pk=row.pk)
        if not done:
            return Response(
                {"detail": f"{what}: not applicable in its current state ({row.status})"},
                status=status.HTTP_409_CONFLICT,
            )
        return Response(self.get_serializer(row).data)

    def _step(self, request, name: str):
        row = self.get_object()
        form = (AssignSerializer if name == "assign" else WorkflowSerializer)(data=request.data)
        form.is_valid(raise_exception=True)
        data = form.validated_data
        by, note = actor_of(request), data.get("note", "")
        try:
            if name == "assign":
                done = self.assign_step(row, assignee=data["assignee"], by=by, note=note)
            elif name == "snooze":
                done = self.snooze_step(row, until=data.get("until"), by=by, note=note)
            else:
                done = self.steps[name](row, by=by, note=note)
        except services.WorkflowError as error:
            raise ValidationError({"detail": str(error)}) from error
        return self._respond(row, done, name)

    @action(detail=True, methods=["post"], permission_classes=[CanOperate])
    def acknowledge(self, request, pk=None):
        return self._step(request, "acknowledge")

    @action(detail=True, methods=["post"], permission_classes=[CanOperate])
    def assign(self, request, pk=None):
        return self._step(request, "assign")

    @action(detail=True, methods=["post"], permission_classes=[CanOperate])
    def resolve(self, request, pk=None):
        return self._step(request, "resolve")

    @action(detail=True, methods=["post"], permission_classes=[CanOperate])
    def snooze(self, request, pk=None):
        return self._step(request, "snooze")

    @action(detail=True, methods=["post"], permission_classes=[CanOperate])
    def reopen(self, request, pk=None):
        return self._step(request, "reopen")


def _workflow_schema(serializer, *extra: str):
    """The documented answers of each workflow step: the object after it, or 409."""
    step_responses = {
        200: serializer,
        409: OpenApiResponse(description="the step does not apply in its current state"),
    }
    step = extend_schema(request=WorkflowSerializer, responses=step_responses)
    names = ("acknowledge", "resolve", "snooze", "reopen", *extra)
    assign = extend_schema(request=AssignSerializer, responses=step_responses)
    return extend_schema_view(assign=assign, **dict.fromkeys(names, step))


@_workflow_schema(IncidentSerializer)
class IncidentViewSet(WorkflowMixin, viewsets.ReadOnlyModelViewSet):
    """Incidents, newest first. Filters: job, host, culprit, status, assignee, ``mine`` (assigned
    to the caller), ``unowned``, since/until."""

    steps = services.INCIDENT_ACTIONS
    assign_step = staticmethod(services.incident_assign)
    snooze_step = staticmethod(services.incident_snooze)

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
        by = actor_of(request)
        memory.host_repaired(host, note=form.validated_data.get("note", ""), by=by)
        # Undo a drain Fleetwatch set (dry-run by default; never a drain someone else set).
        from fleet.drain import drain_resume

        drain_resume(host, by=by)
        return Response(_health(host))


@_workflow_schema(CulpritScoreSerializer, "mute")
class CulpritScoreViewSet(WorkflowMixin, viewsets.ReadOnlyModelViewSet):
    """Recurring culprits, highest score first; ``?flagged=true`` for the accused only; also
    status, assignee, ``mine``, ``unowned``. A culprit is the unit of on-call work: acknowledge,
    assign, snooze, mute, resolve; one resolved and implicated again reopens as a regression."""

    queryset = CulpritScore.objects.select_related("entity").order_by("-flagged", "-score")
    serializer_class = CulpritScoreSerializer
    filterset_class = CulpritFilterSet
    steps = services.CULPRIT_ACTIONS
    assign_step = staticmethod(services.culprit_assign)
    snooze_step = staticmethod(services.culprit_snooze)

    @action(detail=True, methods=["post"], permission_classes=[CanOperate])
    def mute(self, request, pk=None):
        return self._step(request, "mute")
