"""The web UI: server-rendered pages, htmx for partial updates; every log text is autoescaped.

Reads go through ``analysis.selectors``, writes through one service each. Anyone logged in may
read; the workflow and host actions need the operator role (staff, or the "operators" group).
"""

from __future__ import annotations

from datetime import datetime, time

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.core.paginator import Paginator
from django.http import Http404
from django.shortcuts import get_object_or_404, redirect, render
from django.utils import timezone
from django.views.decorators.http import require_POST

from analysis import charts, memory, selectors, services
from analysis.models import CulpritScore, DrainAction, Incident
from fleet.drain import drain_resume, host_drain
from fleet.models import Host, Job
from ingest.models import Upload

PAGE_SIZE = 50
OPERATORS_GROUP = "operators"


def is_operator(user) -> bool:
    return bool(
        user.is_authenticated
        and (user.is_staff or user.groups.filter(name=OPERATORS_GROUP).exists())
    )


def operator_required(view):
    @login_required
    def wrapped(request, *args, **kwargs):
        if not is_operator(request.user):
            raise PermissionDenied("operators only")
        return view(request, *args, **kwargs)

    wrapped.__name__ = view.__name__
    wrapped.__doc__ = view.__doc__
    return wrapped


def _is_htmx(request) -> bool:
    return request.headers.get("HX-Request") == "true"


def _date(value: str) -> datetime | None:
    try:
        day = datetime.strptime(value, "%Y-%m-%d").date()
    except ValueError:
        return None
    return timezone.make_aware(datetime.combine(day, time.min))


# --- overview -----------------------------------------------------------------------------------


def _days_chart(days: list[str], series: dict[str, list[int]], aria: str, **size) -> str:
    """Columns per ISO day (labelled MM-DD), stacked by culprit class."""
    return charts.stacked_columns(
        [day[5:] for day in days],
        series,
        aria=aria,
        empty="No incidents in the last two weeks.",
        **size,
    )


@login_required
def overview(request):
    per_day = selectors.incidents_per_day()
    return render(
        request,
        "fleet/overview.html",
        {
            "open_incidents": selectors.incidents_needing_attention()[:10],
            "open_count": selectors.incidents_needing_attention().count(),
            "per_day": per_day,
            "per_day_chart": _days_chart(
                per_day["days"], per_day["series"], "Incidents per day by culprit class"
            ),
            "top_culprits": selectors.culprit_scores_top(),
            "hosts": selectors.hosts_needing_attention(),
            "ingest": selectors.ingest_health(),
        },
    )


# --- incidents ----------------------------------------------------------------------------------


@login_required
def incident_list(request):
    filters = {
        name: request.GET.get(name, "").strip()
        for name in ("culprit", "status", "job", "host", "since", "until", "sort", "owner")
    }
    queryset = selectors.incident_list(
        owner=filters["owner"],
        me=request.user.get_username(),
        culprit=filters["culprit"],
        status=filters["status"],
        job=filters["job"],
        host=filters["host"],
        since=_date(filters["since"]),
        until=_date(filters["until"]),
        sort=filters["sort"] or "-opened",
    )
    page = Paginator(queryset, PAGE_SIZE).get_page(request.GET.get("page"))
    kept = request.GET.copy()
    kept.pop("page", None)
    template = "fleet/_incident_table.html" if _is_htmx(request) else "fleet/incident_list.html"
    return render(
        request,
        template,
        {
            "page": page,
            "filters": filters,
            "kept": kept.urlencode(),
            "culprits": Incident.Culprit.values,
            "statuses": Incident.Status.values,
            "sorts": list(selectors.INCIDENT_SORTS),
        },
    )


def _incident_context(request, incident: Incident) -> dict:
    timeline = selectors.incident_rank_timeline(incident)
    return {
        "incident": incident,
        "evidence": selectors.evidence_groups(selectors.incident_evidence_links(incident)),
        "timeline": timeline,
        "timeline_groups": selectors.timeline_groups(timeline),
        "timeline_folded": len(timeline) > selectors.TIMELINE_ROWS_SHOWN,
        "hardware": selectors.incident_hardware_events(incident),
        "similar": selectors.incident_similar(incident),
        "culprits": Incident.Culprit.values,
        "culprit_scores": selectors.incident_culprits(incident),
        "operator": is_operator(request.user),
    }


@login_required
def incident_detail(request, pk: int):
    try:
        incident = selectors.incident_get(pk)
    except Incident.DoesNotExist:
        raise Http404("No such incident") from None
    return render(request, "fleet/incident_detail.html", _incident_context(request, incident))


# What each workflow step says when it was taken, and when it no longer applied.
_SAID = {
    "acknowledge": ("Acknowledged.", "It was no longer open."),
    "resolve": ("Resolved.", "It was already resolved."),
    "reopen": ("Reopened.", "It was not resolved."),
    "mute": ("Muted: no notifications, out of the overview.", "It was already muted."),
    "fix-applied": ("Fix recorded as applied.", "The fix was already recorded."),
}


