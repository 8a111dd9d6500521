"""PyTorch Flight Recorder dumps (format versions 2.3 to 2.10, pickle or JSON, one per rank).

A dump is untrusted input: pickles are read with ``SafeUnpickler``, which builds plain
containers and scalars only and refuses every global, so a crafted pickle cannot run code.

A rank's dump holds up to ``TORCH_FR_BUFFER_SIZE`` entries; the cross-rank answer needs only each
process group's *frontier* (last enqueued / started / completed seq) and the entries near it. So
one dump becomes one ``FrFrontier`` event per process group plus ``FrCollective`` events for the
last ``KEEP_PER_PG`` entries of each group: a few KB per rank whatever the buffer size, and the
analysis (``analysis.classify.crossrank``) works on the events of separately parsed files.
"""

from __future__ import annotations

import gzip
import io
import json
import pickle
import re
from collections import deque
from dataclasses import dataclass
from pathlib import PurePath
from typing import Any, BinaryIO, ClassVar

from .artifact import register_kind
from .events import Event, register
from .log import LogParse, ParseIssue

# Entries kept per process group and rank, counted back from the newest: enough to see the
# collective a group is stuck in, the ones just before it on every rank and a desync that started
# a few collectives earlier.
KEEP_PER_PG = 16
# Frames are kept for the newest entries only; they are what an engineer reads first.
FRAMES_PER_PG = 3
MAX_FRAMES = 12
MAX_DUMP_BYTES = 1 << 30
SUPPORTED_VERSIONS = ((2, 3), (2, 10))


@dataclass(frozen=True, slots=True, kw_only=True)
class FrFrontier(Event):
    """Where one rank had got to in one process group when it dumped."""

    kind: ClassVar[str] = "fr_frontier"
    pg: str = ""  # process group name ("0", or a hash for groups made by split/new_group)
    pg_desc: str = ""  # "default_pg", "TP", …
    members: str = ""  # global ranks of the group, compact: "0-7", "0,2,4"
    pg_size: int | None = None
    last_enqueued: int | None = None
    last_started: int | None = None
    last_completed: int | None = None
    first_seq: int | None = None  # oldest collective seq still in the ring buffer
    entries: int = 0  # entries of this group in the buffer
    tracks_state: bool = True  # False for backends that never mark work started (gloo)
    version: str = ""
    backend: str = ""
    timeout_ms: int | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class FrCollective(Event):
    """One Flight Recorder entry near a group's frontier; ``line`` is its index in the dump."""

    kind: ClassVar[str] = "fr_collective"
    pg: str = ""
    pg_desc: str = ""
    seq: int | None = None  # collective_seq_id (seq_id before 2.3)
    p2p_seq: int | None = None
    record_id: int | None = None
    op: str = ""  # "all_reduce", "send 0->1", "coalesced"
    backend: str = ""  # "nccl", "gloo"
    is_p2p: bool = False
    input_sizes: str = ""  # JSON, compact: "[[1024,1024]]"
    output_sizes: str = ""
    input_dtypes: tuple[str, ...] = ()
    output_dtypes: tuple[str, ...] = ()
    state: str = ""  # "scheduled", "started", "completed"
    frames: tuple[str, ...] = ()  # innermost first: "train.py:120 in step"
    time_created_ns: int | None = None


register(FrFrontier)
register(FrCollective)


class UnsafeDump(ValueError):
    """The dump is a pickle that asks to import or call something: refused, nothing ran."""


class SafeUnpickler(pickle.Unpickler):
    """Builds dicts, lists, tuples, sets, strings, bytes, numbers, bools and None; nothing else.

    Every way a pickle can run code (``GLOBAL``/``STACK_GLOBAL`` then ``REDUCE``, ``INST``,
    ``OBJ``, ``NEWOBJ``, ``BUILD`` on a class) first has to look a global up through
    ``find_class``, and persistent ids go through ``persistent_load``: both refuse.
    """

    def find_class(self, module: str, name: str) -> Any:
        raise UnsafeDump(
            f"refused: the pickle asks for the global {module}.{name} (a Flight Recorder dump "
            "holds plain containers only; this file is not one, or was crafted)"
        )

    def persistent_load(self, pid: Any) -> Any:
        raise UnsafeDump("refused: the pickle uses persistent ids (not a Flight Recorder dump)")


