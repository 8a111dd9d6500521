"""Reads for incidents, hosts, culprits and jobs, shared by the UI and reports.

Every list read returns a lazy queryset (the caller paginates); every detail read is a fixed
number of queries whatever the size of the fleet, so pages stay fast at 100k incidents.
"""

from __future__ import annotations

import gzip
from collections import defaultdict, deque
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.db.models import (
    Count,
    DurationField,
    Exists,
    ExpressionWrapper,
    F,
    Max,
    Min,
    OuterRef,
    Prefetch,
    Q,
    QuerySet,
    Subquery,
    Sum,
)
from django.db.models.functions import TruncDate
from django.utils import timezone

from analysis.models import CulpritScore, Implication, Incident
from fleet.models import Attempt, Host, Job, RankPlacement
from ingest.models import Event, Upload

INCIDENT_SORTS = {
    "opened": "opened_at",
    "-opened": "-opened_at",
    "confidence": "confidence",
    "-confidence": "-confidence",
    "culprit": "culprit",
    "status": "status",
}
HARDWARE_EVENT_KINDS = (
    "gpu_xid",
    "gpu_off_bus",
    "gpu_unreachable",
    "pcie_aer",
    "cuda_error",
    "nccl_ib_error",
    "nccl_ib_call_failed",
    "storage_stall",
    "host_oom_kill",
)
TIMELINE_EVENT_KINDS = ("watchdog_timeout", "work_progress", "heartbeat_timeout", "desync_report")


def _incidents_on_host(hostname: str):
    """An incident is on a host when one of its ranks ran there or the host sent an artifact."""
    placed = RankPlacement.objects.filter(attempt=OuterRef("attempt"), host__hostname=hostname)
    sent = Upload.objects.filter(attempt=OuterRef("attempt"), host__hostname=hostname)
    return Q(Exists(placed)) | Q(Exists(sent))


def incident_list(
    *,
    culprit: str = "",
    status: str = "",
    job: str = "",
    host: str = "",
    since: datetime | None = None,
    until: datetime | None = None,
    sort: str = "-opened",
) -> QuerySet:
    qs = Incident.objects.select_related("job", "attempt").defer(
        "evidence", "matches", "alternatives", "suspects", "journal", "fix"
    )
    if culprit:
        qs = qs.filter(culprit=culprit)
    if status:
        qs = qs.filter(status=status)
    if job:
        qs = qs.filter(job__external_id=job)
    if host:
        qs = qs.filter(_incidents_on_host(host))
    if since:
        qs = qs.filter(opened_at__gte=since)
    if until:
        qs = qs.filter(opened_at__lt=until)
    order = INCIDENT_SORTS.get(sort, "-opened_at")
    return qs.order_by(order, "-pk")


def incident_get(pk: int) -> Incident:
    return (
        Incident.objects.select_related("job", "attempt")
        .prefetch_related(
            Prefetch(
                "attempt__uploads",
                queryset=Upload.objects.select_related("host").order_by("rank", "id"),
            )
        )
        .get(pk=pk)
    )


def incident_evidence_links(incident: Incident) -> list[dict]:
    """Each evidence line with the upload it came from, so the page can link to the raw line.
    Uses the prefetched uploads of ``incident_get``."""
    by_name = {u.filename: u for u in incident.attempt.uploads.all()}
    out = []
    for item in incident.evidence:
        upload = by_name.get(item.get("file"))
        out.append({**item, "upload_id": upload.pk if upload else None})
    return out


@dataclass
class RankRow:
    rank: int
    host: str = ""
    reported: bool = False
    last_completed: int | None = None
    failed_seq: int | None = None
    op: str = ""
    timed_out: bool = False
    lagged: bool = False
    never_reported: bool = False
    notes: list[str] = field(default_factory=list)


