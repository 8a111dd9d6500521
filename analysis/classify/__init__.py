"""The pure diagnosis core: events from every rank in, one verdict with evidence out.

No Django here (tests/test_layering.py); the server's classify task and ``fleetwatch diagnose``
call the same ``classify``.
"""

from .engine import ALL_RULES, classify
from .model import (
    CULPRITS,
    Alternative,
    Evidence,
    IncidentContext,
    RuleMatch,
    Suspect,
    Verdict,
)
from .rules import RULES, RULESET_VERSION

__all__ = [
    "ALL_RULES",
    "CULPRITS",
    "RULES",
    "RULESET_VERSION",
    "Alternative",
    "Evidence",
    "IncidentContext",
    "RuleMatch",
    "Suspect",
    "Verdict",
    "classify",
]
