"""Rules that read cross-rank evidence: Flight Recorder dumps and profiler trace summaries."""

from __future__ import annotations

from .rules import Rule

CROSSRANK_RULES: tuple[Rule, ...] = ()
