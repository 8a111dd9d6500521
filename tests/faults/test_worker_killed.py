"""A worker killed mid-parse or mid-classify: the work comes back without the broker's visibility
timeout (a pool child's message at once, acks_late; a whole worker's through the sweep once the
dead run's lease lapses), the next run takes the claim over, and the upload ends parsed with
exactly one set of events, the attempt classified.

The log is genuinely large — half a million NCCL_DEBUG=INFO channel lines before the timeout, as
a long job with NCCL_DEBUG=INFO leaves — so that the parse takes long enough to be killed."""

from __future__ import annotations

import gzip
import os
import signal

import psutil
import pytest

from fleet.demo import JobScenario, rank_log

from .stack import wait_until

pytestmark = pytest.mark.slow

# Short leases and a sweep every second, so that the test waits seconds, not the production
# 30 s lease and 60 s sweep; the broker's visibility timeout stays at its production 30 minutes.
LEASES = {
    "FLEETWATCH_PARSE_LEASE_SECONDS": "2",
    "FLEETWATCH_CLASSIFY_LEASE_SECONDS": "2",
    "FLEETWATCH_SWEEP_SECONDS": "1",
    "FLEETWATCH_SWEEP_GRACE_SECONDS": "1",
}


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
    env = stack.env(broker, **LEASES)
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
        # unacknowledged for the visibility timeout (30 minutes); the claim stops being renewed,
        # and the sweep of another worker hands the upload on once its lease lapsed.
        first.kill_group()
        assert upload_status(db, upload_id) == "parsing", "the parse ended before the kill"
        survivor = stack.worker("second", env, pool="prefork", beat=True)

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


def timeouts_log(rank: int, collectives: int = 60_000) -> bytes:
    """A rank that printed a watchdog timeout for each of 60,000 collectives (a wrapper that
    reprints them): 60,000 events to classify, long enough to kill the worker in the middle."""
    return "".join(
        f"[rank{rank}]:[E1126 04:10:21.000000000 ProcessGroupNCCL.cpp:632] [Rank {rank}] "
        f"Watchdog caught collective operation timeout: WorkNCCL(SeqNum={seq}, OpType=ALLREDUCE, "
        "NumelIn=1, NumelOut=1, Timeout(ms)=600000) ran for 600040 milliseconds before timing "
        "out.\n"
        for seq in range(collectives)
    ).encode()


def test_a_classification_killed_with_its_worker_is_taken_over_once_its_lease_lapses(stack):
    broker = stack.redis()
    env = stack.env(broker, **LEASES)
    web = stack.gunicorn(env, workers=1)
    first = stack.worker("first", env, pool="prefork")
    first.wait_ready()
    db = stack.database
    uploads = [
        web.accepted(
            stack.key,
            gzip.compress(timeouts_log(rank), 6),
            filename=f"rank{rank}.log.gz",
            host="gpu-c1",
            job="job-classify-killed",
            rank=rank,
        )
        for rank in (0, 1)
    ]
    attempt = db.value("SELECT attempt_id FROM ingest_upload WHERE id = %s", uploads[0])

    def incidents() -> int:
        return db.value("SELECT count(*) FROM analysis_incident WHERE attempt_id = %s", attempt)

    wait_until(
        lambda: (
            first.assert_alive()
            or db.value(
                "SELECT classify_claimed_at IS NOT NULL FROM fleet_attempt WHERE id = %s", attempt
            )
        ),
        180,
        "the worker to claim the attempt's classification",
        every=0.02,
    )
    # Worker and pool child at once: the classify message stays unacknowledged in Redis for the
    # visibility timeout (30 minutes); the claim's lease lapses, and another worker's sweep
    # hands the attempt on.
    first.kill_group()
    assert incidents() == 0, "the classification ended before the kill"
    survivor = stack.worker("second", env, pool="prefork", beat=True)

    def released() -> bool:
        # The incident is stored first, then the claim released (attempt_classify_done): the
        # end state is both, in that order.
        claim, classified = db.rows(
            "SELECT classify_claimed_at, classified_at FROM fleet_attempt WHERE id = %s", attempt
        )[0]
        return claim is None and classified is not None

    wait_until(
        lambda: survivor.assert_alive() or (incidents() == 1 and released()),
        180,
        "the attempt to be classified by the second worker and its claim released",
        every=0.2,
    )
    assert incidents() == 1
