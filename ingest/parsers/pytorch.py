"""ProcessGroupNCCL lines, every PyTorch era from 1.8 to 2.10.

Log prefix (the part naming the process group) by era:
  - 1.8 – 2.1: ``[Rank 3]``
  - 2.2 – 2.3: ``[PG 0 Rank 3]`` (and ``[PG 0 (default_pg) Rank 3]`` briefly)
  - 2.4 +    : ``[PG ID 0 PG GUID 0(default_pg) Rank 3]`` (GUID without a name for sub-groups)
  Some 2.4+ messages keep the bare ``[Rank 3]`` form while the progress line uses the PG form.
"""

from __future__ import annotations

import re

from .events import (
    CollectiveMismatch,
    CollectiveStack,
    DesyncReport,
    DumpSignal,
    Event,
    HeartbeatTimeout,
    StoreTimeout,
    WatchdogAbort,
    WatchdogTimeout,
    WorkProgress,
)
from .lines import Line
from .prefix import Prefix

# Every line this parser reads holds "NCCL" (c10 log lines carry "ProcessGroupNCCL.cpp", the
# watchdog message "WorkNCCL(", progress "NCCL work:") or is a Python exception ("Error":
# DistBackendError, the CollectiveFingerPrint mismatch). Desync report lines and stack frames
# carry neither: they are reached with follow() from the line above them.
TRIGGERS: tuple[bytes, ...] = (b"NCCL", b"Error", b"waitForInput")
# Desync report lines that follow a watchdog or "Rank N" header line (TORCH_NCCL_DESYNC_DEBUG).
DESYNC_FOLLOW = 4

_PG_TAG = re.compile(
    r"""\[(?:
        PG\ ID\ (?P<pg_id>\d+)\ PG\ GUID\ (?P<guid>[^\s(\]]+)(?:\((?P<pg_name>[^)]*)\))?   # 2.4+
      | PG\ (?P<pg_old>\d+)(?:\ \((?P<pg_old_name>[^)]*)\))?                             # 2.2-2.3
    )?\ ?Rank\ (?P<pg_rank>\d+)\]""",
    re.VERBOSE,
)
# "[rank0]:" somewhere inside the line: tqdm bars and other prints run into it without a newline.
_INLINE_RANK = re.compile(r"\[rank(\d+)\]:")

# Watchdog timeout, all eras; the body of WorkNCCL(...) is parsed key by key below because its
# fields changed: 1.8 had only OpType and Timeout(ms); 1.9 added SeqNum; 1.10-1.13 printed
# TensorShape=[...]; 2.0+ prints NumelIn/NumelOut (18446744073709551615 = -1 for COALESCED).
# Blocking wait (NCCL_BLOCKING_WAIT=1, torch 1.7-1.9) raised the same text from WorkNCCL::wait
# without the watchdog's word: "[Rank 0] Caught collective operation timeout: WorkNCCL(...)".
_WATCHDOG = re.compile(
    r"(?:Watchdog c|\bC)aught collective operation timeout: WorkNCCL\((?P<body>.*?)\)\s+ran for\s+"
    r"(?P<ran>\d+)\s+milliseconds before timing out"
)
# c10d socket.cpp (2.2+): "[c10d] waitForInput: socket SocketImpl(...) timed out after 1800000ms".
_STORE_WAIT = re.compile(r"waitForInput: socket .*? timed out after (?P<ms>\d+)\s*ms")
_KV = re.compile(r"(\w+)(?:\(ms\))?=(\[[^\]]*\]|[^,]*)")

