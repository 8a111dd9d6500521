"""Writes for incidents: classify an attempt with the pure core and store the verdict."""

from __future__ import annotations

import logging
from datetime import timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import F, Q
from django.utils import timezone

from analysis import memory
from analysis.attempts import attempt_config_events, upload_source_names
from analysis.classify import IncidentContext, Verdict, classify
from analysis.corpus.similar import similar_cases
from analysis.models import CulpritScore, Incident, IncidentRevision
from fleet.models import Attempt
from ingest.models import Event, Upload
from ingest.parsers.events import event_from_row
from ingest.services import artifact_requests_for_incident, task_publish

log = logging.getLogger(__name__)

# Events read per incident at most: a pathological log cannot make classification unbounded.
MAX_EVENTS_PER_ATTEMPT = 200_000


# Uploads whose events are read in one query.
EVENT_BATCH_UPLOADS = 200


def attempt_events(attempt: Attempt):
    """The attempt's stored events, each file's in line order, at most MAX_EVENTS_PER_ATTEMPT.

    Read a batch of uploads at a time along the upload index, as plain rows: one query over all
    of a 2,048-host attempt's 84,000 events (a join and a sort behind a server-side cursor,
    planned on statistics that lag a burst of inserts) took 17 s of a 27 s classification."""
    sources = upload_source_names(attempt.uploads.order_by("id").only("id", "filename"))
    uploads = list(sources)
    left = MAX_EVENTS_PER_ATTEMPT
    for start in range(0, len(uploads), EVENT_BATCH_UPLOADS):
        rows = (
            Event.objects.filter(upload_id__in=uploads[start : start + EVENT_BATCH_UPLOADS])
            .order_by("upload_id", "line")
            .values_list("upload_id", "kind", "line", "text", "rank", "attrs")[:left]
        )
        for upload_id, kind, line, text, rank, attrs in rows:
            left -= 1
            event = event_from_row(
                kind,
                line=line,
                text=text,
                rank=rank,
                source=sources[upload_id],
                attrs=attrs,
            )
            if event is not None:
                yield event
        if left <= 0:
            return


def attempt_context(attempt: Attempt) -> IncidentContext:
    rank_hosts = {p.rank: p.host.hostname for p in attempt.placements.select_related("host").all()}
    uploaded = frozenset(
        r for r in attempt.uploads.exclude(rank=None).values_list("rank", flat=True)
    )
    return IncidentContext(
        world_size=attempt.world_size, rank_hosts=rank_hosts, ranks_uploaded=uploaded
    )


def attempt_settled(attempt: Attempt, now, *, complete: bool = False) -> bool:
    """All uploads parsed and none newer than the settle window (no window when the sender
    says the attempt is complete)."""
    if attempt.uploads.filter(status__in=[Upload.Status.RECEIVED, Upload.Status.PARSING]).exists():
        return False
    if complete:
        return True
    window = timedelta(seconds=settings.FLEETWATCH_SETTLE_SECONDS)
    return attempt.last_parsed_at is None or attempt.last_parsed_at + window <= now


def classify_lease() -> timedelta:
    return timedelta(seconds=settings.FLEETWATCH_CLASSIFY_LEASE_SECONDS)


def attempt_unclassified() -> Q:
    """Attempts whose uploads say more than their last finished classification read."""
    return Q(classified_at__isnull=True) | Q(classified_at__lt=F("last_parsed_at"))


def attempt_claim_for_classify(attempt_id: int, now) -> bool:
    """Conditional update: only one worker classifies a given state of the attempt. The claim is
    a lease: one held longer than FLEETWATCH_CLASSIFY_LEASE_SECONDS belongs to a worker that
    died mid-classify, and may be taken."""
    free = Q(classify_claimed_at__isnull=True) | Q(classify_claimed_at__lt=now - classify_lease())
    return bool(
        Attempt.objects.filter(pk=attempt_id)
        .filter(attempt_unclassified() & free)
        .update(classify_claimed_at=now)
    )


