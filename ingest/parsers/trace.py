"""PyTorch profiler (Kineto) Chrome traces, one per rank, read as a stream into a small summary.

A trace can be hundreds of MB; nothing here holds more than one event, one read block and a
bounded step series at a time. ``summarize_trace`` turns a trace into a JSON-able dict of a few
KB (what the agent uploads instead of the trace), and the ``trace`` kind parser accepts either a
raw trace or such a summary and emits one ``TraceSummary`` event per rank.

What is measured:
  - steps: ``ProfilerStep#N`` annotations and their durations, downsampled to ``MAX_POINTS``;
  - GPU time (HTA's definitions): communication kernels (``ncclKernel_*`` before NCCL 2.19,
    ``ncclDevKernel_*`` since), computation kernels (merged), idle = span minus busy;
  - host-side communication for CPU jobs (gloo): ``gloo:*``/``nccl:*`` work annotations and
    ``record_param_comms``; ``c10d::`` ops are counted as calls;
  - data-loader waits (``enumerate(DataLoader)#…__next__``), host syncs (``cudaStreamSynchronize``,
    ``aten::item``) and I/O-looking Python frames (``fsync``, ``write``, ``add_scalar``…);
  - the last ``KEEP_COLLECTIVES`` collectives by ``Seq`` (``record_param_comms``, NCCL), to join
    the Flight Recorder ``collective_seq_id`` and to see which rank starts each one last; gloo
    writes no ``record_param_comms``, so the last host-side ``c10d::`` collective calls are kept
    with their order instead, and the analysis finds their ``Seq`` from the Flight Recorder entry
    created during each call (``time_created_ns``, on the trace's clock: ``baseTimeNanoseconds``
    plus ``ts``).
"""

from __future__ import annotations

import bisect
import codecs
import gzip
import io
import json
import math
import re
import zlib
from collections import OrderedDict, deque
from dataclasses import dataclass
from typing import Any, BinaryIO, ClassVar

from .artifact import register_kind
from .events import Event, register
from .log import LogParse, ParseIssue

SUMMARY_FORMAT = "fleetwatch.trace_summary/1"
BLOCK = 1 << 20
MAX_POINTS = 256  # step series kept per rank; longer runs are averaged into buckets
KEEP_COLLECTIVES = 128
# c10d ops that are collectives of a group (p2p ops have their own sequence in the recorder).
_C10D_P2P = ("c10d::send", "c10d::recv", "c10d::recv_", "c10d::recv_any_source_")
# An agent's summary of a trace (summarize_trace) is a few KB: MAX_POINTS steps, the kept
# collectives, a handful of totals. Past 1 MiB it is no summary, and decoding JSON costs up to
# ~20x its bytes in objects.
MAX_SUMMARY_BYTES = 1 << 20
MAX_PENDING = 200_000  # intervals waiting for their step (events that come before the step)

_STEP = re.compile(r"ProfilerStep\s*#\s*(\d+)")
# Host-side communication spans. gloo runs the op on its own thread under "gloo:<op>"; NCCL's
# host side is "record_param_comms" (the kernel is the real time).
_HOST_COMM = re.compile(r"^(?:gloo|nccl|ncclx|xccl|mpi|ucc):[a-z_]+|^record_param_comms$")
_IO_FRAME = re.compile(
    r"fsync|fdatasync|\bflush\b|\bwrite\b|add_scalar|add_summary|SummaryWriter|torch\.save|"
    r"\bsave\b|pickle\.dump|\bclose\b|os\.sync",
    re.IGNORECASE,
)
_HOST_SYNC = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize")