# Progress when the watchdog fired.
#   2.2-2.3: "Timeout at NCCL work: 19, last enqueued NCCL work: 19, last completed NCCL work: 18."
#   2.4    : "Exception (either an error or timeout) detected by watchdog at work: 29, last …"
#   2.5+   : "failure detected by watchdog at work sequence id: 5 PG status: last enqueued work: 5,
#             last completed work: 4"
_PROGRESS = re.compile(
    r"(?:(?:Timeout at NCCL work|detected by watchdog at work(?: sequence id)?):\s*"
    r"(?P<failed>-?\d+)"
    r"[,.]?\s*(?:PG status:)?\s*)"
    r"last enqueued (?:NCCL )?work:\s*(?P<enq>-?\d+),\s*"
    r"(?:last started (?:NCCL )?work:\s*(?P<started>-?\d+),\s*)?"
    r"last completed (?:NCCL )?work:\s*(?P<done>-?\d+)"
)
# 2.4+: "Received a dump signal due to a collective timeout from this local rank | from  rank 7
# and we will try our best to dump the debug info. Last enqueued NCCL work: X, last completed …"
# 2.4+: "Observed flight recorder dump signal from another rank via TCPStore."
_DUMP = re.compile(
    r"Received a dump signal (?:due to a collective timeout )?from\s+(?:(?P<local>this local rank)"
    r"|rank\s+(?P<from>\d+))"
    r"(?:.*?Last enqueued (?:NCCL )?work:\s*(?P<enq>-?\d+),\s*last completed (?:NCCL )?work:\s*"
    r"(?P<done>-?\d+))?"
)
_DUMP_STORE = re.compile(
    r"(?:Observed|Received) (?:flight recorder )?dump signal from another rank"
)
_HEARTBEAT = re.compile(r"Heartbeat monitor timed out")
_STACK_HEAD = re.compile(r"Stack trace of the failed collective:\s*$")
_FRAME = re.compile(r"^#(\d+)\s+(.+)$")
# 2.2+: the desync report is logged as "<c10 prefix> Rank 3" followed by its lines.
_DESYNC_HEAD = re.compile(r"\]\s*Rank \d+\s*$")
# TraceUtils.h (TORCH_NCCL_DESYNC_DEBUG), 2.0+
_NEVER_JOINED = re.compile(r"ranks \[(?P<ranks>[\d,\s]*)\] are the lagging ranks")
_NOT_FINISHED = re.compile(
    r"\[(?P<ranks>[\d,\s]*)\] joined but didn't finish collective #(?P<seq>\d+)"
)
# TORCH_DISTRIBUTED_DEBUG=DETAIL (ProcessGroupWrapper), 1.10+
_MISMATCH = re.compile(
    r"Rank (?P<ra>\d+) is running (?:inconsistent )?collective: CollectiveFingerPrint\("
    r"(?:SequenceNumber=(?P<seq>\d+),\s*)?OpType=(?P<opa>\w+)(?:,\s*TensorShape=(?P<sa>\[[^\]]*\]))?"
    r".*?but Rank (?P<rb>\d+) is running (?:inconsistent )?collective: CollectiveFingerPrint\("
    r"(?:SequenceNumber=\d+,\s*)?OpType=(?P<opb>\w+)(?:,\s*TensorShape=(?P<sb>\[[^\]]*\]))?"
)

_MISMATCH_FIRST = re.compile(
    r"Rank (?P<ra>\d+) is running (?:inconsistent )?collective(?:: CollectiveFingerPrint\("
    r"(?:SequenceNumber=\d+,\s*)?OpType=(?P<opa>\w+))?"
)

MAX_FRAMES = 24
WRAP_LINES = 3  # a wrapped watchdog line is joined over at most this many following lines


def _int(value: str | None) -> int | None:
    if value is None:
        return None
    value = value.strip()
    try:
        number = int(value)
    except ValueError:
        return None
    # COALESCED work prints NumelIn=-1 as an unsigned 64-bit number.
    return -1 if number == 2**64 - 1 else number


