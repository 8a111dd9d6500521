"""Writes for incidents: classify an attempt with the pure core and store the verdict."""

from __future__ import annotations

from datetime import timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import F, Q
from django.utils import timezone

from analysis import memory
from analysis.classify import IncidentContext, Verdict, classify
from analysis.corpus.similar import similar_cases
from analysis.models import Incident, IncidentRevision
from fleet.models import Attempt
from ingest.models import Event, Upload
from ingest.parsers import parse_log
from ingest.parsers.events import event_from_row
from ingest.services import artifact_requests_for_incident, task_publish

# Events read per incident at most: a pathological log cannot make classification unbounded.
MAX_EVENTS_PER_ATTEMPT = 200_000


# Uploads whose events are read in one query.
EVENT_BATCH_UPLOADS = 200


def attempt_events(attempt: Attempt):
    """The attempt's stored events, each file's in line order, at most MAX_EVENTS_PER_ATTEMPT.

    Read a batch of uploads at a time along the upload index, as plain rows: one query over all
    of a 2,048-host attempt's 84,000 events (a join and a sort behind a server-side cursor,
    planned on statistics that lag a burst of inserts) took 17 s of a 27 s classification."""
    sources = dict(attempt.uploads.order_by("id").values_list("id", "filename"))
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
                source=sources[upload_id] or f"upload-{upload_id}",
                attrs=attrs,
            )
            if event is not None:
                yield event
        if left <= 0:
            return


def attempt_config_events(attempt: Attempt):
    """What the agent or scheduler reported of the job's settings, as the parsers would read
    them from a log (so the same canonical keys reach the rules)."""
    lines = [f"{key}={value}" for key, value in sorted(attempt.config.items())]
    lines += [f"{key} version: {value}" for key, value in sorted(attempt.versions.items())]
    if not lines:
        return ()
    text = "\n".join(lines) + "\n"
    return parse_log(text.encode(), source="attempt report").events


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


def attempt_claim_for_classify(attempt_id: int, now) -> bool:
    """Conditional update: only one worker classifies a given state of the attempt."""
    return bool(
        Attempt.objects.filter(pk=attempt_id)
        .filter(Q(classified_at__isnull=True) | Q(classified_at__lt=F("last_parsed_at")))
        .update(classified_at=now)
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
        artifact_requests_for_incident(incident, attempt)
        transaction.on_commit(fleet_correlate_soon)
    return incident


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

    from analysis.tasks import fleet_correlate

    delay = settings.FLEETWATCH_CORRELATE_SECONDS
    if delay and cache.add("fleetwatch:correlate-pending", 1, timeout=delay):
        # Through task_publish like every publish: a broker that is down costs a log line, not
        # the classification that committed (beat recomputes anyway); in the embedded default
        # it runs on the settle timer, not inside the request that opened the incident.
        task_publish(fleet_correlate, countdown=delay)


def vars_(item) -> dict:
    return {name: getattr(item, name) for name in item.__slots__}


# --- the on-call workflow ------------------------------------------------------------------
# Each step is a conditional update on the status it moves from, so two operators clicking at
# once record one acknowledgement, and a resolved incident is not re-acknowledged by a stale page.

NOTE_MAX = 2000


def _journal_entry(action: str, by: str, note: str, now) -> dict:
    return {"at": now.isoformat(), "by": by[:150], "action": action, "note": note[:NOTE_MAX]}


def _journal_append(incident: Incident, entry: dict, **fields) -> Incident:
    with transaction.atomic():
        row = Incident.objects.select_for_update().get(pk=incident.pk)
        for name, value in fields.items():
            setattr(row, name, value)
        row.journal = [*row.journal, entry]
        row.save(update_fields=[*fields, "journal"])
    return row


def incident_acknowledge(incident: Incident, *, by: str, note: str = "", now=None) -> bool:
    """Open -> acknowledged. False when someone else moved it first."""
    now = now or timezone.now()
    claimed = Incident.objects.filter(pk=incident.pk, status=Incident.Status.OPEN).update(
        status=Incident.Status.ACKNOWLEDGED, acknowledged_at=now, acknowledged_by=by[:150]
    )
    if claimed:
        _journal_append(incident, _journal_entry("acknowledged", by, note, now))
    return bool(claimed)


def incident_resolve(incident: Incident, *, by: str, note: str = "", now=None) -> bool:
    """Open or acknowledged -> resolved. False when it was already resolved."""
    now = now or timezone.now()
    claimed = (
        Incident.objects.filter(pk=incident.pk)
        .exclude(status=Incident.Status.RESOLVED)
        .update(status=Incident.Status.RESOLVED, resolved_at=now, resolved_by=by[:150])
    )
    if claimed:
        _journal_append(incident, _journal_entry("resolved", by, note, now))
    return bool(claimed)


def incident_fix_applied(incident: Incident, *, by: str, note: str = "", now=None) -> bool:
    """The recommended fix (or the one in the note) was applied; recorded once."""
    now = now or timezone.now()
    claimed = Incident.objects.filter(pk=incident.pk, fix_applied_at=None).update(
        fix_applied_at=now, fix_applied_by=by[:150]
    )
    if claimed:
        _journal_append(incident, _journal_entry("fix applied", by, note, now))
    return bool(claimed)


def incident_reclassify(
    incident: Incident, *, culprit: str, by: str, note: str, now=None
) -> Incident:
    """An operator names a different culprit, with the reason. The classifier's own culprit is
    kept in ``classified_culprit`` (first override only), so reports can count corrections."""
    if culprit not in Incident.Culprit.values:
        raise ValueError(f"unknown culprit class {culprit!r}")
    if not note.strip():
        raise ValueError("a reclassification needs a note saying why")
    now = now or timezone.now()
    row = Incident.objects.only("culprit", "classified_culprit").get(pk=incident.pk)
    entry = _journal_entry(f"reclassified {row.culprit} → {culprit}", by, note, now)
    return _journal_append(
        incident,
        entry,
        culprit=culprit,
        classified_culprit=row.classified_culprit or row.culprit,
    )
