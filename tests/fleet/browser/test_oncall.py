"""The on-call SRE's loop in the browser, each step at most three clicks from the overview.

On the demo fleet (two days: culprits get flagged), the operator ``op`` sees who owns the worst
culprit, assigns it to themself, drains its host (a dry run showing the scontrol command),
resolves it with a note, and, after ``demo_fleet --again`` sends the same planted culprits again,
sees a resolved culprit reopen as a regression. A reader sees no workflow buttons, and log text
is shown as text. Same setup as test_walkthrough.py: Debian's chromium driven by Playwright.
"""

from __future__ import annotations

import io
import re

import pytest

from tests.fleet.browser.support import HOSTILE, demo_fleet_with, shot
from tests.fleet.browser.support import login as sign_in

MAX_CLICKS = 3
HOST_KINDS = ("host", "gpu", "nic")  # culprits whose page offers "Drain <host>"

try:
    from playwright.sync_api import expect
except ImportError:  # pragma: no cover - CI installs it; conftest skips these tests
    expect = None


@pytest.fixture
def fleet(transactional_db):
    """Two demo days (flagged culprits), an operator, a reader, and a log line that looks like
    HTML uploaded through the real API. Returns that upload's id."""
    from analysis.models import CulpritScore

    upload_id = demo_fleet_with(days=2, reader="reader")
    assert CulpritScore.objects.filter(flagged=True).exists(), "the demo flagged no culprit"
    return upload_id


class Clicks:
    """Counts the clicks from the overview: every step starts at ``/`` with none spent."""

    def __init__(self, page):
        self.page, self.n = page, 0

    def overview(self):
        self.page.goto("/")
        expect(self.page.locator("h1")).to_have_text("Fleet overview")
        self.n = 0
        return self.page.locator("table.top-culprits tbody tr")

    def __call__(self, locator):
        locator.click()
        self.n += 1
        assert self.n <= MAX_CLICKS, f"more than {MAX_CLICKS} clicks from the overview"


def login(page, username, password):
    sign_in(page, username, password)
    expect(page.locator("header form.logout span")).to_have_text(username)


def row_of(rows, pk):
    return rows.filter(has=rows.page.locator(f"a[href='/culprits/{pk}/']"))


def test_the_on_call_loop_from_the_overview(page):
    from django.core.management import call_command

    from analysis import services
    from analysis.models import CulpritScore

    login(page, "op", "op-password")
    click = Clicks(page)
    status = page.locator(".workflow > p").first

    # 1. Who owns the worst culprit: zero clicks.
    rows = click.overview()
    worst = rows.first
    expect(worst.locator(".flag").first).to_have_text("flagged")
    expect(worst.locator("td.assignee")).to_have_text("—")
    worst_href = worst.locator("a").first.get_attribute("href")
    worst_pk = int(re.search(r"/culprits/(\d+)/", worst_href).group(1))

    # 2. Assign it to me: two clicks.
    click(worst.locator("a").first)
    click(page.get_by_role("button", name="Assign to me"))
    expect(page.locator("#messages")).to_contain_text("Assigned to op.")
    expect(page.locator(".workflow .assignee")).to_have_text("op")
    expect(page.get_by_role("button", name="Assign to me")).to_have_count(0)
    shot(page, "oncall-01-culprit-assigned")
    rows = click.overview()
    expect(row_of(rows, worst_pk).locator("td.assignee")).to_have_text("op")

    # 3. Drain its host (or the first host/GPU/NIC culprit's): a dry run, shown with its command.
    entities = [t.strip() for t in rows.locator("td:first-child a").all_inner_texts()]
    on_host = next((i for i, e in enumerate(entities) if e.split()[0] in HOST_KINDS), None)
    assert on_host is not None, f"no host, GPU or NIC culprit on the overview: {entities}"
    hostname = entities[on_host].split()[1].split("/")[0]
    click(rows.nth(on_host).locator("a").first)
    click(page.get_by_role("button", name=f"Drain {hostname}"))
    expect(page).to_have_url(re.compile(rf"/hosts/{re.escape(hostname)}/$"))
    expect(page.locator("h1")).to_have_text(hostname)
    message = page.locator("#messages")
    expect(message).to_contain_text("Dry run: nothing ran")
    expect(message).to_contain_text("scontrol")
    drain_clicks = click.n

    # 4. Resolve the worst culprit with a note: two clicks (and typing).
    click.overview()
    click(row_of(rows, worst_pk).locator("a").first)
    page.get_by_label("resolution note").fill("rack recabled")
    click(page.get_by_role("button", name="Resolve"))
    expect(page.locator(".workflow .status")).to_have_text("resolved")
    expect(page.locator(".workflow .journal")).to_contain_text("rack recabled")
    expect(page.get_by_role("button", name="Reopen")).to_be_visible()

    # 5. Every other flagged culprit resolved too, then the demo fleet's next day.
    for score in CulpritScore.objects.filter(flagged=True).exclude(status="resolved"):
        assert services.culprit_resolve(score, by="op", note="dealt with by the test")
    out = io.StringIO()
    call_command("demo_fleet", hosts=16, again=True, stdout=out)
    rows = click.overview()
    back = rows.filter(has=page.locator(".flag.regression"))
    expect(back.first).to_be_visible()  # at least one culprit came back
    shot(page, "oncall-02-overview-regression")
    click(back.first.locator("a").first)
    expect(status.locator(".flag.regression")).to_have_text("regression")
    expect(page.locator(".workflow .status")).to_have_text("open")
    expect(page.locator(".workflow .journal li").last).to_contain_text("regression")
    assert click.n <= 2, out.getvalue()
    assert drain_clicks <= MAX_CLICKS


def test_a_reader_cannot_act_and_log_text_stays_text(page, fleet):
    from analysis.models import CulpritScore

    login(page, "reader", "reader-password")
    score = CulpritScore.objects.filter(flagged=True).order_by("-score").first()
    page.goto(f"/culprits/{score.pk}/")
    expect(page.locator(".workflow")).to_contain_text("Read-only")
    expect(page.get_by_role("button", name="Assign to me")).to_have_count(0)
    expect(page.locator(".workflow form")).to_have_count(0)

    page.goto(f"/artifacts/{fleet}/?line=2")
    target = page.locator("#L2")
    expect(target).to_contain_text(HOSTILE)
    assert target.locator("script, b, i").count() == 0
    assert page.evaluate("() => window.pwned") is None
