"""The diagnosis core's vocabulary: culprit classes and the shape of a verdict."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

# The fixed culprit vocabulary of DESIGN.md. Order matters only for display.
CULPRITS: tuple[str, ...] = (
    "bad_node_hardware",
    "network_transport",
    "storage_io",
    "dataloader_cpu",
    "rank_desync_code",
    "parallelism_config",
    "oom_or_crash",
    "timeout_too_short",
    "software_version",
    "unknown",
)


@dataclass(frozen=True, slots=True)
class Evidence:
    file: str
    line: int
    signal: str  # the name of the signal this line shows, e.g. "lagging_rank"
    text: str


@dataclass(frozen=True, slots=True)
class Suspect:
    kind: str  # rank | host | gpu | config | pg
    id: str
    why: str


@dataclass(frozen=True, slots=True)
class Alternative:
    culprit: str
    confidence: float


@dataclass(frozen=True, slots=True)
class RuleMatch:
    """One rule that matched, named or not: fleet memory counts weak signs too, because
    recurrence is what turns a weak sign into a culprit."""

    rule_id: str
    culprit: str
    confidence: float


@dataclass(frozen=True, slots=True)
class IncidentContext:
    """What the server (or the CLI) knows beyond the events themselves."""

    world_size: int | None = None
    rank_hosts: dict[int, str] = field(default_factory=dict)  # rank -> hostname
    ranks_uploaded: frozenset[int] = frozenset()  # ranks whose own logs arrived


@dataclass(frozen=True, slots=True)
class Verdict:
    culprit: str
    confidence: float
    summary: str
    fix: str
    failed: bool  # the artifacts show a failure at all (timeout, crash, error)
    suspects: tuple[Suspect, ...] = ()
    evidence: tuple[Evidence, ...] = ()
    alternatives: tuple[Alternative, ...] = ()
    rule_ids: tuple[str, ...] = ()
    ruleset_version: str = ""
    matches: tuple[RuleMatch, ...] = ()
    # The naming rule and its summary with volatile tokens as placeholders (signature.py): what
    # makes two incidents the same cause, with the implicated entity (fleet memory).
    signature: str = ""

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        for key in ("suspects", "evidence", "alternatives", "rule_ids", "matches"):
            out[key] = list(out[key])
        return out
