"""How processes ended: torchrun / torch.distributed.elastic failures, signals, CUDA and host
out-of-memory, Python tracebacks, CUDA runtime errors and rendezvous failures.

The elastic agent reports a failed worker in two places: a log line (``failed (exitcode: -6)
local_rank: 0 (pid: 48096) of binary: …``) and, when torchrun exits, the message of its
``ChildFailedError``: a table with a "Root Cause (first observed failure)" entry and the other
"Failures:". We read both; the table is followed line by line from the ``ChildFailedError`` line.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from .events import (
    AgentSignal,
    CudaError,
    CudaOom,
    Event,
    FailureRecord,
    HostOomKill,
    PythonException,
    RendezvousError,
    TracebackCut,
    WorkerFailed,
)
from .lines import Line
from .prefix import Prefix

# "exitcode" (the failed-worker line and the table), "elastic" (every torchelastic logger:
# "Sending process … closing signal"), "Traceback", "Killed" (kernel OOM killer, shells, srun)
# and "Error" (exception lines printed without their traceback).
# "CUDA out of memory": the caching allocator's message (c10/cuda/CUDACachingAllocator.cpp) as
# trainers quote it in their own warnings ("OOM: Ran out of memory with exception: CUDA out of
# memory. Tried to allocate …", fairseq), on lines without an exception type.
# "Root Cause (first observed failure)": the elastic table pasted without its header line.
TRIGGERS: tuple[bytes, ...] = (
    b"exitcode",
    b"elastic",
    b"Traceback",
    b"Killed",
    b"Error",
    b"CUDA out of memory",
    b"exits with return code",
    b"Root Cause (first observed failure)",
)
_ROOT_CAUSE = "Root Cause (first observed failure)"

# Signals by number, with what they usually mean for a training worker.
SIGNALS: dict[int, tuple[str, str]] = {
    1: ("SIGHUP", "the terminal or session went away"),
    2: ("SIGINT", "interrupted (Ctrl-C or the scheduler)"),
    4: ("SIGILL", "illegal instruction (binary built for another CPU)"),
    6: (
        "SIGABRT",
        "abort: the NCCL watchdog taking the process down after a timeout or error, "
        "or a C++ exception/assert",
    ),
    7: ("SIGBUS", "bus error: often /dev/shm too small for DataLoader workers"),
    8: ("SIGFPE", "floating point exception"),
    9: ("SIGKILL", "killed: often the host OOM killer, or a scheduler/agent hard kill"),
    11: ("SIGSEGV", "segmentation fault: a crash in native code"),
    13: ("SIGPIPE", "broken pipe"),
    15: (
        "SIGTERM",
        "terminated: usually sent by the elastic agent or the scheduler after "
        "another worker failed, or a time limit",
    ),
}


def signal_name(exitcode: int | None) -> str:
    """Signal behind an exit code: negative codes (Python's subprocess) and 128+N (shells)."""
    if exitcode is None:
        return ""
    number = -exitcode if exitcode < 0 else exitcode - 128 if 128 < exitcode < 160 else 0
    return SIGNALS.get(number, ("",))[0] if number else ""


# torch.distributed.elastic.multiprocessing.api, 1.9+ (all logger formats):
# "failed (exitcode: -6) local_rank: 0 (pid: 48096) of binary: /usr/bin/python".
_WORKER_FAILED = re.compile(
    r"failed \(exitcode: (?P<code>-?\d+)\) local_rank: (?P<local>\d+) \(pid: (?P<pid>\d+)\)"
)
# DeepSpeed's launcher (deepspeed/launcher/launch.py sigkill_handler), once a worker exited
# non-zero: "[…, '--local_rank=7', …] exits with return code = -9". The code is the failed
# worker's; the command printed is the last one the launcher built, whichever worker failed, so
# it names no rank.
_DS_EXIT = re.compile(r"\] exits with return code = (?P<code>-?\d+)")
# 1.9+: "Sending process 48099 closing signal SIGTERM".
_CLOSING = re.compile(r"Sending process (?P<pid>\d+) closing signal (?P<sig>SIG[A-Z]+)")
# Kernel OOM killer:
#   5.x+: "Out of memory: Killed process 1234 (python) total-vm:…" and
#         "Memory cgroup out of memory: Killed process 1234 (python) …"
#   <5.0: "Out of memory: Kill process 1234 (python) score 900 …" then "Killed process 1234
#         (python) total-vm:…"
_OOM_KILL = re.compile(r"Killed process (?P<pid>\d+) \((?P<proc>[^)]*)\)")
# A shell reporting a SIGKILLed child: "/bin/bash: line 1: 12345 Killed   python train.py";
# srun: "srun: error: node12: task 3: Killed".
_SHELL_KILLED = re.compile(r"(?:line \d+:\s+(?P<pid>\d+) Killed\b|task (?P<task>\d+): Killed\b)")
# The elastic ChildFailedError table (1.9+).
_TABLE_ENTRY = re.compile(r"^\s*\[(?P<idx>\d+)\]:\s*$")
_TABLE_FIELD = re.compile(
    r"^\s*(?P<key>time|host|rank|exitcode|error_file|traceback)\s*:\s*"
    r"(?P<value>.*?)\s*$"
)
_TABLE_RANK = re.compile(r"(?P<rank>-?\d+)(?: \(local_rank: (?P<local>-?\d+)\))?")
_TABLE_EXIT = re.compile(r"(?P<code>-?\d+)(?: \(pid: (?P<pid>\d+)\))?")
_SIGNAL_TEXT = re.compile(r"Signal (?P<num>\d+) \((?P<name>SIG[A-Z]+)\)")
# Python traceback lines.
_FRAME = re.compile(r'^\s*File "(?P<file>[^"]*)", line (?P<line>\d+)(?:, in (?P<func>.*))?')
# torch.distributed's Python API: a frame in this module is a collective (or group) call.
_C10D_MODULE = "distributed_c10d.py"
# The last line of a traceback: a (dotted) exception name, optionally ": message".
_EXCEPTION = re.compile(
    r"^(?P<type>(?:[A-Za-z_]\w*\.)*(?:[A-Za-z_]\w*(?:Error|Exception|Exit|Interrupt|Iteration|"
    r"Warning|Failure|Timeout)|Exception))(?::\s?(?P<msg>.*))?$"
)
# CUDA caching allocator messages:
#   1.x-2.0: "CUDA out of memory. Tried to allocate 2.00 GiB (GPU 0; 79.15 GiB total capacity;
#             … 1.23 GiB free; …)"
#   2.1+   : "CUDA out of memory. Tried to allocate 336.00 MiB. GPU 0 has a total capacity of
#             79.15 GiB of which 141.25 MiB is free."
_OOM_ASK = re.compile(r"Tried to allocate (?P<n>[\d.]+) (?P<u>[KMGT]i?B)")
_OOM_GPU = re.compile(r"\(GPU (?P<gpu>\d+);|GPU (?P<gpu2>\d*) ?has a total capacity")
_OOM_CAP = re.compile(
    r"(?P<n>[\d.]+) (?P<u>[KMGT]i?B) total capacity|total capacity of "
    r"(?P<n2>[\d.]+) (?P<u2>[KMGT]i?B)"
)
_OOM_FREE = re.compile(r"(?P<n>[\d.]+) (?P<u>[KMGT]i?B) (?:is )?free")
_UNITS = {
    "B": 1,
    "KB": 1 << 10,
    "KiB": 1 << 10,
    "MB": 1 << 20,
    "MiB": 1 << 20,
    "GB": 1 << 30,
    "GiB": 1 << 30,
    "TB": 1 << 40,
    "TiB": 1 << 40,
}
# "RuntimeError: CUDA error: an illegal memory access was encountered" (1.x+),
# "CUDA error: uncorrectable ECC error encountered", "CUDA error: unspecified launch failure".
_CUDA_ERROR = re.compile(r"CUDA error: (?P<what>[^\n.]*)")
# PyTorch <= 1.4 (THC's THCudaCheck): "cuda runtime error (39) : uncorrectable ECC error
# encountered at /pytorch/aten/src/THC/THCCachingHostAllocator.cpp:265".
_THC_ERROR = re.compile(r"cuda runtime error \(\d+\) : (?P<what>.*?)(?: at \S+:\d+)?\s*$")
_HARDWARE_CUDA = ("ecc error", "uncorrectable", "gpu is lost", "fallen off")
# Rendezvous / store failures: DistStoreError (2.0+), RendezvousTimeoutError and friends (1.9+),
# DistNetworkError (2.0+), "Socket Timeout" from TCPStore.
_RDZV_TYPES = ("DistStoreError", "Rendezvous", "DistNetworkError")

# A line without any of these cannot be one of ours (the NCCL INFO lines that reach every parser).
_WORDS = (
    _ROOT_CAUSE,
    "exits with return code",
    "exitcode",
    "closing signal",
    "Traceback",
    "Killed",
    "Error",
    "CUDA error",
    "CUDA out of memory",
)

MAX_TRACEBACK_LINES = 400
MAX_TABLE_LINES = 200


def _worker_exit(ctx: dict, code: int, **fields) -> WorkerFailed:
    """A worker's exit as a launcher reports it; a negative code is the signal that ended it."""
    return WorkerFailed(**ctx, exitcode=code, signal=signal_name(code), **fields)


def _bytes(number: str | None, unit: str | None) -> int | None:
    if number is None or unit is None:
        return None
    try:
        return int(float(number) * _UNITS[unit])
    except (ValueError, KeyError):
        return None


@dataclass
class _Traceback:
    start: int
    location: str = ""
    lines: int = 0
    call: str = ""  # the innermost frame's function when it is in torch.distributed's API
    last: Line | None = None


@dataclass
class _Table:
    start: int
    lines: int = 0
    section: str = ""  # "failures" or "root"
    record: dict[str, str] = field(default_factory=dict)
    record_line: Line | None = None


class LauncherParser:
    """Stateful for two multi-line shapes: a traceback being followed to its last line (one
    per output stream, so interleaved ranks do not mix) and the elastic failure table."""

    triggers = TRIGGERS

    def __init__(self) -> None:
        self._tracebacks: dict[tuple[int | None, int | None], _Traceback] = {}
        self._table: _Table | None = None

    def feed(self, line: Line, pre: Prefix, follow) -> list[Event]:
        text = pre.rest
        if self._table is not None:
            return self._table_line(line, text, follow)
        stream = (pre.rank, pre.local_rank)
        tb = self._tracebacks.get(stream)
        if tb is not None:
            out = self._traceback_line(line, pre, text, tb, stream, follow)
            if out is not None:
                return out
        if not any(word in text for word in _WORDS):
            return []
        if text.strip().startswith(_ROOT_CAUSE):
            # The elastic table pasted from its root-cause entry on, without the
            # ChildFailedError line above it.
            self._table = _Table(line.number, section="root")
            follow(1)
            return []
        if "Traceback (most recent call last)" in text:
            if len(self._tracebacks) < 1024:
                self._tracebacks[stream] = _Traceback(line.number)
                follow(1)
            return []
        return self._single(line, pre, text, follow)

    def flush(self) -> list[Event]:
        out = self._end_table() if self._table is not None else []
        out += [
            TracebackCut(
                line=tb.last.number,
                text=tb.last.text,
                rank=stream[0],
                location=tb.location,
                call=tb.call,
            )
            for stream, tb in self._tracebacks.items()
            if tb.call and tb.last is not None
        ]
        self._tracebacks.clear()
        return out

    # -- one-line shapes ------------------------------------------------------------------------

    def _single(
        self,
        line: Line,
        pre: Prefix,
        text: str,
        follow,
        location: str = "",
        tb_line: int | None = None,
    ) -> list[Event]:
        ctx = {"line": line.number, "text": line.text, "rank": pre.rank}
        out: list[Event] = []
        if "exitcode" in text and (m := _WORKER_FAILED.search(text)):
            local, pid = int(m.group("local")), int(m.group("pid"))
            return [_worker_exit(ctx, int(m.group("code")), local_rank=local, pid=pid)]
        if "exits with return code" in text and (m := _DS_EXIT.search(text)):
            # The srun/launcher prefix of a node's launcher is no rank of the job.
            return [_worker_exit({**ctx, "rank": None}, int(m.group("code")))]
        if "closing signal" in text:
            m = _CLOSING.search(text)
            if m:
                return [AgentSignal(**ctx, pid=int(m.group("pid")), signal=m.group("sig"))]
        if "Killed" in text:
            m = _OOM_KILL.search(text)
            if m:
                return [
                    HostOomKill(
                        **ctx,
                        pid=int(m.group("pid")),
                        process=m.group("proc"),
                        cgroup="cgroup" in text,
                    )
                ]
            m = _SHELL_KILLED.search(text)
            if m:
                task = m.group("task")
                return [
                    WorkerFailed(
                        line=line.number,
                        text=line.text,
                        rank=int(task) if task is not None else pre.rank,
                        pid=int(m.group("pid")) if m.group("pid") else None,
                        exitcode=-9,
                        signal="SIGKILL",
                    )
                ]
        stripped = text.strip()
        m = _EXCEPTION.match(stripped) if ("Error" in text or location) else None
        if m is None and "Error" in text:
            # "what():  CUDA error: …", "[ERROR] … DistStoreError: …": not at the line start.
            m = _EXCEPTION.match(stripped.split("  ")[-1].strip()) if "  " in stripped else None
        if m is not None:
            exc_type, message = m.group("type"), (m.group("msg") or "").strip()
            out.append(
                PythonException(
                    **ctx,
                    exc_type=exc_type,
                    message=message[:500],
                    location=location,
                    traceback_line=tb_line,
                )
            )
            if exc_type.endswith("ChildFailedError"):
                self._table = _Table(line.number)
                follow(1)
        out.extend(self._details(ctx, text))
        return out

    def _details(self, ctx: dict, text: str) -> list[Event]:
        """What an error line says beyond its exception type."""
        out: list[Event] = []
        # A warning that quotes an OOM it recovered from (FSDP's "Failed to clone() tensor …
        # Error: CUDA out of memory") is not the rank running out of memory.
        if "out of memory" in text and "CUDA" in text and "Warning:" not in text:
            ask = _OOM_ASK.search(text)
            gpu = _OOM_GPU.search(text)
            cap = _OOM_CAP.search(text)
            free = _OOM_FREE.search(text)
            gpu_no = (gpu.group("gpu") or gpu.group("gpu2")) if gpu else None
            out.append(
                CudaOom(
                    **ctx,
                    gpu=int(gpu_no) if gpu_no else None,
                    requested_bytes=_bytes(*ask.group("n", "u")) if ask else None,
                    capacity_bytes=(
                        _bytes(cap.group("n") or cap.group("n2"), cap.group("u") or cap.group("u2"))
                        if cap
                        else None
                    ),
                    free_bytes=_bytes(*free.group("n", "u")) if free else None,
                )
            )
        elif "CUDA error:" in text or "cuda runtime error (" in text:
            m = _CUDA_ERROR.search(text) or _THC_ERROR.search(text)
            if m:
                what = m.group("what").strip().lower()
                out.append(
                    CudaError(
                        **ctx,
                        error=what[:200],
                        hardware=any(word in what for word in _HARDWARE_CUDA),
                    )
                )
        if any(name in text for name in _RDZV_TYPES) or (
            "Socket Timeout" in text and "Error" in text
        ):
            m = re.search(
                r"(?P<type>[\w.]*(?:DistStoreError|Rendezvous\w*Error|"
                r"DistNetworkError|RendezvousClosedError))(?::\s*(?P<msg>.*))?",
                text,
            )
            if m:
                out.append(
                    RendezvousError(
                        **ctx,
                        error_type=m.group("type").rsplit(".", 1)[-1],
                        message=(m.group("msg") or "").strip()[:300],
                    )
                )
        return out

    # -- tracebacks -----------------------------------------------------------------------------

    def _traceback_line(
        self, line: Line, pre: Prefix, text: str, tb: _Traceback, stream, follow
    ) -> list[Event] | None:
        """Consume one line of a followed traceback; None when the line is not part of it."""
        tb.lines += 1
        if tb.lines > MAX_TRACEBACK_LINES:
            del self._tracebacks[stream]
            return None
        m = _FRAME.match(text)
        if m:
            # Indented as Python prints it, or flush left where a paste lost the indentation.
            where = m.group("file").rsplit("/", 1)[-1]
            func = (m.group("func") or "").strip()
            tb.location = f"{where}:{m.group('line')}" + (f" in {func}" if func else "")
            tb.call = func if where == _C10D_MODULE else ""
            tb.last = line
            follow(1)
            return []
        if not text.strip() or text[:1] in " \t":
            follow(1)
            return []
        if text.startswith("Traceback (most recent call last)"):
            follow(1)
            return []
        m = _EXCEPTION.match(text.strip())
        if m is None:
            # Another process's line between two of ours (no prefix to tell them apart).
            follow(1)
            return None
        del self._tracebacks[stream]
        return self._single(line, pre, text, follow, location=tb.location or "?", tb_line=tb.start)

    # -- the elastic failure table --------------------------------------------------------------

    def _table_line(self, line: Line, text: str, follow) -> list[Event]:
        table = self._table
        assert table is not None
        table.lines += 1
        stripped = text.strip()
        out: list[Event] = []
        if table.lines > MAX_TABLE_LINES:
            return self._end_table()
        if stripped.startswith("=") and table.section:
            return self._end_table()
        follow(1)
        if stripped.startswith("Root Cause"):
            out.extend(self._end_record())
            table.section = "root"
        elif stripped.startswith("Failures:"):
            out.extend(self._end_record())
            table.section = "failures"
        elif _TABLE_ENTRY.match(text):
            out.extend(self._end_record())
            table.record_line = line
        else:
            m = _TABLE_FIELD.match(text)
            if m and table.record_line is not None and m.group("key") not in table.record:
                table.record[m.group("key")] = m.group("value")
        return out

    def _end_record(self) -> list[Event]:
        table = self._table
        if table is None or table.record_line is None or not table.record:
            return []
        record, head = table.record, table.record_line
        table.record, table.record_line = {}, None
        rank = local = code = pid = None
        m = _TABLE_RANK.match(record.get("rank", ""))
        if m:
            rank = int(m.group("rank"))
            local = int(m.group("local")) if m.group("local") else None
        m = _TABLE_EXIT.match(record.get("exitcode", ""))
        if m:
            code = int(m.group("code"))
            pid = int(m.group("pid")) if m.group("pid") else None
        tb = record.get("traceback", "")
        sig = _SIGNAL_TEXT.search(tb)
        text = "; ".join(f"{k}: {v}" for k, v in record.items())
        return [
            FailureRecord(
                line=head.number,
                text=text[:2000],
                rank=rank,
                root_cause=table.section == "root",
                host=record.get("host", ""),
                local_rank=local,
                exitcode=code,
                pid=pid,
                signal=sig.group("name") if sig else signal_name(code),
                error_file=record.get("error_file", ""),
                traceback=tb[:300],
                time=record.get("time", ""),
            )
        ]

    def _end_table(self) -> list[Event]:
        out = self._end_record()
        self._table = None
        return out
