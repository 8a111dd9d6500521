"""Settings that fail more often than the fleet does on the same GPU model: failed attempts
against healthy ones, a one-sided Fisher test per setting."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.utils import timezone

from analysis.classify.recurrence import (
    fisher_greater,
)
from analysis.models import CulpritScore, Exposure, Incident
from fleet.models import Attempt, Host

from .entities import CONFIG_UNRELATED, entity_of, window_days


@dataclass(frozen=True)
class Contrast:
    gpu_model: str
    setting: str
    failed_with: int
    total_with: int
    failed_without: int
    total_without: int
    p_value: float
    failed_attempts: tuple[int, ...] = ()  # the failed attempts that ran with it, newest first

    @property
    def explanation(self) -> str:
        rate_with = self.failed_with / self.total_with if self.total_with else 0
        rate_without = self.failed_without / self.total_without if self.total_without else 0
        return (
            f"{self.setting} on {self.gpu_model or 'any GPU'}: {self.failed_with} of "
            f"{self.total_with} attempts failed ({rate_with:.0%}) vs {rate_without:.0%} "
            f"without it"
        )


def config_contrast(
    now: datetime | None = None, min_failed: int = 3, explained_incidents: Iterable[int] = ()
) -> list[Contrast]:
    """Config values and versions over-represented in failed attempts, per GPU model.

    ``explained_incidents``: incidents an accused host, rack, mount or job family accounts for;
    they are left out like those whose verdict already named such a cause."""
    now = now or timezone.now()
    since = now - timedelta(days=window_days())
    # Failures a config could explain: not those already pinned on a host, a rack, a mount or
    # the job's own code path (a busy job family would otherwise make its settings look bad).
    explained_incidents = set(explained_incidents)
    in_window, failed, explained = set(), set(), set()
    for attempt_id, status, incident_id, culprit in Attempt.objects.filter(
        started_at__gte=since,
        ended_at__lte=now,
        status__in=[Attempt.Status.FAILED, Attempt.Status.SUCCEEDED],
    ).values_list("id", "status", "incident__id", "incident__culprit"):
        in_window.add(attempt_id)
        if culprit in CONFIG_UNRELATED or incident_id in explained_incidents:
            explained.add(attempt_id)
        elif status == Attempt.Status.FAILED:
            failed.add(attempt_id)
    # One scan of the window's exposures by (entity, time), the index fleet memory reads by:
    # a join on attempts would leave the plan to row estimates that lag a growing fleet.
    model_of: dict[int, set[str]] = {}
    settings_of: dict[int, set[str]] = defaultdict(set)
    for attempt_id, kind, key in Exposure.objects.filter(
        at__gte=since, at__lte=now, entity__kind__in=["host", "config", "version"]
    ).values_list("attempt_id", "entity__kind", "entity__key"):
        if attempt_id not in in_window:
            continue
        if kind == "host":
            model_of.setdefault(attempt_id, set()).add(key)
        elif " on " not in key:  # already qualified by GPU model; the contrast does that itself
            settings_of[attempt_id].add(key if kind == "config" else f"version {key}")
    host_models = dict(Host.objects.exclude(gpu_model="").values_list("hostname", "gpu_model"))
    by_model: dict[str, list[int]] = defaultdict(list)
    for attempt_id, hosts in model_of.items():
        if attempt_id in explained:
            continue
        models_seen = {host_models.get(h, "") for h in hosts} - {""}
        for model in models_seen or {""}:
            by_model[model].append(attempt_id)
    found = []
    for model, ids in by_model.items():
        values = defaultdict(lambda: [0, 0])
        failed_ids: dict[str, list[int]] = defaultdict(list)
        for attempt_id in ids:
            for setting in settings_of.get(attempt_id, ()):
                values[setting][0] += attempt_id in failed
                values[setting][1] += 1
                if attempt_id in failed:
                    failed_ids[setting].append(attempt_id)
        total_failed = sum(1 for i in ids if i in failed)
        for setting, (failed_with, total_with) in values.items():
            failed_without = total_failed - failed_with
            total_without = len(ids) - total_with
            if failed_with < min_failed:
                continue
            p = fisher_greater(
                failed_with,
                total_with - failed_with,
                failed_without,
                total_without - failed_without,
            )
            rate_with = failed_with / total_with
            rate_without = failed_without / total_without if total_without else 0.0
            if p < 1e-3 and rate_with >= 3 * max(rate_without, 0.01):
                found.append(
                    Contrast(
                        model,
                        setting,
                        failed_with,
                        total_with,
                        failed_without,
                        total_without,
                        p,
                        tuple(sorted(failed_ids[setting], reverse=True)),
                    )
                )
    return sorted(found, key=lambda c: c.p_value)


def config_contrast_record(
    now: datetime, explained_incidents: Iterable[int] = ()
) -> list[CulpritScore]:
    """Store contrast findings as scores on ``config`` entities qualified by GPU model."""
    import math

    out = []
    cache: dict = {}
    for c in config_contrast(now, explained_incidents=explained_incidents):
        kind = "version" if c.setting.startswith("version ") else "config"
        key = f"{c.setting.removeprefix('version ')} on {c.gpu_model or 'any GPU'}"
        entity = entity_of(kind, key, cache)
        previous = CulpritScore.objects.filter(entity=entity).first()
        first = previous.first_flagged_at if previous and previous.first_flagged_at else now
        count = (
            previous.incidents_when_flagged
            if previous and previous.incidents_when_flagged
            else c.failed_with
        )
        # The failed attempts behind the finding, and the incidents they have: a culprit page
        # lists what stands behind the accusation, whatever kind of entity it is.
        attempts = list(c.failed_attempts[:50])
        incidents = list(
            Incident.objects.filter(attempt_id__in=attempts)
            .order_by("-opened_at")
            .values_list("pk", flat=True)
        )
        score, _ = CulpritScore.objects.update_or_create(
            entity=entity,
            defaults={
                "culprit": "software_version" if kind == "version" else "parallelism_config",
                "score": round(min(50.0, -math.log10(max(c.p_value, 1e-50))), 2),
                "flagged": True,
                "implicated": c.failed_with,
                "exposed": c.total_with,
                "baseline": c.failed_without / c.total_without if c.total_without else 0.0,
                "explanation": c.explanation,
                "incidents": incidents,
                "attempts": attempts,
                "first_flagged_at": first,
                "incidents_when_flagged": count,
                "computed_at": now,
            },
        )
        out.append(score)
    return out
