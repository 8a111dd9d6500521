"""Celery tasks for analysis: thin, idempotent, taking ids."""

from __future__ import annotations

from celery import shared_task
from django.db import OperationalError
from django.utils import timezone

from analysis import services
from fleet.models import Attempt


@shared_task(autoretry_for=(OperationalError,), retry_backoff=True, max_retries=8)
def attempt_classify(attempt_id: int) -> None:
    attempt = Attempt.objects.filter(pk=attempt_id).first()
    if attempt is None:
        return
    now = timezone.now()
    if not services.attempt_settled(attempt, now):
        # A later upload's own task (enqueued after it parsed) will classify the attempt.
        return
    if not services.attempt_claim_for_classify(attempt_id, now):
        return
    services.incident_classify(attempt, now)


@shared_task(autoretry_for=(OperationalError,), retry_backoff=True, max_retries=5)
def fleet_correlate() -> None:
    """Recompute recurrence scores for the whole fleet (periodic, and soon after incidents)."""
    from analysis import memory

    memory.fleet_correlate()


@shared_task(autoretry_for=(OperationalError,), retry_backoff=True, max_retries=5)
def weekly_report_build(week: str = "") -> None:
    """Beat, every Monday: the report for the week before. Never rebuilds a finished week."""
    from analysis import report

    week = week or report.previous_week(timezone.now())
    try:
        report.weekly_report_build(week, by="celery beat")
    except report.ReportExists:
        return
