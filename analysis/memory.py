"""Fleet memory: link each incident to the entities its verdict implicates, record what every
attempt ran on, and score entities whose implications recur more than chance allows.

Writes (``*_record``, ``incident_implicate``, ``fleet_correlate``, ``host_repaired``) and the
reads that compose them (``host_health``, ``config_contrast``) live here because they share one
vocabulary of entities; the statistics themselves are pure (analysis.classify.recurrence).
"""

from __future__ import annotations

import hashlib
import logging
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import F, FloatField, Func, Q, Sum, Value
from django.db.models.functions import Power
from django.utils import timezone

from analysis.attempts import attempt_config_events
from analysis.classify.recurrence import (
    FLAG_SCORE,
    HALF_LIFE_DAYS,
    assess,
    decay,
    fisher_greater,
    job_family,
    suspicious,
)
from analysis.classify.registry import IMPLICATES
from analysis.models import CulpritScore, Entity, Exposure, HostRepair, Implication, Incident
from fleet.models import Attempt, Host
from ingest.models import Event

log = logging.getLogger(__name__)

# Config keys whose values are worth contrasting between failed and healthy attempts.
CONTRAST_KEYS = (
    "pipeline_parallel",
    "tensor_parallel",
    "data_parallel",
    "num_workers",
    "prefetch",
    "prefetch_factor",
    "nnodes",
    "nproc_per_node",
    "sequence_parallel",
)
# Verdict rules -> how they implicate entities; (kind, how, culprit override).
# The strength given to a link that is only a sign (a lagging rank's host, a crash's job family).
WEAK_SIGN = 0.3
# The fleet rate before there is history to measure it: 1 failure in 100 attempts, as strong
# as 100 attempts of evidence.
PRIOR_RATE = 0.01
PRIOR_ATTEMPTS = 100.0
HARDWARE_KINDS = ("gpu_xid", "gpu_off_bus", "gpu_unreachable", "pcie_aer", "cuda_error")
CONFIG_UNRELATED = ("bad_node_hardware", "network_transport", "storage_io", "rank_desync_code")
# Entities that, once accused, explain the failures that implicated them better than any setting
# those jobs ran with: a rack that falls back to sockets fails every job placed on it, whatever
# their tensor-parallel degree.
EXPLAINING_KINDS = ("host", "gpu", "nic", "rack", "mount", "job_family")
NETWORK_KINDS = ("nccl_ib_error", "nccl_ib_call_failed", "nccl_connect_failed")
SOCKET_KINDS = ("nccl_network", "nccl_ib_unavailable")


def window_days() -> int:
    return getattr(settings, "FLEETWATCH_MEMORY_DAYS", 7)


def _entity(kind: str, key: str, cache: dict) -> Entity:
    k = (kind, key[:255])
    if k not in cache:
        cache[k], _ = Entity.objects.get_or_create(kind=kind, key=key[:255])
    return cache[k]


def _entities(pairs: list[tuple[str, str]]) -> dict[tuple[str, str], Entity]:
    """Get or create many entities in three queries, whatever their number."""
    wanted = {(kind, key[:255]) for kind, key in pairs}
    if not wanted:
        return {}

    def fetch() -> dict[tuple[str, str], Entity]:
        match = Q()
        for kind in {kind for kind, _ in wanted}:
            match |= Q(kind=kind, key__in=[key for k, key in wanted if k == kind])
        return {(e.kind, e.key): e for e in Entity.objects.filter(match)}

    found = fetch()
    missing = wanted - set(found)
    if missing:
        # Another worker may create the same entity at the same moment: ignore and re-read.
        Entity.objects.bulk_create(
            [Entity(kind=kind, key=key) for kind, key in missing], ignore_conflicts=True
        )
        found = fetch()
    return found


def _canonical_config(attempt: Attempt) -> dict[str, str]:
    """The attempt's reported settings under canonical keys (same names as the log parser's)."""
    out: dict[str, str] = {}
    for event in attempt_config_events(attempt):
        key = getattr(event, "key", "")
        if key:
            out[key] = event.value
    return out


