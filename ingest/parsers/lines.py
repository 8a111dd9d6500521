"""Streaming line reading for untrusted logs.

Everything here works on bytes in bounded chunks so that a 10 GB log costs the same memory as a
10 KB one. Lines are decoded leniently (invalid UTF-8 becomes U+FFFD), stripped of CR and ANSI
colour codes, and cut at ``max_line`` bytes: a crashing job prints whatever it likes and none of
it may stop the parse.
"""

from __future__ import annotations

import gzip
import io
import re
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import BinaryIO

GZIP_MAGIC = b"\x1f\x8b"
CHUNK_SIZE = 1 << 20
MAX_LINE = 16 * 1024

# ANSI CSI sequences (colours, cursor moves) that tqdm, rich and coloured loggers emit.
_ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]")


@dataclass(frozen=True, slots=True)
class Line:
    number: int  # 1-based, as an editor shows it
    text: str
    truncated: bool = False


class UnreadableInput(ValueError):
    """The bytes cannot be read as a (possibly gzip-compressed) log at all."""


def is_gzip(head: bytes) -> bool:
    return head[:2] == GZIP_MAGIC


def open_stream(raw: BinaryIO) -> BinaryIO:
    """Wrap ``raw`` in a gzip reader when it starts with the gzip magic bytes."""
    if not hasattr(raw, "peek"):
        raw = io.BufferedReader(raw)  # type: ignore[arg-type]
    head = raw.peek(2)[:2]  # type: ignore[attr-defined]
    if is_gzip(head):
        return gzip.GzipFile(fileobj=raw, mode="rb")  # type: ignore[return-value]
    return raw


def iter_chunks(stream: BinaryIO, chunk_size: int = CHUNK_SIZE) -> Iterator[bytes]:
    """Yield chunks that always end on a line boundary (except possibly the last)."""
    carry = b""
    while True:
        try:
            block = stream.read(chunk_size)
        except (EOFError, OSError, zlib.error, gzip.BadGzipFile) as exc:
            # A truncated gzip still gives us everything before the cut: keep it.
            if carry:
                yield carry
            raise UnreadableInput(f"compressed stream is damaged: {exc}") from exc
        if not block:
            break
        block = carry + block
        cut = block.rfind(b"\n")
        if cut < 0:
            if len(block) > chunk_size * 4:
                # One enormous line: hand it on rather than buffering without bound.
                yield block
                carry = b""
            else:
                carry = block
            continue
        yield block[: cut + 1]
        carry = block[cut + 1 :]
    if carry:
        yield carry


def clean(raw: bytes, max_line: int = MAX_LINE) -> tuple[str, bool]:
    """Decode one raw line: cut to ``max_line`` bytes, drop CR and ANSI codes."""
    truncated = len(raw) > max_line
    if truncated:
        raw = raw[:max_line]
    text = raw.decode("utf-8", "replace").rstrip("\r\n")
    if "\x1b" in text:
        text = _ANSI.sub("", text)
    if "\r" in text:
        # tqdm redraws a progress bar with bare CRs; the last redraw is what a terminal shows,
        # but a log line may follow the bar on the same physical line, so keep every segment.
        text = text.replace("\r", " ")
    return text, truncated


def iter_lines(stream: BinaryIO, max_line: int = MAX_LINE) -> Iterator[Line]:
    """Every line of ``stream`` (gzip or plain), numbered from 1."""
    number = 0
    for chunk in iter_chunks(open_stream(stream)):
        parts = chunk.split(b"\n")
        if chunk.endswith(b"\n"):
            parts.pop()  # split() leaves an empty tail that is not a line
        for raw in parts:
            number += 1
            text, truncated = clean(raw, max_line)
            yield Line(number, text, truncated)


class LineScanner:
    """Yield only the lines that contain one of ``triggers``, with their true line numbers.

    This is what makes a diagnosis pass fast: the incident lines are a tiny share of a training
    log, so instead of decoding every line in Python we let ``bytes.find`` (C, memchr-based) jump
    from one trigger to the next and only decode the lines around a hit. Line numbers come from
    ``bytes.count`` over the skipped bytes. After a hit, ``follow(n)`` asks for the next ``n``
    lines whatever they hold (stack frames under "Stack trace of the failed collective").
    """

    def __init__(self, stream: BinaryIO, triggers: tuple[bytes, ...], max_line: int = MAX_LINE):
        self._stream = stream
        self._triggers = triggers
        self._max_line = max_line
        self._follow = 0
        self.lines_seen = 0

    def follow(self, lines: int) -> None:
        self._follow = max(self._follow, lines)

    def _hits(self, chunk: bytes) -> list[int]:
        starts: set[int] = set()
        for trigger in self._triggers:
            i = chunk.find(trigger)
            while i >= 0:
                start = chunk.rfind(b"\n", 0, i) + 1
                starts.add(start)
                end = chunk.find(b"\n", i)
                if end < 0:
                    break
                i = chunk.find(trigger, end)
        return sorted(starts)

    def __iter__(self) -> Iterator[Line]:
        base = 0  # lines before this chunk
        for chunk in iter_chunks(open_stream(self._stream)):
            counted_to, line_no = 0, base
            pos = 0  # bytes before pos have been yielded or skipped
            for start in self._hits(chunk):
                if start < pos:
                    continue
                while self._follow and pos < start:
                    # Lines requested by follow() come before the next hit.
                    end = chunk.find(b"\n", pos)
                    end = len(chunk) if end < 0 else end
                    line_no += chunk.count(b"\n", counted_to, pos)
                    counted_to = pos
                    self._follow -= 1
                    yield Line(line_no + 1, *clean(chunk[pos:end], self._max_line))
                    pos = end + 1
                if start < pos:
                    continue
                line_no += chunk.count(b"\n", counted_to, start)
                counted_to = start
                end = chunk.find(b"\n", start)
                end = len(chunk) if end < 0 else end
                yield Line(line_no + 1, *clean(chunk[start:end], self._max_line))
                pos = end + 1
            while self._follow and pos < len(chunk):
                end = chunk.find(b"\n", pos)
                end = len(chunk) if end < 0 else end
                line_no += chunk.count(b"\n", counted_to, pos)
                counted_to = pos
                self._follow -= 1
                yield Line(line_no + 1, *clean(chunk[pos:end], self._max_line))
                pos = end + 1
            base += chunk.count(b"\n")
            self.lines_seen = base + (0 if chunk.endswith(b"\n") else 1)


def iter_text_lines(text: str) -> Iterator[Line]:
    """Lines of an in-memory string, for tests and the CLI's pasted input."""
    yield from iter_lines(io.BytesIO(text.encode("utf-8", "surrogateescape")))
