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

import gc
import gzip
import io
import json
import pickle
import re
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, fields, replace
from functools import lru_cache
from itertools import chain, compress, repeat
from operator import itemgetter
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
# What a dump may cost to read. PyTorch keeps TORCH_FR_BUFFER_SIZE entries (2,000 by default;
# the integration sets 2,000): a real dump is about 0.5 KB of JSON per entry (1 MB at the
# default; a 2.10-format gloo dump of 309 entries is 145 KB), each entry a handful of containers
# plus one per stack frame. 64 MiB and 2 M containers leave room for buffers past 20,000 entries
# with deep stacks. Past them the dump is refused before it is decoded: 16 M empty dicts are a
# 16 KB gzip and 1.4 GB of objects, and a JSON list of them took 22 s and 1.3 GB here.
MAX_DUMP_BYTES = 64 << 20
MAX_CONTAINERS = 2_000_000
# Bytes that open a container: JSON's { and [; pickle's EMPTY_DICT, EMPTY_LIST, EMPTY_TUPLE, MARK
# (before LIST, DICT, TUPLE), TUPLE1-3, EMPTY_SET, FROZENSET. Counted over the whole dump, string
# bytes included, so the count is an upper bound on the containers decoding would make.
_JSON_OPENERS = (b"{", b"[")
_PICKLE_OPENERS = (b"}", b"]", b")", b"(", b"\x85", b"\x86", b"\x87", b"\x8f", b"\x91")
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
    timeout_ms: int | None = None  # the collective's own timeout (entries carry it since 2.5)


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
        # In 1 MiB steps: a read of the whole bound at once allocates the whole bound.
        parts, held = [], 0
        with gzip.GzipFile(fileobj=io.BytesIO(raw)) as inflated:
            while held <= MAX_DUMP_BYTES:
                part = inflated.read(1 << 20)
                if not part:
                    break
                parts.append(part)
                held += len(part)
        raw = b"".join(parts)
        del parts
    if len(raw) > MAX_DUMP_BYTES:
        raise ValueError(
            f"dump larger than {MAX_DUMP_BYTES >> 20} MiB (inflated): no Flight Recorder buffer "
            "is that large; refused before decoding"
        )
    openers = _PICKLE_OPENERS if raw[:1] == b"\x80" else _JSON_OPENERS
    containers = sum(raw.count(opener) for opener in openers)
    if containers > MAX_CONTAINERS:
        raise ValueError(
            f"dump would build up to {containers:,} containers (limit {MAX_CONTAINERS:,}): no "
            "Flight Recorder buffer holds that many entries; refused before decoding"
        )
    return raw


def load_dump(stream: BinaryIO | bytes) -> dict[str, Any]:
    """The dump as plain Python data. Raises ``UnsafeDump`` for a pickle that would run code
    and ``ValueError`` for anything that is not a dump (truncated, garbage)."""
    if isinstance(stream, bytes | bytearray):
        stream = io.BytesIO(stream)
    raw = _read_all(stream)
    with _gc_paused():
        dump = _decode(raw)
    if not isinstance(dump, dict) or not isinstance(dump.get("entries", []), list):
        raise ValueError("not a Flight Recorder dump (no 'entries' list)")
    return dump


@contextmanager
def _gc_paused() -> Iterator[None]:
    """A 2,000-entry dump is ~100k new containers: with the collector on, loading one sets off
    dozens of collections that walk every object alive, a quarter of the parse time. Plain
    data from one dump is freed by reference counting when the parse drops it; any cycle a
    crafted pickle made is collected once the collector is back on."""
    collecting = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if collecting:
            gc.enable()


def _decode(raw: bytes) -> Any:
    if raw[:1] == b"\x80":
        try:
            return SafeUnpickler(io.BytesIO(raw)).load()
        except UnsafeDump:
            raise
        except Exception as exc:  # truncated or corrupt pickles raise many types
            raise ValueError(f"unreadable pickle: {type(exc).__name__}: {exc}") from None
    try:
        return json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ValueError(f"neither a pickle nor JSON: {exc}") from None
    except RecursionError:
        raise ValueError("JSON nested too deeply for a Flight Recorder dump") from None


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
        return value if _INT64[0] <= value <= _INT64[1] else None
    if isinstance(value, str) and re.fullmatch(r"-?\d{1,19}", value.strip()):
        number = int(value)
        return number if _INT64[0] <= number <= _INT64[1] else None
    return None


