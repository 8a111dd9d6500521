"""Run every job of the fault matrix (two at a time) and hand out where each left its
artifacts: ``tests/torchjobs/matrix/`` holds the jobs, written blind to the rules.

The jobs run once per checkout and code: their artifacts are kept under ``var/test-cache``
keyed by a hash of everything that runs in them (the jobs, the agent package with the torch
integration, the torch version), under a lock (two test processes at once share them), so
``make test``'s second pass reads the same real runs instead of running them again. Each test
process gets its own copy, with the runs' directory rewritten in the text files that name it
(logs, heartbeats): agents write their spools and state beside the artifacts, and the kept runs
stay as the jobs left them."""

from __future__ import annotations

import fcntl
import functools
import hashlib
import importlib.metadata
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
MATRIX = REPO / "tests" / "torchjobs" / "matrix"
CACHE = Path(os.environ.get("FLEETWATCH_TEST_CACHE", REPO / "var" / "test-cache"))
# run.py kills a job at its own 90 s deadline; this only guards against run.py itself hanging.
RUN_TIMEOUT_S = 180
# Text files whose lines may hold the runs' absolute directory (the spool's items are NDJSON).
TEXT_SUFFIXES = (".log", ".json", ".out", ".item")


def expected() -> dict[str, dict]:
    return json.loads((MATRIX / "expected.json").read_text())


def fingerprint() -> str:
    """Everything that runs inside a matrix job: the jobs and their harness, the agent package
    (the torch integration is part of it) and torch itself."""
    digest = hashlib.sha256(importlib.metadata.version("torch").encode())
    sources = [*sorted(MATRIX.rglob("*.py")), MATRIX / "expected.json"]
    sources += sorted((REPO / "agents").rglob("*.py"))
    for path in sources:
        digest.update(path.relative_to(REPO).as_posix().encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:16]


@functools.cache
def matrix_runs() -> dict[str, Path]:
    """fault -> the job's directory (named neutrally: its path appears in the artifacts), a copy
    of the kept runs for this process alone."""
    kept = CACHE / f"matrix-{fingerprint()}"
    if not (kept / "runs.json").exists():
        # Two test processes at once (the two passes of `make test` run by hand together): the
        # first to get here runs the jobs (two at a time, as they were written to run), the
        # other waits and reads them.
        CACHE.mkdir(parents=True, exist_ok=True)
        with (CACHE / "matrix.lock").open("w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not (kept / "runs.json").exists():
                _keep(kept)
    runs = json.loads((kept / "runs.json").read_text())
    root = Path(tempfile.mkdtemp(prefix="fleetwatch-matrix-"))
    shutil.copytree(kept, root, dirs_exist_ok=True)
    old, new = runs["ran_in"].encode(), str(root).encode()
    for path in root.rglob("*"):
        if path.is_file() and path.suffix in TEXT_SUFFIXES:
            data = path.read_bytes()
            if old in data:
                path.write_bytes(data.replace(old, new))
    return {fault: root / name for fault, name in runs["jobs"].items()}


def _keep(kept: Path) -> None:
    """Run the jobs into a directory beside ``kept`` and move it there whole, so that a run cut
    short is never taken for a kept one. ``runs.json`` says where the jobs ran: that path is the
    one their artifacts name, and each copy rewrites it."""
    kept.parent.mkdir(parents=True, exist_ok=True)
    work = kept.with_name(f"{kept.name}.{os.getpid()}")
    shutil.rmtree(work, ignore_errors=True)
    jobs = _run_all(work)
    (work / "runs.json").write_text(json.dumps({"ran_in": str(work), "jobs": jobs}))
    try:
        work.rename(kept)
    except OSError:  # another process kept the same runs first
        shutil.rmtree(work, ignore_errors=True)
    # Runs kept for code that changed since are never read again: a few MB each, gone.
    for old in kept.parent.glob("matrix-*"):
        if old.name != kept.name and "." not in old.name:
            shutil.rmtree(old, ignore_errors=True)


def _run_all(root: Path) -> dict[str, str]:
    """Every fault's job, two at a time, under ``root``: fault -> its directory's name."""
    root.mkdir(parents=True)
    env = dict(os.environ, PYTHONPATH=str(REPO))
    faults = list(expected())
    out: dict[str, str] = {}
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
            out[fault] = outdir.name
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
