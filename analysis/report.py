"""The weekly reliability report: what failed, why, what it cost, and whether fixes held.

``weekly_report_numbers`` reads the database for one ISO week (and the week before, for the
changes); ``weekly_report_build`` claims the week's archive row, renders HTML with inline SVG
charts, a PDF (WeasyPrint) and mails both. A week is built once: a second build refuses unless
asked to rebuild, and every rebuild is logged on the row.
"""

from __future__ import annotations

import logging
from collections import Counter, defaultdict
from datetime import UTC, date, datetime, timedelta

from django.conf import settings
from django.core.files.base import ContentFile
from django.core.mail import EmailMultiAlternatives
from django.db import IntegrityError, transaction
from django.db.models import Q
from django.template.loader import render_to_string
from django.utils import timezone

from analysis import charts
from analysis.classify import CULPRITS
from analysis.models import CulpritScore, HostRepair, Implication, Incident, WeeklyReport
from analysis.models_ops import DrainAction
from fleet.models import Attempt

log = logging.getLogger(__name__)

# Job sizes (GPUs = ranks) that behave differently: one host, a few, a pod, a big run.
SIZE_BUCKETS = ((1, 8, "1–8 GPUs"), (9, 64, "9–64 GPUs"), (65, 512, "65–512 GPUs"))
SIZE_TOP = "over 512 GPUs"


class ReportExists(Exception):
    """The week already has a report (or one is being built); rebuild only when asked."""


def week_bounds(week: str) -> tuple[datetime, datetime]:
    """``"2026-W47"`` → [Monday 00:00 UTC, next Monday 00:00 UTC)."""
    try:
        year, number = week.split("-W")
        monday = date.fromisocalendar(int(year), int(number), 1)
    except ValueError:
        raise ValueError(f"{week!r} is not an ISO week like 2026-W47") from None
    start = datetime(monday.year, monday.month, monday.day, tzinfo=UTC)
    return start, start + timedelta(days=7)


def week_of(moment: datetime) -> str:
    year, number, _ = moment.astimezone(UTC).isocalendar()
    return f"{year}-W{number:02d}"


def previous_week(now: datetime) -> str:
    return week_of(now - timedelta(days=7))


def _size_bucket(size: int) -> str:
    for low, high, label in SIZE_BUCKETS:
        if low <= size <= high:
            return label
    return SIZE_TOP


def _ranks(attempt: Attempt) -> int:
    return attempt.world_size or attempt.placements.count() or 1


def _window(start: datetime, end: datetime, now: datetime) -> dict:
    """The numbers of one window [start, end), as of ``now``."""
    until = min(end, now)
    incidents = list(
        Incident.objects.filter(opened_at__gte=start, opened_at__lt=end)
        .select_related("attempt")
        .order_by("opened_at")
    )
    by_culprit = Counter(i.culprit for i in incidents)
    days = []
    for offset in range(7):
        day = (start + timedelta(days=offset)).date()
        on_day = Counter(i.culprit for i in incidents if i.opened_at.date() == day)
        days.append({"date": day.isoformat(), "total": sum(on_day.values()), **on_day})
    # Time lost: every failed attempt's run time, on every rank it held.
    gpu_hours_lost = 0.0
    for incident in incidents:
        attempt = incident.attempt
        ended = attempt.ended_at or incident.opened_at
        hours = max(0.0, (ended - attempt.started_at).total_seconds() / 3600)
        gpu_hours_lost += hours * _ranks(attempt)
    # Mean time between incidents by job size: hours run by attempts of that size inside the
    # window, divided by their incidents in it.
    run_hours: dict[str, float] = defaultdict(float)
    attempts_by_size: Counter = Counter()
    running = Attempt.objects.filter(started_at__lt=until).filter(
        Q(ended_at__isnull=True) | Q(ended_at__gt=start)
    )
    for attempt in running.only("started_at", "ended_at", "world_size"):
        bucket = _size_bucket(_ranks(attempt))
        began, ended = max(attempt.started_at, start), min(attempt.ended_at or until, until)
        run_hours[bucket] += max(0.0, (ended - began).total_seconds() / 3600)
        attempts_by_size[bucket] += 1
    incidents_by_size = Counter(_size_bucket(_ranks(i.attempt)) for i in incidents)
    mtbi = []
    for label in [b[2] for b in SIZE_BUCKETS] + [SIZE_TOP]:
        if not attempts_by_size[label] and not incidents_by_size[label]:
            continue
        n = incidents_by_size[label]
        mtbi.append(
            {
                "size": label,
                "attempts": attempts_by_size[label],
                "run_hours": round(run_hours[label], 1),
                "incidents": n,
                "mtbi_hours": round(run_hours[label] / n, 1) if n else None,
            }
        )
    drains = DrainAction.objects.filter(at__gte=start, at__lt=end, action="drain")
    return {
        "incidents": len(incidents),
        "by_culprit": {c: by_culprit[c] for c in CULPRITS if by_culprit[c]},
        "by_day": days,
        "failed_attempts": len({i.attempt_id for i in incidents}),
        "gpu_hours_lost": round(gpu_hours_lost, 1),
        "mtbi_by_size": mtbi,
        "fingerprints": Counter(i.fingerprint for i in incidents if i.fingerprint),
        "hosts_drained": sorted(
            set(drains.exclude(result="left_alone").values_list("host__hostname", flat=True))
        ),
        "drains_applied": drains.filter(result="applied").count(),
        "drains_dry_run": drains.filter(result="dry_run").count(),
        "hosts_repaired": sorted(
            set(
                HostRepair.objects.filter(at__gte=start, at__lt=end).values_list(
                    "host__hostname", flat=True
                )
            )
        ),
        "incident_rows": incidents,
    }


