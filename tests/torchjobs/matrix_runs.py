"""Run every job of the fault matrix once per test session (two at a time) and hand out where
each left its artifacts: ``tests/torchjobs/matrix/`` holds the jobs, written blind to the rules."""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
MATRIX = REPO / "tests" / "torchjobs" / "matrix"
# run.py kills a job at its own 90 s deadline; this only guards against run.py itself hanging.
RUN_TIMEOUT_S = 180


def expected() -> dict[str, dict]:
    return json.loads((MATRIX / "expected.json").read_text())


@functools.cache
def matrix_runs() -> dict[str, Path]:
    """fault -> the job's directory (named neutrally: its path appears in the artifacts)."""
    root = Path(tempfile.mkdtemp(prefix="fleetwatch-matrix-"))
    env = dict(os.environ, PYTHONPATH=str(REPO))
    faults = list(expected())
    out: dict[str, Path] = {}
    # Two jobs at a time: eight rank processes on two cores keep healthy collectives well
    # inside the jobs' 6 s timeout (the matrix README).
    for start in range(0, len(faults), 2):
        running = []
        for i, fault in enumerate(faults[start : start + 2], start=start + 1):
            outdir = root / f"job-{i}"
            log = (root / f"job-{i}.out").open("wb")
            running.append(
                (
                    fault,
                    outdir,
                    log,
                    subprocess.Popen(
                        [sys.executable, "-m", "tests.torchjobs.matrix.run", fault, str(outdir)],
                        cwd=REPO,
                        env=env,
                        stdout=log,
                        stderr=subprocess.STDOUT,
                    ),
                )
            )
        for fault, outdir, log, proc in running:
            proc.wait(timeout=RUN_TIMEOUT_S)
            log.close()
            out[fault] = outdir
    return out


def artifact_files(outdir: Path) -> list[Path]:
    """What a user points `fleetwatch diagnose` at: every rank's log, the launchers' consoles,
    the Flight Recorder dumps and torchelastic's error files (not the harness's own records)."""
    return sorted(
        p
        for p in outdir.rglob("*")
        if p.is_file() and (p.suffix == ".log" or "/fr/" in p.as_posix() or p.name == "error.json")
    )


def job_id(outdir: Path) -> str:
    """The job as the torch integration names it: torchelastic's run id."""
    return "elastic:" + json.loads((outdir / "harness.json").read_text())["job_id"]


def host_agent(outdir: Path, host: str, server: str, key: str):
    """The fleetwatch-agent of one simulated host of a matrix job, run after the job ended over
    what it left there: its logs, the integration's spool and run directory (Flight Recorder
    dumps, heartbeats)."""
    root = outdir / host
    return agent_over(
        root,
        host,
        server,
        key,
        logs=(str(root / "rank*.log"), str(root / "torchrun.log")),
        job=job_id(outdir),  # files that name no job belong to the job that ran here
    )


def agent_over(root: Path, host: str, server: str, key: str, *, logs, job: str = ""):
    """An agent over one host's Fleetwatch root (``root/fleetwatch``: spool, run directory),
    following ``logs``; with no ``job``, files are attributed by the jobs' heartbeats."""
    from agents.agent import Agent
    from agents.config import load_config

    return Agent(
        load_config(
            environ={},
            server=server,
            key=key,
            host=host,
            job=job,
            attempt=0,
            spool_dir=str(root / "fleetwatch" / "spool"),
            run_dir=str(root / "fleetwatch" / "run"),
            logs=tuple(logs),
            kernel_logs=(),
            ib_sysfs=str(root / "no-infiniband"),
            poll_s=0.2,
            log_flush_s=0.2,
            stats_interval_s=3600.0,
            backoff_base_s=0.2,
            backoff_max_s=1.0,
        )
    )
