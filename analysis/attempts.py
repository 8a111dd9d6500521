"""What an attempt reported of itself, read the way the rules read a log. Below both the
services (classification) and fleet memory (implication), which use it alike."""

from __future__ import annotations

from fleet.models import Attempt
from ingest.parsers import parse_log


def attempt_config_events(attempt: Attempt):
    """What the agent or scheduler reported of the job's settings, as the parsers would read
    them from a log (so the same canonical keys reach the rules)."""
    lines = [f"{key}={value}" for key, value in sorted(attempt.config.items())]
    lines += [f"{key} version: {value}" for key, value in sorted(attempt.versions.items())]
    if not lines:
        return ()
    text = "\n".join(lines) + "\n"
    return parse_log(text.encode(), source="attempt report").events
