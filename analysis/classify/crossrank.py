"""Rules that read cross-rank evidence: Flight Recorder dumps and profiler trace summaries.

Every rank's dump is parsed on its own into ``fr_frontier`` / ``fr_collective`` events and every
trace into a ``trace_summary``; what only all ranks together show is computed here:

  - ``fr_analyze``: process groups and members, each group's frontier on each rank, ranks missing
    from a collective, op / size / dtype mismatches at the same seq, and ranks with no dump. It
    reads events one at a time and keeps only what the parsers already bounded (the entries near
    each frontier), so memory does not grow with the entries of the dumps.
  - ``slow_rank``: from trace summaries, the rank the others wait for (it spends the least time
    in collectives and its own time grows), and what it did instead (data loading, I/O).
  - ``last_to_start``: which rank starts each collective last, collectives matched across ranks
    by their Flight Recorder ``Seq`` (``record_param_comms`` carries it; gloo traces get it from
    the recorder entry created during each ``c10d::`` call). A rank last into most of them by a
    clear margin is a straggler.

The rules then name the culprit class from those findings.
"""

from __future__ import annotations

import bisect
import statistics
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field

from ingest.parsers.events import Event

from .facts import (
    DATA_BOUND_SHARE,
    GROWTH,
    MIN_STEPS,
    Facts,
)
from .facts import (
    data_share as _data_share,
)
from .facts import (
    recent_growth as _recent_growth,
)
from .facts import (
    step_series as _step_series,
)
from .model import Evidence, Suspect
from .rules import Match, Rule

# A rank spends less than this share of its steps in collectives while the others' median is at
# least twice as high: the others are waiting for it.
WAIT_RATIO = 0.5
# A straggler is last into at least this share of the collectives seen on several ranks, at
# least STRAGGLER_MARGIN times as often as any other rank, over STRAGGLER_MIN collectives or
# more, and a median STRAGGLER_LATE_MS or more after the others (below that, the order is noise).
STRAGGLER_SHARE = 0.5
STRAGGLER_MARGIN = 2.0
STRAGGLER_MIN = 6
STRAGGLER_LATE_MS = 1.0
# A recorder entry is created inside the c10d call that enqueued it; the slack covers the two
# clocks' conversions to Unix time, and is far below the gap between two calls.
JOIN_SLACK_US = 20.0


def _expand(text: str) -> list[int]:
    from ingest.parsers.flight_recorder import expand_ranks

    try:
        return expand_ranks(text)
    except ValueError:
        return []


def _ranks(ranks: Iterable[int]) -> str:
    ranks = sorted(ranks)
    text = ", ".join(map(str, ranks[:8]))
    return text + (f" and {len(ranks) - 8} more" if len(ranks) > 8 else "")


# --- Flight Recorder ---------------------------------------------------------------------------


@dataclass
class FrGroup:
    pg: str
    desc: str
    members: list[int]
    frontiers: dict[int, Event] = field(default_factory=dict)  # rank -> FrFrontier
    entries: dict[int, dict[int, Event]] = field(default_factory=dict)  # rank -> seq -> entry

    @property
    def dumped(self) -> set[int]:
        return set(self.frontiers)

    def enqueued(self) -> dict[int, int]:
        return {
            r: f.last_enqueued for r, f in self.frontiers.items() if f.last_enqueued is not None
        }


@dataclass
class FrFinding:
    kind: str  # "mismatch" | "missing" | "not_started" | "late"
    pg: str
    desc: str
    seq: int
    culprits: list[int]
    detail: str
    ran_more_steps: bool = False
    evidence: list[Event] = field(default_factory=list)


@dataclass
class FrAnalysis:
    groups: dict[tuple[str, str], FrGroup]
    findings: list[FrFinding]
    no_dump: dict[str, list[int]]  # pg -> member ranks without a dump

    @property
    def culprits(self) -> list[int]:
        return self.findings[0].culprits if self.findings else []


def _signature(entry) -> tuple:
    return (entry.op, entry.input_sizes, entry.output_sizes, entry.input_dtypes)


def fr_analyze(events: Iterable[Event], limit_s: float | None = None) -> FrAnalysis:
    """Cross-rank analysis of Flight Recorder events from any number of separately parsed dumps.
    ``limit_s``: the collective timeout the ranks waited under, when the artifacts say it."""
    groups: dict[tuple[str, str], FrGroup] = {}
    pending: list[Event] = []
    for event in events:
        if event.rank is None:
            continue
        if event.kind == "fr_frontier":
            key = (event.pg, event.members)
            group = groups.get(key)
            if group is None:
                group = groups[key] = FrGroup(event.pg, event.pg_desc, _expand(event.members))
            group.frontiers[event.rank] = event
        elif event.kind == "fr_collective" and not event.is_p2p and event.seq is not None:
            pending.append(event)
    by_rank_pg = {(r, g.pg): g for g in groups.values() for r in g.frontiers}
    for entry in pending:
        group = by_rank_pg.get((entry.rank, entry.pg))
        if group is not None:
            group.entries.setdefault(entry.rank, {})[entry.seq] = entry
    findings: list[FrFinding] = []
    no_dump: dict[str, list[int]] = {}
    for group in groups.values():
        missing_dumps = sorted(set(group.members) - group.dumped)
        if missing_dumps:
            no_dump[group.pg] = missing_dumps
        finding = (
            _mismatch(group)
            or _missing(group, missing_dumps)
            or _not_started(group)
            or _late(group, limit_s)
        )
        if finding:
            findings.append(finding)
    # The default group's answer first: it is the one every rank shares.
    findings.sort(key=lambda f: (f.desc != "default_pg", f.pg != "0", f.seq))
    return FrAnalysis(groups, findings, no_dump)