def _read_all(stream: BinaryIO) -> bytes:
    raw = stream.read(MAX_DUMP_BYTES + 1)
    if raw[:2] == b"\x1f\x8b":
        with gzip.GzipFile(fileobj=io.BytesIO(raw)) as inflated:
            raw = inflated.read(MAX_DUMP_BYTES + 1)
    if len(raw) > MAX_DUMP_BYTES:
        raise ValueError(f"dump larger than {MAX_DUMP_BYTES} bytes")
    return raw


def load_dump(stream: BinaryIO | bytes) -> dict[str, Any]:
    """The dump as plain Python data. Raises ``UnsafeDump`` for a pickle that would run code
    and ``ValueError`` for anything that is not a dump (truncated, garbage)."""
    if isinstance(stream, bytes | bytearray):
        stream = io.BytesIO(stream)
    raw = _read_all(stream)
    if raw[:1] == b"\x80":
        try:
            dump = SafeUnpickler(io.BytesIO(raw)).load()
        except UnsafeDump:
            raise
        except Exception as exc:  # truncated or corrupt pickles raise many types
            raise ValueError(f"unreadable pickle: {type(exc).__name__}: {exc}") from None
    else:
        try:
            dump = json.loads(raw)
        except (ValueError, UnicodeDecodeError) as exc:
            raise ValueError(f"neither a pickle nor JSON: {exc}") from None
    if not isinstance(dump, dict) or not isinstance(dump.get("entries", []), list):
        raise ValueError("not a Flight Recorder dump (no 'entries' list)")
    return dump


# A rank in a file name: nccl_trace_rank_3, fr-rank3.json, host12_rank-7.pkl (any era of
# TORCH_FR_DUMP_FILE/TORCH_NCCL_DEBUG_INFO_TEMP_FILE); else fr_trace's convention, the digits at
# the end of the name (prefix + rank, e.g. "dump_12" or a per-host directory of "trace0").
_RANK_NAMED = re.compile(r"(?:^|[^a-z])rank[_-]?(\d{1,6})(?!\d)", re.IGNORECASE)
_TRAILING = re.compile(r"(\d{1,6})$")
_SUFFIXES = (".gz", ".json", ".pkl", ".pickle", ".bin", ".dump", ".txt")


def rank_from_name(source: str) -> int | None:
    name = PurePath(source).name
    m = _RANK_NAMED.search(name)
    if m:
        return int(m.group(1))
    stem = name
    while stem.lower().endswith(_SUFFIXES):
        stem = stem[: stem.rfind(".")]
    m = _TRAILING.search(stem)
    return int(m.group(1)) if m else None


def compact_ranks(ranks: list[int]) -> str:
    """[0,1,2,3,8] -> "0-3,8": a 1024-rank group costs a few bytes per event, not 5 KB."""
    out: list[str] = []
    ranks = sorted(set(ranks))
    i = 0
    while i < len(ranks):
        j = i
        while j + 1 < len(ranks) and ranks[j + 1] == ranks[j] + 1:
            j += 1
        out.append(str(ranks[i]) if i == j else f"{ranks[i]}-{ranks[j]}")
        i = j + 1
    return ",".join(out)


def expand_ranks(text: str) -> list[int]:
    ranks: list[int] = []
    for part in text.split(","):
        if not part:
            continue
        lo, _, hi = part.partition("-")
        ranks.extend(range(int(lo), int(hi or lo) + 1))
    return ranks


def _int(value: Any) -> int | None:
    # pg_status values are ints in pickles and strings in JSON dumps (2.10).
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str) and re.fullmatch(r"-?\d{1,20}", value.strip()):
        return int(value)
    return None


def _members(value: Any) -> list[int]:
    # "ranks" is the string "[0, 1, 2]" in every version; read digits, never eval it.
    if isinstance(value, list | tuple):
        return [v for v in value if isinstance(v, int)]
    if isinstance(value, str):
        return [int(d) for d in re.findall(r"\d+", value)]
    return []


def _frame(frame: Any) -> str:
    if not isinstance(frame, dict):
        return str(frame)[:200]
    return f"{frame.get('filename', '?')}:{frame.get('line', '?')} in {frame.get('name', '?')}"[
        :300
    ]


def _version(dump: dict[str, Any]) -> tuple[str, tuple[int, int] | None]:
    text = str(dump.get("version", ""))
    m = re.fullmatch(r"(\d+)\.(\d+)", text.strip())
    return text, ((int(m.group(1)), int(m.group(2))) if m else None)


