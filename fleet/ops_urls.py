"""Operations endpoints: scheduler API, drains, reports, metrics (see issue 8).

Included at the site root after the ``api/v1/`` routes of ``fleet.urls``; the API paths below
never collide with the router's ``hosts/<hostname>`` (one path segment only)."""

from django.urls import path, re_path

from fleet.api import ops

WEEK = r"(?P<week>\d{4}-W\d{2})"

urlpatterns = [
    path("api/v1/health", ops.HealthListView.as_view(), name="health-list"),
    path("api/v1/hosts/<str:hostname>/drain", ops.HostDrainView.as_view(), name="host-drain"),
    path("api/v1/drains", ops.DrainActionListView.as_view(), name="drain-list"),
    path("healthz", ops.healthz, name="healthz"),
    path("metrics", ops.metrics, name="metrics"),
    path("reports/", ops.report_list, name="report-list"),
    re_path(rf"^reports/{WEEK}/$", ops.report_page, name="report-page"),
    re_path(rf"^reports/{WEEK}\.pdf$", ops.report_pdf, name="report-pdf"),
]
