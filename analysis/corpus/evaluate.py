"""Score the diagnosis core on the labelled corpus: ``fleetwatch eval``.

What it reports, on one split (``dev``, ``test`` or ``all``):

- precision when a culprit is named (right = the thread's primary or secondary cause);
- coverage: the share of known-cause cases where a culprit is named, and recall (named right);
- abstention on ``unknown``-labelled cases: no culprit named at confidence >= 0.5;
- per-class precision and coverage, and the confusion matrix (label x verdict);
- calibration of ``confidence``: a reliability table and the expected calibration error;
- per rule: how often it fired, named the verdict, and was right when it did;
- perturbations: each case again with 20 % of its lines dropped, its ranks' lines interleaved
  in another order, its clock shifted, its lines pushed past the first 2 MiB, and only one
  rank's lines kept. A verdict may fall to ``unknown``; it must never flip to another culprit.

Pure: no Django. Cases are diagnosed as ``fleetwatch diagnose`` diagnoses files.
"""

from __future__ import annotations

import itertools
import random
import re
import tempfile
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ingest.parsers.prefix import split_prefix

from . import Case

NAMED_AT = 0.5  # a verdict names a culprit at this confidence (rules.NAME_THRESHOLD)
CALIBRATION_BINS = (0.5, 0.6, 0.7, 0.8, 0.9, 1.01)
# The 2 MiB head in which ingest.parsers.log looks for start-up settings (HEAD_BYTES), plus room.
PAST_HEAD_BYTES = (2 << 20) + 4096


@dataclass(frozen=True)
class Outcome:
    case: Case
    culprit: str
    confidence: float
    rule_ids: tuple[str, ...]
    naming_rule: str | None

    @property
    def named(self) -> bool:
        return self.culprit != "unknown" and self.confidence >= NAMED_AT

    @property
    def right(self) -> bool:
        return self.named and self.culprit in self.case.accepted


def diagnose_text(name: str, text: str):
    """The verdict ``fleetwatch diagnose`` gives for one file holding ``text``."""
    from fleet.cli import diagnose

    with tempfile.TemporaryDirectory(prefix="fleetwatch-eval-") as tmp:
        path = Path(tmp) / name
        path.write_text(text, encoding="utf-8", errors="surrogateescape")
        return diagnose([str(path)], jobs=1)


def _naming_rule(verdict) -> str | None:
    if verdict.culprit == "unknown":
        return None
    for match in verdict.matches:
        if match.culprit == verdict.culprit:
            return match.rule_id
    return None


def outcome_of(case: Case, verdict) -> Outcome:
    return Outcome(
        case=case,
        culprit=verdict.culprit,
        confidence=verdict.confidence,
        rule_ids=tuple(verdict.rule_ids),
        naming_rule=_naming_rule(verdict),
    )


def case_text(case: Case) -> str:
    return case.log_path.read_text(encoding="utf-8", errors="surrogateescape")


# --- perturbations -----------------------------------------------------------------------------

_RANK_IN_LINE = re.compile(r"\[(?:PG[^\]]*?)?\s*Rank (\d+)\]|\brank(\d+)\]?:")
_CLOCK = re.compile(r"\b([01]\d|2[0-3]):([0-5]\d):([0-5]\d)\b")


def line_rank(line: str) -> int | None:
    rank = split_prefix(line).rank
    if rank is not None:
        return rank
    m = _RANK_IN_LINE.search(line)
    if m:
        return int(m.group(1) or m.group(2))
    return None


def drop_lines(text: str, rng: random.Random, share: float = 0.2) -> str:
    return "\n".join(line for line in text.split("\n") if rng.random() >= share)


def shuffle_ranks(text: str, rng: random.Random) -> str:
    """Interleave the ranks' lines in another order; each rank keeps its own order and lines
    that name no rank stay where they were relative to the rank they follow."""
    blocks: dict[int | None, list[str]] = defaultdict(list)
    order: list[int | None] = []
    current: int | None = None
    for line in text.split("\n"):
        rank = line_rank(line)
        if rank is not None:
            current = rank
        if current not in blocks:
            order.append(current)
        blocks[current].append(line)
    queues = {key: list(lines) for key, lines in blocks.items()}
    out: list[str] = []
    keys = [k for k in order if queues[k]]
    while keys:
        key = rng.choice(keys)
        take = rng.randint(1, 3)
        out.extend(queues[key][:take])
        del queues[key][:take]
        keys = [k for k in keys if queues[k]]
    return "\n".join(out)


def shift_clock(text: str, hours: int = 5, minutes: int = 17) -> str:
    def shifted(m: re.Match) -> str:
        total = (int(m.group(1)) * 60 + int(m.group(2)) + hours * 60 + minutes) % (24 * 60)
        return f"{total // 60:02d}:{total % 60:02d}:{m.group(3)}"

    return _CLOCK.sub(shifted, text)


