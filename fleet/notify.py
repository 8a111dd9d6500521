"""Outgoing notifications: webhooks (plain JSON, chat) and an Alertmanager push.

``notify(event, key, ...)`` records one ``NotificationDelivery`` per enabled destination whose
filter takes the event, unique on (destination, key): the key names the event (a host turning
drain since its last repair, a culprit flagged, an hour of failing uploads), so noticing it again
sends nothing. Each new delivery is published after commit to ``fleet.tasks.
notification_deliver``, which POSTs ``render(delivery)`` and retries with back-off.

Signing, as Stripe signs: ``X-Fleetwatch-Signature: t=<unix seconds>,v1=<hex HMAC-SHA256 of
"<t>." + body under the destination's secret>``. Receivers check it with ``verify_signature``
(or the same few lines in their language), and dedupe on ``X-Fleetwatch-Delivery``: a worker
killed mid-POST sends that delivery again.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import os
import re
import time
from datetime import UTC, datetime
from functools import partial

from django.conf import settings
from django.core.serializers.json import DjangoJSONEncoder
from django.db import transaction
from django.urls import NoReverseMatch, reverse
from django.utils import timezone

from fleet.models import EVENTS, NotificationDelivery, NotificationDestination

log = logging.getLogger(__name__)

CRITICAL = frozenset({"host_drain", "regression"})
SIGNATURE_HEADER = "X-Fleetwatch-Signature"
TITLE_MAX = 500
# Payload keys that become Alertmanager labels (string values, bounded): what an operator routes
# and silences on. Scores, reasons and errors stay in the annotations: a label that changes with
# every recompute would make every push a new alert.
LABEL_KEYS = ("host", "culprit", "entity", "kind", "job", "verdict")
LABEL_VALUE_MAX = 200
_LABEL_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


# --- recording -------------------------------------------------------------------------------


def destinations_for(event: str) -> list[NotificationDestination]:
    return [d for d in NotificationDestination.objects.filter(enabled=True) if d.accepts(event)]


def _jsonable(payload: dict) -> dict:
    """Datetimes, decimals and UUIDs as the JSON encoder writes them: the stored payload is the
    one sent."""
    return json.loads(json.dumps(payload or {}, cls=DjangoJSONEncoder))


def notify(
    event: str,
    key: str,
    title: str,
    payload: dict,
    url: str = "",
    *,
    destinations: list[NotificationDestination] | None = None,
) -> list[NotificationDelivery]:
    """Record the event for every enabled destination that takes it (or for ``destinations``)
    and send each new delivery after commit. Returns the deliveries created now: a key seen
    before creates, and sends, nothing."""
    from ingest.services import task_publish

    if event not in EVENTS:
        raise ValueError(f"unknown event {event!r}; one of {', '.join(EVENTS)}")
    if destinations is None:
        destinations = destinations_for(event)
    fields = {
        "event": event,
        "title": title[:TITLE_MAX],
        "url": url[:2000],
        "payload": _jsonable(payload),
    }
    created = []
    for destination in destinations:
        delivery, new = NotificationDelivery.objects.get_or_create(
            destination=destination, key=key, defaults=fields
        )
        if new:
            transaction.on_commit(
                partial(task_publish, "fleet.tasks.notification_deliver", delivery.pk)
            )
            created.append(delivery)
    return created


# --- rendering and signing -------------------------------------------------------------------


def public_url(url: str) -> str:
    """A UI path made absolute with FLEETWATCH_PUBLIC_URL (where operators reach the UI), when
    that is set; the path as it is otherwise."""
    base = getattr(settings, "FLEETWATCH_PUBLIC_URL", "") or os.environ.get(
        "FLEETWATCH_PUBLIC_URL", ""
    )
    if url.startswith("/") and base:
        return base.rstrip("/") + url
    return url


def _camel(event: str) -> str:
    return "".join(part.capitalize() for part in event.split("_"))


def _iso(at: datetime) -> str:
    return at.astimezone(UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


def _description(delivery: NotificationDelivery) -> str:
    payload = delivery.payload or {}
    reasons = payload.get("reasons")
    if isinstance(reasons, list) and reasons:
        return "; ".join(str(r) for r in reasons)[:2000]
    for name in ("explanation", "error", "description"):
        if payload.get(name):
            return str(payload[name])[:2000]
    return delivery.title


def _alert(delivery: NotificationDelivery, url: str) -> dict:
    if delivery.event in CRITICAL:
        severity = "critical"
    else:
        severity = "info" if delivery.event == "test" else "warning"
    labels = {"alertname": "Fleetwatch" + _camel(delivery.event), "severity": severity}
    for name in LABEL_KEYS:
        value = (delivery.payload or {}).get(name)
        if isinstance(value, (str, int)) and not isinstance(value, bool) and str(value):
            labels.setdefault(name, str(value)[:LABEL_VALUE_MAX])
    alert = {
        "labels": labels,
        "annotations": {
            "summary": delivery.title,
            "description": _description(delivery),
            "key": delivery.key,
        },
        "startsAt": _iso(delivery.created_at),
    }
    if url:
        alert["generatorURL"] = url
    return alert


def signature(secret: str, body: bytes, t: int | None = None) -> str:
    t = int(time.time()) if t is None else t
    mac = hmac.new(secret.encode(), f"{t}.".encode() + body, hashlib.sha256).hexdigest()
    return f"t={t},v1={mac}"


def render(delivery: NotificationDelivery) -> tuple[bytes, dict[str, str]]:
    """The body and headers of one POST of ``delivery`` in its destination's format. The body
    is the same on every attempt; the signature's timestamp is the attempt's."""
    destination = delivery.destination
    url = public_url(delivery.url)
    if destination.format == NotificationDestination.Format.CHAT:
        document: object = {"text": f"{delivery.title} {url}".strip()}
    elif destination.format == NotificationDestination.Format.ALERTMANAGER:
        document = [_alert(delivery, url)]
    else:
        document = {
            "event": delivery.event,
            "key": delivery.key,
            "title": delivery.title,
            "url": url,
            "payload": delivery.payload,
            "at": _iso(delivery.created_at),
        }
    body = json.dumps(document, cls=DjangoJSONEncoder, separators=(",", ":")).encode()
    headers = {
        "Content-Type": "application/json",
        "User-Agent": "Fleetwatch",
        "X-Fleetwatch-Event": delivery.event,
        "X-Fleetwatch-Delivery": str(delivery.pk),
    }
    if destination.secret:
        headers[SIGNATURE_HEADER] = signature(destination.secret, body)
    return body, headers


def verify_signature(secret: str, header: str, body: bytes | str, tolerance_s: int = 300) -> bool:
    """Whether ``header`` (X-Fleetwatch-Signature) signs ``body`` under ``secret`` and was made
    within ``tolerance_s`` of now (a replayed old delivery fails)."""
    if not secret or not header:
        return False
    if isinstance(body, str):
        body = body.encode()
    t, candidates = None, []
    for part in header.split(","):
        name, _, value = part.strip().partition("=")
        if name == "t" and value.isdigit():
            t = int(value)
        elif name == "v1":
            candidates.append(value)
    if t is None or not candidates or abs(time.time() - t) > tolerance_s:
        return False
    expected = signature(secret, body, t).partition(",v1=")[2]
    return any(hmac.compare_digest(expected, c) for c in candidates)


# --- the events Fleetwatch itself notices ----------------------------------------------------


def ui_url(name: str, *args) -> str:
    try:
        return reverse(name, args=args)
    except NoReverseMatch:
        return ""


def notify_host_verdicts(now: datetime | None = None) -> list[NotificationDelivery]:
    """One ``host_drain`` per host whose verdict is drain, keyed by the host and its last repair:
    a host drained again after a repair is a new event, the same drain seen at every recompute
    is not."""
    from fleet.drain import hosts_health

    if not destinations_for("host_drain"):
        return []
    created = []
    for health in hosts_health(now):
        if health.verdict != "drain":
            continue
        since = health.since.isoformat() if health.since else "ever"
        reason = health.reasons[0] if health.reasons else "recurring failures"
        created += notify(
            "host_drain",
            key=f"host_drain:{health.hostname}:{since}",
            title=f"{health.hostname} should be drained: {reason}",
            payload={
                "host": health.hostname,
                "verdict": health.verdict,
                "score": health.score,
                "reasons": health.reasons,
                "incidents": health.incidents,
            },
            url=ui_url("host-detail", health.hostname),
        )
    return created


def notify_ingest_failing(upload) -> list[NotificationDelivery]:
    """At most one ``ingest_failing`` per clock hour, naming the upload that tripped it and how
    many uploads failed in that hour so far."""
    from django.db.models import Q

    from ingest.models import Upload

    if not destinations_for("ingest_failing"):
        return []
    now = timezone.now()
    hour = now.replace(minute=0, second=0, microsecond=0)
    failed = (
        Upload.objects.filter(status=Upload.Status.FAILED)
        .filter(Q(parsed_at__gte=hour) | Q(parsed_at__isnull=True, received_at__gte=hour))
        .count()
    )
    hostname = upload.host.hostname if upload.host_id else ""
    job = upload.job.external_id if upload.job_id else ""
    error = (upload.error or "").strip()
    return notify(
        "ingest_failing",
        key=f"ingest_failing:{now:%Y-%m-%dT%H}",
        title=f"Uploads are failing to parse: upload {upload.pk} from {hostname} "
        f"({max(failed, 1)} failed this hour)",
        payload={
            "upload": upload.pk,
            "host": hostname,
            "job": job,
            "error": error[:2000],
            "failed_this_hour": max(failed, 1),
        },
        url=ui_url("artifact", upload.pk),
    )
