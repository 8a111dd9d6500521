"""Recurrence statistics for fleet memory: pure, no Django.

An entity (host, rack, config value…) is accused only when it is implicated in failures more
often than chance allows given how often it ran: the number of its attempts that a verdict
implicated is compared with a binomial draw at the fleet's rate for entities of its kind.
Old evidence decays with a half-life, and at least ``MIN_INCIDENTS`` incidents are required.

The two tails (binomial upper tail, one-sided Fisher exact test) are written here rather than
taken from scipy.stats: they are a few lines of log-space sums, and scipy with numpy would put
a compiled numerical stack on every server for them. tests/analysis/test_recurrence.py holds both
to exact rational arithmetic (fractions) over generated tables.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

HALF_LIFE_DAYS = 3.5
MIN_INCIDENTS = 2
# Flag when the chance of seeing this many implications by luck is below 1 in 1,000 and the
# entity fails at least 3x as often as the fleet. Direct evidence (a verdict of confidence
# >= STRONG: an Xid on the host, a stalled mount in its kernel log, IB errors on its HCA) needs
# less luck to be ruled out: 1 in 100.
FLAG_SCORE = 3.0
FLAG_SCORE_DIRECT = 2.0
STRONG = 0.75
# Between the two: a verdict that named the class itself (confidence >= the naming threshold)
# is better evidence than a weak sign (a lagging rank, a socket transport), so 1 in ~300.
FLAG_SCORE_NAMED = 2.5
NAMED = 0.5
MIN_LIFT = 3.0
# Under suspicion, though not (yet) accused: 1 in 20 by luck at the same lift. A suspect is left
# out of the fleet rate that other entities of its kind are measured against.
SUSPECT_SCORE = 1.3


def decay(age_seconds: float, half_life_days: float = HALF_LIFE_DAYS) -> float:
    """Weight of evidence that is ``age_seconds`` old (1 now, 0.5 one half-life ago)."""
    return 0.5 ** (max(0.0, age_seconds) / (half_life_days * 86400.0))


def binomial_tail(k: int, n: int, p: float) -> float:
    """P(X >= k) for X ~ Binomial(n, p), computed in log space (n up to millions is fine)."""
    if k <= 0:
        return 1.0
    if n <= 0 or k > n:
        return 0.0
    if p <= 0.0:
        return 0.0
    if p >= 1.0:
        return 1.0
    log_p, log_q = math.log(p), math.log1p(-p)
    log_terms = []
    for i in range(k, n + 1):
        log_terms.append(
            math.lgamma(n + 1)
            - math.lgamma(i + 1)
            - math.lgamma(n - i + 1)
            + i * log_p
            + (n - i) * log_q
        )
        # Terms shrink fast past the mode; stop when they no longer matter.
        if i > n * p and log_terms[-1] < log_terms[0] - 40:
            break
    top = max(log_terms)
    return min(1.0, math.exp(top) * sum(math.exp(t - top) for t in log_terms))


@dataclass(frozen=True, slots=True)
class Recurrence:
    implicated: float  # decayed incidents implicating the entity
    exposed: float  # decayed attempts that ran on or with it
    baseline: float  # fleet rate for its kind
    p_value: float
    score: float  # -log10(p_value), capped
    flagged: bool
    explanation: str


def assess(
    *,
    label: str,
    role: str,
    implicated: float,
    exposed: float,
    incidents: int,
    baseline: float,
    window_days: int,
    strongest: float = 0.0,
) -> Recurrence:
    """Judge one entity. ``incidents`` is the raw (undecayed) count of implicating incidents,
    ``role`` says what the verdicts said of it ("the lagging rank's host"), ``strongest`` is
    the highest confidence of the verdicts that implicated it."""
    k = max(0, round(implicated))
    n = max(k, round(exposed))
    baseline = min(max(baseline, 1e-6), 1.0)
    p_value = binomial_tail(k, n, baseline) if n else 1.0
    score = min(50.0, -math.log10(max(p_value, 1e-50)))
    rate = k / n if n else 0.0
    lift = rate / baseline if baseline else 0.0
    if strongest >= STRONG:
        needed = FLAG_SCORE_DIRECT
    elif strongest >= NAMED:
        needed = FLAG_SCORE_NAMED
    else:
        needed = FLAG_SCORE
    flagged = incidents >= MIN_INCIDENTS and score >= needed and lift >= MIN_LIFT
    explanation = (
        f"{label}: {role} in {k} of its {n} attempts in the last {window_days} days "
        f"({rate:.0%}, decayed); fleet rate {baseline:.1%}; chance by luck "
        f"{_chance(p_value)}"
    )
    if not flagged:
        if incidents < MIN_INCIDENTS:
            explanation += f" — not accused: needs at least {MIN_INCIDENTS} incidents"
        elif lift < MIN_LIFT:
            explanation += f" — not accused: only {lift:.1f}x the fleet rate"
        else:
            explanation += " — not accused: could be chance"
    return Recurrence(
        implicated=implicated,
        exposed=exposed,
        baseline=baseline,
        p_value=p_value,
        score=round(score, 2),
        flagged=flagged,
        explanation=explanation,
    )


def suspicious(result: Recurrence, incidents: int) -> bool:
    """Too unlucky to count as the fleet's normal: flagged, or on its way to it."""
    if result.flagged:
        return True
    rate = result.implicated / result.exposed if result.exposed else 0.0
    return (
        incidents >= MIN_INCIDENTS
        and result.score >= SUSPECT_SCORE
        and rate >= MIN_LIFT * result.baseline
    )


def _chance(p: float) -> str:
    if p >= 0.01:
        return f"{p:.0%}"
    return f"1 in {min(1 / p, 1e12):,.0f}" if p > 0 else "nil"


# Volatile tokens at the end of a job name: run numbers, dates, hashes, attempt tags.
_VOLATILE = re.compile(
    r"^(?:\d+|v\d+(?:\.\d+)*|r(?:un)?\d*|try\d*|attempt\d*|[a-z]|[0-9a-f]{6,}|"
    r"\d{4}-?\d{2}-?\d{2}(?:t?\d{4,6})?)$",
    re.IGNORECASE,
)


def job_family(name: str) -> str:
    """A job name without its run suffix: ``llama-pretrain-20261120-a`` → ``llama-pretrain``."""
    tokens = [t for t in re.split(r"[-_.:/]", name.strip()) if t]
    while len(tokens) > 1 and _VOLATILE.match(tokens[-1]):
        tokens.pop()
    return "-".join(tokens) or name


def fisher_greater(a: int, b: int, c: int, d: int) -> float:
    """One-sided Fisher exact test: P(observing >= a failures among the a+b attempts with a
    config value | margins), for failed/healthy (a, b) with the value and (c, d) without."""
    n1, n2, m = a + b, c + d, a + c
    total = n1 + n2

    def log_comb(n: int, r: int) -> float:
        return math.lgamma(n + 1) - math.lgamma(r + 1) - math.lgamma(n - r + 1)

    denom = log_comb(total, m)
    p = 0.0
    for x in range(a, min(n1, m) + 1):
        if m - x > n2:
            continue
        p += math.exp(log_comb(n1, x) + log_comb(n2, m - x) - denom)
    return min(1.0, p)
