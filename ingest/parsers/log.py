"""``parse_log``: one pass over a text log (plain or gzip) into typed events.

Each format module contributes a parser object with ``triggers`` (byte strings that every line
it cares about contains) and ``feed(line, prefix, follow) -> [Event]``; ``flush()`` ends any
multi-line block. Only lines holding a trigger are decoded, which keeps the pass near the speed
of a plain byte scan on logs that are mostly training noise.
"""

from __future__ import annotations

import io
from collections import Counter, deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import BinaryIO, Protocol

from .config import ConfigParser
from .events import Event
from .kernel import KernelParser
from .launcher import LauncherParser
from .lines import LineScanner, UnreadableInput
from .nccl import NcclParser
from .prefix import split_prefix
from .progress import PhaseDurationParser, TrainerProgressParser
from .pytorch import PytorchParser
from .signatures import SignatureParser
from .stacks import StackParser

# Head triggers (settings printed at start-up) are looked for in this many first bytes of a file;
# the global triggers everywhere. See LineScanner.
HEAD_BYTES = 2 << 20

# Enough for every rank of a 16k-rank job to report a timeout, progress and a stack twice over,
# and small enough that a log of nothing but matching lines cannot exhaust memory.
MAX_EVENTS = 100_000
# Past MAX_EVENTS the middle of the log gives way: the first quarter (start-up settings,
# communicator init) and the newest half are kept, and of the middle the events that can name a
# failure (see AMBIENT): up to a quarter, at most a fifth of that per kind, so that a storm of
# one kind (every rank's traceback, again and again) cannot push out the others. A failing
# job's end (the Xid, the timeouts, the traceback) is what a diagnosis needs most; keeping the
# first 100,000 dropped it, and keeping only the newest dropped a timeout before a stack storm.
HEAD_SHARE = 4
RESERVE_SHARE = 4
# What the middle of a long log can lose first: context that repeats through a healthy run
# (stack samples, steps, bars, communicator set-up, settings, host counters). Everything else is
# a failure, an error or a signature.
AMBIENT = frozenset(
    {
        "stack_sample",
        "trainer_step",
        "progress_bar",
        "phase_duration",
        "nccl_channel",
        "nccl_init",
        "nccl_network",
        "nccl_net_devices",
        "config_value",
        "host_stats",
        "gpu_health",
        "nic_health",
        "reader_status",
        "agent_spool",
        "trace_summary",
    }
)


class LineParser(Protocol):
    triggers: tuple[bytes, ...]

    def feed(self, line, pre, follow: Callable[[int], None]) -> list[Event]: ...

    def flush(self) -> list[Event]: ...

    # Optional: ``trigger_shapes: dict[bytes, tuple[bytes, ...]]`` narrows a trigger to the line
    # shapes ``skip_raw`` could keep, for the pattern scanner (see LineScanner).
    # Optional: ``skip_raw(raw: bytes) -> bool`` says that a hit line is of this parser's own
    # format (an NCCL INFO line, a tqdm bar) and that no parser needs it, so the scanner may
    # drop it undecoded. It must be cheap and conservative.


def default_parsers() -> list[LineParser]:
    return [
        PytorchParser(),
        NcclParser(),
        KernelParser(),
        LauncherParser(),
        ConfigParser(),
        SignatureParser(),
        TrainerProgressParser(),
        PhaseDurationParser(),
        StackParser(),
    ]


@dataclass(frozen=True, slots=True)
class ParseIssue:
    line: int
    message: str


@dataclass(frozen=True, slots=True)
class LogParse:
    source: str
    events: tuple[Event, ...]
    issues: tuple[ParseIssue, ...] = ()
    lines: int = 0
    dropped_events: int = 0
    folded_lines: int = 0  # exact repeats counted, not parsed (see NcclParser.skip_raw)
    complete: bool = True  # False when the input was cut off (truncated gzip)
    # (line, offset of its first byte in the decompressed stream), one per scanned block
    line_index: tuple[tuple[int, int], ...] = ()

    def of_kind(self, kind: str) -> list[Event]:
        return [e for e in self.events if e.kind == kind]


