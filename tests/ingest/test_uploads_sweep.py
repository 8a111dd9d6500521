"""The sweeper re-enqueues work that has no live message, and leaves alone work that may have one.

Tasks run eagerly here, so what the sweep enqueues runs at once and its effect is visible."""

from datetime import timedelta

import pytest
from django.utils import timezone

from analysis.models import Incident
from fleet.demo import JobScenario, rank_log
from fleet.models import Attempt
from ingest.models import Event, Upload
from ingest.services import parse_lease, uploads_sweep

pytestmark = pytest.mark.django_db

JOB = JobScenario("job-sweep", ["gpu-001"], world=2, lagging=1, seq=40)


@pytest.fixture
def grace(settings):
    settings.FLEETWATCH_SWEEP_GRACE_SECONDS = 60
    return timedelta(seconds=60)


def test_an_upload_left_received_past_the_grace_is_parsed_and_a_fresh_one_is_left(upload, grace):
    old = upload(rank_log(JOB, 0), job=JOB.job, rank=0).json()["id"]
    fresh = upload(rank_log(JOB, 1), job=JOB.job, rank=1).json()["id"]
    events = Event.objects.filter(upload_id=old).count()
    now = timezone.now()
    # As if their publish had failed: received, no message anywhere.
    Upload.objects.update(status=Upload.Status.RECEIVED)
    Upload.objects.filter(pk=old).update(received_at=now - grace - timedelta(seconds=1))

    assert uploads_sweep(now) == {"uploads": 1, "attempts": 0}
    assert Upload.objects.get(pk=old).status == "parsed"
    assert Upload.objects.get(pk=fresh).status == "received"
    assert Event.objects.filter(upload_id=old).count() == events  # replaced, not doubled


def test_a_stale_parse_claim_is_taken_over_and_a_live_one_is_left(upload, grace):
    stale = upload(rank_log(JOB, 0), job=JOB.job, rank=0).json()["id"]
    live = upload(rank_log(JOB, 1), job=JOB.job, rank=1).json()["id"]
    now = timezone.now()
    Upload.objects.filter(pk=stale).update(
        status=Upload.Status.PARSING, parsed_at=now - parse_lease() - timedelta(seconds=1)
    )
    Upload.objects.filter(pk=live).update(status=Upload.Status.PARSING, parsed_at=now)

    assert uploads_sweep(now)["uploads"] == 1
    assert Upload.objects.get(pk=stale).status == "parsed"
    assert Upload.objects.get(pk=live).status == "parsing"


def test_an_attempt_parsed_but_never_classified_is_classified(upload, grace):
    upload(rank_log(JOB, 0), job=JOB.job, rank=0)
    upload(rank_log(JOB, 1), job=JOB.job, rank=1)
    attempt = Attempt.objects.get()
    # As if the classify message had been lost with the broker.
    Incident.objects.all().delete()
    long_ago = timezone.now() - grace - timedelta(seconds=1)
    Attempt.objects.filter(pk=attempt.pk).update(classified_at=None, last_parsed_at=long_ago)

    assert uploads_sweep() == {"uploads": 0, "attempts": 1}
    assert Incident.objects.get(attempt=attempt).suspects
    # Classified now: the next sweep finds nothing to do.
    assert uploads_sweep() == {"uploads": 0, "attempts": 0}


def test_an_attempt_with_an_upload_still_to_parse_is_left_to_that_upload(upload, grace):
    upload(rank_log(JOB, 0), job=JOB.job, rank=0)
    attempt = Attempt.objects.get()
    long_ago = timezone.now() - grace - timedelta(seconds=1)
    Attempt.objects.filter(pk=attempt.pk).update(classified_at=None, last_parsed_at=long_ago)
    Upload.objects.update(status=Upload.Status.PARSING, parsed_at=timezone.now())

    assert uploads_sweep() == {"uploads": 0, "attempts": 0}


def test_an_attempt_whose_classification_died_is_classified_after_the_lease(
    upload, grace, settings
):
    settings.FLEETWATCH_CLASSIFY_LEASE_SECONDS = 60
    upload(rank_log(JOB, 0), job=JOB.job, rank=0)
    upload(rank_log(JOB, 1), job=JOB.job, rank=1)
    attempt = Attempt.objects.get()
    Incident.objects.all().delete()
    now = timezone.now()
    long_ago = now - grace - timedelta(seconds=1)
    # A worker claimed it and died before storing a verdict: its lease holds for a while.
    Attempt.objects.filter(pk=attempt.pk).update(
        classified_at=None, last_parsed_at=long_ago, classify_claimed_at=now - timedelta(seconds=30)
    )
    assert uploads_sweep(now) == {"uploads": 0, "attempts": 0}
    Attempt.objects.filter(pk=attempt.pk).update(classify_claimed_at=now - timedelta(seconds=61))
    assert uploads_sweep(now) == {"uploads": 0, "attempts": 1}
    assert Incident.objects.get(attempt=attempt).suspects
