"""The fault matrix end to end: each real job's two hosts each run a `fleetwatch-agent`, which
ships the rank logs, the launcher's console, the Flight Recorder dumps and the integration's
spooled records (attempt start/end, data order) to the server; the incident the server
classifies must name the planted fault's class, rank and host, and the healthy job must get no
incident and stay `succeeded`.

The agents run after each job has ended, over what the job left on its hosts (the integration's
spool, its run directory, the logs): the same collectors and upload path as an agent running
beside the job, without tying the assertions to the timing of a live follow.
"""

import pytest

pytest.importorskip("torch")

from tests.torchjobs.matrix_runs import expected, host_agent, job_id, matrix_runs

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

HOSTS = ("host-a", "host-b")
# fault -> (class it gets today, first rank it suspects); the same misses as the pure test's.
KNOWN_MISSES: dict[str, tuple[str, int]] = {}


def rank_and_host_suspects(incident) -> tuple[list[int], set[str]]:
    ranks = [int(s["id"]) for s in incident.suspects if s["kind"] == "rank"]
    hosts = {s["id"] for s in incident.suspects if s["kind"] == "host"}
    return ranks, hosts


@pytest.mark.parametrize("fault", list(expected()))
def test_agents_ship_a_real_jobs_artifacts_and_the_server_names_the_planted_fault(
    fault, live_server, make_key
):
    from analysis.models import Incident
    from fleet.models import Attempt
    from ingest.models import Upload

    outdir = matrix_runs()[fault]
    key = make_key("upload")
    for host in HOSTS:
        agent = host_agent(outdir, host, live_server.url, key)
        assert agent.flush(timeout_s=60), f"{host}: spool not drained"
    job = job_id(outdir)
    assert Upload.objects.filter(job__external_id=job).exists()
    assert not Upload.objects.exclude(job__external_id=job).exists()  # nothing of another job
    want = expected()[fault]
    attempt = Attempt.objects.get(job__external_id=job)
    incident = Incident.objects.filter(attempt=attempt).first()
    if not want["failed"]:
        assert incident is None, incident.summary
        assert attempt.status == Attempt.Status.SUCCEEDED
        return
    assert incident is not None
    assert attempt.status == Attempt.Status.FAILED
    ranks, hosts = rank_and_host_suspects(incident)
    if fault in KNOWN_MISSES:
        assert (incident.culprit, ranks[0] if ranks else None) == KNOWN_MISSES[fault]
        return
    assert incident.culprit == want["culprit"], incident.summary
    if want["culprit_rank"] is not None:
        assert ranks[:1] == [want["culprit_rank"]], incident.suspects
    if want["culprit_host"] is not None:
        assert want["culprit_host"] in hosts, incident.suspects
