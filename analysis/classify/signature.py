"""A verdict's signature: its naming rule's summary with the volatile tokens replaced by
placeholders, as Sentry groups events. Two incidents share a fingerprint only when the same rule
named the same cause with the same shape of evidence; ranks, sequence numbers, sizes, times,
addresses and paths never make two causes look different, and never make two look the same.

The patterns are applied in order, each named for what it stands for.
"""

from __future__ import annotations

import re

_PATTERNS: tuple[tuple[str, re.Pattern[str]], ...] = (
    # filesystem paths (a checkpoint dir, a dump file): one job's, not the cause's
    ("<path>", re.compile(r"(?:[A-Za-z]:)?(?:/[\w.\-]+){2,}/?")),
    # IPv4 with an optional port, IPv6, and NCCL's "addr<port>" form
    (
        "<addr>",
        re.compile(
            r"\b\d{1,3}(?:\.\d{1,3}){3}(?:[:<]\d+>?)?|\b[0-9a-f]{0,4}(?::[0-9a-f]{0,4}){2,7}\b",
            re.I,
        ),
    ),
    # pointers, comm ids, bus ids written in hex
    ("<hex>", re.compile(r"\b0x[0-9a-f]+\b|\b[0-9a-f]{8,}\b", re.I)),
    # lists of ranks ("rank 1, 2, 3 and 5 more"): how many ranks waited is not the cause
    ("<ranks>", re.compile(r"\b\d+(?:\s*(?:,|and)\s*\d+)+(?:\s+and\s+\d+\s+more)?")),
    # every other number, with its unit or percent sign
    ("<n>", re.compile(r"\b\d+(?:\.\d+)?(?:\s*(?:ms|s|x|%|GiB|MiB|KiB|GB|MB|KB|B)\b)?")),
)
MAX_SIGNATURE = 200


def parameterise(text: str) -> str:
    out = text
    for placeholder, pattern in _PATTERNS:
        out = pattern.sub(placeholder, out)
    # One rank or several is the same shape of evidence.
    out = out.replace("<ranks>", "<n>")
    return re.sub(r"\s+", " ", out).strip()[:MAX_SIGNATURE]
