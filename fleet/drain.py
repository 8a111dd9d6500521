"""Drain and resume hosts through the scheduler — dry run by default, every call audited.

Two adapters: Slurm (``scontrol``) and Kubernetes (cordon, a ``NoSchedule`` taint and a node
condition, through the official client). Both leave alone a node that someone other than
Fleetwatch took out of service: Slurm by the ``Reason`` (ours start with ``fleetwatch:``),
Kubernetes by our taint. ``host_drain`` and ``drain_resume`` are the services; views, the
repaired endpoint and tasks call those, never an adapter directly.

``FLEETWATCH_DRAIN``: ``dry-run`` (default: record the command ``FLEETWATCH_DRAIN_PREVIEW``'s
adapter would run, run nothing), ``slurm`` or ``kubernetes``.
"""

from __future__ import annotations

import shlex
import subprocess
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Protocol

from django.conf import settings
from django.utils import timezone

from analysis.models import DrainAction, HostRepair, Implication
from fleet.models import Host

REASON_PREFIX = "fleetwatch:"
TAINT_KEY = "fleetwatch.io/unhealthy"
CONDITION_TYPE = "FleetwatchUnhealthy"


@dataclass(frozen=True)
class Outcome:
    result: str  # a DrainAction.Result value
    command: str
    output: str = ""


class Adapter(Protocol):
    name: str

    def drain(self, hostname: str, reason: str, *, dry_run: bool) -> Outcome: ...

    def resume(self, hostname: str, *, dry_run: bool) -> Outcome: ...


# --- Slurm -----------------------------------------------------------------------------------


def parse_scontrol_node(text: str) -> dict[str, str]:
    """``scontrol show node`` output → fields. ``Reason=`` runs to the end of its line (it may
    hold spaces, then ``[user@time]``); every other field is one ``Key=Value`` token."""
    fields: dict[str, str] = {}
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith("Reason="):
            fields["Reason"] = stripped.removeprefix("Reason=")
            continue
        for token in stripped.split():
            key, sep, value = token.partition("=")
            if sep:
                fields[key] = value
    return fields


class SlurmAdapter:
    name = "slurm"

    def __init__(self, scontrol: str = "scontrol", run=subprocess.run, timeout: float = 30.0):
        self.scontrol = scontrol
        self.run = run
        self.timeout = timeout

    def _call(self, *args: str) -> subprocess.CompletedProcess:
        return self.run(
            [self.scontrol, *args], capture_output=True, text=True, timeout=self.timeout
        )

    def _node(self, hostname: str) -> tuple[dict[str, str], str]:
        shown = self._call("show", "node", hostname)
        if shown.returncode != 0:
            return {}, (shown.stderr or shown.stdout).strip()
        return parse_scontrol_node(shown.stdout), ""

    def _update(self, args: list[str]) -> Outcome:
        done = self._call(*args)
        command = shlex.join([self.scontrol, *args])
        if done.returncode != 0:
            return Outcome("failed", command, (done.stderr or done.stdout).strip()[:2000])
        return Outcome("applied", command, done.stdout.strip()[:2000])

    def drain(self, hostname: str, reason: str, *, dry_run: bool) -> Outcome:
        args = [
            "update",
            f"NodeName={hostname}",
            "State=DRAIN",
            f"Reason={REASON_PREFIX} {reason}"[:250],
        ]
        command = shlex.join([self.scontrol, *args])
        if dry_run:
            return Outcome("dry_run", command)
        node, error = self._node(hostname)
        if error:
            return Outcome("failed", shlex.join([self.scontrol, "show", "node", hostname]), error)
        state, current = node.get("State", ""), node.get("Reason", "")
        if ("DRAIN" in state or "DOWN" in state) and not current.startswith(REASON_PREFIX):
            # Someone else took it out (maintenance, NHC): their reason must survive ours.
            return Outcome("left_alone", command, f"already {state}: {current}")
        return self._update(args)

    def resume(self, hostname: str, *, dry_run: bool) -> Outcome:
        args = ["update", f"NodeName={hostname}", "State=RESUME"]
        command = shlex.join([self.scontrol, *args])
        if dry_run:
            return Outcome("dry_run", command)
        node, error = self._node(hostname)
        if error:
            return Outcome("failed", shlex.join([self.scontrol, "show", "node", hostname]), error)
        state, current = node.get("State", ""), node.get("Reason", "")
        if "DRAIN" not in state and "DOWN" not in state:
            return Outcome("left_alone", command, f"not drained ({state})")
        if not current.startswith(REASON_PREFIX):
            return Outcome("left_alone", command, f"drained by someone else: {current}")
        return self._update(args)


# --- Kubernetes ------------------------------------------------------------------------------


