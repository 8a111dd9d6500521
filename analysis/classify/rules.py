"""The ruleset: each rule is data (id, description, signals, culprit, confidence, fix) plus one
predicate over the facts.

Bump RULESET_VERSION whenever a rule's meaning changes; incidents store the version that
classified them, so old verdicts never move silently. A rule that matches with a confidence under
NAME_THRESHOLD is reported as an alternative but does not name the culprit on its own: a wrong
confident answer is worse than an honest ``unknown``.
"""

from __future__ import annotations

import re
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace

from ingest.parsers.events import Event
from ingest.parsers.progress import LOCKSTEP_WORK
from ingest.parsers.signatures import known_issues

from .facts import (
    DATA_BOUND_SHARE,
    DEFAULT_PG,
    FAULT_SIGNALS,
    GROWTH,
    MIN_STEPS,
    Facts,
    data_share,
    recent_growth,
    step_series,
)
from .model import Evidence, Suspect

RULESET_VERSION = "2026.11.26.18"
NAME_THRESHOLD = 0.5


@dataclass(frozen=True)
class Rule:
    id: str
    description: str
    needs: tuple[str, ...]  # the event kinds or facts the rule reads
    culprit: str
    confidence: float
    fix: str
    predicate: Callable[[Facts], Match | None] = field(repr=False, compare=False)
    marks_failure: bool = False  # its signal is a failure even without a watchdog timeout

    def evaluate(self, facts: Facts) -> Match | None:
        match = self.predicate(facts)
        if match is None:
            return None
        return Match(
            rule=self,
            confidence=match.confidence if match.confidence else self.confidence,
            summary=match.summary,
            evidence=match.evidence,
            suspects=match.suspects,
            fix=match.fix,
        )


@dataclass(frozen=True)
class Match:
    rule: Rule | None = None
    confidence: float = 0.0
    summary: str = ""
    evidence: tuple[Evidence, ...] = ()
    suspects: tuple[Suspect, ...] = ()
    fix: str = ""  # a fix specific to what matched (a knowledge-base entry's), else the rule's


def cite(events: Iterable[Event], signal: str, most: int = 6) -> tuple[Evidence, ...]:
    out = []
    for event in events:
        out.append(Evidence(event.source, event.line, signal, event.text[:500]))
        if len(out) >= most:
            break
    return tuple(out)


def _rank_suspects(events: Iterable[Event], why: str) -> tuple[Suspect, ...]:
    ranks = sorted({e.rank for e in events if e.rank is not None})
    return tuple(Suspect("rank", str(r), why) for r in ranks[:16])


# --- predicates --------------------------------------------------------------------------------


def _gpu_hardware(f: Facts) -> Match | None:
    primary = [e for e in f.of("gpu_xid") if e.primary] + f.of("gpu_off_bus")
    unreachable = f.of("gpu_unreachable")
    fatal_aer = [e for e in f.of("pcie_aer") if e.severity.startswith("uncorrected")]
    corrected_aer = [e for e in f.of("pcie_aer") if e.severity == "corrected"]
    hw_cuda = [e for e in f.of("cuda_error") if e.hardware]
    strong = primary + unreachable + fatal_aer + hw_cuda
    if strong:
        first = strong[0]
        what = getattr(first, "meaning", "") or first.text[:120]
        where = getattr(first, "pci", "") or getattr(first, "device", "")
        return Match(
            confidence=0.9 if primary or hw_cuda else 0.8,
            summary=f"GPU hardware fault{f' at {where}' if where else ''}: {what}",
            evidence=cite(strong + corrected_aer[:2], "gpu_hardware"),
            suspects=tuple(
                Suspect("gpu", e.pci, "hardware fault reported by the driver")
                for e in strong
                if getattr(e, "pci", "")
            )[:4],
        )
    return None


def _pcie_link_replaying(f: Facts) -> Match | None:
    """A GPU's PCIe link corrected errors faster than NVIDIA allows, in a job that failed: a
    failing link, even before it turns fatal. Corrected errors lose no data and end no job, so
    they explain a failure seen elsewhere, never make one."""
    if not f.failed:
        return None
    storm = corrected_error_storm([e for e in f.of("pcie_aer") if e.severity == "corrected"])
    if storm:
        return Match(
            confidence=0.55,
            summary=(
                f"{len(storm)} PCIe corrected errors within a minute on "
                f"{storm[0].device or 'one device'} (more than {MAX_REPLAYS_PER_MINUTE} a minute "
                "is a failing link)"
            ),
            evidence=cite(storm, "pcie_aer"),
        )
    return None


# PCIe corrects a Data Link or Physical Layer error by replaying the packet (PCIe Base
# Specification, Data Link Layer retry), so each corrected AER report stands for at least one
# replay (the kernel rate-limits its reports: they undercount). NVIDIA's DCGM flags a GPU whose
# link replays more than 8 times a minute ("8 replays per minute is the maximum recommended by
# RM", DCGM_LIMIT_MAX_PCIREPLAY_RATE in dcgmlib's GpuHardwareLimits.h). A few corrected errors
# spread over hours or days are what every healthy link logs now and then; a report without a
# clock cannot be placed in a minute and counts for nothing.
MAX_REPLAYS_PER_MINUTE = 8


def corrected_error_storm(events: list) -> list:
    """The corrected errors of the device whose reports exceed ``MAX_REPLAYS_PER_MINUTE`` within
    some 60 s (per device and per line clock), or [] when none does."""
    by_device: dict[tuple[str, str], list] = defaultdict(list)
    for e in events:
        if e.at is not None and e.clock:
            by_device[(e.device, e.clock)].append(e)
    for series in by_device.values():
        series.sort(key=lambda e: e.at)
        start = 0
        for end, e in enumerate(series):
            while e.at - series[start].at > 60.0:
                start += 1
            if end - start + 1 > MAX_REPLAYS_PER_MINUTE:
                return series[start : end + 1]
    return []


def _crash_first(f: Facts) -> Match | None:
    oom = f.of("cuda_oom") + _job_oom_kills(f)
    # A CUDA error whose own line is a known library signature ("CUDA driver version is
    # insufficient for CUDA runtime version") is the software stack's, not a crash's: the entry
    # in the knowledge base names it.
    known = {(e.line, e.text) for e in f.of("known_signature")}
    cuda = [e for e in f.of("cuda_error") if not e.hardware and (e.line, e.text) not in known]
    died = f.died_on_its_own()
    killed = [e for e in died if e.signal == "SIGKILL"]
    faulted = [e for e in died if e.signal in FAULT_SIGNALS]
    exceptions = f.of("python_exception")
    echoes = _remote_close_echoes(f, exceptions)
    errors = [
        e
        for e in exceptions
        if not _is_timeout_exception(e) and not _is_peer_gone(e) and e not in echoes
    ]
    # A peer that went away, as the survivors see it: NCCL's "Connection closed by localRank",
    # gloo's "Connection closed by peer" / "Connection reset by peer" (any backend, any era).
    closed = f.of("nccl_peer_closed") + [e for e in exceptions if _is_peer_gone(e)] + list(echoes)
    raised = {(e.line, e.text) for e in exceptions}
    if oom and all((e.line, e.text) not in raised and getattr(e, "via", "") != "nccl" for e in oom):
        # Only quoted in a trainer's warning ("attempting to recover from OOM", "Skipping
        # batch"): the rank may have recovered. It is the cause only if the job then failed.
        ended = f.failed or errors or killed or f.of("worker_failed") or f.of("failure_record")
        if not ended:
            oom = []
    root = _first_to_die(f, errors)
    if root is not None and not oom and not cuda:
        own = [e for e in errors if e.rank == root.rank]
        return Match(
            confidence=0.8,
            summary=(
                f"rank {root.rank} died first (exit code {root.exitcode}"
                f"{', ' + root.signal if root.signal else ''})"
                + (f" after raising {own[0].exc_type}" if own else "")
                + "; the other ranks lost their peer"
            ),
            evidence=cite([root, *own, *closed], "crash"),
            suspects=(Suspect("rank", str(root.rank), "first rank to exit (elastic root cause)"),),
        )
    if oom:
        return Match(
            confidence=0.85,
            summary="out of memory on a rank before the others timed out",
            evidence=cite(oom + closed, "oom"),
            suspects=_rank_suspects(oom, "ran out of memory"),
        )
    if cuda:
        return Match(
            confidence=0.75,
            summary=f"CUDA error on a rank: {cuda[0].error[:100]}",
            evidence=cite(cuda, "cuda_error"),
            suspects=_rank_suspects(cuda, "CUDA error"),
        )
    if errors and (f.timeouts or closed):
        first = errors[0]
        return Match(
            confidence=0.65,
            summary=f"a rank raised {first.exc_type} before the others timed out",
            evidence=cite(errors + closed, "crash"),
            suspects=_rank_suspects(errors, f"raised {first.exc_type}"),
        )
    if faulted:
        first = faulted[0]
        return Match(
            confidence=0.75,
            summary=(
                f"{'rank ' + str(first.rank) if first.rank is not None else 'a worker'} died of "
                f"{first.signal} (a fault in native code: a crash of its own, not a timeout)"
            ),
            evidence=cite(faulted + closed, "fault_signal"),
            suspects=_rank_suspects(faulted, f"died of {first.signal}"),
        )
    if killed:
        return Match(
            confidence=0.6,
            summary="a worker was killed with SIGKILL (often the host OOM killer)",
            evidence=cite(killed, "sigkill"),
        )
    return None


