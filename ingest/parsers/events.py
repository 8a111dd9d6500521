"""Typed events that the parsers produce and the diagnosis core consumes.

Every event remembers where it came from (``line``, ``text``) so a verdict can cite its evidence,
and which rank printed it when the log says so. Events are plain frozen dataclasses: they cross
from the parser to the database and back (``to_row`` / ``from_row``) and into the pure core.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, ClassVar

# Evidence text is untrusted and unbounded; this is what we keep of one line.
MAX_EVENT_TEXT = 2000


@dataclass(frozen=True, slots=True, kw_only=True)
class Event:
    kind: ClassVar[str] = "event"
    line: int
    text: str
    rank: int | None = None  # global rank when the log says it
    source: str = ""  # file name or upload label the line came from

    def attrs(self) -> dict[str, Any]:
        """The kind-specific fields, for storage in a JSON column."""
        base = {f.name for f in dataclasses.fields(Event)}
        return {
            f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name not in base
        }


@dataclass(frozen=True, slots=True, kw_only=True)
class WatchdogTimeout(Event):
    """``Watchdog caught collective operation timeout: WorkNCCL(...) ran for N milliseconds``."""

    kind: ClassVar[str] = "watchdog_timeout"
    pg: str | None = None  # process group id or name as printed ("0", "37", "default_pg")
    pg_rank: int | None = None  # the rank inside that process group
    seq: int | None = None  # SeqNum; absent before PyTorch 1.9
    op: str = ""  # OpType, e.g. ALLREDUCE, _ALLGATHER_BASE, SEND, COALESCED
    numel_in: int | None = None
    numel_out: int | None = None
    timeout_ms: int | None = None
    ran_for_ms: int | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class WorkProgress(Event):
    """The process group's progress when the watchdog fired: which seq failed, what was last
    enqueued and last completed on this rank (``last completed NCCL work: 18``)."""

    kind: ClassVar[str] = "work_progress"
    pg: str | None = None
    pg_rank: int | None = None
    failed_seq: int | None = None
    last_enqueued: int | None = None
    last_started: int | None = None
    last_completed: int | None = None


EVENT_TYPES: dict[str, type[Event]] = {}


def register(cls: type[Event]) -> type[Event]:
    EVENT_TYPES[cls.kind] = cls
    return cls


for _cls in (WatchdogTimeout, WorkProgress):
    register(_cls)


def event_from_row(
    kind: str, *, line: int, text: str, rank: int | None, source: str, attrs: dict[str, Any]
) -> Event | None:
    """Rebuild an event stored by the server. Unknown kinds (from a newer parser) are skipped."""
    cls = EVENT_TYPES.get(kind)
    if cls is None:
        return None
    names = {f.name for f in dataclasses.fields(cls)}
    known = {k: v for k, v in attrs.items() if k in names}
    return cls(line=line, text=text, rank=rank, source=source, **known)


@dataclass(frozen=True, slots=True, kw_only=True)
class DumpSignal(Event):
    """A rank was told to dump debug info. ``from_rank`` None means "from this local rank";
    the line also carries this rank's progress, which is how we learn where ranks that did not
    time out themselves had got to."""

    kind: ClassVar[str] = "dump_signal"
    pg: str | None = None
    pg_rank: int | None = None
    from_rank: int | None = None
    via_store: bool = False
    last_enqueued: int | None = None
    last_completed: int | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class HeartbeatTimeout(Event):
    """The watchdog thread itself got stuck (``Heartbeat monitor timed out!``)."""

    kind: ClassVar[str] = "heartbeat_timeout"
    pg: str | None = None
    pg_rank: int | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class CollectiveStack(Event):
    """The Python frames of the failed collective (Flight Recorder enabled)."""

    kind: ClassVar[str] = "collective_stack"
    frames: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class DesyncReport(Event):
    """``TORCH_NCCL_DESYNC_DEBUG`` analysis: ranks that never joined, or that joined a
    collective but did not finish it."""

    kind: ClassVar[str] = "desync_report"
    never_joined: tuple[int, ...] = ()
    not_finished: tuple[int, ...] = ()
    seq: int | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class CollectiveMismatch(Event):
    """``TORCH_DISTRIBUTED_DEBUG=DETAIL`` found two ranks in different collectives."""

    kind: ClassVar[str] = "collective_mismatch"
    seq: int | None = None
    rank_a: int | None = None
    op_a: str = ""
    shape_a: str = ""
    rank_b: int | None = None
    op_b: str = ""
    shape_b: str = ""


for _cls in (DumpSignal, HeartbeatTimeout, CollectiveStack, DesyncReport, CollectiveMismatch):
    register(_cls)
