"""Writes for uploads: receive (the API) and parse (the worker)."""

from __future__ import annotations

import errno
import hashlib
import json
import logging
import time
import zlib
from dataclasses import dataclass
from datetime import timedelta
from functools import partial

from django.conf import settings
from django.core.files.base import File
from django.db import IntegrityError, connection, transaction
from django.db.models import F, Q
from django.utils import timezone
from kombu.exceptions import OperationalError as KombuOperationalError

from fleet.models import Attempt, Host, Job, RankPlacement
from ingest.models import AgentKey, Event, Upload
from ingest.parsers import parse_artifact
from ingest.parsers.detect import detect_kind, is_gzip, looks_binary
from ingest.parsers.events import event_row, storable_text

log = logging.getLogger(__name__)

READ_BLOCK = 1 << 20
# Parse runs an upload may start before it is failed: one that took its worker down this many
# times (killed at the time limit, out of memory) is a poison message, not bad luck.
MAX_PARSE_TRIES = 3
# After a publish failed, this process does not try the broker again for this long.
BROKER_BACKOFF = timedelta(seconds=5)
_broker_down_until = 0.0
# The artifact store has no room: answered 507, and the agent keeps the file and comes back.
NO_SPACE = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG})


class UploadRejected(ValueError):
    """The upload cannot be accepted; ``status`` is the HTTP status to answer with."""

    def __init__(self, message: str, status: int = 400):
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class Received:
    upload: Upload
    created: bool


# The request inflates a gzip upload only as far as FLEETWATCH_REQUEST_INFLATE_BYTES: every
# upload that inflates to less is checked whole here (corrupt, truncated, over the bound:
# 400/413 with the reason). Past it the request stops inflating and stores the bytes; the parse
# in the worker reads the rest under its time limit and keeps what precedes a cut.
# DEFLATE cannot exceed 1032x (a 258-byte match in two bits); only runs of one byte value come
# near it. A log does not: one line repeated verbatim compresses about 300x, NCCL INFO 8x. Past
# this ratio (measured once a few MiB are out) the stream is a bomb, refused at once.
BOMB_RATIO = 1000
BOMB_CHECK_AFTER = 16 * 1024 * 1024


