"""The web UI shell: behind a login, and log text shown as text."""

import pytest

from analysis.models import Incident
from fleet.models import Attempt, Job

pytestmark = pytest.mark.django_db


@pytest.fixture
def hostile_incident():
    job = Job.objects.create(external_id="job-<b>x</b>")
    attempt = Attempt.objects.create(job=job)
    return Incident.objects.create(
        attempt=attempt,
        job=job,
        summary="<script>alert('summary')</script>",
        evidence=[
            {
                "file": "<img src=x onerror=alert(1)>",
                "line": 3,
                "signal": "s",
                "text": "[rank0]: <script>alert(1)</script> Watchdog caught",
            }
        ],
        suspects=[{"kind": "rank", "id": "0", "why": "<iframe>"}],
    )


def test_pages_need_a_login(client, hostile_incident):
    response = client.get("/")
    assert response.status_code == 302 and "/accounts/login/" in response["Location"]


def test_incident_list_and_page_show_log_text_escaped(admin_client, hostile_incident):
    listing = admin_client.get("/").content.decode()
    page = admin_client.get(f"/incidents/{hostile_incident.pk}/").content.decode()
    for html in (listing, page):
        assert "<script>" not in html
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert "<img src=x" not in page and "<iframe>" not in page
    assert "job-&lt;b&gt;x&lt;/b&gt;" in listing


def test_incident_list_filters_by_culprit(admin_client, hostile_incident):
    assert "alert" in admin_client.get("/?culprit=unknown").content.decode()
    assert "No incidents match" in admin_client.get("/?culprit=storage_io").content.decode()


def test_a_missing_incident_is_a_404(admin_client):
    assert admin_client.get("/incidents/999/").status_code == 404


def test_login_page_renders_with_csrf(client):
    html = client.get("/accounts/login/").content.decode()
    assert "csrfmiddlewaretoken" in html