def attempt_entities(attempt: Attempt) -> list[tuple[str, str]]:
    """What an attempt ran on or with — for failed and healthy attempts alike."""
    hosts = set(attempt.placements.values_list("host__hostname", flat=True))
    hosts |= set(attempt.uploads.values_list("host__hostname", flat=True))
    found: list[tuple[str, str]] = [("host", h) for h in sorted(hosts)]
    racks = Host.objects.filter(hostname__in=hosts).exclude(rack="").values_list("rack", flat=True)
    found += [("rack", r) for r in sorted(set(racks))]
    config = _canonical_config(attempt)
    settings_run = [f"{k}={config[k]}" for k in CONTRAST_KEYS if k in config]
    found += [("config", setting) for setting in settings_run]
    # A setting can fail on one GPU model only (a pipeline degree on PCIe-only GPUs): the
    # setting on each model the attempt ran on is an entity of its own.
    models = _models(hosts)
    found += [("config", f"{setting} on {m}") for setting in settings_run for m in models]
    found += [("version", f"{k}={v}") for k, v in sorted(attempt.versions.items())]
    family = job_family(attempt.job.name or attempt.job.external_id)
    found.append(("job_family", family))
    return found


def _models(hostnames) -> list[str]:
    return sorted(
        set(
            Host.objects.filter(hostname__in=hostnames)
            .exclude(gpu_model="")
            .values_list("gpu_model", flat=True)
        )
    )


def exposures_record(attempt: Attempt) -> None:
    pairs = attempt_entities(attempt)
    entities = _entities(pairs)
    rows = [
        Exposure(attempt=attempt, entity=entities[(kind, key[:255])], at=attempt.started_at)
        for kind, key in pairs
    ]
    Exposure.objects.bulk_create(rows, ignore_conflicts=True)


@dataclass
class _Links:
    rows: list[tuple[str, str, str, str, float, str]] = field(default_factory=list)

    def add(self, kind, key, culprit, rule_id, confidence, why):
        if key:
            self.rows.append((kind, key, culprit, rule_id, confidence, why))


def _event_hosts(attempt: Attempt, kinds: tuple[str, ...]):
    return Event.objects.filter(attempt=attempt, kind__in=kinds).values_list(
        "kind", "attrs", "upload__host__hostname", "rank"
    )


def incident_implicate(incident: Incident, attempt: Attempt) -> list[Implication]:
    """Turn the verdict (every matched rule, named or weak) into implicated entities."""
    matches = {m["rule_id"]: m for m in incident.matches}
    links = _Links()
    rank_hosts = dict(attempt.placements.values_list("rank", "host__hostname"))

    def conf(rule_id: str) -> float:
        return matches[rule_id]["confidence"]

    for rule_id, match in matches.items():
        for how in IMPLICATES.get(rule_id, ()):
            _implicate(
                how, rule_id, match["culprit"], conf(rule_id), attempt, incident, links, rank_hosts
            )
    # The ranks the others waited for: a host that keeps holding them up is a bad node, even
    # when no single incident can say why.
    # When another entity explains why the others waited, the lagging rank's host is not the
    # suspect; only unexplained (or hardware) verdicts implicate it.
    explained = incident.culprit not in ("unknown", "bad_node_hardware")
    for host, _why in [] if explained else _suspect_hosts(incident, rank_hosts):
        links.add(
            "host",
            host,
            "bad_node_hardware",
            "lagging_rank",
            WEAK_SIGN,
            "ran the rank the others waited for",
        )

    cache: dict = {}
    rows = []
    seen = set()
    for kind, key, culprit, rule_id, confidence, why in links.rows:
        entity = _entity(kind, key, cache)
        if (entity.pk, rule_id) in seen:
            continue
        seen.add((entity.pk, rule_id))
        rows.append(
            Implication(
                incident=incident,
                entity=entity,
                culprit=culprit,
                rule_id=rule_id,
                confidence=confidence,
                why=why[:500],
                at=incident.opened_at,
            )
        )
    with transaction.atomic():
        Implication.objects.filter(incident=incident).delete()
        Implication.objects.bulk_create(rows)
        top = max(rows, key=lambda r: r.confidence, default=None)
        fingerprint = incident_fingerprint(incident.culprit, top, incident.signature)
        Incident.objects.filter(pk=incident.pk).update(fingerprint=fingerprint)
    return rows


def _suspect_hosts(incident: Incident, rank_hosts: dict[int, str]):
    """(host, why) of each suspect: named hosts, and the hosts the suspected ranks ran on."""
    for suspect in incident.suspects:
        host = suspect["id"] if suspect["kind"] == "host" else None
        if suspect["kind"] == "rank" and suspect["id"].isdigit():
            host = rank_hosts.get(int(suspect["id"]))
        if host:
            yield host, suspect["why"]


