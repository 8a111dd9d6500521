"""Trainers' own per-step lines: how long each rank's steps took, and how much of that it waited
for its data.

Formats read (each names its source):
  - pytorch/examples' ImageNet trainer (and its many copies): ``Time  0.903 ( 0.640)\tData
    0.352 ( 0.090)``, each meter's value for the batch, then its running average;
  - pipe-separated step lines: ``| data 0.736s | step 1.356s |``;
  - mmengine/mmcv and detectron2: ``… time: 0.5123  data_time: 0.0123 …`` (``IterTimerHook``:
    ``time`` is the whole iteration, ``data_time`` the wait for the batch);
  - trainers that print ``step_time 0.118s | data_time 0.035s`` or ``step_time=…`` (the same
    two quantities under their plain names);
  - lines that give both a ``step_time`` and a longer ``iter_time``: the iteration is the whole
    (step plus whatever the rank did outside it: logging, checkpoint writes, waiting for data), so
    the iteration time is the rank's step time. ``iter_time`` alone is not read: ESPnet's
    reporter prints ``iter_time`` for the wait on its batch iterator, not the iteration;
  - ``elapsed/step 1980.9 ms`` (wall clock per step, as ``elapsed time per iteration``).
Megatron-LM's ``elapsed time per iteration (ms)`` is not read: only the last pipeline stage's
first rank prints it, so it cannot tell one rank's time from another's, and fleets print it on
every iteration (decoding it cost the diagnosis pass half its speed on the bench's log).
The step index comes from ``global_step N``, ``iter: N``, ``iteration N/``, ``Iter [N/``, else the
order of the lines. A long job prints a step line per rank per step: per rank the first
``HEAD_STEPS`` and the last ``TAIL_STEPS`` are kept (the baseline and the run-up to a failure),
so memory stays bounded whatever the log's length.
"""

from __future__ import annotations

import re
from collections import deque
from dataclasses import dataclass
from typing import ClassVar

from .events import Event, register
from .lines import Line
from .prefix import Prefix

_WORDS = ("data_time", "step_time", "data-time", "elapsed/step", "\tData ", "| data ")
HEAD_STEPS = 50
TAIL_STEPS = 200


@dataclass(frozen=True, slots=True, kw_only=True)
class TrainerStep(Event):
    kind: ClassVar[str] = "trainer_step"
    step: int | None = None
    step_s: float | None = None
    data_s: float | None = None


register(TrainerStep)

_NUM = r"(?P<{0}>\d+(?:\.\d+)?)\s*(?P<{0}_unit>ms|s)?"
_DATA = re.compile(r"\bdata[_-]time\s*[:=]?\s*" + _NUM.format("v"))
_STEP_TIME = re.compile(r"(?:\bstep[_-]time|(?<![\w-])time)\s*[:=]?\s*" + _NUM.format("v"))
_ITER_TIME = re.compile(r"\biter[_-]time\s*[:=]?\s*" + _NUM.format("v"))
_ELAPSED = re.compile(r"\belapsed/step\s*[:=]?\s*" + _NUM.format("v"))
# pytorch/examples' ImageNet trainer and the many scripts copied from it: ProgressMeter prints
# AverageMeter('Time', ':6.3f') and AverageMeter('Data', ':6.3f') as "Time  0.903 ( 0.640)\t
# Data  0.352 ( 0.090)": the batch's own value, then the running average.
_METERS = re.compile(
    r"\bTime\s+(?P<t>\d+(?:\.\d+)?)\s+\(\s*[\d.]+\)\s+Data\s+(?P<d>\d+(?:\.\d+)?)\s+\("
)
# Pipe-separated step lines: "| data 0.736s | step 1.356s |".
_PIPES = re.compile(
    r"\|\s*data\s+(?P<d>\d+(?:\.\d+)?)\s*(?P<du>ms|s)\s*\|\s*step\s+"
    r"(?P<t>\d+(?:\.\d+)?)\s*(?P<tu>ms|s)\b"
)
_EPOCH_BATCH = re.compile(r"\[(?P<e>\d+)\]\[\s*(?P<b>\d+)/\d+\]")
# "[rank3]" (PyTorch's own prefix style) and "[rank 3]" (trainers' logging formatters).
_RANK_TAG = re.compile(r"\[rank ?(\d{1,6})\]")
_INDEX = re.compile(
    r"\bglobal_step[:=\s]\s*(?P<a>\d+)|\biter[:=\s]\s*(?P<b>\d+)|\bIter \[(?P<c>\d+)/"
)