def classify_lease_renewed(attempt_id: int):
    """The attempt's classification claim renewed while the block runs (fleet.celery.
    lease_renewed): a short lease then suffices for a classification of any length, and a dead
    worker's is taken over within a lease and a sweep."""
    from fleet.celery import lease_renewed

    def renew() -> None:
        Attempt.objects.filter(pk=attempt_id, classify_claimed_at__isnull=False).update(
            classify_claimed_at=timezone.now()
        )

    return lease_renewed(
        f"attempt {attempt_id} classification", renew, classify_lease().total_seconds()
    )


# A classification run that ended with its worker (killed for memory or time, crashed) is
# taken over once its lease lapses; the same events would end the next worker the same way.
MAX_CLASSIFY_TRIES = 3


def attempt_classify_begin(attempt_id: int, now) -> bool:
    """Count a classification run of the attempt; False (and the attempt given up, saying why)
    when MAX_CLASSIFY_TRIES runs have begun since the last that finished."""
    began = Attempt.objects.filter(pk=attempt_id, classify_tries__lt=MAX_CLASSIFY_TRIES).update(
        classify_tries=F("classify_tries") + 1
    )
    if began:
        return True
    given_up = Attempt.objects.filter(pk=attempt_id).update(
        classified_at=now,
        classify_claimed_at=None,
        classify_error=(
            f"the classification never finished: {MAX_CLASSIFY_TRIES} runs each ended with their "
            "worker (killed for memory or time, or crashed); not tried again until a new upload "
            "of the attempt is parsed. The uploads and their events are kept."
        ),
    )
    if given_up:
        log.error(
            "attempt %s: its classification took %d workers down", attempt_id, MAX_CLASSIFY_TRIES
        )
    return False


def attempt_classify_done(attempt_id: int, claimed_at) -> None:
    """The classification claimed at ``claimed_at`` is stored: the attempt counts as classified
    as of then, and the claim is released. Uploads parsed while it ran are newer than what it
    read: their own classification was refused by the claim, so one is published now."""
    Attempt.objects.filter(pk=attempt_id).update(
        classified_at=claimed_at, classify_claimed_at=None, classify_tries=0, classify_error=""
    )
    if Attempt.objects.filter(pk=attempt_id, last_parsed_at__gt=claimed_at).exists():
        task_publish(
            "analysis.tasks.attempt_classify",
            attempt_id,
            countdown=settings.FLEETWATCH_SETTLE_SECONDS,
        )


def incident_classify(attempt: Attempt, now=None) -> Incident | None:
    """Run the diagnosis core on everything the attempt's uploads said; store the verdict.

    Returns the incident, or None when the artifacts show no failure."""
    now = now or timezone.now()
    events = [*attempt_config_events(attempt), *attempt_events(attempt)]
    verdict: Verdict = classify(events, attempt_context(attempt))
    if not verdict.failed or attempt.status == Attempt.Status.SUCCEEDED:
        # An incident needs a failure: slow-rank, I/O and loader signals of an attempt that
        # every rank finished (exit 0, reported by the agent or scheduler) are no incident, and
        # the attempt stays succeeded so fleet memory never counts a failure that did not happen.
        return Incident.objects.filter(attempt=attempt).first()
    fields = {
        "job_id": attempt.job_id,
        "culprit": verdict.culprit,
        "confidence": verdict.confidence,
        "summary": verdict.summary,
        "fix": verdict.fix,
        "evidence": [vars_(e) for e in verdict.evidence],
        "suspects": [vars_(s) for s in verdict.suspects],
        "alternatives": [vars_(a) for a in verdict.alternatives],
        "rule_ids": list(verdict.rule_ids),
        "matches": [vars_(m) for m in verdict.matches],
        "ruleset_version": verdict.ruleset_version,
        "signature": verdict.signature[:255],
        "similar": [s.to_dict() for s in similar_cases(events)],
        "classified_at": now,
    }
    with transaction.atomic():
        # An incident opens when the attempt failed, if an agent or scheduler said when.
        opened = min(now, attempt.ended_at) if attempt.ended_at else now
        previous = (
            Incident.objects.select_for_update()
            .filter(attempt=attempt)
            .only("pk", "classified_culprit", "culprit")
            .first()
        )
        if previous is not None and previous.classified_culprit:
            # An operator named the culprit: the core's newer verdict is kept beside it.
            fields["classified_culprit"] = fields.pop("culprit")
        incident, _ = Incident.objects.update_or_create(
            attempt=attempt, defaults=fields, create_defaults={**fields, "opened_at": opened}
        )
        incident_revise(incident, verdict, attempt, now)
        Attempt.objects.filter(pk=attempt.pk).update(status=Attempt.Status.FAILED)
        memory.exposures_record(attempt)
        memory.incident_implicate(incident, attempt)
        incident_label_evidence(incident)
        artifact_requests_for_incident(incident, attempt)
        transaction.on_commit(fleet_correlate_soon)
    return incident


