"""Two real jobs at once on the same two hosts, sharing each host's Fleetwatch root (spool, run
directory, Flight Recorder dumps, heartbeats) and log directory, with one agent per host and no
job configured: every upload goes to the job that wrote it, the spools drain to empty, the
healthy job gets no incident and the faulty one its verdict."""

import functools
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

pytest.importorskip("torch")

from tests.torchjobs.matrix_runs import REPO, RUN_TIMEOUT_S, agent_over, expected, job_id

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

HOSTS = ("host-a", "host-b")
FAULTS = ("healthy", "collective_mismatch")


@functools.cache
def concurrent_runs() -> tuple[Path, dict[str, Path]]:
    root = Path(tempfile.mkdtemp(prefix="fleetwatch-concurrent-"))
    shared = root / "shared"
    env = dict(os.environ, PYTHONPATH=str(REPO))
    running = []
    for i, fault in enumerate(FAULTS):
        outdir = root / f"job-{i}"
        log = (root / f"job-{i}.out").open("wb")
        cmd = [sys.executable, "-m", "tests.torchjobs.matrix.run", fault, str(outdir)]
        cmd += ["--shared-root", str(shared)]
        proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)
        running.append((fault, outdir, log, proc))
    out = {}
    for fault, outdir, log, proc in running:
        proc.wait(timeout=RUN_TIMEOUT_S)
        log.close()
        out[fault] = outdir
    return shared, out


def test_two_jobs_sharing_hosts_dirs_each_get_their_own_uploads_and_verdict(live_server, make_key):
    from analysis.models import Incident
    from fleet.models import Attempt
    from ingest.models import Upload

    shared, runs = concurrent_runs()
    key = make_key("upload")
    for host in HOSTS:
        logs = (str(shared / host / "logs" / "*.log"),)
        agent = agent_over(shared / host, host, live_server.url, key, logs=logs)
        assert agent.flush(timeout_s=60), f"{host}: spool not drained"
        assert agent.spool.names() == []
    jobs = {fault: job_id(outdir) for fault, outdir in runs.items()}
    for fault, job in jobs.items():
        uploads = Upload.objects.filter(job__external_id=job)
        logs = uploads.filter(kind="log")
        assert logs.exists(), fault
        # A job's logs are the files it wrote: named by its own id (the matrix's job id is
        # what follows "elastic:"), never the other job's.
        own = job.split(":", 1)[1]
        assert all(u.filename.startswith(own + ".rank") for u in logs), [u.filename for u in logs]
        assert set(logs.values_list("rank", flat=True)) == {0, 1, 2, 3}
        attempt = Attempt.objects.get(job__external_id=job)
        incident = Incident.objects.filter(attempt=attempt).first()
        want = expected()[fault]
        if not want["failed"]:
            assert incident is None, incident.summary
            assert attempt.status == Attempt.Status.SUCCEEDED
        else:
            assert incident is not None and incident.culprit == want["culprit"], (
                incident and incident.summary
            )
    assert not Upload.objects.exclude(job__external_id__in=jobs.values()).exists()
