from django.contrib import admin
from django.urls import include, path
from drf_spectacular.views import (
    SpectacularAPIView,
    SpectacularRedocView,
    SpectacularSwaggerView,
)
from rest_framework.routers import DefaultRouter

from analysis.api.views import (
    CulpritScoreViewSet,
    HostHealthView,
    HostRepairedView,
    IncidentViewSet,
)
from fleet.api.views import AttemptReportView, HostViewSet, JobViewSet
from ingest.api.views import ArtifactRequestAnswerView, ArtifactRequestsView, UploadViewSet

router = DefaultRouter(trailing_slash=False)
router.register("incidents", IncidentViewSet)
router.register("hosts", HostViewSet)
router.register("jobs", JobViewSet)
router.register("uploads", UploadViewSet)
router.register("culprits", CulpritScoreViewSet)

api_v1 = [
    path("attempts", AttemptReportView.as_view(), name="attempt-report"),
    path("artifact-requests", ArtifactRequestsView.as_view(), name="artifact-requests"),
    path(
        "artifact-requests/<int:pk>/answer",
        ArtifactRequestAnswerView.as_view(),
        name="artifact-request-answer",
    ),
    path("hosts/<str:hostname>/health", HostHealthView.as_view(), name="host-health"),
    path("hosts/<str:hostname>/repaired", HostRepairedView.as_view(), name="host-repaired"),
    path("", include(router.urls)),
]

urlpatterns = [
    path("api/v1/", include(api_v1)),
    path("api/schema/", SpectacularAPIView.as_view(), name="schema"),
    path("api/docs/", SpectacularSwaggerView.as_view(url_name="schema"), name="swagger-ui"),
    path(
        "api/redoc/",
        SpectacularRedocView.as_view(url_name="schema", template_name="fleet/redoc.html"),
        name="redoc",
    ),
    path("admin/", admin.site.urls),
    path("accounts/", include("django.contrib.auth.urls")),
    path("", include("fleet.ops_urls")),
    path("", include("fleet.ui_urls")),
]
