"""HTML and script in what a crashing job printed, sent the way an agent sends it (through the
upload API, parsed, classified), then read in the web UI: shown as text, escaped, and bounded
in size. (tests/fleet/test_ui.py checks the templates with rows made directly; this checks the
whole path from the bytes an agent sends to the HTML an SRE opens.)"""

from __future__ import annotations

import json
import re

import pytest

from analysis.models import Incident
from fleet.demo import JobScenario, rank_log
from ingest.models import Event, Upload
from tests.hostile.forms import upload_form

pytestmark = pytest.mark.django_db

SCENARIO = JobScenario("job-html", ["gpu-001", "gpu-002"], world=2, lagging=1, seq=812)
SCRIPT = "<script>alert('{}')</script>"
IMG = '<img src=x onerror="alert({})">'
LONG = 100_000  # one line of 100 KB


def hostile_log(rank: int) -> str:
    """The rank's real log with script after the watchdog line's own text, and 100 KB of
    padding on that line (what a tqdm bar glued to it looks like)."""
    return rank_log(SCENARIO, rank).replace(
        "before timing out.",
        f"before timing out. {SCRIPT.format(f'evidence{rank}')} {IMG.format(rank)} " + "A" * LONG,
    )


KERNEL = (
    f"Nov 21 03:12:44 gpu-001 kernel: NVRM: Xid (PCI:0000:3b:00): 79, pid=4242, "
    f"name={SCRIPT.format('xid')}, GPU has fallen off the bus.\n"
)
HW = {
    "hw_stats": "fleetwatch.hw_stats/1",
    "host": "gpu-001",
    "records": [
        {"type": "gpu", "index": 0, "pci": SCRIPT.format("pci"), "throttle_reasons": ["<b>hot"]},
        {"type": "nic", "device": "mlx5_0", "port": "1", "state": IMG.format("nic")},
        {"type": SCRIPT.format("type")},  # unknown: an issue, shown as the upload's error
    ],
}


@pytest.fixture
def incident(upload, post_form, make_key, api):
    for rank in (0, 1):
        response = upload(hostile_log(rank), host=SCENARIO.host_of(rank), job="job-html", rank=rank)
        assert response.status_code == 202
    upload(KERNEL, host="gpu-001", job="job-html", name="kern.log")
    upload(json.dumps(HW), host="gpu-001", job="job-html", name="hw.json", kind="hw_stats")
    named = post_form(upload_form(b"step 1\n", IMG.format("filename") + ".log", job="job-html"))
    assert named.status_code == 202
    api.credentials(HTTP_AUTHORIZATION=f"Bearer {make_key('operate')}")
    note = {"note": SCRIPT.format("repair note")}
    assert api.post("/api/v1/hosts/gpu-001/repaired", note, format="json").status_code == 200
    return Incident.objects.get(job__external_id="job-html")


def assert_shown_escaped(html: str, *names: str) -> None:
    """No markup from the content survives, and the content is there, escaped: a page that
    dropped the text would pass the first check alone."""
    assert "<script>alert" not in html and "<img src=x" not in html and "<b>hot" not in html
    for name in names:
        assert f"&lt;script&gt;alert(&#x27;{name}&#x27;)&lt;/script&gt;" in html, name


def test_the_incident_page_shows_log_text_evidence_and_errors_escaped(admin_client, incident):
    response = admin_client.get(f"/incidents/{incident.pk}/")
    assert response.status_code == 200
    html = response.content.decode()
    assert_shown_escaped(html, "evidence0", "xid")
    assert "&lt;img src=x onerror=&quot;alert(filename)&quot;&gt;.log" in html  # the file name
    assert "unknown record type &quot;&lt;script&gt;alert(" in html  # an upload's error


def test_evidence_text_is_bounded_on_the_page_and_in_the_row(admin_client, incident):
    html = admin_client.get(f"/incidents/{incident.pk}/").content.decode()
    assert len(html) < 200_000
    assert max(map(len, re.findall("A+", html))) <= 2000
    assert max(len(e.text) for e in Event.objects.all()) <= 2000
    assert max(len(e["text"]) for e in incident.evidence) <= 2000


def test_the_artifact_viewer_shows_the_raw_line_escaped_and_cut(admin_client, incident):
    row = Upload.objects.get(job__external_id="job-html", rank=0)
    line = Event.objects.get(upload=row, kind="watchdog_timeout").line
    html = admin_client.get(f"/artifacts/{row.pk}/?line={line}").content.decode()
    assert_shown_escaped(html, "evidence0")
    assert "line truncated" in html and "A" * 5000 not in html


def test_the_artifact_viewer_shows_a_hostile_file_name_escaped(admin_client, incident):
    row = Upload.objects.get(filename__startswith="<img")
    html = admin_client.get(f"/artifacts/{row.pk}/").content.decode()
    assert "<img src=x" not in html
    assert html.count("&lt;img src=x onerror=&quot;alert(filename)&quot;&gt;.log") >= 2


def test_the_host_page_shows_hardware_readings_and_notes_escaped(admin_client, incident):
    html = admin_client.get("/hosts/gpu-001/").content.decode()
    assert_shown_escaped(html, "xid", "pci", "repair note")
    assert "&lt;img src=x onerror=&quot;alert(nic)&quot;&gt;" in html
    assert "&lt;b&gt;hot" in html
