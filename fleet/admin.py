from django import forms
from django.contrib import admin

from fleet.models import (
    Attempt,
    Gpu,
    Host,
    Job,
    NotificationDelivery,
    NotificationDestination,
    RankPlacement,
)
from fleet.notify import EVENTS

admin.site.register([Host, Gpu, Job, Attempt, RankPlacement])


# --- notifications: an operator adds a destination here -----------------------------------------


class NotificationDestinationForm(forms.ModelForm):
    url = forms.URLField(max_length=2000, assume_scheme="https")
    events = forms.MultipleChoiceField(
        choices=[(e, e) for e in EVENTS if e != "test"],
        required=False,
        widget=forms.CheckboxSelectMultiple,
        help_text="None ticked: every event. The test event (manage.py notify_test) always goes.",
    )

    class Meta:
        model = NotificationDestination
        fields = ["name", "url", "format", "events", "secret", "enabled"]
        help_texts = {
            "secret": "HMAC-SHA256 key of the X-Fleetwatch-Signature header; give it to the "
            "receiver. Required for JSON and chat; an Alertmanager may go without.",
        }


@admin.register(NotificationDestination)
class NotificationDestinationAdmin(admin.ModelAdmin):
    form = NotificationDestinationForm
    list_display = ["name", "format", "url", "events", "secret_hint", "enabled", "created_at"]
    list_filter = ["format", "enabled"]


@admin.register(NotificationDelivery)
class NotificationDeliveryAdmin(admin.ModelAdmin):
    list_display = [
        "created_at",
        "destination",
        "event",
        "title",
        "status",
        "attempts",
        "response_code",
        "delivered_at",
    ]
    list_filter = ["status", "event", "destination"]
    search_fields = ["key", "title"]
    readonly_fields = [
        "destination",
        "event",
        "key",
        "title",
        "url",
        "payload",
        "status",
        "attempts",
        "last_error",
        "response_code",
        "created_at",
        "delivered_at",
    ]
    list_select_related = ["destination"]
