import django_filters

from analysis.models import Incident


class IncidentFilterSet(django_filters.FilterSet):
    job = django_filters.CharFilter(field_name="job__external_id")
    host = django_filters.CharFilter(method="filter_host", label="hostname")
    culprit = django_filters.ChoiceFilter(choices=Incident.Culprit.choices)
    status = django_filters.ChoiceFilter(choices=Incident.Status.choices)
    since = django_filters.IsoDateTimeFilter(field_name="opened_at", lookup_expr="gte")
    until = django_filters.IsoDateTimeFilter(field_name="opened_at", lookup_expr="lt")

    class Meta:
        model = Incident
        fields = ["job", "host", "culprit", "status", "since", "until"]

    def filter_host(self, queryset, name, value):
        # A host is part of an incident when any of its ranks or uploads belong to the attempt.
        return queryset.filter(attempt__uploads__host__hostname=value).distinct()