def _scan(fileobj) -> tuple[str, int, bytes, bool]:
    """sha256, size, the (decompressed) head, and whether it is gzip — checking on the way
    that a gzip stream is whole and does not inflate beyond the configured bound (as far as
    FLEETWATCH_REQUEST_INFLATE_BYTES; see above) or like a bomb."""
    digest = hashlib.sha256()
    size = 0
    head = b""
    inflater = None
    inflating = False
    inflated = consumed = 0
    limit = settings.FLEETWATCH_MAX_INFLATED_BYTES
    fileobj.seek(0)
    while block := fileobj.read(READ_BLOCK):
        if size == 0 and is_gzip(block):
            inflater = zlib.decompressobj(16 + zlib.MAX_WBITS)
            inflating = True
        size += len(block)
        if size > settings.FLEETWATCH_MAX_UPLOAD_BYTES:
            raise UploadRejected(
                f"file is larger than the {settings.FLEETWATCH_MAX_UPLOAD_BYTES} byte limit", 413
            )
        digest.update(block)
        if inflating:
            try:
                data = block
                while data:
                    if inflater.eof:
                        # Another gzip member (concatenated gzip, zero padding between members):
                        # every gzip reader, the parsers' too, inflates it, so it counts too.
                        before = len(data)
                        data = data.lstrip(b"\0")
                        consumed += before - len(data)
                        if not data:
                            break
                        inflater = zlib.decompressobj(16 + zlib.MAX_WBITS)
                    # Inflate in bounded steps so a gzip bomb never sits in memory whole.
                    fed = len(data)
                    chunk = inflater.decompress(data, READ_BLOCK)
                    while True:
                        inflated += len(chunk)
                        if len(head) < 65536:
                            head += chunk[: 65536 - len(head)]
                        if inflated > limit:
                            raise UploadRejected(
                                f"gzip content inflates beyond the {limit} byte limit", 413
                            )
                        # What of ``data`` is not consumed yet (at a member's end, unused_data).
                        left = len(
                            inflater.unused_data if inflater.eof else inflater.unconsumed_tail
                        )
                        if inflated >= BOMB_CHECK_AFTER and inflated > BOMB_RATIO * (
                            consumed + fed - left
                        ):
                            raise UploadRejected(
                                f"gzip content inflates more than {BOMB_RATIO}x (a run of one "
                                "byte value, not a log): refused as a decompression bomb",
                                413,
                            )
                        if inflated >= settings.FLEETWATCH_REQUEST_INFLATE_BYTES:
                            inflating = False  # the rest is the worker's (see above)
                            break
                        # At a member's end what follows is in unused_data (and unconsumed_tail
                        # still holds it too: inflating that again would loop for ever).
                        if inflater.eof or not inflater.unconsumed_tail:
                            break
                        chunk = inflater.decompress(inflater.unconsumed_tail, READ_BLOCK)
                    consumed += fed - (len(inflater.unused_data) if inflater.eof else 0)
                    if not inflating:
                        break
                    data = inflater.unused_data if inflater.eof else b""
            except zlib.error as exc:
                raise UploadRejected(f"gzip stream is corrupt: {exc}") from exc
        elif inflater is None and len(head) < 65536:
            head += block[: 65536 - len(head)]
    if inflating and not inflater.eof:
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
    same = {"sha256": sha256, "host": host, "job": job, "attempt__number": attempt_number}
    existing = Upload.objects.filter(**same, rank=rank).first()
    if existing is not None:
        return Received(existing, created=False)

    # The blob is content-addressed: written before the row, it is never half of an upload, and
    # the same bytes from another host reuse it.
    storage = Upload._meta.get_field("blob").storage
    name = f"uploads/{sha256[:2]}/{sha256}{'.gz' if compressed else ''}"
    if not storage.exists(name):
        try:
            name = storage.save(name, File(fileobj, name=name))
        except OSError as exc:
            if exc.errno not in NO_SPACE:
                raise
            # The storage backend leaves no partial blob (ingest/storage.py) and no row exists.
            log.error("artifact storage full: upload of %d bytes from %s refused", size, hostname)
            raise UploadRejected(
                f"artifact storage is full ({exc.strerror}): the {size} byte file was not "
                "stored; keep it and send it again later",
                507,
            ) from exc
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
            # After commit, and never failing the request: the row is the record (outbox).
            transaction.on_commit(partial(task_publish, "ingest.tasks.upload_parse", upload.pk))
    except IntegrityError:
        # The same bytes arrived concurrently on another connection: that one won.
        existing = Upload.objects.filter(**same, rank=rank).first()
        if existing is None:
            raise
        return Received(existing, created=False)
    return Received(upload, created=True)


def task_publish(task, *args, **options) -> bool:
    """Send a task (or the task registered under a name: a service publishes by name, so that
    it never imports the tasks that import it) to the broker; when the broker is down, log it
    and return False.

    Called after a commit, so the row is already the record: the request (or the task) that
    committed it must not fail now, and ``uploads_sweep`` re-enqueues what never got a message.
    The publish itself is bounded (CELERY_TASK_PUBLISH_RETRY_POLICY and the transport's
    timeouts), and after a failure this process leaves the broker alone for BROKER_BACKOFF, so
    during an outage a burst of uploads is answered at full speed rather than each one waiting
    out the retries. Eager mode (no broker) runs the task here and lets its errors through, or
    after its countdown on a timer thread (``fleet.celery.EagerCountdowns``)."""
    global _broker_down_until
    if isinstance(task, str):
        from celery import current_app

        task = current_app.tasks[task]  # registered by each app's ready() (see apps.py)
    if task.app.conf.task_always_eager:
        countdown = options.pop("countdown", 0) or 0
        if countdown > 0:
            from fleet.celery import eager_countdowns

            eager_countdowns.schedule(task, args, countdown)
        else:
            task.apply_async(args, **options)
        return True
    if time.monotonic() < _broker_down_until:
        log.info("broker unreachable moments ago: %s%r left to the sweeper", task.name, args)
        return False
    try:
        task.apply_async(args, **options)
    except (KombuOperationalError, OSError) as exc:
        _broker_down_until = time.monotonic() + BROKER_BACKOFF.total_seconds()
        log.warning("could not enqueue %s%r (%s); the sweeper will", task.name, args, exc)
        return False
    return True


