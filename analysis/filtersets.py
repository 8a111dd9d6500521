from datetime import timedelta

import django_filters
from django import forms

from analysis.models import Incident

# PostgreSQL refuses UTC offsets beyond ±15:59 and Python accepts up to ±23:59; years before the
# epoch mean a typo, not a query. Both are a 400, never a 500.
MAX_OFFSET = timedelta(hours=14)


class SaneDateTimeField(django_filters.fields.IsoDateTimeField):
    def clean(self, value):
        value = super().clean(value)
        if value is None:
            return value
        offset = value.utcoffset()
        if offset is not None and abs(offset) > MAX_OFFSET:
            raise forms.ValidationError("UTC offset out of range (at most ±14:00)")
        if not 1970 <= value.year <= 9000:
            raise forms.ValidationError("year out of range (1970 to 9000)")
        return value


class SaneDateTimeFilter(django_filters.IsoDateTimeFilter):
    field_class = SaneDateTimeField


class IncidentFilterSet(django_filters.FilterSet):
    job = django_filters.CharFilter(field_name="job__external_id")
    host = django_filters.CharFilter(method="filter_host", label="hostname")
    culprit = django_filters.ChoiceFilter(choices=Incident.Culprit.choices)
    status = django_filters.ChoiceFilter(choices=Incident.Status.choices)
    since = SaneDateTimeFilter(field_name="opened_at", lookup_expr="gte")
    until = SaneDateTimeFilter(field_name="opened_at", lookup_expr="lt")

    class Meta:
        model = Incident
        fields = ["job", "host", "culprit", "status", "since", "until"]

    def filter_host(self, queryset, name, value):
        # A host is part of an incident when any of its ranks or uploads belong to the attempt.
        return queryset.filter(attempt__uploads__host__hostname=value).distinct()
