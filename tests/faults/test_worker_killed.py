"""A worker killed mid-parse: the message comes back (acks_late), the next run takes over the dead
run's claim, and the upload ends parsed with exactly one set of events.

The log is genuinely large — half a million NCCL_DEBUG=INFO channel lines before the timeout, as
a long job with NCCL_DEBUG=INFO leaves — so that the parse takes long enough to be killed."""

from __future__ import annotations

import gzip
import os
import signal
import time

import psutil
import pytest

from fleet.demo import JobScenario, rank_log

from .stack import wait_until

pytestmark = pytest.mark.slow

VISIBILITY_S = 2


def large_log() -> bytes:
    scenario = JobScenario("job-killed", ["gpu-k1"], world=2, lagging=1, seq=77)
    line = "gpu-k1:2231:2290 [0] NCCL INFO Channel {c:02d}/0 : 0[0] -> 1[1] via NET/IB/{n}/GDRDMA\n"
    block = "".join(line.format(c=c % 32, n=c % 4) for c in range(1000)).encode()
    return block * 800 + rank_log(scenario, 0).encode()  # 63 MB


def upload_status(db, upload_id):
    return db.value("SELECT status FROM ingest_upload WHERE id = %s", upload_id)


@pytest.mark.parametrize("victim", ["pool child", "whole worker"])
def test_a_parse_killed_with_its_worker_is_redelivered_and_stored_once(stack, victim):
    broker = stack.redis()
    env = stack.env(broker)
    web = stack.gunicorn(env, workers=1)
    first = stack.worker("first", env, pool="prefork")
    first.wait_ready()

    upload_id = web.accepted(
        stack.key,
        gzip.compress(large_log(), 6),
        filename="rank0.log.gz",
        host="gpu-k1",
        job="job-killed",
        rank=0,
    )
    db = stack.database
    wait_until(
        lambda: first.assert_alive() or upload_status(db, upload_id) == "parsing",
        60,
        "the worker to claim the upload",
        every=0.02,
    )

    if victim == "pool child":
        # The main process sees its child die and hands the message back at once
        # (reject_on_worker_lost); its next child gets it, marked redelivered.
        [child] = psutil.Process(first.pid).children()
        os.kill(child.pid, signal.SIGKILL)
        assert upload_status(db, upload_id) == "parsing", "the parse ended before the kill"
        survivor = first
    else:
        # Worker and pool child at once, as when a node dies. The message stays in Redis as
        # unacknowledged until the visibility timeout; a worker starting after that restores it.
        first.kill_group()
        assert upload_status(db, upload_id) == "parsing", "the parse ended before the kill"
        [(_, delivered_at)] = broker.client().zrange("unacked_index", 0, -1, withscores=True)
        wait_until(
            lambda: time.time() > delivered_at + VISIBILITY_S + 0.5,
            VISIBILITY_S + 10,
            "the unacknowledged message to outlive the visibility timeout",
        )
        survivor = stack.worker(
            "second",
            {**env, "FLEETWATCH_BROKER_VISIBILITY_TIMEOUT": str(VISIBILITY_S)},
            pool="prefork",
        )

    wait_until(
        lambda: survivor.assert_alive() or upload_status(db, upload_id) == "parsed",
        120,
        "the re-delivered parse to finish",
        every=0.2,
    )
    expected, events, distinct = db.rows(
        "SELECT u.event_count, count(e.id), count(DISTINCT (e.line, e.kind)) "
        "FROM ingest_upload u JOIN ingest_event e ON e.upload_id = u.id "
        "WHERE u.id = %s GROUP BY u.event_count",
        upload_id,
    )[0]
    assert expected == events == distinct > 0
    assert db.value("SELECT line_count FROM ingest_upload WHERE id = %s", upload_id) > 800_000
