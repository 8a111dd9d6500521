"""Every page of the UI in Debian's headless Chromium, driven by Playwright, on the demo fleet.

Needs /usr/bin/chromium (apt-get install chromium) and the ``playwright`` package; skips with
the reason when either is missing. Never downloads a browser. Screenshots go to
test-artifacts/screenshots/.
"""

from __future__ import annotations

import re

import pytest

from tests.fleet.browser.support import HOSTILE, demo_fleet_with, login, shot

try:
    from playwright.sync_api import expect
except ImportError:  # pragma: no cover - CI installs it; conftest skips these tests
    expect = None


@pytest.fixture
def fleet(transactional_db):
    """One demo day, an operator, a viewer, and a log line that looks like HTML."""
    return demo_fleet_with(days=1, reader="viewer")


def test_an_operator_walks_every_page(page):
    login(page, "op", "op-password")
    page.click("header >> text=Fleetwatch")
    expect(page.locator("h1")).to_have_text("Fleet overview")
    # Drawn on the server (analysis/charts.py): an SVG with a segment per day and class.
    expect(page.locator("#per-day-chart svg[role=img]")).to_be_visible()
    assert page.locator("#per-day-chart svg rect[data-culprit]").count() > 0
    shot(page, "01-overview")

    # Incidents: filter through htmx (the select change swaps the table in place).
    page.click("nav >> text=Incidents")
    expect(page.locator("h1")).to_have_text("Incidents")
    shot(page, "02-incidents")
    page.select_option("select[name=culprit]", "storage_io")
    expect(page).to_have_url(re.compile(r"culprit=storage_io"))
    rows = page.locator("table.incidents tbody tr")
    expect(rows.first).to_contain_text("storage_io")
    for text in rows.all_inner_texts():
        assert "storage_io" in text
    shot(page, "03-incidents-filtered")

    # An incident, its evidence, and the raw line behind it.
    rows.first.locator("a").first.click()
    expect(page.locator(".verdict .culprit")).to_have_text("storage_io")
    expect(page.locator("h2", has_text="Rank timeline")).to_be_visible()
    shot(page, "04-incident")
    incident_url = page.url
    evidence = page.locator("a.evidence-link").first
    line = evidence.inner_text()
    evidence.click()
    expect(page.locator(f"#L{line}.target")).to_be_visible()
    shot(page, "05-artifact")

    # The workflow: acknowledge, then resolve (htmx swaps the panel; CSRF from the page).
    page.goto(incident_url)
    page.click("button:text('Acknowledge')")
    expect(page.locator(".workflow")).to_contain_text("acknowledged by op")
    page.fill(".workflow form:has(button:text('Resolve')) input[name=note]", "logs moved")
    page.click("button:text('Resolve')")
    expect(page.locator(".workflow .status")).to_have_text("resolved")
    page.reload()
    expect(page.locator(".workflow")).to_contain_text("logs moved")
    shot(page, "06-incident-resolved")

    page.click("nav >> text=Hosts")
    expect(page.locator("h1")).to_have_text("Hosts")
    shot(page, "07-hosts")
    page.locator("table.list tbody a").first.click()
    expect(page.locator(".verdict .verdict")).to_be_visible()
    shot(page, "08-host")

    page.click("nav >> text=Culprits")
    shot(page, "09-culprits")
    page.locator("table.list tbody a").first.click()
    expect(page.get_by_role("heading", name="Incidents", exact=True)).to_be_visible()
    shot(page, "10-culprit")

    page.click("nav >> text=Jobs")
    shot(page, "11-jobs")
    page.locator("table.list tbody a").first.click()
    expect(page.locator("h1")).not_to_be_empty()
    shot(page, "12-job")


def test_html_in_a_log_line_is_shown_as_text(page, fleet):
    login(page, "viewer", "viewer-password")
    page.goto(f"/artifacts/{fleet}/?line=2")
    target = page.locator("#L2")
    expect(target).to_contain_text(HOSTILE)
    assert target.locator("script, b, i").count() == 0
    assert page.evaluate("() => window.pwned") is None
    shot(page, "13-hostile-artifact")
    # A read-only user sees no workflow buttons and no host actions.
    page.goto("/hosts/gpu-hostile/")
    expect(page.locator("button:text('Drain')")).to_have_count(0)