def _mismatch(group: FrGroup) -> FrFinding | None:
    seqs = sorted({s for entries in group.entries.values() for s in entries})
    for seq in seqs:
        at = {r: e[seq] for r, e in group.entries.items() if seq in e}
        if len(at) < 2:
            continue
        votes = Counter(_signature(e) for e in at.values())
        if len(votes) < 2:
            continue
        (top, top_n), (_, second_n) = votes.most_common(2)
        if top_n == second_n:
            # No majority (two ranks, or an even split): every side is a suspect.
            culprits = sorted(at)
        else:
            culprits = sorted(r for r, e in at.items() if _signature(e) != top)
        majority = next(e for e in at.values() if _signature(e) == top)
        odd = at[culprits[0]]
        if odd.op != majority.op:
            what = f"{odd.op} while the others ran {majority.op}"
        elif odd.input_sizes != majority.input_sizes or odd.output_sizes != majority.output_sizes:
            what = (
                f"{odd.op} of size {odd.input_sizes} while the others used {majority.input_sizes}"
            )
        else:
            what = (
                f"{odd.op} with dtype {'/'.join(odd.input_dtypes)} while the others used "
                f"{'/'.join(majority.input_dtypes)}"
            )
        majority_ranks = [r for r, e in at.items() if _signature(e) == top]
        ran_more = (
            top_n != second_n
            and _repeats_step(group, culprits[0], seq, odd)
            and not _repeats_step(group, majority_ranks[0], seq, majority)
        )
        return FrFinding(
            kind="mismatch",
            pg=group.pg,
            desc=group.desc,
            seq=seq,
            culprits=culprits,
            detail=f"at collective seq {seq} of process group {group.pg} rank "
            f"{_ranks(culprits)} ran {what}",
            ran_more_steps=ran_more,
            evidence=[at[r] for r in culprits[:4]] + [majority],
        )
    return None


def _repeats_step(group: FrGroup, rank: int, seq: int, odd) -> bool:
    """The rank's op at ``seq`` is one it ran a few collectives earlier: a loop op. When the odd
    rank repeats a loop op while the majority's op is new (save, eval), the odd rank is still in
    the loop: it ran more steps. When both are loop ops, a rank skipped or reordered one."""
    entries = group.entries.get(rank, {})
    for period in range(1, 9):
        before = entries.get(seq - period)
        if before is not None and _signature(before) == _signature(odd):
            return True
    return False


def _missing(group: FrGroup, missing_dumps: list[int]) -> FrFinding | None:
    enq = group.enqueued()
    if len(enq) >= 2 and len(set(enq.values())) > 1:
        low, top = min(enq.values()), max(enq.values())
        culprits = sorted(r for r, v in enq.items() if v == low)
        ahead = sorted(r for r, v in enq.items() if v > low)
        entry = None
        for rank in ahead:
            entry = group.entries.get(rank, {}).get(low + 1)
            if entry is not None:
                break
        op = f" ({entry.op})" if entry is not None else ""
        return FrFinding(
            kind="missing",
            pg=group.pg,
            desc=group.desc,
            seq=low + 1,
            culprits=culprits,
            detail=f"rank {_ranks(culprits)} never joined collective seq {low + 1}{op} of process "
            f"group {group.pg}: its last enqueued is {low} while rank {_ranks(ahead)} reached "
            f"{top}",
            evidence=[group.frontiers[r] for r in culprits[:4]]
            + ([entry] if entry is not None else []),
        )
    if missing_dumps and enq:
        # Everyone who dumped is at the same point: the ranks without a dump never arrived.
        top = max(enq.values())
        return FrFinding(
            kind="missing",
            pg=group.pg,
            desc=group.desc,
            seq=top,
            culprits=missing_dumps,
            detail=f"every rank that dumped reached seq {top} of process group {group.pg}; rank "
            f"{_ranks(missing_dumps)} left no dump",
            evidence=list(group.frontiers.values())[:2],
        )
    return None


