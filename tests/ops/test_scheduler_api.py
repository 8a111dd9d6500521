"""The scheduler API: hosts by verdict, drains, the audit trail, scopes and rate limits."""

from __future__ import annotations

import pytest
from django.core.cache import cache

from tests.ops.helpers import incident_on

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _fresh_rate_limits():
    cache.clear()
    yield
    cache.clear()


def client_with(make_key, *scopes):
    from rest_framework.test import APIClient

    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {make_key(*scopes)}")
    return client


def test_health_list_names_the_host_with_a_gpu_fault_as_drain(reader):
    from fleet.models import Host

    incident_on("gpu-bad")
    Host.objects.create(hostname="gpu-fine")
    body = reader.get("/api/v1/health").json()
    assert body["verdicts"] == {"ok": 1, "watch": 0, "drain": 1}
    assert {h["hostname"]: h["verdict"] for h in body["results"]} == {
        "gpu-bad": "drain",
        "gpu-fine": "ok",
    }
    drained = reader.get("/api/v1/health", {"verdict": "drain"}).json()
    assert [h["hostname"] for h in drained["results"]] == ["gpu-bad"]
    assert drained["count"] == 1
    assert "GPU hardware fault" in drained["results"][0]["reasons"][0]


def test_health_list_refuses_an_unknown_verdict(reader):
    response = reader.get("/api/v1/health", {"verdict": "sick"})
    assert response.status_code == 400
    assert "verdict" in response.json()["errors"]


def test_health_list_needs_a_key_with_read_scope(api, make_key):
    assert api.get("/api/v1/health").status_code == 401
    assert client_with(make_key, "upload").get("/api/v1/health").status_code == 403


def test_host_health_route_still_answers_beside_the_list(reader):
    incident_on("gpu-bad")
    assert reader.get("/api/v1/hosts/gpu-bad/health").json()["verdict"] == "drain"


def test_drain_is_a_dry_run_by_default_and_audited(make_key, reader):
    from analysis.models import DrainAction

    incident_on("gpu-bad")
    operator = client_with(make_key, "operate")
    response = operator.post(
        "/api/v1/hosts/gpu-bad/drain", {"reason": "xid 79 twice"}, format="json"
    )
    assert response.status_code == 200, response.content
    body = response.json()
    assert body["dry_run"] is True and body["result"] == "dry_run"
    assert body["command"] == (
        "scontrol update NodeName=gpu-bad State=DRAIN 'Reason=fleetwatch: xid 79 twice'"
    )
    assert body["by"].startswith("key:")
    row = DrainAction.objects.get()
    assert (row.action, row.adapter, row.host.hostname) == ("drain", "slurm", "gpu-bad")
    listed = reader.get("/api/v1/drains", {"host": "gpu-bad"}).json()
    assert [d["id"] for d in listed["results"]] == [row.pk]
    assert reader.get("/api/v1/drains", {"host": "other"}).json()["count"] == 0


def test_drain_needs_operate_scope_a_reason_and_a_known_host(make_key, reader):
    incident_on("gpu-bad")
    assert reader.post("/api/v1/hosts/gpu-bad/drain", {"reason": "x"}).status_code == 403
    operator = client_with(make_key, "operate")
    assert operator.post("/api/v1/hosts/gpu-bad/drain", {}, format="json").status_code == 400
    missing = operator.post("/api/v1/hosts/nope/drain", {"reason": "x"}, format="json")
    assert missing.status_code == 404


def test_incidents_by_job_for_schedulers(reader):
    incident_on("gpu-a", job="slurm-4242")
    incident_on("gpu-b", job="slurm-77", fingerprint="fp-2")
    body = reader.get("/api/v1/incidents", {"job": "slurm-4242"}).json()
    assert [i["job"] for i in body["results"]] == ["slurm-4242"]


def test_attempt_reports_need_upload_scope(make_key, reader):
    report = {"job": "slurm-1", "event": "start", "host": "gpu-a", "world_size": 8}
    assert reader.post("/api/v1/attempts", report, format="json").status_code == 403
    agent = client_with(make_key, "upload")
    assert agent.post("/api/v1/attempts", report, format="json").status_code == 200


def test_a_key_over_its_rate_gets_429_with_retry_after(make_key, settings):
    settings.FLEETWATCH_RATE_LIMITS = {"read": "3/min", "upload": "", "operate": "1/min"}
    first, second = client_with(make_key, "read"), client_with(make_key, "read")
    codes = [first.get("/api/v1/health").status_code for _ in range(4)]
    assert codes == [200, 200, 200, 429]
    refused = first.get("/api/v1/incidents")
    assert refused.status_code == 429
    assert 0 < int(refused["Retry-After"]) <= 60
    # The limit is per key: another scheduler's key is not held back.
    assert second.get("/api/v1/health").status_code == 200


def test_operate_has_its_own_smaller_budget(make_key, settings):
    settings.FLEETWATCH_RATE_LIMITS = {"read": "100/min", "upload": "", "operate": "1/min"}
    incident_on("gpu-bad")
    operator = client_with(make_key, "operate", "read")
    url = "/api/v1/hosts/gpu-bad/drain"
    assert operator.post(url, {"reason": "x"}, format="json").status_code == 200
    assert operator.post(url, {"reason": "x"}, format="json").status_code == 429
    assert operator.get("/api/v1/health").status_code == 200


def test_an_empty_rate_means_unlimited(make_key, settings):
    settings.FLEETWATCH_RATE_LIMITS = {"read": "", "upload": "", "operate": ""}
    reader = client_with(make_key, "read")
    assert {reader.get("/api/v1/health").status_code for _ in range(30)} == {200}


def test_healthz_answers_json_when_the_database_does(client):
    response = client.get("/healthz")
    assert response.status_code == 200
    assert response.json() == {"status": "ok", "database": "ok"}


def test_healthz_answers_503_when_the_database_does_not(client, monkeypatch):
    from django.db import connection

    def broken(*args, **kwargs):
        raise RuntimeError("connection refused")

    monkeypatch.setattr(connection, "cursor", broken)
    response = client.get("/healthz")
    assert response.status_code == 503
    assert response.json()["status"] == "error"


def test_report_pages_need_a_login(client, django_user_model):
    from analysis.models import WeeklyReport

    WeeklyReport.objects.create(
        week="2026-W47",
        starts_at="2026-11-16T00:00Z",
        ends_at="2026-11-23T00:00Z",
        status="ready",
        html="<html><body>archived report</body></html>",
        built_at="2026-11-23T06:00Z",
    )
    assert client.get("/reports/2026-W47/").status_code == 302
    user = django_user_model.objects.create_user("sre", password="pw-long-enough")
    client.force_login(user)
    page = client.get("/reports/2026-W47/")
    assert page.status_code == 200 and b"archived report" in page.content
    listing = client.get("/reports/")
    assert listing.status_code == 200 and b"2026-W47" in listing.content
    assert b'href="/reports/"' in listing.content  # in the nav, in the site's own page
    assert b"2026-W47.pdf" not in listing.content  # no PDF link where none was built
    assert client.get("/reports/2026-W48/").status_code == 404
    assert client.get("/reports/2026-W47.pdf").status_code == 404  # built without a PDF


def test_the_report_list_says_when_there_is_none_yet(client, django_user_model):
    client.force_login(django_user_model.objects.create_user("sre", password="pw-long-enough"))
    page = client.get("/reports/")
    assert page.status_code == 200 and b"No weekly report yet" in page.content
