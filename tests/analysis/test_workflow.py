"""The on-call loop in the API: incidents and culprits owned, acknowledged, snoozed, muted,
resolved and reopened with scope ``operate``, every step journaled; a resolved culprit that is
implicated again reopens as a regression."""

from datetime import timedelta

import pytest
from django.utils import timezone
from rest_framework.test import APIClient

from analysis import memory
from analysis.models import CulpritScore, Incident
from ingest.models import AgentKey
from tests.analysis.test_fleet_memory import report_healthy, run_job

pytestmark = pytest.mark.django_db


@pytest.fixture
def operator(make_key):
    client = APIClient()
    key = make_key("read", "operate", name="pager")
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {key}")
    client.actor = f"key:{AgentKey.objects.get(name='pager').prefix}"
    return client


def an_incident(upload) -> Incident:
    return run_job(upload, "job-wf", ["gpu-a", "gpu-b"], lagging=3)


def test_an_operator_key_takes_an_incident_through_its_whole_loop(upload, operator):
    incident = an_incident(upload)
    url = f"/api/v1/incidents/{incident.pk}"
    body = operator.post(f"{url}/assign", {"assignee": "alice"}, format="json").json()
    assert body["assignee"] == "alice"
    assert operator.post(f"{url}/acknowledge", {"note": "looking"}).json()["status"] == (
        "acknowledged"
    )
    until = (timezone.now() + timedelta(hours=4)).isoformat()
    assert operator.post(f"{url}/snooze", {"until": until}, format="json").status_code == 200
    resolved = operator.post(f"{url}/resolve", {"note": "rank 3's host replaced"}).json()
    assert resolved["status"] == "resolved" and resolved["resolved_by"] == operator.actor
    # A step that no longer applies is a conflict, not a silent success.
    again = operator.post(f"{url}/acknowledge")
    assert again.status_code == 409 and "resolved" in again.json()["detail"]
    assert operator.post(f"{url}/reopen", {"note": "it came back"}).json()["status"] == "open"
    journal = operator.get(url).json()["journal"]
    assert [j["action"][:30] for j in journal] == [
        "assigned to alice",
        "acknowledged",
        f"snoozed until {until[:16]}",
        "resolved",
        "reopened",
    ]
    assert {j["by"] for j in journal} == {operator.actor}
    assert journal[-1]["note"] == "it came back"


def test_workflow_steps_need_the_operate_scope_and_say_what_is_wrong(
    upload, api, make_key, operator
):
    incident = an_incident(upload)
    url = f"/api/v1/incidents/{incident.pk}"
    api.credentials(HTTP_AUTHORIZATION=f"Bearer {make_key('read')}")
    refused = api.post(f"{url}/acknowledge")
    assert refused.status_code == 403 and "operate" in refused.json()["detail"]
    past = (timezone.now() - timedelta(hours=1)).isoformat()
    bad = operator.post(f"{url}/snooze", {"until": past}, format="json")
    assert bad.status_code == 400 and "future" in str(bad.json())
    assert operator.post(f"{url}/assign", {}, format="json").status_code == 400
    incident.refresh_from_db()
    assert incident.status == "open" and incident.journal == []


def test_mine_and_unowned_filter_by_the_caller(upload, operator):
    mine = run_job(upload, "job-mine", ["gpu-a", "gpu-b"], lagging=3)
    run_job(upload, "job-free", ["gpu-c", "gpu-d"], lagging=3)
    operator.post(
        f"/api/v1/incidents/{mine.pk}/assign", {"assignee": operator.actor}, format="json"
    )
    assert [r["job"] for r in operator.get("/api/v1/incidents?mine=true").json()["results"]] == [
        "job-mine"
    ]
    unowned = operator.get("/api/v1/incidents?unowned=true").json()["results"]
    assert [r["job"] for r in unowned] == ["job-free"]
    by_name = operator.get("/api/v1/incidents", {"assignee": operator.actor}).json()
    assert by_name["count"] == 1


