"""The rule engine: every rule reads the facts, the strongest match names the culprit.

Rules are data (``rules.py``): an id, a description, the signals they need, the culprit class,
a confidence and the fix. The engine itself knows nothing about any particular failure.
"""

from __future__ import annotations

import contextlib
import functools
import json
from collections.abc import Iterable
from pathlib import Path

from ingest.parsers.events import Event

from .facts import DEFAULT_PG, Facts, gather
from .model import Alternative, Evidence, IncidentContext, RuleMatch, Suspect, Verdict
from .registry import ALL_RULES
from .rules import NAME_THRESHOLD, RULESET_VERSION, Match
from .signature import parameterise

MAX_EVIDENCE = 40

# The confidence a verdict reports is the naming rule's precision on the corpus's dev split
# (calibration.json, written by `fleetwatch eval --split dev --calibrate`), shrunk toward the
# rule's own stated strength with PRIOR_CASES pseudo-cases, so that a rule seen naming twice does
# not claim 100 %. A rule whose calibrated precision falls under the naming threshold names
# nothing: it was wrong more often than right on real incidents.
CALIBRATION_FILE = Path(__file__).with_name("calibration.json")
PRIOR_CASES = 2
_calibrating = False  # set by the evaluator while it measures the rules themselves


@functools.cache
def calibration() -> dict[str, dict]:
    try:
        table = json.loads(CALIBRATION_FILE.read_text())
    except FileNotFoundError:
        return {}
    # A table measured on another ruleset says nothing about this one.
    return table["rules"] if table.get("ruleset_version") == RULESET_VERSION else {}


def calibrated(rule_id: str, stated: float) -> float:
    if _calibrating:
        return stated
    row = calibration().get(rule_id)
    if not row:
        return stated
    return (row["right"] + PRIOR_CASES * stated) / (row["named"] + PRIOR_CASES)


@contextlib.contextmanager
def uncalibrated():
    """Rules at their stated strength (what the calibration itself is measured from)."""
    global _calibrating
    before, _calibrating = _calibrating, True
    try:
        yield
    finally:
        _calibrating = before


def _evidence(event: Event, signal: str) -> Evidence:
    return Evidence(file=event.source, line=event.line, signal=signal, text=event.text[:500])


def _ranks(ranks: Iterable[int]) -> str:
    ranks = sorted(ranks)
    if len(ranks) > 8:
        return ", ".join(map(str, ranks[:8])) + f" and {len(ranks) - 8} more"
    return ", ".join(map(str, ranks))


def progress_suspects(facts: Facts) -> tuple[list[Suspect], list[Evidence], str]:
    """Who the other ranks were waiting for, from progress alone (no culprit class)."""
    suspects: list[Suspect] = []
    evidence: list[Evidence] = []
    notes: list[str] = []
    for pg, group in sorted(facts.groups.items()):
        lagging, counter = group.lagging()
        if not lagging:
            continue
        stuck = group.stuck_seq()
        top = max(
            getattr(p, counter) for p in group.ranks.values() if getattr(p, counter) is not None
        )
        for rank in lagging:
            progress = group.ranks[rank]
            value = getattr(progress, counter)
            host = facts.context.rank_hosts.get(rank)
            if counter == "last_enqueued" and stuck is not None:
                why = (
                    f"last enqueued seq {value} on process group {pg}: it never joined "
                    f"collective {stuck} that the other ranks timed out in"
                )
            else:
                why = (
                    f"{counter.replace('_', ' ')} seq {value} on process group {pg} while other "
                    f"ranks reached {top}"
                )
            suspects.append(Suspect("rank", str(rank), why))
            if host:
                suspects.append(Suspect("host", host, f"runs lagging rank {rank}"))
            evidence.extend(_evidence(e, "lagging_rank") for e in progress.evidence[:3])
        notes.append(f"rank {_ranks(lagging)} lagged on process group {pg} ({counter} behind)")
    silent = facts.silent_ranks()
    if silent and not suspects:
        uploaded = set(facts.context.ranks_uploaded)
        for rank in sorted(silent)[:64]:
            why = (
                "its log shows no timeout: it was not waiting in the collective"
                if rank in uploaded
                else "its lines are here but show no timeout: it was not waiting in the collective"
            )
            suspects.append(Suspect("rank", str(rank), why))
            host = facts.context.rank_hosts.get(rank)
            if host:
                suspects.append(Suspect("host", host, f"runs silent rank {rank}"))
        notes.append(f"rank {_ranks(silent)} never reported the timed-out collective")
    missing = facts.missing_ranks()
    if missing:
        # Not suspects: nothing of theirs is here to say where they were.
        notes.append(
            f"no artifacts from rank {_ranks(missing)}: upload their logs to tell whether they "
            "were in the collective"
        )
    return suspects, evidence, "; ".join(notes)


