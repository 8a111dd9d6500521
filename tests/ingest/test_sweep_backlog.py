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


def left_upload(job: str, rank: int, *, received_at) -> Upload:
    """An upload stored with no message queued for it (its publish failed), rank ``rank`` of
    attempt 0 of ``job`` on host gpu-``job``."""
    job_row, _ = Job.objects.get_or_create(external_id=job)
    attempt, _ = Attempt.objects.get_or_create(job=job_row, number=0)
    host, _ = Host.objects.get_or_create(hostname=f"gpu-{job}")
    return Upload.objects.create(
        host=host,
        job=job_row,
        attempt=attempt,
        filename=f"rank{rank}.log",
        sha256=f"{job}{rank}".encode().hex().ljust(64, "0")[:64],
        size=1,
        received_at=received_at,
    )


def test_a_sweep_sends_left_work_once_until_the_republish_interval_passes(broker, settings):
    settings.FLEETWATCH_SWEEP_GRACE_SECONDS = 60
    settings.FLEETWATCH_SWEEP_REPUBLISH_SECONDS = 300
    now = timezone.now()
    for i in range(3):  # accepted while the broker was down: received, no message anywhere
        left_upload("backlog", i, received_at=now - timedelta(minutes=5))

    assert uploads_sweep(now) == {"uploads": 3, "attempts": 0}
    assert broker.llen("ingest") == 3
    # No worker took them: the next sweeps leave the queued messages alone.
    assert uploads_sweep(now + timedelta(minutes=1)) == {"uploads": 0, "attempts": 0}
    assert uploads_sweep(now + timedelta(minutes=4)) == {"uploads": 0, "attempts": 0}
    assert broker.llen("ingest") == 3
    # Long enough that the broker may have lost them: sent once more.
    assert uploads_sweep(now + timedelta(minutes=6)) == {"uploads": 3, "attempts": 0}
    assert broker.llen("ingest") == 6


def test_work_a_worker_took_and_then_dropped_is_sent_again_at_once(broker, settings):
    """The sweep's message was consumed: a worker claimed the upload after it was sent, then
    died (its lease lapsed). No message is left queued, so the republish interval, which is
    there to leave queued messages alone, does not hold it back."""
    settings.FLEETWATCH_SWEEP_GRACE_SECONDS = 60
    settings.FLEETWATCH_SWEEP_REPUBLISH_SECONDS = 300
    settings.FLEETWATCH_PARSE_LEASE_SECONDS = 30
    settings.FLEETWATCH_CLASSIFY_LEASE_SECONDS = 30
    settings.FLEETWATCH_SETTLE_SECONDS = 10
    now = timezone.now()
    upload = left_upload("dropped", 0, received_at=now - timedelta(minutes=5))
    attempt = upload.attempt
    assert uploads_sweep(now) == {"uploads": 1, "attempts": 0}
    app_queue = broker.llen("ingest")
    # A worker takes the message 10 s later, then dies: its claim is never renewed.
    Upload.objects.filter(pk=upload.pk).update(
        status=Upload.Status.PARSING, parsed_at=now + timedelta(seconds=10)
    )
    broker.delete("ingest")  # the message was consumed
    assert uploads_sweep(now + timedelta(seconds=30)) == {"uploads": 0, "attempts": 0}  # held
    assert uploads_sweep(now + timedelta(seconds=60)) == {"uploads": 1, "attempts": 0}
    assert broker.llen("ingest") == 1 and app_queue == 1

    # The same for a classification: sent by the sweep, claimed after, the claim lapsed.
    Upload.objects.filter(pk=upload.pk).update(status=Upload.Status.PARSED)
    Attempt.objects.filter(pk=attempt.pk).update(last_parsed_at=now - timedelta(minutes=5))
    later = now + timedelta(minutes=2)
    assert uploads_sweep(later)["attempts"] == 1
    Attempt.objects.filter(pk=attempt.pk).update(classify_claimed_at=later + timedelta(seconds=5))
    assert uploads_sweep(later + timedelta(seconds=20))["attempts"] == 0  # still held
    assert uploads_sweep(later + timedelta(seconds=60))["attempts"] == 1