def _not_started(group: FrGroup) -> FrFinding | None:
    """All ranks enqueued the same seq, but some never started it (NCCL states)."""
    tracked = {r: f for r, f in group.frontiers.items() if f.tracks_state}
    started = {r: f.last_started for r, f in tracked.items() if f.last_started is not None}
    if len(started) < 2 or len(set(started.values())) < 2:
        return None
    low = min(started.values())
    culprits = sorted(r for r, v in started.items() if v == low)
    return FrFinding(
        kind="not_started",
        pg=group.pg,
        desc=group.desc,
        seq=low + 1,
        culprits=culprits,
        detail=f"rank {_ranks(culprits)} never started collective seq {low + 1} of process group "
        f"{group.pg} that the others started",
        evidence=[group.frontiers[r] for r in culprits[:4]],
    )


def _late(group: FrGroup, limit_s: float | None) -> FrFinding | None:
    """Every rank enqueued the last collective, but one enqueued it a whole timeout after a peer
    had: by the time it arrived, that peer had given up waiting (its wait is bounded by the
    process group's timeout from when it entered). The late rank is the one the others waited
    for; it got there after the abort. Times are the recorder's ``time_created_ns`` on each
    host's clock: NTP keeps hosts within milliseconds, far under a collective timeout."""
    if len(group.entries) < 2:
        return None
    common = set.intersection(*(set(e) for e in group.entries.values()))
    if not common:
        return None
    seq = max(common)
    at = {r: e[seq] for r, e in group.entries.items() if e[seq].time_created_ns}
    # The recorder's own timeout for that collective (2.5+), else the one the logs state.
    stated = [e.timeout_ms for e in at.values() if e.timeout_ms]
    limit_s = max(stated) / 1000 if stated else limit_s
    if len(at) < 2 or not limit_s:
        return None
    first = min(e.time_created_ns for e in at.values())
    late = sorted(r for r, e in at.items() if e.time_created_ns - first >= limit_s * 1e9)
    if not late or len(late) == len(at):
        return None
    gap = max(at[r].time_created_ns for r in late) - first
    return FrFinding(
        kind="late",
        pg=group.pg,
        desc=group.desc,
        seq=seq,
        culprits=late,
        detail=f"rank {_ranks(late)} entered collective seq {seq} ({at[late[0]].op}) of process "
        f"group {group.pg} {gap / 1e9:.1f} s after the first rank did, past the {limit_s:g} s "
        "timeout: the others had stopped waiting before it arrived",
        evidence=[at[r] for r in late[:4]] + [min(at.values(), key=lambda e: e.time_created_ns)],
    )


# --- profiler traces ---------------------------------------------------------------------------


@dataclass
class SlowRank:
    rank: int
    summary: Event  # its TraceSummary
    why: str
    dataloader_share: float
    io_share: float
    own_growth: float  # last third / first third of (step - comm) time


