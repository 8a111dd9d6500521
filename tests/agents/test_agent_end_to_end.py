"""The agent beside real gloo jobs, uploading to a live test server, incidents classified."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from agents.agent import Agent
from agents.config import load_config

JOB = Path(__file__).with_name("job.py")
REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.slow


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_job(tmp_path: Path, job: str, world: int, **env) -> list[subprocess.Popen]:
    procs = []
    port = str(free_port())
    for rank in range(world):
        log = open(tmp_path / "logs" / f"rank{rank}.log", "wb")  # noqa: SIM115
        procs.append(
            subprocess.Popen(
                [sys.executable, str(JOB), str(rank), str(world)],
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=REPO,
                env={
                    "PATH": os.environ.get("PATH", ""),
                    "PYTHONPATH": str(REPO),
                    "FLEETWATCH_SPOOL_DIR": str(tmp_path / "spool"),
                    "FLEETWATCH_RUN_DIR": str(tmp_path / "run"),
                    "FLEETWATCH_JOB": job,
                    "FLEETWATCH_HOST": "gpu-e2e",
                    "JOB_PORT": port,
                    **env,
                },
            )
        )
    return procs


class AgentThread:
    def __init__(self, config):
        self.agent = Agent(config)
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.agent.run, args=(self.stop,), daemon=True)

    def __enter__(self):
        self.thread.start()
        return self.agent

    def __exit__(self, *exc):
        self.stop.set()
        self.thread.join(timeout=10)


def agent_config(tmp_path: Path, server: str, key: str, **more):
    (tmp_path / "logs").mkdir(exist_ok=True)
    return load_config(
        environ={},
        server=server,
        key=key,
        host="gpu-e2e",
        spool_dir=str(tmp_path / "spool"),
        run_dir=str(tmp_path / "run"),
        logs=(str(tmp_path / "logs" / "*.log"),),
        kernel_logs=(),
        poll_s=0.2,
        log_flush_s=0.3,
        stats_interval_s=2.0,
        backoff_base_s=0.2,
        backoff_max_s=1.0,
        **more,
    )


def wait_for(predicate, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def incident_of(job: str):
    from analysis.models import Incident

    return Incident.objects.filter(job__external_id=job).first()


def test_an_unseeded_split_is_flagged_at_step_zero_before_the_job_hangs(
    live_server, transactional_db, make_key, tmp_path
):
    config = agent_config(tmp_path, live_server.url, make_key("upload"))
    go = tmp_path / "go"
    with AgentThread(config) as agent:
        procs = start_job(
            tmp_path, "e2e-unseeded", 2, JOB_MODE="unseeded", JOB_GO=str(go), JOB_TIMEOUT_S="3"
        )
        try:
            incident = wait_for(lambda: incident_of("e2e-unseeded"), 120, "the data order incident")
            # Flagged while every rank still waits before its first step.
            assert not go.exists()
            beats = [b for b in agent.heartbeats if b["job"] == "e2e-unseeded"]
            assert beats and all(b["steps"] == 0 for b in beats)
            assert incident.culprit == "rank_desync_code"
            assert "data_order_mismatch" in incident.rule_ids
            assert "steps per epoch" in incident.summary
            assert {s["id"] for s in incident.suspects if s["kind"] == "rank"}
            go.touch()
            for proc in procs:
                proc.wait(timeout=120)
        finally:
            for proc in procs:
                proc.kill()
        # The rank with more steps hung in all_reduce until gloo's timeout; the integration
        # dumped its Flight Recorder (PyTorch does not for gloo) and the agent uploaded it.
        from ingest.models import Upload

        wait_for(
            lambda: Upload.objects.filter(job__external_id="e2e-unseeded", kind="fr_dump").exists(),
            60,
            "the Flight Recorder dump upload",
        )
        assert agent.flush(timeout_s=60)
    kinds = set(
        Upload.objects.filter(job__external_id="e2e-unseeded").values_list("kind", flat=True)
    )
    assert {"log", "hw_stats", "fr_dump"} <= kinds
    incident = incident_of("e2e-unseeded")
    assert incident.culprit == "rank_desync_code"
    from fleet.models import Attempt

    attempt = Attempt.objects.get(job__external_id="e2e-unseeded", number=0)
    assert attempt.world_size == 2
    assert attempt.status == "failed"


def test_a_stalled_rank_gets_an_on_demand_flight_recorder_dump_through_its_pipe(
    live_server, transactional_db, make_key, tmp_path
):
    config = agent_config(
        tmp_path, live_server.url, make_key("upload"), stall_factor=5.0, stall_min_s=0.5
    )
    with AgentThread(config) as agent:
        procs = start_job(
            tmp_path, "e2e-stall", 2, JOB_MODE="stall", JOB_STALL_S="4", JOB_TIMEOUT_S="20"
        )
        try:
            for proc in procs:
                proc.wait(timeout=120)
        finally:
            for proc in procs:
                proc.kill()
        assert all(p.returncode == 0 for p in procs)
        assert agent.flush(timeout_s=60)
    from ingest.models import Event, Upload

    dumps = Upload.objects.filter(job__external_id="e2e-stall", kind="fr_dump")
    # Both ranks dumped on request, while the job was still alive (it then finished cleanly).
    assert set(dumps.values_list("rank", flat=True)) == {0, 1}
    stalls = Event.objects.filter(upload__job__external_id="e2e-stall", kind="progress_stall")
    assert stalls.exists()
    assert "made no step" in stalls.first().text
