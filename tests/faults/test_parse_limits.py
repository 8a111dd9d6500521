"""A parse that cannot end, through a real prefork worker: past its time limit it is failed with
the reason, whether Python can interrupt it (a huge log: the soft limit) or not (a pickle whose
dict key is a tuple of shared tuples, which the unpickler hashes for hours in C: the hard limit
kills the pool child); and the worker goes on to parse the next upload."""

from __future__ import annotations

import gzip
import os
import signal
import struct

import psutil
import pytest

from fleet.demo import JobScenario, rank_log

from .stack import wait_until
from .test_worker_killed import large_log

pytestmark = pytest.mark.slow


def hash_bomb(depth: int = 48) -> bytes:
    """A dump of 400 bytes whose pg_config key is a tuple of two copies of a tuple of two
    copies of … ``depth`` deep: building it hashes 2**depth tuples. Written opcode by opcode,
    since building the key in this process would hash it here."""

    def text(value: str) -> bytes:  # BINUNICODE
        return b"X" + struct.pack("<I", len(value)) + value.encode()

    # (1,), memoised; then, again and again, pop it, push it twice, pair the two, memoise that.
    key = b"K\x01\x85q\x01" + b"0h\x01h\x01\x86q\x01" * depth
    return (
        b"\x80\x02}"  # the dump
        + text("version") + text("2.10") + b"s"
        + text("entries") + b"]s"
        + text("pg_config") + b"}" + key + b"K\x01ss."
    )  # fmt: skip


def status_and_error(db, upload_id):
    return db.rows("SELECT status, error FROM ingest_upload WHERE id = %s", upload_id)[0]


def test_parses_past_their_time_limit_are_failed_saying_why_and_the_worker_goes_on(stack):
    broker = stack.redis()
    env = stack.env(broker, FLEETWATCH_PARSE_TIME_LIMIT="2")
    web = stack.gunicorn(env, workers=1)
    worker = stack.worker("parser", env, pool="prefork")
    worker.wait_ready()
    db = stack.database

    def send(body: bytes, filename: str, rank: int) -> int:
        return web.accepted(
            stack.key, body, filename=filename, host="gpu-t1", job="job-limits", rank=rank
        )

    bomb = send(hash_bomb(), "fr_rank0.pkl", 0)
    huge = send(gzip.compress(large_log() * 2, 1), "rank1.log", 1)  # parses for ~6 s here
    scenario = JobScenario("job-limits", ["gpu-t1"], world=2, lagging=1, seq=5)
    fine = send(rank_log(scenario, 0).encode(), "rank0.log", 0)

    def settled(upload_id):
        worker.assert_alive()
        return status_and_error(db, upload_id)[0] in ("parsed", "failed")

    for upload_id in (bomb, huge, fine):
        wait_until(lambda u=upload_id: settled(u), 90, f"upload {upload_id} to settle", every=0.2)

    status, error = status_and_error(db, bomb)
    assert status == "failed" and "stopped after 7 s" in error, (error, worker.tail())
    status, error = status_and_error(db, huge)
    assert status == "failed" and "ran past its 2 s limit" in error, (error, worker.tail())
    assert status_and_error(db, fine) == ("parsed", "")
    assert "Hard time limit (7" in worker.log()


def test_an_upload_whose_parse_keeps_killing_its_worker_is_failed_after_three_runs(stack):
    # As the kernel's OOM killer would: the pool child dies mid-parse, the message comes back
    # (reject_on_worker_lost), and the next child starts the parse again — three times at most.
    broker = stack.redis()
    env = stack.env(broker)
    web = stack.gunicorn(env, workers=1)
    worker = stack.worker("victim", env, pool="prefork")
    worker.wait_ready()
    db = stack.database
    upload_id = web.accepted(
        stack.key,
        gzip.compress(large_log(), 1),
        filename="rank0.log",
        host="gpu-t2",
        job="job-oom",
        rank=0,
    )

    def state():
        worker.assert_alive()
        return db.rows(
            "SELECT status, parse_tries, error FROM ingest_upload WHERE id = %s", upload_id
        )[0]

    for run in (1, 2, 3):
        wait_until(lambda r=run: state()[:2] == ("parsing", r), 60, f"parse run {run}", every=0.02)
        [child] = psutil.Process(worker.pid).children()
        os.kill(child.pid, signal.SIGKILL)
    wait_until(lambda: state()[0] == "failed", 60, "the upload to be failed", every=0.1)
    _, tries, error = state()
    assert tries == 3 and "3 runs each ended with their worker killed" in error
