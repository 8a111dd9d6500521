"""Rows for operations tests: a host that fleet memory wants drained, incidents with known
run times."""

from __future__ import annotations

from datetime import timedelta

from django.utils import timezone


def incident_on(
    hostname,
    *,
    job="job-1",
    culprit="bad_node_hardware",
    started=None,
    hours=2.0,
    world_size=8,
    rule_id="gpu_hardware_fault",
    confidence=0.9,
    fingerprint="fp-1",
):
    from analysis.models import Entity, Implication, Incident
    from fleet.models import Attempt, Host, Job

    ended = (started or timezone.now() - timedelta(hours=hours + 1)) + timedelta(hours=hours)
    host, _ = Host.objects.get_or_create(hostname=hostname)
    job_row, _ = Job.objects.get_or_create(external_id=job)
    attempt = Attempt.objects.create(
        job=job_row,
        number=job_row.attempts.count(),
        status="failed",
        started_at=ended - timedelta(hours=hours),
        ended_at=ended,
        world_size=world_size,
    )
    incident = Incident.objects.create(
        attempt=attempt,
        job=job_row,
        culprit=culprit,
        confidence=confidence,
        fix="replace the GPU",
        fingerprint=fingerprint,
        opened_at=ended,
    )
    entity, _ = Entity.objects.get_or_create(kind="host", key=hostname)
    Implication.objects.create(
        incident=incident,
        entity=entity,
        culprit=culprit,
        rule_id=rule_id,
        confidence=confidence,
        why="gpu xid 79",
        at=ended,
    )
    return host, incident


def flagged_host(hostname, *, culprit="bad_node_hardware", **fields):
    """A host fleet memory has flagged as a culprit (a CulpritScore as fleet_correlate writes
    one); ``fields`` override the figures or set the workflow status."""
    from analysis.models import CulpritScore, Entity

    figures = {
        "score": 9.0,
        "flagged": True,
        "implicated": 3,
        "exposed": 4,
        "baseline": 0.01,
        "explanation": "e",
        "computed_at": timezone.now(),
    }
    return CulpritScore.objects.create(
        entity=Entity.objects.get_or_create(kind="host", key=hostname)[0],
        culprit=culprit,
        **{**figures, **fields},
    )
