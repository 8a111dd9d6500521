"""The server asks for the raw trace of a suspect rank; the agent answers; old traces go."""

import dataclasses
import gzip
import json
import os
import time

import pytest

from agents.agent import Agent
from fleet.demo import JobScenario, rank_log
from ingest.models import ArtifactRequest, Upload
from ingest.parsers.trace import summarize_trace

from .test_agent_end_to_end import agent_config

pytestmark = pytest.mark.django_db


def tiny_trace(rank: int) -> bytes:
    events = [
        {
            "ph": "X",
            "name": f"ProfilerStep#{s}",
            "ts": s * 1000,
            "dur": 900,
            "pid": rank,
            "tid": 1,
            "cat": "user_annotation",
        }
        for s in range(5)
    ]
    return json.dumps({"traceEvents": events, "distributedInfo": {"rank": rank}}).encode()


def test_a_suspect_ranks_summary_makes_the_server_ask_for_its_raw_trace(upload, api, make_key):
    import io

    scenario = JobScenario("job-tr", ["gpu-t"], world=2, lagging=1, seq=70)
    summary = json.dumps(summarize_trace(io.BytesIO(tiny_trace(1)))).encode()
    assert (
        upload(
            summary,
            job="job-tr",
            host="gpu-t",
            rank=1,
            kind="trace",
            name="trace_rank1.summary.json",
        ).status_code
        == 202
    )
    for rank in (0, 1):
        upload(rank_log(scenario, rank), job="job-tr", host="gpu-t", rank=rank)
    api.credentials(HTTP_AUTHORIZATION=f"Bearer {make_key('upload', name='agent')}")
    wanted = api.get("/api/v1/artifact-requests", {"host": "gpu-t"}).json()
    assert [(r["job"], r["rank"], r["kind"]) for r in wanted] == [("job-tr", 1, "trace")]

    raw = gzip.compress(tiny_trace(1))
    assert (
        upload(
            raw, job="job-tr", host="gpu-t", rank=1, kind="trace", name="trace_rank1.json"
        ).status_code
        == 202
    )
    assert api.get("/api/v1/artifact-requests", {"host": "gpu-t"}).json() == []
    assert ArtifactRequest.objects.get().upload.filename == "trace_rank1.json"


def test_asking_needs_a_host_and_the_upload_scope(api, make_key):
    api.credentials(HTTP_AUTHORIZATION=f"Bearer {make_key('upload')}")
    assert api.get("/api/v1/artifact-requests").status_code == 400
    api.credentials(HTTP_AUTHORIZATION=f"Bearer {make_key('read', name='r')}")
    assert api.get("/api/v1/artifact-requests", {"host": "h"}).status_code == 403


@pytest.mark.django_db(transaction=True)
def test_the_agent_answers_a_request_with_the_kept_trace_and_prunes_old_ones(
    live_server, make_key, tmp_path
):
    from fleet.models import Attempt, Host, Job

    traces = tmp_path / "traces"
    traces.mkdir()
    (traces / "trace_rank1.json").write_bytes(tiny_trace(1))
    old = traces / "trace_rank0.json"
    old.write_bytes(tiny_trace(0))
    job = Job.objects.create(external_id="job-kept")
    attempt = Attempt.objects.create(job=job)
    host = Host.objects.create(hostname="gpu-e2e")
    ArtifactRequest.objects.create(
        job=job,
        attempt=attempt,
        host=host,
        rank=1,
        reason="test",
        source_file="trace_rank1.json.summary.json",  # the summary the agent sent
    )

    config = agent_config(
        tmp_path,
        live_server.url,
        make_key("upload"),
        trace_dirs=(str(traces),),
        request_poll_s=0.1,
        trace_keep_s=3600.0,
    )
    config = dataclasses.replace(config, job="job-kept")  # the job these traces belong to
    agent = Agent(config)
    agent.flush()  # both traces summarised and their summaries sent
    os.utime(old, (time.time() - 7200, time.time() - 7200))  # summarised two hours ago
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and ArtifactRequest.objects.get().fulfilled_at is None:
        agent.tick()
        time.sleep(0.2)
    agent.tick()  # the next pass removes what outlived trace_keep_s
    request = ArtifactRequest.objects.get()
    assert request.fulfilled_at is not None and request.outcome == "sent"
    while time.monotonic() < deadline and ArtifactRequest.objects.get().upload is None:
        agent.tick()
        time.sleep(0.2)
    request = ArtifactRequest.objects.get()
    assert request.upload.filename == "trace_rank1.json.gz"
    assert Upload.objects.filter(kind="trace", filename__endswith=".summary.json").count() == 2
    assert not old.exists()  # past trace_keep_s: gone from the host
    assert (traces / "trace_rank1.json").exists()


@pytest.mark.django_db(transaction=True)
def test_the_agent_sends_only_the_trace_behind_the_named_summary_and_answers_each_request_once(
    live_server, make_key, tmp_path
):
    """Two jobs' traces of rank 1 sit in one directory: a request of job B for a summary job A
    sent gets 'none', and a request for job A's summary gets that one file, once."""
    from fleet.models import Attempt, Host, Job

    traces = tmp_path / "traces"
    traces.mkdir()
    (traces / "jobA.trace_rank1.json").write_bytes(tiny_trace(1))
    config = agent_config(
        tmp_path,
        live_server.url,
        make_key("upload"),
        trace_dirs=(str(traces),),
        request_poll_s=0.1,
        trace_keep_s=3600.0,
    )
    agent = Agent(dataclasses.replace(config, job="job-a"))
    agent.flush()  # job A's trace summarised and sent under job A
    (traces / "jobB.trace_rank1.json").write_bytes(tiny_trace(1))
    host = Host.objects.get(hostname="gpu-e2e")
    job_a = Job.objects.get(external_id="job-a")
    job_b = Job.objects.create(external_id="job-b")
    wrong_job = ArtifactRequest.objects.create(
        job=job_b,
        attempt=Attempt.objects.create(job=job_b),
        host=host,
        rank=1,
        source_file="jobA.trace_rank1.json.summary.json",
    )
    right = ArtifactRequest.objects.create(
        job=job_a,
        attempt=Attempt.objects.get(job=job_a),
        host=host,
        rank=1,
        source_file="jobA.trace_rank1.json.summary.json",
    )
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and (
        ArtifactRequest.objects.filter(outcome="").exists()
        or not Upload.objects.filter(filename="jobA.trace_rank1.json.gz").exists()
    ):
        agent.tick()
        agent.flush()
        time.sleep(0.2)
    wrong_job.refresh_from_db()
    right.refresh_from_db()
    assert wrong_job.outcome == "none" and wrong_job.upload is None
    assert right.outcome == "sent"
    for _ in range(5):  # later polls list nothing: nothing is sent again
        agent.answer_requests(time.time() + 3600)
        agent.flush()
    raw = Upload.objects.filter(kind="trace").exclude(filename__endswith=".summary.json")
    assert list(raw.values_list("job__external_id", "filename")) == [
        ("job-a", "jobA.trace_rank1.json.gz")
    ]
