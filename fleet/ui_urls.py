from django.urls import path

from fleet import views

urlpatterns = [
    path("", views.incident_list, name="incident-list"),
    path("incidents/<int:pk>/", views.incident_detail, name="incident-detail"),
]