# Seqs, ids and times are 64-bit in every writer; anything wider was crafted.
_INT64 = (-(2**63), 2**63 - 1)


# No job has more ranks than this (the upload API's bound too); a larger number in a group's
# "ranks" is not a rank, and would make "0-99999999999" a range no one can expand.
MAX_RANK = 10_000_000


def _members(value: Any) -> list[int]:
    # "ranks" is the string "[0, 1, 2]" in every version; read digits, never eval it.
    if isinstance(value, list | tuple):
        return [v for v in value if type(v) is int and 0 <= v <= MAX_RANK]
    if isinstance(value, str):
        return list(_members_text(value[:1_000_000]))
    return []


# Every rank's dump repeats the same group configs: a 1,024-rank group's "ranks" string is read
# once per job, not once per dump.
@lru_cache(maxsize=256)
def _members_text(text: str) -> tuple[int, ...]:
    # At most 8 digits: a longer run is no rank, and int() of 5,000 digits raises.
    return tuple(
        rank for rank in map(int, re.findall(r"(?<!\d)\d{1,8}(?!\d)", text)) if rank <= MAX_RANK
    )


_SCALARS = (str, int, float, bool, type(None))


def _text(value: Any, limit: int) -> str:
    """A dump's value as bounded text. A scalar is itself; a container is rendered by
    ``_render``, never by ``str()``, which walks the whole of it: a pickle can name one list
    many times over (its memo), so 40 small opcodes can be a structure of 2**40 leaves."""
    if isinstance(value, str):
        return value[:limit]
    if isinstance(value, _SCALARS):
        return _scalar(value)[:limit]
    return _render(value, limit)


def _scalar(value: Any) -> str:
    # A pickle's int may have any number of digits; str() refuses past 4,300 of them.
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 64:
        return f"<{value.bit_length()}-bit int>"
    return json.dumps(value) if isinstance(value, bool | type(None)) else str(value)


def _render(value: Any, limit: int) -> str:
    """Compact JSON-like text of ``value``, cut at ``limit`` characters: the walk stops there,
    whatever the size or depth of the structure (shared references included)."""
    out: list[str] = []
    size = 0
    # A stack of what is left to write: values, and the literal text between them.
    stack: list[tuple[bool, Any]] = [(False, value)]
    while stack and size < limit:
        literal, item = stack.pop()
        if literal:
            piece = item
        elif isinstance(item, str):
            # Quoted, not escaped: this is text to read, and storing it makes it safe.
            piece = f'"{item[:limit]}"'
        elif isinstance(item, _SCALARS):
            piece = _scalar(item)
        elif isinstance(item, list | tuple | set | frozenset):
            # Only as many items as could still show: the rest would be cut anyway.
            items = list(item)[: limit - size]
            todo: list[tuple[bool, Any]] = [(True, "[")]
            for n, element in enumerate(items):
                todo += [(True, ",")] if n else []
                todo.append((False, element))
            todo.append((True, "]"))
            stack.extend(reversed(todo))
            continue
        elif isinstance(item, dict):
            pairs = list(item.items())[: limit - size]
            todo = [(True, "{")]
            for n, (key, element) in enumerate(pairs):
                todo += [(True, ",")] if n else []
                todo += [(False, key), (True, ":"), (False, element)]
            todo.append((True, "}"))
            stack.extend(reversed(todo))
            continue
        else:
            piece = type(item).__name__
        out.append(piece)
        size += len(piece)
    return "".join(out)[:limit]


def _items(value: Any, limit: int) -> list[Any]:
    """The first items of a list or tuple; anything else (an object, a string) as none."""
    return list(value[:limit]) if isinstance(value, list | tuple) else []


@lru_cache(maxsize=256)
def _compact_members(members: tuple[int, ...]) -> str:
    return compact_ranks(list(members))


def _frame(frame: Any) -> str:
    if not isinstance(frame, dict):
        return _text(frame, 200)
    where = [_text(frame.get(key, "?"), 200) for key in ("filename", "line", "name")]
    return f"{where[0]}:{where[1]} in {where[2]}"[:300]