def _seconds(m: re.Match, default_unit: str = "s") -> float:
    value = float(m.group("v"))
    unit = m.groupdict().get("v_unit") or default_unit
    return value / 1000 if unit == "ms" else value


class TrainerProgressParser:
    triggers = tuple(word.encode() for word in _WORDS)

    def __init__(self) -> None:
        self._head: dict[int | None, list[TrainerStep]] = {}
        self._tail: dict[int | None, deque[TrainerStep]] = {}
        self._count: dict[int | None, int] = {}

    def feed(self, line: Line, pre: Prefix, follow) -> list[Event]:
        text = pre.rest
        if not any(word in text for word in _WORDS):
            return []  # a line decoded for another parser
        step_s = data_s = None
        m = (_METERS.search(text) if "\tData " in text else None) or (
            _PIPES.search(text) if "| data " in text else None
        )
        if m is not None:
            scale = {"ms": 0.001}
            step_s = float(m.group("t")) * scale.get(m.groupdict().get("tu") or "s", 1.0)
            data_s = float(m.group("d")) * scale.get(m.groupdict().get("du") or "s", 1.0)
            return self._keep(line, pre, text, step_s, data_s)
        d = _DATA.search(text) if "data" in text else None
        if d:
            data_s = _seconds(d)
        # "time" after removing the data_time field, so that it is not read twice.
        t = _STEP_TIME.search(text[: d.start()] + text[d.end() :] if d else text)
        if t:
            step_s = _seconds(t)
            it = _ITER_TIME.search(text) if "iter" in text else None
            if it and _seconds(it) > step_s:
                step_s = _seconds(it)
        elif "elapsed/step" in text:
            e = _ELAPSED.search(text)
            step_s = _seconds(e) if e else None
        if step_s is None and data_s is None:
            return []
        return self._keep(line, pre, text, step_s, data_s)

    def _keep(self, line: Line, pre: Prefix, text: str, step_s, data_s) -> list[Event]:
        rank = pre.rank
        if rank is None:
            # Trainers' loggers often put the tag after their timestamp: "[2026-…][rank3] …".
            tag = _RANK_TAG.search(text, 0, 80)
            rank = int(tag.group(1)) if tag else None
        n = self._count.get(rank, 0)
        self._count[rank] = n + 1
        idx = _INDEX.search(text)
        step = int(next(g for g in idx.groups() if g is not None)) if idx else n
        if idx is None and "][" in text:
            eb = _EPOCH_BATCH.search(text)  # "Epoch: [7][1200/2150]": ordered by epoch, batch
            step = int(eb.group("e")) * 1_000_000 + int(eb.group("b")) if eb else n
        event = TrainerStep(
            line=line.number, text=line.text, rank=rank, step=step, step_s=step_s, data_s=data_s
        )
        head = self._head.setdefault(rank, [])
        if len(head) < HEAD_STEPS:
            head.append(event)
        else:
            self._tail.setdefault(rank, deque(maxlen=TAIL_STEPS)).append(event)
        return []

    def flush(self) -> list[Event]:
        out: list[Event] = []
        for rank, head in self._head.items():
            out.extend(head)
            out.extend(self._tail.get(rank, ()))
        self._head, self._tail, self._count = {}, {}, {}
        return out


# --- phases that report their own length ------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class PhaseDuration(Event):
    """A piece of work that reported how long it took, once it finished: torchtune's
    ``Saving checkpoint took 965.61 secs``, ``Tokenization finished in 1830 s``,
    ``Evaluation completed in 0:31:02``. One event per description, its longest report. Work a
    rank did alone for longer than the collective timeout is what its peers waited on."""

    kind: ClassVar[str] = "phase_duration"
    desc: str = ""
    elapsed_s: float = 0.0
    ongoing: bool = False  # a report of work still under way (its length so far), not its end


register(PhaseDuration)

