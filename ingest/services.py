"""Writes for uploads: receive (the API) and parse (the worker)."""

from __future__ import annotations

import hashlib
import logging
import zlib
from dataclasses import dataclass
from datetime import timedelta

from django.conf import settings
from django.core.files.base import File
from django.db import IntegrityError, transaction
from django.db.models import Q
from django.utils import timezone

from fleet.models import Attempt, Host, Job, RankPlacement
from ingest.models import AgentKey, Event, Upload
from ingest.parsers import parse_artifact
from ingest.parsers.detect import detect_kind, is_gzip, looks_binary
from ingest.parsers.events import MAX_EVENT_TEXT

log = logging.getLogger(__name__)

READ_BLOCK = 1 << 20
# A parse claimed longer ago than this belongs to a worker that died: another may take it over.
STALE_CLAIM = timedelta(minutes=15)


class UploadRejected(ValueError):
    """The upload cannot be accepted; ``status`` is the HTTP status to answer with."""

    def __init__(self, message: str, status: int = 400):
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class Received:
    upload: Upload
    created: bool


def _scan(fileobj) -> tuple[str, int, bytes, bool]:
    """sha256, size, the (decompressed) head, and whether it is gzip — checking on the way
    that a gzip stream is whole and does not inflate beyond the configured bound."""
    digest = hashlib.sha256()
    size = 0
    head = b""
    inflater = None
    inflated = 0
    limit = settings.FLEETWATCH_MAX_INFLATED_BYTES
    fileobj.seek(0)
    while block := fileobj.read(READ_BLOCK):
        if size == 0 and is_gzip(block):
            inflater = zlib.decompressobj(16 + zlib.MAX_WBITS)
        size += len(block)
        if size > settings.FLEETWATCH_MAX_UPLOAD_BYTES:
            raise UploadRejected(
                f"file is larger than the {settings.FLEETWATCH_MAX_UPLOAD_BYTES} byte limit", 413
            )
        digest.update(block)
        if inflater is not None:
            try:
                # Inflate in bounded steps so a gzip bomb never sits in memory whole.
                chunk = inflater.decompress(block, READ_BLOCK)
                while True:
                    inflated += len(chunk)
                    if len(head) < 65536:
                        head += chunk[: 65536 - len(head)]
                    if inflated > limit:
                        raise UploadRejected(
                            f"gzip content inflates beyond the {limit} byte limit", 413
                        )
                    if not inflater.unconsumed_tail:
                        break
                    chunk = inflater.decompress(inflater.unconsumed_tail, READ_BLOCK)
            except zlib.error as exc:
                raise UploadRejected(f"gzip stream is corrupt: {exc}") from exc
        elif len(head) < 65536:
            head += block[: 65536 - len(head)]
    if inflater is not None and not inflater.eof:
        raise UploadRejected("gzip stream is truncated: the upload was cut off before its end")
    fileobj.seek(0)
    return digest.hexdigest(), size, head, inflater is not None


def upload_receive(
    *,
    fileobj,
    filename: str,
    hostname: str,
    job_id: str,
    attempt_number: int = 0,
    rank: int | None = None,
    kind: str = "",
    key: AgentKey | None = None,
) -> Received:
    sha256, size, head, compressed = _scan(fileobj)
    if size == 0:
        raise UploadRejected("file is empty")
    detected = detect_kind(head, filename)
    kind = kind or detected
    if kind == "unknown" or (kind == "log" and looks_binary(head[:4096])):
        raise UploadRejected(
            "file is not a text log, Flight Recorder dump, profiler trace or hardware stats "
            "(it looks like binary data); send one of those, plain or gzip"
        )

    now = timezone.now()
    host, _ = Host.objects.get_or_create(hostname=hostname)
    job, _ = Job.objects.get_or_create(external_id=job_id)
    existing = Upload.objects.filter(sha256=sha256, host=host, job=job).first()
    if existing is not None:
        return Received(existing, created=False)

    # The blob is content-addressed: written before the row, it is never half of an upload, and
    # the same bytes from another host reuse it.
    storage = Upload._meta.get_field("blob").storage
    name = f"uploads/{sha256[:2]}/{sha256}{'.gz' if compressed else ''}"
    if not storage.exists(name):
        name = storage.save(name, File(fileobj, name=name))
    try:
        with transaction.atomic():
            attempt, _ = Attempt.objects.get_or_create(job=job, number=attempt_number)
            upload = Upload.objects.create(
                sha256=sha256,
                kind=kind,
                size=size,
                compressed=compressed,
                filename=filename[:255],
                host=host,
                job=job,
                attempt=attempt,
                rank=rank,
                blob=name,
                key=key,
                received_at=now,
            )
            Host.objects.filter(pk=host.pk).update(last_seen=now)
            if rank is not None:
                RankPlacement.objects.get_or_create(
                    attempt=attempt, rank=rank, defaults={"host": host}
                )
            artifact_requests_fulfil(upload)
            from ingest.tasks import upload_parse

            upload_parse.delay_on_commit(upload.pk)
    except IntegrityError:
        # The same bytes arrived concurrently on another connection: that one won.
        existing = Upload.objects.filter(sha256=sha256, host=host, job=job).first()
        if existing is None:
            raise
        return Received(existing, created=False)
    return Received(upload, created=True)


