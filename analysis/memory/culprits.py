"""Culprits as the unit of work: notifications when one is flagged, and a resolved one that is
implicated again reopening as a regression."""

from __future__ import annotations

import logging
from collections.abc import Iterable
from datetime import datetime

from django.db import transaction

from analysis.models import CulpritScore, Implication
from fleet.models import Attempt

log = logging.getLogger(__name__)


def _notify(event: str, key: str, title: str, payload: dict, url: str = "") -> None:
    """Tell the configured destinations (fleet.notify); a notification problem never fails the
    computation that found the event."""
    try:
        from fleet.notify import notify

        notify(event, key, title, payload, url=url)
    except Exception:  # logged; the scores are stored either way
        log.exception("notification %s (%s) not sent", event, key)


def _culprit_url(score: CulpritScore) -> str:
    from fleet.notify import ui_url

    return ui_url("culprit-detail", score.pk)


def _culprit_payload(score: CulpritScore) -> dict:
    return {
        "culprit_id": score.pk,
        "entity": f"{score.entity.kind}:{score.entity.key}",
        "culprit": score.culprit,
        "score": score.score,
        "explanation": score.explanation,
        "incidents": list(score.incidents[:20]),
        "assignee": score.assignee,
    }


def culprits_notify_flagged(entity_ids: Iterable[int]) -> None:
    """A culprit newly flagged: one notification per flagging (keyed by when it was first
    flagged), none for a muted one."""
    for score in CulpritScore.objects.filter(entity_id__in=list(entity_ids)).select_related(
        "entity"
    ):
        if score.status == CulpritScore.Status.MUTED or score.first_flagged_at is None:
            continue
        _notify(
            "culprit_flagged",
            f"culprit_flagged:{score.entity.kind}:{score.entity.key}:"
            f"{score.first_flagged_at.isoformat()}",
            f"{score.entity.kind} {score.entity.key} flagged as {score.culprit}: "
            f"{score.explanation}"[:300],
            _culprit_payload(score),
            url=_culprit_url(score),
        )


def culprits_regress(now: datetime) -> list[CulpritScore]:
    """A resolved culprit implicated again after its resolution (a new incident names it, or
    for a setting: a new failed attempt ran with it) reopens, marked as a regression, journaled
    with what brought it back, and notified."""
    reopened = []
    resolved = CulpritScore.objects.filter(
        status=CulpritScore.Status.RESOLVED, resolved_at__isnull=False
    ).select_related("entity")
    for score in resolved:
        since = score.resolved_at
        implication = (
            Implication.objects.filter(entity_id=score.entity_id, at__gt=since, at__lte=now)
            .order_by("at")
            .first()
        )
        if implication is not None:
            why = f"incident {implication.incident_id} implicated it again"
        else:
            attempt = (
                Attempt.objects.filter(pk__in=score.attempts[:200], started_at__gt=since)
                .order_by("started_at")
                .first()
            )
            if attempt is None:
                continue
            why = f"attempt {attempt.number} of job {attempt.job_id} failed with it again"
        claimed = CulpritScore.objects.filter(
            pk=score.pk, status=CulpritScore.Status.RESOLVED, resolved_at=since
        ).update(status=CulpritScore.Status.OPEN, regressed_at=now, resolved_at=None)
        if not claimed:
            continue  # an operator moved it meanwhile
        entry = {
            "at": now.isoformat(),
            "by": "fleetwatch",
            "action": "regression",
            "note": f"{why} after it was resolved {since.isoformat(timespec='minutes')} "
            f"by {score.resolved_by or 'someone'}",
        }
        with transaction.atomic():
            row = CulpritScore.objects.select_for_update().get(pk=score.pk)
            row.journal = [*row.journal, entry]
            row.save(update_fields=["journal"])
        reopened.append(row)
        _notify(
            "regression",
            f"regression:{score.pk}:{since.isoformat()}",
            f"Regression: {score.entity.kind} {score.entity.key} ({score.culprit}) is back: {why}",
            _culprit_payload(row),
            url=_culprit_url(score),
        )
    return reopened
