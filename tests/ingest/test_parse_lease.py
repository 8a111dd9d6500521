"""A parse claim is a lease its worker renews while the parse runs (PostgreSQL: workers in
other processes can take over a lapsed one; the embedded SQLite default has no other worker)."""

import time
from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone

from fleet.models import Attempt, Host, Job
from ingest.models import Upload
from ingest.services import parse_lease_renewed

pytestmark = pytest.mark.django_db(transaction=True)  # the renewing thread sees committed rows


def parsing_upload(claimed_at) -> Upload:
    job = Job.objects.create(external_id="lease")
    return Upload.objects.create(
        host=Host.objects.create(hostname="gpu-lease"),
        job=job,
        attempt=Attempt.objects.create(job=job),
        filename="rank0.log",
        sha256="0" * 64,
        size=1,
        status=Upload.Status.PARSING,
        parsed_at=claimed_at,
    )


def parsed_at(upload: Upload):
    return Upload.objects.values_list("parsed_at", flat=True).get(pk=upload.pk)


@pytest.mark.skipif(connection.vendor == "sqlite", reason="no renewal on the embedded default")
def test_a_running_parse_renews_its_claim_and_stops_when_it_ends(settings):
    settings.FLEETWATCH_PARSE_LEASE_SECONDS = 0.3  # renewed every 0.1 s
    claimed = timezone.now() - timedelta(minutes=5)
    upload = parsing_upload(claimed)
    with parse_lease_renewed(upload.pk):
        deadline = time.monotonic() + 30
        while parsed_at(upload) == claimed:
            assert time.monotonic() < deadline, "the claim was never renewed"
            time.sleep(0.05)
    # Ended: the parse's own result is what counts now, and no renewal overwrites it.
    Upload.objects.filter(pk=upload.pk).update(status=Upload.Status.PARSED, parsed_at=claimed)
    assert parsed_at(upload) == claimed


@pytest.mark.skipif(connection.vendor == "sqlite", reason="no renewal on the embedded default")
def test_a_running_classification_renews_its_claim_and_stops_when_it_ends(settings):
    from analysis.services import classify_lease_renewed

    settings.FLEETWATCH_CLASSIFY_LEASE_SECONDS = 0.3  # renewed every 0.1 s
    claimed = timezone.now() - timedelta(minutes=5)
    job = Job.objects.create(external_id="classify-lease")
    attempt = Attempt.objects.create(job=job, classify_claimed_at=claimed)

    def claim():
        return Attempt.objects.values_list("classify_claimed_at", flat=True).get(pk=attempt.pk)

    with classify_lease_renewed(attempt.pk):
        deadline = time.monotonic() + 30
        while claim() == claimed:
            assert time.monotonic() < deadline, "the claim was never renewed"
            time.sleep(0.05)
    # Done: the claim is released, and no renewal sets it again.
    Attempt.objects.filter(pk=attempt.pk).update(classify_claimed_at=None)
    assert claim() is None
