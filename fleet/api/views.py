from rest_framework import viewsets

from fleet.api.serializers import HostSerializer, JobSerializer
from fleet.filtersets import HostFilterSet, JobFilterSet
from fleet.models import Host, Job


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
