"""Reads for incidents, hosts, culprits and jobs, shared by the UI and reports.

Every list read returns a lazy queryset (the caller paginates); every detail read is a fixed
number of queries whatever the size of the fleet, so pages stay fast at 100k incidents.
"""

from __future__ import annotations

import gzip
import re
from collections import defaultdict, deque
from collections.abc import Iterable
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

from analysis.attempts import upload_source_names
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
    "storage_recovered",
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
    owner: str = "",
    me: str = "",
) -> QuerySet:
    """``owner``: "mine" (assigned to ``me``) or "unowned"."""
    qs = Incident.objects.select_related("job", "attempt").defer(
        "evidence", "matches", "alternatives", "suspects", "journal", "fix"
    )
    if owner == "mine":
        qs = qs.filter(assignee=me)
    elif owner == "unowned":
        qs = qs.filter(assignee="")
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
    uploads = list(incident.attempt.uploads.all())
    names = upload_source_names(uploads)
    by_name = {names[u.pk]: u for u in uploads}
    out = []
    for item in incident.evidence:
        upload = by_name.get(item.get("file"))
        out.append({**item, "upload_id": upload.pk if upload else None})
    return out


_RANK_IN_FILE = re.compile(r"rank[_-]?(\d+)", re.IGNORECASE)


def rank_ranges(ranks: Iterable[int]) -> str:
    """``0–26, 28–2047``: sorted ranks as runs."""
    runs: list[list[int]] = []
    for rank in sorted(set(ranks)):
        if runs and rank == runs[-1][1] + 1:
            runs[-1][1] = rank
        else:
            runs.append([rank, rank])
    return ", ".join(f"{a}" if a == b else f"{a}–{b}" for a, b in runs)


def _evidence_rank(item: dict) -> int | None:
    from ingest.parsers.prefix import split_prefix

    rank = split_prefix(item.get("text", "")).rank
    if rank is None:
        m = _RANK_IN_FILE.search(item.get("file", ""))
        rank = int(m.group(1)) if m else None
    return rank


def evidence_groups(items: list[dict]) -> list[dict]:
    """Evidence deduplicated into its distinct templates (ranks, seqs, times as placeholders),
    in the order they first appear, each with how many lines and which ranks printed it: a
    2,048-rank timeout is one row, "ranks 0–26, 28–2047", not 2,048."""
    from analysis.classify.signature import parameterise
    from ingest.parsers.prefix import split_prefix

    groups: dict[tuple[str, str], dict] = {}
    for item in items:
        # Without the line's own prefix ("[rank5]:[E1121 03:12:44 …]"), which names the rank.
        body = split_prefix(item.get("text", "")).rest
        key = (item.get("signal", ""), parameterise(body)[:300])
        group = groups.get(key)
        if group is None:
            group = groups[key] = {**item, "count": 0, "rank_list": []}
        group["count"] += 1
        rank = _evidence_rank(item)
        if rank is not None:
            group["rank_list"].append(rank)
    out = []
    for group in groups.values():
        ranks = group.pop("rank_list")
        group["ranks"] = rank_ranges(ranks) if len(set(ranks)) > 1 else ""
        out.append(group)
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


def _awake(now: datetime | None = None) -> Q:
    now = now or timezone.now()
    return Q(snoozed_until__isnull=True) | Q(snoozed_until__lte=now)


def incidents_needing_attention(now: datetime | None = None) -> QuerySet:
    """Open and acknowledged incidents that are not snoozed: acknowledging one does not hide
    it, it shows who has it."""
    return incident_list().filter(
        _awake(now), status__in=[Incident.Status.OPEN, Incident.Status.ACKNOWLEDGED]
    )


def culprit_scores_top(limit: int = 10, now: datetime | None = None) -> QuerySet:
    """The worst culprits still to be dealt with: not resolved, muted or snoozed."""
    return (
        CulpritScore.objects.select_related("entity")
        .filter(_awake(now))
        .exclude(status__in=[CulpritScore.Status.RESOLVED, CulpritScore.Status.MUTED])
        .order_by("-flagged", "-score")[:limit]
    )


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
    hosts = Host.objects.filter(hostname__in=hostnames).order_by("hostname")[:limit]
    out = [h for h in memory.hosts_health_of(hosts, now).values() if h.verdict != "ok"]
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


HOST_SORTS = {
    "hostname": ("hostname",),
    "-score": (F("score").desc(nulls_last=True), "hostname"),
    "-last_incident": (F("last_incident").desc(nulls_last=True), "hostname"),
}


