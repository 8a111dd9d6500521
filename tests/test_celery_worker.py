"""A real Celery worker consuming from Redis classifies an uploaded incident.

Runs on the PostgreSQL + Redis pass of `make test`; on the embedded pass there is no broker."""

import os
import subprocess
import sys
import time

import pytest
from django.db import connection

from fleet.demo import JobScenario, rank_log

pytestmark = [
    pytest.mark.redis,
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(
        not os.environ.get("CELERY_BROKER_URL", "").startswith("redis://")
        or not os.environ.get("DATABASE_URL", "").startswith("postgres"),
        reason="needs CELERY_BROKER_URL=redis://… and DATABASE_URL=postgres://… (make test)",
    ),
]


@pytest.fixture
def worker(settings, tmp_path):
    from fleet.celery import app

    app.conf.task_always_eager = False
    app.control.purge()
    db = connection.settings_dict
    env = {
        **os.environ,
        "DATABASE_URL": f"postgres://{db['USER']}@{db['HOST']}:{db['PORT']}/{db['NAME']}",
        "FLEETWATCH_SETTLE_SECONDS": "0.5",
    }
    log = (tmp_path / "worker.log").open("wb")
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "celery",
            "-A",
            "fleet",
            "worker",
            "--pool=solo",
            "--loglevel=WARNING",
            "--without-heartbeat",
            "--without-mingle",
            "--without-gossip",
        ],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    yield proc
    proc.terminate()
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()
    log.close()


def test_a_real_worker_parses_and_classifies_uploads_from_redis(worker, api, make_key, tmp_path):
    from django.core.files.uploadedfile import SimpleUploadedFile

    from analysis.models import Incident
    from ingest.models import Upload

    scenario = JobScenario("job-redis", ["gpu-r1", "gpu-r2"], world=2, lagging=0, seq=300)
    key = make_key("upload")
    for rank in (0, 1):
        response = api.post(
            "/api/v1/uploads",
            {
                "file": SimpleUploadedFile(f"r{rank}.log", rank_log(scenario, rank).encode()),
                "host": scenario.host_of(rank),
                "job": "job-redis",
                "rank": rank,
            },
            format="multipart",
            HTTP_AUTHORIZATION=f"Bearer {key}",
        )
        assert response.status_code == 202
        # Accepted and queued: nothing ran in this process.
        assert Upload.objects.get(pk=response.json()["id"]).status == "received"

    deadline = time.monotonic() + 90
    while (
        time.monotonic() < deadline
        and not Incident.objects.filter(job__external_id="job-redis").exists()
    ):
        assert worker.poll() is None, (tmp_path / "worker.log").read_text()
        time.sleep(0.3)
    incident = Incident.objects.get(job__external_id="job-redis")
    assert [s["id"] for s in incident.suspects if s["kind"] == "rank"] == ["0"]
    assert set(Upload.objects.values_list("status", flat=True)) == {"parsed"}
