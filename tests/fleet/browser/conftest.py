"""Debian's headless chromium driven by Playwright, on the demo fleet: the setup every browser
test here shares (helpers in support.py). Needs /usr/bin/chromium (apt-get install chromium)
and the ``playwright`` package; the tests skip with the reason when either is missing."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.fleet.browser.support import CHROMIUM, SHOTS, sync_playwright


def pytest_collection_modifyitems(config, items):
    here = Path(__file__).parent
    missing = (
        "playwright is not installed (pip)"
        if sync_playwright is None
        else f"{CHROMIUM} missing (apt-get install chromium)"
        if not os.path.exists(CHROMIUM)
        else None
    )
    if missing:
        for item in items:
            if Path(str(item.fspath)).parent == here:
                item.add_marker(pytest.mark.skip(reason=missing))


@pytest.fixture
def page(fleet, live_server):
    """A tab on the live server, after the module's ``fleet`` fixture loaded its data; fails the
    test on any JavaScript error the pages raised."""
    # Playwright's sync API runs an event loop in this thread; the ORM work is done above.
    os.environ.setdefault("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
    SHOTS.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as pw:
        browser = pw.chromium.launch(
            executable_path=CHROMIUM,
            headless=True,
            args=["--no-sandbox", "--disable-gpu", "--disable-background-networking"],
        )
        context = browser.new_context(
            base_url=live_server.url, viewport={"width": 1300, "height": 900}
        )
        tab = context.new_page()
        tab.set_default_timeout(10_000)
        errors: list[str] = []
        tab.on("pageerror", lambda error: errors.append(str(error)))
        yield tab
        browser.close()
        assert not errors, errors
