"""The entities an incident implicates and the ones every attempt ran on: what fleet memory
counts. The rule-to-entity map is data (analysis.classify.registry.IMPLICATES); this reads it."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

from django.conf import settings
from django.db import transaction
from django.db.models import Q

from analysis.attempts import attempt_config_events
from analysis.classify.recurrence import (
    job_family,
)
from analysis.classify.registry import IMPLICATES
from analysis.models import Entity, Exposure, Implication, Incident
from fleet.models import Attempt, Host
from ingest.models import Event

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
# The strength given to a link that is only a sign (a lagging rank's host, a crash's job family).
WEAK_SIGN = 0.3
HARDWARE_KINDS = ("gpu_xid", "gpu_off_bus", "gpu_unreachable", "pcie_aer", "cuda_error")
CONFIG_UNRELATED = ("bad_node_hardware", "network_transport", "storage_io", "rank_desync_code")
NETWORK_KINDS = ("nccl_ib_error", "nccl_ib_call_failed", "nccl_connect_failed")
SOCKET_KINDS = ("nccl_network", "nccl_ib_unavailable")


def window_days() -> int:
    return getattr(settings, "FLEETWATCH_MEMORY_DAYS", 7)


def entity_of(kind: str, key: str, cache: dict) -> Entity:
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
        entity = entity_of(kind, key, cache)
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
