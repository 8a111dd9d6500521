"""Redis down: uploads are still accepted, and parsed and classified once it is back.

No upload may depend on the broker being up at the instant it arrives. The row committed by the
upload is the record; the publish that fails after it is logged and dropped, and the sweeper
(beat, and every worker start) re-enqueues what never got a message."""

from __future__ import annotations

import gzip
import socket

import pytest

from fleet.demo import JobScenario

from .stack import json_of, wait_until

pytestmark = pytest.mark.slow


def test_uploads_during_a_broker_outage_are_accepted_then_parsed_once_and_classified(stack):
    broker = stack.redis()
    env = stack.env(
        broker,
        FLEETWATCH_SWEEP_SECONDS="1",
        FLEETWATCH_SWEEP_GRACE_SECONDS="1",
    )
    web = stack.gunicorn(env)
    worker = stack.worker("both", env, beat=True)
    worker.wait_ready()

    broker.stop()  # every queued message is gone with it (no persistence)
    scenario = JobScenario("job-outage", ["gpu-o1", "gpu-o2"], world=4, lagging=0, seq=912)
    ids = web.accepted_logs(stack.key, scenario, range(4))
    db = stack.database
    assert db.rows("SELECT DISTINCT status FROM ingest_upload") == [("received",)]
    assert "could not enqueue ingest.tasks.upload_parse" in web.log()

    broker.start()  # the same port, empty
    wait_until(
        lambda: worker.assert_alive() or db.value("SELECT count(*) FROM analysis_incident") == 1,
        90,
        "the uploads to be parsed and the incident classified after the broker came back",
        every=0.2,
    )
    assert db.rows("SELECT id, status FROM ingest_upload ORDER BY id") == [
        (i, "parsed") for i in sorted(ids)
    ]
    # Parsed exactly once: each upload's events are one set, none doubled by a second run.
    counted = db.rows(
        "SELECT u.id, u.event_count, count(e.id) FROM ingest_upload u "
        "LEFT JOIN ingest_event e ON e.upload_id = u.id GROUP BY u.id, u.event_count"
    )
    assert all(events > 0 and events == expected for _, expected, events in counted), counted
    assert not db.rows(
        "SELECT upload_id, line, kind FROM ingest_event GROUP BY upload_id, line, kind "
        "HAVING count(*) > 1"
    )
    suspects = db.value("SELECT suspects FROM analysis_incident")
    assert [s["id"] for s in suspects if s["kind"] == "rank"] == ["0"]


def test_a_worker_starting_after_the_outage_picks_up_what_was_accepted_during_it(stack):
    # No beat here: the sweep a worker runs when it starts is what finds the uploads.
    broker = stack.redis()
    env = stack.env(broker, FLEETWATCH_SWEEP_GRACE_SECONDS="0")
    web = stack.gunicorn(env, workers=1)
    broker.stop()
    scenario = JobScenario("job-cold", ["gpu-c1"], world=2, lagging=1, seq=12)
    web.accepted_logs(stack.key, scenario, (0, 1))

    broker.start()
    worker = stack.worker("late", env)
    db = stack.database
    wait_until(
        lambda: worker.assert_alive() or db.value("SELECT count(*) FROM analysis_incident") == 1,
        90,
        "the starting worker to parse both uploads and classify the incident",
        every=0.2,
    )
    assert db.rows("SELECT DISTINCT status FROM ingest_upload") == [("parsed",)]
    assert "Task ingest.tasks.uploads_sweep[" in worker.log()


def test_a_broker_that_accepts_connections_but_never_answers_does_not_hang_an_upload(stack):
    # A black-holed Redis (a dead host behind a live proxy, a half-open connection): the kernel
    # completes the TCP handshake on this socket's backlog, and nothing ever replies.
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(64)
        url = f"redis://127.0.0.1:{silent.getsockname()[1]}"
        env = stack.env(CELERY_BROKER_URL=f"{url}/0", REDIS_URL=f"{url}/1")
        web = stack.gunicorn(env, workers=1)
        for rank in (0, 1):
            response = web.upload(
                stack.key,
                f"rank {rank} step 1 loss 2.0\n".encode(),
                filename=f"rank{rank}.log",
                host="gpu-silent",
                job="job-silent",
                rank=rank,
            )
            # Answered (the client would give up after 60 s), accepted, and kept for the sweep.
            assert response.status == 202, (json_of(response), web.tail())
    assert stack.database.rows("SELECT DISTINCT status FROM ingest_upload") == [("received",)]
    assert "could not enqueue ingest.tasks.upload_parse" in web.log()


def test_a_worker_holding_an_unacknowledged_message_survives_a_redis_kill(stack):
    """Redis dies while the worker parses (its message taken, not yet acknowledged): the worker
    loses the broker, keeps running, reconnects when Redis is back and goes on consuming."""
    from .test_worker_killed import LEASES, large_log

    broker = stack.redis()
    env = stack.env(broker, **LEASES)
    web = stack.gunicorn(env, workers=1)
    worker = stack.worker("holder", env, pool="prefork", beat=True)
    worker.wait_ready()
    db = stack.database
    held = web.accepted(
        stack.key,
        gzip.compress(large_log(), 6),
        filename="rank0.log.gz",
        host="gpu-k1",
        job="job-held",
        rank=0,
    )
    wait_until(
        lambda: (
            worker.assert_alive()
            or db.value("SELECT status FROM ingest_upload WHERE id = %s", held) == "parsing"
        ),
        60,
        "the worker to take the upload's message",
        every=0.02,
    )
    broker.process.kill_group()  # SIGKILL: the unacknowledged message dies with it
    broker.process = None
    wait_until(
        lambda: worker.assert_alive() or "Connection to broker lost" in worker.log(),
        60,
        "the worker to notice the broker is gone",
        every=0.2,
    )
    broker.start()  # the same port, empty
    scenario = JobScenario("job-after", ["gpu-a1"], world=2, lagging=1, seq=12)
    after = web.accepted_logs(stack.key, scenario, (0, 1))
    wait_until(
        lambda: (
            worker.assert_alive()
            or db.value(
                "SELECT count(*) FROM ingest_upload WHERE status = 'parsed' AND id = ANY(%s)",
                [held, *after],
            )
            == 3
        ),
        180,
        "the upload held during the outage and the ones after it to be parsed",
        every=0.2,
    )
    worker.assert_alive()
    assert "Unrecoverable error" not in worker.log()
