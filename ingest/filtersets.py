"""Filters of the ingest read API."""

import django_filters

from ingest.models import Upload


class UploadFilterSet(django_filters.FilterSet):
    job = django_filters.CharFilter(
        field_name="job__external_id", help_text="the scheduler's job id, as uploaded"
    )
    host = django_filters.CharFilter(field_name="host__hostname")
    attempt = django_filters.NumberFilter(field_name="attempt__number")
    rank = django_filters.NumberFilter()

    class Meta:
        model = Upload
        fields = ["status", "kind", "job", "host", "attempt", "rank"]