def incident_rank_timeline(incident: Incident, limit: int = 5000) -> list[RankRow]:
    """Per rank: the last collective it completed, the one it timed out in, whether it lagged
    behind the others (completed less) and whether it never reported at all."""
    attempt = incident.attempt
    rows: dict[int, RankRow] = {}
    hosts = dict(attempt.placements.values_list("rank", "host__hostname"))
    world = attempt.world_size or 0
    for rank in range(world):
        rows[rank] = RankRow(rank, host=hosts.get(rank, ""))
    for upload in attempt.uploads.all():  # prefetched by incident_get
        if upload.rank is not None:
            row = rows.setdefault(upload.rank, RankRow(upload.rank))
            row.reported = True
            row.host = row.host or upload.host.hostname
    events = Event.objects.filter(attempt=attempt, kind__in=TIMELINE_EVENT_KINDS).exclude(rank=None)
    for kind, rank, attrs in events.values_list("kind", "rank", "attrs")[:limit]:
        row = rows.setdefault(rank, RankRow(rank, host=hosts.get(rank, "")))
        row.reported = True
        if kind == "work_progress":
            done = attrs.get("last_completed")
            if done is not None:
                row.last_completed = max(row.last_completed or done, done)
            row.failed_seq = attrs.get("failed_seq") or row.failed_seq
        elif kind == "watchdog_timeout":
            row.timed_out = True
            row.op = attrs.get("op") or row.op
            row.failed_seq = attrs.get("seq") or row.failed_seq
            if row.last_completed is None and row.failed_seq:
                row.last_completed = row.failed_seq - 1
        else:
            row.notes.append(kind)
    completed = [r.last_completed for r in rows.values() if r.last_completed is not None]
    ahead = max(completed) if completed else None
    suspects = {str(s.get("id")) for s in incident.suspects if s.get("kind") == "rank"}
    for row in rows.values():
        row.never_reported = not row.reported
        behind = ahead is not None and row.last_completed is not None and row.last_completed < ahead
        row.lagged = behind or str(row.rank) in suspects
    return [rows[r] for r in sorted(rows)]


def incident_hardware_events(incident: Incident, hours: int = 6, limit: int = 50) -> list[Event]:
    """Hardware, network and storage events of this attempt, and those the same hosts reported
    around the time of the failure (kernel logs arrive as separate uploads)."""
    attempt = incident.attempt
    hosts = set(attempt.placements.values_list("host_id", flat=True))
    hosts |= {u.host_id for u in attempt.uploads.all()}
    around = Q(
        upload__host_id__in=hosts,
        upload__received_at__gte=incident.opened_at - timedelta(hours=hours),
        upload__received_at__lte=incident.opened_at + timedelta(hours=hours),
    )
    return list(
        Event.objects.filter(Q(attempt=attempt) | around, kind__in=HARDWARE_EVENT_KINDS)
        .select_related("upload__host")
        .only("kind", "line", "text", "rank", "upload__filename", "upload__host__hostname")
        .order_by("upload_id", "line")[:limit]
    )


@dataclass(frozen=True)
class Similar:
    ordinal: int  # this incident is the Nth with its fingerprint in the window
    total: int  # in the window
    days: int
    recent: list


def incident_similar(incident: Incident, days: int = 30, limit: int = 10) -> Similar:
    if not incident.fingerprint:
        return Similar(1, 1, days, [])
    same = Incident.objects.filter(
        fingerprint=incident.fingerprint,
        opened_at__gte=incident.opened_at - timedelta(days=days),
    )
    counts = same.aggregate(
        total=Count("pk"), before=Count("pk", filter=Q(opened_at__lte=incident.opened_at))
    )
    recent = list(
        same.exclude(pk=incident.pk)
        .select_related("job")
        .only("opened_at", "culprit", "status", "job__external_id")
        .order_by("-opened_at")[:limit]
    )
    return Similar(counts["before"], counts["total"], days, recent)


# --- fleet overview -----------------------------------------------------------------------------


def incidents_per_day(days: int = 14, now: datetime | None = None) -> dict:
    """{"days": [...], "series": {culprit: [count per day]}} — one grouped query."""
    now = now or timezone.now()
    start = (now - timedelta(days=days - 1)).date()
    rows = (
        Incident.objects.filter(opened_at__date__gte=start)
        .annotate(day=TruncDate("opened_at"))
        .values("day", "culprit")
        .annotate(n=Count("pk"))
        .order_by()
    )
    labels = [start + timedelta(days=i) for i in range(days)]
    index = {d: i for i, d in enumerate(labels)}
    series: dict[str, list[int]] = defaultdict(lambda: [0] * days)
    for row in rows:
        if row["day"] in index:
            series[row["culprit"]][index[row["day"]]] += row["n"]
    return {"days": [d.isoformat() for d in labels], "series": dict(sorted(series.items()))}


def culprit_scores_top(limit: int = 10) -> QuerySet:
    return CulpritScore.objects.select_related("entity").order_by("-flagged", "-score")[:limit]