def past_head(text: str) -> str:
    """Push every line past the head in which start-up settings are read, behind ordinary
    training chatter that carries no signal."""
    noise_line = "INFO train.py:214 heartbeat: data iterator alive, queue depth nominal\n"
    noise = noise_line * (PAST_HEAD_BYTES // len(noise_line) + 1)
    return noise + text


def one_rank(text: str) -> str:
    """Keep the lines of the lowest rank named (and the lines that name no rank)."""
    lines = text.split("\n")
    ranks = sorted({r for r in map(line_rank, lines) if r is not None})
    if len(ranks) < 2:
        return text
    keep = ranks[0]
    return "\n".join(line for line in lines if line_rank(line) in (None, keep))


def perturbations(case: Case) -> dict[str, Callable[[str], str]]:
    seed = sum(map(ord, case.id))
    return {
        "drop_20pct": lambda t: drop_lines(t, random.Random(seed)),
        "shuffle_ranks": lambda t: shuffle_ranks(t, random.Random(seed + 1)),
        "shift_clock": shift_clock,
        "past_2mib": past_head,
        "one_rank": one_rank,
    }


@dataclass(frozen=True)
class Flip:
    case_id: str
    perturbation: str
    before: str
    after: str


def perturbation_flips(case: Case, base: Outcome) -> list[Flip]:
    """Perturbed verdicts that name a different culprit than the case's own verdict (falling
    to ``unknown`` is allowed; so is staying the same)."""
    text = case_text(case)
    flips = []
    for name, perturb in perturbations(case).items():
        changed = perturb(text)
        if changed == text:
            continue
        after = outcome_of(case, diagnose_text(case.log_path.name, changed))
        if after.named and after.culprit != (base.culprit if base.named else None):
            flips.append(Flip(case.id, name, base.culprit, after.culprit))
    return flips


# --- figures ------------------------------------------------------------------------------------


def _ratio(num: int, den: int) -> float | None:
    return round(num / den, 3) if den else None


def calibration(outcomes: Iterable[Outcome]) -> tuple[list[dict[str, Any]], float | None]:
    """Reliability table over named verdicts and the expected calibration error."""
    named = [o for o in outcomes if o.named]
    rows, ece = [], 0.0
    for low, high in itertools.pairwise(CALIBRATION_BINS):
        inside = [o for o in named if low <= o.confidence < high]
        if not inside:
            continue
        mean_conf = sum(o.confidence for o in inside) / len(inside)
        accuracy = sum(o.right for o in inside) / len(inside)
        rows.append(
            {
                "bin": f"{low:.1f}–{min(high, 1.0):.1f}",
                "cases": len(inside),
                "mean_confidence": round(mean_conf, 3),
                "accuracy": round(accuracy, 3),
            }
        )
        ece += len(inside) / len(named) * abs(mean_conf - accuracy)
    return rows, (round(ece, 3) if named else None)


def report(outcomes: list[Outcome], flips: list[Flip] | None = None) -> dict[str, Any]:
    known = [o for o in outcomes if o.case.known_cause]
    unknown = [o for o in outcomes if not o.case.known_cause]
    named = [o for o in outcomes if o.named]
    right = [o for o in named if o.right]
    classes = sorted({o.case.primary for o in outcomes} | {o.culprit for o in outcomes})
    per_class = {}
    for culprit in classes:
        labelled = [o for o in known if o.case.primary == culprit]
        said = [o for o in named if o.culprit == culprit]
        per_class[culprit] = {
            "cases": len(labelled),
            "named": len(said),
            "precision": _ratio(sum(o.right for o in said), len(said)),
            "coverage": _ratio(sum(o.named for o in labelled), len(labelled)),
            "recall": _ratio(sum(o.right for o in labelled), len(labelled)),
        }
    confusion: dict[str, Counter] = defaultdict(Counter)
    for o in outcomes:
        confusion[o.case.primary][o.culprit if o.named else "unknown"] += 1
    rules: dict[str, dict[str, int]] = defaultdict(lambda: Counter())
    for o in outcomes:
        for rule_id in o.rule_ids:
            rules[rule_id]["fired"] += 1
        if o.naming_rule:
            rules[o.naming_rule]["named"] += 1
            rules[o.naming_rule]["right"] += o.right
    table, ece = calibration(outcomes)
    out: dict[str, Any] = {
        "cases": len(outcomes),
        "known_cause": len(known),
        "unknown_labelled": len(unknown),
        "named": len(named),
        "right": len(right),
        "precision": _ratio(len(right), len(named)),
        "coverage": _ratio(sum(o.named for o in known), len(known)),
        "recall": _ratio(sum(o.right for o in known), len(known)),
        "abstention_on_unknown": _ratio(sum(not o.named for o in unknown), len(unknown)),
        "named_on_unknown": sorted(o.case.id for o in unknown if o.named),
        "per_class": per_class,
        "confusion": {label: dict(row) for label, row in sorted(confusion.items())},
        "calibration": table,
        "ece": ece,
        "rules": {
            rule_id: {
                "fired": counts["fired"],
                "named": counts["named"],
                "precision": _ratio(counts["right"], counts["named"]),
            }
            for rule_id, counts in sorted(rules.items())
        },
        "wrong": sorted(
            f"{o.case.id}: said {o.culprit} ({o.naming_rule}), labelled {o.case.primary}"
            for o in named
            if not o.right
        ),
    }
    if flips is not None:
        out["perturbation_flips"] = [
            f"{f.case_id} {f.perturbation}: {f.before} -> {f.after}" for f in flips
        ]
    return out


def calibration_table(outcomes: Iterable[Outcome]) -> dict[str, dict[str, int]]:
    """Per rule: how often it named the verdict and how often that was right."""
    table: dict[str, dict[str, int]] = {}
    for o in outcomes:
        if o.naming_rule:
            row = table.setdefault(o.naming_rule, {"named": 0, "right": 0})
            row["named"] += 1
            row["right"] += o.right
    return dict(sorted(table.items()))


def calibrate(cases: list[Case]) -> dict[str, Any]:
    """Measure every rule at its stated strength on these (dev) cases: the table the engine
    turns into the confidence it reports."""
    from analysis.classify.engine import uncalibrated
    from analysis.classify.rules import RULESET_VERSION

    with uncalibrated():
        outcomes = [outcome_of(c, diagnose_text(c.log_path.name, case_text(c))) for c in cases]
    return {
        "ruleset_version": RULESET_VERSION,
        "measured_on": f"the corpus's dev split, {len(cases)} cases",
        "rules": calibration_table(outcomes),
    }


def similar_figures(cases: list[Case]) -> dict[str, Any]:
    """How often the closest resolved public case (leave-one-out: never the case itself) has the
    case's own cause, when one is offered at all."""
    from .similar import OFFER_AT, case_templates, similar_to

    offered = right = 0
    for case in cases:
        if not case.known_cause:
            continue
        # The index parsed every known-cause case already: no second parse of each log.
        top = similar_to(case_templates(case.id) or frozenset(), exclude=case.id, most=1)
        if top:
            offered += 1
            right += top[0].culprit in case.accepted
    known = sum(c.known_cause for c in cases)
    return {
        "offer_at": OFFER_AT,
        "offered": offered,
        "offered_share": _ratio(offered, known),
        "top1_right": right,
        "top1_precision": _ratio(right, offered),
    }


def evaluate(cases: list[Case], *, perturb: bool = True) -> dict[str, Any]:
    outcomes, flips = [], []
    for case in cases:
        base = outcome_of(case, diagnose_text(case.log_path.name, case_text(case)))
        outcomes.append(base)
        if perturb:
            flips.extend(perturbation_flips(case, base))
    figures = report(outcomes, flips if perturb else None)
    figures["similar"] = similar_figures(cases)
    return figures


def render(figures: dict[str, Any], split: str) -> str:
    def pct(value):
        return "—" if value is None else f"{value:.2f}"

    lines = [
        f"split {split}: {figures['cases']} cases ({figures['known_cause']} with a known cause, "
        f"{figures['unknown_labelled']} labelled unknown)",
        f"  precision when named  {pct(figures['precision'])}  "
        f"({figures['right']} right of {figures['named']} named)",
        f"  coverage              {pct(figures['coverage'])}  (recall {pct(figures['recall'])})",
        f"  abstention on unknown {pct(figures['abstention_on_unknown'])}",
        f"  calibration error     {pct(figures['ece'])}",
    ]
    if "perturbation_flips" in figures:
        lines.append(f"  perturbation flips    {len(figures['perturbation_flips'])}")
    sim = figures.get("similar")
    if sim:
        lines.append(
            f"  similar public case   offered for {sim['offered']} known-cause cases "
            f"(similarity >= {sim['offer_at']}), its cause right {pct(sim['top1_precision'])}"
        )
    lines.append("  per class (cases, named, precision, coverage):")
    for culprit, row in figures["per_class"].items():
        lines.append(
            f"    {culprit:20s} {row['cases']:4d} {row['named']:4d}  {pct(row['precision'])}"
            f"  {pct(row['coverage'])}"
        )
    lines.append("  calibration (bin, cases, mean confidence, accuracy):")
    for row in figures["calibration"]:
        lines.append(
            f"    {row['bin']}  {row['cases']:4d}  {row['mean_confidence']:.2f}  "
            f"{row['accuracy']:.2f}"
        )
    lines.append("  rules (fired, named, precision when naming):")
    for rule_id, row in figures["rules"].items():
        lines.append(
            f"    {rule_id:34s} {row['fired']:4d} {row['named']:4d}  {pct(row['precision'])}"
        )
    return "\n".join(lines)