@dataclass(frozen=True, slots=True, kw_only=True)
class TraceSummary(Event):
    """One rank's profiler trace in a few KB. Times in microseconds."""

    kind: ClassVar[str] = "trace_summary"
    steps: int = 0
    first_step: int | None = None
    last_step: int | None = None
    step_ms: tuple[float, ...] = ()  # step durations, bucket-averaged when there are many
    step_bucket: int = 1  # how many steps each point of step_ms averages
    comm_ms_per_step: tuple[float, ...] = ()  # same buckets: time in communication
    dataloader_ms_per_step: tuple[float, ...] = ()
    io_ms_per_step: tuple[float, ...] = ()
    span_us: float = 0.0
    gpu: bool = False
    compute_us: float = 0.0
    comm_us: float = 0.0
    idle_us: float = 0.0
    comm_kernels: int = 0
    comm_calls: int = 0
    dataloader_us: float = 0.0
    host_sync_us: float = 0.0
    io_us: float = 0.0
    # (seq, start_us, dur_us, op, pg) from record_param_comms; start_us on the trace's clock
    collectives: tuple[tuple[int, float, float, str, str], ...] = ()
    # (ordinal, start_us, dur_us, op): host-side c10d:: collective calls, numbered in trace order
    calls: tuple[tuple[int, float, float, str], ...] = ()
    clock_base_us: float = 0.0  # start_us + clock_base_us = Unix time in µs
    host: str = ""
    world_size: int | None = None


register(TraceSummary)


class TraceError(ValueError):
    pass


class _Text:
    """A window on the decoded text of a byte stream: ``buf[pos:]`` is what is not yet read."""

    def __init__(self, stream: BinaryIO):
        self.stream = stream
        self.decoder = codecs.getincrementaldecoder("utf-8")("replace")
        self.buf = ""
        self.pos = 0
        self.eof = False

    def more(self) -> bool:
        if self.eof:
            return False
        raw = self.stream.read(BLOCK)
        if not raw:
            self.eof = True
            self.buf = self.buf[self.pos :] + self.decoder.decode(b"", final=True)
            self.pos = 0
            return False
        self.buf = self.buf[self.pos :] + self.decoder.decode(raw)
        self.pos = 0
        return True

    def peek(self) -> str:
        """The next non-blank character ('' at the end), without consuming it."""
        while True:
            buf, pos, n = self.buf, self.pos, len(self.buf)
            while pos < n and buf[pos] in " \t\r\n":
                pos += 1
            self.pos = pos
            if pos < n:
                return buf[pos]
            if not self.more():
                return ""

    def take(self, char: str) -> None:
        if self.peek() != char:
            got = self.buf[self.pos : self.pos + 20]
            raise TraceError(f"expected {char!r} at {got!r}")
        self.pos += 1

    def value(self, decoder=json.JSONDecoder()) -> Any:  # noqa: B008 - one shared decoder
        self.peek()
        while True:
            try:
                value, end = decoder.raw_decode(self.buf, self.pos)
            except json.JSONDecodeError:
                if self.more():
                    continue
                raise TraceError("truncated or malformed JSON") from None
            except RecursionError:
                raise TraceError("JSON nested too deeply for a profiler trace") from None
            # A number at the end of the block may go on in the next one.
            if end == len(self.buf) and not self.eof and self.more():
                continue
            self.pos = end
            return value


def _open(stream: BinaryIO) -> BinaryIO:
    head = stream.peek(2)[:2] if hasattr(stream, "peek") else b""
    if not head:
        start = stream.tell()
        head = stream.read(2)
        stream.seek(start)
    if head == b"\x1f\x8b":
        return gzip.GzipFile(fileobj=stream)  # type: ignore[return-value]
    return stream


