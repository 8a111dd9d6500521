"""One verdict per attempt on the embedded default too: eager Celery has no broker to hold a
delayed message, so the settle window runs on a timer in the server process; a loader that sends
whole attempts classifies each once when it is done."""

import time

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.db import OperationalError
from rest_framework.test import APIClient

from analysis.models import Incident, IncidentRevision
from analysis.tasks import attempt_classify
from fleet.celery import eager_countdowns
from fleet.demo import JobScenario, rank_log

pytestmark = pytest.mark.django_db(transaction=True)

JOB = JobScenario("job-settle", ["gpu-001", "gpu-002"], world=4, lagging=3, seq=77)


def send(client, key, rank: int) -> None:
    response = client.post(
        "/api/v1/uploads",
        {
            "file": SimpleUploadedFile(f"rank{rank}.log", rank_log(JOB, rank).encode()),
            "host": JOB.host_of(rank),
            "job": JOB.job,
            "rank": rank,
        },
        HTTP_AUTHORIZATION=f"Bearer {key}",
    )
    assert response.status_code == 202, response.content


def wait_for(condition, deadline_s: float = 60.0) -> bool:
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        try:
            if condition():
                return True
        except OperationalError:
            # The test database is SQLite in memory with a shared cache: while the timer thread
            # writes, a reader here is refused ("table is locked") instead of waiting.
            pass
        time.sleep(0.2)
    return condition()


def test_uploads_of_one_attempt_get_one_verdict_after_the_window(make_key, settings):
    # Far longer than one small upload takes on a busy 2-core machine; the wait below is for
    # the condition, with a generous deadline.
    settings.FLEETWATCH_SETTLE_SECONDS = 10  # the default
    client, key = APIClient(), make_key("upload")
    for rank in range(JOB.world):
        send(client, key, rank)
        # Inside the window nothing is classified, however many ranks are in.
        assert not Incident.objects.exists()
    assert wait_for(
        lambda: Incident.objects.exists() and eager_countdowns.pending(attempt_classify.name) == 0
    )
    incident = Incident.objects.get()
    # The verdict read every rank's log: the one that never enqueued the collective is named.
    assert "rank 3 lagged" in incident.summary
    assert IncidentRevision.objects.filter(incident=incident).count() == 1


def test_a_loader_that_sends_whole_attempts_classifies_each_once_without_waiting(
    make_key, settings
):
    settings.FLEETWATCH_SETTLE_SECONDS = 600  # far longer than this test may run
    client, key = APIClient(), make_key("upload")
    with eager_countdowns.batch():
        for rank in range(JOB.world):
            send(client, key, rank)
        assert not Incident.objects.exists()
    incident = Incident.objects.get()
    assert IncidentRevision.objects.filter(incident=incident).count() == 1
    # No classification waits on a timer. (Opening the incident may schedule other work, the
    # fleet correlation and the first sweep, on theirs: that depends on what ran before.)
    assert eager_countdowns.pending(attempt_classify.name) == 0
