"""Facts: what all ranks' events say together, computed once and read by every rule.

The key fact is each rank's progress in each process group. Within one group a collective
completes on every member or on none, so a rank whose *last enqueued* seq is behind the others
never reached the collective they are waiting in: it is the lagging rank, and the ranks that
report the timeout are usually innocent.
"""

from __future__ import annotations

import dataclasses
import re
import statistics
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field

from ingest.parsers.events import DumpSignal, Event, WatchdogTimeout, WorkProgress

from .model import IncidentContext

DEFAULT_PG = "0"
FAULT_SIGNALS = frozenset({"SIGSEGV", "SIGBUS", "SIGILL", "SIGFPE"})
GROWTH = 1.5  # the later steps over the earlier ones: "step time grows"


def _pg_key(pg: str | None) -> str:
    return DEFAULT_PG if pg in (None, "", "0", "default_pg") else pg


# A collective timeout raised as an exception rather than reported by the NCCL watchdog: gloo
# ("Timed out waiting 6000ms for recv operation to complete"), NCCL with blocking wait
# (NCCL_BLOCKING_WAIT / TORCH_NCCL_BLOCKING_WAIT: "... Operation timed out!"), and the
# watchdog's own message re-raised by a wrapper.
# gloo's pair.cc closes a pair whose operation outlived the timeout with "Application timeout
# caused pair closure".
_TIMEOUT_WORDS = (
    "timed out",
    "watchdog caught collective operation timeout",
    "application timeout caused pair closure",
)
_COLLECTIVE_WORDS = (
    "gloo",
    "nccl",
    "operation timed out",
    "collective",
    "distbackenderror",
    "pair closure",
)


# gloo/transport/tcp/unbound_buffer.cc: "Timed out waiting 6000ms for recv operation to complete".
_GLOO_WAIT = re.compile(r"Timed out waiting (\d+)ms")


def _collective_timeout(event) -> bool:
    text = f"{event.exc_type} {event.message}".lower()
    return any(w in text for w in _TIMEOUT_WORDS) and any(w in text for w in _COLLECTIVE_WORDS)


@dataclass
class RankProgress:
    rank: int
    last_enqueued: int | None = None
    last_completed: int | None = None
    timed_out_seq: int | None = None
    evidence: list[Event] = field(default_factory=list)

    def note(self, enqueued: int | None, completed: int | None, event: Event) -> None:
        if enqueued is not None:
            self.last_enqueued = max(self.last_enqueued or enqueued, enqueued)
        if completed is not None:
            self.last_completed = max(self.last_completed or completed, completed)
        self.evidence.append(event)


@dataclass
class GroupProgress:
    pg: str
    ranks: dict[int, RankProgress] = field(default_factory=dict)

    def rank(self, rank: int) -> RankProgress:
        if rank not in self.ranks:
            self.ranks[rank] = RankProgress(rank)
        return self.ranks[rank]

    def lagging(self) -> tuple[list[int], str]:
        """Ranks behind the others, and which counter shows it.

        The collective the group is stuck in is the lowest seq any rank timed out on; a rank
        whose last enqueued seq is below it never joined that collective. Ranks that enqueued
        further (async work queued behind the stuck one) are not ahead of anyone that matters.
        """
        enq = {r: p.last_enqueued for r, p in self.ranks.items() if p.last_enqueued is not None}
        stuck = [p.timed_out_seq for p in self.ranks.values() if p.timed_out_seq is not None]
        if stuck and enq:
            floor = min(stuck)  # once: a 16,384-rank job is 16,384 comparisons, not 2.7e8
            laggers = sorted(r for r, v in enq.items() if v < floor)
            if laggers:
                return laggers, "last_enqueued"
        elif len(enq) >= 2 and len(set(enq.values())) > 1:
            top = max(enq.values())
            return sorted(r for r, v in enq.items() if v < top), "last_enqueued"
        done = {r: p.last_completed for r, p in self.ranks.items() if p.last_completed is not None}
        if len(done) >= 2 and len(set(done.values())) > 1:
            top = max(done.values())
            return sorted(r for r, v in done.items() if v < top), "last_completed"
        return [], ""

    def stuck_seq(self) -> int | None:
        stuck = [p.timed_out_seq for p in self.ranks.values() if p.timed_out_seq is not None]
        return min(stuck) if stuck else None