def _implicate(
    how: str,
    rule_id: str,
    culprit: str,
    confidence: float,
    attempt,
    incident,
    links,
    rank_hosts: dict[int, str],
):
    """One entry of the rule registry's ``IMPLICATES`` (analysis/classify/registry.py)."""
    if how == "hardware_hosts":
        for kind, attrs, host, _rank in _event_hosts(attempt, HARDWARE_KINDS):
            pci = attrs.get("pci") or attrs.get("device") or ""
            why = f"{kind.replace('_', ' ')} {attrs.get('code') or ''}".strip()
            links.add("host", host, culprit, rule_id, confidence, why)
            if pci:
                links.add("gpu", f"{host}/{pci}", culprit, rule_id, confidence, why)
    elif how == "network_hosts":
        for _kind, attrs, host, _rank in _event_hosts(attempt, NETWORK_KINDS):
            where = attrs.get("host") or host
            links.add("host", where, culprit, rule_id, confidence, "reported NCCL network errors")
            detail = attrs.get("detail") or ""
            hca = detail.split("hca ")[-1].split()[0] if "hca " in detail else ""
            if hca:
                links.add("nic", f"{where}/{hca}", culprit, rule_id, confidence, "IB errors here")
    elif how == "socket_racks":
        hosts = {
            attrs.get("host") or h
            for kind, attrs, h, _r in _event_hosts(attempt, SOCKET_KINDS)
            if kind == "nccl_ib_unavailable" or attrs.get("network", "").lower() == "socket"
        }
        racks = Host.objects.filter(hostname__in=hosts).values_list("hostname", "rack")
        for host, rack in racks:
            links.add(
                "rack" if rack else "host",
                rack or host,
                culprit,
                rule_id,
                confidence,
                "NCCL fell back to sockets here",
            )
    elif how == "stall_mounts":
        stalls = list(_event_hosts(attempt, ("storage_stall",)))
        named_mount = any(attrs.get("mount") for _k, attrs, _h, _r in stalls)
        for _kind, attrs, host, _rank in stalls:
            mount = attrs.get("mount") or ""
            if not mount and named_mount:
                continue  # a hung task beside a stalled mount is the mount's doing
            if mount:
                why = f"{attrs.get('signature', 'stall')} on {host}"
                links.add("mount", mount, culprit, rule_id, confidence, why)
            else:
                # A hung task without a named mount: the host's own disks are the suspect.
                why = "storage stalled on this host"
                links.add("host", host, culprit, rule_id, confidence, why)
    elif how == "signature_hosts":
        for _kind, attrs, host, _rank in _event_hosts(attempt, ("known_signature",)):
            why = f"known issue {attrs.get('signature', '')} in its logs"
            links.add("host", host, culprit, rule_id, confidence, why)
    elif how == "suspect_hosts":
        for host, why in _suspect_hosts(incident, rank_hosts):
            links.add("host", host, culprit, rule_id, confidence, why[:200])
    elif how.startswith("config:"):
        config = _canonical_config(attempt)
        models = _models(attempt.placements.values_list("host__hostname", flat=True))
        for key in how.removeprefix("config:").split(","):
            if key not in config:
                continue
            setting = f"{key}={config[key]}"
            for target in [setting] + [f"{setting} on {m}" for m in models]:
                links.add(
                    "config", target, culprit, rule_id, confidence, "setting in the failing job"
                )
    elif how in ("job_family", "job_family_weak"):
        # A crash is sure of the rank that died, not of the code that ran there (memory
        # pressure, a bad GPU, bad data): for the job family it is a weak sign.
        weak = how == "job_family_weak"
        links.add(
            "job_family",
            job_family(attempt.job.name or attempt.job.external_id),
            culprit,
            rule_id,
            min(confidence, WEAK_SIGN) if weak else confidence,
            "a rank of this job family crashed first" if weak else "this job family's code path",
        )
    elif how == "versions":
        for key, value in attempt.versions.items():
            links.add(
                "version",
                f"{key}={value}",
                culprit,
                rule_id,
                confidence,
                "version in the failing job",
            )
    else:  # pragma: no cover - the registry test holds every entry to this vocabulary
        raise ValueError(f"unknown implication {how!r} of rule {rule_id}")


def incident_fingerprint(culprit: str, top: Implication | None, signature: str = "") -> str:
    """Same cause: the same culprit named by the same rule with the same shape of evidence
    (the verdict's parameterised signature), on the same implicated entity when there is one.
    A culprit class alone is no cause: a collective mismatch and an unseeded split are both
    rank_desync_code and must not count as one recurring problem."""
    entity = f"{top.entity.kind}:{top.entity.key}|{top.rule_id}" if top else ""
    basis = f"{culprit}|{entity}|{signature}"
    return hashlib.sha256(basis.encode()).hexdigest()[:16]


