"""What the browser tests share: Debian's chromium (never a downloaded browser), the demo
fleet through the real upload API, logging in, screenshots (test-artifacts/screenshots/)."""

from __future__ import annotations

import gzip
import io
from pathlib import Path

CHROMIUM = "/usr/bin/chromium"
SHOTS = Path(__file__).resolve().parents[3] / "test-artifacts" / "screenshots"
HOSTILE = "E1121 [rank1]: <script>window.pwned=1</script> <b>bold</b> & <i>x</i>"

try:
    from playwright.sync_api import sync_playwright
except ImportError:  # pragma: no cover - CI installs it
    sync_playwright = None


def demo_fleet_with(days: int, reader: str) -> int:
    """The demo fleet through the real upload API (``days`` of it), the operator ``op`` with the
    password ``op-password``, a read-only ``reader`` (password ``<reader>-password``), and a log
    line that looks like HTML. Returns that upload's id."""
    from django.contrib.auth.models import User
    from django.core.files.uploadedfile import SimpleUploadedFile
    from django.core.management import call_command
    from django.test import Client

    from ingest.models import AgentKey

    call_command("demo_fleet", hosts=16, days=days, user="op", stdout=io.StringIO())
    op = User.objects.get(username="op")
    op.set_password("op-password")
    op.save()
    User.objects.create_user(reader, password=f"{reader}-password")
    _, key = AgentKey.objects.create_key(name="browser test", scopes=["upload"])
    body = f"step 1 loss 2.0\n{HOSTILE}\nstep 2 loss 1.9\n".encode()
    response = Client().post(
        "/api/v1/uploads",
        {
            "file": SimpleUploadedFile("hostile.log.gz", gzip.compress(body)),
            "host": "gpu-hostile",
            "job": "hostile-job",
            "rank": 1,
        },
        HTTP_AUTHORIZATION=f"Bearer {key}",
    )
    assert response.status_code == 202, response.content
    return response.json()["id"]


def login(page, username: str, password: str) -> None:
    page.goto("/accounts/login/")
    page.fill("input[name=username]", username)
    page.fill("input[name=password]", password)
    page.click("button[type=submit], input[type=submit]")


def shot(page, name: str) -> None:
    page.screenshot(path=str(SHOTS / f"{name}.png"), full_page=True)
