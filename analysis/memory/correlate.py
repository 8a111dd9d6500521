"""Recurrence across the fleet: each entity's implications against its exposures, decayed over
the memory window, scored by the pure statistics of analysis.classify.recurrence."""

from __future__ import annotations

from collections import defaultdict
from datetime import datetime, timedelta

from django.db.models import F, FloatField, Func, Q, Sum, Value
from django.db.models.functions import Power
from django.utils import timezone

from analysis.classify.recurrence import (
    HALF_LIFE_DAYS,
    assess,
    decay,
    suspicious,
)
from analysis.models import CulpritScore, Entity, Exposure, Implication
from fleet.models import Attempt

from .contrast import config_contrast_record
from .culprits import culprits_notify_flagged, culprits_regress
from .entities import CONFIG_UNRELATED, window_days

# The fleet rate before there is history to measure it: 1 failure in 100 attempts, as strong
# as 100 attempts of evidence.
PRIOR_RATE = 0.01
PRIOR_ATTEMPTS = 100.0
# Entities that, once accused, explain the failures that implicated them better than any setting
# those jobs ran with: a rack that falls back to sockets fails every job placed on it, whatever
# their tensor-parallel degree.
EXPLAINING_KINDS = ("host", "gpu", "nic", "rack", "mount", "job_family")

ROLES = {
    "lagging_rank": "ran the rank the others waited for",
    "gpu_hardware_fault": "had a GPU hardware fault",
    "pcie_link_replaying": "had a GPU link replaying past NVIDIA's limit",
    "network_errors": "reported network errors",
    "socket_transport_multinode": "fell back to socket transport",
    "storage_stall": "stalled storage",
}


class _EpochSeconds(Func):
    """A timestamp as seconds since 1970, on PostgreSQL and on SQLite."""

    output_field = FloatField()

    def as_postgresql(self, compiler, connection, **extra):
        template = "EXTRACT(EPOCH FROM %(expressions)s)::double precision"
        return self.as_sql(compiler, connection, template=template, **extra)

    def as_sqlite(self, compiler, connection, **extra):
        template = "((julianday(%(expressions)s) - 2440587.5) * 86400.0)"
        return self.as_sql(compiler, connection, template=template, **extra)


def _decayed(field_name: str, now: datetime):
    """SQL for ``decay(now - field)``: the weight of evidence as old as the field says."""
    age = Value(now.timestamp()) - _EpochSeconds(F(field_name))
    return Power(Value(0.5), age / Value(HALF_LIFE_DAYS * 86400.0), output_field=FloatField())


