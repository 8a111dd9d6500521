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
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import BinaryIO

GZIP_MAGIC = b"\x1f\x8b"
NEAR = 512  # bytes searched with bytes.find after a hit before falling back to memmem
CHUNK_SIZE = 4 << 20
# Line-index entries kept per stream, one per block: 16 GiB of log at the default block size.
MAX_INDEX_ENTRIES = 4096
MAX_LINE = 16 * 1024
# Bytes of an enormous line repeated at the start of its next piece: longer than any trigger.
PIECE_OVERLAP = 256


def _load_memmem():
    """libc ``memmem`` through ctypes, or None where there is no C library to ask.

    ``bytes.find`` on CPython 3.11 scans at roughly the speed of ``bytes.count(b"\\n")`` per
    trigger; glibc's ``memmem`` skips ahead by byte pairs and is two to four times faster on
    training logs. It only reads inside the bounds we pass, and every result is checked against
    ``bytes.find`` semantics by the tests; without it we fall back to ``bytes.find``.
    """
    try:
        import ctypes

        memmem = ctypes.CDLL(None).memmem
    except (OSError, AttributeError, TypeError):
        return None
    memmem.restype = ctypes.c_void_p
    memmem.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p, ctypes.c_size_t]
    probe = b"xxNCCLyy"
    addr = ctypes.cast(ctypes.c_char_p(probe), ctypes.c_void_p).value
    if addr is None or memmem(addr, len(probe), b"NCCL", 4) != addr + 2:
        return None

    def address(chunk: bytes) -> int:
        return ctypes.cast(ctypes.c_char_p(chunk), ctypes.c_void_p).value or 0

    return memmem, address


_MEMMEM = _load_memmem()


def _load_hyperscan():
    """Intel Hyperscan (python-hyperscan) finds every trigger in one pass over a chunk, at
    close to memory speed, instead of one pass per trigger. Optional: where its wheel does not
    exist (non-x86 machines) the scanner uses memmem or bytes.find per trigger."""
    try:
        import hyperscan
    except ImportError:
        return None
    return hyperscan


_HYPERSCAN = _load_hyperscan()
_DATABASES: dict[tuple, object] = {}


def _database(
    triggers: tuple[bytes, ...], shapes: tuple[tuple[bytes, tuple[bytes, ...]], ...] = ()
):
    """A compiled database per trigger set, built once per process. A trigger with ``shapes``
    is compiled as those patterns (single-line regular expressions) instead of as a literal: the
    lines they leave out are the ones the trigger's ``skip`` would drop anyway."""
    key = (triggers, shapes)
    db = _DATABASES.get(key)
    if db is None:
        hs = _HYPERSCAN
        refined = dict(shapes)
        expressions = [
            pattern
            for trigger in triggers
            for pattern in refined.get(trigger, (hs_escape(trigger),))
        ]
        db = hs.Database(mode=hs.HS_MODE_BLOCK)
        db.compile(
            expressions=expressions,
            ids=list(range(len(expressions))),
            elements=len(expressions),
            flags=[0] * len(expressions),
        )
        _DATABASES[key] = db
    return db


def hs_escape(literal: bytes) -> bytes:
    """Hyperscan compiles regular expressions: escape every non-alphanumeric byte."""
    return b"".join(bytes([c]) if chr(c).isalnum() else b"\\x%02x" % c for c in literal)


# ANSI CSI sequences (colours, cursor moves) that tqdm, rich and coloured loggers emit.
_ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]")


@dataclass(frozen=True, slots=True)
class Line:
    number: int  # 1-based, as an editor shows it
    text: str
    truncated: bool = False
    followed: bool = False  # yielded because a parser asked with follow(), not for a trigger


class UnreadableInput(ValueError):
    """The bytes cannot be read as a (possibly gzip-compressed) log at all."""


def is_gzip(head: bytes) -> bool:
    return head[:2] == GZIP_MAGIC


def open_stream(raw: BinaryIO) -> BinaryIO:
    """Wrap ``raw`` in a gzip reader when it starts with the gzip magic bytes."""
    if not hasattr(raw, "peek"):
        if raw.seekable():
            # BytesIO and plain files: look at the magic bytes and rewind, no extra buffer copy.
            start = raw.tell()
            head = raw.read(2)
            raw.seek(start)
            if is_gzip(head):
                return gzip.GzipFile(fileobj=raw, mode="rb")  # type: ignore[return-value]
            return raw
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