class _Series:
    """Step rows (duration, comm, data loader, io in µs), averaged pairwise past MAX_POINTS:
    memory stays constant however long the run."""

    def __init__(self) -> None:
        self.rows: list[list[float]] = []
        self.bucket = 1
        self.partial: list[float] | None = None
        self.partial_n = 0

    def add(self, row: list[float]) -> None:
        if self.partial is None:
            self.partial, self.partial_n = list(row), 1
        else:
            self.partial = [a + b for a, b in zip(self.partial, row, strict=True)]
            self.partial_n += 1
        if self.partial_n == self.bucket:
            self.rows.append([v / self.bucket for v in self.partial])
            self.partial, self.partial_n = None, 0
            if len(self.rows) >= 2 * MAX_POINTS:
                self.rows = [
                    [(a + b) / 2 for a, b in zip(x, y, strict=True)]
                    for x, y in zip(self.rows[::2], self.rows[1::2], strict=True)
                ]
                self.bucket *= 2

    def points(self) -> list[list[float]]:
        rows = list(self.rows)
        if self.partial is not None:
            rows.append([v / self.partial_n for v in self.partial])
        return rows


class _Merge:
    """Running union of intervals that arrive (mostly) in start order."""

    def __init__(self) -> None:
        self.total = 0.0
        self.start: float | None = None
        self.end = 0.0

    def add(self, start: float, end: float) -> None:
        if self.start is None or start > self.end:
            if self.start is not None:
                self.total += self.end - self.start
            self.start, self.end = start, end
        elif end > self.end:
            self.end = end

    def value(self) -> float:
        return self.total + ((self.end - self.start) if self.start is not None else 0.0)