# Python's own process names, and PyTorch's: since 2.x the main thread names itself
# "pt_main_thread" (c10::setThreadName), which is what the OOM killer then prints as the comm.
_TRAINING_PROCESS = re.compile(r"^(?:python[\d.]*|pt_\w+|torchrun|deepspeed|accelerate)$")


def _job_oom_kills(f: Facts) -> list:
    """The kernel's OOM killer (the host's memory or a container's cgroup limit) ending one of
    the job's processes: a pid the job's own lines name (the launcher's failure table, a worker
    that died), or a Python/PyTorch process. A kill of anything else on the node is the node's
    business, not this job's crash."""
    pids = {e.pid for e in f.of("worker_failed") + f.of("failure_record") if e.pid}
    return [
        e
        for e in f.of("host_oom_kill")
        if (e.pid and e.pid in pids) or _TRAINING_PROCESS.match(e.process or "")
    ]


def _remote_close_echoes(f: Facts, exceptions: list) -> list:
    """NCCL errors raised by a process whose own NCCL lines, just before, said the remote peer
    closed the connection (``NCCL WARN Net : Connection closed by remote peer``, NCCL's socket
    transport; ``Connection reset by peer``): that process lost a peer (one that aborted after
    its own timeout, or died) and surfaced it as ``unhandled system error`` / ``remote process
    exited``. It is a survivor, not the rank that crashed."""
    closes = [e for e in f.of("nccl_error") if e.error == "remote"]
    if not closes:
        return []
    return [
        e
        for e in exceptions
        if "nccl" in f"{e.exc_type} {e.message}".lower()
        and any(c.source == e.source and c.line < e.line for c in closes)
    ]


def _first_to_die(f: Facts, errors: list):
    """The rank that died first on its own, from torchelastic's tables.

    Each host's torchrun prints its own "Root Cause (first observed failure)": the first rank
    *of that host* to exit, which on gloo is often a survivor whose collective timed out or lost
    its peer (exit code 1 too). So a root cause counts only with positive evidence that the rank
    died by itself: an exception of its own that is neither a timeout nor a lost peer, a fault
    signal (SIGSEGV, SIGBUS, SIGILL, SIGFPE), or a kill (SIGKILL, -9). SIGABRT (-6) is the NCCL
    watchdog taking a process down after a timeout (ProcessGroupNCCL's "taking the entire
    process down"). Of several, the earliest wins."""
    raised = {e.rank for e in errors if e.rank is not None}
    roots = [r for r in f.of("failure_record") if r.root_cause and r.rank is not None]
    killed = {
        r.rank
        for r in f.of("failure_record")
        if r.rank is not None
        and (r.signal in FAULT_SIGNALS or r.signal == "SIGKILL" or r.exitcode == -9)
    }
    for record in sorted(roots, key=lambda r: r.time or "~"):  # undated ones last
        if record.rank in killed or (record.exitcode == 1 and record.rank in raised):
            return record
    return None


def _is_peer_gone(e) -> bool:
    text = f"{e.exc_type} {e.message}".lower()
    return any(
        words in text
        for words in (
            "connection closed by peer",
            "connection reset by peer",
            "connection closed by remote peer",
            "broken pipe",
        )
    )


# torch.multiprocessing.spawn's summary of a child's end, raised in the parent: "process 0
# terminated with signal SIGABRT" (the watchdog's abort) or "with exit code 1" (the child's own
# traceback, printed above it, is the failure). Only a fault signal in it is news of a death.
_SPAWN_SUMMARY = ("processexitedexception", "processraisedexception")
_FAULTS_IN_TEXT = ("sigkill", "sigsegv", "sigbus", "sigill", "sigfpe")


def _is_timeout_exception(e) -> bool:
    text = f"{e.exc_type} {e.message}".lower()
    if any(word in text for word in _SPAWN_SUMMARY):
        return not any(signal in text for signal in _FAULTS_IN_TEXT)
    return any(
        word in text
        for word in (
            "watchdog",
            "timed out",
            "timeout",
            "distbackenderror",
            "nccl communicator",
            "keyboardinterrupt",
            "childfailederror",
            # torch.distributed.launch (<= 1.9) reports a worker's non-zero exit this way: the
            # launcher's summary of a failure, never the failure itself.
            "calledprocesserror",
            "signalexception",
            "aborted",
        )
    )


def _network_errors(f: Facts) -> Match | None:
    ib = [e for e in f.of("nccl_ib_error") if not e.follow_on]
    calls = f.of("nccl_ib_call_failed")
    connect = f.of("nccl_connect_failed")
    if f.of("cuda_oom") or _job_oom_kills(f):
        return None  # network errors after a rank died are its echo
    strong = ib + calls + connect
    if not strong:
        return None
    link_local = [e for e in connect if e.link_local]
    # A peer advertised a loopback address: NCCL's bootstrap picked `lo` or a hostname that
    # resolves to 127.0.0.1 (NCCL_SOCKET_IFNAME docs: the interface must be routable between
    # hosts). 127.0.0.0/8 is loopback by RFC 1122.
    loopback = [e for e in connect if e.address.startswith(("127.", "localhost", "::1"))]
    if link_local:
        summary = (
            "NCCL tried to connect over an IPv6 link-local address (a tunnel or unroutable "
            "interface)"
        )
    elif loopback:
        summary = (
            f"NCCL tried to reach a peer at a loopback address ({loopback[0].address}): a rank "
            "advertised `lo` or a hostname resolving to 127.0.0.1; pin NCCL_SOCKET_IFNAME to the "
            "routable interface"
        )
    else:
        summary = f"a rank could not reach its peers ({strong[0].text[:120]})"
    return Match(
        confidence=0.8,
        summary=summary,
        evidence=cite(strong + f.of("nccl_net_devices")[:2], "network_error"),
        suspects=tuple(
            Suspect("host", e.host, "reported the network error") for e in strong if e.host
        )[:4],
    )


def _bootstrap_socket_failed(f: Facts) -> Match | None:
    """NCCL's return trace shows a system or remote error inside its bootstrap. The bootstrap
    exchanges the ranks' addresses over TCP sockets on NCCL_SOCKET_IFNAME before any transport
    exists (NCCL bootstrap.cc; ncclSystemError is "a system call failed", ncclRemoteError a
    connect that ran out of retries), so the ranks could not reach each other there: an
    interface that does not route between the hosts, a blocked port, a hostname resolving
    elsewhere. A rank that crashed or ran out of memory closes its sockets too: then the crash
    is the cause, and this rule stays silent."""
    failed = f.of("nccl_bootstrap_failed")
    if not failed or f.has_crash_or_hardware():
        return None
    hosts = sorted({e.host for e in failed if e.host})
    return Match(
        summary=(
            "NCCL's bootstrap failed in a socket call (a system or remote error from bootstrap.cc"
            + (f" on {', '.join(hosts[:3])}" if hosts else "")
            + "): the ranks could not reach each other over the bootstrap interface"
        ),
        evidence=cite(failed + f.of("nccl_network")[:2], "bootstrap_failed"),
        suspects=tuple(Suspect("host", h, "its NCCL bootstrap failed") for h in hosts[:4]),
    )