@dataclass
class Facts:
    events: list[Event]
    context: IncidentContext
    timeouts: list[WatchdogTimeout] = field(default_factory=list)
    groups: dict[str, GroupProgress] = field(default_factory=dict)
    # The group each timeout was counted in, by identity: a lookup per timeout, not a scan of
    # every group's evidence (quadratic in a log with thousands of timeout lines).
    timeout_groups: dict[int, str] = field(default_factory=dict)

    @property
    def failed(self) -> bool:
        return (
            bool(self.timeouts)
            or bool(self.of("watchdog_abort"))
            or bool(self.of("store_timeout"))
            or any(_collective_timeout(e) for e in self.of("python_exception"))
        )

    @property
    def timed_out_ranks(self) -> set[int]:
        ranks = {t.rank for t in self.timeouts if t.rank is not None}
        ranks |= {
            e.rank
            for e in self.events
            if isinstance(e, WorkProgress) and e.failed_seq is not None and e.rank is not None
        }
        return ranks

    def of(self, kind: str) -> list:
        if not hasattr(self, "_by_kind"):
            by_kind: dict[str, list[Event]] = defaultdict(list)
            for event in self.events:
                by_kind[event.kind].append(event)
            self._by_kind = by_kind
        return self._by_kind.get(kind, [])

    def config_events(self, *keys: str) -> list:
        return [e for e in self.of("config_value") if e.key in keys]

    def config_number(self, key: str) -> float | None:
        values = [e.number for e in self.config_events(key) if e.number is not None]
        return values[-1] if values else None

    def config_version(self, key: str) -> tuple[int, ...] | None:
        for event in reversed(self.config_events(key)):
            parts = re.findall(r"\d+", event.value)[:3]
            if parts:
                return tuple(int(p) for p in parts)
        return None

    def collective_limit_s(self) -> float | None:
        """The longest wait the ranks were allowed, as the artifacts state it: the watchdog's
        Timeout(ms), the c10d store's, gloo's "Timed out waiting 6000ms for recv operation"."""
        limits = [t.timeout_ms for t in self.timeouts if t.timeout_ms]
        limits += [s.timeout_ms for s in self.of("store_timeout") if s.timeout_ms]
        for e in self.of("python_exception"):
            m = _GLOO_WAIT.search(e.message) if "Timed out waiting" in e.message else None
            if m:
                limits.append(int(m.group(1)))
        return max(limits) / 1000 if limits else None

    def timeout_seconds(self) -> float | None:
        limits = [t.timeout_ms for t in self.timeouts if t.timeout_ms]
        return max(limits) / 1000 if limits else None

    def hosts(self) -> set[str]:
        named = {getattr(e, "host", "") for e in self.events}
        return {h for h in named if h} | set(self.context.rank_hosts.values())

    def multi_node(self) -> bool:
        if len(self.hosts()) >= 2:
            return True
        # More ranks in one communicator than GPUs in any one host (8) means several hosts.
        return any((e.nranks or 0) > 8 for e in self.of("nccl_init")) or bool(
            self.context.world_size and self.context.world_size > 8
        )

    def group_of(self, timeout: WatchdogTimeout) -> str:
        return self.timeout_groups.get(id(timeout)) or _pg_key(timeout.pg)

    def died_on_its_own(self) -> list:
        """Workers that ended without anyone of the job ending them: a fault signal the process
        raised on itself (SIGSEGV, SIGBUS, SIGILL, SIGFPE: the kernel delivers them on a bad
        memory access or instruction), or SIGKILL from outside the job (the OOM killer, the
        scheduler) — not the one torchrun sends a worker it already asked to stop with SIGTERM.
        SIGABRT is left out: ProcessGroupNCCL's watchdog aborts a process after its timeout."""
        stopped = {e.pid for e in self.of("agent_signal") if e.pid}
        return [
            e
            for e in self.of("worker_failed") + self.of("failure_record")
            if e.signal in FAULT_SIGNALS or (e.signal == "SIGKILL" and e.pid not in stopped)
        ]

    def has_crash_or_hardware(self) -> bool:
        if self.died_on_its_own():
            return True
        kinds = (
            "cuda_oom",
            "host_oom_kill",
            "cuda_error",
            "gpu_xid",
            "gpu_off_bus",
            "gpu_unreachable",
            "nccl_peer_closed",
        )
        return any(self.of(k) for k in kinds)

    def expected_ranks(self) -> set[int]:
        """Ranks that should have reported: the job's world if known, else those we have logs
        of, else 0..highest rank seen (only when at least two ranks reported)."""
        if self.context.world_size:
            return set(range(self.context.world_size))
        seen = {e.rank for e in self.events if e.rank is not None}
        known = set(self.context.ranks_uploaded) | set(self.context.rank_hosts)
        if known:
            return known | seen
        if len(seen) >= 2:
            return set(range(max(seen) + 1))
        return seen

    def present_ranks(self) -> set[int]:
        """Ranks whose own artifacts are here: an uploaded log or dump, or lines of theirs in a
        shared log. Only these can be said to have done something else."""
        return set(self.context.ranks_uploaded) | {
            e.rank for e in self.events if e.rank is not None
        }

    def _unreported(self) -> set[int]:
        if not self.timeouts or len(self.groups) != 1:
            # With several groups in play we cannot tell which ranks belong to which.
            return set()
        (group,) = self.groups.values()
        if group.pg != DEFAULT_PG:
            return set()
        return self.expected_ranks() - set(group.ranks)

    def silent_ranks(self) -> set[int]:
        """Ranks whose artifacts are here but show no timeout nor progress on the group the
        others timed out on: they were somewhere else. A rank with no artifacts at all is not
        silent, it is missing (``missing_ranks``): absence of its lines is no evidence, a pasted
        excerpt usually holds only some ranks' lines."""
        return self._unreported() & self.present_ranks()

    def missing_ranks(self) -> set[int]:
        """Ranks expected in the timed-out group with no artifacts here at all."""
        return self._unreported() - self.present_ranks()


