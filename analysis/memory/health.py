"""A host's health (ok, watch, drain) from its recent implications and its score, and the
repairs that start it afresh."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.db.models import Q
from django.utils import timezone

from analysis.classify.recurrence import (
    decay,
)
from analysis.models import CulpritScore, HostRepair, Implication
from fleet.models import Host

from .entities import window_days

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
