"""The classify task: waits for an attempt's uploads to settle, claims, is safe to run twice."""

import contextlib
from datetime import timedelta

import pytest
from django.utils import timezone

from analysis import services
from analysis.models import Incident
from analysis.tasks import attempt_classify
from fleet.celery import eager_countdowns
from fleet.demo import JobScenario, rank_log
from fleet.models import Attempt
from ingest.models import Upload
from ingest.tasks import upload_parse

pytestmark = pytest.mark.django_db

JOB = JobScenario("job-s", ["gpu-001"], world=3, lagging=2, seq=40)


def test_an_attempt_is_not_classified_while_an_upload_is_still_unparsed(upload):
    upload(rank_log(JOB, 0), job="job-s", rank=0)
    attempt = Attempt.objects.get()
    Upload.objects.update(status=Upload.Status.RECEIVED)
    Incident.objects.all().delete()
    attempt_classify(attempt.pk)
    assert not Incident.objects.exists()


def test_an_attempt_is_not_classified_inside_the_settle_window(upload, settings):
    upload(rank_log(JOB, 0), job="job-s", rank=0)
    Incident.objects.all().delete()
    settings.FLEETWATCH_SETTLE_SECONDS = 60
    attempt = Attempt.objects.get()
    Attempt.objects.update(last_parsed_at=timezone.now(), classified_at=None)
    attempt_classify(attempt.pk)
    assert not Incident.objects.exists()
    Attempt.objects.update(last_parsed_at=timezone.now() - timedelta(seconds=61))
    attempt_classify(attempt.pk)
    assert Incident.objects.count() == 1


def test_every_ranks_upload_joins_one_incident(upload):
    for rank in range(3):
        upload(rank_log(JOB, rank), job="job-s", rank=rank)
    incident = Incident.objects.get()
    assert "rank 2 lagged" in incident.summary
    assert Attempt.objects.get().status == "failed"


def test_classifying_an_already_classified_attempt_is_a_no_op(upload, django_assert_num_queries):
    upload(rank_log(JOB, 0), job="job-s", rank=0)
    attempt = Attempt.objects.get()
    before = Incident.objects.get().classified_at
    attempt_classify(attempt.pk)  # nothing new parsed since: the claim fails
    assert Incident.objects.get().classified_at == before


def test_the_claim_lets_only_one_worker_through():
    from fleet.models import Job

    attempt = Attempt.objects.create(
        job=Job.objects.create(external_id="j"), last_parsed_at=timezone.now()
    )
    now = timezone.now()
    assert services.attempt_claim_for_classify(attempt.pk, now) is True
    assert services.attempt_claim_for_classify(attempt.pk, now) is False


def test_a_claim_held_past_its_lease_is_taken_and_a_finished_one_is_released(settings):
    from fleet.models import Job

    settings.FLEETWATCH_CLASSIFY_LEASE_SECONDS = 60
    parsed = timezone.now()
    attempt = Attempt.objects.create(job=Job.objects.create(external_id="j"), last_parsed_at=parsed)
    claimed = parsed + timedelta(seconds=1)
    assert services.attempt_claim_for_classify(attempt.pk, claimed) is True
    # Its worker died mid-classify: the attempt is still unclassified and the claim holds for
    # the lease, then any worker may take it.
    assert services.attempt_claim_for_classify(attempt.pk, claimed + timedelta(seconds=59)) is False
    later = claimed + timedelta(seconds=61)
    assert services.attempt_claim_for_classify(attempt.pk, later) is True
    services.attempt_classify_done(attempt.pk, later)
    attempt.refresh_from_db()
    assert (attempt.classified_at, attempt.classify_claimed_at) == (later, None)
    # Done, and nothing parsed since: there is nothing to claim.
    assert services.attempt_claim_for_classify(attempt.pk, later + timedelta(hours=1)) is False


def test_an_upload_parsed_while_a_classification_ran_gets_its_own_after_it(upload):
    # The classification in flight read the uploads as they were when it claimed; the upload
    # that parsed meanwhile found the attempt claimed. Releasing the claim classifies again.
    upload(rank_log(JOB, 0), job=JOB.job, rank=0)
    attempt = Attempt.objects.get()
    first = Incident.objects.get().classified_at
    claimed = attempt.classified_at - timedelta(seconds=1)
    Attempt.objects.filter(pk=attempt.pk).update(
        classify_claimed_at=claimed, last_parsed_at=claimed + timedelta(milliseconds=500)
    )
    with eager_countdowns.batch():  # the published classification runs as the block ends
        services.attempt_classify_done(attempt.pk, claimed)
    assert Incident.objects.get().classified_at > first


def test_tasks_for_rows_that_are_gone_return_quietly():
    attempt_classify(987654)
    upload_parse(987654)


def test_parsing_an_upload_twice_does_not_duplicate_its_events(upload):
    upload_id = upload(rank_log(JOB, 0), job="job-s", rank=0).json()["id"]
    count = Upload.objects.get(pk=upload_id).events.count()
    upload_parse(upload_id)  # redelivered: already parsed, the claim fails
    Upload.objects.filter(pk=upload_id).update(status=Upload.Status.RECEIVED)
    upload_parse(upload_id)  # parsed again from scratch
    assert Upload.objects.get(pk=upload_id).events.count() == count


def test_a_healthy_attempt_opens_no_incident(upload):
    upload("step 1 loss 2.1\nstep 2 loss 2.0\nTraining complete.\n", job="fine", rank=0)
    assert not Incident.objects.exists()