@dataclass
class _Group:
    name: str
    desc: str
    entries: int = 0
    first_seq: int | None = None
    last_seq: int | None = None
    last_started: int | None = None
    last_completed: int | None = None
    started_seen: bool = False
    backend: str = ""
    timeout_ms: int | None = None


def _seq(entry: dict[str, Any]) -> int | None:
    return _int(entry.get("collective_seq_id", entry.get("seq_id")))


def parse_flight_recorder(stream: BinaryIO | bytes, *, source: str = "") -> LogParse:
    """One rank's dump -> ``FrFrontier`` per group + ``FrCollective`` near each frontier."""
    try:
        dump = load_dump(stream)
    except UnsafeDump as exc:
        return LogParse(source=source, events=(), issues=(ParseIssue(0, str(exc)),), complete=False)
    except (ValueError, OSError, EOFError) as exc:
        return LogParse(
            source=source,
            events=(),
            issues=(ParseIssue(0, f"not a readable Flight Recorder dump: {exc}"),),
            complete=False,
        )
    issues: list[ParseIssue] = []
    version, parts = _version(dump)
    if parts is None or not (SUPPORTED_VERSIONS[0] <= parts <= SUPPORTED_VERSIONS[1]):
        issues.append(ParseIssue(0, f"Flight Recorder format version {version!r} not in 2.3-2.10"))
    rank = rank_from_name(source)
    if rank is None:
        issues.append(ParseIssue(0, "no rank in the file name; cross-rank analysis skips it"))

    pg_config = dump.get("pg_config") or {}
    if not isinstance(pg_config, dict):
        pg_config = {}
    groups: dict[str, _Group] = {}
    tails: dict[str, deque[tuple[int, dict[str, Any]]]] = {}
    for index, entry in enumerate(dump.get("entries") or ()):
        if not isinstance(entry, dict):
            issues.append(ParseIssue(index, "entry is not a mapping"))
            continue
        pg_name, pg_desc = _process_group(entry)
        group = groups.get(pg_name)
        if group is None:
            group = groups[pg_name] = _Group(pg_name, pg_desc)
            tails[pg_name] = deque(maxlen=KEEP_PER_PG)
        group.entries += 1
        seq = _seq(entry)
        is_p2p = bool(entry.get("is_p2p")) or _is_p2p_name(str(entry.get("profiling_name", "")))
        if seq is not None and not is_p2p:
            group.first_seq = seq if group.first_seq is None else min(group.first_seq, seq)
            group.last_seq = seq if group.last_seq is None else max(group.last_seq, seq)
            state = entry.get("state")
            if state in ("started", "completed"):
                group.started_seen = True
                group.last_started = max(group.last_started or 0, seq)
            if state == "completed":
                group.last_completed = max(group.last_completed or 0, seq)
        group.backend = group.backend or str(entry.get("profiling_name", "")).partition(":")[0]
        group.timeout_ms = _int(entry.get("timeout_ms")) or group.timeout_ms
        tails[pg_name].append((index, entry))

    status = dump.get("pg_status") if isinstance(dump.get("pg_status"), dict) else {}
    events: list[Event] = []
    for pg_name, group in groups.items():
        members = _group_members(pg_config, pg_name, group.desc)
        pg_status = status.get(pg_name)
        if not isinstance(pg_status, dict) and len(groups) == 1 and len(status) == 1:
            pg_status = next(iter(status.values()))
        pg_status = pg_status if isinstance(pg_status, dict) else {}
        enq = _int(pg_status.get("last_enqueued_collective"))
        started = _int(pg_status.get("last_started_collective"))
        completed = _int(pg_status.get("last_completed_collective"))
        # gloo work never reaches "started" in the recorder, and its pg_status says -1 started
        # with completed tracking enqueued: only the enqueued counter means anything there.
        tracks_state = group.started_seen or (started is not None and started >= 0)
        if enq is None:
            enq = group.last_seq
        if started is None or started < 0:
            started = group.last_started if tracks_state else None
        if completed is None or not tracks_state:
            completed = group.last_completed if tracks_state else None
        text = (
            f"rank {rank} pg {pg_name} ({group.desc}): last enqueued {enq}, started {started}, "
            f"completed {completed}; {group.entries} entries from seq {group.first_seq}"
        )
        events.append(
            FrFrontier(
                line=0,
                text=text,
                rank=rank,
                source=source,
                pg=pg_name,
                pg_desc=group.desc,
                members=compact_ranks(members),
                pg_size=len(members) or None,
                last_enqueued=enq,
                last_started=started,
                last_completed=completed,
                first_seq=group.first_seq,
                entries=group.entries,
                tracks_state=tracks_state,
                version=version[:20],
                backend=group.backend[:20],
                timeout_ms=group.timeout_ms,
            )
        )
        tail = list(tails[pg_name])
        for position, (index, entry) in enumerate(tail):
            keep_frames = position >= len(tail) - FRAMES_PER_PG
            events.append(_collective(entry, index, rank, source, keep_frames))
    return LogParse(
        source=source,
        events=tuple(events),
        issues=tuple(issues),
        lines=len(dump.get("entries") or ()),
    )