def parse_lease() -> timedelta:
    """A parse claim not renewed for this long belongs to a worker that died: another may take
    it over (the sweep re-publishes it)."""
    return timedelta(seconds=settings.FLEETWATCH_PARSE_LEASE_SECONDS)


def parse_lease_renewed(upload_id: int):
    """The upload's parse claim renewed while the block runs: a parse of a big log runs for
    minutes (fleet.celery.lease_renewed)."""
    from fleet.celery import lease_renewed

    def renew() -> None:
        Upload.objects.filter(pk=upload_id, status=Upload.Status.PARSING).update(
            parsed_at=timezone.now()
        )

    return lease_renewed(f"upload {upload_id} parse", renew, parse_lease().total_seconds())


def _claim(upload_id: int, *, takeover: bool = False, retry: bool = False) -> bool:
    now = timezone.now()
    claimable = Q(status=Upload.Status.RECEIVED) | Q(
        status=Upload.Status.PARSING, parsed_at__lt=now - parse_lease()
    )
    if takeover or retry:
        # The claim's holder is gone: the broker re-delivered its message because the worker
        # died (acks_late), or this is the retry of a run that failed. Taking over is safe:
        # a parse replaces the upload's events in one transaction under a row lock.
        claimable |= Q(status=Upload.Status.PARSING)
    if retry:
        # The run before this one reported back (a database error): it does not count.
        claim = {}
    else:
        claimable &= Q(parse_tries__lt=MAX_PARSE_TRIES)
        claim = {"parse_tries": F("parse_tries") + 1}
    claimed = (
        Upload.objects.filter(pk=upload_id)
        .filter(claimable)
        .update(status=Upload.Status.PARSING, parsed_at=now, **claim)
    )
    if not claimed and not retry:
        spent = Upload.objects.filter(
            pk=upload_id,
            status__in=[Upload.Status.RECEIVED, Upload.Status.PARSING],
            parse_tries__gte=MAX_PARSE_TRIES,
        )
        if spent.update(
            status=Upload.Status.FAILED,
            error=f"the parse never finished: {MAX_PARSE_TRIES} runs each ended with their "
            "worker killed (the time limit, memory) or crashed; not tried again. The artifact "
            "is kept.",
        ):
            log.error("upload %s: its parse took %d workers down", upload_id, MAX_PARSE_TRIES)
            upload_failed_notify(upload_id)
    return bool(claimed)


def upload_parse(upload_id: int, *, takeover: bool = False, retry: bool = False) -> None:
    """Parse one upload into events. Safe to run twice: the claim lets one run through, and a
    run that takes over a claim (``takeover``, or the ``retry`` after a database error)
    replaces, never adds to, the events."""
    if not _claim(upload_id, takeover=takeover, retry=retry):
        return
    with parse_lease_renewed(upload_id):
        _parse_claimed(upload_id)


def _parse_claimed(upload_id: int) -> None:
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
        upload_failed_notify(upload_id)
        attempt_classify_soon(upload.attempt_id)
        return
    # Bounded and storable on every backend: the content is untrusted.
    rows = [(event.kind, event_row(event, default_rank=upload.rank)) for event in result.events]
    ranks = sorted({row["rank"] for _, row in rows if row["rank"] is not None})
    problems = "; ".join(
        f"line {i.line}: {i.message}" if i.line else i.message for i in result.issues[:20]
    )
    # Accepted but unreadable as its kind (a refused pickle, a truncated dump): failed, saying why.
    unreadable = not result.complete and not rows
    now = timezone.now()
    with transaction.atomic():
        # Two runs of one upload (a take-over while the first was still alive) serialise on the
        # row, so the second deletes what the first committed instead of adding to it.
        if not list(Upload.objects.select_for_update().filter(pk=upload_id).values_list("pk")):
            return
        Event.objects.filter(upload=upload).delete()
        events_insert(upload, rows)
        Upload.objects.filter(pk=upload_id).update(
            status=Upload.Status.FAILED if unreadable else Upload.Status.PARSED,
            parsed_at=now,
            line_count=result.lines,
            line_index=[list(entry) for entry in result.line_index],
            event_count=len(rows),
            ranks=ranks,
            error=storable_text(problems[:4000]),
        )
        # New events: a classification that gave up on the old ones may try again in full.
        Attempt.objects.filter(pk=upload.attempt_id).update(last_parsed_at=now, classify_tries=0)
        transaction.on_commit(partial(attempt_classify_soon, upload.attempt_id))
        if unreadable:
            transaction.on_commit(partial(upload_failed_notify, upload_id))


