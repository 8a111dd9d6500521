"""Parsing and analysis travel on separate queues, so each scales (and backs up) on its own."""

from __future__ import annotations

import pytest

from fleet.demo import JobScenario

from .stack import wait_until

pytestmark = pytest.mark.slow


def test_an_ingest_worker_parses_and_only_an_analysis_worker_classifies(stack):
    broker = stack.redis()
    env = stack.env(broker)
    web = stack.gunicorn(env, workers=1)
    ingest = stack.worker("ingest", env, queues="ingest")
    ingest.wait_ready()

    scenario = JobScenario("job-queues", ["gpu-q1", "gpu-q2"], world=2, lagging=0, seq=300)
    web.accepted_logs(stack.key, scenario, (0, 1))

    db = stack.database
    wait_until(
        lambda: (
            ingest.assert_alive()
            or db.value("SELECT count(*) FROM ingest_upload WHERE status = 'parsed'") == 2
        ),
        60,
        "the ingest worker to parse both uploads",
    )
    # The classify task waits on the analysis queue, which nobody consumes yet, and only there
    # (one or two of them: the first parse schedules one too if it ends before the second upload
    # arrives). The parse commits its row before it publishes: wait for the message, do not
    # expect it the instant the row says "parsed" (a busy machine widens that gap).
    wait_until(
        lambda: broker.client().llen("analysis") >= 1,
        60,
        "the classify task on the analysis queue",
    )
    assert broker.client().llen("analysis") in (1, 2), stack.logs_text()
    assert broker.client().llen("ingest") == 0
    assert db.value("SELECT count(*) FROM analysis_incident") == 0
    assert "Task analysis.tasks.attempt_classify[" not in ingest.log()

    analysis = stack.worker("analysis", env, queues="analysis")
    incident = wait_until(
        lambda: (
            analysis.assert_alive()
            or db.rows(
                "SELECT suspects FROM analysis_incident WHERE job_id = "
                "(SELECT id FROM fleet_job WHERE external_id = %s)",
                scenario.job,
            )
        ),
        60,
        "the analysis worker to classify the incident",
    )
    suspects = incident[0][0]
    assert [s["id"] for s in suspects if s["kind"] == "rank"] == ["0"]
    assert "Task ingest.tasks.upload_parse[" not in analysis.log()
    assert "Task analysis.tasks.attempt_classify[" in analysis.log()


def test_every_task_has_a_queue_and_every_queue_a_worker_in_compose_and_make():
    import re

    import yaml

    from fleet.celery import app
    from fleet.settings import BASE_DIR

    app.loader.import_default_modules()
    declared = {queue.name for queue in app.conf.task_queues}
    tasks = sorted(name for name in app.tasks if not name.startswith("celery."))
    assert "ingest.tasks.upload_parse" in tasks
    routed = {name: app.amqp.router.route({}, name)["queue"].name for name in tasks}
    assert routed["ingest.tasks.upload_parse"] == "ingest"
    assert routed["analysis.tasks.attempt_classify"] == "analysis"
    assert set(routed.values()) <= declared, routed
    # A message routed to one queue reaches that queue only: no two share a binding.
    bindings = [(q.exchange.name, q.routing_key) for q in app.conf.task_queues]
    assert len(set(bindings)) == len(bindings), bindings

    compose = yaml.safe_load((BASE_DIR / "docker-compose.yml").read_text())
    consumed = set()
    for service in compose["services"].values():
        command = service.get("command") or []
        if isinstance(command, list) and "worker" in command:
            consumed |= set(command[command.index("-Q") + 1].split(","))
    assert consumed == declared
    make_queues = re.search(r"^QUEUES \?= (\S+)$", (BASE_DIR / "Makefile").read_text(), re.M)
    assert set(make_queues.group(1).split(",")) == declared
