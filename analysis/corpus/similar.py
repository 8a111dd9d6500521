"""The resolved public incidents most like this one: offered beside a verdict, with their thread
and fix, never named as the verdict.

Each artifact line a parser understood becomes a template (``analysis.classify.signature``: ranks,
seqs, sizes, times, addresses, paths as placeholders), as Sentry groups events. Two incidents are
alike by weighted Jaccard over their templates, each template weighted by how rare it is in the
corpus (log(N / document frequency)): the watchdog line every timeout prints weighs almost
nothing, a specific NCCL WARN or a kernel message weighs a lot.

Only cases whose cause the thread established are offered. How often the closest case's cause is
the right one is measured on dev by ``fleetwatch eval`` (leave-one-out); the choice not to name a
verdict from it is written down in DEVELOPERS.md.
"""

from __future__ import annotations

import functools
import math
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass

from analysis.classify.signature import parameterise

from . import Case, load_cases

# The least similarity worth showing (dev, leave-one-out: offered for 4 of 61, 2 right).
OFFER_AT = 0.2
MOST = 3
# One shared line is a coincidence of two short excerpts (a single NCCL error string); a shape
# of evidence needs at least two.
MIN_SHARED = 2


@dataclass(frozen=True)
class Similar:
    case_id: str
    source_url: str
    title: str
    culprit: str
    fix: str
    similarity: float

    def to_dict(self) -> dict:
        return {
            "case": self.case_id,
            "source_url": self.source_url,
            "title": self.title,
            "culprit": self.culprit,
            "fix": self.fix,
            "similarity": round(self.similarity, 2),
        }


# A 16,384-rank incident holds as many timeout lines, nearly all one template: parameterising
# each distinct line once, and at most this many, keeps a classification's cost bounded.
MAX_LINES = 4096


def templates(events: Iterable) -> frozenset[str]:
    lines = {(event.kind, event.text) for event in events if getattr(event, "text", "")}
    return frozenset(
        f"{kind}|{parameterise(text)[:160]}" for kind, text in sorted(lines)[:MAX_LINES]
    )


def _case_templates(case: Case) -> frozenset[str]:
    from ingest.parsers import parse_file

    return templates(parse_file(case.log_path).events)


@functools.cache
def _index() -> tuple[tuple[tuple[Case, frozenset[str]], ...], dict[str, float]]:
    known = tuple((c, _case_templates(c)) for c in load_cases() if c.known_cause)
    df = Counter(t for _, ts in known for t in ts)
    n = max(1, len(known))
    weights = {t: math.log((n + 1) / (count + 0.5)) for t, count in df.items()}
    return known, weights


def similar_cases(
    events: Iterable, *, exclude: str | None = None, at_least: float = OFFER_AT, most: int = MOST
) -> list[Similar]:
    """The resolved corpus cases most like these events (``exclude``: a case id to leave out,
    for leave-one-out measurement)."""
    return similar_to(templates(events), exclude=exclude, at_least=at_least, most=most)


def case_templates(case_id: str) -> frozenset[str] | None:
    """A known-cause corpus case's templates, as the index already holds them."""
    known, _ = _index()
    return next((ts for case, ts in known if case.id == case_id), None)


def similar_to(
    mine: frozenset[str],
    *,
    exclude: str | None = None,
    at_least: float = OFFER_AT,
    most: int = MOST,
) -> list[Similar]:
    if not mine:
        return []
    known, weights = _index()
    rare = max(weights.values(), default=1.0)  # a template the corpus never saw

    def weight(t: str) -> float:
        return weights.get(t, rare)

    scored = []
    for case, theirs in known:
        if case.id == exclude or not theirs:
            continue
        shared = mine & theirs
        if len(shared) < MIN_SHARED:
            continue
        union = sum(weight(t) for t in mine | theirs)
        score = sum(weight(t) for t in shared) / union if union else 0.0
        if score >= at_least:
            scored.append((score, case))
    scored.sort(key=lambda pair: (-pair[0], pair[1].id))
    return [
        Similar(
            case.id,
            case.source_url,
            str(case.meta.get("title") or ""),
            case.primary,
            str(case.meta.get("fix") or ""),
            score,
        )
        for score, case in scored[:most]
    ]