# How far back a label is looked for among incidents of the same cause.
LABEL_LOOKBACK = 50


def operator_label(incident: Incident) -> dict | None:
    """What an operator last said, with a reason, about an earlier incident with this one's
    fingerprint (the same cause: rule, implicated entity, signature): a reclassification, or a
    resolution with a note. As evidence: "reclassified as storage_io on incident 412 by alice"."""
    fingerprint = (
        Incident.objects.filter(pk=incident.pk).values_list("fingerprint", flat=True).first()
    )
    if not fingerprint:
        return None
    earlier = (
        Incident.objects.filter(fingerprint=fingerprint, opened_at__lte=incident.opened_at)
        .exclude(pk=incident.pk)
        .only("pk", "culprit", "journal")
        .order_by("-opened_at", "-pk")[:LABEL_LOOKBACK]
    )
    for other in earlier:
        for entry in reversed(other.journal or []):
            action, note = entry.get("action", ""), (entry.get("note") or "").strip()
            if action.startswith("reclassified"):
                said = f"reclassified as {other.culprit}"
            elif action == "resolved" and note:
                said = f"confirmed as {other.culprit}"
            else:
                continue
            return {
                "file": f"incident {other.pk}",
                "line": 0,
                "signal": "operator_label",
                "text": f"{said} on incident {other.pk} by {entry.get('by') or 'an operator'}"
                + (f": {note}" if note else ""),
                "incident": other.pk,
                "culprit": other.culprit,
            }
    return None


def incident_label_evidence(incident: Incident) -> dict | None:
    """Put the operators' label of the same cause first in the incident's evidence."""
    label = operator_label(incident)
    if label is not None:
        rest = [e for e in incident.evidence if e.get("signal") != "operator_label"]
        incident.evidence = [label, *rest]
        Incident.objects.filter(pk=incident.pk).update(evidence=incident.evidence)
    return label


def _verdict_ranks(verdict: Verdict) -> list[int]:
    return [int(s.id) for s in verdict.suspects if s.kind == "rank" and s.id.isdigit()][:4]


def incident_revise(incident: Incident, verdict: Verdict, attempt: Attempt, now) -> bool:
    """Record a revision when the culprit or the suspected ranks changed (or for the first
    verdict), saying what arrived since the last one. Returns whether one was recorded."""
    ranks = _verdict_ranks(verdict)
    last = incident.revisions.order_by("-at", "-pk").first()
    if last is not None and (last.culprit, last.ranks) == (verdict.culprit, ranks):
        return False
    since = attempt.uploads.order_by("received_at")
    if last is not None:
        since = since.filter(received_at__gt=last.at)
    arrived = [
        f"{u.kind}"
        + (f" of rank {u.rank}" if u.rank is not None else "")
        + f" from {u.host.hostname}"
        for u in since.select_related("host")[:6]
    ]
    cause = ("first verdict" if last is None else "changed after") + (
        ": " + ", ".join(arrived) if arrived else ""
    )
    naming = next((m.rule_id for m in verdict.matches if m.culprit == verdict.culprit), "")
    IncidentRevision.objects.create(
        incident=incident,
        at=now,
        culprit=verdict.culprit,
        confidence=verdict.confidence,
        ranks=ranks,
        rule_id=naming if verdict.culprit != "unknown" else "",
        cause=cause[:500],
        ruleset_version=verdict.ruleset_version,
    )
    return True


def fleet_correlate_soon() -> None:
    """Recompute recurrence scores shortly, at most once per FLEETWATCH_CORRELATE_SECONDS
    however many incidents arrive (the beat schedule also runs it periodically)."""
    from django.core.cache import cache

    delay = settings.FLEETWATCH_CORRELATE_SECONDS
    if delay and cache.add("fleetwatch:correlate-pending", 1, timeout=delay):
        # Through task_publish like every publish: a broker that is down costs a log line, not
        # the classification that committed (beat recomputes anyway); in the embedded default
        # it runs on the settle timer, not inside the request that opened the incident.
        task_publish("analysis.tasks.fleet_correlate", countdown=delay)