def host_list(query: str = "", *, verdict: str = "", sort: str = "hostname", now=None) -> QuerySet:
    """Hosts with their recurrence score, GPU count and last incident. ``verdict`` ("drain" or
    "watch") keeps the hosts host health gives that verdict (only hosts implicated within the
    memory window can have one: ``hosts_needing_attention``)."""
    score = CulpritScore.objects.filter(entity__kind="host", entity__key=OuterRef("hostname"))
    last = (
        Incident.objects.filter(
            Q(
                Exists(
                    RankPlacement.objects.filter(
                        attempt=OuterRef("attempt"), host=OuterRef(OuterRef("pk"))
                    )
                )
            )
        )
        .order_by("-opened_at")
        .values("opened_at")[:1]
    )
    qs = Host.objects.annotate(
        score=Subquery(score.values("score")[:1]),
        flagged=Subquery(score.values("flagged")[:1]),
        gpu_count=Count("gpus", distinct=True),
        last_incident=Subquery(last),
    ).order_by(*HOST_SORTS.get(sort, HOST_SORTS["hostname"]))
    if query:
        qs = qs.filter(Q(hostname__icontains=query) | Q(rack__icontains=query))
    if verdict in ("drain", "watch"):
        names = [
            h.hostname for h in hosts_needing_attention(now, limit=500) if h.verdict == verdict
        ]
        qs = qs.filter(hostname__in=names)
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


def culprit_list(
    *,
    culprit: str = "",
    flagged: bool | None = None,
    status: str = "",
    owner: str = "",
    me: str = "",
) -> QuerySet:
    """``owner``: "mine" (assigned to ``me``) or "unowned"."""
    qs = CulpritScore.objects.select_related("entity").order_by("-flagged", "-score", "pk")
    if culprit:
        qs = qs.filter(culprit=culprit)
    if flagged is not None:
        qs = qs.filter(flagged=flagged)
    if status:
        qs = qs.filter(status=status)
    if owner == "mine":
        qs = qs.filter(assignee=me)
    elif owner == "unowned":
        qs = qs.filter(assignee="")
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


def culprit_attempts(score: CulpritScore, limit: int = 50) -> list[Attempt]:
    """The failed attempts behind a score: those of its incidents, and for a setting or a
    version the failed attempts that ran with it (they may have no incident of their own)."""
    ids = set(score.attempts[:limit])
    ids |= set(
        Incident.objects.filter(pk__in=score.incidents[:limit]).values_list("attempt_id", flat=True)
    )
    return list(
        Attempt.objects.filter(pk__in=ids)
        .select_related("job", "incident")
        .order_by("-started_at", "-pk")[:limit]
    )


def incident_culprits(incident: Incident) -> list[CulpritScore]:
    """The culprits (scored entities) this incident implicates: incident → culprit links."""
    return list(
        CulpritScore.objects.filter(entity__implications__incident=incident)
        .select_related("entity")
        .distinct()
        .order_by("-flagged", "-score")[:8]
    )


def culprit_host(score: CulpritScore) -> str:
    """The host a host, GPU or NIC culprit lives on ("" for other kinds)."""
    if score.entity.kind in ("host", "gpu", "nic"):
        return score.entity.key.split("/", 1)[0]
    return ""


def host_culprits(host: Host) -> list[CulpritScore]:
    """The culprits that are this host, its GPUs or NICs, or its rack: host → culprit links."""
    query = Q(entity__kind="host", entity__key=host.hostname) | Q(
        entity__kind__in=["gpu", "nic"], entity__key__startswith=f"{host.hostname}/"
    )
    if host.rack:
        query |= Q(entity__kind="rack", entity__key=host.rack)
    return list(
        CulpritScore.objects.filter(query)
        .select_related("entity")
        .order_by("-flagged", "-score")[:8]
    )


def culprit_rack_hosts(score: CulpritScore, limit: int = 64) -> list[str]:
    """The hosts of a rack culprit, to go to (and drain) one by one."""
    if score.entity.kind != "rack":
        return []
    return list(
        Host.objects.filter(rack=score.entity.key)
        .order_by("hostname")
        .values_list("hostname", flat=True)[:limit]
    )


# What to do about a culprit whose incidents carry no fix of its class: a setting or a version
# contrasted across the fleet names no incident rule's fix.
_KIND_FIX = {
    "config": (
        "Run the affected jobs without {key} (or with the value the healthy attempts used) and "
        "watch the failure rate; if it falls to the fleet's, change the default."
    ),
    "version": (
        "Pin the affected jobs to another version than {key} and watch the failure rate; check "
        "the release notes of the versions after it for a fix."
    ),
}


def culprit_fix(score: CulpritScore, incidents: list[Incident]) -> str:
    fix = next((i.fix for i in incidents if i.fix and i.culprit == score.culprit), "")
    if fix:
        return fix
    template = _KIND_FIX.get(score.entity.kind)
    return template.format(key=score.entity.key) if template else ""


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
    # The parse's line index: the latest line known to start at or before ``first``, and where.
    start_line, start_offset = 1, 0
    for entry in upload.line_index or ():
        if isinstance(entry, list | tuple) and len(entry) == 2 and 1 <= entry[0] <= first:
            start_line, start_offset = int(entry[0]), int(entry[1])
    with upload.blob.open("rb") as raw:
        head = raw.read(2)
        raw.seek(0)
        reader = gzip.GzipFile(fileobj=raw) if head == GZIP_MAGIC else raw
        if start_offset:
            # Plain files seek at once; gzip inflates up to the offset in C, not line by line.
            reader.seek(start_offset)
            number = start_line - 1
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


