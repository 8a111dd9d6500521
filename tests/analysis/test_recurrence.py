"""Recurrence statistics: accuse only what fails more than chance allows."""

import math
from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from analysis.classify.recurrence import (
    assess,
    binomial_tail,
    decay,
    fisher_greater,
    job_family,
)


def test_binomial_tail_matches_a_direct_sum():
    n, p = 20, 0.1
    direct = sum(math.comb(n, i) * p**i * (1 - p) ** (n - i) for i in range(3, n + 1))
    assert binomial_tail(3, n, p) == pytest.approx(direct, rel=1e-9)
    assert binomial_tail(0, 5, 0.3) == 1.0
    assert binomial_tail(6, 5, 0.3) == 0.0


def exact_binomial_tail(k: int, n: int, p: Fraction) -> Fraction:
    return sum(
        (math.comb(n, i) * p**i * (1 - p) ** (n - i) for i in range(max(k, 0), n + 1)),
        Fraction(0),
    )


def exact_fisher_greater(a: int, b: int, c: int, d: int) -> Fraction:
    n1, n2, m = a + b, c + d, a + c
    total = math.comb(n1 + n2, m)
    return sum(
        (
            Fraction(math.comb(n1, x) * math.comb(n2, m - x), total)
            for x in range(a, min(n1, m) + 1)
            if m - x <= n2
        ),
        Fraction(0),
    )


@settings(max_examples=120, deadline=None)
@given(
    n=st.integers(1, 400),
    k=st.integers(0, 400),
    p=st.fractions(min_value=Fraction(1, 10_000), max_value=Fraction(9_999, 10_000)),
)
def test_binomial_tail_agrees_with_exact_arithmetic(n, k, p):
    exact = exact_binomial_tail(k, n, p) if k <= n else Fraction(0)
    got = binomial_tail(k, n, float(p))
    # The sum stops where terms fall 40 e-folds (1e-17) under the first: a relative error that
    # small, or an absolute one below float resolution.
    assert got == pytest.approx(float(exact), rel=1e-9, abs=1e-300)


@settings(max_examples=120, deadline=None)
@given(a=st.integers(0, 60), b=st.integers(0, 200), c=st.integers(0, 60), d=st.integers(0, 400))
def test_fisher_greater_agrees_with_exact_arithmetic(a, b, c, d):
    assert fisher_greater(a, b, c, d) == pytest.approx(
        float(exact_fisher_greater(a, b, c, d)), rel=1e-9, abs=1e-300
    )


def test_evidence_halves_every_half_life():
    assert decay(0) == 1.0
    assert decay(3.5 * 86400) == pytest.approx(0.5)


def test_a_host_lagging_in_3_of_4_attempts_on_a_2_percent_fleet_is_accused():
    r = assess(
        label="host gpu-a01",
        role="lagging rank's host",
        implicated=3,
        exposed=4,
        incidents=3,
        baseline=0.02,
        window_days=7,
    )
    assert r.flagged
    assert "3 of its 4 attempts" in r.explanation and "fleet rate 2.0%" in r.explanation


def test_one_incident_is_never_enough():
    r = assess(
        label="host h",
        role="suspect",
        implicated=1,
        exposed=1,
        incidents=1,
        baseline=0.001,
        window_days=7,
    )
    assert not r.flagged and "needs at least 2 incidents" in r.explanation


def test_a_busy_host_failing_at_the_fleet_rate_is_not_accused():
    r = assess(
        label="host h",
        role="suspect",
        implicated=4,
        exposed=200,
        incidents=4,
        baseline=0.02,
        window_days=7,
    )
    assert not r.flagged


@pytest.mark.parametrize(
    ("name", "family"),
    [
        ("llama-pretrain-20261120-a", "llama-pretrain"),
        ("asr-finetune-7781", "asr-finetune"),
        ("sft-llama-7b-run3", "sft-llama-7b"),
        ("vit_sweep_lr3e-4", "vit-sweep-lr3e"),
        ("job", "job"),
        ("dit-train-77-3f9a2c1", "dit-train"),
    ],
)
def test_job_family_drops_the_run_suffix(name, family):
    assert job_family(name) == family


def test_fisher_flags_a_value_that_only_fails():
    assert fisher_greater(8, 0, 2, 90) < 1e-6
    assert fisher_greater(1, 9, 10, 90) > 0.3
