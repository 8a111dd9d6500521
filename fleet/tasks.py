"""Celery tasks of the fleet app: delivering notifications (``fleet.notify``)."""

from __future__ import annotations

import contextlib
import logging
import math
import urllib.error
import urllib.request
from http.client import HTTPException

from celery import shared_task
from django.conf import settings
from django.db.models import F
from django.utils import timezone

from fleet.celery import retry_countdown
from fleet.models import NotificationDelivery

log = logging.getLogger(__name__)

TIMEOUT_S = 10
ERROR_MAX = 2000
# A Retry-After longer than this is not waited for: the back-off schedule still applies.
RETRY_AFTER_MAX_S = 600


class _NoRedirects(urllib.request.HTTPRedirectHandler):
    """A redirect is answered as the error it is for a webhook: urllib would turn the POST into
    a GET without its body."""

    def redirect_request(self, req, fp, code, msg, headers, newurl):
        return None


def max_retries() -> int:
    return int(getattr(settings, "FLEETWATCH_NOTIFY_MAX_RETRIES", 8))


def _post(url: str, body: bytes, headers: dict[str, str]) -> tuple[int | None, str, float]:
    """(status code or None, error text or "", Retry-After seconds or 0)."""
    # http(s) only: notification_deliver checks the scheme before it calls this.
    request = urllib.request.Request(url, data=body, headers=headers, method="POST")  # noqa: S310
    try:
        with urllib.request.build_opener(_NoRedirects).open(request, timeout=TIMEOUT_S) as response:
            response.read(4096)
            return response.status, "", 0.0
    except urllib.error.HTTPError as exc:
        text = ""
        with contextlib.suppress(OSError, HTTPException):
            text = exc.read(500).decode("utf-8", "replace")
        try:
            retry_after = float(exc.headers.get("Retry-After") or 0)
        except (TypeError, ValueError):
            retry_after = 0.0  # an HTTP date, or nonsense: the back-off alone decides
        if not math.isfinite(retry_after) or retry_after < 0:
            retry_after = 0.0
        detail = f"HTTP {exc.code} {exc.reason}" + (f": {text.strip()}" if text.strip() else "")
        return exc.code, detail, retry_after
    except (OSError, HTTPException) as exc:  # refused, reset, timed out, DNS, TLS
        reason = getattr(exc, "reason", None) or exc
        return None, f"{type(exc).__name__}: {reason}", 0.0


def _retryable(code: int | None) -> bool:
    return code is None or code == 429 or code >= 500


@shared_task(bind=True, max_retries=8)
def notification_deliver(self, delivery_id: int):
    """POST one delivery. Connection errors, timeouts, 5xx and 429 are retried with full-jitter
    back-off up to FLEETWATCH_NOTIFY_MAX_RETRIES (8) times, then the delivery is failed; any
    other answer that is not 2xx fails it at once (the receiver refused the payload)."""
    from fleet.notify import render

    delivery = (
        NotificationDelivery.objects.select_related("destination").filter(pk=delivery_id).first()
    )
    if delivery is None or delivery.status != NotificationDelivery.Status.PENDING:
        return None
    rows = NotificationDelivery.objects.filter(pk=delivery_id)
    if not delivery.destination.enabled and delivery.event != "test":
        # Disabled to stop it (a receiver gone for good): what it had pending is not sent. A
        # test (manage.py notify_test --destination) is, to check a receiver before enabling.
        rows.update(
            status=NotificationDelivery.Status.FAILED,
            last_error="the destination was disabled before the delivery was sent",
        )
        return None
    # Claim this attempt: of two runs of one message (a re-delivery after a worker died while a
    # slow run was still alive) only one POSTs it.
    attempt = delivery.attempts + 1
    if not rows.filter(status=NotificationDelivery.Status.PENDING, attempts=attempt - 1).update(
        attempts=F("attempts") + 1
    ):
        return None

    url = delivery.destination.url
    if not url.lower().startswith(("http://", "https://")):
        code, error, retry_after = None, f"not an http(s) URL: {url[:200]}", 0.0
        final = True
    else:
        body, headers = render(delivery)
        code, error, retry_after = _post(url, body, headers)
        final = False
    if code is not None and 200 <= code < 300:
        rows.update(
            status=NotificationDelivery.Status.DELIVERED,
            response_code=code,
            delivered_at=timezone.now(),
        )  # last_error keeps what an earlier attempt met
        return None

    retries = self.request.retries
    error = f"attempt {attempt}: {error}"[:ERROR_MAX]
    if final or not _retryable(code) or retries >= max_retries():
        if _retryable(code) and not final:
            error = f"{error} (gave up after {attempt} attempts)"[:ERROR_MAX]
        rows.update(status=NotificationDelivery.Status.FAILED, response_code=code, last_error=error)
        log.warning("notification %s to %s failed: %s", delivery_id, delivery.destination, error)
        return None
    rows.update(response_code=code, last_error=error)
    countdown = max(retry_countdown(self), min(retry_after, RETRY_AFTER_MAX_S))
    retry = self.retry(countdown=countdown, max_retries=max_retries(), throw=False)
    if self.request.is_eager:
        # Eager mode (the embedded default, the tests): a task that *returns* its Retry is run
        # again by ``apply`` at once, once. A raised one would instead escape into the caller
        # when task_eager_propagates is on, and the retry would never run.
        return retry
    raise retry


# A delivery never tried after this long lost its message (the broker was down when it was
# published, a worker died holding it): the sweep sends it again. Longer than any back-off.
STUCK_AFTER_S = 900


@shared_task
def notifications_sweep() -> int:
    """Publish again the deliveries whose first attempt never ran; returns how many. The claim in
    ``notification_deliver`` keeps a late original message from sending one twice."""
    from datetime import timedelta

    from ingest.services import task_publish

    stuck = NotificationDelivery.objects.filter(
        status=NotificationDelivery.Status.PENDING,
        attempts=0,
        created_at__lt=timezone.now() - timedelta(seconds=STUCK_AFTER_S),
    ).values_list("pk", flat=True)[:1000]
    sent = 0
    for delivery_id in stuck:
        sent += task_publish(notification_deliver, delivery_id)
    return sent