def _version(dump: dict[str, Any]) -> tuple[str, tuple[int, int] | None]:
    text = _text(dump.get("version", ""), 40)
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
    tail: list[tuple[int, dict[str, Any]]] = field(default_factory=list)  # (index, entry)


def _seq(entry: dict[str, Any]) -> int | None:
    return _int(entry.get("collective_seq_id", entry.get("seq_id")))


class _Irregular(Exception):
    """The fast scan met something it does not handle; the entry-by-entry scan does."""


def _scan_fast(entries: list[Any]) -> dict[str, _Group]:
    """Every group's frontier and tail in a few C-level passes over each group's entries.

    This is the shape every torch version writes: each entry a dict with a ``process_group``
    pair, an int ``collective_seq_id``, hashable names and states. Anything else raises
    ``_Irregular`` and the dump goes through ``_scan_entries``, which reads entry by entry and
    reports what it could not use; the two agree on regular dumps (tested).
    """
    try:
        pgs = list(map(_PROCESS_GROUP, entries))
    except (KeyError, TypeError) as exc:
        raise _Irregular from exc
    if not pgs:
        return {}
    # Groups are compared and hashed below: only pairs of strings, whose cost is their length
    # (a crafted pair of nested lists would cost whatever its shared references expand to).
    if not set(map(type, pgs)) <= {list, tuple} or not set(map(type, chain.from_iterable(pgs))) <= {
        str
    }:
        raise _Irregular
    buckets: dict[Any, tuple[list[dict[str, Any]], list[int] | None]] = {}
    if pgs.count(pgs[0]) == len(pgs):
        # One group, the common case: no partition, indices are positions.
        buckets[0] = (entries, None)
    else:
        prev: Any = _Irregular  # a value no entry holds
        bucket: list[dict[str, Any]] = []
        where: list[int] = []
        try:
            for index, (pg, entry) in enumerate(zip(pgs, entries, strict=True)):
                if pg is not prev and pg != prev:
                    key = pg if pg.__class__ is tuple else tuple(pg)
                    if key not in buckets:
                        buckets[key] = ([], [])
                    bucket, where = buckets[key]  # type: ignore[assignment]
                    prev = pg
                bucket.append(entry)
                where.append(index)
        except TypeError as exc:  # an unhashable group
            raise _Irregular from exc
    groups: dict[str, _Group] = {}
    for rows, indices in buckets.values():
        if not isinstance(rows[0], dict):
            raise _Irregular
        name, desc = _process_group(rows[0])
        if name in groups or not isinstance(rows[0].get("process_group"), list | tuple):
            raise _Irregular  # two spellings of one group: keep the entry order right
        groups[name] = _summarize_rows(name, desc, rows, indices)
    return groups


_PROCESS_GROUP = itemgetter("process_group")
_STARTED_SET = frozenset(("started", "completed"))
_COMPLETED_SET = frozenset(("completed",))


def _column(rows: list[dict[str, Any]], key: str) -> list[Any]:
    # dict.get mapped over the rows: one C call per row, no Python frame.
    return list(map(dict.get, rows, repeat(key)))


def _summarize_rows(name: str, desc: str, rows: list[dict], indices: list[int] | None) -> _Group:
    try:
        seqs = _column(rows, "collective_seq_id")
        if set(map(type, seqs)) != {int}:
            raise _Irregular  # seq_id (before 2.3), string seqs, missing seqs
        names = _column(rows, "profiling_name")
        flags = _column(rows, "is_p2p")
        states = _column(rows, "state")
        # Hashed and compared below: strings only (see the groups in _scan_fast).
        if not set(map(type, names)) | set(map(type, states)) <= {str, type(None)}:
            raise _Irregular
        if not set(map(type, flags)) <= {bool, int, type(None)}:
            raise _Irregular
        p2p_names = {n for n in set(names) if n and _is_p2p_name(n)}
        if p2p_names or any(flags):
            keep = [not flag and n not in p2p_names for flag, n in zip(flags, names, strict=True)]
            seqs = list(compress(seqs, keep))
            states = list(compress(states, keep))
        started = list(compress(seqs, map(_STARTED_SET.__contains__, states)))
        completed = list(compress(seqs, map(_COMPLETED_SET.__contains__, states)))
    except TypeError as exc:  # a row that is not a dict, an unhashable name or state
        raise _Irregular from exc
    group = _Group(name, desc, entries=len(rows))
    if seqs:
        group.first_seq, group.last_seq = min(seqs), max(seqs)
        if group.first_seq < _INT64[0] or group.last_seq > _INT64[1]:
            raise _Irregular
        if started:
            group.started_seen = True
            group.last_started = max(max(started), 0)
            if completed:
                group.last_completed = max(max(completed), 0)
    for n in names:
        backend = (n or "")[:80].partition(":")[0]
        if backend:
            group.backend = backend
            break
    for row in reversed(rows):
        timeout = _int(row.get("timeout_ms"))
        if timeout:
            group.timeout_ms = timeout
            break
    n = len(rows)
    where = indices[-KEEP_PER_PG:] if indices is not None else range(max(0, n - KEEP_PER_PG), n)
    group.tail = list(zip(where, rows[-KEEP_PER_PG:], strict=True))
    return group