def vars_(item) -> dict:
    return {name: getattr(item, name) for name in item.__slots__}


# --- the on-call workflow ------------------------------------------------------------------
# Incidents and culprits alike. Each step is a conditional update on the status it moves from,
# so two operators clicking at once record one acknowledgement, and a resolved item is not
# re-acknowledged by a stale page. Every step is journaled with who did it and why (the audit).

NOTE_MAX = 2000


class WorkflowError(ValueError):
    """A workflow step that cannot be taken as asked (a date in the past, a missing note)."""


def _journal_entry(action: str, by: str, note: str, now) -> dict:
    return {"at": now.isoformat(), "by": by[:150], "action": action, "note": note[:NOTE_MAX]}


def _journal_append(row, entry: dict, **fields):
    """Append ``entry`` to the row's journal (and set ``fields``) under a row lock."""
    model = type(row)
    with transaction.atomic():
        locked = model.objects.select_for_update().get(pk=row.pk)
        for name, value in fields.items():
            setattr(locked, name, value)
        locked.journal = [*locked.journal, entry]
        locked.save(update_fields=[*fields, "journal"])
    return locked


def _step(row, action: str, *, by: str, note: str, now, allowed: Q | None, **fields) -> bool:
    """Move ``row`` with a conditional update (``allowed``: the states it may move from) and
    journal it; False when it was not in such a state (someone moved it first)."""
    query = type(row).objects.filter(pk=row.pk)
    if allowed is not None:
        query = query.filter(allowed)
    if not query.update(**fields):
        return False
    _journal_append(row, _journal_entry(action, by, note, now))
    return True


def _assign(row, assignee: str, *, by: str, note: str, now) -> bool:
    assignee = assignee.strip()[:150]
    action = f"assigned to {assignee}" if assignee else "unassigned"
    return _step(row, action, by=by, note=note, now=now, allowed=None, assignee=assignee)


def _snooze(row, until, *, by: str, note: str, now) -> bool:
    if until is not None and until <= now:
        raise WorkflowError("snooze until a time in the future")
    action = f"snoozed until {until.isoformat(timespec='minutes')}" if until else "unsnoozed"
    return _step(row, action, by=by, note=note, now=now, allowed=None, snoozed_until=until)


def incident_acknowledge(incident: Incident, *, by: str, note: str = "", now=None) -> bool:
    """Open -> acknowledged. False when someone else moved it first."""
    now = now or timezone.now()
    return _step(
        incident,
        "acknowledged",
        by=by,
        note=note,
        now=now,
        allowed=Q(status=Incident.Status.OPEN),
        status=Incident.Status.ACKNOWLEDGED,
        acknowledged_at=now,
        acknowledged_by=by[:150],
    )


def incident_resolve(incident: Incident, *, by: str, note: str = "", now=None) -> bool:
    """Open or acknowledged -> resolved. False when it was already resolved."""
    now = now or timezone.now()
    return _step(
        incident,
        "resolved",
        by=by,
        note=note,
        now=now,
        allowed=~Q(status=Incident.Status.RESOLVED),
        status=Incident.Status.RESOLVED,
        resolved_at=now,
        resolved_by=by[:150],
    )


def incident_reopen(incident: Incident, *, by: str, note: str = "", now=None) -> bool:
    """Resolved -> open (the resolution did not hold). False when it was not resolved."""
    now = now or timezone.now()
    return _step(
        incident,
        "reopened",
        by=by,
        note=note,
        now=now,
        allowed=Q(status=Incident.Status.RESOLVED),
        status=Incident.Status.OPEN,
        resolved_at=None,
        resolved_by="",
    )


def incident_assign(incident: Incident, *, assignee: str, by: str, note: str = "", now=None):
    """Give the incident to a user or a team ("team:storage"); blank takes it from everyone."""
    return _assign(incident, assignee, by=by, note=note, now=now or timezone.now())


