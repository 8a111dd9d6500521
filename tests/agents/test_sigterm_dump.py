"""A rank stopped by its launcher (torchrun's SIGTERM to the surviving workers of a failed
attempt, Slurm's scancel) leaves its Flight Recorder behind, and still dies of the signal."""

import os
import select
import signal
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")

JOB = """
import datetime, os, sys, time
import torch, torch.distributed as dist
from agents import torch as fleetwatch_torch
fleetwatch_torch.install(heartbeat_every_s=0.2)
dist.init_process_group("gloo", init_method="tcp://127.0.0.1:" + os.environ["JOB_PORT"],
                        rank=0, world_size=1, timeout=datetime.timedelta(seconds=30))
dist.all_reduce(torch.ones(3))
loader = iter(torch.utils.data.DataLoader(torch.arange(64.0), batch_size=2, num_workers=1))
next(loader)  # a live worker process, in the launcher's process group like the rank
print("ready", flush=True)
time.sleep(120)  # where a rank the others wait for would be: somewhere else
"""


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_sigterm_dumps_the_flight_recorder_then_lets_the_signal_end_the_rank(tmp_path):
    env = {
        **os.environ,
        "PYTHONPATH": str(Path(__file__).resolve().parents[2]),
        "RANK": "0",
        "WORLD_SIZE": "1",
        "LOCAL_RANK": "0",
        "JOB_PORT": str(free_port()),
        "FLEETWATCH_SPOOL_DIR": str(tmp_path / "spool"),
        "FLEETWATCH_RUN_DIR": str(tmp_path / "run"),
        "FLEETWATCH_JOB": "sigterm-1",
    }
    stderr = tmp_path / "stderr.log"
    proc = subprocess.Popen(
        [sys.executable, "-c", JOB],
        env=env,
        stdout=subprocess.PIPE,
        stderr=stderr.open("wb"),
        start_new_session=True,
    )
    try:
        # A deadline, not a fixed wait: the job says "ready" when its collective is done.
        ready, _, _ = select.select([proc.stdout], [], [], 300)
        assert ready and proc.stdout.readline().strip() == b"ready", stderr.read_text()[-2000:]
        # As torchrun and Slurm do: the whole process group, the DataLoader's worker included.
        os.killpg(proc.pid, signal.SIGTERM)
        assert proc.wait(timeout=120) == -signal.SIGTERM
        # The worker's death during teardown is no "DataLoader worker ... killed" failure.
        assert "DataLoader worker" not in stderr.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    dumps = list((tmp_path / "run" / "fr").glob("*0"))
    assert dumps, sorted(p.name for p in (tmp_path / "run").rglob("*"))

    from ingest.parsers import parse_files

    (result,) = parse_files(dumps, jobs=1)
    assert any("all_reduce" in e.text or "allreduce" in e.text.lower() for e in result.events), [
        e.kind for e in result.events
    ]
