"""Writes for the fleet inventory: attempts reported by agents and schedulers."""

from __future__ import annotations

from datetime import datetime

from django.db import transaction
from django.utils import timezone

from fleet.models import Attempt, Host, Job, RankPlacement

MAX_CONFIG_KEYS = 200


def _merge(old: dict, new: dict | None) -> dict:
    merged = dict(old)
    for key, value in (new or {}).items():
        if len(merged) >= MAX_CONFIG_KEYS and key not in merged:
            break
        merged[str(key)[:100]] = str(value)[:500]
    return merged


@transaction.atomic
def attempt_report(
    *,
    job_id: str,
    number: int = 0,
    event: str,
    status: str = "",
    at: datetime | None = None,
    hostname: str = "",
    ranks: list[int] | None = None,
    world_size: int | None = None,
    job_name: str = "",
    gpu_model: str = "",
    rack: str = "",
    config: dict | None = None,
    versions: dict | None = None,
) -> Attempt:
    """Record that an attempt started or ended. Safe to repeat: every host of a job reports."""
    at = at or timezone.now()
    job, _ = Job.objects.get_or_create(external_id=job_id, defaults={"name": job_name})
    if job_name and not job.name:
        Job.objects.filter(pk=job.pk).update(name=job_name)
    attempt, created = Attempt.objects.select_for_update().get_or_create(
        job=job, number=number, defaults={"started_at": at, "status": Attempt.Status.RUNNING}
    )
    if event == "start":
        if not created and attempt.status == Attempt.Status.UNKNOWN:
            attempt.status = Attempt.Status.RUNNING
        attempt.started_at = min(attempt.started_at, at)
    else:
        attempt.ended_at = max(attempt.ended_at or at, at)
        # An incident's verdict (failed) outranks an agent's report of a clean exit.
        if attempt.status != Attempt.Status.FAILED:
            attempt.status = status or Attempt.Status.UNKNOWN
    if world_size:
        attempt.world_size = world_size
    attempt.config = _merge(attempt.config, config)
    attempt.versions = _merge(attempt.versions, versions)
    attempt.save()
    if hostname:
        host, _ = Host.objects.get_or_create(hostname=hostname)
        if rack and not host.rack:
            Host.objects.filter(pk=host.pk).update(rack=rack)
        updates = {"last_seen": timezone.now()}
        if gpu_model and not host.gpu_model:
            updates["gpu_model"] = gpu_model
        Host.objects.filter(pk=host.pk).update(**updates)
        # First report of a rank wins, as get_or_create would; one query for all of them.
        RankPlacement.objects.bulk_create(
            [RankPlacement(attempt=attempt, rank=rank, host=host) for rank in ranks or []],
            ignore_conflicts=True,
        )
    # What this attempt runs on and with: the denominator fleet memory compares failures to.
    from analysis.memory import exposures_record

    exposures_record(attempt)
    return attempt