def _fingerprint_labels(fingerprints) -> dict[str, dict]:
    """Each fingerprint's culprit, its strongest implicated entity and its fix."""
    out: dict[str, dict] = {}
    rows = (
        Incident.objects.filter(fingerprint__in=list(fingerprints))
        .order_by("fingerprint", "-opened_at")
        .values("id", "fingerprint", "culprit", "fix")
    )
    for row in rows:
        out.setdefault(row["fingerprint"], {**row, "entity": ""})
    strongest = (
        Implication.objects.filter(incident_id__in=[v["id"] for v in out.values()])
        .select_related("entity")
        .order_by("incident_id", "-confidence")
    )
    by_incident = {entry["id"]: entry for entry in out.values()}
    for imp in strongest:
        entry = by_incident.get(imp.incident_id)
        if entry is not None and not entry["entity"]:
            entry["entity"] = f"{imp.entity.kind}:{imp.entity.key}"
            entry["entity_id"] = imp.entity_id
    # The culprit the UI shows for that entity (fleet memory's verdict over all its incidents),
    # not one incident's: the newest may have been an abstention on a rack the fleet has long
    # classified.
    scores = dict(
        CulpritScore.objects.filter(
            entity_id__in=[e["entity_id"] for e in out.values() if e.get("entity_id")]
        )
        .exclude(culprit="unknown")
        .values_list("entity_id", "culprit")
    )
    for entry in out.values():
        entry["culprit"] = scores.get(entry.get("entity_id"), entry["culprit"])
    return out


def _fix_applied_at(fingerprint: str, entity: str, end: datetime) -> datetime | None:
    """When a cause's fix was first applied before ``end``: an operator marked an incident of
    it "fix applied" (the incident page's workflow), or, for a cause whose strongest entity is a
    host, that host was repaired after the cause's first incident. None when neither."""
    marked = (
        Incident.objects.filter(fingerprint=fingerprint, fix_applied_at__lt=end)
        .order_by("fix_applied_at")
        .values_list("fix_applied_at", flat=True)
        .first()
    )
    repaired = None
    if entity.startswith("host:"):
        first = (
            Incident.objects.filter(fingerprint=fingerprint)
            .order_by("opened_at")
            .values_list("opened_at", flat=True)
            .first()
        )
        repaired = (
            HostRepair.objects.filter(
                host__hostname=entity.removeprefix("host:"), at__gte=first, at__lt=end
            )
            .order_by("at")
            .values_list("at", flat=True)
            .first()
        )
    return min((t for t in (marked, repaired) if t is not None), default=None)


def _fixes(this: dict, before: dict, end: datetime) -> dict:
    """Fixes recommended vs applied, and whether the culprit came back: a cause counts as fixed
    once an operator marked one of its incidents "fix applied" or repaired the host it
    implicates, and as *came back* when an incident of it opened after that."""
    recommended = {f for f in this["fingerprints"]}
    labels = _fingerprint_labels(recommended | set(before["fingerprints"]))
    recommended = {f for f in recommended if labels.get(f, {}).get("fix")}
    applied, came_back = [], []
    for fingerprint in recommended | set(before["fingerprints"]):
        entity = labels.get(fingerprint, {}).get("entity", "")
        at = _fix_applied_at(fingerprint, entity, end)
        if at is None:
            continue
        applied.append(fingerprint)
        if Incident.objects.filter(
            fingerprint=fingerprint, opened_at__gt=at, opened_at__lt=end
        ).exists():
            came_back.append(fingerprint)
    last_week = set(before["fingerprints"])
    return {
        "recommended": len(recommended),
        "applied": len(applied),
        "came_back": len(came_back),
        "last_week_causes": len(last_week),
        "last_week_causes_recurred": len(last_week & set(this["fingerprints"])),
        "note": (
            "'Applied' counts causes an operator marked 'fix applied' on an incident, or whose "
            "host was repaired after the cause first appeared."
        ),
    }