def _socket_fallback(f: Facts) -> Match | None:
    sockets = [e for e in f.of("nccl_network") if e.network.lower() == "socket"]
    no_ib = f.of("nccl_ib_unavailable")
    if not (sockets or no_ib) or not f.multi_node():
        return None
    return Match(
        confidence=0.45,
        summary="NCCL used TCP sockets between nodes (no InfiniBand/RDMA transport)",
        evidence=cite(sockets + no_ib, "socket_transport"),
    )


def _collective_mismatch(f: Facts) -> Match | None:
    mismatches = f.of("collective_mismatch")
    if not mismatches:
        return None
    full = [m for m in mismatches if m.rank_b is not None]
    if not full:
        # The wrapper's error with its fingerprints cut off: the mismatch is certain, who ran
        # what is not in the excerpt.
        return Match(
            confidence=0.85,
            summary="PyTorch detected a mismatch between the collectives ranks ran (the "
            "fingerprints are cut from the excerpt)",
            evidence=cite(mismatches, "collective_mismatch"),
        )
    m = full[0]
    return Match(
        confidence=0.85,
        summary=(
            f"ranks ran different collectives at the same point: rank {m.rank_a} {m.op_a} "
            f"{m.shape_a} vs rank {m.rank_b} {m.op_b} {m.shape_b}"
        ),
        evidence=cite(mismatches, "collective_mismatch"),
        suspects=(
            Suspect("rank", str(m.rank_b), f"ran {m.op_b} while rank {m.rank_a} ran {m.op_a}"),
        ),
    )


# Ops every member calls with the same element count. p2p ops (SEND, RECV, COALESCED) count on
# their own sequence since PyTorch 2.4 and may legitimately differ, as may all-to-all splits and
# the root's side of gather/scatter.
SAME_SIZE_OPS = frozenset(
    {
        "ALLREDUCE",
        "BROADCAST",
        "REDUCE",
        "ALLGATHER",
        "_ALLGATHER_BASE",
        "ALLGATHER_INTO_TENSOR_COALESCED",
        "REDUCE_SCATTER",
        "_REDUCE_SCATTER_BASE",
        "REDUCE_SCATTER_TENSOR_COALESCED",
        "BARRIER",
    }
)


def _watchdog_mismatch(f: Facts) -> Match | None:
    """Two ranks timed out at the same SeqNum of the same group in different collectives.

    ProcessGroupNCCL numbers the collectives of each process group in the order every rank
    issues them (``seqCollective_``, incremented once per collective call; p2p has its own
    counter since 2.4), so equal seqs on one group are one call site in program order. A
    different OpType or element count there means the ranks are on different code paths, even
    without TORCH_DISTRIBUTED_DEBUG. A rank printing two ops for one seq means several groups
    share the unlabelled line: such a seq says nothing.
    """
    by_key: dict[tuple[str, int], dict[int, set]] = defaultdict(lambda: defaultdict(set))
    unlabelled: dict[int, set] = defaultdict(set)
    for t in f.timeouts:
        if t.rank is None or t.seq is None or not t.op:
            continue
        labelled = t.pg is not None or f.group_of(t) != DEFAULT_PG
        by_key[(f.group_of(t) if labelled else "?", t.seq)][t.rank].add((t.op, t.numel_in))
        if not labelled:
            unlabelled[t.rank].add((t.seq, t.op))
    if any(len(calls) > 1 for calls in unlabelled.values()):
        # A rank timed out in several works with no group named: several groups are in play
        # and equal seqs on unlabelled lines may belong to different groups.
        by_key = {key: ranks for key, ranks in by_key.items() if key[0] != "?"}
    for (pg, seq), ranks in sorted(by_key.items()):
        if len(ranks) < 2 or any(len(calls) != 1 for calls in ranks.values()):
            continue
        calls = {rank: next(iter(c)) for rank, c in ranks.items()}
        if any(op not in SAME_SIZE_OPS for op, _ in calls.values()):
            continue
        sized = all(numel is not None for _, numel in calls.values())

        def kind(call, sized=sized):
            return call if sized else (call[0], None)

        kinds = Counter(kind(call) for call in calls.values())
        if len(kinds) < 2:
            continue
        (top, n_top), (_, n_next) = kinds.most_common(2)
        # The odd ranks out are the minority; with no majority nobody is singled out.
        odd = sorted(r for r, call in calls.items() if kind(call) != top) if n_top > n_next else []
        by_kind: dict[tuple, list[int]] = defaultdict(list)
        for rank, call in sorted(calls.items()):
            by_kind[kind(call)].append(rank)
        same_op = len({op for op, _ in calls.values()}) == 1
        return Match(
            # Different ops at one seq cannot be one call; equal ops of different sizes almost
            # surely are not (an all_reduce's count is the caller's tensor), a notch weaker.
            confidence=0.7 if same_op else 0.8,
            summary=(
                f"ranks timed out at the same SeqNum {seq}"
                + (f" on process group {pg}" if pg != "?" else "")
                + " in different "
                "collectives ("
                + "; ".join(
                    f"{op}" + (f" of {n}" if sized else "") + f" on rank {_short(ranks)}"
                    for (op, n), ranks in sorted(by_kind.items(), key=lambda kv: kv[0][0])
                )
                + "): they issued collectives in a different order"
            ),
            evidence=cite(
                [t for t in f.timeouts if t.seq == seq and t.rank in calls], "collective_mismatch"
            ),
            suspects=tuple(
                Suspect("rank", str(r), f"ran {calls[r][0]} at SeqNum {seq} unlike the others")
                for r in odd[:8]
            ),
        )
    return None


def _short(ranks: list[int]) -> str:
    return ", ".join(map(str, ranks[:6])) + (
        f" and {len(ranks) - 6} more" if len(ranks) > 6 else ""
    )


def _watchdog_seq_spread(f: Facts) -> Match | None:
    """Ranks of one group timed out in the same collective call (op and size) at different
    SeqNums: they had issued different numbers of collectives before it (ranks that ran
    different numbers of steps, an extra or skipped collective), so NCCL paired different calls
    of different ranks. Each group numbers its collectives in issue order (``seqCollective_``), so
    ranks running one program reach a call at the same seq. One timed-out seq per rank only:
    a rank reporting several works says several groups share unlabelled lines."""
    per_rank: dict[tuple[str, int], set] = defaultdict(set)
    for t in f.timeouts:
        if t.rank is None or t.seq is None or t.op not in SAME_SIZE_OPS:
            continue
        labelled = t.pg is not None or f.group_of(t) != DEFAULT_PG
        per_rank[(f.group_of(t) if labelled else "?", t.rank)].add((t.seq, t.op, t.numel_in))
    groups: dict[str, dict[int, tuple]] = defaultdict(dict)
    for (pg, rank), works in per_rank.items():
        if len(works) == 1:
            groups[pg][rank] = next(iter(works))
    for _pg, ranks in sorted(groups.items()):
        by_call: dict[tuple, dict[int, int]] = defaultdict(dict)
        for rank, (seq, op, numel) in ranks.items():
            by_call[(op, numel)][rank] = seq
        for (op, _numel), seq_of in sorted(by_call.items(), key=lambda kv: -len(kv[1])):
            seqs = set(seq_of.values())
            if len(seq_of) < 2 or len(seqs) < 2:
                continue
            low, high = min(seqs), max(seqs)
            return Match(
                summary=(
                    f"{len(seq_of)} ranks timed out in the same {op} at different SeqNums "
                    f"({low}–{high}): they had issued different numbers of collectives before "
                    "it (different step counts, an extra or skipped collective)"
                ),
                evidence=cite([t for t in f.timeouts if t.seq in seqs], "seq_spread"),
            )
    return None


