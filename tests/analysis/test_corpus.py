"""The labelled corpus of real incidents (analysis/corpus), scored as `fleetwatch eval` scores it.

No case is special-cased: these tests hold the core to figures over whole splits, so a rule that
fits one case and breaks others fails them. The figures are floors under what `fleetwatch eval`
measured when the rules were last changed (README.md, "Accuracy"); raise them as the core gets
better, never lower them to let a change land.
"""

import json

import pytest

from analysis.classify.model import CULPRITS
from analysis.corpus import CASES, cases_on, hashed_side, load_cases, load_split, side_of
from analysis.corpus.evaluate import evaluate, one_rank, past_head, shift_clock, shuffle_ranks

VOCABULARY = set(CULPRITS)


def test_every_case_has_its_log_a_label_from_the_vocabulary_and_a_source():
    cases = load_cases()
    assert len(cases) >= 100
    for case in cases:
        assert case.log_path.exists(), case.id
        assert case.log_path.read_text(errors="replace").strip(), case.id
        assert case.primary in VOCABULARY, case.id
        assert case.secondary in VOCABULARY | {None}, case.id
        assert case.source_url.startswith("https://"), case.id
        assert case.label_confidence in {"high", "medium", "low"}, case.id


def test_the_split_is_frozen_for_every_case_and_follows_the_url_hash_unless_moved():
    split = load_split()
    for case in load_cases():
        assert case.id in split["assignments"], f"{case.id}: run python -m analysis.corpus"
        if case.id not in split["moved_to_dev"]:
            assert split["assignments"][case.id] == hashed_side(case.source_url), case.id
    moved = split["moved_to_dev"]
    assert all(reason.strip() for reason in moved.values())
    assert set(moved) <= {c.id for c in load_cases()}


def test_about_forty_percent_of_cases_are_held_out():
    split = load_split()
    sides = [side_of(c, split) for c in load_cases()]
    assert 0.25 <= sides.count("test") / len(sides) <= 0.5


@pytest.fixture(scope="module")
def dev_figures():
    return evaluate(cases_on("dev"), perturb=True)


@pytest.mark.slow
def test_on_dev_a_named_culprit_is_right_at_least_85_percent_of_the_time(dev_figures):
    assert dev_figures["named"] >= 10
    assert dev_figures["precision"] >= 0.85, dev_figures["wrong"]


@pytest.mark.slow
def test_on_dev_perturbed_logs_never_flip_to_another_culprit(dev_figures):
    assert dev_figures["perturbation_flips"] == []


@pytest.mark.slow
def test_on_dev_cases_whose_cause_was_never_found_mostly_get_no_culprit(dev_figures):
    assert dev_figures["abstention_on_unknown"] >= 0.8, dev_figures["named_on_unknown"]


def test_perturbations_change_the_text_the_way_they_say():
    text = (
        "[rank0]: a 10:00:01\n[rank1]: b 23:59:59\n[rank0]: c\nplain\n[rank1]: d\n"
        "[E ProcessGroupNCCL.cpp:737] [Rank 2] e\n"
    )
    assert "15:17:01" in shift_clock(text) and "05:16:59" in shift_clock(text)
    assert past_head(text).endswith(text) and len(past_head(text)) > 2 << 20
    kept = one_rank(text)
    assert "[rank1]" not in kept and "[Rank 2]" not in kept and "[rank0]: c" in kept
    import random

    shuffled = shuffle_ranks(text, random.Random(3))
    assert sorted(shuffled.split("\n")) == sorted(text.split("\n"))
    for rank in ("[rank0]", "[rank1]"):
        mine = [line for line in text.split("\n") if line.startswith(rank)]
        assert [line for line in shuffled.split("\n") if line.startswith(rank)] == mine


def test_case_files_are_valid_json_with_an_id_matching_the_file():
    for path in CASES.glob("*.json"):
        meta = json.loads(path.read_text())
        assert meta["id"] == path.stem


def test_the_calibration_table_was_measured_on_dev_for_this_ruleset():
    # A rule change bumps RULESET_VERSION; its verdicts then report stated strengths until
    # `fleetwatch eval --split dev --calibrate` measures them again. This keeps that run honest.
    from analysis.classify.engine import CALIBRATION_FILE
    from analysis.classify.rules import RULESET_VERSION

    table = json.loads(CALIBRATION_FILE.read_text())
    assert table["ruleset_version"] == RULESET_VERSION
    assert table["measured_on"].startswith("the corpus's dev split")
    assert all(0 <= row["right"] <= row["named"] for row in table["rules"].values())


def test_calibrating_on_the_held_out_split_is_refused(capsys):
    from fleet.cli import main

    assert main(["eval", "--split", "test", "--calibrate"]) == 2
    assert "dev only" in capsys.readouterr().err


def test_a_rule_reports_its_dev_precision_shrunk_toward_its_stated_strength():
    from analysis.classify.engine import PRIOR_CASES, calibrated, calibration

    for rule_id, row in calibration().items():
        expected = (row["right"] + PRIOR_CASES * 0.6) / (row["named"] + PRIOR_CASES)
        assert calibrated(rule_id, 0.6) == pytest.approx(expected)
    assert calibrated("a rule never measured", 0.6) == 0.6