def _kubernetes_api():
    # Imported here: only clusters that drain through Kubernetes need the client installed.
    from kubernetes import client, config

    try:
        config.load_incluster_config()
    except config.ConfigException:
        config.load_kube_config()
    return client.CoreV1Api()


def _field(node_part, name: str):
    if node_part is None:
        return None
    if isinstance(node_part, dict):
        return node_part.get(name)
    return getattr(node_part, name, None)


def _taints(node) -> list[dict]:
    out = []
    for taint in _field(_field(node, "spec"), "taints") or []:
        out.append(
            {
                "key": _field(taint, "key"),
                "value": _field(taint, "value"),
                "effect": _field(taint, "effect"),
            }
        )
    return out


class KubernetesAdapter:
    """Cordon + ``fleetwatch.io/unhealthy:NoSchedule`` taint + a ``FleetwatchUnhealthy`` node
    condition. Our taint marks the cordon as ours, so resume never uncordons someone else's."""

    name = "kubernetes"

    def __init__(self, api=None):
        self._api = api

    @property
    def api(self):
        if self._api is None:
            self._api = _kubernetes_api()
        return self._api

    def _condition(self, status: str, reason: str, message: str) -> dict:
        now = timezone.now().isoformat()
        return {
            "status": {
                "conditions": [
                    {
                        "type": CONDITION_TYPE,
                        "status": status,
                        "reason": reason,
                        "message": message[:1000],
                        "lastHeartbeatTime": now,
                        "lastTransitionTime": now,
                    }
                ]
            }
        }

    def drain(self, hostname: str, reason: str, *, dry_run: bool) -> Outcome:
        taint = {"key": TAINT_KEY, "value": "true", "effect": "NoSchedule"}
        plan = (
            f"patch_node({hostname}, spec.unschedulable=true, +taint {TAINT_KEY}=true:NoSchedule)"
            f"; patch_node_status({hostname}, {CONDITION_TYPE}=True)"
        )
        if dry_run:
            return Outcome("dry_run", plan)
        try:
            node = self.api.read_node(hostname)
            taints = _taints(node)
            ours = any(t["key"] == TAINT_KEY for t in taints)
            if _field(_field(node, "spec"), "unschedulable") and not ours:
                return Outcome("left_alone", plan, "cordoned by someone else")
            if not ours:
                taints.append(taint)
            self.api.patch_node(hostname, {"spec": {"unschedulable": True, "taints": taints}})
            self.api.patch_node_status(
                hostname, self._condition("True", "FleetwatchDrain", f"{REASON_PREFIX} {reason}")
            )
        except Exception as exc:  # the client raises ApiException and transport errors alike
            return Outcome("failed", plan, str(exc)[:2000])
        return Outcome("applied", plan)

    def resume(self, hostname: str, *, dry_run: bool) -> Outcome:
        plan = (
            f"patch_node({hostname}, spec.unschedulable=false, -taint {TAINT_KEY})"
            f"; patch_node_status({hostname}, {CONDITION_TYPE}=False)"
        )
        if dry_run:
            return Outcome("dry_run", plan)
        try:
            node = self.api.read_node(hostname)
            taints = _taints(node)
            if not any(t["key"] == TAINT_KEY for t in taints):
                return Outcome("left_alone", plan, "no Fleetwatch taint: not ours to uncordon")
            kept = [t for t in taints if t["key"] != TAINT_KEY]
            self.api.patch_node(hostname, {"spec": {"unschedulable": False, "taints": kept}})
            self.api.patch_node_status(
                hostname, self._condition("False", "FleetwatchRepaired", "repaired")
            )
        except Exception as exc:
            return Outcome("failed", plan, str(exc)[:2000])
        return Outcome("applied", plan)


# --- services --------------------------------------------------------------------------------

ADAPTERS = {"slurm": SlurmAdapter, "kubernetes": KubernetesAdapter}


def drain_adapter() -> tuple[Adapter, bool]:
    """The configured adapter and whether this is a dry run."""
    mode = getattr(settings, "FLEETWATCH_DRAIN", "dry-run")
    if mode == "dry-run":
        return ADAPTERS[getattr(settings, "FLEETWATCH_DRAIN_PREVIEW", "slurm")](), True
    if mode == "slurm":
        return SlurmAdapter(scontrol=getattr(settings, "FLEETWATCH_SCONTROL", "scontrol")), False
    return KubernetesAdapter(), False


def _record(host: Host, action: str, adapter: Adapter, dry_run: bool, outcome: Outcome, **kw):
    return DrainAction.objects.create(
        host=host,
        action=action,
        adapter=adapter.name,
        dry_run=dry_run,
        command=outcome.command,
        result=outcome.result,
        output=outcome.output,
        reason=kw.get("reason", "")[:2000],
        by=kw.get("by", "")[:150],
    )


