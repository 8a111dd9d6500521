"""/metrics from the database at scrape time, and the HealthCheckProgram script."""

from __future__ import annotations

from datetime import timedelta
from io import StringIO

import pytest
from django.conf import settings
from django.core.management import call_command
from django.utils import timezone
from prometheus_client.parser import text_string_to_metric_families

from tests.ops.helpers import incident_on

pytestmark = pytest.mark.django_db


def samples(body: str) -> dict:
    out = {}
    for family in text_string_to_metric_families(body):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def test_metrics_count_incidents_verdicts_uploads_and_lag(client):
    from fleet.models import Host
    from ingest.models import Upload

    host, incident = incident_on("gpu-bad")
    Host.objects.create(hostname="gpu-fine")
    for status, age in (("received", 120), ("failed", 5), ("parsed", 1)):
        Upload.objects.create(
            sha256=f"{status:0<64}",
            size=1,
            host=host,
            job=incident.job,
            attempt=incident.attempt,
            blob="uploads/x",
            status=status,
            received_at=timezone.now() - timedelta(seconds=age),
        )
    response = client.get("/metrics")
    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/plain")
    got = samples(response.content.decode())
    assert got[("fleetwatch_incidents_total", (("culprit", "bad_node_hardware"),))] == 1
    assert got[("fleetwatch_incidents_total", (("culprit", "storage_io"),))] == 0
    assert got[("fleetwatch_hosts", (("verdict", "drain"),))] == 1
    assert got[("fleetwatch_hosts", (("verdict", "ok"),))] == 1
    assert got[("fleetwatch_parse_failures_total", ())] == 1
    assert 119 <= got[("fleetwatch_ingest_lag_seconds", ())] < 200
    assert got[("fleetwatch_uploads", (("status", "received"),))] == 1
    queue = [value for (name, _labels), value in got.items() if name == "fleetwatch_queue_depth"]
    if settings.CELERY_BROKER_URL.startswith("redis://"):
        assert queue and all(v >= 0 for v in queue)  # the real queue, read with LLEN
    else:
        assert queue == []  # no broker to ask: absent, not a made-up zero


def test_metrics_are_the_same_from_any_worker(client):
    # Two renders stand for two gunicorn workers: nothing is held in the process.
    from fleet.metrics import render

    incident_on("gpu-bad")
    assert render()[0] == render()[0]
    incident_on("gpu-other", job="job-2", fingerprint="fp-2")
    assert b'fleetwatch_incidents_total{culprit="bad_node_hardware"} 2.0' in render()[0]


def test_queue_depth_reads_llen_of_each_celery_queue(monkeypatch, settings):
    from fleet import metrics

    class FakeRedis:
        def llen(self, name):
            return {"ingest": 17, "analysis": 3}[name]

        def close(self):
            pass

    settings.CELERY_BROKER_URL = "redis://broker:6379/0"
    monkeypatch.setattr("redis.Redis.from_url", lambda *a, **k: FakeRedis())
    rendered = metrics.render()[0]
    assert b'fleetwatch_queue_depth{queue="ingest"} 17.0' in rendered
    assert b'fleetwatch_queue_depth{queue="analysis"} 3.0' in rendered


def test_metrics_token_when_configured(client, settings):
    settings.FLEETWATCH_METRICS_TOKEN = "s3cret"
    assert client.get("/metrics").status_code == 401
    assert client.get("/metrics", HTTP_AUTHORIZATION="Bearer s3cret").status_code == 200


def check(*args) -> tuple[int, str]:
    out = StringIO()
    with pytest.raises(SystemExit) as exit_:
        call_command("host_check", *args, stdout=out)
    return exit_.value.code, out.getvalue().strip()


def test_host_check_exit_codes_follow_the_verdict():
    from fleet.models import Host

    incident_on("gpu-bad")
    Host.objects.create(hostname="gpu-fine")
    code, line = check("gpu-bad")
    assert code == 2 and line.startswith("DRAIN gpu-bad: score") and "\n" not in line
    assert check("gpu-fine") == (0, "OK gpu-fine: score 0.0; no recent incidents")
    code, line = check("gpu-nobody")
    assert code == 3 and line == "UNKNOWN gpu-nobody: not known to Fleetwatch"


def test_host_check_watch_is_exit_1():
    incident_on("gpu-meh", rule_id="lagging_rank", confidence=0.3)
    code, line = check("gpu-meh")
    assert code == 1 and line.startswith("WATCH gpu-meh")


def test_host_check_over_the_api_with_a_read_key(live_server, make_key):
    incident_on("gpu-bad")
    key = make_key("read")
    code, line = check("gpu-bad", "--url", live_server.url, "--key", key)
    assert code == 2 and line.startswith("DRAIN gpu-bad")
    assert check("gpu-none", "--url", live_server.url, "--key", key)[0] == 3
    code, line = check("gpu-bad", "--url", live_server.url, "--key", "wrong")
    assert code == 3 and "HTTP 401" in line


def test_every_dashboard_query_names_a_series_the_exporter_exposes(client):
    # Counters are exposed with their _total suffix; a panel that drops it shows no data, and
    # delta() on a counter misreads a reset (Prometheus docs: use increase()/rate()).
    import json
    import re

    incident_on("gpu-bad")
    exposed = set()
    for family in text_string_to_metric_families(client.get("/metrics").content.decode()):
        # A family is exposed even with no samples yet (no drain requested so far).
        exposed.add(family.name + ("_total" if family.type == "counter" else ""))
    dashboard = json.loads(
        (settings.BASE_DIR / "fleet" / "grafana" / "fleetwatch.json").read_text()
    )
    exprs = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", []) if "expr" in t]
    assert exprs
    for expr in exprs:
        for name in re.findall(r"\bfleetwatch_[a-z_]+", expr):
            if name == "fleetwatch_queue_depth" and not settings.CELERY_BROKER_URL.startswith(
                "redis://"
            ):
                continue  # only with a broker to ask
            assert name in exposed, (expr, sorted(exposed))
        assert not re.search(r"\bdelta\(\s*fleetwatch_\w+_total", expr), expr
