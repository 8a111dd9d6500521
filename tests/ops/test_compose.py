"""docker-compose.yml, read as compose reads it: every long-running service restarts on its own
(a Celery worker exits for good after some broker outages), and the worker queues match the
Make targets'."""

from pathlib import Path

import yaml

COMPOSE = Path(__file__).resolve().parents[2] / "docker-compose.yml"


def test_every_service_restarts_on_its_own_and_the_workers_cover_both_queues():
    services = yaml.safe_load(COMPOSE.read_text())["services"]
    assert {"postgres", "redis", "web", "proxy", "worker-ingest", "worker-analysis", "beat"} <= set(
        services
    )
    for name, service in services.items():
        assert service.get("restart") in ("always", "unless-stopped"), name
    queues = set()
    for name in ("worker-ingest", "worker-analysis"):
        command = services[name]["command"]
        queues |= set(command[command.index("-Q") + 1].split(","))
    assert queues == {"ingest", "analysis"}


def test_the_web_tier_is_reached_through_the_proxy_only():
    """gunicorn's sync workers sit behind nginx (tests/ops/test_proxy.py runs that config)."""
    services = yaml.safe_load(COMPOSE.read_text())["services"]
    assert "ports" not in services["web"]
    proxy = services["proxy"]
    [mount] = [v for v in proxy["volumes"] if v.endswith("/etc/nginx/conf.d/default.conf:ro")]
    conf = COMPOSE.parent / mount.split(":")[0]
    assert conf.is_file() and "server web:8000;" in conf.read_text()
    assert proxy["ports"] == ["8000:80"]