# --- each rank's own step lines (trainer progress) ---------------------------------------------
# A rank's printed step time includes its waits in collectives, so in synchronous training every
# rank's step time grows when one rank slows; what tells the ranks apart is the laggard (the rank
# the Flight Recorder says never joined, or the silent rank) and how its *own* time was spent:
# ``data_time`` is its wait for the next batch (mmengine IterTimerHook, detectron2, most trainers).
DATA_BOUND_SHARE = 0.5  # more than half of a step spent waiting for input: the rank is input-bound
MIN_STEPS = 5  # fewer step lines say nothing about a trend


def step_series(f: Facts) -> dict[int, list]:
    series: dict[int, list] = {}
    for e in f.of("trainer_step"):
        if e.rank is not None and e.step_s is not None:
            series.setdefault(e.rank, []).append(e)
    return {
        r: sorted(s, key=lambda e: e.step if e.step is not None else -1) for r, s in series.items()
    }


def data_share(steps: list) -> float:
    """The share of its last MIN_STEPS steps the rank spent waiting for data: the run-up to the
    failure, not an average that a long healthy run would dilute."""
    recent = [e for e in steps[-MIN_STEPS:] if e.data_s is not None and e.step_s]
    if not recent:
        return 0.0
    return statistics.fmean(min(1.0, e.data_s / e.step_s) for e in recent)