ROLES = {
    "lagging_rank": "ran the rank the others waited for",
    "gpu_hardware_fault": "had a GPU hardware fault",
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


# --- culprits as the unit of work ----------------------------------------------------------------


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
        entity = _entity(kind, key, cache)
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


# --- host health ---------------------------------------------------------------------------

DRAIN_SCORE = 6.0


@dataclass(frozen=True)
class HostHealth:
    hostname: str
    verdict: str  # ok | watch | drain
    score: float
    reasons: list[str]
    incidents: list[int]
    since: datetime | None  # last repair, when health started afresh


def host_health(host: Host, now: datetime | None = None) -> HostHealth:
    return hosts_health_of([host], now)[host.hostname]


def hosts_health_of(hosts: Iterable[Host], now: datetime | None = None) -> dict[str, HostHealth]:
    """The health of each of ``hosts``, in a fixed number of queries whatever their number (an
    overview of a fleet with hundreds of implicated hosts pays no query per host)."""
    now = now or timezone.now()
    hosts = list(hosts)
    names = {h.hostname for h in hosts}
    window_start = now - timedelta(days=window_days())
    repairs: dict[int, datetime] = {}
    for host_id, at in HostRepair.objects.filter(host__in=hosts).values_list("host_id", "at"):
        repairs[host_id] = max(at, repairs.get(host_id, at))
    # A host's implications are those of the host itself and of its GPUs and NICs ("host/…").
    implications = Implication.objects.filter(
        entity__kind__in=["host", "gpu", "nic"], at__gte=window_start
    )
    if len(names) <= 50:
        mine = Q()
        for name in names:
            mine |= Q(entity__key=name) | Q(entity__key__startswith=f"{name}/")
        implications = implications.filter(mine) if names else implications.none()
    by_host: dict[str, list[Implication]] = defaultdict(list)
    for imp in implications.select_related("entity").order_by("-at"):
        name = imp.entity.key.split("/", 1)[0]
        if name in names:
            by_host[name].append(imp)
    scores = {
        row.entity.key: row
        for row in CulpritScore.objects.filter(
            entity__kind="host", entity__key__in=names
        ).select_related("entity")
    }
    out = {}
    for host in hosts:
        repair = repairs.get(host.pk)
        since = max(window_start, repair) if repair else window_start
        mine = [i for i in by_host[host.hostname] if i.at >= since]
        out[host.hostname] = _health(host, mine, scores.get(host.hostname), repair, now)
    return out


def _health(host: Host, implications: list, score_row, repair, now) -> HostHealth:
    reasons: list[str] = []
    incidents: list[int] = []
    hardware = False
    weight = 0.0
    for imp in implications:
        if imp.incident_id not in incidents:
            incidents.append(imp.incident_id)
        weight += decay((now - imp.at).total_seconds()) * imp.confidence
        if imp.rule_id == "gpu_hardware_fault" and imp.confidence >= 0.8:
            hardware = True
            reason = f"GPU hardware fault ({imp.why}) in incident {imp.incident_id}"
            if reason not in reasons:
                reasons.append(reason)
    score = score_row.score if score_row and incidents else 0.0
    if score_row and score_row.flagged and incidents:
        reasons.append(score_row.explanation)
    if hardware or (score_row and score_row.flagged and score >= DRAIN_SCORE and incidents):
        verdict = "drain"
    elif incidents and (weight >= 0.25 or (score_row and score_row.flagged)):
        verdict = "watch"
        if not reasons:
            reasons.append(f"implicated in {len(incidents)} recent incident(s)")
    else:
        verdict = "ok"
    if verdict == "ok" and incidents:
        reasons.append(f"weakly implicated in {len(incidents)} incident(s); evidence decays")
    return HostHealth(host.hostname, verdict, round(score, 2), reasons, incidents[:50], repair)


def host_repaired(host: Host, *, note: str = "", by: str = "") -> HostRepair:
    return HostRepair.objects.create(host=host, note=note[:2000], by=by[:150])


__all__ = [
    "FLAG_SCORE",
    "Contrast",
    "HostHealth",
    "config_contrast",
    "exposures_record",
    "fleet_correlate",
    "host_health",
    "host_repaired",
    "incident_implicate",
]