_PHASE_VERBS = (" took ", " finished in ", " completed in ", " done in ")
# Work still under way that reports how long it has run so far: a decode or eval loop's
# "decoded 2560/3003 sentences | 1068.2s elapsed", a converter's "(total 247s, …)", and faiss
# k-means in verbose mode ("Iteration 17 (1679.36 s, search 1650.12 s): objective=…", the
# format of faiss/Clustering.cpp). The line's words, digits masked, name the phase.
_ONGOING_MARKS = ("s elapsed", "(total ", "s, search ", "Clustering ")
_ONGOING = re.compile(
    r"(?P<n>\d+(?:\.\d+)?)\s*s(?:ec(?:ond)?s?)?\s+elapsed\b"
    r"|\(total (?P<t>\d+(?:\.\d+)?)\s*s\b"
    r"|\bIteration \d+ \((?P<k>\d+(?:\.\d+)?) s, search \d+(?:\.\d+)? s\)"
    # faiss's header as k-means starts: "Clustering 111099511 points in 128D to 524288 clusters"
    r"|\bClustering (?P<points>\d+) points in \d+D to \d+ clusters"
)
_DIGITS = re.compile(r"\d+(?:[.,/]\d+)*")
_PHASE = re.compile(
    r"(?P<desc>[A-Za-z][\w ./'()-]{0,80}?)\s+(?:took|finished in|completed in|done in)\s*:?\s*"
    r"(?:(?P<hms>\d+:\d\d:\d\d)(?:\.\d+)?|(?P<n>\d+(?:\.\d+)?)\s*"
    r"(?P<unit>ms|milliseconds?|s|secs?|seconds?|mins?|minutes?|h|hrs?|hours?)\b)"
)
# A training loop's own length says nothing about a wait: every rank runs it, in lockstep.
LOCKSTEP_WORK = re.compile(
    r"\b(?:epoch|step|iter(?:ation)?|batch|train(?:ing)?|forward|backward)s?\b", re.IGNORECASE
)
MAX_PHASES = 100


def _unit_seconds(unit: str) -> float:
    if unit.startswith("ms") or unit.startswith("milli"):
        return 0.001
    if unit.startswith("mi"):
        return 60.0
    if unit.startswith("h"):
        return 3600.0
    return 1.0


class PhaseDurationParser:
    triggers = tuple(verb.encode() for verb in _PHASE_VERBS + _ONGOING_MARKS)

    def __init__(self) -> None:
        self._phases: dict[str, PhaseDuration] = {}

    def feed(self, line: Line, pre: Prefix, follow) -> list[Event]:
        text = pre.rest
        if any(mark in text for mark in _ONGOING_MARKS):
            # (A watchdog line glued to the last redraw does not hide the redraws before it.)
            self._ongoing(line, pre, text)
        if not any(verb in text for verb in _PHASE_VERBS) or "NCCL" in text:
            return []
        m = _PHASE.search(text)
        if m is None:
            return []
        # The phase's name is the words after the logger's own prefix ("INFO:module:", "] ").
        desc = re.split(r"[:\]|>]", m.group("desc"))[-1].strip(" .-")
        if not desc or LOCKSTEP_WORK.search(desc):
            return []
        if m.group("hms"):
            h, mi, s = (int(p) for p in m.group("hms").split(":"))
            seconds = float(h * 3600 + mi * 60 + s)
        else:
            seconds = float(m.group("n")) * _unit_seconds(m.group("unit").lower())
        self._keep(line, pre, desc, seconds)
        return []

    def _ongoing(self, line: Line, pre: Prefix, text: str) -> None:
        # \r-glued redraws (faiss prints its iterations so): the last report is the furthest.
        found = list(_ONGOING.finditer(text))
        if not found:
            return
        m = found[-1]
        if m.group("k") is not None or m.group("points") is not None:
            desc, seconds = "k-means clustering (faiss)", float(m.group("k") or 0)
        else:
            before = text[: m.start()]
            # The phase's words: after the logger's prefix, digits masked ("decoded N sentences").
            words = [w for w in re.split(r"\s[|>]\s|\]\s|INFO\b:?", before) if w.strip(" |-(")]
            desc = re.split(r"[:(]", words[-1] if words else before)[0]
            desc = " ".join(_DIGITS.sub("N", desc).split()).strip(" |-,[]")[:80]
            seconds = float(m.group("n") or m.group("t"))
        if not desc or LOCKSTEP_WORK.search(desc):
            return
        self._keep(line, pre, desc, seconds, ongoing=True)

    def _keep(
        self, line: Line, pre: Prefix, desc: str, seconds: float, ongoing: bool = False
    ) -> None:
        old = self._phases.get(desc)
        if (old is not None and old.elapsed_s >= seconds) or (
            old is None and len(self._phases) >= MAX_PHASES
        ):
            return
        self._phases[desc] = PhaseDuration(
            line=line.number,
            text=line.text,
            rank=pre.rank,
            desc=desc[:80],
            elapsed_s=seconds,
            ongoing=ongoing,
        )

    def flush(self) -> list[Event]:
        phases = sorted(self._phases.values(), key=lambda p: p.line)
        self._phases = {}
        return phases
