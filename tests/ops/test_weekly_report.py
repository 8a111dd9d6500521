"""The weekly reliability report: numbers, archive, rebuild, PDF, email, beat task."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest
from django.core import mail
from django.core.management import CommandError, call_command

from analysis import report
from tests.ops.helpers import flagged_host, incident_on

MONDAY = datetime(2026, 11, 16, tzinfo=UTC)  # 2026-W47
AFTER = datetime(2026, 11, 24, 6, tzinfo=UTC)


def test_iso_weeks():
    assert report.week_bounds("2026-W47") == (MONDAY, MONDAY + timedelta(days=7))
    assert report.previous_week(AFTER) == "2026-W47"
    with pytest.raises(ValueError, match="ISO week"):
        report.week_bounds("2026-47")


@pytest.fixture
def week(db):
    """W47: three hardware incidents on gpu-a (8 ranks × 2 h each), one storage incident on a
    64-rank job (3 h); gpu-a drained (dry run) and repaired mid-week, then failed again.
    W46: one hardware incident on gpu-a."""
    from analysis.models import DrainAction, HostRepair

    at = MONDAY + timedelta(hours=10)
    incident_on("gpu-a", job="j0", started=at - timedelta(days=7), fingerprint="fp-a")
    host, _ = incident_on("gpu-a", job="j1", started=at, fingerprint="fp-a")
    incident_on("gpu-a", job="j2", started=at + timedelta(days=1), fingerprint="fp-a")
    DrainAction.objects.create(
        host=host, action="drain", adapter="slurm", result="dry_run", at=at + timedelta(days=1)
    )
    HostRepair.objects.create(host=host, at=at + timedelta(days=2))
    incident_on("gpu-a", job="j3", started=at + timedelta(days=3), fingerprint="fp-a")
    incident_on(
        "gpu-b",
        job="big",
        culprit="storage_io",
        started=at + timedelta(days=3),
        hours=3,
        world_size=64,
        rule_id="storage_stall",
        fingerprint="fp-b",
    )
    return host


def test_numbers_of_a_known_week(week):
    n = report.weekly_report_numbers("2026-W47", now=AFTER)
    assert n["partial"] is False
    assert n["incidents"] == 4
    assert n["by_culprit"] == {"bad_node_hardware": 3, "storage_io": 1}
    # 3 × (2 h × 8 ranks) + 3 h × 64 ranks
    assert n["gpu_hours_lost"] == 3 * 16 + 192
    assert [d["total"] for d in n["by_day"]] == [1, 1, 0, 2, 0, 0, 0]
    sizes = {row["size"]: row for row in n["mtbi_by_size"]}
    assert sizes["1–8 GPUs"] == {
        "size": "1–8 GPUs",
        "attempts": 3,
        "run_hours": 6.0,
        "incidents": 3,
        "mtbi_hours": 2.0,
    }
    assert sizes["9–64 GPUs"]["mtbi_hours"] == 3.0
    top = n["top_recurring"]
    assert [(t["entity"], t["count"], t["previous"], t["trend"]) for t in top] == [
        ("host:gpu-a", 3, 1, "up")
    ]
    assert n["hosts_drained"] == ["gpu-a"] and n["drains_dry_run"] == 1
    assert n["hosts_repaired"] == ["gpu-a"]
    fixes = n["fixes"]
    assert (fixes["recommended"], fixes["applied"], fixes["came_back"]) == (2, 1, 1)
    assert (fixes["last_week_causes"], fixes["last_week_causes_recurred"]) == (1, 1)
    assert n["previous"]["incidents"] == 1 and n["previous"]["has_data"] is True
    assert n["changes"]["incidents"] == 3
    assert n["changes"]["by_culprit"] == {"bad_node_hardware": 2, "storage_io": 1}
    assert n["summary"] == [
        "4 incidents cost 240.0 GPU-hours, 3 more than the week before.",
        "The leading cause was bad node hardware (3 of 4).",
        "The most recurrent: bad node hardware on gpu-a, 3 incidents this week.",
        "1 host drained, 1 repaired.",
        "Fixes applied for 1 of 2 causes with a recommended fix; 1 came back after the fix.",
    ]


def test_a_fix_marked_applied_on_an_incident_counts_and_its_return_is_seen(week):
    from analysis.models import Incident
    from analysis.services import incident_fix_applied

    # The storage cause (fp-b) implicates no host: only the incident workflow can mark it.
    before = report.weekly_report_numbers("2026-W47", now=AFTER)["fixes"]
    storage = Incident.objects.get(fingerprint="fp-b")
    assert incident_fix_applied(storage, by="sre", now=storage.opened_at + timedelta(hours=1))
    after = report.weekly_report_numbers("2026-W47", now=AFTER)["fixes"]
    assert (after["applied"], after["came_back"]) == (before["applied"] + 1, before["came_back"])
    incident_on(
        "gpu-b",
        job="big-again",
        culprit="storage_io",
        started=storage.opened_at + timedelta(hours=5),
        rule_id="storage_stall",
        fingerprint="fp-b",
    )
    again = report.weekly_report_numbers("2026-W47", now=AFTER)["fixes"]
    assert again["came_back"] == before["came_back"] + 1


def test_no_change_is_claimed_against_a_week_without_data(db, settings):
    # Only W47 has anything: W46 is before Fleetwatch saw this fleet.
    incident_on("gpu-c", job="only", started=MONDAY + timedelta(hours=3), fingerprint="fp-c")
    n = report.weekly_report_numbers("2026-W47", now=AFTER)
    assert n["previous"]["has_data"] is False and n["changes"] is None
    assert n["summary"][0] == (
        "1 incident cost 16.0 GPU-hours; Fleetwatch has no data for the week before."
    )
    html = report.weekly_report_html(n)
    assert "vs week before" not in html and "no data the week before" in html
    assert "+1" not in html


def test_build_archives_mails_and_refuses_a_silent_rebuild(week, settings, tmp_path):
    settings.FLEETWATCH_REPORT_EMAILS = ["sre@example.com", "owner@example.com"]
    settings.EMAIL_BACKEND = "django.core.mail.backends.locmem.EmailBackend"
    settings.STORAGES = {
        **settings.STORAGES,
        "default": {
            "BACKEND": "django.core.files.storage.FileSystemStorage",
            "OPTIONS": {"location": tmp_path},
        },
    }
    built = report.weekly_report_build("2026-W47", by="test", now=AFTER)
    assert built.status == "ready" and built.rebuilds == []
    assert "<svg" in built.html and "gpu-a" in built.html
    pdf = built.pdf.open("rb").read()
    assert pdf.startswith(b"%PDF")
    (message,) = mail.outbox
    assert message.to == ["sre@example.com", "owner@example.com"]
    assert "2026-W47" in message.subject
    assert "4 incidents cost 240.0 GPU-hours, 3 more than the week before." in message.body
    assert [a[0] for a in message.attachments] == ["fleetwatch-2026-W47.pdf"]
    assert message.alternatives[0][1] == "text/html"
    assert built.emailed_to == settings.FLEETWATCH_REPORT_EMAILS

    with pytest.raises(CommandError, match="--rebuild"):
        call_command("weekly_report", "--week", "2026-W47", "--no-email")
    call_command("weekly_report", "--week", "2026-W47", "--rebuild", "--no-email")
    built.refresh_from_db()
    assert len(built.rebuilds) == 1 and built.rebuilds[0]["previous_status"] == "ready"
    assert "Rebuilt 1 time" in built.html
    assert len(mail.outbox) == 1  # --no-email


def test_a_failed_build_is_recorded_and_may_be_retried(week, monkeypatch, settings):
    from analysis.models import WeeklyReport

    settings.FLEETWATCH_REPORT_PDF = False

    def boom(*args, **kwargs):
        raise RuntimeError("database went away")

    monkeypatch.setattr(report, "weekly_report_numbers", boom)
    with pytest.raises(RuntimeError):
        report.weekly_report_build("2026-W47", now=AFTER)
    assert WeeklyReport.objects.get().status == "failed"
    monkeypatch.undo()
    settings.FLEETWATCH_REPORT_PDF = False
    assert report.weekly_report_build("2026-W47", now=AFTER, rebuild=True).status == "ready"


def test_beat_task_builds_last_week_once(week, settings, monkeypatch):
    from analysis import tasks
    from analysis.models import WeeklyReport

    settings.FLEETWATCH_REPORT_PDF = False
    monkeypatch.setattr("django.utils.timezone.now", lambda: AFTER)
    tasks.weekly_report_build.delay()
    tasks.weekly_report_build.delay()  # the second Monday run (or a redelivery) is a no-op
    (row,) = WeeklyReport.objects.all()
    assert (row.week, row.rebuilds, row.built_by) == ("2026-W47", [], "celery beat")
    assert "weekly-report" in settings.CELERY_BEAT_SCHEDULE


@pytest.mark.django_db(transaction=True)
def test_report_of_a_simulated_fleet_matches_the_database(tmp_path, settings):
    from django.utils import timezone

    from analysis.models import Incident

    settings.FLEETWATCH_REPORT_PDF = False
    truth_path = tmp_path / "truth.json"
    call_command("simulate_fleet", hosts=64, days=2, seed=3, truth=str(truth_path))
    truth = json.loads(truth_path.read_text())
    now = timezone.now()
    week = report.week_of(now - timedelta(days=1))
    start, end = report.week_bounds(week)
    n = report.weekly_report_build(week, now=now, email=False).numbers
    in_week = Incident.objects.filter(opened_at__gte=start, opened_at__lt=end)
    assert n["incidents"] == in_week.count() > 0
    assert n["incidents"] + n["previous"]["incidents"] == Incident.objects.count()
    assert Incident.objects.count() <= truth["failures"]
    assert sum(n["by_culprit"].values()) == n["incidents"]
    assert sum(d["total"] for d in n["by_day"]) == n["incidents"]
    assert sum(row["incidents"] for row in n["mtbi_by_size"]) == n["incidents"]
    # Every planted hardware failure on the bad host is a bad_node_hardware incident.
    assert (
        n["by_culprit"].get("bad_node_hardware", 0)
        + n["previous"]["by_culprit"].get("bad_node_hardware", 0)
        >= 1
    )
    lost = 0.0
    for incident in in_week.select_related("attempt"):
        a = incident.attempt
        lost += (a.ended_at - a.started_at).total_seconds() / 3600 * a.world_size
    assert n["gpu_hours_lost"] == pytest.approx(lost, abs=0.1)
    assert n["failed_attempts"] == in_week.count()


def test_the_report_and_the_ui_draw_each_culprit_in_the_same_colour(
    week, client, django_user_model
):
    """One palette (analysis/palette.py) and one renderer (analysis/charts.py): the report's
    chart fills, the overview page's chart (drawn on the server, no script) and its badges."""
    import re

    from analysis.palette import CULPRIT_COLOURS, badge_background

    fill = re.compile(r'fill="(#[0-9a-f]{6})" data-culprit="([a-z_]+)"')
    html = report.weekly_report_html(report.weekly_report_numbers("2026-W47", now=AFTER))
    drawn = {culprit: colour for colour, culprit in fill.findall(html)}
    assert len(drawn) >= 2 and all(CULPRIT_COLOURS[c] == v for c, v in drawn.items()), drawn

    # The overview draws the last two weeks: incidents of today's, of two classes.
    incident_on("gpu-today-1", job="job-today-1", culprit="storage_io", rule_id="storage_stall")
    incident_on("gpu-today-2", job="job-today-2", culprit="oom_or_crash", rule_id="crash")
    client.force_login(django_user_model.objects.create_user("palette"))
    page = client.get("/").content.decode()
    on_page = {culprit: colour for colour, culprit in fill.findall(page)}
    assert {"storage_io", "oom_or_crash"} <= set(on_page), on_page
    assert all(CULPRIT_COLOURS[c] == v for c, v in on_page.items()), on_page
    assert "<script" not in page.split('id="per-day-chart"', 1)[1].split("</div>", 1)[0]
    for culprit, colour in CULPRIT_COLOURS.items():
        assert f".culprit-{culprit} {{ background: {badge_background(colour)}; }}" in page


