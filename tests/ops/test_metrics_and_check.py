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
    assert got[("fleetwatch_incidents_total", ())] == 1
    assert got[("fleetwatch_incidents_by_culprit", (("culprit", "bad_node_hardware"),))] == 1
    assert got[("fleetwatch_incidents_by_culprit", (("culprit", "storage_io"),))] == 0
    assert got[("fleetwatch_hosts", (("verdict", "drain"),))] == 1
    assert got[("fleetwatch_hosts", (("verdict", "ok"),))] == 1
    # Each host's own series, so that an alert names the host.
    assert got[("fleetwatch_host_verdict", (("host", "gpu-bad"), ("verdict", "drain")))] == 1
    assert got[("fleetwatch_host_verdict", (("host", "gpu-fine"), ("verdict", "ok")))] == 1
    assert got[("fleetwatch_host_score", (("host", "gpu-fine"),))] == 0
    assert got[("fleetwatch_parse_failures_total", ())] == 1
    assert 119 <= got[("fleetwatch_ingest_lag_seconds", ())] < 200
    assert got[("fleetwatch_uploads", (("status", "received"),))] == 1
    queue = {
        dict(labels)["queue"]: value
        for (name, labels), value in got.items()
        if name == "fleetwatch_queue_depth"
    }
    if settings.CELERY_BROKER_URL.startswith("redis://"):
        assert set(queue) == {"ingest", "analysis"}  # the real queues, read with LLEN
    else:
        assert set(queue) == {"in-process"}  # eager: tasks waiting out their countdown here


def test_metrics_are_the_same_from_any_worker(client):
    # Two renders stand for two gunicorn workers: nothing is held in the process.
    from fleet.metrics import render

    incident_on("gpu-bad")
    assert render()[0] == render()[0]
    incident_on("gpu-other", job="job-2", fingerprint="fp-2")
    assert b"fleetwatch_incidents_total 2.0" in render()[0]


def reachable(port: int) -> bool:
    import socket

    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
    except OSError:
        return False
    return True


@pytest.mark.skipif(not reachable(6379), reason="no Redis on 127.0.0.1:6379")
def test_queue_depth_reads_each_celery_queue_of_a_redis_broker(settings):
    import redis

    from fleet import metrics

    settings.CELERY_BROKER_URL = "redis://127.0.0.1:6379/14"
    settings.CELERY_TASK_ALWAYS_EAGER = False
    client = redis.Redis.from_url(settings.CELERY_BROKER_URL)
    client.delete("ingest", "analysis")
    try:
        client.rpush("ingest", *[f"message {i}" for i in range(17)])
        client.rpush("analysis", *[f"message {i}" for i in range(3)])
        rendered = metrics.render()[0]
    finally:
        client.delete("ingest", "analysis")
        client.close()
    assert b'fleetwatch_queue_depth{queue="ingest"} 17.0' in rendered
    assert b'fleetwatch_queue_depth{queue="analysis"} 3.0' in rendered


@pytest.mark.skipif(not reachable(5672), reason="no RabbitMQ on 127.0.0.1:5672")
def test_queue_depth_reads_each_celery_queue_of_an_amqp_broker(settings):
    from kombu import Connection, Exchange, Queue

    from fleet import metrics

    settings.CELERY_BROKER_URL = "amqp://guest:guest@127.0.0.1:5672//"
    settings.CELERY_TASK_ALWAYS_EAGER = False
    with Connection(settings.CELERY_BROKER_URL, connect_timeout=2) as connection:
        queues = {name: Queue(name, Exchange(name), routing_key=name) for name in ("ingest",)}
        producer = connection.Producer()
        for queue in queues.values():
            queue(connection.default_channel).declare()
            queue(connection.default_channel).purge()
        try:
            for i in range(5):
                producer.publish(
                    {"n": i},
                    exchange=queues["ingest"].exchange,
                    routing_key="ingest",
                    declare=[queues["ingest"]],
                )
            rendered = metrics.render()[0]
        finally:
            for queue in queues.values():
                queue(connection.default_channel).delete()
    assert b'fleetwatch_queue_depth{queue="ingest"} 5.0' in rendered
    # A queue no worker declared yet holds nothing.
    assert b'fleetwatch_queue_depth{queue="analysis"} 0.0' in rendered


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


def exposed_types(client) -> dict[str, str]:
    """Every series name /metrics exposes -> its type; counters with their _total suffix."""
    types = {}
    for family in text_string_to_metric_families(client.get("/metrics").content.decode()):
        # A family is exposed even with no samples yet (no drain requested so far).
        types[family.name + ("_total" if family.type == "counter" else "")] = family.type
    return types


