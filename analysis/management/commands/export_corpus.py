"""``manage.py export_corpus OUTDIR``: the fleet's own labelled incidents, in the format of the
labelled corpus (analysis/corpus/README.md), so that ``fleetwatch eval --cases OUTDIR`` scores
the rules on this fleet's incidents as it scores them on public ones.

A case is an incident an operator labelled with a reason: reclassified (the journal says why), or
resolved with a note. The label is the incident's culprit as it stands (the operator's); the
log is the attempt's logs, each line carrying the rank of the file it came from
(``[rank3]: …``, PyTorch's own prefix) unless it names one already, newest lines kept when a file
is large. Incidents whose culprit an operator only acknowledged are no label and are left out.
"""

from __future__ import annotations

import gzip
import json
import re
from collections import deque
from pathlib import Path

from django.conf import settings
from django.core.management.base import BaseCommand

from analysis.corpus import VOCABULARY
from analysis.models import Incident
from ingest.models import Upload

# Per file, the newest lines up to this many bytes: the failure is at the end of a rank's log.
FILE_TAIL_BYTES = 1 << 20
CASE_MAX_BYTES = 8 << 20
GZIP_MAGIC = b"\x1f\x8b"
_HAS_RANK = re.compile(r"^\[rank ?\d+\]|^\S*\[rank\d+\]:|^\[\S+ Rank \d+\]")


def _label(incident: Incident) -> dict | None:
    """The operator's label and reason, newest first: a reclassification or a noted resolution."""
    for entry in reversed(incident.journal or []):
        action, note = entry.get("action", ""), (entry.get("note") or "").strip()
        if action.startswith("reclassified") or (action == "resolved" and note):
            return {"by": entry.get("by", ""), "at": entry.get("at", ""), "note": note}
    return None


def _tail_lines(upload: Upload, limit: int) -> list[str]:
    """The newest lines of an upload's blob (plain or gzip) within ``limit`` bytes, streamed."""
    kept: deque[bytes] = deque()
    size = 0
    with upload.blob.open("rb") as raw:
        head = raw.read(2)
        raw.seek(0)
        reader = gzip.GzipFile(fileobj=raw) if head == GZIP_MAGIC else raw
        for line in iter(lambda: reader.readline(64 * 1024), b""):
            kept.append(line)
            size += len(line)
            while size > limit and kept:
                size -= len(kept.popleft())
    return [b.decode("utf-8", errors="replace").rstrip("\r\n") for b in kept]


def case_log(incident: Incident) -> str:
    uploads = (
        Upload.objects.filter(attempt_id=incident.attempt_id, kind=Upload.Kind.LOG)
        .exclude(status=Upload.Status.FAILED)
        .order_by("rank", "pk")
    )
    parts, total = [], 0
    for upload in uploads:
        lines = _tail_lines(upload, FILE_TAIL_BYTES)
        if upload.rank is not None:
            lines = [
                line if _HAS_RANK.match(line) else f"[rank{upload.rank}]: {line}" for line in lines
            ]
        text = "\n".join(lines)
        if total + len(text) > CASE_MAX_BYTES:
            break
        parts.append(text)
        total += len(text)
    return "\n\n".join(parts) + "\n"


def case_meta(incident: Incident, label: dict) -> dict:
    attempt = incident.attempt
    versions = attempt.versions or {}
    base = getattr(settings, "FLEETWATCH_PUBLIC_URL", "") or "fleetwatch:"
    reclassified = bool(incident.classified_culprit)
    return {
        "id": f"fleet__{incident.job.external_id}__{incident.pk}"[:200],
        "source_url": f"{base.rstrip('/')}/incidents/{incident.pk}/",
        "repo": "",
        "title": f"{incident.job.external_id} attempt {attempt.number}",
        "primary": incident.culprit,
        "secondary": None,
        "resolution": (label["note"] or f"labelled {incident.culprit} by {label['by']}")[:500],
        "quote": label["note"][:300] or None,
        "fix": incident.fix,
        "label_confidence": "high" if incident.fix_applied_at else "medium",
        "versions": {
            "pytorch": versions.get("torch"),
            "nccl": versions.get("nccl"),
            "cuda": versions.get("cuda"),
        },
        "world_size": attempt.world_size,
        "every_rank": False,
        "culprit_rank": None,
        "thread_only": (
            f"the classifier said {incident.classified_culprit}; {label['by']} "
            f"reclassified it {label['at'][:16]}"
            if reclassified
            else f"resolved by {label['by']} {label['at'][:16]}"
        ),
    }


class Command(BaseCommand):
    help = "Write the fleet's operator-labelled incidents as a corpus `fleetwatch eval` reads."

    def add_arguments(self, parser):
        parser.add_argument("outdir", help="folder to write <id>.log and <id>.json into")
        parser.add_argument("--since", help="only incidents opened on or after this date")

    def handle(self, *args, outdir: str, since: str | None = None, **options):
        out = Path(outdir)
        out.mkdir(parents=True, exist_ok=True)
        incidents = Incident.objects.select_related("job", "attempt").order_by("pk")
        if since:
            incidents = incidents.filter(opened_at__date__gte=since)
        written = skipped = 0
        for incident in incidents.iterator(chunk_size=200):
            label = _label(incident)
            if label is None or incident.culprit not in VOCABULARY:
                continue
            log = case_log(incident)
            if not log.strip():
                skipped += 1  # no log upload left to read: nothing to score the rules on
                continue
            meta = case_meta(incident, label)
            stem = re.sub(r"[^A-Za-z0-9_.-]", "_", meta["id"])
            meta["id"] = stem
            (out / f"{stem}.log").write_text(log, encoding="utf-8")
            (out / f"{stem}.json").write_text(json.dumps(meta, indent=2) + "\n")
            written += 1
        self.stdout.write(
            f"{written} labelled incident(s) written to {out}"
            + (f"; {skipped} left out with no log to read" if skipped else "")
        )
