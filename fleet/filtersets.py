import django_filters

from fleet.models import Host, Job


class HostFilterSet(django_filters.FilterSet):
    hostname = django_filters.CharFilter(lookup_expr="icontains")

    class Meta:
        model = Host
        fields = ["hostname", "rack", "gpu_model"]


class JobFilterSet(django_filters.FilterSet):
    external_id = django_filters.CharFilter()
    # What every other endpoint calls a job: the scheduler's id (external_id is kept for callers
    # written against the first API).
    job = django_filters.CharFilter(field_name="external_id", help_text="the scheduler's job id")

    class Meta:
        model = Job
        fields = ["job", "external_id", "name"]