EVENT_COLUMNS = ("upload_id", "attempt_id", "kind", "rank", "line", "text", "attrs")


def events_insert(upload: Upload, rows: list[tuple[str, dict]]) -> None:
    """Store one upload's events: ``COPY`` on PostgreSQL (a burst of 2,000 uploads is 80,000
    rows, and an INSERT's parameters cost more to bind than the rows to store), ``bulk_create``
    elsewhere."""
    if connection.vendor != "postgresql":
        Event.objects.bulk_create(
            [
                Event(upload=upload, attempt_id=upload.attempt_id, kind=kind, **row)
                for kind, row in rows
            ],
            batch_size=1000,
        )
        return
    columns = ", ".join(EVENT_COLUMNS)
    with (
        connection.cursor() as cursor,
        cursor.cursor.copy(f"COPY {Event._meta.db_table} ({columns}) FROM STDIN") as copy,
    ):
        for kind, row in rows:
            copy.write_row(
                (
                    upload.pk,
                    upload.attempt_id,
                    kind,
                    row["rank"],
                    row["line"],
                    row["text"],
                    json.dumps(row["attrs"], allow_nan=False),
                )
            )


def attempt_classify_soon(attempt_id: int) -> None:
    """An upload of the attempt is done (committed): classify the attempt once the settle window
    has passed — unless another of its uploads is still to be parsed, whose parse will do this.
    So a burst of 2,000 parses schedules one or two classifications, not 2,000. Each parse looks
    after its own commit, so of two that finish together the one that looks last sees the other
    done: at least one schedules."""
    pending = Upload.objects.filter(
        attempt_id=attempt_id, status__in=[Upload.Status.RECEIVED, Upload.Status.PARSING]
    )
    if not pending.exists():
        task_publish(
            "analysis.tasks.attempt_classify",
            attempt_id,
            countdown=settings.FLEETWATCH_SETTLE_SECONDS,
        )