class _Summarizer:
    def __init__(self) -> None:
        self.steps: list[tuple[float, float, int]] = []  # (start, end, number) in arrival order
        self.step_extra: dict[int, list[float]] = {}  # step number -> [comm, dataloader, io]
        self.pending: list[tuple[float, float, int]] = []  # (ts, dur, which) before their step
        self.comm_kernel_us = 0.0
        self.comm_kernels = 0
        self.compute = _Merge()
        self.busy = _Merge()
        self.gpu_first: float | None = None
        self.gpu_last = 0.0
        self.host_comm: dict[Any, _Merge] = {}
        self.comm_calls = 0
        self.dataloader_us = 0.0
        self.host_sync_us = 0.0
        self.io_us = 0.0
        self.collectives: OrderedDict[tuple[str, int], tuple] = OrderedDict()
        self.calls: deque[tuple[int, float, float, str]] = deque(maxlen=KEEP_COLLECTIVES)
        self.collective_calls = 0
        self.first_ts: float | None = None
        self.last_ts = 0.0
        self.meta: dict[str, Any] = {}

    def _attribute(self, ts: float, dur: float, which: int) -> None:
        steps = self.steps
        if steps and steps[-1][0] <= ts <= steps[-1][1]:
            self.step_extra[steps[-1][2]][which] += dur
            return
        i = bisect.bisect_right(steps, (ts, float("inf"), 0)) - 1
        if i >= 0 and steps[i][0] <= ts <= steps[i][1]:
            self.step_extra[steps[i][2]][which] += dur
        elif len(self.pending) < MAX_PENDING:
            self.pending.append((ts, dur, which))

    def event(self, ev: dict[str, Any]) -> None:
        if ev.get("ph") != "X":
            return
        name = ev.get("name")
        ts, dur = ev.get("ts"), ev.get("dur")
        if not isinstance(name, str) or not isinstance(ts, int | float):
            return
        dur = dur if isinstance(dur, int | float) else 0.0
        end = ts + dur
        if self.first_ts is None or ts < self.first_ts:
            self.first_ts = ts
        if end > self.last_ts:
            self.last_ts = end
        cat = ev.get("cat", "")
        if cat == "kernel":
            self.gpu_first = ts if self.gpu_first is None else min(self.gpu_first, ts)
            self.gpu_last = max(self.gpu_last, end)
            self.busy.add(ts, end)
            if name.startswith("nccl"):
                self.comm_kernel_us += dur
                self.comm_kernels += 1
                self._attribute(ts, dur, 0)
            elif not name.startswith(("Memcpy", "Memset", "dma")):
                self.compute.add(ts, end)
            return
        if name.startswith("ProfilerStep"):
            m = _STEP.match(name)
            if m:
                number = int(m.group(1))
                if number not in self.step_extra:
                    self.step_extra[number] = [0.0, 0.0, 0.0]
                    row = (ts, end, number)
                    if not self.steps or ts >= self.steps[-1][0]:
                        self.steps.append(row)
                    else:
                        bisect.insort(self.steps, row)
            return
        if name.startswith("enumerate(DataLoader)"):
            self.dataloader_us += dur
            self._attribute(ts, dur, 1)
            return
        if name.startswith("c10d::"):
            if not name.startswith(_C10D_P2P):
                # Numbered among the group collectives only, as the recorder numbers its seqs.
                self.calls.append((self.collective_calls, ts, dur, name[6:46]))
                self.collective_calls += 1
            self.comm_calls += 1
            return
        if _HOST_COMM.match(name):
            tid = ev.get("tid")
            tid = tid if isinstance(tid, int | str) else None  # a thread id is a number or a name
            merge = self.host_comm.get(tid)
            if merge is None:
                merge = self.host_comm[tid] = _Merge()
            merge.add(ts, end)
            args = ev.get("args") or {}
            seq = args.get("Seq") if isinstance(args, dict) else None
            if isinstance(seq, int) and name == "record_param_comms":
                op = str(args.get("Collective name", ""))[:40]
                pg = str(args.get("Process Group Name", ""))[:40]
                self.collectives[(pg, seq)] = (seq, ts, dur, op, pg)
                self.collectives.move_to_end((pg, seq))
                if len(self.collectives) > KEEP_COLLECTIVES:
                    self.collectives.popitem(last=False)
            if not name.startswith("record_param_comms"):
                self._attribute(ts, dur, 0)
            return
        if cat == "cuda_runtime" and name in _HOST_SYNC:
            self.host_sync_us += dur
            return
        if cat == "python_function" and _IO_FRAME.search(name):
            self.io_us += dur
            self._attribute(ts, dur, 2)

    def finish(self) -> dict[str, Any]:
        pending, self.pending = self.pending, []
        for ts, dur, which in pending:
            i = bisect.bisect_right(self.steps, (ts, float("inf"), 0)) - 1
            if i >= 0 and self.steps[i][0] <= ts <= self.steps[i][1]:
                self.step_extra[self.steps[i][2]][which] += dur
        series = _Series()
        for start, end, number in sorted(self.steps, key=lambda s: s[2]):
            extra = self.step_extra[number]
            series.add([end - start, *extra])
        points = series.points()
        gpu = self.gpu_first is not None
        span_gpu = (self.gpu_last - self.gpu_first) if gpu else 0.0
        host_comm = sum(m.value() for m in self.host_comm.values())
        dist = self.meta.get("distributedInfo") or {}
        numbers = [s[2] for s in self.steps]
        base = self.meta.get("baseTimeNanoseconds")
        return {
            "format": SUMMARY_FORMAT,
            # Empty, so that Chrome-trace readers and the kind sniffer take the summary for a
            # trace; the summary's own fields follow.
            "traceEvents": [],
            "rank": dist.get("rank") if isinstance(dist, dict) else None,
            "world_size": dist.get("world_size") if isinstance(dist, dict) else None,
            "host": str(self.meta.get("host_name", ""))[:200],
            "steps": len(self.steps),
            "first_step": min(numbers) if numbers else None,
            "last_step": max(numbers) if numbers else None,
            "step_bucket": series.bucket,
            "step_ms": [round(p[0] / 1000, 4) for p in points],
            "comm_ms_per_step": [round(p[1] / 1000, 4) for p in points],
            "dataloader_ms_per_step": [round(p[2] / 1000, 4) for p in points],
            "io_ms_per_step": [round(p[3] / 1000, 4) for p in points],
            "span_us": (self.last_ts - self.first_ts) if self.first_ts is not None else 0.0,
            "gpu": gpu,
            "compute_us": self.compute.value(),
            "comm_us": self.comm_kernel_us if gpu else host_comm,
            "idle_us": (span_gpu - self.busy.value()) if gpu else 0.0,
            "comm_kernels": self.comm_kernels,
            "comm_calls": self.comm_calls,
            "dataloader_us": self.dataloader_us,
            "host_sync_us": self.host_sync_us,
            "io_us": self.io_us,
            "collectives": [list(c) for c in self.collectives.values()],
            "calls": [list(c) for c in self.calls],
            # Kineto >= torch 2.4 writes ts relative to this base; before, ts is Unix time.
            "clock_base_us": base / 1000 if isinstance(base, int) else 0.0,
        }


