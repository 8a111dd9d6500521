from django.urls import path

from fleet import notify_views

urlpatterns = [
    path("notifications/", notify_views.notifications, name="notifications"),
]