def assert_expression_reads_the_exporter(expr: str, types: dict[str, str]) -> None:
    """Names a series /metrics exposes; rate()/increase()/irate() only over counters (they read
    resets), delta()/deriv() never over them (Prometheus docs, functions)."""
    import re

    names = re.findall(r"\bfleetwatch_[a-z_]+", expr)
    assert names, expr
    for name in names:
        assert name in types, (expr, sorted(types))
    for fn, name in re.findall(r"\b(rate|irate|increase|delta|deriv)\(\s*(fleetwatch_\w+)", expr):
        if fn in ("rate", "irate", "increase"):
            assert types[name] == "counter", (expr, f"{fn}() over the {types[name]} {name}")
        else:
            assert types[name] != "counter", (expr, f"{fn}() over the counter {name}")


def test_every_dashboard_query_names_a_series_the_exporter_exposes(client):
    import json

    incident_on("gpu-bad")
    types = exposed_types(client)
    dashboard = json.loads(
        (settings.BASE_DIR / "fleet" / "grafana" / "fleetwatch.json").read_text()
    )
    exprs = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", []) if "expr" in t]
    assert exprs
    for expr in exprs:
        assert_expression_reads_the_exporter(expr, types)


def test_every_alerting_rule_reads_series_the_exporter_exposes(client):
    import yaml

    incident_on("gpu-bad")
    types = exposed_types(client)
    rules = yaml.safe_load(
        (settings.BASE_DIR / "fleet" / "grafana" / "fleetwatch-alerts.yml").read_text()
    )
    alerts = [rule for group in rules["groups"] for rule in group["rules"]]
    assert {"FleetwatchHostToDrain", "FleetwatchIngestLagging"} <= {a["alert"] for a in alerts}
    for alert in alerts:
        assert_expression_reads_the_exporter(alert["expr"], types)
        assert alert["labels"]["severity"] in ("warning", "critical"), alert
        assert alert["annotations"]["summary"], alert


def test_a_reclassified_incident_lowers_no_counter(client):
    from analysis.models import IncidentRevision

    _host, incident = incident_on("gpu-bad")
    IncidentRevision.objects.create(incident=incident, culprit="bad_node_hardware")
    before = samples(client.get("/metrics").content.decode())
    incident.culprit = "storage_io"
    incident.save(update_fields=["culprit"])
    IncidentRevision.objects.create(incident=incident, culprit="storage_io")
    after = samples(client.get("/metrics").content.decode())
    counters = {
        key for key in before if key[0].endswith("_total") and key[0] != "fleetwatch_queue_depth"
    }
    assert counters
    for key in counters:
        assert after[key] >= before[key], key
    verdicts = ("fleetwatch_verdicts_total", (("culprit", "storage_io"),))
    assert (before[verdicts], after[verdicts]) == (0, 1)
    # The current count moved between culprits: a gauge, which may go down.
    gauge = ("fleetwatch_incidents_by_culprit", (("culprit", "bad_node_hardware"),))
    assert (before[gauge], after[gauge]) == (1, 0)


def test_host_health_is_computed_once_per_state_of_its_inputs_and_shared(
    client, django_assert_max_num_queries
):
    from fleet import drain
    from fleet.models import Host

    for n in range(30):
        incident_on(f"gpu-{n:02d}", job=f"j{n}", fingerprint=f"fp-{n}")
    Host.objects.create(hostname="gpu-fine")
    first = drain.hosts_health_shared()
    assert first == drain.hosts_health()
    # Nothing moved: the shared result, a handful of aggregate queries whatever the hosts.
    with django_assert_max_num_queries(4):
        again = drain.hosts_health_shared()
    assert again == first
    with django_assert_max_num_queries(4 + 20):  # the rest of the scrape, hosts read shared
        client.get("/metrics")
    # A new implication, a repair: the next reader sees them.
    incident_on("gpu-new", job="j-new", fingerprint="fp-new")
    assert "gpu-new" in {h.hostname for h in drain.hosts_health_shared() if h.verdict == "drain"}
    from analysis.memory import host_repaired

    host_repaired(Host.objects.get(hostname="gpu-new"))
    assert {h.hostname: h.verdict for h in drain.hosts_health_shared()}["gpu-new"] == "ok"


def test_a_cache_that_is_down_costs_the_computation_not_the_answer(client, monkeypatch):
    from django.core.cache import cache
    from redis.exceptions import ConnectionError as RedisDown

    from fleet import drain

    incident_on("gpu-bad")

    def down(*args, **kwargs):
        raise RedisDown("Connection refused")

    for name in ("get", "add", "set", "delete"):
        monkeypatch.setattr(cache, name, down)
    assert {h.hostname: h.verdict for h in drain.hosts_health_shared()} == {"gpu-bad": "drain"}
    got = samples(client.get("/metrics").content.decode())
    assert got[("fleetwatch_host_verdict", (("host", "gpu-bad"), ("verdict", "drain")))] == 1
