"""Accuracy: the diagnosis core on the corpus's held-out split, as `fleetwatch eval --split test`
scores it. Rows are figures against the goals issue 14 set (a missed goal is reported, never a
failure); the gates check the measurement itself: every case was diagnosed and every case's side
is frozen in split.json."""

from __future__ import annotations

from analysis.corpus import cases_on, load_cases, load_split
from analysis.corpus.evaluate import evaluate

from .report import scenario


def run(*, quick: bool, say) -> list[dict]:
    split = load_split()
    cases = cases_on("test")
    say(f"accuracy: {len(cases)} held-out cases" + ("" if quick else ", with perturbations"))
    figures = evaluate(cases, perturb=not quick)
    frozen = sum(c.id in split["assignments"] for c in load_cases())
    rows = [
        scenario(
            "accuracy",
            "held-out cases diagnosed",
            float(figures["cases"]),
            "held-out cases in the corpus",
            float(len(cases)),
            "==",
            1,
            gate=True,
        ),
        scenario(
            "accuracy",
            "cases whose side is frozen in split.json",
            float(frozen),
            "cases in the corpus",
            float(len(load_cases())),
            "==",
            1,
            gate=True,
        ),
        scenario(
            "accuracy",
            "named culprits that are right (precision)",
            float(figures["right"]),
            "culprits named",
            float(figures["named"]),
            ">=",
            0.9,
        ),
        scenario(
            "accuracy",
            "known-cause cases with a culprit named (coverage)",
            round((figures["coverage"] or 0) * figures["known_cause"]),
            "known-cause cases",
            float(figures["known_cause"]),
            ">=",
            0.5,
        ),
        scenario(
            "accuracy",
            "unknown-labelled cases left unnamed (abstention)",
            round((figures["abstention_on_unknown"] or 0) * figures["unknown_labelled"]),
            "unknown-labelled cases",
            float(figures["unknown_labelled"]),
            "==",
            1,
        ),
        scenario(
            "accuracy",
            "1 - expected calibration error of confidence",
            1 - (figures["ece"] or 0),
            "perfect calibration",
            1.0,
            ">=",
            0.9,
        ),
    ]
    if "perturbation_flips" in figures:
        rows.append(
            scenario(
                "accuracy",
                "cases whose perturbed verdicts never flip to another culprit",
                float(
                    figures["cases"] - len({f.split()[0] for f in figures["perturbation_flips"]})
                ),
                "held-out cases",
                float(figures["cases"]),
                "==",
                1,
                note="; ".join(figures["perturbation_flips"][:5]),
            )
        )
    return rows