def _describe_timeouts(facts: Facts) -> str:
    if not facts.timeouts:
        if facts.of("watchdog_abort"):
            return (
                "a collective failed or timed out and the watchdog took the process down (the "
                "WorkNCCL line itself is not in the artifacts)"
            )
        return ""
    first = facts.timeouts[0]
    ops = sorted({t.op for t in facts.timeouts if t.op})
    seqs = sorted({t.seq for t in facts.timeouts if t.seq is not None})
    seq_text = (
        f" SeqNum {seqs[0]}"
        if len(seqs) == 1
        else (f" SeqNum {seqs[0]}–{seqs[-1]}" if seqs else "")
    )
    ranks = facts.timed_out_ranks
    who = f" on rank {_ranks(ranks)}" if ranks else ""
    limit = f" after {first.timeout_ms // 1000} s" if first.timeout_ms else ""
    return f"{'/'.join(ops) or 'collective'}{seq_text} timed out{limit}{who}"


def classify(events: Iterable[Event], context: IncidentContext | None = None) -> Verdict:
    facts = gather(events, context or IncidentContext())
    matches: list[Match] = []
    for rule in ALL_RULES:
        match = rule.evaluate(facts)
        if match is not None:
            matches.append(match)
    suspects, evidence, progress_note = progress_suspects(facts)
    for timeout in facts.timeouts[:8]:
        evidence.append(_evidence(timeout, "watchdog_timeout"))
    ranked = sorted(matches, key=lambda m: -m.confidence)
    # Only a match at or above the threshold may name the culprit; weaker ones are alternatives.
    # A rule whose class is "unknown" adds suspects and evidence but never names a culprit.
    named = [
        m
        for m in ranked
        if m.confidence >= NAME_THRESHOLD
        and m.rule.culprit != "unknown"
        and calibrated(m.rule.id, m.confidence) >= NAME_THRESHOLD
    ]
    for m in ranked:
        if m.rule.culprit == "unknown":
            suspects = list(m.suspects) + suspects
            evidence = list(m.evidence) + evidence
    summary = "; ".join(p for p in (_describe_timeouts(facts), progress_note) if p)
    signature = ""
    if named:
        best = named[0]
        signature = f"{best.rule.id}|{parameterise(best.summary)}"
        culprit, fix = best.rule.culprit, best.fix or best.rule.fix
        confidence = calibrated(best.rule.id, best.confidence)
        summary = ". ".join(p for p in (best.summary, summary) if p)
        evidence = list(best.evidence) + evidence
        suspects = list(best.suspects) + suspects
    else:
        culprit, confidence = "unknown", 0.0
        fix = (
            "Not enough evidence to name a cause. Upload every rank's log, the NCCL_DEBUG=INFO "
            "output and Flight Recorder dumps (TORCH_FR_BUFFER_SIZE=2000, "
            "TORCH_NCCL_TRACE_BUFFER_SIZE before PyTorch 2.6, TORCH_NCCL_DUMP_ON_TIMEOUT=1)"
            + ("; start with the suspect ranks named above." if suspects else ".")
        )
    alternatives = tuple(
        dict.fromkeys(
            Alternative(m.rule.culprit, round(m.confidence, 2))
            for m in ranked
            if m.rule.culprit != culprit
        )
    )
    if not named and ranked:
        # Say what was seen without calling it the cause.
        weak = "weak signs: " + "; ".join(m.summary for m in ranked if m.summary)
        summary = ". ".join(p for p in (summary, weak) if p)
        evidence = [e for m in ranked for e in m.evidence] + evidence
    summary = summary or "no collective timeout or failure in the artifacts"
    if not signature and facts.failed:
        signature = "unknown|" + parameterise(_describe_timeouts(facts))
    seen: set[tuple[str, int, str]] = set()
    unique_evidence = []
    for item in evidence:
        key = (item.file, item.line, item.signal)
        if key not in seen:
            seen.add(key)
            unique_evidence.append(item)
    unique_suspects, seen_ids = [], set()
    for suspect in suspects:
        if (suspect.kind, suspect.id) not in seen_ids:
            seen_ids.add((suspect.kind, suspect.id))
            unique_suspects.append(suspect)
    return Verdict(
        culprit=culprit,
        confidence=round(confidence, 2),
        summary=summary,
        fix=fix,
        failed=facts.failed or any(m.rule.marks_failure for m in matches),
        suspects=tuple(unique_suspects[:64]),
        evidence=tuple(unique_evidence[:MAX_EVIDENCE]),
        alternatives=alternatives,
        rule_ids=tuple(m.rule.id for m in matches),
        ruleset_version=RULESET_VERSION,
        matches=tuple(RuleMatch(m.rule.id, m.rule.culprit, round(m.confidence, 2)) for m in ranked),
        signature=signature,
    )


__all__ = ["DEFAULT_PG", "classify"]