def _stack_waits_on_data(f: Facts) -> Match | None:
    """A rank's own stack dump (py-spy, faulthandler) shows its main thread blocked waiting for
    its next batch while the job failed: it is the rank the others waited for, held up by its
    input pipeline."""
    if not f.failed:
        return None
    waiting = [s for s in f.of("stack_sample") if s.waits_on_data and s.rank is not None]
    waiting += _unnamed_laggard_stacks(f)
    if not waiting:
        return None
    ranks = sorted({s.rank for s in waiting})
    return Match(
        summary=(
            f"rank {_short(ranks)} was in its DataLoader (waiting for its next batch, or "
            f"loading it itself) when its stack was dumped ({waiting[0].frames[0]} under "
            f"{_data_frame(waiting[0].frames)})"
        ),
        evidence=cite(waiting, "stack_in_dataloader"),
        suspects=tuple(
            Suspect("rank", str(r), "its stack waits on its DataLoader") for r in ranks[:8]
        ),
    )


def _unnamed_laggard_stacks(f: Facts) -> list:
    """A py-spy dump names its process, not its rank. When exactly one rank of the group never
    reported the collective the others timed out in, and the launcher accounts for the dumped
    process as none of those its watchdog aborted (exit -6, SIGABRT: they were waiting), the
    process dumped in its data loading is that rank."""
    silent = f.silent_ranks() | f.missing_ranks()
    if len(silent) != 1:
        return []
    records = f.of("failure_record") + f.of("worker_failed")
    aborted = {e.pid for e in records if e.pid and (e.signal == "SIGABRT" or e.exitcode == -6)}
    if not aborted:
        return []
    (rank,) = silent
    return [
        replace(s, rank=rank)
        for s in f.of("stack_sample")
        if s.waits_on_data and s.rank is None and s.pid and s.pid not in aborted
    ]


def _data_frame(frames: tuple[str, ...]) -> str:
    return next((f for f in frames if "data" in f and "queue.py" not in f), frames[-1])


# A collective this small is no training step's: ProcessGroupNCCL::barrier() all-reduces a
# one-element tensor, and broadcast_object_list first broadcasts a tensor of its objects' sizes.
BARRIER_NUMEL = 16


def _not_training_wait(t) -> bool:
    """The timed-out collective is one of the job's first (SeqNum <= 10) or barrier-sized: the
    ranks were waiting at a synchronisation point, not in a training step."""
    early = t.seq is not None and t.seq <= 10
    barrier = t.numel_in is not None and 0 < t.numel_in <= BARRIER_NUMEL
    return early or barrier


# Bars that prepare data rather than train on it, by the descriptions their libraries give them:
# Hugging Face datasets' Dataset.map/filter ("Map", "Map (num_proc=16)", "Filter"), the
# transformers examples' "Running tokenizer on dataset" and "Grouping texts in chunks of 1024",
# datasets' "Downloading"/"Extracting"/"Generating train split", yolov5's label cache
# (utils/dataloaders.py: "Scanning '…/labels/train' images and labels..."). main_process_first and
# rank-0-only caching run them on one process while the others wait.
_PREP_BAR = re.compile(
    r"^(?:map|filter)\b|tokeni[sz]|\bscanning\b|\bpreprocess|\bcaching\b|\bdownloading\b"
    r"|\bextracting\b|\bgenerating \w+ split|\bgrouping texts|\bpacking\b"
    # transformers' squad/glue processors: "convert squad examples to features"
    r"|\bto features\b",
    re.IGNORECASE,
)


def _unplaced(t) -> bool:
    """A watchdog line of PyTorch before 1.12 names neither SeqNum nor sizes
    (``WorkNCCL(OpType=ALLREDUCE, Timeout(ms)=60000)``): where in the job it waited is unknown."""
    return t.seq is None and t.numel_in is None


# A bar's last drawn state comes before the wait expired: the others began waiting when the
# preparing process began (main_process_first), often before its bar appeared (loading the raw
# files, a split), and tqdm redraws only every so often. Work that ran this share of the limit
# or more is taken to have filled the wait.
NEAR_LIMIT = 0.8


def _preprocessing_outlasted_timeout(f: Facts) -> Match | None:
    """One process's progress bar (dataset map, tokenisation, packing), or a phase's own report
    of its length (a checkpoint save), ran about as long as the wait that expired: the other
    ranks waited at a barrier or on the c10d store (main_process_first, a store-based barrier)
    for the whole of that work, and the timeout ended it."""
    stores = f.of("store_timeout")
    limit_s = f.collective_limit_s()
    if not limit_s or not (f.timeouts or stores):
        return None
    unplaced = any(_unplaced(t) for t in f.timeouts)
    in_training = not all(_not_training_wait(t) or _unplaced(t) for t in f.timeouts)
    # A bar still drawing, or a phase that reported its length (finished, or so far: a decode
    # loop's "1068.2s elapsed"): either way one process worked alone for about the timeout.
    bars = [b for b in f.of("progress_bar") if b.elapsed_s and b.elapsed_s >= NEAR_LIMIT * limit_s]
    bars += [p for p in f.of("phase_duration") if p.elapsed_s >= NEAR_LIMIT * limit_s]
    if in_training:
        # Mid-training (an evaluation or a generation run on rank 0 after epoch N, an index
        # built by one rank) the others wait in a training step's collective. Only work that is
        # not the training loop itself (every rank runs that in lockstep, its length says
        # nothing) counts, and only on a rank that is not among those waiting.
        waiting = f.timed_out_ranks
        bars = [
            b
            for b in bars
            if b.desc
            and not LOCKSTEP_WORK.search(b.desc)
            and (b.rank not in waiting if b.rank is not None else _all_but_a_few_waited(f))
        ]
    elif unplaced:
        # A wait whose place in the job is unknown could be a training step's, beside which a
        # long training bar says nothing: only a bar that prepares data places it at start-up.
        bars = [b for b in bars if b.kind == "progress_bar" and _PREP_BAR.search(b.desc)]
    if bars:
        return Match(
            confidence=0.75,
            summary=(
                f"'{bars[0].desc or 'a step'}' ran {bars[0].elapsed_s:.0f} s while the other ranks "
                f"waited, close to the {int(limit_s)} s timeout"
            ),
            evidence=cite(bars + stores[:2], "long_preprocessing"),
        )
    return None


def _all_but_a_few_waited(f: Facts) -> bool:
    """Work printed by a rank the line does not name is lone work only when the job's world is
    known and every rank but a few (the worker: rank 0, or each node's local rank 0) is seen
    waiting. Ranks merely absent from an excerpt prove nothing."""
    world = f.context.world_size or int(f.config_number("world_size") or 0)
    waiting = f.timed_out_ranks & set(range(world))
    return bool(world) and len(waiting) < world and len(waiting) >= world - len(waiting)


# The waits nobody set: torch.distributed's default process-group timeout
# (torch/distributed/constants.py default_pg_timeout = _DEFAULT_PG_TIMEOUT, 30 min; HF
# TrainingArguments.ddp_timeout also defaults to 1800 s) and the NCCL backend's own default from
# PyTorch 2.2 (ProcessGroupNCCL.hpp kProcessGroupNCCLDefaultTimeout, 10 min).
DEFAULT_WAITS_S = (600, 1800)
# How long after the wait expired the preparing process may still draw its bar: the NCCL
# watchdog's heartbeat monitor gives a stuck watchdog TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC (480 s)
# before it kills the process, torchrun's agent checks its workers every monitor_interval (up
# to 5 s) and gives the survivors 30 s after SIGTERM before SIGKILL.
CUT_LATENCY_S = 480 + 5 + 30
# A wait that expired says so ("Socket Timeout", "Timed out waiting").
_WAIT_EXPIRED = re.compile(r"time[d ]?\s?out", re.IGNORECASE)