def _snooze_until(value: str):
    """A date (YYYY-MM-DD: until that day starts) or a datetime-local; blank: unsnooze."""
    value = value.strip()
    if not value:
        return None
    day = _date(value)
    if day is not None:
        return day
    try:
        moment = datetime.fromisoformat(value)
    except ValueError:
        raise services.WorkflowError("snooze until a date (YYYY-MM-DD)") from None
    return timezone.make_aware(moment) if timezone.is_naive(moment) else moment


def _workflow_step(request, row, action: str, steps: dict, assign, snooze) -> tuple[bool, str]:
    """One step of the on-call loop from a form, for an incident or a culprit."""
    by = request.user.get_username()
    note = request.POST.get("note", "")[: services.NOTE_MAX]
    try:
        if action in steps:
            done = steps[action](row, by=by, note=note)
            return done, _SAID[action][0 if done else 1]
        if action == "assign":
            assignee = by if request.POST.get("to") == "me" else request.POST.get("assignee", "")
            assign(row, assignee=assignee, by=by, note=note)
            return True, f"Assigned to {assignee.strip()}." if assignee.strip() else "Unassigned."
        if action == "snooze":
            until = _snooze_until(request.POST.get("until", ""))
            snooze(row, until=until, by=by, note=note)
            return True, f"Snoozed until {until:%Y-%m-%d %H:%M %Z}." if until else "Unsnoozed."
    except services.WorkflowError as error:
        return False, str(error)
    raise Http404("No such action")


@require_POST
@operator_required
def incident_action(request, pk: int, action: str):
    incident = get_object_or_404(Incident, pk=pk)
    if action == "reclassify":
        try:
            services.incident_reclassify(
                incident,
                culprit=request.POST.get("culprit", ""),
                by=request.user.get_username(),
                note=request.POST.get("note", "")[: services.NOTE_MAX],
            )
        except ValueError as error:
            done, text = False, str(error)
        else:
            done, text = True, "Reclassified."
    else:
        done, text = _workflow_step(
            request,
            incident,
            action,
            services.INCIDENT_ACTIONS,
            services.incident_assign,
            services.incident_snooze,
        )
    (messages.success if done else messages.warning)(request, text)
    if _is_htmx(request):
        incident = selectors.incident_get(pk)
        return render(
            request, "fleet/_incident_workflow.html", _incident_context(request, incident)
        )
    return redirect("incident-detail", pk=pk)


# --- hosts --------------------------------------------------------------------------------------


@login_required
def host_list(request):
    query = request.GET.get("q", "").strip()
    verdict = request.GET.get("verdict", "")
    sort = request.GET.get("sort", "hostname")
    hosts = selectors.host_list(query, verdict=verdict, sort=sort)
    page = Paginator(hosts, PAGE_SIZE).get_page(request.GET.get("page"))
    health = memory.hosts_health_of(page.object_list)
    for host in page.object_list:
        host.health = health[host.hostname]
    kept = request.GET.copy()
    kept.pop("page", None)
    return render(
        request,
        "fleet/host_list.html",
        {
            "page": page,
            "q": query,
            "verdict": verdict,
            "sort": sort,
            "sorts": list(selectors.HOST_SORTS),
            "kept": kept.urlencode(),
        },
    )


@login_required
def host_detail(request, hostname: str):
    host = get_object_or_404(Host, hostname=hostname)
    incidents = Paginator(selectors.host_incidents(host), 25).get_page(request.GET.get("page"))
    return render(
        request,
        "fleet/host_detail.html",
        {
            "host": host,
            "health": memory.host_health(host),
            "culprit_scores": selectors.host_culprits(host),
            "incidents": incidents,
            "gpus": host.gpus.all(),
            "hardware": selectors.host_hardware_events(host),
            "counters": selectors.host_gpu_counters(host),
            "nic_counters": selectors.host_nic_counters(host),
            "repairs": host.repairs.all()[:10],
            "drains": _drain_actions(host),
            "operator": is_operator(request.user),
        },
    )


def _drain_actions(host: Host) -> list:
    return list(DrainAction.objects.filter(host=host).order_by("-at")[:10])


@require_POST
@operator_required
def host_action(request, hostname: str, action: str):
    host = get_object_or_404(Host, hostname=hostname)
    by = request.user.get_username()
    note = request.POST.get("note", "")[:2000]
    if action == "repaired":
        memory.host_repaired(host, note=note, by=by)
        drain_resume(host, by=by)  # undo Fleetwatch's own drain, if any
        messages.success(request, f"{host.hostname} marked repaired; its health starts afresh.")
    elif action == "drain":
        row = host_drain(host, reason=note or "drained from the Fleetwatch UI", by=by)
        if row.dry_run:
            text = f"Dry run: nothing ran. To drain {host.hostname} it would run: {row.command}"
        else:
            text = f"Drain of {host.hostname}: {row.result}. Ran: {row.command}"
        messages.success(request, text)
    else:
        raise Http404("No such action")
    return redirect("host-detail", hostname=host.hostname)


