"""Python stack dumps of a live rank: where its main thread was when someone looked.

Formats (each names its source):
  - py-spy dump: ``Thread 47731 (idle): "MainThread"`` then frames ``    get (queue.py:170)``;
  - faulthandler (``faulthandler.dump_traceback``, SIGABRT/SIGSEGV handlers, PyTorch's watchdog
    on some versions): ``Current thread 0x00007f… (most recent call first):`` or ``Thread
    0x00007f… (most recent call first):`` then ``  File "…/queue.py", line 170 in get``.
Both list the innermost frame first. A stack is "waiting on data" when its innermost frames are a
wait (a queue get, a connection poll, a lock) reached from a data-loading frame: torch's
DataLoader (``torch/utils/data/dataloader.py``) or a trainer's data iterator (``__next__`` in a
file under a ``data`` directory).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import ClassVar

from .events import Event, register
from .lines import Line
from .prefix import Prefix

MAX_FRAMES = 40

_PYSPY_HEAD = re.compile(r'^Thread (?:0x)?[0-9A-Fa-f]+ \((?:idle|active)[^)]*\): "(?P<name>[^"]*)"')
_FH_HEAD = re.compile(
    r"^(?P<current>Current )?[Tt]hread 0x[0-9a-fA-F]+ \(most recent call first\):"
)
_PYSPY_FRAME = re.compile(r"^\s+(?P<func>[\w<>.]+) \((?P<file>[^():]+):\d+\)")
_FH_FRAME = re.compile(r'^\s+File "(?P<file>[^"]+)", line \d+ in (?P<func>[\w<>.]+)')

_PYSPY_PROCESS = re.compile(r"^Process (?P<pid>\d+): ")
_WAITS = ("get", "wait", "poll", "_poll", "select", "acquire", "recv", "_recv", "read")
_STDLIB = ("threading.py", "queue.py", "selectors.py", "multiprocessing/", "socket.py", "ssl.py")


@dataclass(frozen=True, slots=True, kw_only=True)
class StackSample(Event):
    kind: ClassVar[str] = "stack_sample"
    thread: str = ""
    frames: tuple[str, ...] = ()  # "func (file)", innermost first
    waits_on_data: bool = False
    pid: int | None = None  # py-spy's "Process 40215: …" header of the dump


register(StackSample)


def waits_on_data(frames: list[tuple[str, str]]) -> bool:
    """Innermost first: a wait in the standard library, reached from a data-loading frame; or
    the loading itself in this thread (``num_workers=0``: the DataLoader's single-process
    iterator fetches through torch/utils/data/_utils/fetch.py, the dataset's ``__getitem__``
    decoding in the training process)."""
    if any(func == "_worker_loop" for func, _ in frames):
        return False  # a DataLoader worker process: the loader's own, not the rank's wait
    if any("torch/utils/data/_utils/fetch.py" in path for _, path in frames):
        return True
    if not frames or frames[0][0] not in _WAITS:
        return False
    for func, path in frames:
        if any(s in path for s in _STDLIB):
            continue
        return "torch/utils/data/" in path or (
            func in ("__next__", "_next_data", "_get_data", "_try_get_data")
            and ("/data/" in path or "data" in path.rsplit("/", 1)[-1])
        )
    return False


class StackParser:
    triggers = (b'"MainThread"', b"(most recent call first):", b"Process ")

    def __init__(self) -> None:
        self._open: tuple[Line, Prefix, str, list[tuple[str, str]]] | None = None
        self._pid: int | None = None  # the process of the py-spy dump being read

    def feed(self, line: Line, pre: Prefix, follow) -> list[Event]:
        text = pre.rest
        if text.startswith("Process "):
            m = _PYSPY_PROCESS.match(text)
            if m:
                # The next dump's header: what was open belongs to the previous process.
                out = self.flush() if self._open is not None else []
                self._pid = int(m.group("pid"))
                return out
        if self._open is not None:
            m = _PYSPY_FRAME.match(text) or _FH_FRAME.match(text)
            frames = self._open[3]
            if m and len(frames) < MAX_FRAMES:
                frames.append((m.group("func"), m.group("file")))
                follow(1)
                return []
            out = self.flush()
            return out + self._start(line, pre, text, follow)
        return self._start(line, pre, text, follow)

    def _start(self, line: Line, pre: Prefix, text: str, follow) -> list[Event]:
        if "MainThread" in text:
            m = _PYSPY_HEAD.match(text.strip())
            if m and m.group("name") == "MainThread":
                self._open = (line, pre, "MainThread", [])
                follow(1)
            return []
        if "most recent call first" in text:
            m = _FH_HEAD.match(text.strip())
            if m:
                self._open = (line, pre, "current" if m.group("current") else "thread", [])
                follow(1)
        return []

    def flush(self) -> list[Event]:
        if self._open is None:
            return []
        head, pre, thread, frames = self._open
        self._open = None
        if not frames:
            return []
        return [
            StackSample(
                line=head.number,
                text=head.text,
                rank=pre.rank,
                thread=thread,
                frames=tuple(f"{func} ({path})" for func, path in frames[:MAX_FRAMES]),
                # The main thread's wait is the rank's; a helper thread (pin_memory, a loader's
                # feeder) waits on its queue by design, whatever the rank does.
                waits_on_data=thread in ("MainThread", "current") and waits_on_data(frames),
                pid=self._pid if thread == "MainThread" else None,
            )
        ]
