"""``manage.py notify_test [--destination NAME]`` — send a test notification to check a receiver.

Every enabled destination gets it (or the one named, enabled or not); every filter takes the
``test`` event. Each run is a new event (its key holds the time), so it is sent again. With the
embedded default (eager Celery) the delivery runs here and its outcome is printed; with a broker
a worker sends it, and the notifications page shows how it went.
"""

from __future__ import annotations

import uuid

from django.core.management.base import BaseCommand, CommandError
from django.utils import timezone

from fleet.models import NotificationDelivery, NotificationDestination
from fleet.notify import destinations_for, notify, ui_url


class Command(BaseCommand):
    help = "Send a test notification to every enabled destination, or to the one named."

    def add_arguments(self, parser):
        parser.add_argument("--destination", default="", help="the destination's name")

    def handle(self, *args, destination: str = "", **options):
        if destination:
            targets = list(NotificationDestination.objects.filter(name=destination))
            if not targets:
                raise CommandError(f"no notification destination named {destination!r}")
        else:
            targets = destinations_for("test")
            if not targets:
                raise CommandError("no enabled notification destination; add one in the admin")
        now = timezone.now()
        created = notify(
            "test",
            key=f"test:{now.isoformat()}:{uuid.uuid4().hex[:8]}",
            title="Fleetwatch test notification: this destination receives Fleetwatch events",
            payload={"test": True, "sent_at": now.isoformat()},
            url=ui_url("notifications"),
            destinations=targets,
        )
        for delivery in NotificationDelivery.objects.filter(
            pk__in=[d.pk for d in created]
        ).select_related("destination"):
            line = f"{delivery.destination.name}: {delivery.status}"
            if delivery.attempts:
                line += f" after {delivery.attempts} attempt(s)"
            if delivery.response_code:
                line += f", HTTP {delivery.response_code}"
            if delivery.last_error:
                line += f" ({delivery.last_error})"
            self.stdout.write(line)
