"""docker-compose.yml, read as compose reads it: every long-running service restarts on its own
(a Celery worker exits for good after some broker outages), and the worker queues match the
Make targets'."""

from pathlib import Path

import yaml

COMPOSE = Path(__file__).resolve().parents[2] / "docker-compose.yml"


def test_every_service_restarts_on_its_own_and_the_workers_cover_both_queues():
    services = yaml.safe_load(COMPOSE.read_text())["services"]
    assert {"postgres", "redis", "web", "worker-ingest", "worker-analysis", "beat"} <= set(services)
    for name, service in services.items():
        assert service.get("restart") in ("always", "unless-stopped"), name
    queues = set()
    for name in ("worker-ingest", "worker-analysis"):
        command = services[name]["command"]
        queues |= set(command[command.index("-Q") + 1].split(","))
    assert queues == {"ingest", "analysis"}