def hosts_needing_attention(now: datetime | None = None, limit: int = 40) -> list:
    """Host health for the hosts implicated within the memory window (the only ones that can be
    anything but ok), worst first; never more than ``limit`` host_health calls."""
    from analysis import memory

    now = now or timezone.now()
    since = now - timedelta(days=memory.window_days())
    keys = (
        Implication.objects.filter(entity__kind__in=["host", "gpu", "nic"], at__gte=since)
        .values_list("entity__key", flat=True)
        .distinct()
    )
    hostnames = {key.split("/", 1)[0] for key in keys[: limit * 8]}
    out = []
    for host in Host.objects.filter(hostname__in=hostnames).order_by("hostname")[:limit]:
        health = memory.host_health(host, now)
        if health.verdict != "ok":
            out.append(health)
    rank = {"drain": 0, "watch": 1}
    return sorted(out, key=lambda h: (rank[h.verdict], -h.score, h.hostname))


@dataclass(frozen=True)
class IngestHealth:
    pending: int
    oldest_pending: datetime | None
    lag_seconds: float
    failed_24h: int
    recent_failures: list
    received_24h: int


def ingest_health(now: datetime | None = None) -> IngestHealth:
    now = now or timezone.now()
    waiting = Upload.objects.filter(status__in=[Upload.Status.RECEIVED, Upload.Status.PARSING])
    pending = waiting.aggregate(n=Count("pk"), oldest=Min("received_at"))
    day = now - timedelta(hours=24)
    recent = Upload.objects.filter(received_at__gte=day).aggregate(
        n=Count("pk"), failed=Count("pk", filter=Q(status=Upload.Status.FAILED))
    )
    failures = list(
        Upload.objects.filter(status=Upload.Status.FAILED)
        .select_related("host", "job")
        .only("filename", "error", "received_at", "host__hostname", "job__external_id")
        .order_by("-received_at")[:10]
    )
    oldest = pending["oldest"]
    return IngestHealth(
        pending=pending["n"],
        oldest_pending=oldest,
        lag_seconds=(now - oldest).total_seconds() if oldest else 0.0,
        failed_24h=recent["failed"],
        recent_failures=failures,
        received_24h=recent["n"],
    )


# --- hosts, culprits, jobs ----------------------------------------------------------------------


def host_list(query: str = "") -> QuerySet:
    score = CulpritScore.objects.filter(entity__kind="host", entity__key=OuterRef("hostname"))
    qs = Host.objects.annotate(
        score=Subquery(score.values("score")[:1]),
        flagged=Subquery(score.values("flagged")[:1]),
        gpu_count=Count("gpus", distinct=True),
    ).order_by("hostname")
    if query:
        qs = qs.filter(Q(hostname__icontains=query) | Q(rack__icontains=query))
    return qs


def host_incidents(host: Host) -> QuerySet:
    return incident_list(host=host.hostname)


def host_hardware_events(host: Host, limit: int = 50) -> list[Event]:
    """The host's recent hardware events (Xids, bus drops, IB errors, stalls), newest uploads
    first — the GPU/NIC counters an operator checks before draining."""
    uploads = Upload.objects.filter(host=host).order_by("-received_at").values("pk")[:200]
    return list(
        Event.objects.filter(upload_id__in=Subquery(uploads), kind__in=HARDWARE_EVENT_KINDS)
        .select_related("upload")
        .only("kind", "line", "text", "attrs", "upload__filename", "upload__received_at")
        .order_by("-upload__received_at", "line")[:limit]
    )


def host_gpu_counters(host: Host, limit: int = 100) -> list[dict]:
    """NVML readings the agent uploaded for this host, newest first: ECC, row remaps, NVLink
    and PCIe error counters, temperature, power and throttle reasons over time."""
    uploads = (
        Upload.objects.filter(host=host, kind=Upload.Kind.HW_STATS)
        .order_by("-received_at")
        .values("pk")[:100]
    )
    rows = (
        Event.objects.filter(upload_id__in=Subquery(uploads), kind="gpu_health")
        .select_related("upload")
        .only("attrs", "upload__received_at")
        .order_by("-upload__received_at", "line")[:limit]
    )
    return [{"received_at": e.upload.received_at, **e.attrs} for e in rows]


