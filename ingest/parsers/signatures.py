"""Known failure signatures: storage stalls in kernel logs and known library bugs in stacks.

Each signature is data — an id, the literal that triggers it, a regex, and what it means — so
adding one is a one-line change with a test, never a new code path.
"""

from __future__ import annotations

import functools
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from .events import Event, register
from .kernel import line_clock
from .lines import Line
from .prefix import Prefix


@dataclass(frozen=True, slots=True, kw_only=True)
class StorageStall(Event):
    """The host's storage stopped answering: NFS/Lustre timeouts, tasks blocked in I/O."""

    kind: ClassVar[str] = "storage_stall"
    signature: str = ""
    mount: str = ""  # server or mount point when the line names it
    clock: str = ""  # the kernel line's clock (kernel.line_clock): "boot", "wall", "syslog"
    at: float | None = None
    task: str = ""  # the hung task's command name ("python", "rsync", "jbd2/sdb1-8")
    pid: int | None = None  # and its pid


@dataclass(frozen=True, slots=True, kw_only=True)
class StorageRecovered(Event):
    """The storage answered again: ``nfs: server fs01 OK`` after ``not responding``."""

    kind: ClassVar[str] = "storage_recovered"
    signature: str = ""
    mount: str = ""
    clock: str = ""
    at: float | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class KnownSignature(Event):
    """A line that matches a known bug of a library version (NCCL, PyTorch, driver)."""

    kind: ClassVar[str] = "known_signature"
    signature: str = ""
    culprit: str = ""


register(StorageStall)
register(StorageRecovered)
register(KnownSignature)


@dataclass(frozen=True)
class Signature:
    id: str
    trigger: bytes
    pattern: re.Pattern[str]
    event: type[Event]
    culprit: str = ""
    meaning: str = ""


STORAGE = (
    # Linux NFS client (all kernels, fs/nfs/client.c and sunrpc): "nfs: server fs01 not
    # responding, still trying" (or "…, timed out"), and "nfs: server fs01 OK" once it answers.
    Signature(
        "nfs_not_responding",
        b"nfs: server",
        re.compile(r"nfs: server (?P<mount>\S+) not responding"),
        StorageStall,
    ),
    Signature(
        "nfs_ok",
        b"nfs: server",
        re.compile(r"nfs: server (?P<mount>\S+) OK\b"),
        StorageRecovered,
    ),
    # Linux hung-task detector: "INFO: task python:1234 blocked for more than 120 seconds."
    Signature(
        "hung_task",
        b"blocked for more than",
        re.compile(r"INFO: task (?P<task>\S+?):(?P<pid>\d+) blocked for more than \d+ seconds"),
        StorageStall,
    ),
    # Lustre client: "LustreError: ... lost connection" / "Connection to fs-OST0003 ... was lost"
    Signature(
        "lustre_connection_lost",
        b"Lustre",
        re.compile(
            r"Lustre(?:Error)?:.*?(?:Connection to (?P<mount>\S+).*?was lost|"
            r"evicted|timed out for slow reply)"
        ),
        StorageStall,
    ),
    # ext4/xfs and the block layer: I/O errors under a training write
    Signature(
        "block_io_error",
        b"I/O error",
        re.compile(
            r"(?:blk_update_request|Buffer I/O error on dev(?:ice)? (?P<mount>\S+)|"
            r"EXT4-fs error|XFS .*I/O error)"
        ),
        StorageStall,
    ),
)

KNOWN_BUGS = (
    # NCCL 2.19-2.20 work-FIFO leak: with CUDA graphs, enqueue spins in waitWorkFifoAvailable
    # until every rank stalls (NVIDIA/nccl#1251; fixed in 2.21).
    Signature(
        "nccl_work_fifo_stall",
        b"waitWorkFifoAvailable",
        re.compile(r"\bwaitWorkFifoAvailable\b"),
        KnownSignature,
        "software_version",
        "NCCL work FIFO full: known NCCL 2.19/2.20 leak with CUDA graphs",
    ),
)

# The known-issues knowledge base (known_issues.json): NCCL/PyTorch/driver bugs and environment
# faults with the versions they affect and the release that fixed them, each sourced from release
# notes or a maintainer's word. Entries with a log signature become signatures here; the
# version-only ones are read by the diagnosis core (analysis/classify/rules.py).
KNOWLEDGE_FILE = Path(__file__).with_name("known_issues.json")


@functools.cache
def known_issues() -> dict[str, dict]:
    entries = json.loads(KNOWLEDGE_FILE.read_text())["entries"]
    return {entry["id"]: entry for entry in entries}


def _knowledge_signatures() -> tuple[Signature, ...]:
    out = []
    for entry in known_issues().values():
        sig = entry.get("signature")
        if not sig or not sig.get("trigger"):
            continue
        pattern = re.compile(sig.get("regex") or re.escape(sig["trigger"]))
        out.append(
            Signature(
                entry["id"],
                sig["trigger"].encode(),
                pattern,
                KnownSignature,
                entry["culprit"],
                entry["title"],
            )
        )
    return tuple(out)


SIGNATURES = STORAGE + KNOWN_BUGS + _knowledge_signatures()


_DECODED = tuple((s.trigger.decode(), s) for s in SIGNATURES)


class SignatureParser:
    triggers = tuple(sorted({s.trigger for s in SIGNATURES}))

    def feed(self, line: Line, pre: Prefix, follow) -> list[Event]:
        text = pre.rest
        for word, sig in _DECODED:
            if word not in text:
                continue
            m = sig.pattern.search(text)
            if not m:
                continue
            if sig.event is StorageStall or sig.event is StorageRecovered:
                found = m.groupdict()
                mount = (found.get("mount") or "").rstrip(",;:")[:200]
                clock = line_clock(line.text) or line_clock(text)
                extra = {}
                if sig.event is StorageStall and found.get("task"):
                    extra = {"task": found["task"][:64], "pid": int(found["pid"])}
                return [
                    sig.event(
                        line=line.number,
                        text=line.text,
                        rank=pre.rank,
                        signature=sig.id,
                        mount=mount,
                        clock=clock[0] if clock else "",
                        at=clock[1] if clock else None,
                        **extra,
                    )
                ]
            return [
                KnownSignature(
                    line=line.number,
                    text=line.text,
                    rank=pre.rank,
                    signature=sig.id,
                    culprit=sig.culprit,
                )
            ]
        return []

    def flush(self) -> list[Event]:
        return []
