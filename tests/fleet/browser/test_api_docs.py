"""The API docs work where GPU clusters live: with no way out to the internet, Swagger UI comes
from this server (drf-spectacular-sidecar) and shows the operations."""

from __future__ import annotations

from urllib.parse import urlsplit

import pytest


@pytest.fixture
def fleet(transactional_db):
    """Nothing to load: the docs describe the API, not the data."""


def block_the_network(page, live_server) -> list[str]:
    """Let through only requests to the test server; return the list of those refused."""
    ours = urlsplit(live_server.url).netloc
    refused: list[str] = []

    def only_this_server(route):
        if urlsplit(route.request.url).netloc == ours:
            route.continue_()
        else:
            refused.append(route.request.url)
            route.abort()

    page.context.route("**/*", only_this_server)
    return refused


def test_the_api_docs_show_the_operations_with_the_network_blocked(page, live_server):
    refused = block_the_network(page, live_server)
    page.goto("/api/docs/")
    page.wait_for_selector(".opblock-summary-path", timeout=30_000)
    paths = page.locator(".opblock-summary-path").all_inner_texts()
    assert any(p.startswith("/api/v1/uploads") for p in paths), paths
    assert any(p.startswith("/api/v1/incidents") for p in paths), paths
    assert refused == [], f"the docs reached outside this server: {refused}"


def test_redoc_shows_the_operations_with_the_network_blocked(page, live_server):
    refused = block_the_network(page, live_server)
    page.goto("/api/redoc/")
    # ReDoc renders each operation's path in its request samples panel.
    page.get_by_text("/api/v1/uploads").first.wait_for(timeout=30_000)
    assert page.get_by_text("/api/v1/incidents").count() > 0
    assert refused == [], f"the docs reached outside this server: {refused}"