def uploads_sweep(now=None) -> dict[str, int]:
    """Re-enqueue the work that has no live message (beat, and whenever a worker starts).

    Uploads still received after the grace (their publish failed while the broker was down, or
    the broker lost the message), parse claims not renewed within their lease (a worker died and
    its message never came back), and attempts whose uploads all parsed but which were never
    classified after the settle window, or whose classification's claim outlived its lease.
    Each task is safe to run twice, so a message that was merely slow costs one no-op claim;
    what the sweep sent is marked and not sent again for FLEETWATCH_SWEEP_REPUBLISH_SECONDS, so
    a backlog (workers down) does not grow by every unfinished item each sweep, unless a worker
    claimed it after it was sent (the message was consumed) and then let the claim lapse. Stops
    at the first failed publish: the broker is down and the next sweep will try again."""
    now = now or timezone.now()
    grace = timedelta(seconds=settings.FLEETWATCH_SWEEP_GRACE_SECONDS)
    settle = timedelta(seconds=settings.FLEETWATCH_SETTLE_SECONDS)
    classify_lease = timedelta(seconds=settings.FLEETWATCH_CLASSIFY_LEASE_SECONDS)
    batch = settings.FLEETWATCH_SWEEP_BATCH
    sent_before = now - timedelta(seconds=settings.FLEETWATCH_SWEEP_REPUBLISH_SECONDS)
    uploads = list(
        Upload.objects.filter(
            Q(status=Upload.Status.RECEIVED, received_at__lt=now - grace)
            | Q(status=Upload.Status.PARSING, parsed_at__lt=now - parse_lease())
        )
        .filter(
            Q(published_at__isnull=True)
            | Q(published_at__lt=sent_before)
            # Claimed after the sweep sent it: that message was consumed, by a worker that is
            # gone now (its lease lapsed). No message is left to wait for.
            | Q(status=Upload.Status.PARSING, parsed_at__gt=F("published_at"))
        )
        .order_by("received_at")
        .values_list("pk", flat=True)[:batch]
    )
    attempts = list(
        Attempt.objects.filter(last_parsed_at__lt=now - settle - grace)
        .filter(Q(classified_at__isnull=True) | Q(classified_at__lt=F("last_parsed_at")))
        .filter(
            Q(classify_claimed_at__isnull=True) | Q(classify_claimed_at__lt=now - classify_lease)
        )
        .filter(
            Q(classify_published_at__isnull=True)
            | Q(classify_published_at__lt=sent_before)
            | Q(classify_claimed_at__gt=F("classify_published_at"))
        )
        .exclude(uploads__status__in=[Upload.Status.RECEIVED, Upload.Status.PARSING])
        .order_by("last_parsed_at")
        .values_list("pk", flat=True)[:batch]
    )
    sent = {"uploads": 0, "attempts": 0}
    work = (
        ("uploads", "ingest.tasks.upload_parse", uploads, Upload.objects, "published_at"),
        (
            "attempts",
            "analysis.tasks.attempt_classify",
            attempts,
            Attempt.objects,
            "classify_published_at",
        ),
    )
    for kind, task, ids, rows, marker in work:
        published = []
        try:
            for pk in ids:
                if not task_publish(task, pk):
                    log.warning("sweep stopped: the broker refused a message")
                    return sent
                published.append(pk)
                sent[kind] += 1
        finally:
            rows.filter(pk__in=published).update(**{marker: now})
    if any(sent.values()):
        log.info("sweep re-enqueued %(uploads)d uploads and %(attempts)d attempts", sent)
    return sent


def upload_mark_failed(upload_id: int, reason: str) -> None:
    if Upload.objects.filter(pk=upload_id).update(
        status=Upload.Status.FAILED, error=storable_text(reason[:4000])
    ):
        upload_failed_notify(upload_id)


def upload_failed_notify(upload_id: int) -> None:
    """An upload was failed (committed): tell the notification destinations that take
    ``ingest_failing``, at most once an hour (``fleet.notify``). A notification problem never
    breaks parsing: it is logged and the parse goes on."""
    try:
        from fleet.notify import notify_ingest_failing

        upload = Upload.objects.select_related("host", "job").filter(pk=upload_id).first()
        if upload is not None and upload.status == Upload.Status.FAILED:
            notify_ingest_failing(upload)
    except Exception:
        log.exception("upload %s failed, and notifying that failed too", upload_id)


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
                    "source_file": filename[:255],
                },
            )
            made += created
    return made


def artifact_request_answer(request_id: int, outcome: str, now=None) -> bool:
    """The agent's one answer to a request: it sent the file, or it has none. The first answer
    closes the request (a conditional update, so a repeated answer changes nothing)."""
    from ingest.models import ArtifactRequest

    return bool(
        ArtifactRequest.objects.filter(pk=request_id, outcome="").update(
            outcome=outcome, fulfilled_at=now or timezone.now()
        )
    )


def artifact_requests_fulfil(upload: Upload) -> None:
    """A raw trace arrived: the requests it answers are done."""
    from ingest.models import ArtifactRequest

    if upload.kind != Upload.Kind.TRACE or upload.filename.endswith(".summary.json"):
        return
    answered = ArtifactRequest.objects.filter(
        attempt=upload.attempt, host=upload.host, rank=upload.rank, upload=None
    )
    # The agent's "sent" answer may arrive before the file: link the file either way.
    answered.filter(fulfilled_at=None).update(fulfilled_at=timezone.now(), outcome="sent")
    answered.update(upload=upload)
