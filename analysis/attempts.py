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


def upload_source_names(uploads) -> dict[int, str]:
    """The name each upload's events carry as their ``source`` (and evidence its ``file``): the
    file name, unless two uploads of the attempt share it (every host's ``dmesg.log``), then
    the name with the upload's id — the rules keep each file's lines apart by this name (a
    kernel log's boot banner speaks only of the lines above it in the same file)."""
    pairs = [(u.pk, u.filename or f"upload-{u.pk}") for u in uploads]
    seen: dict[str, int] = {}
    for _, name in pairs:
        seen[name] = seen.get(name, 0) + 1
    return {pk: name if seen[name] == 1 else f"{name} (upload {pk})" for pk, name in pairs}
