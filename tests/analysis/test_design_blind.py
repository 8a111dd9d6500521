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

# case -> (the culprit it gets today, the first rank it suspects): measured, not wished. The
# first fifteen (-a, -b, -c) are all right since ruleset 2026.11.25. The ten -d/-e cases were
# written later by another blind helper and scored before anything was read: 5 of 10 right, one
# wrong (5-d named oom_or_crash from a survivor's NCCL error after its peer closed the
# connection) and one abstained on nvidia-smi's driver CUDA read as the runtime's; both fixed
# since (README.md). These abstain:
KNOWN_MISSES: dict[str, tuple[str, int | None]] = {
    # rank 0 never joined (its Flight Recorder stops a seq early) but its own slowdown shows only
    # as tokens/s and its mount only in nfsiostat, neither of which is read.
    "1_fsdp_rank0_logging-e": ("unknown", 0),
    # same SeqNum, same op, different sizes: watchdog_op_mismatch fires but measured 0 of 1 on dev.
    "2_unseeded_split_save_hang-d": ("unknown", None),
    "2_unseeded_split_save_hang-e": ("unknown", None),
}


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