# A timeline longer than this is shown grouped by state first, the per-rank rows folded away.
TIMELINE_ROWS_SHOWN = 64


def rank_state(row: RankRow) -> str:
    if row.never_reported:
        return "never reported"
    if row.lagged:
        return "lagged"
    if row.timed_out:
        return "timed out waiting"
    return "reported"


def timeline_groups(rows: list[RankRow]) -> list[dict]:
    """The rank timeline grouped by what the ranks did: state, the collective they were stuck
    in and the last one they completed; the odd ones out first (fewest ranks first)."""
    groups: dict[tuple, dict] = {}
    for row in rows:
        state = rank_state(row)
        key = (state, row.op, row.failed_seq, row.last_completed)
        group = groups.setdefault(
            key,
            {
                "state": state,
                "op": row.op,
                "failed_seq": row.failed_seq,
                "last_completed": row.last_completed,
                "rank_list": [],
                "hosts": set(),
            },
        )
        group["rank_list"].append(row.rank)
        if row.host:
            group["hosts"].add(row.host)
    out = []
    for group in groups.values():
        ranks = group.pop("rank_list")
        hosts = sorted(group.pop("hosts"))
        group.update(
            ranks=rank_ranges(ranks),
            count=len(ranks),
            hosts=", ".join(hosts[:3]) + (f" and {len(hosts) - 3} more" if len(hosts) > 3 else ""),
        )
        out.append(group)
    return sorted(out, key=lambda g: (g["count"], g["state"]))


@dataclass
class RuleRow:
    id: str
    culprit: str
    description: str
    basis: str
    fix: str
    corpus_named: int = 0
    corpus_right: int = 0
    fleet_named: int = 0  # incidents it named whose culprit an operator labelled
    fleet_right: int = 0  # ... and the label agreed

    @property
    def corpus_precision(self) -> float | None:
        return self.corpus_right / self.corpus_named if self.corpus_named else None

    @property
    def fleet_precision(self) -> float | None:
        return self.fleet_right / self.fleet_named if self.fleet_named else None


def _labelled(journal: list) -> bool:
    """An operator's label: a reclassification, or a resolution with a note."""
    return any(
        j.get("action", "").startswith("reclassified")
        or (j.get("action") == "resolved" and (j.get("note") or "").strip())
        for j in journal or []
    )


def rules_precision() -> list[RuleRow]:
    """Every rule of the ruleset with its basis, its precision on the corpus's dev split (the
    calibration table) and on this fleet: of the incidents it named that an operator labelled
    (reclassified, or resolved with a note), how many kept its culprit."""
    from analysis.classify.engine import calibration
    from analysis.classify.registry import ALL_RULES, BASIS

    table = calibration()
    rows = {
        rule.id: RuleRow(
            id=rule.id,
            culprit=rule.culprit,
            description=rule.description,
            basis=BASIS.get(rule.id, ""),
            fix=rule.fix,
            corpus_named=table.get(rule.id, {}).get("named", 0),
            corpus_right=table.get(rule.id, {}).get("right", 0),
        )
        for rule in ALL_RULES
    }
    labelled = (
        Incident.objects.exclude(journal=[])
        .exclude(culprit="unknown", classified_culprit="")
        .values_list("culprit", "classified_culprit", "matches", "journal")
        .iterator(chunk_size=500)
    )
    for culprit, classified, matches, journal in labelled:
        if not _labelled(journal):
            continue
        said = classified or culprit  # what the classifier said
        naming = next((m["rule_id"] for m in matches or [] if m.get("culprit") == said), None)
        if naming in rows and said != "unknown":
            rows[naming].fleet_named += 1
            rows[naming].fleet_right += culprit == said
    return sorted(rows.values(), key=lambda r: (-r.fleet_named, -r.corpus_named, r.id))


def search(query: str, limit: int = 20) -> dict[str, list]:
    """Hosts, jobs and culprits whose name holds ``query``."""
    return {
        "hosts": list(
            Host.objects.filter(Q(hostname__icontains=query) | Q(rack__iexact=query)).order_by(
                "hostname"
            )[:limit]
        ),
        "jobs": list(
            Job.objects.filter(Q(external_id__icontains=query) | Q(name__icontains=query)).order_by(
                "-created_at"
            )[:limit]
        ),
        "culprits": list(
            CulpritScore.objects.filter(entity__key__icontains=query)
            .select_related("entity")
            .order_by("-flagged", "-score")[:limit]
        ),
    }