def test_the_pdf_as_printed_draws_each_culprit_in_the_ui_colour(week, client, django_user_model):
    """The PDF itself, rasterised by PDFium: every culprit of the week shows in the colour the
    UI draws it in, and no other culprit's colour appears (a swapped or stale palette would)."""
    import re

    pdfium = pytest.importorskip("pypdfium2")
    from analysis.palette import CULPRIT_COLOURS

    # The UI's colours as the overview draws them: incidents of the week's classes, today.
    incident_on("gpu-today-1", job="job-today-1", culprit="bad_node_hardware")
    incident_on("gpu-today-2", job="job-today-2", culprit="storage_io", rule_id="storage_stall")
    client.force_login(django_user_model.objects.create_user("printer"))
    page = client.get("/").content.decode()
    ui = dict(CULPRIT_COLOURS)
    ui.update(
        (culprit, colour)
        for colour, culprit in re.findall(r'fill="(#[0-9a-f]{6})" data-culprit="([a-z_]+)"', page)
    )
    numbers = report.weekly_report_numbers("2026-W47", now=AFTER)
    pdf = pdfium.PdfDocument(report.weekly_report_pdf(report.weekly_report_html(numbers)))
    seen: set[tuple[int, int, int]] = set()
    for index in range(len(pdf)):
        image = pdf[index].render(scale=2).to_pil().convert("RGB")
        seen.update(colour for _, colour in image.getcolors(maxcolors=1 << 20))

    def rgb(hex_colour: str) -> tuple[int, int, int]:
        return tuple(int(hex_colour[i : i + 2], 16) for i in (1, 3, 5))

    week_culprits = set(numbers["by_culprit"])
    assert week_culprits == {"bad_node_hardware", "storage_io"}
    for culprit in week_culprits:
        assert rgb(ui[culprit]) in seen, f"{culprit}: {ui[culprit]} is not on the printed page"
    for culprit in set(CULPRIT_COLOURS) - week_culprits:
        assert rgb(ui[culprit]) not in seen, f"{culprit}'s colour printed in a week without it"


def test_a_recurring_cause_carries_the_culprit_the_ui_shows_for_its_entity(db):
    """The newest incident of a recurring cause abstained (unknown); fleet memory classified
    the host behind all of them network_transport. The report says what the UI says."""
    at = MONDAY + timedelta(hours=10)
    incident_on("gpu-n", job="a", culprit="network_transport", started=at, fingerprint="fp-n")
    incident_on(
        "gpu-n", job="b", culprit="unknown", started=at + timedelta(days=1), fingerprint="fp-n"
    )
    flagged_host("gpu-n", culprit="network_transport")
    [top] = report.weekly_report_numbers("2026-W47", now=AFTER)["top_recurring"]
    assert (top["entity"], top["culprit"]) == ("host:gpu-n", "network_transport")