def _thirds(values: list[float]) -> float:
    if len(values) < 3:
        return 1.0
    k = max(1, len(values) // 3)
    first, last = statistics.fmean(values[:k]), statistics.fmean(values[-k:])
    return last / first if first > 0 else 1.0


def _own_ms(summary) -> list[float]:
    comm = list(summary.comm_ms_per_step) or [0.0] * len(summary.step_ms)
    return [max(0.0, s - c) for s, c in zip(summary.step_ms, comm, strict=False)]


def _share(summary, series: tuple[float, ...]) -> float:
    total = sum(summary.step_ms)
    return sum(series) / total if total else 0.0


def slow_rank(summaries: list) -> SlowRank | None:
    """The rank the others wait for: the least time in collectives while the others' median is
    at least twice its share. Needs two or more ranks' traces with steps."""
    by_rank = {s.rank: s for s in summaries if s.rank is not None and s.step_ms}
    if len(by_rank) < 2:
        return None
    # The first step carries warm-up and rendezvous: leave it out of the shares.
    waits = {
        r: (sum(s.comm_ms_per_step[1:]) / sum(s.step_ms[1:]) if sum(s.step_ms[1:]) else 0.0)
        for r, s in by_rank.items()
    }
    rank = min(waits, key=waits.get)
    others = [w for r, w in waits.items() if r != rank]
    if not others or statistics.median(others) <= 0:
        return None
    if waits[rank] > WAIT_RATIO * statistics.median(others):
        return None
    summary = by_rank[rank]
    why = (
        f"spends {waits[rank]:.0%} of its steps in collectives while the other ranks spend "
        f"{statistics.median(others):.0%} waiting in them"
    )
    return SlowRank(
        rank=rank,
        summary=summary,
        why=why,
        dataloader_share=_share(summary, summary.dataloader_ms_per_step),
        io_share=_share(summary, summary.io_ms_per_step),
        own_growth=_thirds(_own_ms(summary)),
    )


def _op_key(op: str) -> str:
    """ "c10d::allreduce_", "all_reduce", "_allgather_base" -> "allreduce", "allgatherbase"."""
    return op.lower().removeprefix("c10d::").replace("_", "")


def _call_seqs(summary, recorded: list) -> dict[tuple[str, int], float]:
    """(pg, seq) -> Unix start time (µs) of each c10d call of a trace without Seq (gloo): the
    recorder entries created during a call give the offset from call order to seq."""
    base = summary.clock_base_us
    calls = sorted(summary.calls, key=lambda c: c[1])
    starts = [base + c[1] for c in calls]
    votes: Counter = Counter()
    for entry in recorded:
        if entry.is_p2p or entry.seq is None or not entry.time_created_ns:
            continue
        at = entry.time_created_ns / 1000
        i = bisect.bisect_right(starts, at + JOIN_SLACK_US) - 1
        if i < 0:
            continue
        ordinal, start, dur, op = calls[i]
        if at <= base + start + dur + JOIN_SLACK_US and _op_key(op) == _op_key(entry.op):
            votes[(entry.pg, entry.seq - ordinal)] += 1
    if not votes:
        return {}
    (pg, offset), n = votes.most_common(1)[0]
    # Call order is one sequence for all groups: with calls of several groups in the window,
    # or too few agreeing entries, the order cannot be turned into seqs.
    if len({g for g, _ in votes}) > 1 or n < max(2, sum(votes.values()) // 2 + 1):
        return {}
    return {(pg, ordinal + offset): base + start for ordinal, start, _, _ in calls}


def _collective_starts(summary, recorded: list) -> dict[tuple[str, int], float]:
    if summary.collectives:
        base = summary.clock_base_us
        # record_param_comms names its group; before that was kept, the default group.
        return {(pg or "0", seq): base + start for seq, start, _, _, pg in summary.collectives}
    if summary.calls and recorded:
        return _call_seqs(summary, recorded)
    return {}


@dataclass
class Straggler:
    rank: int
    summary: Event  # its TraceSummary
    last: int  # collectives it started last
    joined: int  # collectives whose start was seen on several ranks
    runner_up: int  # the most any other rank was last
    late_ms: float  # median of how long after the other ranks' median start it started
    seqs: tuple[int, int]  # first and last seq compared
    hosts: int  # distinct hosts among the ranks compared (> 1: clocks must be in sync)


def last_to_start(summaries: list, recorded: Iterable[Event] = ()) -> Straggler | None:
    """The rank that starts most collectives last, by a clear margin, or None.

    ``recorded``: Flight Recorder ``fr_collective`` events, needed for traces without ``Seq``."""
    by_rank = {s.rank: s for s in summaries if s.rank is not None}
    entries: dict[int, list] = {}
    for entry in recorded:
        if entry.kind == "fr_collective" and entry.rank is not None:
            entries.setdefault(entry.rank, []).append(entry)
    starts: dict[tuple[str, int], dict[int, float]] = {}
    for rank, summary in by_rank.items():
        for key, start in _collective_starts(summary, entries.get(rank, [])).items():
            starts.setdefault(key, {})[rank] = start
    ranks = {r for at in starts.values() for r in at}
    if len(ranks) < 2:
        return None
    quorum = max(2, (len(ranks) + 1) // 2)
    last: Counter = Counter()
    late: dict[int, list[float]] = {}
    seqs: list[int] = []
    for (_, seq), at in starts.items():
        if len(at) < quorum:
            continue
        order = sorted(at, key=at.get)
        rank = order[-1]
        last[rank] += 1
        late.setdefault(rank, []).append(at[rank] - statistics.median(at[r] for r in order[:-1]))
        seqs.append(seq)
    joined = sum(last.values())
    if joined < STRAGGLER_MIN:
        return None
    (rank, n), *rest = last.most_common()
    runner_up = rest[0][1] if rest else 0
    late_ms = statistics.median(late[rank]) / 1000
    if n < STRAGGLER_SHARE * joined or n < STRAGGLER_MARGIN * runner_up:
        return None
    if late_ms < STRAGGLER_LATE_MS:
        return None
    hosts = len({by_rank[r].host for r in ranks if by_rank[r].host} or {""})
    return Straggler(
        rank=rank,
        summary=by_rank[rank],
        last=n,
        joined=joined,
        runner_up=runner_up,
        late_ms=late_ms,
        seqs=(min(seqs), max(seqs)),
        hosts=hosts,
    )


def _trace_evidence(summary, signal: str, text: str) -> Evidence:
    return Evidence(summary.source, summary.line, signal, text[:500])


def _fr_evidence(events: Iterable[Event], signal: str) -> list[Evidence]:
    out = []
    for event in events:
        frames = getattr(event, "frames", ())
        text = event.text + (f" | at {frames[0]}" if frames else "")
        out.append(Evidence(event.source, event.line, signal, text[:500]))
    return out


# --- the facts every cross-rank rule reads, computed once per Facts ------------------------------


@dataclass
class CrossRank:
    fr: FrAnalysis | None
    slow: SlowRank | None
    traces: list
    straggler: Straggler | None = None


def cross_rank(f: Facts) -> CrossRank:
    # Computed once per incident and kept on the facts, as Facts.of keeps its index.
    cached = getattr(f, "_crossrank", None)
    if cached is not None:
        return cached
    fr_events = f.of("fr_frontier") + f.of("fr_collective")
    fr = fr_analyze(fr_events, f.collective_limit_s()) if fr_events else None
    traces = f.of("trace_summary")
    result = CrossRank(
        fr=fr,
        slow=slow_rank(traces) if traces else None,
        traces=traces,
        straggler=last_to_start(traces, f.of("fr_collective")) if len(traces) >= 2 else None,
    )
    f._crossrank = result
    return result


def _first_finding(f: Facts, *kinds: str) -> FrFinding | None:
    fr = cross_rank(f).fr
    if fr is None:
        return None
    return next((x for x in fr.findings if x.kind in kinds), None)


def _missing_note(f: Facts) -> str:
    fr = cross_rank(f).fr
    if fr is None or not fr.no_dump:
        return ""
    parts = [f"group {pg}: rank {_ranks(r)}" for pg, r in sorted(fr.no_dump.items())]
    return " (no Flight Recorder dump from " + "; ".join(parts) + ")"


def _suspects(ranks: list[int], why: str, f: Facts) -> tuple[Suspect, ...]:
    out = []
    for rank in ranks[:16]:
        out.append(Suspect("rank", str(rank), why))
        host = f.context.rank_hosts.get(rank)
        if host:
            out.append(Suspect("host", host, f"runs rank {rank}"))
    return tuple(out)


def _laggard(f: Facts) -> tuple[list[int], FrFinding | None]:
    """The rank(s) the others wait for: the FR missing rank, else the trace's slow rank."""
    finding = _first_finding(f, "missing", "not_started", "late")
    if finding is not None:
        return finding.culprits, finding
    slow = cross_rank(f).slow
    return ([slow.rank] if slow else []), None


# --- predicates ----------------------------------------------------------------------------------


def _ran_more_steps(f: Facts) -> Match | None:
    finding = _first_finding(f, "mismatch")
    if finding is None or not finding.ran_more_steps:
        return None
    evidence = _fr_evidence(finding.evidence, "fr_desync")
    steps = {s.rank: s.steps for s in cross_rank(f).traces if s.rank is not None}
    if len(set(steps.values())) > 1:
        most = max(steps.values())
        for s in cross_rank(f).traces:
            if s.steps == most:
                evidence.append(
                    _trace_evidence(s, "step_count", f"rank {s.rank} profiled {s.steps} steps")
                )
    return Match(
        summary=(
            f"{finding.detail}: rank {_ranks(finding.culprits)} was still running the training "
            "step's collective after the others had left the loop — it ran more steps, as when "
            "ranks split the data with different random states"
        ),
        evidence=tuple(evidence),
        suspects=_suspects(finding.culprits, "ran more steps than the other ranks", f),
    )


def _collective_mismatch(f: Facts) -> Match | None:
    finding = _first_finding(f, "mismatch")
    if finding is None or finding.ran_more_steps:
        return None
    return Match(
        summary=f"ranks issued different collectives: {finding.detail}" + _missing_note(f),
        evidence=tuple(_fr_evidence(finding.evidence, "fr_mismatch")),
        suspects=_suspects(finding.culprits, f"ran a different collective at seq {finding.seq}", f),
    )


def _xid_for(f: Facts, ranks: list[int]) -> list[Event]:
    xids = [e for e in f.of("gpu_xid") if e.primary] + f.of("gpu_off_bus")
    hosts = {f.context.rank_hosts.get(r) for r in ranks} - {None}
    linked = [
        e
        for e in xids
        if e.rank in ranks or any(h and (h in e.source or h in e.text) for h in hosts)
    ]
    return linked


def _missing_rank_hardware(f: Facts) -> Match | None:
    ranks, finding = _laggard(f)
    if finding is None:
        return None
    xids = _xid_for(f, ranks)
    if not xids:
        return None
    return Match(
        summary=f"{finding.detail}; its GPU reported a hardware fault ({xids[0].text[:120]})",
        evidence=tuple(_fr_evidence(finding.evidence, "fr_missing_rank"))
        + tuple(Evidence(e.source, e.line, "gpu_xid", e.text[:500]) for e in xids[:4]),
        suspects=_suspects(ranks, "never joined the collective; its GPU failed", f),
    )


def _slow_rank_io(f: Facts) -> Match | None:
    ranks, finding = _laggard(f)
    slow = cross_rank(f).slow
    if not ranks or slow is None or slow.rank not in ranks or _xid_for(f, ranks):
        return None
    s = slow.summary
    io_growth = _thirds(list(s.io_ms_per_step))
    io_like = slow.io_share >= 0.1 or (s.io_us > 0 and io_growth >= GROWTH)
    logging_rank = slow.rank == 0 and slow.own_growth >= GROWTH and slow.dataloader_share < 0.1
    if not (io_like or logging_rank):
        return None
    what = (
        f"{slow.io_share:.0%} of its step time in file writes/fsync (growing {io_growth:.1f}x)"
        if io_like
        else "its own (non-communication) step time grows while it is the logging rank"
    )
    evidence = [
        _trace_evidence(
            s,
            "step_time_growth",
            f"rank {s.rank} step ms {_series(s.step_ms)}; own time grows {slow.own_growth:.1f}x; "
            f"io ms/step {_series(s.io_ms_per_step)}",
        )
    ]
    evidence += [
        _trace_evidence(o, "waiting_in_collectives", o.text)
        for o in cross_rank(f).traces
        if o.rank != s.rank
    ][:3]
    if finding is not None:
        evidence = _fr_evidence(finding.evidence, "fr_missing_rank") + evidence
    return Match(
        confidence=0.8 if io_like else 0.65,
        summary=(
            f"rank {slow.rank} is the rank the others wait for: it {slow.why}, with {what}"
            + (f"; {finding.detail}" if finding else "")
        ),
        evidence=tuple(evidence),
        suspects=_suspects([slow.rank], "slow on I/O (synchronous log/checkpoint writes)", f),
    )


def _slow_rank_dataloader(f: Facts) -> Match | None:
    ranks, finding = _laggard(f)
    slow = cross_rank(f).slow
    if not ranks or slow is None or slow.rank not in ranks or slow.dataloader_share < 0.25:
        return None
    s = slow.summary
    evidence = [
        _trace_evidence(
            s,
            "dataloader_wait",
            f"rank {s.rank} waits {slow.dataloader_share:.0%} of its step time in DataLoader "
            f"__next__ (ms/step {_series(s.dataloader_ms_per_step)})",
        )
    ]
    if finding is not None:
        evidence = _fr_evidence(finding.evidence, "fr_missing_rank") + evidence
    return Match(
        summary=(
            f"rank {slow.rank} is the rank the others wait for: it {slow.why}, and spends "
            f"{slow.dataloader_share:.0%} of its steps waiting for the DataLoader"
            + (f"; {finding.detail}" if finding else "")
        ),
        evidence=tuple(evidence),
        suspects=_suspects([slow.rank], "waits on its DataLoader", f),
    )


# --- the laggard's own step lines (trainer progress; helpers in facts.py) -------------------------


def _progress_laggard(f: Facts) -> list[int]:
    ranks, _ = _laggard(f)
    return ranks or sorted(f.silent_ranks())


def _no_other_explanation(f: Facts) -> bool:
    """No crash, kill, hardware or network error that would explain the missing rank."""
    from .rules import _is_peer_gone, _is_timeout_exception

    crashed = any(
        not _is_timeout_exception(e) and not _is_peer_gone(e) for e in f.of("python_exception")
    )
    killed = any(r.signal == "SIGKILL" or r.exitcode == -9 for r in f.of("failure_record"))
    return not (
        crashed
        or killed
        or f.has_crash_or_hardware()
        or f.of("nccl_connect_failed")
        or f.of("nccl_ib_error")
    )


def _laggard_waits_on_data(f: Facts) -> Match | None:
    if not f.failed and not _first_finding(f, "missing", "not_started", "late"):
        return None
    series = _step_series(f)
    for rank in _progress_laggard(f):
        steps = series.get(rank, [])
        if len(steps) < MIN_STEPS:
            continue
        share = _data_share(steps)
        growth = _recent_growth([e.data_s or 0.0 for e in steps])
        if share >= DATA_BOUND_SHARE and growth >= GROWTH:
            return Match(
                summary=(
                    f"rank {rank}, the rank the others waited for, spent {share:.0%} of its last "
                    f"steps waiting for its next batch, {growth:.1f}x its earlier data wait"
                ),
                evidence=cite_steps(steps, "dataloader_wait"),
                suspects=_suspects([rank], "waited on its DataLoader", f),
            )
    return None


def _laggard_left_path(f: Facts) -> Match | None:
    """The rank the others wait for never joined the collective, raised nothing, was not killed,
    and nothing of its own slowed it: it went somewhere else in its code (a rank-dependent
    branch, a sleep, an extra step).

    What could have slowed it is read from its own time, not from step growth: in synchronous
    training every rank's step time includes its waits, so growth is the whole job's (a loaded
    host slows every rank alike) and says nothing of one rank. Its own time is its wait for data
    (the data-bound share) and, for rank 0, the logging rank, its writes (logging_rank_slows
    reads growth there: that rank has a mechanism of its own)."""
    finding = _first_finding(f, "missing", "not_started", "late")
    if finding is None or not _no_other_explanation(f):
        return None
    series = _step_series(f)
    for rank in finding.culprits:
        steps = series.get(rank, [])
        if len(steps) < MIN_STEPS:
            continue
        if _data_share(steps) >= DATA_BOUND_SHARE or (
            rank == 0 and _recent_growth([e.step_s for e in steps]) >= GROWTH
        ):
            continue
        return Match(
            summary=(
                f"{finding.detail}; its own steps were steady until then and it raised "
                "nothing: it left the path the other ranks took"
            ),
            evidence=tuple(_fr_evidence(finding.evidence, "fr_missing_rank"))
            + cite_steps(steps, "steady_steps"),
            suspects=_suspects([rank], "never joined; steady steps, no error", f),
        )
    return None


def _logging_rank_slows(f: Facts) -> Match | None:
    """Rank 0, by convention the rank that logs and checkpoints, is the one the others wait for,
    and its steps grew while it was not waiting for data: its own synchronous writes grew (the
    same reading as the trace rule slow_rank_storage_io's logging-rank branch)."""
    finding = _first_finding(f, "missing", "not_started", "late")
    ranks = finding.culprits if finding else sorted(f.silent_ranks())
    if ranks != [0] or not _no_other_explanation(f):
        return None
    steps = _step_series(f).get(0, [])
    if len(steps) < MIN_STEPS:
        return None
    growth = _recent_growth([e.step_s for e in steps])
    if growth < GROWTH or _data_share(steps) >= 0.2:
        return None
    return Match(
        summary=(
            f"rank 0, the logging rank, is the rank the others waited for; its step time grew "
            f"{growth:.1f}x while it was not waiting for data: its own writes (logs, "
            "checkpoints) slowed it"
        ),
        evidence=cite_steps(steps, "step_time_growth"),
        suspects=_suspects([0], "slowed by its own synchronous writes", f),
    )


def cite_steps(steps: list, signal: str) -> tuple[Evidence, ...]:
    picked = steps[:2] + steps[-3:] if len(steps) > 5 else steps
    return tuple(Evidence(e.source, e.line, signal, e.text[:500]) for e in picked)


def _series(values: tuple[float, ...]) -> str:
    shown = [f"{v:.0f}" for v in values[:12]]
    return " ".join(shown) + (" …" if len(values) > 12 else "")


def _rank_missing(f: Facts) -> Match | None:
    """A rank never joined and nothing says why: name it, let the verdict stay unknown."""
    finding = _first_finding(f, "missing", "not_started", "late")
    if finding is None:
        return None
    return Match(
        summary=finding.detail + _missing_note(f),
        evidence=tuple(_fr_evidence(finding.evidence, "fr_missing_rank")),
        suspects=_suspects(finding.culprits, "never joined the collective the others wait in", f),
    )


def _straggler(f: Facts) -> Match | None:
    slow = cross_rank(f).slow
    if slow is None:
        return None
    return Match(
        summary=f"rank {slow.rank} is a straggler on every profiled step: it {slow.why}",
        evidence=(_trace_evidence(slow.summary, "straggler", slow.summary.text),),
        suspects=_suspects([slow.rank], "straggler", f),
    )


def _last_to_start(f: Facts) -> Match | None:
    straggler = cross_rank(f).straggler
    if straggler is None:
        return None
    s = straggler
    clocks = (
        f"; the ranks ran on {s.hosts} hosts, so this assumes their clocks agree to well under "
        f"{s.late_ms:.0f} ms"
        if s.hosts > 1
        else ""
    )
    text = (
        f"rank {s.rank} started {s.last} of {s.joined} collectives last (seq {s.seqs[0]}-"
        f"{s.seqs[1]}, matched across ranks by their Flight Recorder seq), a median "
        f"{s.late_ms:.1f} ms after the other ranks; "
        + (
            f"no other rank was last more than {s.runner_up} times"
            if s.runner_up
            else "no other rank was ever last"
        )
        + clocks
    )
    return Match(
        summary=f"{text}: the others wait for it",
        evidence=(_trace_evidence(s.summary, "last_to_start", text),),
        suspects=_suspects([s.rank], "starts the collectives last (straggler)", f),
    )


_SEED_FIX = (
    "Give every rank the same number of steps: seed the dataset split "
    "(`train_test_split(..., seed=42)`, `random_split(..., generator=torch.Generator()"
    ".manual_seed(42))`) and seed numpy/random before it, or shard with DistributedSampler and "
    "drop_last=True; torch.distributed.algorithms.Join handles truly uneven inputs."
)

CROSSRANK_RULES: tuple[Rule, ...] = (
    Rule(
        "laggard_waits_on_data",
        "The rank the others wait for spent most of its recent steps waiting for its batch",
        ("trainer_step", "fr_frontier"),
        "dataloader_cpu",
        0.7,
        "Feed the input pipeline: more DataLoader workers only up to the host's cores (keep "
        "num_workers × GPU processes per host ≤ cores), persistent_workers=True, pre-decoded or "
        "sharded data on fast local storage; check that rank's host for CPU or I/O contention.",
        _laggard_waits_on_data,
    ),
    Rule(
        "laggard_left_path",
        "The rank the others wait for never joined, with steady steps and no error",
        ("trainer_step", "fr_frontier"),
        "rank_desync_code",
        0.6,
        "Find what that rank did instead of the collective: a rank-dependent branch (`if rank "
        "== 0:` evaluation, logging, checkpointing), a sleep or wait, or an extra/skipped step; "
        "TORCH_DISTRIBUTED_DEBUG=DETAIL and py-spy dump of that rank show where it was.",
        _laggard_left_path,
    ),
    Rule(
        "logging_rank_slows",
        "Rank 0 (logging/checkpoint rank) is the laggard and its own step time grew",
        ("trainer_step", "fr_frontier"),
        "storage_io",
        0.6,
        "Move rank 0's logging and checkpoint writes off the critical path: fast local storage "
        "or tmpfs, asynchronous writers, less frequent logging, no fsync per step; raise the "
        "collective timeout only as a stopgap.",
        _logging_rank_slows,
    ),
    Rule(
        "straggler_last_to_start",
        "One rank starts most collectives last (traces, matched by Flight Recorder seq)",
        ("trace_summary", "fr_collective"),
        # Why it is late is another rule's to say (data loader, I/O, hardware); this one names
        # the rank, and fleet memory turns a host whose ranks keep straggling into a culprit.
        "unknown",
        0.45,
        "Look at what the straggler does before each collective: its profiler trace (data "
        "loading, host syncs, Python work that only that rank does), its host's CPU load, "
        "clocks and throttling; if it recurs on the same host across jobs, drain the host.",
        _last_to_start,
    ),
    Rule(
        "fr_missing_rank_hardware",
        "A rank never joined the collective (Flight Recorder) and its GPU reported an Xid",
        ("fr_frontier", "gpu_xid", "gpu_off_bus"),
        "bad_node_hardware",
        0.92,
        "Drain the host of the missing rank and run GPU diagnostics (`dcgmi diag -r 3`, "
        "`nvidia-smi -q` for retired pages / row remaps); rerun the job without that host.",
        _missing_rank_hardware,
        marks_failure=True,
    ),
    Rule(
        "fr_rank_ran_more_steps",
        "At one seq a rank still ran the step's collective while the others had moved on",
        ("fr_collective", "trace_summary"),
        "rank_desync_code",
        0.88,
        _SEED_FIX,
        _ran_more_steps,
        marks_failure=True,
    ),
    Rule(
        "fr_collective_mismatch",
        "Flight Recorder shows ranks in different collectives (op, size or dtype) at one seq",
        ("fr_collective",),
        "rank_desync_code",
        0.85,
        "Make every rank issue the same collectives in the same order: move collectives out of "
        "rank- or data-dependent branches (`if rank == 0:`, `if step % k == 0` on a per-rank "
        "counter, early `continue`), and give them the same shapes and dtypes on every rank.",
        _collective_mismatch,
        marks_failure=True,
    ),
    Rule(
        "slow_rank_storage_io",
        "The rank the others wait for spends growing time writing files (logs, checkpoints)",
        ("trace_summary", "fr_frontier"),
        "storage_io",
        0.8,
        "Move logging and checkpoint writes off the training loop's critical path: write to "
        "fast local storage or tmpfs, log asynchronously (a background thread/queue, "
        "SummaryWriter with flush_secs) and less often, and avoid fsync per step; raise the "
        "collective timeout only as a stopgap.",
        _slow_rank_io,
        # explains a failure; is none itself (an incident needs a failure)
        marks_failure=False,
    ),
    Rule(
        "slow_rank_dataloader",
        "The rank the others wait for spends its steps waiting on its DataLoader",
        ("trace_summary", "fr_frontier"),
        "dataloader_cpu",
        0.75,
        "Speed up that rank's input pipeline: more DataLoader workers (within num_workers × "
        "GPUs ≤ cores), pin_memory, persistent_workers=True, prefetch; check its data shard "
        "(slow storage, larger samples) and the host's CPU load.",
        _slow_rank_dataloader,
        # explains a failure; is none itself (an incident needs a failure)
        marks_failure=False,
    ),
    Rule(
        "fr_rank_missing",
        "A rank never joined a collective the others wait in; nothing shows why",
        ("fr_frontier",),
        "unknown",
        0.5,
        "Look at what the named rank was doing: its stack (py-spy dump --pid, or the Flight "
        "Recorder frames above), its host's kernel log and hardware stats. Upload its log and "
        "its host's stats so the cause can be named.",
        _rank_missing,
        marks_failure=True,
    ),
    Rule(
        "straggler_rank",
        "One rank is the last into collectives on every profiled step (traces)",
        ("trace_summary",),
        "bad_node_hardware",
        0.4,
        "Compare the straggler's host with its peers (clocks, throttling, CPU load, noisy "
        "neighbours); if it recurs on the same host across jobs, drain it.",
        _straggler,
    ),
)

__all__ = [
    "CROSSRANK_RULES",
    "FrAnalysis",
    "FrFinding",
    "Straggler",
    "fr_analyze",
    "last_to_start",
    "slow_rank",
]
