"""The labelled corpus of real incidents: data the product ships, and the yardstick its verdicts
are scored on (``fleetwatch eval``).

Pure: no Django (tests/test_layering.py). Each case is ``cases/<id>.log`` (the machine lines as
posted in a public thread) and ``cases/<id>.json`` (source, labels, resolution, fix). The split
into ``dev`` and ``test`` is frozen in ``split.json``: a case's side follows from a hash of its
source URL alone, so adding cases never moves an old one, and a rule author can know which cases
they may read (``dev``) without reading the others. See README.md.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent
CASES = ROOT / "cases"
SPLIT_FILE = ROOT / "split.json"

# 40 % of cases are held out: the first 8 hex digits of sha256(source_url), mod 100, below this.
TEST_PERCENT = 40


@dataclass(frozen=True)
class Case:
    id: str
    source_url: str
    primary: str
    secondary: str | None
    label_confidence: str
    log_path: Path
    meta: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)

    @property
    def accepted(self) -> frozenset[str]:
        """The verdicts that count as right: the primary cause, or the secondary one the
        thread also established."""
        return frozenset(c for c in (self.primary, self.secondary) if c)

    @property
    def known_cause(self) -> bool:
        return self.primary != "unknown"


def hashed_side(source_url: str) -> str:
    digest = hashlib.sha256(source_url.strip().encode()).hexdigest()
    return "test" if int(digest[:8], 16) % 100 < TEST_PERCENT else "dev"


# The culprit vocabulary (DESIGN.md); a case labelled otherwise is not a case of this corpus.
VOCABULARY = frozenset(
    {
        "bad_node_hardware",
        "storage_io",
        "dataloader_cpu",
        "rank_desync_code",
        "parallelism_config",
        "network_transport",
        "software_version",
        "oom_or_crash",
        "timeout_too_short",
        "unknown",
    }
)
REQUIRED = ("id", "source_url", "primary")


class CorpusError(ValueError):
    """A case that is not in the corpus format, saying which and why."""


def _checked(meta: Any, meta_path: Path) -> dict[str, Any]:
    if not isinstance(meta, dict):
        raise CorpusError(f"{meta_path.name}: not a JSON object")
    missing = [k for k in REQUIRED if not meta.get(k)]
    if missing:
        raise CorpusError(f"{meta_path.name}: missing {', '.join(missing)}")
    for key in ("primary", "secondary"):
        if meta.get(key) and meta[key] not in VOCABULARY:
            raise CorpusError(f"{meta_path.name}: {key} {meta[key]!r} is not a culprit class")
    if not meta_path.with_suffix(".log").is_file():
        raise CorpusError(f"{meta_path.name}: no {meta_path.with_suffix('.log').name} beside it")
    return meta


def load_cases(root: Path = CASES, *, strict: bool = False) -> list[Case]:
    """The cases in ``root``. ``strict`` (a corpus from elsewhere): every case is checked and
    the first that is not in the format raises CorpusError; an empty folder too."""
    cases = []
    paths = sorted(root.glob("*.json"))
    if strict and not root.is_dir():
        raise CorpusError(f"{root}: no such folder")
    if strict and not paths:
        raise CorpusError(f"{root}: no <id>.json cases in it")
    for meta_path in paths:
        try:
            meta = json.loads(meta_path.read_text())
        except ValueError as exc:
            if strict:
                raise CorpusError(f"{meta_path.name}: not JSON ({exc})") from None
            raise
        if strict:
            meta = _checked(meta, meta_path)
        cases.append(
            Case(
                id=meta["id"],
                source_url=meta["source_url"],
                primary=meta["primary"],
                secondary=meta.get("secondary") or None,
                label_confidence=meta.get("label_confidence", "low"),
                log_path=meta_path.with_suffix(".log"),
                meta=meta,
            )
        )
    return cases


def load_split(path: Path = SPLIT_FILE) -> dict[str, Any]:
    if not path.exists():
        return {"assignments": {}, "moved_to_dev": {}}
    return json.loads(path.read_text())


def side_of(case: Case, split: dict[str, Any]) -> str:
    """A case's side: ``dev`` when it was moved there (read before the split, or a rule was
    written from it after its miss was recorded), else its frozen assignment, else the hash."""
    if case.id in split.get("moved_to_dev", {}):
        return "dev"
    return split.get("assignments", {}).get(case.id) or hashed_side(case.source_url)


def cases_on(side: str | None, root: Path = CASES, split_path: Path = SPLIT_FILE) -> list[Case]:
    split = load_split(split_path)
    cases = load_cases(root)
    if side in (None, "all"):
        return cases
    return [c for c in cases if side_of(c, split) == side]


def freeze_split(root: Path = CASES, path: Path = SPLIT_FILE) -> dict[str, Any]:
    """Record every case's side in ``split.json``. Existing assignments never change; new cases
    get their hashed side. Returns the split written."""
    split = load_split(path)
    assignments = dict(split.get("assignments", {}))
    for case in load_cases(root):
        assignments.setdefault(case.id, hashed_side(case.source_url))
    split = {
        "rule": (
            f"test when int(sha256(source_url)[:8], 16) % 100 < {TEST_PERCENT}; frozen once "
            "written; a case moves to dev only with a reason (moved_to_dev)"
        ),
        "assignments": dict(sorted(assignments.items())),
        "moved_to_dev": dict(sorted(split.get("moved_to_dev", {}).items())),
    }
    path.write_text(json.dumps(split, indent=1) + "\n")
    return split
