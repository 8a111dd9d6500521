import django_filters

from fleet.models import Host, Job


class HostFilterSet(django_filters.FilterSet):
    hostname = django_filters.CharFilter(lookup_expr="icontains")

    class Meta:
        model = Host
        fields = ["hostname", "rack", "gpu_model"]


class JobFilterSet(django_filters.FilterSet):
    external_id = django_filters.CharFilter()

    class Meta:
        model = Job
        fields = ["external_id", "name"]