def _is_p2p_name(profiling_name: str) -> bool:
    op = profiling_name.partition(":")[2]
    return op.startswith(("send", "recv"))


def _process_group(entry: dict[str, Any]) -> tuple[str, str]:
    pg = entry.get("process_group")
    if isinstance(pg, list | tuple) and pg:
        return str(pg[0])[:200], str(pg[1] if len(pg) > 1 else "")[:200]
    return str(entry.get("pg_id", ""))[:200], ""


def _group_members(pg_config: dict[str, Any], pg_name: str, desc: str) -> list[int]:
    config = pg_config.get(pg_name)
    if isinstance(config, dict):
        return _members(config.get("ranks"))
    # gloo (2.10) registers its groups under an empty name; with one group, or for the default
    # group, the widest membership is the right one.
    configs = [c for c in pg_config.values() if isinstance(c, dict)]
    named = [c for c in configs if c.get("desc") == desc and desc]
    if named:
        return _members(named[0].get("ranks"))
    if len(configs) == 1 or desc == "default_pg":
        return max((_members(c.get("ranks")) for c in configs), key=len, default=[])
    return []


# torch.distributed's own wrappers and the process launcher say nothing about the job's code.
_PLUMBING = re.compile(r"/torch/distributed/|/torch/multiprocessing/|/multiprocessing/|^<string>")


def _user_frames(frames: list[Any]) -> tuple[str, ...]:
    dicts = [f for f in frames if isinstance(f, dict)]
    user = [f for f in dicts if not _PLUMBING.search(str(f.get("filename", "")))]
    return tuple(_frame(f) for f in (user or dicts)[:MAX_FRAMES])


def _sizes(value: Any) -> str:
    try:
        return json.dumps(value, separators=(",", ":"))[:300]
    except (TypeError, ValueError):
        return str(value)[:300]


def _collective(
    entry: dict[str, Any], index: int, rank: int | None, source: str, keep_frames: bool
) -> FrCollective:
    pg_name, pg_desc = _process_group(entry)
    backend, _, op = str(entry.get("profiling_name", "")).partition(":")
    if not op:
        backend, op = "", backend
    seq = _seq(entry)
    state = str(entry.get("state", ""))[:20]
    frames = entry.get("frames") if keep_frames else None
    frames = _user_frames(frames) if isinstance(frames, list) else ()
    in_sizes, out_sizes = _sizes(entry.get("input_sizes")), _sizes(entry.get("output_sizes"))
    in_dtypes = tuple(str(d)[:20] for d in (entry.get("input_dtypes") or ())[:8])
    out_dtypes = tuple(str(d)[:20] for d in (entry.get("output_dtypes") or ())[:8])
    text = (
        f"rank {rank} pg {pg_name} seq {seq}: {backend}:{op} in={in_sizes} {'/'.join(in_dtypes)} "
        f"out={out_sizes} state={state}"
    )
    return FrCollective(
        line=index,
        text=text[:500],
        rank=rank,
        source=source,
        pg=pg_name,
        pg_desc=pg_desc,
        seq=seq,
        p2p_seq=_int(entry.get("p2p_seq_id")),
        record_id=_int(entry.get("record_id")),
        op=op[:80],
        backend=backend[:20],
        is_p2p=bool(entry.get("is_p2p")) or _is_p2p_name(str(entry.get("profiling_name", ""))),
        input_sizes=in_sizes,
        output_sizes=out_sizes,
        input_dtypes=in_dtypes,
        output_dtypes=out_dtypes,
        state=state,
        frames=frames,
        time_created_ns=_int(entry.get("time_created_ns")),
    )


register_kind("fr_dump", parse_flight_recorder)

__all__ = [
    "FrCollective",
    "FrFrontier",
    "SafeUnpickler",
    "UnsafeDump",
    "compact_ranks",
    "expand_ranks",
    "load_dump",
    "parse_flight_recorder",
    "rank_from_name",
]