def weekly_report_numbers(week: str, now: datetime | None = None) -> dict:
    now = now or timezone.now()
    start, end = week_bounds(week)
    this = _window(start, end, now)
    before = _window(start - timedelta(days=7), start, now)
    labels = _fingerprint_labels(set(this["fingerprints"]))
    top = []
    for fingerprint, count in this["fingerprints"].most_common():
        if count < 2 or len(top) >= 10:
            continue
        previous = before["fingerprints"].get(fingerprint, 0)
        label = labels.get(fingerprint, {})
        top.append(
            {
                "fingerprint": fingerprint,
                "culprit": label.get("culprit", "unknown"),
                "entity": label.get("entity", ""),
                "fix": label.get("fix", ""),
                "count": count,
                "previous": previous,
                "trend": (
                    "new"
                    if not previous
                    else "up"
                    if count > previous
                    else "down"
                    if count < previous
                    else "same"
                ),
            }
        )
    fixes = _fixes(this, before, end)
    # A week Fleetwatch saw nothing of (no attempt ran, no incident) is no baseline: "+53 on the
    # week before" against an empty week would be a change that never happened.
    before_has_data = bool(before["incidents"]) or any(
        row["attempts"] for row in before["mtbi_by_size"]
    )
    changes = {
        "incidents": this["incidents"] - before["incidents"],
        "gpu_hours_lost": round(this["gpu_hours_lost"] - before["gpu_hours_lost"], 1),
        "hosts_drained": len(this["hosts_drained"]) - len(before["hosts_drained"]),
        "by_culprit": {
            c: this["by_culprit"].get(c, 0) - before["by_culprit"].get(c, 0)
            for c in CULPRITS
            if this["by_culprit"].get(c) or before["by_culprit"].get(c)
        },
    }
    public = {k: v for k, v in this.items() if k not in ("fingerprints", "incident_rows")}
    numbers = {
        "week": week,
        "starts_at": start.isoformat(),
        "ends_at": end.isoformat(),
        "partial": now < end,
        "as_of": now.isoformat(),
        **public,
        "top_recurring": top,
        "fixes": fixes,
        "previous": {
            "incidents": before["incidents"],
            "gpu_hours_lost": before["gpu_hours_lost"],
            "by_culprit": before["by_culprit"],
            "hosts_drained": len(before["hosts_drained"]),
            "hosts_repaired": len(before["hosts_repaired"]),
            "has_data": before_has_data,
        },
        "changes": changes if before_has_data else None,
    }
    numbers["summary"] = summary_sentences(numbers)
    return numbers


def _plural(count: int, word: str) -> str:
    return f"{count} {word}{'' if count == 1 else 's'}"


def summary_sentences(n: dict) -> list[str]:
    """What a reader needs first, in sentences: the page, the PDF and the email open with it."""
    total = n["incidents"]
    if n["changes"] is None:
        versus = "; Fleetwatch has no data for the week before"
    else:
        delta = n["changes"]["incidents"]
        versus = (
            f", {abs(delta)} {'more' if delta > 0 else 'fewer'} than the week before"
            if (delta)
            else ", as many as the week before"
        )
    out = [
        f"{_plural(total, 'incident')} cost {n['gpu_hours_lost']} GPU-hours{versus}."
        if total
        else f"No incidents{versus}."
    ]
    if total:
        leading = sorted(n["by_culprit"].items(), key=lambda kv: -kv[1])
        culprit, count = leading[0]
        out.append(f"The leading cause was {culprit.replace('_', ' ')} ({count} of {total}).")
    if n["top_recurring"]:
        top = n["top_recurring"][0]
        where = f" on {top['entity'].split(':', 1)[-1]}" if top["entity"] else ""
        out.append(
            f"The most recurrent: {top['culprit'].replace('_', ' ')}{where}, "
            f"{_plural(top['count'], 'incident')} this week."
        )
    drained, repaired = len(n["hosts_drained"]), len(n["hosts_repaired"])
    if drained or repaired:
        out.append(f"{_plural(drained, 'host')} drained, {repaired} repaired.")
    fixes = n["fixes"]
    if fixes["recommended"] or fixes["applied"]:
        out.append(
            f"Fixes applied for {fixes['applied']} of {_plural(fixes['recommended'], 'cause')} "
            f"with a recommended fix; {fixes['came_back']} came back after the fix."
        )
    return out


