from django.urls import include, path

from fleet import views

urlpatterns = [
    path("", views.overview, name="overview"),
    path("incidents/", views.incident_list, name="incident-list"),
    path("incidents/<int:pk>/", views.incident_detail, name="incident-detail"),
    path("incidents/<int:pk>/<slug:action>/", views.incident_action, name="incident-action"),
    path("hosts/", views.host_list, name="host-list"),
    path("hosts/<str:hostname>/<slug:action>/", views.host_action, name="host-action"),
    path("hosts/<str:hostname>/", views.host_detail, name="host-detail"),
    path("culprits/", views.culprit_list, name="culprit-list"),
    path("culprits/<int:pk>/", views.culprit_detail, name="culprit-detail"),
    path("culprits/<int:pk>/<slug:action>/", views.culprit_action, name="culprit-action"),
    path("rules/", views.rule_list, name="rule-list"),
    path("search/", views.search, name="search"),
    path("jobs/", views.job_list, name="job-list"),
    path("jobs/<int:pk>/", views.job_detail, name="job-detail"),
    path("artifacts/<int:pk>/", views.artifact, name="artifact"),
    path("", include("fleet.notify_urls")),
]
