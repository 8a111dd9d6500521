from datetime import timedelta

import django_filters
from django import forms

from analysis.models import CulpritScore, Incident
from ingest.auth import actor_of

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


class OwnershipFilters:
    """``mine`` (assigned to the caller: the user name, or ``key:<prefix>`` for a key) and
    ``unowned`` (assigned to nobody)."""

    def filter_mine(self, queryset, name, value):
        if value is None:
            return queryset
        me = actor_of(self.request) if self.request is not None else ""
        return queryset.filter(assignee=me) if value else queryset.exclude(assignee=me)

    def filter_unowned(self, queryset, name, value):
        if value is None:
            return queryset
        return queryset.filter(assignee="") if value else queryset.exclude(assignee="")


class IncidentFilterSet(OwnershipFilters, django_filters.FilterSet):
    job = django_filters.CharFilter(field_name="job__external_id")
    host = django_filters.CharFilter(method="filter_host", label="hostname")
    culprit = django_filters.ChoiceFilter(choices=Incident.Culprit.choices)
    status = django_filters.ChoiceFilter(choices=Incident.Status.choices)
    since = SaneDateTimeFilter(field_name="opened_at", lookup_expr="gte")
    until = SaneDateTimeFilter(field_name="opened_at", lookup_expr="lt")
    assignee = django_filters.CharFilter()
    mine = django_filters.BooleanFilter(method="filter_mine", label="assigned to the caller")
    unowned = django_filters.BooleanFilter(method="filter_unowned", label="assigned to nobody")

    class Meta:
        model = Incident
        fields = ["job", "host", "culprit", "status", "since", "until", "assignee"]

    def filter_host(self, queryset, name, value):
        # A host is part of an incident when any of its ranks or uploads belong to the attempt.
        return queryset.filter(attempt__uploads__host__hostname=value).distinct()


class CulpritFilterSet(OwnershipFilters, django_filters.FilterSet):
    culprit = django_filters.ChoiceFilter(choices=Incident.Culprit.choices)
    status = django_filters.ChoiceFilter(choices=CulpritScore.Status.choices)
    kind = django_filters.CharFilter(field_name="entity__kind")
    entity__kind = django_filters.CharFilter(field_name="entity__kind", label="kind (old name)")
    assignee = django_filters.CharFilter()
    mine = django_filters.BooleanFilter(method="filter_mine", label="assigned to the caller")
    unowned = django_filters.BooleanFilter(method="filter_unowned", label="assigned to nobody")

    class Meta:
        model = CulpritScore
        fields = ["flagged", "culprit", "status", "kind", "assignee"]