def _prep_cut_at_default_wait(f: Facts) -> Match | None:
    """No wait is stated anywhere (no watchdog line with its Timeout(ms), no store timeout's),
    a waiting process failed inside a collective call or on the store, and one process's data
    preparation bar, unfinished, had run about as long as one of the default waits: the others
    waited at the barrier for the whole preparation (main_process_first), and the default
    timeout ended it. The bar's last state is near the default (NEAR_LIMIT of it) or past it by
    no more than the job's teardown takes; a bar that ran longer says the job had another
    timeout, unknown here, and names nothing."""
    if f.collective_limit_s() or f.has_crash_or_hardware():
        return None
    exceptions = f.of("python_exception")
    if any(not _is_timeout_exception(e) and not _is_peer_gone(e) for e in exceptions):
        return None  # an error of its own, whatever the bar says
    waits = [c for c in f.of("traceback_cut") if c.call] + list(f.of("store_timeout"))
    # A wait that expired says so ("Socket Timeout", "Timed out"); a launcher's summary of a
    # failed worker (ChildFailedError) does not say what failed.
    waits += [e for e in exceptions if _WAIT_EXPIRED.search(f"{e.exc_type} {e.message}")]
    if not waits:
        return None
    bars = [
        b
        for b in f.of("progress_bar")
        if _PREP_BAR.search(b.desc)
        and (b.percent is None or b.percent < 100)
        and b.elapsed_s
        and any(NEAR_LIMIT * d <= b.elapsed_s <= d + CUT_LATENCY_S for d in DEFAULT_WAITS_S)
    ]
    if not bars:
        return None
    bar = bars[0]
    default = max(d for d in DEFAULT_WAITS_S if NEAR_LIMIT * d <= bar.elapsed_s)
    return Match(
        summary=(
            f"'{bar.desc}' had run {bar.elapsed_s:.0f} s, unfinished, when a waiting process "
            f"failed in {_wait_place(waits[0])}: the default {default // 60}-minute "
            "process-group timeout ended the wait for it"
        ),
        evidence=cite([bar, *waits[:2]], "prep_cut_at_default_wait"),
    )


def _wait_place(event) -> str:
    call = getattr(event, "call", "")
    return f"{call}()" if call else "its wait"


def _startup_work_running(f: Facts) -> Match | None:
    """Every timeout is in one of the job's first collectives (SeqNum <= 5), and what the late
    process was doing is on the page: data preparation seen under way and not seen finishing (a
    preparation bar short of 100 %, or cut before its counts), or work that reported only how
    long it had run so far (faiss k-means). Its length is unknown, so this is less sure than a
    bar whose elapsed time matches the timeout (preprocessing_outlasted_timeout)."""
    if not f.timeouts or f.has_crash_or_hardware() or f.of("nccl_connect_failed"):
        return None
    early = [t for t in f.timeouts if t.seq is not None and t.seq <= 5]
    if len(early) != len(f.timeouts):
        return None
    running = [
        b
        for b in f.of("progress_bar")
        if _PREP_BAR.search(b.desc) and (b.percent is None or b.percent < 100)
    ]
    running += [p for p in f.of("phase_duration") if p.ongoing]
    if not running:
        return None
    return Match(
        summary=(
            f"the first collectives (SeqNum ≤ {max(t.seq for t in early)}) timed out while "
            f"'{running[0].desc}' was still running on one process"
        ),
        evidence=cite(running[:2] + early[:2], "startup_work_running"),
    )


def _first_barrier_timed_out(f: Facts) -> Match | None:
    """Every rank timed out in one of the job's very first collectives, a barrier-sized one:
    some rank was still busy with start-up work (preprocessing, downloading, loading weights)
    when the others reached it. Only when no crash, hardware or network error explains it."""
    if not f.timeouts or f.has_crash_or_hardware() or f.of("nccl_connect_failed"):
        return None
    early = [t for t in f.timeouts if t.seq is not None and t.seq <= 5]
    if len(early) != len(f.timeouts):
        return None
    small = [t for t in early if t.numel_in is not None and 0 < t.numel_in <= 16]
    if not small:
        return None
    return Match(
        # A weak sign: the first collective timing out shows a rank was late at start-up, not
        # what it was doing (preprocessing, loading data or weights, a hang). Naming
        # timeout_too_short was a guess that failed on real cases whose start-up wait was a data
        # loader or never explained; a progress bar of the work (preprocessing_outlasted_timeout)
        # is what names it.
        confidence=0.45,
        summary=(
            f"the first collectives (SeqNum ≤ {max(t.seq for t in early)}, {small[0].op} of "
            f"{small[0].numel_in} element) timed out: a rank was still busy with start-up work"
        ),
        evidence=cite(early, "first_barrier"),
    )


def _rank_left_early(f: Facts) -> Match | None:
    silent = f.silent_ranks()
    if not silent or not f.timeouts or f.has_crash_or_hardware():
        return None
    if loader_oversubscribed(f):
        # Read from silence alone, "it went elsewhere" loses to a mechanism that makes any
        # rank late: starved of CPU, a rank never reaching the collective is a slow rank.
        return None
    series = step_series(f)
    for rank in silent:
        steps = series.get(rank, [])
        if len(steps) >= MIN_STEPS and (
            recent_growth([e.step_s for e in steps]) >= GROWTH
            or data_share(steps) >= DATA_BOUND_SHARE
        ):
            # Its own steps slowed (or waited on data) before it went missing: it did not take
            # another path, it was slow; the progress rules say where the time went.
            return None
    uploaded = silent & set(f.context.ranks_uploaded)
    return Match(
        # Its own file says it was elsewhere (0.7); its lines in a shared log do too, but a
        # shared log may be an excerpt cut before the rank's timeout line (0.6).
        confidence=0.7 if uploaded else 0.6,
        summary=(
            f"every reporting rank waits in the same collective while rank "
            f"{', '.join(map(str, sorted(silent)[:8]))} never joined it and shows no error: it "
            "left the loop early or took another code path"
        ),
        # The suspects themselves come from the progress analysis every verdict carries.
    )


def _p2p_schedule_desync(f: Facts) -> Match | None:
    p2p = [t for t in f.timeouts if t.op in ("SEND", "RECV", "COALESCED")]
    groups = {f.group_of(t) for t in p2p}
    seqs = {t.seq for t in p2p if t.seq is not None}
    if not p2p or len(groups) < 2 or len(seqs) < 2:
        return None
    degree = f.config_number("pipeline_parallel")
    return Match(
        confidence=0.65 if degree and degree > 1 else 0.55,
        summary=(
            f"point-to-point ops ({', '.join(sorted({t.op for t in p2p}))}) timed out on "
            f"{len(groups)} process groups at different SeqNums ({min(seqs)}–{max(seqs)}): the "
            "pipeline stages fell out of step"
        ),
        evidence=cite(p2p, "p2p_desync"),
    )


def _version(text: str | None) -> tuple[int, ...] | None:
    parts = re.findall(r"\d+", text or "")[:3]
    return tuple(int(p) for p in parts) if parts else None


def _in_range(version: tuple[int, ...] | None, entry: dict) -> bool | None:
    """Whether a printed version lies in a known issue's affected range (None: no version)."""
    if version is None:
        return None
    low, high = (
        _version(entry["affected"].get("min")),
        _version(entry["affected"].get("max_excluded")),
    )
    return (low is None or version >= low) and (high is None or version < high)


def _component_version(f: Facts, component: str) -> tuple[int, ...] | None:
    key = {"nccl": "nccl_version", "pytorch": "torch_version", "cuda": "cuda_version"}.get(
        component
    )
    return f.config_version(key) if key else None


def _knowledge_hits(f: Facts, culprits: set[str]):
    """Known-issue signatures seen, less those whose printed component version is outside the
    entry's affected range (a fixed release cannot have the bug)."""
    hits = []
    for event in f.of("known_signature"):
        if event.culprit not in culprits:
            continue
        entry = known_issues().get(event.signature)
        if entry and _in_range(_component_version(f, entry["component"]), entry) is False:
            continue
        hits.append((event, entry))
    return hits


def _known_library_bug(f: Facts) -> Match | None:
    hits = [h for h in _knowledge_hits(f, {"software_version"}) if not _names_its_cause(h)]
    if not hits:
        return None
    event, entry = hits[0]
    title = entry["title"] if entry else event.signature
    fixed = (
        f" (fixed in {entry['component'].upper()} {entry['fixed_in']})"
        if entry and entry.get("fixed_in")
        else ""
    )
    return Match(
        confidence=0.7,
        summary=f"known library bug: {title}{fixed}",
        evidence=cite([e for e, _ in hits], "known_bug"),
        fix=(entry["fix"] + f" Source: {entry['source_url']}") if entry else "",
    )