def _ranks(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", text))


class PytorchParser:
    """Stateful only for multi-line blocks (the frames under a stack-trace header)."""

    triggers = TRIGGERS

    def __init__(self) -> None:
        self._stack: list[str] | None = None
        self._stack_head: tuple[Line, int | None] | None = None
        # A watchdog line wrapped over several lines by a terminal or a paste: its start, the
        # text joined so far and how many more lines may complete it.
        self._wrapped: tuple[Line, Prefix, str, int] | None = None

    def _timeout(self, line: Line, pre: Prefix, text: str, follow) -> list[Event]:
        m = _WATCHDOG.search(text)
        fields = {k: v for k, v in _KV.findall(m.group("body"))}
        pg, pg_rank = self._pg(text)
        follow(DESYNC_FOLLOW)
        rank, rank_from = self._rank_and_source(pre, line.text, pg, pg_rank)
        return [
            WatchdogTimeout(
                line=line.number,
                text=line.text if text == pre.rest else text[:2000],
                rank=rank,
                rank_from=rank_from,
                pg=pg,
                pg_rank=pg_rank,
                seq=_int(fields.get("SeqNum")),
                op=fields.get("OpType", "").strip(),
                numel_in=_int(fields.get("NumelIn")),
                numel_out=_int(fields.get("NumelOut")),
                timeout_ms=_int(fields.get("Timeout")),
                ran_for_ms=_int(m.group("ran")),
            )
        ]

    def _pg(self, text: str) -> tuple[str | None, int | None]:
        m = _PG_TAG.search(text)
        if not m:
            return None, None
        pg = m.group("pg_name") or m.group("pg_id") or m.group("pg_old_name") or m.group("pg_old")
        return pg, int(m.group("pg_rank"))

    def _rank(self, pre: Prefix, text: str, pg: str | None, pg_rank: int | None) -> int | None:
        return self._rank_and_source(pre, text, pg, pg_rank)[0]

    def _rank_and_source(
        self, pre: Prefix, text: str, pg: str | None, pg_rank: int | None
    ) -> tuple[int | None, str]:
        default_group = pg in (None, "0", "default_pg")
        if pre.rank is not None:
            if (
                pre.task is not None
                and default_group
                and pg_rank is not None
                and pg_rank > pre.task
            ):
                # An srun/mpirun task id below the rank the watchdog names: torch.distributed
                # sorts a group's ranks (new_group), so a process's rank in any group is at most
                # its global rank, and this task is a node's launcher, not rank pre.task.
                return pg_rank, "watchdog"
            return pre.rank, "launcher"
        m = _INLINE_RANK.search(text)
        if m:
            return int(m.group(1)), "launcher"
        # Without a launcher prefix, the PG rank is the global rank only on the default group.
        if default_group and pg_rank is not None:
            return pg_rank, "watchdog"
        return None, ""

    def feed(self, line: Line, pre: Prefix, follow) -> list[Event]:
        text = pre.rest
        out: list[Event] = []
        if self._wrapped is not None:
            first, first_pre, joined, left = self._wrapped
            self._wrapped = None
            starts_anew = "Watchdog caught" in text
            joined = f"{joined} {text.strip()}"
            if not starts_anew and _WATCHDOG.search(joined):
                return self._timeout(first, first_pre, joined, follow)
            if not starts_anew and left > 1 and "ran for" not in joined:
                self._wrapped = (first, first_pre, joined, left - 1)
                follow(1)
            # Not (yet) completed: the line is read for what it says itself as well.
        if self._stack is not None:
            m = _FRAME.match(text.strip())
            if m and len(self._stack) < MAX_FRAMES:
                self._stack.append(m.group(2)[:300])
                follow(1)
                return out
            out.extend(self.flush())
        if "waitForInput" in text:
            m = _STORE_WAIT.search(text)
            if m:
                out.append(
                    StoreTimeout(
                        line=line.number,
                        text=line.text,
                        rank=self._rank(pre, line.text, None, None),
                        timeout_ms=int(m.group("ms")),
                    )
                )
                return out
        if "WorkNCCL(" in text and _WATCHDOG.search(text):
            return out + self._timeout(line, pre, text, follow)
        if "Watchdog caught collective operation timeout" in text and "ran for" not in text:
            # Wrapped: "…timeout:" / "WorkNCCL(SeqNum=…)" / "ran for N milliseconds…".
            self._wrapped = (line, pre, text.rstrip(), WRAP_LINES)
            follow(1)
            return out
        m = _PROGRESS.search(text) if "last enqueued" in text else None
        if m:
            pg, pg_rank = self._pg(text)
            out.append(
                WorkProgress(
                    line=line.number,
                    text=line.text,
                    rank=self._rank(pre, line.text, pg, pg_rank),
                    pg=pg,
                    pg_rank=pg_rank,
                    failed_seq=_int(m.group("failed")),
                    last_enqueued=_int(m.group("enq")),
                    last_started=_int(m.group("started")),
                    last_completed=_int(m.group("done")),
                )
            )
            return out
        if "dump signal" in text:
            m = _DUMP.search(text)
            store = _DUMP_STORE.search(text)
            if m or store:
                pg, pg_rank = self._pg(text)
                out.append(
                    DumpSignal(
                        line=line.number,
                        text=line.text,
                        rank=self._rank(pre, line.text, pg, pg_rank),
                        pg=pg,
                        pg_rank=pg_rank,
                        from_rank=_int(m.group("from")) if m else None,
                        via_store=bool(store),
                        last_enqueued=_int(m.group("enq")) if m else None,
                        last_completed=_int(m.group("done")) if m else None,
                    )
                )
            return out
        if "Heartbeat" in text and _HEARTBEAT.search(text):
            pg, pg_rank = self._pg(text)
            out.append(
                HeartbeatTimeout(
                    line=line.number,
                    text=line.text,
                    rank=self._rank(pre, line.text, pg, pg_rank),
                    pg=pg,
                    pg_rank=pg_rank,
                )
            )
            return out
        if "Stack trace" in text and _STACK_HEAD.search(text):
            self._stack = []
            self._stack_head = (line, self._rank(pre, line.text, *self._pg(text)))
            follow(1)
            return out
        if "ProcessGroupNCCL" in text and _DESYNC_HEAD.search(text):
            follow(DESYNC_FOLLOW)
            return out
        m = _NEVER_JOINED.search(text) if "lagging" in text else None
        if m:
            out.append(
                DesyncReport(
                    line=line.number,
                    text=line.text,
                    rank=pre.rank,
                    never_joined=_ranks(m.group("ranks")),
                )
            )
            return out
        m = _NOT_FINISHED.search(text) if "finish" in text else None
        if m:
            out.append(
                DesyncReport(
                    line=line.number,
                    text=line.text,
                    rank=pre.rank,
                    not_finished=_ranks(m.group("ranks")),
                    seq=_int(m.group("seq")),
                )
            )
            return out
        m = _MISMATCH.search(text) if "CollectiveFingerPrint" in text else None
        if m:
            out.append(
                CollectiveMismatch(
                    line=line.number,
                    text=line.text,
                    rank=pre.rank,
                    seq=_int(m.group("seq")),
                    rank_a=_int(m.group("ra")),
                    op_a=m.group("opa"),
                    shape_a=m.group("sa") or "",
                    rank_b=_int(m.group("rb")),
                    op_b=m.group("opb"),
                    shape_b=m.group("sb") or "",
                )
            )
            return out
        if "Detected mismatch between collectives on ranks" in text:
            # ProcessGroupWrapper raises this only on a mismatch; a pasted or wrapped excerpt
            # may cut the fingerprints after it: the fact stands without them.
            first = _MISMATCH_FIRST.search(text)
            out.append(
                CollectiveMismatch(
                    line=line.number,
                    text=line.text,
                    rank=pre.rank,
                    rank_a=_int(first.group("ra")) if first else None,
                    op_a=(first.group("opa") or "") if first else "",
                )
            )
            return out
        if "Some NCCL operations have failed or timed out" in text or (
            "WorkNCCL::checkTimeout" in text
        ):
            # The watchdog's abort message (all eras) and the C++ frame of its timeout check:
            # the collective failed even when the WorkNCCL(...) line itself was not kept.
            out.append(WatchdogAbort(line=line.number, text=line.text, rank=pre.rank))
        return out

    def flush(self) -> list[Event]:
        if self._stack is None or self._stack_head is None:
            return []
        head, rank = self._stack_head
        frames = tuple(self._stack)
        self._stack = self._stack_head = None
        if not frames:
            return []
        return [CollectiveStack(line=head.number, text=head.text, rank=rank, frames=frames)]