def weekly_report_html(numbers: dict, *, rebuilds: list | None = None) -> str:
    return render_to_string(
        "analysis/report.html",
        {
            "n": numbers,
            "chart_culprit": charts.bars_by_culprit(
                numbers["by_culprit"],
                aria="Incidents by culprit class",
                empty="No incidents this week.",
            ),
            "chart_day": charts.stacked_columns(
                [date.fromisoformat(d["date"]).strftime("%a %d") for d in numbers["by_day"]],
                {c: [d.get(c, 0) for d in numbers["by_day"]] for c in CULPRITS},
                aria="Incidents by day and culprit class",
                empty="No incidents this week.",
            ),
            "rebuilds": rebuilds or [],
        },
    )


def weekly_report_pdf(html: str) -> bytes:
    # WeasyPrint: pure Python over pango (a Debian package), no browser process to manage.
    from weasyprint import HTML

    return HTML(string=html).write_pdf()


def _summary_text(n: dict) -> str:
    lines = [
        f"Fleetwatch weekly reliability report, {n['week']}"
        + (" (partial: built before the week ended)" if n["partial"] else ""),
        "",
        *n["summary"],
        "",
        "By culprit: " + (", ".join(f"{c} {k}" for c, k in n["by_culprit"].items()) or "none"),
        "",
        "The full report (charts, recurring culprits, fixes) is attached as HTML and PDF.",
    ]
    return "\n".join(lines)


def weekly_report_email(report: WeeklyReport) -> list[str]:
    recipients = list(getattr(settings, "FLEETWATCH_REPORT_EMAILS", []))
    if not recipients:
        return []
    message = EmailMultiAlternatives(
        subject=f"Fleetwatch weekly reliability report {report.week}",
        body=_summary_text(report.numbers),
        to=recipients,
    )
    message.attach_alternative(report.html, "text/html")
    if report.pdf:
        with report.pdf.open("rb") as handle:
            message.attach(f"fleetwatch-{report.week}.pdf", handle.read(), "application/pdf")
    message.send()
    return recipients


def _claim(week: str, start, end, *, rebuild: bool, by: str, now: datetime) -> WeeklyReport:
    """Create the week's row as the claim; on rebuild, take the finished row back with a
    conditional update so two builders never race on one week."""
    try:
        with transaction.atomic():
            return WeeklyReport.objects.create(
                week=week, starts_at=start, ends_at=end, built_by=by[:150]
            )
    except IntegrityError:
        pass
    report = WeeklyReport.objects.get(week=week)
    if report.status == WeeklyReport.Status.BUILDING:
        raise ReportExists(f"the report for {week} is being built right now")
    if report.status == WeeklyReport.Status.READY and not rebuild:
        raise ReportExists(
            f"the report for {week} was built at {report.built_at:%Y-%m-%d %H:%M} UTC; "
            "pass --rebuild to build it again (the rebuild is recorded)"
        )
    claimed = WeeklyReport.objects.filter(pk=report.pk, status=report.status).update(
        status=WeeklyReport.Status.BUILDING
    )
    if not claimed:
        raise ReportExists(f"another builder took the report for {week} first")
    report.rebuilds = [
        *report.rebuilds,
        {
            "at": now.isoformat(),
            "by": by,
            "previous_status": report.status,
            "previous_built_at": report.built_at.isoformat() if report.built_at else None,
        },
    ]
    report.status = WeeklyReport.Status.BUILDING
    report.save(update_fields=["rebuilds", "status"])
    return report


def weekly_report_build(
    week: str,
    *,
    rebuild: bool = False,
    by: str = "",
    now: datetime | None = None,
    email: bool = True,
) -> WeeklyReport:
    """Build, archive and mail the report for ``week``. Raises ReportExists when the week
    already has one and ``rebuild`` is false (a failed build may be retried: it has none)."""
    now = now or timezone.now()
    start, end = week_bounds(week)
    report = _claim(week, start, end, rebuild=rebuild, by=by, now=now)
    try:
        numbers = weekly_report_numbers(week, now)
        html = weekly_report_html(numbers, rebuilds=report.rebuilds)
        report.numbers, report.html, report.error = numbers, html, ""
        if getattr(settings, "FLEETWATCH_REPORT_PDF", True):
            report.pdf.save(f"{week}.pdf", ContentFile(weekly_report_pdf(html)), save=False)
        report.built_at, report.built_by = now, by[:150]
        report.status = WeeklyReport.Status.READY
        report.save()
    except Exception as exc:
        WeeklyReport.objects.filter(pk=report.pk).update(
            status=WeeklyReport.Status.FAILED, error=f"{type(exc).__name__}: {exc}"[:2000]
        )
        raise
    if email:
        sent = weekly_report_email(report)
        if sent:
            report.emailed_to, report.emailed_at = sent, timezone.now()
            report.save(update_fields=["emailed_to", "emailed_at"])
    return report