# --- culprits and jobs --------------------------------------------------------------------------


@login_required
def culprit_list(request):
    culprit = request.GET.get("culprit", "")
    flagged = {"yes": True, "no": False}.get(request.GET.get("flagged", ""))
    status = request.GET.get("status", "")
    owner = request.GET.get("owner", "")
    scores = selectors.culprit_list(
        culprit=culprit,
        flagged=flagged,
        status=status,
        owner=owner,
        me=request.user.get_username(),
    )
    kept = request.GET.copy()
    kept.pop("page", None)
    return render(
        request,
        "fleet/culprit_list.html",
        {
            "page": Paginator(scores, PAGE_SIZE).get_page(request.GET.get("page")),
            "culprit": culprit,
            "flagged": request.GET.get("flagged", ""),
            "status": status,
            "owner": owner,
            "culprits": Incident.Culprit.values,
            "statuses": CulpritScore.Status.values,
            "kept": kept.urlencode(),
        },
    )


@login_required
def culprit_detail(request, pk: int):
    try:
        score = selectors.culprit_get(pk)
    except CulpritScore.DoesNotExist:
        raise Http404("No such culprit") from None
    incidents = selectors.culprit_incidents(score)
    trend = selectors.culprit_trend(incidents)
    return render(
        request,
        "fleet/culprit_detail.html",
        {
            "score": score,
            "incidents": incidents,
            "attempts": selectors.culprit_attempts(score),
            "fix": selectors.culprit_fix(score, incidents),
            "trend_chart": _days_chart(
                trend["days"],
                {score.culprit: trend["n"]},
                "Incidents per day, last two weeks",
                height=160,
            ),
            "host": selectors.culprit_host(score),
            "rack_hosts": selectors.culprit_rack_hosts(score),
            "operator": is_operator(request.user),
            "now": timezone.now(),
        },
    )


@require_POST
@operator_required
def culprit_action(request, pk: int, action: str):
    score = get_object_or_404(CulpritScore, pk=pk)
    done, text = _workflow_step(
        request,
        score,
        action,
        services.CULPRIT_ACTIONS,
        services.culprit_assign,
        services.culprit_snooze,
    )
    (messages.success if done else messages.warning)(request, text)
    return redirect("culprit-detail", pk=pk)


@login_required
def search(request):
    """The box in the header: an incident id, a host, a job or a culprit's entity goes straight
    to its page when it names exactly one; otherwise the matches of each kind."""
    query = request.GET.get("q", "").strip()[:200]
    if not query:
        return redirect("overview")
    if query.lstrip("#").isdigit() and Incident.objects.filter(pk=int(query.lstrip("#"))).exists():
        return redirect("incident-detail", pk=int(query.lstrip("#")))
    if Host.objects.filter(hostname=query).exists():
        return redirect("host-detail", hostname=query)
    job = Job.objects.filter(external_id=query).values_list("pk", flat=True).first()
    if job is not None:
        return redirect("job-detail", pk=job)
    found = selectors.search(query)
    if len(found["culprits"]) == 1 and found["culprits"][0].entity.key == query:
        return redirect("culprit-detail", pk=found["culprits"][0].pk)
    return render(request, "fleet/search.html", {"q": query, **found})


@login_required
def rule_list(request):
    from analysis.classify.rules import RULESET_VERSION

    return render(
        request,
        "fleet/rule_list.html",
        {"rules": selectors.rules_precision(), "ruleset": RULESET_VERSION},
    )


@login_required
def job_list(request):
    query = request.GET.get("q", "").strip()
    page = Paginator(selectors.job_list(query), PAGE_SIZE).get_page(request.GET.get("page"))
    return render(request, "fleet/job_list.html", {"page": page, "q": query})


@login_required
def job_detail(request, pk: int):
    try:
        job = selectors.job_get(pk)
    except Job.DoesNotExist:
        raise Http404("No such job") from None
    return render(request, "fleet/job_detail.html", {"job": job})


# --- raw artifacts ------------------------------------------------------------------------------


@login_required
def artifact(request, pk: int):
    upload = get_object_or_404(Upload.objects.select_related("host", "job", "attempt"), pk=pk)
    try:
        line = max(1, int(request.GET.get("line", "1")))
    except ValueError:
        line = 1
    try:
        window = selectors.artifact_window(upload, line)
    except (OSError, EOFError) as error:
        return render(
            request, "fleet/artifact.html", {"upload": upload, "error": str(error)}, status=502
        )
    return render(request, "fleet/artifact.html", {"upload": upload, "window": window})