def iter_blocks(stream: BinaryIO, chunk_size: int = CHUNK_SIZE) -> Iterator[tuple[bytes, int, int]]:
    """Like ``iter_chunks`` without copying each block twice: yields ``(block, lo, hi)`` where
    ``block[lo:hi]`` is the next run of whole lines (the last run of the stream, or a piece of
    one enormous line, may end without a newline). A line cut by a block boundary is joined
    with its rest into a small block of its own, so no big slice is ever made."""
    carry = b""
    while True:
        try:
            block = stream.read(chunk_size)
        except (EOFError, OSError, zlib.error, gzip.BadGzipFile) as exc:
            if carry:
                yield carry, 0, len(carry)
            raise UnreadableInput(f"compressed stream is damaged: {exc}") from exc
        if not block:
            break
        lo = 0
        if carry:
            first = block.find(b"\n")
            if first < 0:
                carry += block
                if len(carry) > chunk_size * 4:
                    # One enormous line: hand it on rather than buffering without bound, keeping
                    # an overlap so that a trigger cut by the hand-over is still found whole.
                    yield carry, 0, len(carry)
                    carry = carry[-PIECE_OVERLAP:]
                continue
            joined = carry + block[: first + 1]
            yield joined, 0, len(joined)
            carry, lo = b"", first + 1
        hi = block.rfind(b"\n", lo) + 1
        if hi <= lo:
            carry = block[lo:]
            if len(carry) > chunk_size * 4:
                yield carry, 0, len(carry)
                carry = carry[-PIECE_OVERLAP:]
            continue
        yield block, lo, hi
        carry = block[hi:]
    if carry:
        yield carry, 0, len(carry)


def clean(raw: bytes, max_line: int = MAX_LINE) -> tuple[str, bool]:
    """Decode one raw line: cut to ``max_line`` bytes, drop CR and ANSI codes.

    A cut line keeps its head and its tail: a tqdm bar redrawn with CRs for half an hour is one
    multi-megabyte "line", and what matters in it is the last redraw and whatever a rank printed
    right after it (case: a watchdog timeout glued to a tokenizer progress bar).
    """
    truncated = len(raw) > max_line
    if truncated:
        half = max_line // 2
        raw = raw[:half] + b" [...] " + raw[-half:]
    text = raw.decode("utf-8", "replace").rstrip("\r\n")
    if "\x1b" in text:
        text = _ANSI.sub("", text)
    if "\r" in text:
        # tqdm redraws a progress bar with bare CRs; the last redraw is what a terminal shows,
        # but a log line may follow the bar on the same physical line, so keep every segment.
        text = text.replace("\r", " ")
    return text, truncated