def fleet_correlate(now: datetime | None = None) -> list[CulpritScore]:
    """Recompute every entity's recurrence score over the memory window."""
    now = now or timezone.now()
    since = now - timedelta(days=window_days())
    implications = (
        Implication.objects.filter(at__gte=since, at__lte=now)
        .select_related("entity")
        .order_by("-at")
    )
    per_entity: dict[int, dict] = {}
    # What each incident implicated, per kind of entity: the fleet rate is built from these.
    incident_kinds: dict[int, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for imp in implications:
        entry = per_entity.setdefault(
            imp.entity_id,
            {
                "entity": imp.entity,
                "weight": 0.0,
                "incidents": {},
                "rules": defaultdict(int),
                "culprits": defaultdict(float),
                "strongest": 0.0,
            },
        )
        if imp.incident_id in entry["incidents"]:
            continue
        entry["incidents"][imp.incident_id] = imp.at
        w = decay((now - imp.at).total_seconds())
        entry["weight"] += w
        entry["rules"][imp.rule_id] += 1
        entry["culprits"][imp.culprit] += w * imp.confidence
        entry["strongest"] = max(entry["strongest"], imp.confidence)
        incident_kinds[imp.incident_id][imp.entity.kind] += w
    # Exposures: decayed attempts per entity, and totals per kind for the fleet baseline.
    exposure_w: dict[int, float] = defaultdict(float)
    kind_exposure: dict[str, float] = defaultdict(float)
    # An attempt counts once it could have failed: it ended, or has run for half a day (agents
    # do not always report a clean end).
    settled = Q(attempt__ended_at__lte=now) | Q(
        attempt__ended_at__isnull=True, at__lte=now - timedelta(hours=12)
    )
    # Summed in the database, one row per entity: a week of a large fleet is 10^5 exposures.
    exposures = (
        Exposure.objects.filter(settled, at__gte=since, at__lte=now)
        .values("entity_id", "entity__kind")
        .annotate(w=Sum(_decayed("at", now)))
        .values_list("entity_id", "entity__kind", "w")
    )
    for entity_id, kind, w in exposures:
        exposure_w[entity_id] += w
        kind_exposure[kind] += w
    # GPUs and NICs are exposed whenever their host is.
    host_ids = dict(Entity.objects.filter(kind="host").values_list("key", "id"))

    def exposed_of(entity_id: int, entry: dict) -> float:
        entity = entry["entity"]
        if entity.kind in ("gpu", "nic"):
            return exposure_w.get(host_ids.get(entity.key.split("/")[0]), 0.0)
        if entity.kind == "mount":
            # No attempt reports the mounts it writes to: judge a mount by the distinct jobs it
            # stalled, the direct kernel evidence being strong on its own.
            return max(exposure_w.get(entity_id, 0.0), entry["weight"])
        return exposure_w.get(entity_id, 0.0)

    # Attempts and their failures, decayed: the fleet rate settings and versions are held to.
    attempts_w, unexplained_w = 0.0, 0.0
    unexplained: dict[int, float] = {}
    failed_attempt: dict[int, float] = {}
    for started, incident_id, culprit, opened in Attempt.objects.filter(
        Q(ended_at__lte=now) | Q(ended_at__isnull=True, started_at__lte=now - timedelta(hours=12)),
        started_at__gte=since,
        started_at__lte=now,
    ).values_list("started_at", "incident__id", "incident__culprit", "incident__opened_at"):
        w = decay((now - started).total_seconds())
        attempts_w += w
        if incident_id is None or opened > now:
            continue
        failed_attempt[incident_id] = w
        if culprit not in CONFIG_UNRELATED:
            unexplained[incident_id] = w
            unexplained_w += w

    def judge(entity_id: int, entry: dict, accused: dict[str, list[int]]):
        """The entity against the rest of the fleet: the rate at which other entities of its
        kind were implicated, leaving out every incident that implicated this entity (an
        incident names a setting and the same setting on a GPU model together; counting the
        sibling would make the culprit raise its own bar) and everything already accused (the
        fleet rate is that of entities under no suspicion)."""
        entity = entry["entity"]
        base_kind = "host" if entity.kind in ("gpu", "nic") else entity.kind
        exposed = exposed_of(entity_id, entry)
        rest_exposed = kind_exposure.get(base_kind, 0.0)
        if base_kind == entity.kind:
            rest_exposed -= exposed
        others = [a for a in accused.get(base_kind, ()) if a != entity_id]
        if len(others) == len(accused.get(base_kind, ())):
            left_out = accused_incidents[base_kind] | set(entry["incidents"])
        else:
            left_out = set(entry["incidents"]).union(*(per_entity[a]["incidents"] for a in others))
        rest_exposed -= sum(exposure_w.get(a, 0.0) for a in others)
        implicated_rest = kind_implicated[base_kind] - sum(
            incident_kinds[i].get(base_kind, 0.0) for i in left_out
        )
        if base_kind in ("config", "version"):
            # A rule that names a setting names it whenever its job times out, whatever the
            # cause; most settings are never named by any rule. So a setting is measured against
            # how often the rest of the fleet's attempts fail for no reason already pinned on a
            # host, a rack, a mount or a job's code path.
            implicated_rest = unexplained_w - sum(unexplained.get(i, 0.0) for i in left_out)
            rest_exposed = (
                attempts_w
                - exposed
                - sum(failed_attempt.get(i, 0.0) for i in left_out - entry["incidents"].keys())
            )
        # The fleet rate is taken at the high end of what its counts allow (one failure more
        # than seen), and with little history it is shrunk toward a healthy fleet's
        # (PRIOR_RATE, worth PRIOR_ATTEMPTS attempts): a rate measured from a handful of
        # failures would otherwise accuse whatever had a little bad luck.
        baseline = (max(implicated_rest, 0.0) + 1.0 + PRIOR_RATE * PRIOR_ATTEMPTS) / (
            max(rest_exposed, 0.0) + PRIOR_ATTEMPTS
        )
        if entity.kind == "mount":
            baseline = 0.05
        top_rule = max(entry["rules"], key=entry["rules"].get)
        return assess(
            label=f"{entity.kind} {entity.key}",
            role=ROLES.get(top_rule, f"implicated ({top_rule.replace('_', ' ')})"),
            implicated=entry["weight"],
            exposed=exposed,
            incidents=len(entry["incidents"]),
            baseline=min(baseline, 0.5),
            window_days=window_days(),
            strongest=entry["strongest"],
        )

    kind_implicated: dict[str, float] = defaultdict(float)
    for kinds in incident_kinds.values():
        for kind, w in kinds.items():
            kind_implicated[kind] += w
    # The fleet rate is estimated from entities under no suspicion: judge, set the suspects
    # aside, judge again, until they no longer change (a few rounds at most). Two culprits of a
    # kind that start failing together would otherwise each raise the other's bar.
    accused: dict[str, list[int]] = {}
    accused_incidents: dict[str, set[int]] = defaultdict(set)
    results: dict = {}
    for _round in range(4):
        results = {eid: judge(eid, entry, accused) for eid, entry in per_entity.items()}
        now_accused: dict[str, list[int]] = defaultdict(list)
        for eid, result in results.items():
            if suspicious(result, len(per_entity[eid]["incidents"])):
                now_accused[per_entity[eid]["entity"].kind].append(eid)
        if now_accused == accused:
            break
        accused = dict(now_accused)
        accused_incidents = defaultdict(set)
        for kind, ids in accused.items():
            accused_incidents[kind] = set().union(*(per_entity[a]["incidents"] for a in ids))

    existing = {
        entity_id: (first, count)
        for entity_id, first, count in CulpritScore.objects.values_list(
            "entity_id", "first_flagged_at", "incidents_when_flagged"
        )
    }
    out = []
    newly_flagged: list[int] = []
    for entity_id, entry in per_entity.items():
        result = results[entity_id]
        culprit = max(entry["culprits"], key=entry["culprits"].get)
        first_flagged, flagged_count = existing.get(entity_id, (None, None))
        if result.flagged and first_flagged is None:
            first_flagged, flagged_count = now, len(entry["incidents"])
            newly_flagged.append(entity_id)
        out.append(
            CulpritScore(
                entity=entry["entity"],
                culprit=culprit,
                score=result.score,
                flagged=result.flagged,
                implicated=round(result.implicated, 3),
                exposed=round(result.exposed, 3),
                baseline=result.baseline,
                explanation=result.explanation,
                incidents=list(entry["incidents"])[:50],
                first_flagged_at=first_flagged,
                incidents_when_flagged=flagged_count,
                computed_at=now,
            )
        )
    # One upsert for every score: a fleet has thousands of implicated entities.
    CulpritScore.objects.bulk_create(
        out,
        batch_size=500,
        update_conflicts=True,
        unique_fields=["entity"],
        update_fields=[
            "culprit",
            "score",
            "flagged",
            "implicated",
            "exposed",
            "baseline",
            "explanation",
            "incidents",
            "first_flagged_at",
            "incidents_when_flagged",
            "computed_at",
        ],
    )
    # Entities with no implication left in the window are no longer accused.
    CulpritScore.objects.exclude(entity_id__in=per_entity).update(flagged=False, score=0.0)
    explained = set().union(
        *(
            entry["incidents"]
            for entity_id, entry in per_entity.items()
            if results[entity_id].flagged and entry["entity"].kind in EXPLAINING_KINDS
        )
    )
    contrasts = config_contrast_record(now, explained)
    newly_flagged += [score.entity_id for score in contrasts if score.first_flagged_at == now]
    out.extend(contrasts)
    culprits_notify_flagged(newly_flagged)
    culprits_regress(now)
    return out