_STARTED = ("started", "completed")


def _scan_entries(entries: list[Any], issues: list[ParseIssue]) -> dict[str, _Group]:
    """Entry by entry, for dumps the fast scan does not take: older seq keys, odd values."""
    groups: dict[str, _Group] = {}
    tails: dict[str, deque[tuple[int, dict[str, Any]]]] = {}
    for index, entry in enumerate(entries):
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
        is_p2p = _entry_is_p2p(entry)
        if seq is not None and not is_p2p:
            group.first_seq = seq if group.first_seq is None else min(group.first_seq, seq)
            group.last_seq = seq if group.last_seq is None else max(group.last_seq, seq)
            state = entry.get("state")
            if state in _STARTED:
                group.started_seen = True
                group.last_started = max(group.last_started or 0, seq)
            if state == "completed":
                group.last_completed = max(group.last_completed or 0, seq)
        if not group.backend:
            group.backend = _text(entry.get("profiling_name") or "", 80).partition(":")[0]
        group.timeout_ms = _int(entry.get("timeout_ms")) or group.timeout_ms
        tails[pg_name].append((index, entry))
    for pg_name, group in groups.items():
        group.tail = list(tails[pg_name])
    return groups


def _empty_groups(pg_config: dict[str, Any], status: dict[str, Any]) -> dict[str, _Group]:
    """A rank that recorded nothing still dumps its groups: it is at seq 0 in each of them,
    which is what tells the analysis that it never joined the others' first collective."""
    groups: dict[str, _Group] = {}
    configs = {k: c for k, c in pg_config.items() if isinstance(c, dict)}
    for key in [*configs, *(k for k in status if k not in configs)]:
        config = configs.get(key, {})
        name, desc = _text(config.get("name", key), 200), _text(config.get("desc", ""), 200)
        if not name and len(configs) == 1:
            # gloo (2.10) registers its default group under an empty name and desc.
            name, desc = "0", "default_pg"
        if name not in groups:
            groups[name] = _Group(name, desc, last_seq=0)
    return groups


# Where a dump records whose it is. torch's own writers (2.3-2.10) put no rank in the dump, but
# dumps re-saved by fr_trace's loader or by other tools carry a top-level "rank"; some writers
# also put the recording rank in the default group's pg_config entry.
_RANK_KEYS = ("rank", "global_rank")


def _dump_rank(dump: dict[str, Any], pg_config: dict[str, Any]) -> int | None:
    for key in _RANK_KEYS:
        rank = _int(dump.get(key))
        if rank is not None and rank >= 0:
            return rank
    for name, config in pg_config.items():
        if not isinstance(config, dict) or not (name == "0" or config.get("desc") == "default_pg"):
            continue
        for key in _RANK_KEYS:
            rank = _int(config.get(key))
            if rank is not None and rank >= 0:
                return rank
    return None