def flagged_host(upload, api, make_key) -> CulpritScore:
    for n in range(12):
        report_healthy(api, make_key, f"ok-{n}", [f"gpu-{n % 6}", f"gpu-{(n + 1) % 6}"])
    for n, family in enumerate(["llama-pretrain", "asr-train", "vit-sweep"]):
        run_job(upload, f"{family}-{n}", [f"gpu-{n}", "gpu-bad"], lagging=3, seq=100 + n)
    memory.fleet_correlate()
    score = CulpritScore.objects.get(entity__kind="host", entity__key="gpu-bad")
    assert score.flagged and score.status == "open"
    return score


def test_a_resolved_culprit_implicated_again_reopens_as_a_regression(
    upload, api, make_key, operator
):
    score = flagged_host(upload, api, make_key)
    url = f"/api/v1/culprits/{score.pk}"
    assert operator.post(f"{url}/assign", {"assignee": "team:hw"}, format="json").status_code == 200
    resolved = operator.post(f"{url}/resolve", {"note": "rack r008 recabled"}).json()
    assert resolved["status"] == "resolved" and resolved["assignee"] == "team:hw"
    # Recomputing the scores keeps the workflow; nothing new implicated it: still resolved.
    memory.fleet_correlate()
    assert operator.get(url).json()["status"] == "resolved"

    incident = run_job(upload, "llama-pretrain-9", ["gpu-5", "gpu-bad"], lagging=3, seq=900)
    memory.fleet_correlate()
    body = operator.get(url).json()
    assert body["status"] == "open" and body["regressed_at"]
    assert body["assignee"] == "team:hw"  # the owner keeps it
    last = body["journal"][-1]
    assert last["action"] == "regression" and f"incident {incident.pk}" in last["note"]
    assert operator.actor in last["note"]  # who had resolved it
    # Once reopened it is not reopened again by the same implication.
    memory.fleet_correlate()
    assert [j["action"] for j in operator.get(url).json()["journal"]].count("regression") == 1


def test_a_muted_culprit_stays_muted_and_a_culprit_step_is_journaled(
    upload, api, make_key, operator
):
    score = flagged_host(upload, api, make_key)
    url = f"/api/v1/culprits/{score.pk}"
    assert operator.post(f"{url}/acknowledge").json()["acknowledged_by"] == operator.actor
    assert operator.post(f"{url}/mute", {"note": "known flaky, RMA filed"}).json()["status"] == (
        "muted"
    )
    assert operator.post(f"{url}/mute").status_code == 409
    run_job(upload, "asr-train-9", ["gpu-5", "gpu-bad"], lagging=3, seq=901)
    memory.fleet_correlate()
    body = operator.get(url).json()
    assert body["status"] == "muted" and body["regressed_at"] is None
    assert operator.get("/api/v1/culprits?status=muted").json()["count"] == 1
    assert operator.post(f"{url}/reopen").json()["status"] == "open"


def test_a_flagged_culprit_and_its_regression_reach_a_webhook_once_each(
    upload, api, make_key, operator, django_capture_on_commit_callbacks
):
    from fleet.models import NotificationDelivery, NotificationDestination
    from fleet.notify import verify_signature
    from tests.fleet.test_notify import Receiver

    hook = Receiver(answers=())
    try:
        dest = NotificationDestination.objects.create(
            name="oncall", url=hook.url, events=["culprit_flagged", "regression"]
        )
        with django_capture_on_commit_callbacks(execute=True):
            score = flagged_host(upload, api, make_key)
            memory.fleet_correlate()  # the same flagging seen again: nothing more
        hook.wait_for(lambda r: len(r) >= 1, "the flagging")
        operator.post(f"/api/v1/culprits/{score.pk}/resolve", {"note": "GPU swapped"})
        with django_capture_on_commit_callbacks(execute=True):
            run_job(upload, "vit-sweep-9", ["gpu-4", "gpu-bad"], lagging=3, seq=902)
            memory.fleet_correlate()
            memory.fleet_correlate()
        hook.wait_for(lambda r: len(r) >= 2, "the regression")
        events = [r["headers"]["X-Fleetwatch-Event"] for r in hook.requests]
        assert events == ["culprit_flagged", "regression"]
        for request in hook.requests:
            header = request["headers"]["X-Fleetwatch-Signature"]
            assert verify_signature(dest.secret, header, request["body"])
        assert "gpu-bad" in hook.requests[1]["body"].decode()
        assert NotificationDelivery.objects.filter(status="delivered").count() == 2
    finally:
        hook.close()
