"""``parse_artifact``: one entry point for every kind of artifact an agent uploads.

Text logs go to ``parse_log``; Flight Recorder dumps, profiler traces and hardware stats go to
the parsers registered for their kind. Every parser returns a ``LogParse`` (events + issues), so
the CLI and the server treat all artifacts alike.
"""

from __future__ import annotations

import io
import os
import struct
import zlib
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor
from typing import BinaryIO

from .detect import SNIFF_BYTES, detect_kind, inflate_head, is_gzip
from .log import LogParse, ParseIssue, parse_log

ArtifactParser = Callable[..., LogParse]

# kind -> parser(stream, *, source) -> LogParse. Modules for dumps, traces and hardware stats
# register themselves here (see register_kind).
PARSERS: dict[str, ArtifactParser] = {"log": parse_log}


def register_kind(kind: str, parser: ArtifactParser) -> ArtifactParser:
    PARSERS[kind] = parser
    return parser


def sniff(stream: BinaryIO, filename: str = "") -> str:
    """The kind of a seekable stream, from its (decompressed) first bytes; rewinds it."""
    start = stream.tell()
    head = stream.read(SNIFF_BYTES)
    stream.seek(start)
    if is_gzip(head):
        head = inflate_head(head)
    return detect_kind(head, filename)


# What a parser bug meeting strange content raises.
CONTENT_ERRORS = (
    ArithmeticError,
    AssertionError,
    AttributeError,
    EOFError,
    LookupError,
    MemoryError,
    RuntimeError,  # RecursionError among them
    TypeError,
    ValueError,  # UnicodeError among them
    struct.error,
    zlib.error,
)


def parse_artifact(stream: BinaryIO | bytes, *, kind: str = "", source: str = "") -> LogParse:
    """Parse any artifact; ``kind`` is detected when not given. Never raises on content: what a
    parser could not read is an issue, with ``complete`` False."""
    if isinstance(stream, bytes | bytearray):
        stream = io.BytesIO(stream)
    kind = kind or sniff(stream, source)
    _load_optional_parsers()
    parser = PARSERS.get(kind)
    if parser is None:
        return LogParse(
            source=source,
            events=(),
            issues=(ParseIssue(0, f"no parser for artifacts of kind {kind!r}"),),
            complete=False,
        )
    try:
        return parser(stream, source=source)
    except CONTENT_ERRORS as exc:
        # Parsers never raise on content; when one does anyway (a bug, a RecursionError on
        # crafted nesting), the upload says so and fails instead of taking its worker down.
        # What is not about the content (the storage failing to read, the worker's time limit)
        # goes to the caller.
        return LogParse(
            source=source,
            events=(),
            issues=(ParseIssue(0, f"the {kind} parser failed: {type(exc).__name__}: {exc}"[:500]),),
            complete=False,
        )


def parse_file(path: str | os.PathLike) -> LogParse:
    with open(path, "rb") as stream:
        return parse_artifact(stream, source=str(path))


# Below this much input a process pool costs more to start than it saves.
POOL_MIN_BYTES = 8 << 20


def parse_files(paths: Sequence[str | os.PathLike], *, jobs: int = 1) -> Iterator[LogParse]:
    """Each file's parse, in the order given. With ``jobs`` > 1 and enough input, files are
    parsed in that many processes: a 1,024-rank job's Flight Recorder dumps are mostly the
    unpickler's time, one core per dump. Each process holds one file at a time, and only the
    events (a few KB a file) come back. A file that cannot be read raises ``OSError`` here."""
    paths = list(paths)
    jobs = max(1, min(jobs, len(paths)))
    if jobs == 1 or sum(os.stat(p).st_size for p in paths) < POOL_MIN_BYTES:
        yield from map(parse_file, paths)
        return
    with ProcessPoolExecutor(max_workers=jobs) as pool:
        yield from pool.map(parse_file, paths, chunksize=max(1, len(paths) // (jobs * 8)))


def _load_optional_parsers() -> None:
    """Import the modules that register the non-log kinds (each registers on import)."""
    import importlib

    for module in ("flight_recorder", "trace", "hw_stats"):
        try:
            importlib.import_module(f"{__package__}.{module}")
        except ModuleNotFoundError as exc:
            if exc.name != f"{__package__}.{module}":
                raise