def test_a_parse_abandoned_by_a_dead_worker_is_taken_over_later(upload):
    upload_id = upload(rank_log(JOB, 0), job="job-s", rank=0).json()["id"]
    Upload.objects.filter(pk=upload_id).update(
        status=Upload.Status.PARSING, parsed_at=timezone.now() - timedelta(hours=1)
    )
    upload_parse(upload_id)
    assert Upload.objects.get(pk=upload_id).status == "parsed"


def test_later_evidence_revises_the_verdict_only_when_culprit_or_ranks_change(upload, reader):
    """Each verdict is kept with what changed it; the same verdict again is no revision. The
    uploads run their parse and classification as they arrive (eager), one rank at a time."""
    scenario = JobScenario("rev-1", ["gpu-r"], world=4, era="2.3", seq=19, numel=1, lagging=3)

    def revisions():
        found = reader.get("/api/v1/incidents", {"job": "rev-1"}).json()["results"]
        return found[0]["revisions"] if found else []

    for rank in (0, 1):
        upload(
            rank_log(scenario, rank), job="rev-1", rank=rank, host="gpu-r", name=f"rank{rank}.log"
        )
    first = revisions()
    assert len(first) == 1 and first[0]["cause"].startswith("first verdict")
    upload(rank_log(scenario, 2), job="rev-1", rank=2, host="gpu-r", name="rank2.log")
    assert revisions() == first  # the same culprit and ranks again: no revision
    upload(rank_log(scenario, 3), job="rev-1", rank=3, host="gpu-r", name="rank3.log")
    final = revisions()
    assert final[:1] == first
    assert len(final) <= 2
    if len(final) == 2:  # the lagging rank's own log changed who is suspected
        assert final[1]["cause"].startswith("changed after") and "of rank 3" in final[1]["cause"]
        assert final[1]["ranks"] != first[0]["ranks"] or final[1]["culprit"] != first[0]["culprit"]


class _WorkerDied(BaseException):
    """What a killed worker looks like from inside the task: it never returns."""


def test_a_classification_that_keeps_taking_its_worker_down_stops_and_says_why(upload, monkeypatch):
    upload(rank_log(JOB, 0), job=JOB.job, rank=0)
    attempt = Attempt.objects.get()
    Incident.objects.all().delete()
    runs = []

    def dies(attempt, now=None):
        runs.append(now)
        raise _WorkerDied

    monkeypatch.setattr(services, "incident_classify", dies)
    for _ in range(services.MAX_CLASSIFY_TRIES + 2):
        # Each run dies holding the claim; the sweep hands the attempt on once the lease lapsed.
        Attempt.objects.filter(pk=attempt.pk).update(
            classified_at=None, classify_claimed_at=timezone.now() - timedelta(hours=1)
        )
        with contextlib.suppress(_WorkerDied):
            attempt_classify(attempt.pk)
    assert len(runs) == services.MAX_CLASSIFY_TRIES
    attempt.refresh_from_db()
    assert "never finished" in attempt.classify_error and attempt.classify_claimed_at is None
    assert not Attempt.objects.filter(services.attempt_unclassified(), pk=attempt.pk).exists()

    # A new upload of the attempt is new evidence: a full budget again, and a run that finishes
    # clears the error.
    monkeypatch.undo()
    upload(rank_log(JOB, 1), job=JOB.job, rank=1)
    attempt.refresh_from_db()
    assert (attempt.classify_tries, attempt.classify_error) == (0, "")
    assert Incident.objects.filter(attempt=attempt).exists()


def test_a_retry_after_a_database_error_does_not_spend_a_try(upload):
    # The retry (takeover) follows a run that reported back: that run was counted, this one is
    # not, so a budget spent by dead workers still lets the retry through.
    upload(rank_log(JOB, 0), job=JOB.job, rank=0)
    attempt = Attempt.objects.get()
    Incident.objects.all().delete()
    Attempt.objects.filter(pk=attempt.pk).update(
        classified_at=None,
        classify_claimed_at=timezone.now(),
        classify_tries=services.MAX_CLASSIFY_TRIES,
    )
    attempt_classify(attempt.pk, takeover=True)
    assert Incident.objects.filter(attempt=attempt).exists()
    attempt.refresh_from_db()
    assert (attempt.classify_tries, attempt.classify_claimed_at) == (0, None)


def test_a_boot_in_one_hosts_dmesg_says_nothing_about_another_hosts_file_of_the_same_name(upload):
    # Two hosts upload "dmesg.log": host A's was rebooted late in its file, host B's GPU fell off
    # the bus early in its own. B's fault is this job's, whatever A's file says of A's past.
    reboot = "".join(f"[{n}.000000] usb 1-1: new device\n" for n in range(1, 50)) + (
        "[    0.000000] Linux version 5.15.0-119-generic (buildd@lcy02-amd64-075) (gcc (Ubuntu "
        "11.4.0-1ubuntu1~22.04) 11.4.0, GNU ld (GNU Binutils for Ubuntu) 2.38) #129-Ubuntu SMP\n"
    )
    fallen = "[812088.402125] NVRM: Xid (PCI:0000:c1:00): 79, pid=0, GPU has fallen off the bus.\n"
    upload(rank_log(JOB, 0), job=JOB.job, rank=0, host="gpu-001")
    upload(reboot, job=JOB.job, host="gpu-a", name="dmesg.log")
    upload(fallen, job=JOB.job, host="gpu-b", name="dmesg.log")
    attempt = Attempt.objects.get()
    sources = {e.source for e in services.attempt_events(attempt)}
    assert {s for s in sources if s.startswith("dmesg.log")} == {
        f"dmesg.log (upload {u.pk})" for u in Upload.objects.filter(filename="dmesg.log")
    }
    assert Incident.objects.get(attempt=attempt).culprit == "bad_node_hardware"
