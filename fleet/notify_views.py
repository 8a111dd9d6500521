"""The notifications page: where notifications go and what was sent (the delivery log).

Destinations are added in the admin; the page never shows a secret, only its last four
characters, and shows delivery text (titles, receivers' errors) autoescaped like every log text.
"""

from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.shortcuts import render

from fleet.models import NotificationDelivery, NotificationDestination
from fleet.notify import EVENTS

DELIVERIES_SHOWN = 200


@login_required
def notifications(request):
    deliveries = NotificationDelivery.objects.select_related("destination").order_by(
        "-created_at", "-pk"
    )[:DELIVERIES_SHOWN]
    return render(
        request,
        "fleet/notifications.html",
        {
            "destinations": NotificationDestination.objects.order_by("name"),
            "deliveries": deliveries,
            "events": [e for e in EVENTS if e != "test"],
            "shown": DELIVERIES_SHOWN,
        },
    )