def iter_lines(
    stream: BinaryIO, max_line: int = MAX_LINE, chunk_size: int = CHUNK_SIZE
) -> Iterator[Line]:
    """Every line of ``stream`` (gzip or plain), numbered from 1."""
    number = 0
    for chunk in iter_chunks(open_stream(stream), chunk_size):
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

    Every trigger costs one ``bytes.find`` pass over the whole file, so the set must stay small.
    ``head_triggers`` are looked for only in the first ``head_bytes`` of the stream: settings are
    printed when a job starts, and their many spellings would otherwise each cost a full pass.
    ``skip(raw)`` may drop a hit line before it is decoded: a job with ``NCCL_DEBUG=INFO``
    prints thousands of INFO lines that hold the ``NCCL`` trigger and say nothing new.
    ``shapes`` tells the Hyperscan path which lines of a trigger ``skip`` could keep (see
    ``_database``), so that the lines it would drop cost no Python at all; ``skip`` still has
    the last word, and the other paths ignore ``shapes``.
    """

    def __init__(
        self,
        stream: BinaryIO,
        triggers: tuple[bytes, ...],
        max_line: int = MAX_LINE,
        *,
        head_triggers: tuple[bytes, ...] = (),
        head_bytes: int = 0,
        chunk_size: int = CHUNK_SIZE,
        fast: bool = True,
        skip: Callable[[bytes], bool] | None = None,
        shapes: dict[bytes, tuple[bytes, ...]] | None = None,
    ):
        self._stream = stream
        self._triggers = triggers
        self._head_triggers = head_triggers
        self._head_bytes = head_bytes
        self._chunk_size = chunk_size
        self._max_line = max_line
        self._follow = 0
        self._memmem = _MEMMEM if fast else None
        self._hyperscan = _HYPERSCAN is not None and fast and bool(triggers)
        self._skip = skip
        self._shapes = tuple(sorted((shapes or {}).items()))
        self.lines_seen = 0
        # (line number, stream offset where that line starts) once per block: a sparse index
        # that lets a reader of the same stream seek near line N instead of counting to it.
        self.line_index: list[tuple[int, int]] = []

    def follow(self, lines: int) -> None:
        self._follow = max(self._follow, lines)

    def _hits_hyperscan(self, chunk: bytes, offset: int) -> list[int]:
        # ``offset`` is the stream offset of chunk[0] (negative when the block starts with the
        # tail of a line that was already handed on).
        ends: list[int] = []

        def on_match(_id, _start, end, _flags, _ctx):
            ends.append(end)

        _database(self._triggers, self._shapes).scan(chunk, match_event_handler=on_match)
        if self._head_triggers and offset < self._head_bytes:
            head = chunk[: self._head_bytes - offset]
            _database(self._head_triggers).scan(head, match_event_handler=on_match)
        # A shape may end on the newline that closes its line ("NCCL[^ ]"): look before it.
        starts = {chunk.rfind(b"\n", 0, end - 1) + 1 for end in ends}
        return sorted(starts)

    def _hits(self, chunk: bytes, offset: int) -> list[int]:
        """Start offsets of the lines of ``chunk`` that hold a trigger."""
        if self._hyperscan:
            return self._hits_hyperscan(chunk, offset)
        starts: set[int] = set()
        triggers = self._triggers
        limit = len(chunk)
        if self._head_triggers and offset < self._head_bytes:
            triggers = triggers + self._head_triggers
        if self._memmem is not None:
            memmem, address = self._memmem
            base = address(chunk)
        for trigger in triggers:
            if offset >= self._head_bytes or trigger in self._triggers:
                stop = limit
            else:
                stop = min(limit, self._head_bytes - offset)
            i = 0
            while i < stop:
                # Hits come in runs (an NCCL INFO dump): look just ahead with bytes.find before
                # paying for a ctypes call that pays off only over long stretches.
                near = chunk.find(trigger, i, min(stop, i + NEAR))
                if near >= 0 or self._memmem is None:
                    i = near if near >= 0 else chunk.find(trigger, i, stop)
                else:
                    i = max(i, min(stop, i + NEAR) - len(trigger) + 1)
                    hit = memmem(base + i, stop - i, trigger, len(trigger)) if i < stop else None
                    i = -1 if hit is None else hit - base
                if i < 0:
                    break
                starts.add(chunk.rfind(b"\n", 0, i) + 1)
                end = chunk.find(b"\n", i)
                if end < 0:
                    break
                i = end
        return sorted(starts)

    def _line(
        self, chunk: bytes, pos: int, line_no: int, hi: int, followed: bool = False
    ) -> tuple[Line, int]:
        end = chunk.find(b"\n", pos, hi)
        end = hi if end < 0 else end
        text, truncated = clean(chunk[pos:end], self._max_line)
        return Line(line_no + 1, text, truncated, followed), end + 1

    def __iter__(self) -> Iterator[Line]:
        base = 0  # lines before this block's run
        offset = 0  # stream bytes before this block's run
        open_line = False  # the last run ended inside a line that was already yielded
        for chunk, lo, hi in iter_blocks(open_stream(self._stream), self._chunk_size):
            counted_to, line_no = lo, base
            pos = lo  # bytes before pos have been yielded or skipped
            if open_line:
                # iter_blocks hands on an enormous line in pieces: its first piece was yielded.
                first_end = chunk.find(b"\n", lo, hi)
                pos = hi if first_end < 0 else first_end + 1
            for start in self._hits(chunk, offset - lo):
                if start < pos:
                    continue
                if start >= hi:
                    break
                while self._follow and pos < start:
                    # Lines requested by follow() come before the next hit.
                    line_no += chunk.count(b"\n", counted_to, pos)
                    counted_to = pos
                    self._follow -= 1
                    line, pos = self._line(chunk, pos, line_no, hi, followed=True)
                    yield line
                if start < pos:
                    continue
                if self._skip is not None:
                    end = chunk.find(b"\n", start, hi)
                    end = hi if end < 0 else end
                    if self._skip(chunk[start : min(end, start + self._max_line)]):
                        continue
                line_no += chunk.count(b"\n", counted_to, start)
                counted_to = start
                line, pos = self._line(chunk, start, line_no, hi)
                yield line
            while self._follow and pos < hi:
                line_no += chunk.count(b"\n", counted_to, pos)
                counted_to = pos
                self._follow -= 1
                line, pos = self._line(chunk, pos, line_no, hi, followed=True)
                yield line
            # Count each byte once: what the hits above have not counted yet.
            ends_line = chunk[hi - 1 : hi] == b"\n"
            base = line_no + chunk.count(b"\n", counted_to, hi)
            last_end = chunk.rfind(b"\n", lo, hi)
            if last_end >= 0 and len(self.line_index) < MAX_INDEX_ENTRIES:
                # No line ends after last_end in this block: the next one is line base + 1.
                self.line_index.append((base + 1, offset + last_end + 1 - lo))
            offset += hi - lo
            open_line = pos >= hi and not ends_line
            self.lines_seen = base + (0 if ends_line else 1)
