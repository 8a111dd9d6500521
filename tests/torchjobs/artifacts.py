"""Run every injected-fault job once per test session and hand out its artifact directory."""

from __future__ import annotations

import functools
import os
import signal
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
JOB_TIMEOUT_S = 150


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@functools.cache
def job_artifacts() -> dict[str, Path]:
    """scenario -> directory of its dumps and traces; a job that fails leaves its stderr in
    <scenario>.log beside the directories."""
    from .jobs import SCENARIOS

    root = Path(tempfile.mkdtemp(prefix="fleetwatch-torchjobs-"))
    env = dict(os.environ, TORCH_FR_BUFFER_SIZE="2000", PYTHONPATH=str(REPO))
    # Two jobs at a time: six rank processes on two cores keep healthy collectives well inside
    # the timeout; twelve made them time out by themselves under load.
    result = {}
    pending = list(SCENARIOS)
    while pending:
        batch, pending = pending[:2], pending[2:]
        running = []
        for scenario in batch:
            out = root / scenario
            out.mkdir()
            log = (root / f"{scenario}.log").open("wb")
            proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "tests.torchjobs.jobs",
                    scenario,
                    str(out),
                    str(_free_port()),
                ],
                cwd=REPO,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # so a hung job's ranks can be stopped together
            )
            running.append((scenario, proc, log))
        for scenario, proc, log in running:
            try:
                proc.wait(timeout=JOB_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            log.close()
            result[scenario] = root / scenario
    return result