def incident_snooze(incident: Incident, *, until, by: str, note: str = "", now=None) -> bool:
    """Out of the overview and the open lists until ``until`` (None: back now)."""
    return _snooze(incident, until, by=by, note=note, now=now or timezone.now())


def incident_fix_applied(incident: Incident, *, by: str, note: str = "", now=None) -> bool:
    """The recommended fix (or the one in the note) was applied; recorded once."""
    now = now or timezone.now()
    return _step(
        incident,
        "fix applied",
        by=by,
        note=note,
        now=now,
        allowed=Q(fix_applied_at=None),
        fix_applied_at=now,
        fix_applied_by=by[:150],
    )


def incident_reclassify(
    incident: Incident, *, culprit: str, by: str, note: str, now=None
) -> Incident:
    """An operator names a different culprit, with the reason. The classifier's own culprit is
    kept in ``classified_culprit`` (first override only), so reports can count corrections."""
    if culprit not in Incident.Culprit.values:
        raise WorkflowError(f"unknown culprit class {culprit!r}")
    if not note.strip():
        raise WorkflowError("a reclassification needs a note saying why")
    now = now or timezone.now()
    row = Incident.objects.only("culprit", "classified_culprit").get(pk=incident.pk)
    entry = _journal_entry(f"reclassified {row.culprit} → {culprit}", by, note, now)
    return _journal_append(
        incident,
        entry,
        culprit=culprit,
        classified_culprit=row.classified_culprit or row.culprit,
    )


# --- culprits: the unit of work --------------------------------------------------------------

_CULPRIT_LIVE = Q(status__in=[CulpritScore.Status.OPEN, CulpritScore.Status.ACKNOWLEDGED])


def culprit_acknowledge(score: CulpritScore, *, by: str, note: str = "", now=None) -> bool:
    now = now or timezone.now()
    return _step(
        score,
        "acknowledged",
        by=by,
        note=note,
        now=now,
        allowed=Q(status=CulpritScore.Status.OPEN),
        status=CulpritScore.Status.ACKNOWLEDGED,
        acknowledged_at=now,
        acknowledged_by=by[:150],
    )


def culprit_resolve(score: CulpritScore, *, by: str, note: str = "", now=None) -> bool:
    """The cause was dealt with ("rack r008 recabled"). If it is implicated again afterwards,
    fleet_correlate reopens it as a regression (``culprits_regress``)."""
    now = now or timezone.now()
    return _step(
        score,
        "resolved",
        by=by,
        note=note,
        now=now,
        allowed=~Q(status=CulpritScore.Status.RESOLVED),
        status=CulpritScore.Status.RESOLVED,
        resolved_at=now,
        resolved_by=by[:150],
    )


def culprit_mute(score: CulpritScore, *, by: str, note: str = "", now=None) -> bool:
    """Known and accepted: no notifications, out of the overview; history goes on."""
    now = now or timezone.now()
    return _step(
        score,
        "muted",
        by=by,
        note=note,
        now=now,
        allowed=~Q(status=CulpritScore.Status.MUTED),
        status=CulpritScore.Status.MUTED,
    )


def culprit_reopen(score: CulpritScore, *, by: str, note: str = "", now=None) -> bool:
    """Resolved or muted -> open."""
    now = now or timezone.now()
    return _step(
        score,
        "reopened",
        by=by,
        note=note,
        now=now,
        allowed=~_CULPRIT_LIVE,
        status=CulpritScore.Status.OPEN,
        resolved_at=None,
        resolved_by="",
    )


def culprit_assign(score: CulpritScore, *, assignee: str, by: str, note: str = "", now=None):
    return _assign(score, assignee, by=by, note=note, now=now or timezone.now())


def culprit_snooze(score: CulpritScore, *, until, by: str, note: str = "", now=None) -> bool:
    return _snooze(score, until, by=by, note=note, now=now or timezone.now())


INCIDENT_ACTIONS = {
    "acknowledge": incident_acknowledge,
    "resolve": incident_resolve,
    "reopen": incident_reopen,
    "fix-applied": incident_fix_applied,
}
CULPRIT_ACTIONS = {
    "acknowledge": culprit_acknowledge,
    "resolve": culprit_resolve,
    "mute": culprit_mute,
    "reopen": culprit_reopen,
}