def _names_its_cause(hit) -> bool:
    _, entry = hit
    return bool(entry and entry.get("names_its_cause"))


def _build_mismatch(f: Facts) -> Match | None:
    """An error that states the build's own requirement: the binary has no kernel for this GPU,
    the driver is older than the runtime it was built for, NCCL needs a newer CUDA for graphs.
    The rank that raised it crashed because of it, so it outranks the crash (as an invalid
    device ordinal does)."""
    hits = [h for h in _knowledge_hits(f, {"software_version"}) if _names_its_cause(h)]
    return _knowledge_match(hits, "the build does not fit this host")


def _known_environment_issue(culprit: str, what: str = "known environment fault"):
    """A known environment fault with its own signature (shared memory too small, systemd
    removing IPC objects, RoCE GID changes, fabric manager state), for the knowledge-base
    entries of one culprit class, with the entry's sourced fix."""
    return lambda f: _knowledge_match(_knowledge_hits(f, {culprit}), what)


def _knowledge_match(hits, what: str) -> Match | None:
    """The first knowledge-base hit names the match, with the entry's sourced fix."""
    if not hits:
        return None
    event, entry = hits[0]
    return Match(
        summary=f"{what}: {entry['title'] if entry else event.signature}",
        evidence=cite([e for e, _ in hits], "known_issue"),
        fix=(entry["fix"] + f" Source: {entry['source_url']}") if entry else "",
    )


def _known_version_issue(f: Facts) -> Match | None:
    """The printed NCCL/PyTorch version lies in the bounded range of a known regression (both
    ends known from release notes). A lead, never the culprit on its own: the bug needs its
    conditions, which a version does not show."""
    if not f.failed:
        return None
    found = []
    for entry in known_issues().values():
        if entry.get("signature") or not entry["affected"].get("min"):
            continue
        if entry["affected"].get("max_excluded") and _in_range(
            _component_version(f, entry["component"]), entry
        ):
            found.append(entry)
    if not found:
        return None
    return Match(
        confidence=0.35,
        summary="the job's version has known hangs fixed since: "
        + "; ".join(f"{e['title']} (fixed in {e['fixed_in']})" for e in found[:3]),
        evidence=cite(f.config_events("nccl_version", "torch_version"), "known_version_issue"),
        fix="; ".join(f"{e['fix']} ({e['source_url']})" for e in found[:3]),
    )


def _old_stack(f: Facts) -> Match | None:
    cuda = f.config_version("cuda_version")
    nccl = f.config_version("nccl_version")
    old = []
    if cuda is not None and cuda < (10,):
        old.append("CUDA " + ".".join(map(str, cuda[:2])))
    if nccl is not None and nccl < (2, 7):
        old.append("NCCL " + ".".join(map(str, nccl)))
    if not old or not f.failed:
        return None
    return Match(
        confidence=0.5,
        summary=f"an old communication stack ({', '.join(old)}) with known hang fixes since",
        evidence=cite(f.config_events("cuda_version", "nccl_version"), "old_version"),
    )


def _recovered_within(stall, recoveries: list, limit_s: float | None) -> bool:
    """The same server answered again (``nfs: server X OK``), by the same clock, sooner than
    the collective timeout after the stall began: a rank blocked on it resumed before any peer
    could have waited the whole timeout, so the stall cannot be the wait that expired."""
    if not limit_s or stall.at is None or not stall.clock:
        return False
    return any(
        r.mount == stall.mount
        and r.clock == stall.clock
        and r.at is not None
        and 0 <= r.at - stall.at < limit_s
        for r in recoveries
    )


def _job_stalls(f: Facts) -> list:
    """Storage stalls that can hold this job: a server or disk that stopped answering, or a hung
    task that is one of the job's processes. The hung-task detector reports any process in
    uninterruptible sleep; a backup's rsync or updatedb blocked on a slow mount says the mount is
    slow, not that a rank waited on it."""
    pids = {e.pid for e in f.of("worker_failed") + f.of("failure_record") if e.pid}
    return [
        s
        for s in f.of("storage_stall")
        if not s.task or (s.pid and s.pid in pids) or _TRAINING_PROCESS.match(s.task)
    ]


def _storage_stall(f: Facts) -> Match | None:
    recoveries = f.of("storage_recovered")
    limit_s = f.collective_limit_s()
    stalls = [s for s in _job_stalls(f) if not _recovered_within(s, recoveries, limit_s)]
    if not stalls:
        return None
    mounts = sorted({s.mount for s in stalls if s.mount})
    return Match(
        confidence=0.75 if f.timeouts else 0.55,
        summary=(
            "storage stalled on a host while ranks waited"
            + (f" ({', '.join(mounts[:3])})" if mounts else "")
        ),
        evidence=cite(stalls, "storage_stall"),
        suspects=tuple(Suspect("config", f"mount={m}", "storage that stalled") for m in mounts[:3]),
    )


# ENOSPC (errno 28, strerror "No space left on device"; write(2), fallocate(2)): the filesystem
# being written is full. POSIX shared memory and semaphores live in /dev/shm (shm_overview(7),
# sem_overview(7)), and a full /dev/shm fails with the same errno: a DataLoader's worker queues
# (multiprocessing SemLock, torch's "</torch_…>" segments) or NCCL's shm transport. Those are not
# storage, and an exception whose frames were not seen could be either.
_ENOSPC = re.compile(r"\[Errno 28\]|No space left on device")
_SHARED_MEMORY = re.compile(
    r"/dev/shm|shared[ _]?memory|shm_open|SemLock|synchronize\.py|heap\.py|</torch_|"  # noqa: S108
    r"posix_fallocate|Bus error",
    re.IGNORECASE,
)


# torch.save's zip writer (caffe2/serialize/inline_container.cc) checks every write of the
# stream: a short write raises "PytorchStreamWriter failed writing file …: file write failed",
# and the bytes it then finds missing "unexpected pos A vs B". The filesystem refused the
# write: full, over quota, or failing; whichever, the storage, and the message names the file.
_STREAM_WRITER = re.compile(
    r"PytorchStreamWriter failed writing|inline_container\.cc:\d+\] \. unexpected pos"
)


def _disk_full(f: Facts) -> Match | None:
    exceptions = f.of("python_exception")
    full = [
        e
        for e in exceptions
        if _ENOSPC.search(e.message) and e.location and not _SHARED_MEMORY.search(e.text)
    ]
    refused = [e for e in exceptions if _STREAM_WRITER.search(e.message)]
    if refused and not full:
        return Match(
            summary="torch.save could not write a checkpoint: the filesystem refused the write "
            "(full, over quota or failing)",
            evidence=cite(refused[:4], "write_failed"),
        )
    if not full:
        return None
    shm = [
        e
        for e in f.of("python_exception") + f.of("known_signature") + f.of("nccl_error")
        if _SHARED_MEMORY.search(e.text)
    ]
    if shm:
        return None  # the errno is shared memory's here
    first = full[0]
    return Match(
        summary=f"a write failed because its filesystem is full (ENOSPC at {first.location})",
        evidence=cite(full[:4], "disk_full"),
    )


