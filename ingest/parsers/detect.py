"""Guess what kind of artifact some bytes are, from their first few kilobytes."""

from __future__ import annotations

import zlib

KINDS = ("log", "fr_dump", "trace", "hw_stats", "unknown")
SNIFF_BYTES = 64 * 1024
# Control characters a text log does not hold (tab, newline, vertical tab, form feed and carriage
# return are text).
_CONTROL = bytes(b for b in range(32) if not 9 <= b <= 13)


def inflate_head(head: bytes, limit: int = SNIFF_BYTES) -> bytes:
    """The first ``limit`` bytes of a gzip stream (empty if it is not one or is damaged)."""
    try:
        return zlib.decompressobj(16 + zlib.MAX_WBITS).decompress(head, limit)
    except zlib.error:
        return b""


def looks_binary(sample: bytes) -> bool:
    """Text logs have no NUL bytes and few control characters; dumps and garbage do."""
    if not sample:
        return False
    if b"\x00" in sample:
        return True
    # Counted in C: every upload and every parse sniffs its head, and a loop over 4 KB in
    # Python was 5% of receiving an upload.
    control = len(sample) - len(sample.translate(None, _CONTROL))
    return control / len(sample) > 0.05


def detect_kind(head: bytes, filename: str = "") -> str:
    """``head`` is the start of the (decompressed) content."""
    name = filename.lower().removesuffix(".gz")
    stripped = head.lstrip()
    # Flight Recorder dumps: pickle (protocol 2+ starts with 0x80) or JSON with FR keys.
    if head[:1] == b"\x80" and len(head) > 1 and head[1] <= 5:
        return "fr_dump"
    if stripped[:1] == b"{":
        if b'"traceEvents"' in head or b'"deviceProperties"' in head:
            return "trace"
        if b'"entries"' in head and (b'"pg_config"' in head or b'"version"' in head):
            return "fr_dump"
        # A dump of a rank that recorded nothing (2.10 JSON) has no "entries" key at all. Its
        # "pg_status" / "comm_lib_version" are the Flight Recorder's own; "pg_config" alone is
        # not (a Kineto trace's distributedInfo has one too).
        if b'"pg_status"' in head or b'"comm_lib_version"' in head:
            return "fr_dump"
        if b'"nvml"' in head or b'"gpus"' in head or b'"hw_stats"' in head:
            return "hw_stats"
    if name.endswith(".csv") and b"utilization.gpu" in head[:2048]:
        return "hw_stats"
    if name.endswith((".pt.trace.json", ".trace.json")):
        return "trace"
    if looks_binary(head[:4096]):
        return "unknown"
    return "log"


def is_gzip(head: bytes) -> bool:
    return head[:2] == b"\x1f\x8b"


__all__ = ["KINDS", "detect_kind", "inflate_head", "is_gzip", "looks_binary"]
