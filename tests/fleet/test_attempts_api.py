"""POST /api/v1/attempts: agents and schedulers report attempts, healthy ones included."""

import pytest

from fleet.models import Attempt, RankPlacement

pytestmark = pytest.mark.django_db


@pytest.fixture
def agent(api, make_key):
    api.credentials(HTTP_AUTHORIZATION=f"Bearer {make_key('upload')}")
    return api


def report(client, **body):
    return client.post("/api/v1/attempts", body, format="json")


def test_start_then_end_records_a_healthy_attempt_with_its_placement_and_config(agent):
    start = report(
        agent,
        job="j-1",
        attempt=0,
        event="start",
        host="gpu-a",
        ranks=[0, 1],
        world_size=4,
        config={"NCCL_IB_HCA": "mlx5_0", "num_workers": "4"},
        versions={"torch": "2.5.1", "nccl": "2.21.5"},
        gpu_model="H100",
    )
    assert start.status_code == 200, start.json()
    report(agent, job="j-1", attempt=0, event="start", host="gpu-b", ranks=[2, 3])
    end = report(agent, job="j-1", attempt=0, event="end", status="succeeded")
    assert end.json()["status"] == "succeeded"
    attempt = Attempt.objects.get()
    assert attempt.world_size == 4 and attempt.ended_at is not None
    assert attempt.config["num_workers"] == "4" and attempt.versions["nccl"] == "2.21.5"
    assert sorted(RankPlacement.objects.values_list("rank", "host__hostname")) == [
        (0, "gpu-a"),
        (1, "gpu-a"),
        (2, "gpu-b"),
        (3, "gpu-b"),
    ]
    assert attempt.placements.first().host.gpu_model == "H100"


def test_a_clean_end_report_does_not_hide_an_incident(agent, upload):
    from fleet.demo import JobScenario, rank_log

    scenario = JobScenario("j-2", ["gpu-a"], world=2, lagging=1)
    for rank in (0, 1):
        upload(rank_log(scenario, rank), job="j-2", rank=rank, host="gpu-a")
    report(agent, job="j-2", event="end", status="succeeded")
    assert Attempt.objects.get().status == "failed"


def test_a_rank_of_the_reported_world_with_no_artifacts_is_named_missing_not_accused(
    agent, upload, reader
):
    from fleet.demo import JobScenario, rank_log

    report(agent, job="j-3", event="start", world_size=4)
    scenario = JobScenario("j-3", ["gpu-a"], world=4, era="2.3", seq=19, numel=1)
    for rank in (1, 2, 3):  # rank 0 never uploads anything
        upload(rank_log(scenario, rank), job="j-3", rank=rank, host="gpu-a")
    incident = reader.get("/api/v1/incidents", {"job": "j-3"}).json()["results"][0]
    # Nothing of rank 0 is here to say where it was: absence of evidence is not evidence.
    assert [s["id"] for s in incident["suspects"] if s["kind"] == "rank"] == []
    assert "no artifacts from rank 0" in incident["summary"]


def test_an_end_report_needs_a_status(agent):
    response = report(agent, job="j", event="end")
    assert response.status_code == 400
    assert "status" in response.json()["errors"]


def test_a_read_key_cannot_report_attempts(api, make_key):
    api.credentials(HTTP_AUTHORIZATION=f"Bearer {make_key('read')}")
    assert report(api, job="j", event="start").status_code == 403


def test_too_many_config_keys_are_refused(agent):
    response = report(agent, job="j", event="start", config={f"K{i}": "v" for i in range(201)})
    assert response.status_code == 400
