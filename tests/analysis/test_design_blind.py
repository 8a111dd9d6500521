"""The five DESIGN.md stories, three ways each, written blind to the rules (README.md beside the
cases says by whom and how): every rank's artifacts in their own directory, and what a right
diagnosis must say in expected.json.

A case that the core gets wrong today is tabled in KNOWN_MISSES with what it answers instead, and
the test holds that too: fixing a miss (or breaking a right case) fails until the table is
updated, so the table is always the truth.
"""

import json
from pathlib import Path

import pytest

from fleet.cli import diagnose

ROOT = Path(__file__).resolve().parent / "design_blind"
CASES = sorted(p for p in ROOT.iterdir() if (p / "expected.json").exists()) if ROOT.exists() else []

# case -> (the culprit it gets today, the first rank it suspects): measured, not wished. Empty
# since ruleset 2026.11.25: all fifteen are right.
KNOWN_MISSES: dict[str, tuple[str, int | None]] = {}


def rank_suspects(verdict) -> list[int]:
    return [int(s.id) for s in verdict.suspects if s.kind == "rank" and s.id.isdigit()]


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_a_design_story_told_blind_gets_its_culprit_and_rank(case):
    expected = json.loads((case / "expected.json").read_text())
    verdict = diagnose(
        [str(p) for p in sorted(case.rglob("*")) if p.is_file() and p.name != "expected.json"],
        jobs=1,
    )
    if case.name in KNOWN_MISSES:
        ranks = rank_suspects(verdict)
        assert (verdict.culprit, ranks[0] if ranks else None) == KNOWN_MISSES[case.name]
        return
    assert verdict.culprit in {expected["culprit"], *expected.get("also_right", [])}, (
        verdict.summary
    )
    if expected.get("culprit_rank") is not None and verdict.culprit == expected["culprit"]:
        assert rank_suspects(verdict)[:1] == [expected["culprit_rank"]], verdict.suspects