def parse_flight_recorder(stream: BinaryIO | bytes, *, source: str = "") -> LogParse:
    """One rank's dump -> ``FrFrontier`` per group + ``FrCollective`` near each frontier."""
    # The dump is dropped before the collector runs again: it never walks the dump's objects.
    with _gc_paused():
        parsed = _parse(stream, source)
        # The events hold strings and ints of the dump itself (group names, states, dtypes,
        # seqs): each pins a memory pool the freed dump otherwise emptied, and the next dumps
        # are built across thousands of such part-used pools. Keeping 1,024 ranks' events that
        # way cost ~5 ms of CPU per dump, as much as scanning it. So they are written out as
        # JSON (a few KB), the originals dropped, and read back as new objects.
        classes = [type(e) for e in parsed.events]
        rows = [{f.name: getattr(e, f.name) for f in fields(e)} for e in parsed.events]
        tuples = [[name for name, value in row.items() if isinstance(value, tuple)] for row in rows]
        text = json.dumps(rows)
        del rows
        parsed = replace(parsed, events=())
        events = []
        for cls, names, values in zip(classes, tuples, json.loads(text), strict=True):
            for name in names:
                values[name] = tuple(values[name])
            events.append(cls(**values))
        return replace(parsed, events=tuple(events))


def _parse(stream: BinaryIO | bytes, source: str) -> LogParse:
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
    pg_config = dump.get("pg_config") or {}
    if not isinstance(pg_config, dict):
        pg_config = {}
    # The dump's own word first; the file name is a convention that renaming breaks.
    own, named = _dump_rank(dump, pg_config), rank_from_name(source)
    rank = own if own is not None else named
    if own is not None and named is not None and own != named:
        issues.append(ParseIssue(0, f"the dump records rank {own}, its file name says {named}"))
    if rank is None:
        issues.append(
            ParseIssue(0, "no rank in the dump or its file name; cross-rank analysis skips it")
        )

    entries = dump.get("entries") or []
    try:
        groups = _scan_fast(entries)
    except _Irregular:
        groups = _scan_entries(entries, issues)
    status = dump.get("pg_status") if isinstance(dump.get("pg_status"), dict) else {}
    if not entries:
        groups = _empty_groups(pg_config, status)

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
                members=_compact_members(tuple(members)),
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
        tail = group.tail
        for position, (index, entry) in enumerate(tail):
            keep_frames = position >= len(tail) - FRAMES_PER_PG
            events.append(_collective(entry, index, rank, source, keep_frames))
    return LogParse(source=source, events=tuple(events), issues=tuple(issues), lines=len(entries))


def _is_p2p_name(profiling_name: str) -> bool:
    op = profiling_name.partition(":")[2]
    return op.startswith(("send", "recv"))


def _entry_is_p2p(entry: dict[str, Any]) -> bool:
    flag = entry.get("is_p2p")
    return (isinstance(flag, bool | int) and bool(flag)) or _is_p2p_name(
        _text(entry.get("profiling_name", ""), 80)
    )


def _process_group(entry: dict[str, Any]) -> tuple[str, str]:
    pg = entry.get("process_group")
    if isinstance(pg, list | tuple) and pg:
        return _text(pg[0], 200), _text(pg[1] if len(pg) > 1 else "", 200)
    return _text(entry.get("pg_id", ""), 200), ""


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
    user = [f for f in dicts if not _PLUMBING.search(_text(f.get("filename", ""), 300))]
    return tuple(_frame(f) for f in (user or dicts)[:MAX_FRAMES])


def _sizes(value: Any) -> str:
    return _render(value, 300)


def _collective(
    entry: dict[str, Any], index: int, rank: int | None, source: str, keep_frames: bool
) -> FrCollective:
    pg_name, pg_desc = _process_group(entry)
    backend, _, op = _text(entry.get("profiling_name", ""), 100).partition(":")
    if not op:
        backend, op = "", backend
    seq = _seq(entry)
    state = _text(entry.get("state", ""), 20)
    frames = entry.get("frames") if keep_frames else None
    frames = _user_frames(frames[:256]) if isinstance(frames, list) else ()
    in_sizes, out_sizes = _sizes(entry.get("input_sizes")), _sizes(entry.get("output_sizes"))
    in_dtypes = tuple(_text(d, 20) for d in _items(entry.get("input_dtypes"), 8))
    out_dtypes = tuple(_text(d, 20) for d in _items(entry.get("output_dtypes"), 8))
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
        is_p2p=_entry_is_p2p(entry),
        input_sizes=in_sizes,
        output_sizes=out_sizes,
        input_dtypes=in_dtypes,
        output_dtypes=out_dtypes,
        state=state,
        frames=frames,
        time_created_ns=_int(entry.get("time_created_ns")),
        timeout_ms=_int(entry.get("timeout_ms")),
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