def _claim(upload_id: int) -> bool:
    now = timezone.now()
    return bool(
        Upload.objects.filter(pk=upload_id)
        .filter(
            Q(status=Upload.Status.RECEIVED)
            | Q(status=Upload.Status.PARSING, parsed_at__lt=now - STALE_CLAIM)
        )
        .update(status=Upload.Status.PARSING, parsed_at=now)
    )


def upload_parse(upload_id: int) -> None:
    """Parse one upload into events. Safe to run twice: the claim lets one run through."""
    if not _claim(upload_id):
        return
    upload = Upload.objects.select_related("attempt").get(pk=upload_id)
    try:
        with upload.blob.open("rb") as stream:
            result = parse_artifact(
                stream, kind=upload.kind, source=upload.filename or f"upload-{upload.pk}"
            )
    except OSError as exc:
        Upload.objects.filter(pk=upload_id).update(
            status=Upload.Status.FAILED, error=f"artifact unreadable: {exc}"[:2000]
        )
        return
    rows = [
        Event(
            upload=upload,
            attempt_id=upload.attempt_id,
            kind=event.kind,
            rank=event.rank if event.rank is not None else upload.rank,
            line=event.line,
            text=event.text[:MAX_EVENT_TEXT],
            attrs=event.attrs(),
        )
        for event in result.events
    ]
    ranks = sorted({r.rank for r in rows if r.rank is not None})
    problems = "; ".join(f"line {i.line}: {i.message}" for i in result.issues[:20])
    now = timezone.now()
    with transaction.atomic():
        Event.objects.filter(upload=upload).delete()
        Event.objects.bulk_create(rows, batch_size=1000)
        Upload.objects.filter(pk=upload_id).update(
            status=Upload.Status.PARSED,
            parsed_at=now,
            line_count=result.lines,
            event_count=len(rows),
            ranks=ranks,
            error=problems[:4000],
        )
        Attempt.objects.filter(pk=upload.attempt_id).update(last_parsed_at=now)
        from analysis.tasks import attempt_classify

        transaction.on_commit(
            lambda: attempt_classify.apply_async(
                (upload.attempt_id,), countdown=settings.FLEETWATCH_SETTLE_SECONDS
            )
        )


def upload_mark_failed(upload_id: int, reason: str) -> None:
    Upload.objects.filter(pk=upload_id).update(status=Upload.Status.FAILED, error=reason[:4000])


def artifact_requests_for_incident(incident, attempt: Attempt) -> int:
    """Ask for the raw profiler trace of every suspect rank whose summary was uploaded: the
    summary named the rank, the full trace shows why. Returns how many requests are open."""
    from ingest.models import ArtifactRequest

    suspects = {
        int(s["id"]) for s in incident.suspects if s["kind"] == "rank" and s["id"].isdigit()
    }
    if not suspects:
        return 0
    summaries = Event.objects.filter(attempt=attempt, kind="trace_summary").values_list(
        "rank", "upload__host_id", "upload__filename"
    )
    made = 0
    for rank, host_id, filename in summaries:
        if rank in suspects and filename.endswith(".summary.json"):
            _, created = ArtifactRequest.objects.get_or_create(
                attempt=attempt,
                host_id=host_id,
                rank=rank,
                kind=Upload.Kind.TRACE,
                defaults={
                    "job_id": attempt.job_id,
                    "reason": f"raw trace of suspect rank {rank} (incident {incident.pk})",
                },
            )
            made += created
    return made


def artifact_requests_fulfil(upload: Upload) -> None:
    """A raw trace arrived: the requests it answers are done."""
    from ingest.models import ArtifactRequest

    if upload.kind != Upload.Kind.TRACE or upload.filename.endswith(".summary.json"):
        return
    ArtifactRequest.objects.filter(
        attempt=upload.attempt, host=upload.host, rank=upload.rank, fulfilled_at=None
    ).update(fulfilled_at=timezone.now(), upload=upload)