def _processes_per_host(f: Facts) -> int:
    """GPU processes on one host: torchrun's --nproc_per_node (or a launcher's GPUs per node)
    when printed, else the world over the nodes, else the most ranks seen placed on one host,
    else one (a lower bound)."""
    nproc = f.config_number("nproc_per_node")
    if nproc and nproc >= 1:
        return int(nproc)
    world, nodes = f.config_number("world_size"), f.config_number("nnodes")
    if world and nodes and nodes >= 1 and world % nodes == 0:
        return int(world // nodes)
    placed: dict[str, set[int]] = defaultdict(set)
    for rank, host in f.context.rank_hosts.items():
        placed[host].add(rank)
    for e in f.of("nccl_init"):
        if e.host and e.rank is not None:
            placed[e.host].add(e.rank)
    return max((len(ranks) for ranks in placed.values()), default=1)


def _host_cpus(f: Facts) -> tuple[int | None, list]:
    """The fewest CPUs any host gave the job, and where that was read: a printed count (lscpu,
    Slurm, PyTorch's own DataLoader warning) or the agent's host readings."""
    readings = [(int(e.number), e) for e in f.config_events("host_cpus") if e.number]
    readings += [(e.cpu_count, e) for e in f.of("host_stats") if e.cpu_count]
    if not readings:
        return None, []
    fewest = min(n for n, _ in readings)
    return fewest, [e for n, e in readings if n == fewest][:2]


def loader_oversubscribed(f: Facts) -> tuple[str, list] | None:
    """DataLoader workers outnumber the CPUs they run on: what was read, and where.

    Every GPU process starts num_workers worker processes, each a busy Python process while it
    decodes and collates. PyTorch warns when one process's workers outnumber the CPUs it may run
    on (torch/utils/data/dataloader.py, _check_worker_number_rationality, comparing num_workers
    with len(os.sched_getaffinity(0))); unbound processes of one host share all its CPUs, so the
    host holds processes x workers of them. More than the CPUs, and the training processes' own
    threads wait for a CPU: steps stretch unevenly until one rank is late past the collective
    timeout. How deep each worker prefetches is memory, not CPU: not read here."""
    workers = f.config_number("num_workers")
    if not workers:
        return None
    warned = [e for e in f.config_events("process_cpus") if e.number]
    if warned and workers > min(e.number for e in warned):
        cpus = int(min(e.number for e in warned))
        summary = (
            f"each GPU process starts {workers:g} DataLoader workers and may run on {cpus} "
            "CPUs (PyTorch's own worker-count warning)"
        )
        read_from = warned[:2]
    else:
        cpus, read_from = _host_cpus(f)
        processes = _processes_per_host(f)
        if not cpus or int(workers) * processes <= cpus:
            return None
        summary = (
            f"{processes} GPU process{'es' if processes > 1 else ''} per host × {workers:g} "
            f"DataLoader workers = {int(workers) * processes} worker processes for {cpus} CPUs"
        )
    cited = f.config_events("num_workers", "nproc_per_node", "world_size", "nnodes") + read_from
    return summary, cited


def _dataloader_oversubscribed(f: Facts) -> Match | None:
    killed_loader = [
        e for e in f.of("python_exception") if "DataLoader worker" in f"{e.exc_type} {e.message}"
    ]
    if killed_loader:
        return Match(
            confidence=0.7,
            summary="DataLoader workers died (killed or exited) before the timeout",
            evidence=cite(killed_loader, "dataloader_worker"),
        )
    found = loader_oversubscribed(f) if f.failed else None
    if found is None:
        return None
    summary, cited = found
    return Match(
        # A setting every process of the job shares slows them all: it is weaker than evidence
        # about the one rank the others waited for (a laggard's own writes, 0.6), and yields
        # to it.
        confidence=0.55,
        summary=summary + ": loading oversubscribes the CPUs and starves the training processes",
        evidence=cite(cited, "dataloader_config"),
    )


# The fix for start-up preparation that outlasted the wait (two rules name it).
PREP_FIX = (
    "Preprocess ahead of training (tokenize or cache offline, or inside "
    "`main_process_first()` with a longer window) and raise the timeout for start-up: "
    "init_process_group(timeout=timedelta(hours=2)), HF `ddp_timeout`."
)


RULES: tuple[Rule, ...] = (
    Rule(
        "gpu_hardware_fault",
        "A GPU reported a primary Xid, fell off the bus, or its PCIe link failed",
        ("gpu_xid", "gpu_off_bus", "gpu_unreachable", "pcie_aer", "cuda_error"),
        "bad_node_hardware",
        0.9,
        "Drain the host and run GPU diagnostics (`dcgmi diag -r 3`, check `nvidia-smi -q` for "
        "retired pages/row remaps and the PCIe link); reseat or replace the GPU before returning "
        "it. Rerun the job on other hosts.",
        _gpu_hardware,
        marks_failure=True,
    ),
    Rule(
        "pcie_link_replaying",
        "A GPU's PCIe link corrected errors faster than NVIDIA's limit, in a job that failed",
        ("pcie_aer",),
        "bad_node_hardware",
        0.55,
        "Drain the host and check the link (`nvidia-smi -q -d PCIE` replay counters, `lspci -vv` "
        "link width and speed against the slot's); reseat the GPU or riser, then run "
        "`dcgmi diag -r 3` before returning it.",
        _pcie_link_replaying,
    ),
    Rule(
        "rank_crashed_first",
        "One rank ran out of memory or crashed; the others then timed out waiting for it",
        ("cuda_oom", "host_oom_kill", "cuda_error", "python_exception", "worker_failed"),
        "oom_or_crash",
        0.85,
        "Fix the failing rank first: for CUDA OOM lower the per-GPU batch or sequence length, "
        "cap sample lengths, or enable activation checkpointing; for a host OOM kill lower "
        "DataLoader num_workers/prefetch_factor. The other ranks' timeouts are a consequence.",
        _crash_first,
        marks_failure=True,
    ),
    Rule(
        "collective_mismatch",
        "TORCH_DISTRIBUTED_DEBUG caught ranks in different collectives at the same seq",
        ("collective_mismatch",),
        "rank_desync_code",
        0.85,
        "Make every rank issue the same collectives in the same order: move collectives "
        "(broadcast, barrier, all_reduce of metrics) out of `if rank == 0:` blocks, e.g. "
        "checkpoint or logging code that broadcasts from rank 0 alone.",
        _collective_mismatch,
        marks_failure=True,
    ),
    Rule(
        "watchdog_op_mismatch",
        "Ranks timed out at the same SeqNum of one group in different collectives or sizes",
        ("watchdog_timeout",),
        "rank_desync_code",
        0.8,
        "Make every rank issue the same collectives in the same order with the same sizes: look "
        "for collectives inside rank- or data-dependent branches (rank-0-only evaluation, "
        "logging or checkpoint code, early exits, data-dependent skips); "
        "TORCH_DISTRIBUTED_DEBUG=DETAIL names the call sites.",
        _watchdog_mismatch,
        marks_failure=True,
    ),
    Rule(
        "watchdog_seq_spread",
        "Ranks of one group timed out in the same collective call at different SeqNums",
        ("watchdog_timeout",),
        "rank_desync_code",
        0.7,
        "Make every rank run the same number of steps and collectives: seed any random dataset "
        "split (train_test_split(..., seed=...), numpy and random seeds), shard with "
        "DistributedSampler(drop_last=True), and keep collectives out of rank- or "
        "data-dependent branches.",
        _watchdog_seq_spread,
        marks_failure=True,
    ),
    Rule(
        "stack_waits_on_data",
        "A rank's stack dump shows its main thread waiting for its next batch",
        ("stack_sample",),
        "dataloader_cpu",
        # Direct evidence of where the rank was: it outranks the silent-rank reading (0.7).
        0.75,
        "Feed that rank's input pipeline: enough DataLoader workers for the host's cores (keep "
        "num_workers × GPU processes per host ≤ cores), persistent_workers=True, pre-processed "
        "data on fast local storage; look at that host for CPU, memory or I/O contention.",
        _stack_waits_on_data,
    ),
    Rule(
        "network_errors",
        "NCCL reported IB completion errors, failed verbs calls or failed connections",
        ("nccl_ib_error", "nccl_ib_call_failed", "nccl_connect_failed"),
        "network_transport",
        0.8,
        "Check the fabric between the named hosts (`ibstat`, `ibv_devinfo`, port error "
        "counters, `ib_write_bw` between the pair); pin NCCL to the right interfaces with "
        "NCCL_SOCKET_IFNAME=<routable if> and NCCL_IB_HCA=<hca list>; for retry-exceeded "
        "errors consider NCCL_IB_TIMEOUT=22.",
        _network_errors,
        marks_failure=True,
    ),
    Rule(
        "known_library_bug",
        "A native stack or message matches a known bug of an NCCL/PyTorch release",
        ("known_signature",),
        "software_version",
        0.7,
        "Upgrade to a release with the fix (for the NCCL 2.19/2.20 work-FIFO stall: NCCL 2.21 "
        "or newer); raising NCCL_WORK_FIFO_DEPTH only delays the hang.",
        _known_library_bug,
        marks_failure=True,
    ),
    Rule(
        "nccl_bootstrap_socket_failed",
        "NCCL's bootstrap failed in a socket call before any collective ran",
        ("nccl_bootstrap_failed",),
        "network_transport",
        0.6,
        "Make the bootstrap interface routable between the hosts: NCCL_SOCKET_IFNAME=<the NIC "
        "the hosts reach each other on> (exclude lo and docker0 with ^lo,docker0), open the TCP "
        "ports between the nodes (firewall, security groups), and check that each hostname "
        "resolves to that interface's address.",
        _bootstrap_socket_failed,
        marks_failure=True,
    ),
    Rule(
        "known_network_issue",
        "A known network fault's signature (knowledge base: RoCE GID change, IB timeouts, no "
        "socket interface, NCCL's shared-memory transport without its /dev/shm segment)",
        ("known_signature",),
        "network_transport",
        0.65,
        "See the knowledge-base entry named in the summary.",
        _known_environment_issue("network_transport"),
        marks_failure=True,
    ),
    Rule(
        "known_host_issue",
        "A known host fault's signature (knowledge base: systemd RemoveIPC, fabric manager)",
        ("known_signature",),
        "bad_node_hardware",
        0.65,
        "See the knowledge-base entry named in the summary.",
        _known_environment_issue("bad_node_hardware"),
        marks_failure=True,
    ),
    Rule(
        "build_mismatch",
        "An error that states its build's requirement (no kernel image for this GPU, driver "
        "older than the runtime)",
        ("known_signature",),
        "software_version",
        # Outranks the crash it explains: the error names its own cause.
        0.85,
        "See the knowledge-base entry named in the summary.",
        _build_mismatch,
        marks_failure=True,
    ),
    Rule(
        "known_layout_issue",
        "A known launch-layout fault's signature (knowledge base: invalid device ordinal)",
        ("known_signature",),
        "parallelism_config",
        # Outranks the crash it explains: the error names its own cause.
        0.85,
        "See the knowledge-base entry named in the summary.",
        _known_environment_issue(
            "parallelism_config", "the parallel or launch layout does not fit"
        ),
        marks_failure=True,
    ),
    Rule(
        "known_code_path_issue",
        "A known error that says the ranks' code paths differed (knowledge base: DDP parameters "
        "that received no gradient)",
        ("known_signature",),
        "rank_desync_code",
        # Outranks the crash it explains: the error names its own cause.
        0.85,
        "See the knowledge-base entry named in the summary.",
        _known_environment_issue("rank_desync_code", "the ranks' code paths differed"),
        marks_failure=True,
    ),
    Rule(
        "known_version_issue",
        "The printed version lies in the affected range of a known regression",
        ("config_value",),
        "software_version",
        0.35,
        "Upgrade to the release that fixed it.",
        _known_version_issue,
    ),
    Rule(
        "storage_stall",
        "The kernel log shows storage that stopped answering (NFS, Lustre, hung tasks in I/O)",
        ("storage_stall",),
        "storage_io",
        0.75,
        "Write logs and checkpoints to fast local storage (NVMe or tmpfs) and copy them out "
        "asynchronously; log less often from rank 0; raise the collective timeout only as a "
        "stopgap (init_process_group(timeout=timedelta(minutes=30))).",
        _storage_stall,
        # explains a failure; is none itself (an incident needs a failure)
        marks_failure=False,
    ),
    Rule(
        "disk_full",
        "A rank's write failed with ENOSPC on a filesystem other than shared memory, or "
        "torch.save's writer could not write its file",
        ("python_exception",),
        "storage_io",
        # Outranks the crash it explains: the error names its own cause.
        0.85,
        "Free space on the volume the failing frame wrote to, or point the writer at a larger "
        "one (checkpoint dir, HF_HOME / HF_DATASETS_CACHE, TMPDIR); keep only the last N "
        "checkpoints; alert on disk usage before a run starts.",
        _disk_full,
        marks_failure=True,
    ),
    Rule(
        "preprocessing_outlasted_timeout",
        "The ranks timed out waiting while one process worked alone about as long as the "
        "timeout (preprocessing at start-up, an evaluation or index build mid-training)",
        ("progress_bar", "phase_duration", "watchdog_timeout", "store_timeout"),
        "timeout_too_short",
        0.75,
        "Preprocess ahead of training (tokenize offline, or on rank 0 inside "
        "`main_process_first()` with a longer window), and raise the timeout for that phase: "
        "`ddp_timeout` / init_process_group(timeout=timedelta(hours=2)).",
        _preprocessing_outlasted_timeout,
    ),
    Rule(
        "startup_work_running",
        "The first collectives timed out while one process's data preparation was still "
        "running (a preparation bar short of its end, faiss k-means under way)",
        ("progress_bar", "phase_duration", "watchdog_timeout"),
        "timeout_too_short",
        0.7,
        PREP_FIX,
        _startup_work_running,
    ),
    Rule(
        "prep_cut_at_default_wait",
        "A waiting process failed in a collective while one process's data preparation, "
        "unfinished, had run about as long as a default process-group timeout (none stated)",
        ("progress_bar", "traceback_cut", "store_timeout", "python_exception"),
        "timeout_too_short",
        0.7,
        PREP_FIX,
        _prep_cut_at_default_wait,
        marks_failure=True,
    ),
    Rule(
        "first_barrier_timed_out",
        "Every rank timed out in a barrier-sized collective at the very start of the job",
        ("watchdog_timeout",),
        "timeout_too_short",
        0.45,
        "Do start-up work before the process group's clock runs: preprocess/tokenize offline or "
        "cache it, download weights ahead of time, or raise the timeout for start-up "
        "(init_process_group(timeout=timedelta(hours=2)), HF `ddp_timeout`, Megatron "
        "`--distributed-timeout-minutes`).",
        _first_barrier_timed_out,
    ),
    Rule(
        "dataloader_oversubscribed",
        "DataLoader workers died, or workers × GPU processes outnumber the host's CPUs",
        ("config_value", "python_exception", "host_stats"),
        "dataloader_cpu",
        0.6,
        "Lower DataLoader num_workers so that num_workers × GPU processes per host stays within "
        "the host's CPUs (leave a core per training process), keep prefetch_factor small "
        "(e.g. num_workers 2, prefetch halved), use persistent_workers=True, and move "
        "CPU-heavy decoding offline.",
        _dataloader_oversubscribed,
    ),
    Rule(
        "p2p_schedule_desync",
        "Point-to-point ops timed out on several groups at different seqs (pipeline desync)",
        ("watchdog_timeout",),
        "parallelism_config",
        0.55,
        "Lower the pipeline degree on this hardware (PCIe-only GPUs suffer most) or upgrade the "
        "framework's pipeline communication; check that every stage runs the same schedule "
        "(microbatch count, sequence lengths).",
        _p2p_schedule_desync,
    ),
    Rule(
        "rank_left_early",
        "All reporting ranks wait in one collective; a rank never joined it and shows no error",
        ("watchdog_timeout", "work_progress"),
        "rank_desync_code",
        0.55,
        "Give every rank the same number of steps: seed any random dataset split "
        "(train_test_split(..., seed=42), numpy seed) so ranks agree, shard data evenly or use "
        "drop_last=True, or wrap uneven inputs in torch.distributed.algorithms.Join.",
        _rank_left_early,
    ),
    Rule(
        "old_communication_stack",
        "CUDA or NCCL old enough to have known hang fixes since",
        ("config_value",),
        "software_version",
        0.5,
        "Upgrade CUDA and NCCL (and the PyTorch build that bundles them).",
        _old_stack,
    ),
    Rule(
        "socket_transport_multinode",
        "NCCL fell back to TCP sockets on a multi-node job",
        ("nccl_network", "nccl_ib_unavailable"),
        "network_transport",
        0.45,
        "Make InfiniBand/RoCE available to the job (libibverbs in the container, the IB devices "
        "mounted, NCCL_IB_DISABLE unset) or set NCCL_SOCKET_IFNAME to the fastest interface.",
        _socket_fallback,
    ),
)
