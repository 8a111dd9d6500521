"""``parse_artifact``: one entry point for every kind of artifact an agent uploads.

Text logs go to ``parse_log``; Flight Recorder dumps, profiler traces and hardware stats go to
the parsers registered for their kind. Every parser returns a ``LogParse`` (events + issues), so
the CLI and the server treat all artifacts alike.
"""

from __future__ import annotations

import io
import struct
import zlib
from collections.abc import Callable
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


def _load_optional_parsers() -> None:
    """Import the modules that register the non-log kinds (each registers on import)."""
    import importlib

    for module in ("flight_recorder", "trace", "hw_stats"):
        try:
            importlib.import_module(f"{__package__}.{module}")
        except ModuleNotFoundError as exc:
            if exc.name != f"{__package__}.{module}":
                raise