@dataclass
class _Collector:
    source: str
    head: list[Event] = field(default_factory=list)
    reserve: list[Event] = field(default_factory=list)
    dropped: int = 0
    first_dropped_line: int | None = None

    def __post_init__(self) -> None:
        self.head_cap = MAX_EVENTS // HEAD_SHARE
        self.reserve_cap = MAX_EVENTS // RESERVE_SHARE
        self.per_kind = max(1, self.reserve_cap // 5)
        self.tail: deque[Event] = deque(maxlen=MAX_EVENTS - self.head_cap - self.reserve_cap)
        self.kept: Counter[str] = Counter()
        self.lost: Counter[str] = Counter()

    def add(self, new: Iterable[Event]) -> None:
        for event in new:
            if self.source and not event.source:
                event = _with_source(event, self.source)
            if len(self.head) < self.head_cap:
                self.head.append(event)
                continue
            if len(self.tail) == self.tail.maxlen:
                self._evict(self.tail[0])  # the oldest of the tail gives way to the newest
            self.tail.append(event)

    def _evict(self, gone: Event) -> None:
        kind = gone.kind
        if (
            kind not in AMBIENT
            and len(self.reserve) < self.reserve_cap
            and self.kept[kind] < self.per_kind
        ):
            self.reserve.append(gone)
            self.kept[kind] += 1
            return
        self.dropped += 1
        self.lost[kind] += 1
        if self.first_dropped_line is None:
            self.first_dropped_line = gone.line

    @property
    def events(self) -> list[Event]:
        return [*self.head, *self.reserve, *self.tail]

    def issue(self) -> ParseIssue | None:
        if not self.dropped:
            return None
        lost = ", ".join(f"{n} {kind}" for kind, n in self.lost.most_common(4))
        return ParseIssue(
            self.first_dropped_line or 0,
            f"{self.dropped} events from the middle of the log were dropped (more than "
            f"{MAX_EVENTS}; {lost}): the first {self.head_cap}, failures and errors from the "
            f"middle (up to {self.per_kind} of each kind) and the newest {self.tail.maxlen} "
            "are kept",
        )


def _first_true(skips: list[Callable[[bytes], bool]]) -> Callable[[bytes], bool] | None:
    """One predicate from several, called once per hit line: no generator per call."""
    if len(skips) <= 1:
        return skips[0] if skips else None

    def skip(raw: bytes) -> bool:
        for each in skips:  # noqa: SIM110 - called per hit line; any() would build a generator
            if each(raw):
                return True
        return False

    return skip


def _with_source(event: Event, source: str) -> Event:
    import dataclasses

    return dataclasses.replace(event, source=source)


def parse_log(
    stream: BinaryIO | bytes, *, source: str = "", parsers: list[LineParser] | None = None
) -> LogParse:
    """Parse a whole log. Never raises on content; a damaged gzip gives what came before it."""
    if isinstance(stream, bytes | bytearray):
        stream = io.BytesIO(stream)
    parsers = parsers if parsers is not None else default_parsers()
    triggers = tuple(sorted({t for p in parsers for t in p.triggers}))
    head = tuple(
        sorted({t for p in parsers for t in getattr(p, "head_triggers", ())} - set(triggers))
    )
    skips = [p.skip_raw for p in parsers if hasattr(p, "skip_raw")]
    shapes = {t: s for p in parsers for t, s in getattr(p, "trigger_shapes", {}).items()}
    scanner = LineScanner(
        stream,
        triggers,
        head_triggers=head,
        head_bytes=HEAD_BYTES,
        skip=_first_true(skips),
        shapes=shapes,
    )
    out = _Collector(source)
    issues: list[ParseIssue] = []
    complete = True
    last_line = 0
    # A line holding a trigger goes to every parser; a line yielded only because parsers asked
    # for it with follow() (a stack frame, a traceback's next line) goes to those that asked.
    # In a storm of stack dumps those lines are most of what is read.
    wanted = [0] * len(parsers)

    def asker(i: int) -> Callable[[int], None]:
        def follow(lines: int) -> None:
            wanted[i] = max(wanted[i], lines)
            scanner.follow(lines)

        return follow

    follows = [asker(i) for i in range(len(parsers))]
    everyone = tuple(range(len(parsers)))
    try:
        for line in scanner:
            last_line = line.number
            if line.truncated:
                issues.append(ParseIssue(line.number, "line longer than the limit; cut"))
            pre = split_prefix(line.text)
            if line.followed:
                to = tuple(i for i in everyone if wanted[i])
                for i in to:
                    wanted[i] -= 1
            else:
                to = everyone
            for i in to:
                parser = parsers[i]
                try:
                    out.add(parser.feed(line, pre, follows[i]))
                except Exception as exc:  # a parser bug must not lose the rest of the file
                    issues.append(ParseIssue(line.number, f"{type(parser).__name__}: {exc!r}"))
    except UnreadableInput as exc:
        complete = False
        issues.append(ParseIssue(last_line, str(exc)))
    for parser in parsers:
        out.add(parser.flush())
    folded = sum(getattr(p, "folded", 0) for p in parsers)
    if folded:
        issues.insert(
            0,
            ParseIssue(
                0,
                f"{folded} exact repeats of NCCL warnings or settings already printed on the "
                "same host were counted, not parsed (the first of each was read)",
            ),
        )
    dropped = out.issue()
    if dropped is not None:
        issues.insert(0, dropped)
    return LogParse(
        source=source,
        events=tuple(out.events),
        issues=tuple(issues[:1000]),
        lines=scanner.lines_seen,
        dropped_events=out.dropped,
        folded_lines=folded,
        complete=complete,
        line_index=tuple(scanner.line_index),
    )
