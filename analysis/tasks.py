"""Celery tasks for analysis: thin, idempotent, taking ids. They run on the ``analysis`` queue."""

from __future__ import annotations

import logging

from celery import shared_task
from django.utils import timezone

from analysis import services
from fleet.celery import DATABASE_TRANSIENT, eager_countdowns, redelivered, retry_countdown
from fleet.models import Attempt

log = logging.getLogger(__name__)


@shared_task(bind=True, max_retries=8)
def attempt_classify(self, attempt_id: int, takeover: bool = False, complete: bool = False) -> None:
    """Classify the attempt once its uploads have settled: none still to be parsed and none newer
    than the settle window, unless the sender says the attempt is ``complete`` (a loader that
    sent every artifact of it: no window to wait out)."""
    try:
        attempt = Attempt.objects.filter(pk=attempt_id).first()
        if attempt is None:
            return
        now = timezone.now()
        if not services.attempt_settled(attempt, now, complete=complete):
            # A later upload's own task (enqueued after it parsed) will classify the attempt.
            return
        claimed = services.attempt_claim_for_classify(attempt_id, now)
        # A run that claimed and then died (worker killed: the message is re-delivered, or the
        # sweep re-publishes it once the claim's lease ran out) or failed on the database (the
        # retry) left the claim set: its successor takes it over. Classifying twice is safe:
        # the incident is unique on its attempt.
        if not (claimed or takeover or redelivered(self)):
            return
        if not takeover and not services.attempt_classify_begin(attempt_id, now):
            # Runs before this one each took their worker down (a retry after a database error,
            # ``takeover``, reported back and does not count).
            return
        try:
            with services.classify_lease_renewed(attempt_id):
                services.incident_classify(attempt, now)
        except DATABASE_TRANSIENT:
            raise
        except Exception:
            # Not the database: the same events would fail the same way again. Logged, and the
            # attempt counts as classified (as far as it could be) so that no sweep loops on it.
            log.exception("attempt %s: classification failed", attempt_id)
        services.attempt_classify_done(attempt_id, now)
    except DATABASE_TRANSIENT as exc:
        raise self.retry(
            exc=exc,
            kwargs={"attempt_id": attempt_id, "takeover": True, "complete": complete},
            countdown=retry_countdown(self),
        ) from exc


eager_countdowns.complete_tasks.add(attempt_classify.name)


@shared_task(autoretry_for=DATABASE_TRANSIENT, retry_backoff=True, max_retries=5)
def fleet_correlate() -> None:
    """Recompute recurrence scores for the whole fleet (periodic, and soon after incidents)."""
    from analysis import memory

    memory.fleet_correlate()
    try:
        from fleet.notify import notify_host_verdicts

        notify_host_verdicts()
    except Exception:
        # A notification problem never fails the recompute: logged, and the next one tries again.
        log.exception("fleet memory recomputed; notifying the hosts to drain failed")


@shared_task(autoretry_for=DATABASE_TRANSIENT, retry_backoff=True, max_retries=5)
def weekly_report_build(week: str = "") -> None:
    """Beat, every Monday: the report for the week before. Never rebuilds a finished week."""
    from analysis import report

    week = week or report.previous_week(timezone.now())
    try:
        report.weekly_report_build(week, by="celery beat")
    except report.ReportExists:
        return
