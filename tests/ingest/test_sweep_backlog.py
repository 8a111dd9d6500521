"""The sweep does not grow a backlog: work it re-published is not sent again while its message
may still be queued (FLEETWATCH_SWEEP_REPUBLISH_SECONDS). Real Redis, no worker consuming: the
PostgreSQL + Redis pass of `make test`."""

import os
from datetime import timedelta

import pytest
from django.utils import timezone

from fleet.models import Attempt, Host, Job
from ingest.models import Upload
from ingest.services import uploads_sweep

pytestmark = [
    pytest.mark.redis,
    pytest.mark.django_db,
    pytest.mark.skipif(
        not os.environ.get("CELERY_BROKER_URL", "").startswith("redis://"),
        reason="needs CELERY_BROKER_URL=redis://… (make test)",
    ),
]


@pytest.fixture
def broker(settings):
    import redis

    from fleet.celery import app

    app.conf.task_always_eager = False
    app.control.purge()
    client = redis.Redis.from_url(os.environ["CELERY_BROKER_URL"])
    yield client
    app.control.purge()
    client.close()


def test_a_sweep_sends_left_work_once_until_the_republish_interval_passes(broker, settings):
    settings.FLEETWATCH_SWEEP_GRACE_SECONDS = 60
    settings.FLEETWATCH_SWEEP_REPUBLISH_SECONDS = 300
    now = timezone.now()
    job = Job.objects.create(external_id="backlog")
    attempt = Attempt.objects.create(job=job)
    host = Host.objects.create(hostname="gpu-backlog")
    for i in range(3):  # accepted while the broker was down: received, no message anywhere
        Upload.objects.create(
            host=host,
            job=job,
            attempt=attempt,
            filename=f"rank{i}.log",
            sha256=f"{i:064x}",
            size=1,
            received_at=now - timedelta(minutes=5),
        )

    assert uploads_sweep(now) == {"uploads": 3, "attempts": 0}
    assert broker.llen("ingest") == 3
    # No worker took them: the next sweeps leave the queued messages alone.
    assert uploads_sweep(now + timedelta(minutes=1)) == {"uploads": 0, "attempts": 0}
    assert uploads_sweep(now + timedelta(minutes=4)) == {"uploads": 0, "attempts": 0}
    assert broker.llen("ingest") == 3
    # Long enough that the broker may have lost them: sent once more.
    assert uploads_sweep(now + timedelta(minutes=6)) == {"uploads": 3, "attempts": 0}
    assert broker.llen("ingest") == 6