def recent_growth(values: list[float]) -> float:
    """The last MIN_STEPS values over the first third (at least MIN_STEPS) of the series."""
    if len(values) < 2 * MIN_STEPS:
        return 1.0
    base = statistics.fmean(values[: max(MIN_STEPS, len(values) // 3)])
    return statistics.fmean(values[-MIN_STEPS:]) / base if base > 0 else 1.0


def _group_local_numbers(events: list[Event]) -> set[int]:
    """Rank numbers that two processes printed for themselves on the watchdog's own "[Rank N]"
    (no launcher prefix, no process group named). ProcessGroupNCCL prints the rank *inside the
    timed-out group* there (its ``rank_``), so under tensor or data parallel subgroups rank 0 of
    each group says "[Rank 0]". One process reports a work's timeout once (a wrapper repeats the
    same line), so the same number with the same SeqNum but another op, size or "ran for" is a
    second process: these numbers are not global ranks."""
    seen: dict[tuple[int, int | None], set[tuple]] = defaultdict(set)
    for e in events:
        if isinstance(e, WatchdogTimeout) and e.rank_from == "watchdog" and e.pg is None:
            seen[(e.rank, e.seq)].add((e.op, e.numel_in, e.ran_for_ms))
    return {rank for (rank, _), works in seen.items() if len(works) > 1}


# What a kernel log says about the host's hardware and storage. Lines before the log's last boot
# banner describe a previous boot: a GPU that fell off the bus then was reset by the reboot, and
# a job that ran after it never met that fault.
KERNEL_KINDS = frozenset(
    {
        "gpu_xid",
        "gpu_off_bus",
        "gpu_unreachable",
        "pcie_aer",
        "storage_stall",
        "storage_recovered",
        "host_oom_kill",
    }
)


def _since_last_boot(events: list[Event]) -> list[Event]:
    boots: dict[str, int] = {}
    for e in events:
        if e.kind == "kernel_boot":
            boots[e.source] = max(boots.get(e.source, 0), e.line)
    if not boots:
        return events
    return [
        e
        for e in events
        if not (e.kind in KERNEL_KINDS and e.source in boots and e.line < boots[e.source])
    ]


def gather(events: Iterable[Event], context: IncidentContext) -> Facts:
    events = _since_last_boot(list(events))
    ambiguous = _group_local_numbers(events)
    if ambiguous:
        # Which global rank printed each of them is unknown: they count as timeouts of some
        # rank, never as a rank's own (nor, by their absence, as another rank's silence).
        events = [
            dataclasses.replace(e, rank=None)
            if isinstance(e, WatchdogTimeout) and e.rank_from == "watchdog" and e.pg is None
            else e
            for e in events
        ]
    facts = Facts(events=events, context=context)
    # PyTorch 2.4 prints the timeout with a bare "[Rank 0]" and the progress line that follows
    # with "[PG 37 Rank 0]": the progress line tells which group the timed-out work was on.
    pg_of_failure = {
        (e.rank, e.failed_seq): e.pg
        for e in facts.events
        if isinstance(e, WorkProgress) and e.pg is not None and e.failed_seq is not None
    }
    for event in facts.events:
        if isinstance(event, WatchdogTimeout):
            facts.timeouts.append(event)
            if event.rank is None:
                continue
            pg = event.pg if event.pg is not None else pg_of_failure.get((event.rank, event.seq))
            group = facts.groups.setdefault(_pg_key(pg), GroupProgress(_pg_key(pg)))
            facts.timeout_groups[id(event)] = group.pg
            progress = group.rank(event.rank)
            progress.timed_out_seq = event.seq
            # Timing out at seq N means N was enqueued; completion is only known from the
            # progress line, which usually follows.
            progress.note(event.seq, None, event)
        elif isinstance(event, WorkProgress | DumpSignal) and event.rank is not None:
            group = facts.groups.setdefault(_pg_key(event.pg), GroupProgress(_pg_key(event.pg)))
            progress = group.rank(event.rank)
            progress.note(event.last_enqueued, event.last_completed, event)
            if isinstance(event, WorkProgress) and event.failed_seq is not None:
                progress.timed_out_seq = event.failed_seq
    return facts