def _walk(text: _Text, summary: _Summarizer) -> None:
    text.take("{")
    if text.peek() == "}":
        return
    while True:
        key = text.value()
        text.take(":")
        if key == "traceEvents":
            text.take("[")
            if text.peek() == "]":
                text.pos += 1
            else:
                while True:
                    ev = text.value()
                    if isinstance(ev, dict):
                        summary.event(ev)
                    sep = text.peek()
                    text.pos += 1
                    if sep == "]":
                        break
                    if sep != ",":
                        raise TraceError("malformed traceEvents array")
        else:
            value = text.value()
            if key in ("distributedInfo", "host_name", "format") or isinstance(value, str | int):
                summary.meta[key] = value
        sep = text.peek()
        text.pos += 1
        if sep == "}":
            return
        if sep != ",":
            raise TraceError("malformed trace object")


def summarize_trace(stream: BinaryIO | bytes) -> dict[str, Any]:
    """A raw Kineto trace (plain or gzip) -> a JSON-able summary of a few KB. Raises
    ``TraceError`` when the input is not a trace (what was read before the damage is lost)."""
    if isinstance(stream, bytes | bytearray):
        stream = io.BytesIO(stream)
    summary = _Summarizer()
    text = _Text(_open(stream))
    try:
        _walk(text, summary)
    except (EOFError, OSError, zlib.error) as exc:
        raise TraceError(f"damaged compressed trace: {exc}") from None
    return summary.finish()


def _is_summary(head: bytes) -> bool:
    return SUMMARY_FORMAT.encode() in head


