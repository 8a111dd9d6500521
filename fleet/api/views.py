from drf_spectacular.utils import extend_schema
from rest_framework import status, viewsets
from rest_framework.response import Response
from rest_framework.views import APIView

from fleet import services
from fleet.api.serializers import (
    AttemptReportedSerializer,
    AttemptReportSerializer,
    HostSerializer,
    JobSerializer,
)
from fleet.filtersets import HostFilterSet, JobFilterSet
from fleet.models import Host, Job
from ingest.auth import CanUpload


class HostViewSet(viewsets.ReadOnlyModelViewSet):
    queryset = Host.objects.all()
    serializer_class = HostSerializer
    filterset_class = HostFilterSet
    lookup_field = "hostname"
    lookup_value_regex = r"[^/]+"


class JobViewSet(viewsets.ReadOnlyModelViewSet):
    queryset = Job.objects.prefetch_related("attempts")
    serializer_class = JobSerializer
    filterset_class = JobFilterSet


class AttemptReportView(APIView):
    """Agents and schedulers report attempts that start and end — healthy ones included, so
    that fleet memory can compare failures against everything that ran."""

    permission_classes = [CanUpload]

    @extend_schema(request=AttemptReportSerializer, responses={200: AttemptReportedSerializer})
    def post(self, request):
        form = AttemptReportSerializer(data=request.data)
        form.is_valid(raise_exception=True)
        d = form.validated_data
        attempt = services.attempt_report(
            job_id=d["job"],
            number=d.get("attempt", 0),
            event=d["event"],
            status=d.get("status", ""),
            at=d.get("at"),
            hostname=d.get("host", ""),
            ranks=d.get("ranks"),
            world_size=d.get("world_size"),
            job_name=d.get("job_name", ""),
            gpu_model=d.get("gpu_model", ""),
            rack=d.get("rack", ""),
            config=d.get("config"),
            versions=d.get("versions"),
        )
        return Response(
            {
                "id": attempt.pk,
                "job": d["job"],
                "attempt": attempt.number,
                "status": attempt.status,
            },
            status=status.HTTP_200_OK,
        )