def host_drain(host: Host, *, reason: str, by: str = "", adapter: Adapter | None = None):
    """Ask the scheduler to stop placing jobs on ``host``; returns the audit row."""
    dry_run = True
    if adapter is None:
        adapter, dry_run = drain_adapter()
    else:
        dry_run = getattr(settings, "FLEETWATCH_DRAIN", "dry-run") == "dry-run"
    outcome = adapter.drain(host.hostname, reason, dry_run=dry_run)
    return _record(host, "drain", adapter, dry_run, outcome, reason=reason, by=by)


def drain_resume(host: Host, by: str = "", *, adapter: Adapter | None = None):
    """Return a repaired host to service — only if Fleetwatch drained it. Called by the
    repaired endpoint; returns the audit row."""
    dry_run = True
    if adapter is None:
        adapter, dry_run = drain_adapter()
    else:
        dry_run = getattr(settings, "FLEETWATCH_DRAIN", "dry-run") == "dry-run"
    outcome = adapter.resume(host.hostname, dry_run=dry_run)
    return _record(host, "resume", adapter, dry_run, outcome, reason="repaired", by=by)


# --- host verdicts for the whole fleet -------------------------------------------------------


def hosts_health(now: datetime | None = None) -> list:
    """Every host's health. Only hosts implicated within the memory window can be anything
    but ``ok``, so only those pay for ``host_health``; the rest are ok without a query each."""
    from analysis.memory import HostHealth, hosts_health_of, window_days

    now = now or timezone.now()
    since = now - timedelta(days=window_days())
    keys = Implication.objects.filter(
        entity__kind__in=["host", "gpu", "nic"], at__gte=since
    ).values_list("entity__key", flat=True)
    implicated = {key.split("/")[0] for key in keys}
    repairs = dict(HostRepair.objects.order_by("at").values_list("host_id", "at"))
    hosts = list(Host.objects.order_by("hostname"))
    judged = hosts_health_of([h for h in hosts if h.hostname in implicated], now)
    return [
        judged.get(h.hostname) or HostHealth(h.hostname, "ok", 0.0, [], [], repairs.get(h.pk))
        for h in hosts
    ]


# Readers that many clients poll (``/metrics`` scrapers, schedulers polling the health list) share
# one computation per state of its inputs: the implications, repairs and scores behind it, and
# the time within HEALTH_SHARED_SECONDS (an implication ages out of the window without a new row).
# While the inputs stand still a request costs a few aggregate queries and a cache read, however
# many hosts are implicated; one request recomputes when they move, the others meanwhile read the
# last result.
HEALTH_SHARED_SECONDS = 60
_HEALTH_KEY = "fleetwatch:hosts-health"


def _health_inputs(now: datetime) -> str:
    from django.db.models import Count, Max

    from analysis.models import CulpritScore

    implications = Implication.objects.aggregate(n=Count("id"), last=Max("id"), at=Max("at"))
    repairs = HostRepair.objects.aggregate(n=Count("id"), last=Max("id"))
    hosts = Host.objects.aggregate(n=Count("id"), last=Max("id"))
    scores = CulpritScore.objects.filter(entity__kind="host").aggregate(
        n=Count("id"), at=Max("computed_at")
    )
    bucket = int(now.timestamp() // HEALTH_SHARED_SECONDS)
    return repr((implications, repairs, hosts, scores, bucket))


def hosts_health_shared(now: datetime | None = None) -> list:
    """``hosts_health``, computed once per state of its inputs and shared by every reader."""
    import hashlib

    from django.core.cache import cache
    from redis.exceptions import RedisError

    from analysis.memory import HostHealth

    now = now or timezone.now()
    inputs = hashlib.sha256(_health_inputs(now).encode()).hexdigest()[:16]
    try:
        stored = cache.get(_HEALTH_KEY)
        if stored and stored.get("inputs") == inputs:
            return [HostHealth(**row) for row in stored["hosts"]]
        if stored and not cache.add(f"{_HEALTH_KEY}:computing", 1, timeout=HEALTH_SHARED_SECONDS):
            # Another request is computing this state: the last one is at most a minute behind.
            return [HostHealth(**row) for row in stored["hosts"]]
    except (RedisError, OSError):
        # A cache that is down costs the computation, never the answer (as rate limits do).
        return hosts_health(now)
    every = hosts_health(now)
    try:
        cache.set(
            _HEALTH_KEY,
            {"inputs": inputs, "hosts": [vars(h) for h in every]},
            timeout=24 * 3600,
        )
        cache.delete(f"{_HEALTH_KEY}:computing")
    except (RedisError, OSError):
        pass
    return every


def forget_shared_health() -> None:
    """Drop the shared result (a database replaced under the cache: tests, a restore)."""
    from django.core.cache import cache

    cache.delete_many([_HEALTH_KEY, f"{_HEALTH_KEY}:computing"])