def _finite(value: Any) -> bool:
    """A JSON number a summary may hold: not a bool, not NaN or an infinity (which Python's
    decoder accepts), not an integer too wide for a float."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return False
    if isinstance(value, int):
        return value.bit_length() <= 64
    return math.isfinite(value)


def _numbers(values) -> bool:
    return all(map(_finite, values))


def _event_from_summary(summary: dict[str, Any], source: str, rank: int | None) -> TraceSummary:
    # A summary comes from an agent, or from anyone with an upload key: every value is checked.
    def rows(key: str) -> list:
        values = summary.get(key)
        return values[:KEEP_COLLECTIVES] if isinstance(values, list) else []

    def floats(key: str) -> tuple[float, ...]:
        values = summary.get(key)
        values = values[: 2 * MAX_POINTS] if isinstance(values, list) else ()
        return tuple(float(v) for v in values if _finite(v))

    def number(key: str) -> float:
        value = summary.get(key)
        return float(value) if _finite(value) else 0.0

    def integer(key: str) -> int | None:
        value = summary.get(key)
        return value if isinstance(value, int) and _finite(value) else None

    def label(value: Any) -> str:
        return value[:40] if isinstance(value, str) else ""

    def seq_row(row: Any, sizes: tuple[int, ...]) -> bool:
        return (
            isinstance(row, list)
            and len(row) in sizes
            and isinstance(row[0], int)
            and _numbers(row[:3])
        )

    collectives, calls = [], []
    for row in rows("collectives"):
        # Summaries written before the group was recorded have four fields.
        if seq_row(row, (4, 5)):
            pg = label(row[4]) if len(row) == 5 else ""
            collectives.append((row[0], float(row[1]), float(row[2]), label(row[3]), pg))
    for row in rows("calls"):
        if seq_row(row, (4,)):
            calls.append((row[0], float(row[1]), float(row[2]), label(row[3])))
    step_ms = floats("step_ms")
    text = (
        f"rank {rank} trace: {summary.get('steps', 0)} steps, "
        f"step {min(step_ms, default=0):.1f}-{max(step_ms, default=0):.1f} ms, "
        f"comm {number('comm_us') / 1000:.1f} ms, data loader {number('dataloader_us') / 1000:.1f}"
        f" ms, io {number('io_us') / 1000:.1f} ms"
    )
    return TraceSummary(
        line=0,
        text=text,
        rank=rank,
        source=source,
        steps=integer("steps") or 0,
        first_step=integer("first_step"),
        last_step=integer("last_step"),
        step_ms=step_ms,
        step_bucket=integer("step_bucket") or 1,
        comm_ms_per_step=floats("comm_ms_per_step"),
        dataloader_ms_per_step=floats("dataloader_ms_per_step"),
        io_ms_per_step=floats("io_ms_per_step"),
        span_us=number("span_us"),
        gpu=bool(summary.get("gpu")),
        compute_us=number("compute_us"),
        comm_us=number("comm_us"),
        idle_us=number("idle_us"),
        comm_kernels=integer("comm_kernels") or 0,
        comm_calls=integer("comm_calls") or 0,
        dataloader_us=number("dataloader_us"),
        host_sync_us=number("host_sync_us"),
        io_us=number("io_us"),
        collectives=tuple(collectives),
        calls=tuple(calls),
        clock_base_us=number("clock_base_us"),
        host=summary["host"][:200] if isinstance(summary.get("host"), str) else "",
        world_size=integer("world_size"),
    )


def parse_trace(stream: BinaryIO | bytes, *, source: str = "") -> LogParse:
    """A raw trace or an agent's summary of one -> one ``TraceSummary`` event."""
    from .flight_recorder import rank_from_name

    if isinstance(stream, bytes | bytearray):
        stream = io.BytesIO(stream)
    try:
        stream = _open(stream)
        head = stream.read(4096)
        rest = io.BufferedReader(_Chain(head, stream))  # type: ignore[arg-type]
        if _is_summary(head):
            text = rest.read(MAX_SUMMARY_BYTES + 1)
            if len(text) > MAX_SUMMARY_BYTES:
                raise TraceError(
                    f"a trace summary is a few KB; this one is over {MAX_SUMMARY_BYTES >> 20} MiB"
                )
            try:
                summary = json.loads(text)
            except RecursionError:
                raise TraceError("summary JSON nested too deeply") from None
            if not isinstance(summary, dict):
                raise TraceError("summary is not an object")
        else:
            summary = summarize_trace(rest)
    except (TraceError, ValueError, OSError, EOFError, zlib.error) as exc:
        return LogParse(
            source=source,
            events=(),
            issues=(ParseIssue(0, f"unreadable profiler trace: {exc}"),),
            complete=False,
        )
    rank = summary.get("rank")
    if not isinstance(rank, int):
        rank = rank_from_name(source)
    return LogParse(source=source, events=(_event_from_summary(summary, source, rank),))


class _Chain(io.RawIOBase):
    """``head`` then the rest of ``stream``: lets us sniff a non-seekable (gzip) stream."""

    def __init__(self, head: bytes, stream: BinaryIO):
        self.head, self.stream = head, stream

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        if self.head:
            n = min(len(buffer), len(self.head))
            buffer[:n] = self.head[:n]
            self.head = self.head[n:]
            return n
        chunk = self.stream.read(len(buffer))
        buffer[: len(chunk)] = chunk
        return len(chunk)


register_kind("trace", parse_trace)

__all__ = ["SUMMARY_FORMAT", "TraceError", "TraceSummary", "parse_trace", "summarize_trace"]
