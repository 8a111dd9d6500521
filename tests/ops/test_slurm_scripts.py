"""The shipped Slurm prolog and epilog, run as slurmd runs them: no PATH, the job's SLURM_*
variables only. The attempt must reach the server (slurm.conf: the prolog's environment has no
PATH; a bare command name there silently recorded nothing)."""

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.django_db(transaction=True)

DEPLOY = Path(__file__).resolve().parents[2] / "agents" / "deploy"
AGENT = Path(sys.executable).with_name("fleetwatch-agent")


def run_script(name: str, tmp_path: Path, server: str, key: str, **slurm) -> None:
    (tmp_path / "key").write_text(key)
    config = tmp_path / "agent.toml"
    config.write_text(
        "[agent]\n"
        f'server = "{server}"\nkey_file = "{tmp_path / "key"}"\nhost = "node-07"\n'
        f'spool_dir = "{tmp_path / "spool"}"\nrun_dir = "{tmp_path / "run"}"\n'
        "kernel_logs = []\n"
    )
    env = {"FLEETWATCH_AGENT": str(AGENT), "FLEETWATCH_AGENT_CONFIG": str(config), **slurm}
    done = subprocess.run(
        ["/bin/sh", str(DEPLOY / name)], env=env, capture_output=True, timeout=120
    )
    assert done.returncode == 0, done.stderr  # never fails the job


@pytest.mark.skipif(not AGENT.exists(), reason="fleetwatch-agent is not installed beside python")
def test_prolog_and_epilog_record_the_attempt_with_no_path(live_server, make_key, tmp_path):
    from fleet.models import Attempt

    key = make_key("upload")
    run_script("slurm-prolog.sh", tmp_path, live_server.url, key, SLURM_JOB_ID="4242")
    attempt = Attempt.objects.get(job__external_id="slurm:4242")
    assert attempt.status == Attempt.Status.RUNNING
    run_script(
        "slurm-epilog.sh",
        tmp_path,
        live_server.url,
        key,
        SLURM_JOB_ID="4242",
        SLURM_JOB_EXIT_CODE="0:0",
    )
    attempt.refresh_from_db()
    assert attempt.status == Attempt.Status.SUCCEEDED and attempt.ended_at is not None


def test_a_missing_agent_never_fails_the_job(tmp_path):
    env = {"FLEETWATCH_AGENT": str(tmp_path / "nowhere"), "SLURM_JOB_ID": "1"}
    for name in ("slurm-prolog.sh", "slurm-epilog.sh"):
        done = subprocess.run(["/bin/sh", str(DEPLOY / name)], env=env, timeout=60)
        assert done.returncode == 0


def test_a_hung_agent_holds_the_job_no_longer_than_the_bound(tmp_path):
    # An agent stuck on a dead server (or DNS): slurmd waits for the prolog, so it is bounded.
    hung = tmp_path / "fleetwatch-agent"
    hung.write_text("#!/bin/sh\nexec sleep 600\n")
    hung.chmod(0o755)
    env = {"FLEETWATCH_AGENT": str(hung), "FLEETWATCH_REPORT_TIMEOUT": "1", "SLURM_JOB_ID": "1"}
    for name in ("slurm-prolog.sh", "slurm-epilog.sh"):
        # The subprocess deadline is far beyond the bound; reaching it would mean no bound.
        done = subprocess.run(["/bin/sh", str(DEPLOY / name)], env=env, timeout=300)
        assert done.returncode == 0
