"""PostgreSQL stopped and started again in the middle of a burst of agent uploads.

While the database is down the API answers 503 with ``Retry-After`` and a JSON ``detail``; the
real agent uploader keeps each file in its spool and comes back; persistent connections are
checked and replaced after the restart. Every upload ends stored exactly once, and parsed."""

from __future__ import annotations

import hashlib
import logging
import threading
import time

import pytest

from agents.config import AgentConfig
from agents.spool import Spool
from agents.uploader import Uploader
from fleet.demo import JobScenario, rank_log

from .stack import json_of, wait_until

pytestmark = pytest.mark.slow

HOSTS = 4
PER_HOST_PER_BATCH = 2
BATCHES = 4  # before the stop, at the stop, while down, after the restart


class Deferrals(logging.Handler):
    """What the agents said when they put an upload off (``upload deferred … after HTTP 503``)."""

    def __init__(self):
        super().__init__(logging.INFO)
        self.messages: list[str] = []

    def emit(self, record):
        self.messages.append(record.getMessage())

    def count(self, status: int) -> int:
        return sum(f"after HTTP {status}" in m for m in self.messages)


class Agent(threading.Thread):
    """One host's spool and uploader, draining until told the burst is over."""

    def __init__(self, server: str, key: str, host: str, root):
        super().__init__(name=f"agent-{host}", daemon=True)
        self.spool = Spool(root / host)
        config = AgentConfig(
            server=server,
            key=key,
            host=host,
            spool_dir=str(root / host),
            backoff_base_s=0.2,
            backoff_max_s=2.0,
            request_timeout_s=60.0,
        )
        self.uploader = Uploader(config, self.spool)
        self.finish = threading.Event()
        self.abort = threading.Event()  # the test failed: stop even with items left
        self.error: BaseException | None = None

    def run(self):
        try:
            while not self.abort.is_set() and not (self.finish.is_set() and not self.spool.names()):
                if self.spool.names() and self.uploader.ready():
                    self.uploader.drain(budget_s=1.0)
                else:
                    time.sleep(0.02)
        except BaseException as exc:  # reported by the test, not lost in a thread
            self.error = exc


def test_a_database_restart_mid_burst_answers_503_and_loses_nothing(stack, tmp_path):
    broker = stack.redis()
    env = stack.env(broker, FLEETWATCH_RETRY_AFTER_SECONDS="1")
    web = stack.gunicorn(env)
    worker = stack.worker("both", env)
    worker.wait_ready()
    cluster, db = stack.database.cluster, stack.database

    deferrals = Deferrals()
    agent_log = logging.getLogger("fleetwatch.agent")
    agent_log.addHandler(deferrals)
    previous_level = agent_log.level
    agent_log.setLevel(logging.INFO)
    agents = [Agent(web.url, stack.key, f"gpu-p{h}", tmp_path / "spools") for h in range(HOSTS)]
    scenario = JobScenario(
        "job-restart", ["gpu-p0"], world=HOSTS * PER_HOST_PER_BATCH * BATCHES, lagging=0, seq=5
    )
    bodies: list[bytes] = []

    def spool_batch(batch: int) -> None:
        for h, agent in enumerate(agents):
            for j in range(PER_HOST_PER_BATCH):
                rank = (batch * HOSTS + h) * PER_HOST_PER_BATCH + j
                body = rank_log(scenario, rank).encode()
                bodies.append(body)
                header = {"job": scenario.job, "attempt": 0, "rank": rank}
                agent.spool.put({**header, "filename": f"rank{rank}.log", "kind": "log"}, body)

    def stored() -> int:
        return db.value("SELECT count(*) FROM ingest_upload")

    try:
        for agent in agents:
            agent.start()
        spool_batch(0)
        wait_until(lambda: stored() == len(bodies), 60, "the first batch to be stored")

        spool_batch(1)  # being sent while the database goes down
        cluster.stop("fast")
        spool_batch(2)  # sent while it is down
        wait_until(lambda: deferrals.count(503), 60, "an agent to be told 503")
        response = web.upload(
            stack.key, b"step 1 loss 2.0\n", filename="probe.log", host="gpu-probe", job="probe"
        )
        assert response.status == 503, json_of(response)
        assert response.headers["Retry-After"] == "1"
        assert "database is unavailable" in json_of(response)["detail"]

        cluster.start()
        spool_batch(3)
        for agent in agents:
            agent.finish.set()
        for agent in agents:
            agent.join(timeout=120)
            assert not agent.is_alive(), f"{agent.name} still has {agent.spool.names()}"
            assert agent.error is None, agent.error
            assert agent.uploader.stats.rejected == 0
        # Told to come back, every time: never a 500 ("this request is broken").
        assert not [m for m in deferrals.messages if "after HTTP 5" in m and "503" not in m]
    finally:
        for agent in agents:
            agent.abort.set()
        agent_log.removeHandler(deferrals)
        agent_log.setLevel(previous_level)
        if not cluster.running():
            cluster.start()

    # Stored exactly once: every body is there, and nothing else is (the probe was refused).
    assert stored() == len(bodies) == HOSTS * PER_HOST_PER_BATCH * BATCHES
    shas = {sha for (sha,) in db.rows("SELECT sha256 FROM ingest_upload")}
    assert shas == {hashlib.sha256(body).hexdigest() for body in bodies}
    assert not db.rows("SELECT 1 FROM fleet_host WHERE hostname = 'gpu-probe'")

    # And the workers, which lost the database too, parsed every one of them and classified.
    wait_until(
        lambda: (
            worker.assert_alive()
            or (
                db.value("SELECT count(*) FROM ingest_upload WHERE status = 'parsed'")
                == len(bodies)
                and db.value("SELECT count(*) FROM analysis_incident") == 1
            )
        ),
        120,
        "every upload to be parsed and the incident classified",
        every=0.2,
    )
    assert not db.rows(
        "SELECT upload_id, line, kind FROM ingest_event GROUP BY upload_id, line, kind "
        "HAVING count(*) > 1"
    )
