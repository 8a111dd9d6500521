from django.db.models import Prefetch
from rest_framework import viewsets

from analysis.api.serializers import IncidentSerializer
from analysis.filtersets import IncidentFilterSet
from analysis.models import Incident
from ingest.models import Upload


class IncidentViewSet(viewsets.ReadOnlyModelViewSet):
    queryset = Incident.objects.select_related("job", "attempt").prefetch_related(
        Prefetch("attempt__uploads", queryset=Upload.objects.select_related("host"))
    )
    serializer_class = IncidentSerializer
    filterset_class = IncidentFilterSet
