"""The ruleset: each rule is data plus one predicate over the facts.

Bump RULESET_VERSION whenever a rule's meaning changes; incidents store the version that
classified them, so old verdicts never move silently.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from .facts import Facts
from .model import Evidence, Suspect

RULESET_VERSION = "2026.11.0"


@dataclass(frozen=True)
class Rule:
    id: str
    description: str
    needs: tuple[str, ...]  # the signals the rule reads, for documentation and the UI
    culprit: str
    confidence: float
    fix: str
    predicate: Callable[[Facts], Match | None] = field(repr=False, compare=False)
    marks_failure: bool = False

    def evaluate(self, facts: Facts) -> Match | None:
        match = self.predicate(facts)
        if match is None:
            return None
        return Match(
            rule=self,
            confidence=match.confidence if match.confidence else self.confidence,
            summary=match.summary,
            evidence=match.evidence,
            suspects=match.suspects,
        )


@dataclass(frozen=True)
class Match:
    rule: Rule | None = None
    confidence: float = 0.0
    summary: str = ""
    evidence: tuple[Evidence, ...] = ()
    suspects: tuple[Suspect, ...] = ()


RULES: tuple[Rule, ...] = ()
