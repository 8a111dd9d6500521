"""Fleet memory: entities implicated across jobs, recurrence scores, host health, cause groups."""

import json

import pytest
from django.core.management import call_command
from django.utils import timezone

from analysis import memory
from analysis.models import CulpritScore, HostRepair, Incident
from fleet.demo import XID_79, JobScenario, rank_log
from fleet.models import Host

pytestmark = pytest.mark.django_db


def run_job(upload, job, hosts, lagging=None, dmesg=None, world=4, seq=500):
    scenario = JobScenario(job, hosts, world=world, lagging=lagging, seq=seq)
    for rank in range(world):
        upload(rank_log(scenario, rank), job=job, rank=rank, host=scenario.host_of(rank))
    for host, text in (dmesg or {}).items():
        upload(text, job=job, host=host, name=f"{host}-dmesg.log")
    return Incident.objects.get(job__external_id=job)


def report_healthy(api, make_key, job, hosts):
    api.credentials(HTTP_AUTHORIZATION=f"Bearer {make_key('upload', name=job)}")
    for i, host in enumerate(hosts):
        api.post(
            "/api/v1/attempts",
            {"job": job, "event": "start", "host": host, "ranks": [2 * i, 2 * i + 1]},
            format="json",
        )
    api.post("/api/v1/attempts", {"job": job, "event": "end", "status": "succeeded"}, format="json")


def test_a_host_lagging_in_three_unrelated_jobs_is_accused_with_an_explanation(
    upload, api, make_key
):
    for n in range(12):  # a healthy fleet around it, for the base rate
        report_healthy(api, make_key, f"ok-{n}", [f"gpu-{n % 6}", f"gpu-{(n + 1) % 6}"])
    for n, family in enumerate(["llama-pretrain", "asr-train", "vit-sweep"]):
        # rank 2 and 3 run on gpu-bad in each job; rank 3 lags
        run_job(upload, f"{family}-{n}", [f"gpu-{n}", "gpu-bad"], lagging=3, seq=100 + n)
    memory.fleet_correlate()
    score = CulpritScore.objects.get(entity__kind="host", entity__key="gpu-bad")
    assert score.flagged
    assert "ran the rank the others waited for in 3 of its 3 attempts" in score.explanation
    assert "fleet rate" in score.explanation and score.culprit == "bad_node_hardware"
    other = CulpritScore.objects.filter(entity__kind="host", entity__key="gpu-0").first()
    assert other is None or not other.flagged


def test_one_lagging_incident_accuses_nobody(upload):
    run_job(upload, "solo-1", ["gpu-a", "gpu-b"], lagging=3)
    memory.fleet_correlate()
    assert not CulpritScore.objects.filter(flagged=True).exists()


def test_an_xid_79_drains_the_host_at_once_and_repair_starts_it_afresh(upload, api, make_key):
    incident = run_job(upload, "sft-9", ["gpu-a", "gpu-x"], lagging=3, dmesg={"gpu-x": XID_79})
    assert incident.culprit == "bad_node_hardware"
    reader = api
    reader.credentials(HTTP_AUTHORIZATION=f"Bearer {make_key('read', 'operate')}")
    health = reader.get("/api/v1/hosts/gpu-x/health").json()
    assert health["hostname"] == "gpu-x" and health["verdict"] == "drain"
    assert health["incidents"] == [incident.pk]
    assert any("GPU hardware fault" in r for r in health["reasons"])
    assert reader.get("/api/v1/hosts/gpu-a/health").json()["verdict"] == "ok"

    repaired = reader.post(
        "/api/v1/hosts/gpu-x/repaired", {"note": "reseated GPU 3"}, format="json"
    )
    assert repaired.status_code == 200 and repaired.json()["verdict"] == "ok"
    assert HostRepair.objects.get().note == "reseated GPU 3"
    assert Incident.objects.filter(pk=incident.pk).exists()  # history kept


def test_repairing_needs_the_operate_scope(api, make_key):
    Host.objects.create(hostname="gpu-z")
    api.credentials(HTTP_AUTHORIZATION=f"Bearer {make_key('read')}")
    assert api.post("/api/v1/hosts/gpu-z/repaired", {}, format="json").status_code == 403
    assert api.get("/api/v1/hosts/nope/health").status_code == 404


def test_incidents_with_the_same_cause_share_a_fingerprint_and_count_up(upload, reader):
    for n in range(3):
        run_job(
            upload, f"train-{n}", ["gpu-a", "gpu-x"], lagging=3, dmesg={"gpu-x": XID_79}, seq=10 + n
        )
    incidents = reader.get("/api/v1/incidents").json()["results"]
    assert len({i["fingerprint"] for i in incidents}) == 1
    assert sorted(i["occurrence"] for i in incidents) == [3, 3, 3]
    one = reader.get(f"/api/v1/incidents/{incidents[-1]['id']}").json()
    assert one["occurrence"] == 1  # the oldest: the first time


def test_the_culprits_api_lists_accused_entities_first(upload, reader):
    for n in range(3):
        run_job(
            upload, f"train-{n}", ["gpu-a", "gpu-x"], lagging=3, dmesg={"gpu-x": XID_79}, seq=10 + n
        )
    memory.fleet_correlate()
    body = reader.get("/api/v1/culprits", {"flagged": "true"}).json()
    keys = [(c["kind"], c["key"]) for c in body["results"]]
    assert ("host", "gpu-x") in keys
    assert all(c["flagged"] for c in body["results"])


def test_evidence_decays_out_of_the_window(upload):
    run_job(upload, "old-1", ["gpu-a", "gpu-x"], lagging=3, dmesg={"gpu-x": XID_79})
    later = timezone.now() + timezone.timedelta(days=30)
    health = memory.host_health(Host.objects.get(hostname="gpu-x"), now=later)
    assert health.verdict == "ok" and health.incidents == []


@pytest.mark.django_db(transaction=True)
def test_a_small_simulated_fleet_flags_every_planted_culprit(tmp_path):
    truth = tmp_path / "truth.json"
    call_command("simulate_fleet", hosts=128, days=4, seed=2, truth=str(truth), ticks_per_day=24)
    from io import StringIO

    out = StringIO()
    call_command("evaluate_fleet", truth=str(truth), stdout=out)
    result = json.loads(out.getvalue())
    missed = [p["id"] for p in result["plants"] if not p["flagged"]]
    assert missed == []
    assert result["precision"] >= 0.9, result["false_positives"]
    assert {p["culprit"] for p in result["plants"]} == {
        "bad_node_hardware",
        "network_transport",
        "storage_io",
        "parallelism_config",
        "rank_desync_code",
        "dataloader_cpu",
    }