def host_nic_counters(host: Host, limit: int = 100) -> list[dict]:
    """InfiniBand/RoCE port error counters the agent uploaded for this host, newest first."""
    uploads = (
        Upload.objects.filter(host=host, kind=Upload.Kind.HW_STATS)
        .order_by("-received_at")
        .values("pk")[:100]
    )
    rows = (
        Event.objects.filter(upload_id__in=Subquery(uploads), kind="nic_health")
        .select_related("upload")
        .only("attrs", "upload__received_at")
        .order_by("-upload__received_at", "line")[:limit]
    )
    return [{"received_at": e.upload.received_at, **e.attrs} for e in rows]


def culprit_list(*, culprit: str = "", flagged: bool | None = None) -> QuerySet:
    qs = CulpritScore.objects.select_related("entity").order_by("-flagged", "-score", "pk")
    if culprit:
        qs = qs.filter(culprit=culprit)
    if flagged is not None:
        qs = qs.filter(flagged=flagged)
    return qs


def culprit_get(pk: int) -> CulpritScore:
    return CulpritScore.objects.select_related("entity").get(pk=pk)


def culprit_incidents(score: CulpritScore, limit: int = 100) -> list[Incident]:
    ids = list(score.incidents[:limit])
    return list(
        Incident.objects.filter(pk__in=ids)
        .select_related("job", "attempt")
        .defer("evidence", "matches", "alternatives", "suspects", "journal")
        .order_by("-opened_at")
    )


def culprit_trend(incidents: list[Incident], days: int = 14, now=None) -> dict:
    now = now or timezone.now()
    start = (now - timedelta(days=days - 1)).date()
    counts = [0] * days
    for incident in incidents:
        i = (incident.opened_at.date() - start).days
        if 0 <= i < days:
            counts[i] += 1
    return {"days": [(start + timedelta(days=i)).isoformat() for i in range(days)], "n": counts}


_FAILED_DURATION = ExpressionWrapper(
    F("attempts__ended_at") - F("attempts__started_at"), output_field=DurationField()
)


def job_list(query: str = "") -> QuerySet:
    failed = Q(attempts__status=Attempt.Status.FAILED)
    qs = Job.objects.annotate(
        attempt_count=Count("attempts", distinct=True),
        failure_count=Count("attempts", filter=failed, distinct=True),
        time_lost=Sum(_FAILED_DURATION, filter=failed & Q(attempts__ended_at__isnull=False)),
        last_started=Max("attempts__started_at"),
    ).order_by("-created_at", "-pk")
    if query:
        qs = qs.filter(Q(external_id__icontains=query) | Q(name__icontains=query))
    return qs


def job_get(pk: int) -> Job:
    attempts = Attempt.objects.select_related("incident").order_by("number")
    return job_list().prefetch_related(Prefetch("attempts", queryset=attempts)).get(pk=pk)


# --- raw artifacts ------------------------------------------------------------------------------

GZIP_MAGIC = b"\x1f\x8b"


@dataclass(frozen=True)
class ArtifactWindow:
    lines: list[tuple[int, str, bool]]  # (number, text, truncated)
    first: int
    last: int
    target: int
    at_end: bool  # the file ended inside the window


def artifact_window(
    upload: Upload, line: int, *, before: int = 40, after: int = 60, max_chars: int = 2000
) -> ArtifactWindow:
    """Lines ``line-before .. line+after`` of the blob, read as a stream (plain or gzip): memory
    is bounded by the window and ``max_chars`` whatever the size of the file or of a line."""
    line = max(1, line)
    first = max(1, line - before)
    last = line + after
    window: deque = deque()
    number = 0
    at_end = False
    with upload.blob.open("rb") as raw:
        head = raw.read(2)
        raw.seek(0)
        reader = gzip.GzipFile(fileobj=raw) if head == GZIP_MAGIC else raw
        while number < last:
            chunk = reader.readline(max_chars + 1)
            if not chunk:
                at_end = True
                break
            number += 1
            truncated = len(chunk) > max_chars and not chunk.endswith(b"\n")
            if truncated:
                # Skip the rest of an over-long line in bounded reads.
                rest = chunk
                while rest and not rest.endswith(b"\n"):
                    rest = reader.readline(64 * 1024)
            if number >= first:
                text = chunk[:max_chars].decode("utf-8", errors="replace").rstrip("\r\n")
                window.append((number, text, truncated))
    return ArtifactWindow(list(window), first, number if at_end else last, line, at_end)
