"""The small JSON documents the agent and the torch integration upload as ``hw_stats``.

One document carries a list of typed records; ``ingest/parsers/hw_stats.py`` turns each into
an event. Record types: ``gpu`` (NVML readings of one GPU), ``reader`` (a reader that had
nothing to read, and why), ``host`` (CPU, memory, disk, network), ``agent`` (spool losses),
``data_order`` (a rank's dataset at an epoch start), ``progress_stall`` (a rank's heartbeat
stopped), ``collective_failure`` (a collective raised in the training process).
"""

from __future__ import annotations

import json
import time

FORMAT = "fleetwatch.hw_stats/1"


def document(records: list[dict], *, host: str, job: str, attempt: int, rank=None, now=None):
    return {
        "hw_stats": FORMAT,
        "host": host,
        "job": job,
        "attempt": attempt,
        "rank": rank,
        "at": time.time() if now is None else now,
        "records": records,
    }


def encode(doc: dict) -> bytes:
    return json.dumps(doc, separators=(",", ":"), sort_keys=True, default=str).encode()


def upload_header(
    *, host: str, job: str, attempt: int, rank, kind: str, filename: str, **extra
) -> dict:
    return {
        "endpoint": "uploads",
        "host": host,
        "job": job,
        "attempt": int(attempt or 0),
        "rank": rank,
        "kind": kind,
        "filename": filename[:255],
        **extra,
    }


def attempt_header(**extra) -> dict:
    return {"endpoint": "attempts", **extra}
