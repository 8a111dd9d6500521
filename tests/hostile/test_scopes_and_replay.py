"""Keys of the wrong scope on every endpoint that writes (or that only agents may call), and
replayed uploads. A key that may not do a thing gets a 403 naming the scope it lacks and
changes nothing; a key that is not one gets a 401; the same bytes again are the same upload."""

from __future__ import annotations

import gzip
import json
import pickle
from datetime import timedelta

import pytest
from django.utils import timezone
from rest_framework.test import APIClient

from analysis.models import DrainAction, HostRepair, Incident
from fleet.demo import JobScenario, rank_log
from fleet.models import Attempt, Host, Job
from ingest.models import AgentKey, Event, Upload
from tests.ops.helpers import flagged_host

pytestmark = pytest.mark.django_db

SCOPES = ("upload", "read", "operate")


def _upload_form():
    from django.core.files.uploadedfile import SimpleUploadedFile

    return {"file": SimpleUploadedFile("rank0.log", b"step 1\n"), "host": "gpu-001", "job": "j"}


# Every endpoint that changes state, or that only an agent may call: (method, path, scope,
# body, format, what would have changed).
ENDPOINTS = {
    "upload": ("post", "/api/v1/uploads", "upload", _upload_form, "multipart", Upload),
    "attempt report": (
        "post",
        "/api/v1/attempts",
        "upload",
        lambda: {"job": "j", "event": "start", "host": "gpu-001"},
        "json",
        Attempt,
    ),
    "artifact requests": (
        "get",
        "/api/v1/artifact-requests?host=gpu-001",
        "upload",
        None,
        None,
        None,
    ),
    "artifact request answer": (
        "post",
        lambda: _open_request_path(),
        "upload",
        lambda: {"outcome": "none"},
        "json",
        None,
    ),
    "drain": (
        "post",
        "/api/v1/hosts/gpu-001/drain",
        "operate",
        lambda: {"reason": "xid 79"},
        "json",
        DrainAction,
    ),
    "repaired": (
        "post",
        "/api/v1/hosts/gpu-001/repaired",
        "operate",
        lambda: {"note": "GPU swapped"},
        "json",
        HostRepair,
    ),
}


def _workflow(kind: str, step: str):
    """A workflow step on an incident or a culprit made afresh (resolved first for reopen)."""

    def path() -> str:
        n = Job.objects.count()
        status = "resolved" if step == "reopen" else "open"
        if kind == "incidents":
            job = Job.objects.create(external_id=f"j-wf-{n}")
            row = Incident.objects.create(
                attempt=Attempt.objects.create(job=job), job=job, status=status
            )
        else:
            Job.objects.create(external_id=f"j-wf-{n}")  # only to number the entity
            row = flagged_host(f"gpu-wf-{n}", status=status)
        return f"/api/v1/{kind}/{row.pk}/{step}"

    path.template = f"/api/v1/{kind}/{{id}}/{step}"
    if step == "assign":
        body = lambda: {"assignee": "alice"}  # noqa: E731
    elif step == "snooze":
        body = lambda: {"until": (timezone.now() + timedelta(hours=1)).isoformat()}  # noqa: E731
    else:
        body = lambda: {"note": "hostile test"}  # noqa: E731
    return ("post", path, "operate", body, "json", None)


for _kind, _steps in (
    ("incidents", ("acknowledge", "assign", "resolve", "snooze", "reopen")),
    ("culprits", ("acknowledge", "assign", "resolve", "snooze", "reopen", "mute")),
):
    for _step in _steps:
        ENDPOINTS[f"{_kind} {_step}"] = _workflow(_kind, _step)


def _open_request_path() -> str:
    """An open artifact request of gpu-001, made afresh: its id is only known once it exists."""
    from ingest.models import ArtifactRequest

    host, _ = Host.objects.get_or_create(hostname="gpu-001")
    job = Job.objects.create(external_id=f"j-req-{Job.objects.count()}")
    request = ArtifactRequest.objects.create(
        job=job, attempt=Attempt.objects.create(job=job), host=host, rank=0
    )
    return f"/api/v1/artifact-requests/{request.pk}/answer"


def _template(path) -> str:
    if callable(path):
        return getattr(path, "template", "/api/v1/artifact-requests/{id}/answer")
    return path.split("?")[0].replace("gpu-001", "{hostname}")


def call(client, endpoint: str):
    method, path, _, body, fmt, _ = ENDPOINTS[endpoint]
    path = path() if callable(path) else path
    if body is None:
        return getattr(client, method)(path)
    return getattr(client, method)(path, body(), format=fmt)


def client_with(key: str | None) -> APIClient:
    client = APIClient()
    if key is not None:
        client.credentials(HTTP_AUTHORIZATION=f"Bearer {key}")
    return client


@pytest.fixture
def host():
    return Host.objects.create(hostname="gpu-001")


def test_the_table_covers_every_operation_that_is_not_a_read():
    # A write endpoint added later without a row here fails this test, not production.
    from drf_spectacular.generators import SchemaGenerator

    document = SchemaGenerator().get_schema(request=None, public=True)
    writes = {
        (method.lower(), path)
        for path, operations in document["paths"].items()
        for method in operations
        if method.lower() not in ("get", "head", "options")
    }
    covered = {(m, _template(p)) for m, p, *_ in ENDPOINTS.values()}
    assert writes <= covered, writes - covered


KEY_SCOPES = [(), ("read",), ("upload",), ("operate",), ("read", "upload"), ("read", "operate")]
WRONG_SCOPE = [
    pytest.param(endpoint, scopes, id=f"{endpoint}-{'+'.join(scopes) or 'no scope'}")
    for endpoint, row in ENDPOINTS.items()
    for scopes in KEY_SCOPES
    if row[2] not in scopes
]


@pytest.mark.parametrize(("endpoint", "scopes"), WRONG_SCOPE)
def test_a_key_without_the_scope_is_refused_with_403_and_changes_nothing(
    make_key, host, endpoint, scopes
):
    needed, model = ENDPOINTS[endpoint][2], ENDPOINTS[endpoint][5]
    before = model.objects.count() if model else 0
    response = call(client_with(make_key(*scopes)), endpoint)
    assert response.status_code == 403, response.content
    assert response.json()["detail"] == f"This key lacks the '{needed}' scope."
    assert (model.objects.count() if model else 0) == before


@pytest.mark.parametrize("endpoint", list(ENDPOINTS))
def test_the_key_with_the_scope_is_let_through(make_key, host, endpoint):
    # The other side of the 403s: the same request, with the scope, does its work.
    needed, model = ENDPOINTS[endpoint][2], ENDPOINTS[endpoint][5]
    before = model.objects.count() if model else 0
    response = call(client_with(make_key(needed)), endpoint)
    assert response.status_code in (200, 202), response.content
    if model is not None:
        assert model.objects.count() == before + 1


@pytest.mark.parametrize("endpoint", list(ENDPOINTS))
@pytest.mark.parametrize("which", ["none", "unknown", "revoked", "expired", "empty", "other"])
def test_no_key_or_a_dead_one_is_refused_with_401_and_changes_nothing(
    make_key, host, endpoint, which
):
    model = ENDPOINTS[endpoint][5]
    every = make_key(*SCOPES, name="dead")
    if which == "revoked":
        AgentKey.objects.filter(name="dead").update(revoked=True)
    if which == "expired":
        AgentKey.objects.filter(name="dead").update(expiry_date=timezone.now() - timedelta(1))
    key = {"none": None, "unknown": "abcd1234.notakey", "empty": ""}.get(which, every)
    client = client_with(key)
    if which == "other":
        client.credentials(HTTP_AUTHORIZATION=f"Basic {every}")  # not a scheme we take
    before = model.objects.count() if model else 0
    response = call(client, endpoint)
    assert response.status_code == 401, response.content
    assert response.json()["detail"]
    assert (model.objects.count() if model else 0) == before


def test_a_key_is_not_a_login_for_the_web_ui_actions(make_key, host, client):
    job = Job.objects.create(external_id="j")
    incident = Incident.objects.create(
        attempt=Attempt.objects.create(job=job), job=job, fingerprint="f"
    )
    key = make_key(*SCOPES)
    for path in (f"/incidents/{incident.pk}/resolve/", "/hosts/gpu-001/repaired/"):
        response = client.post(path, HTTP_AUTHORIZATION=f"Bearer {key}")
        assert response.status_code == 302 and "/accounts/login/" in response["Location"]
    assert Incident.objects.get().status == "open" and not HostRepair.objects.exists()


# --- replayed uploads -------------------------------------------------------------------------

SCENARIO = JobScenario("job-replay", ["gpu-001", "gpu-002"], world=2, lagging=1, seq=812)
HW = json.dumps(
    {
        "hw_stats": "fleetwatch.hw_stats/1",
        "host": "gpu-001",
        "records": [{"type": "gpu", "index": 0, "ecc_uncorrected_volatile": 3}],
    }
).encode()
REPLAYED = {
    "log": (rank_log(SCENARIO, 0).encode(), "rank0.log", None),
    "gzip log": (gzip.compress(rank_log(SCENARIO, 0).encode(), mtime=0), "rank0.log.gz", None),
    "fr_dump": (
        pickle.dumps({"version": "2.10", "entries": [{"pg_id": 0, "collective_seq_id": 1}]}),
        "fr_rank0.pkl",
        None,
    ),
    "hw_stats": (HW, "hw.json", "hw_stats"),
    "refused pickle": (b"\x80\x04\x8c\x02os\x8c\x06system\x93.", "fr_rank0.pkl", None),
}


@pytest.mark.parametrize("case", list(REPLAYED))
def test_a_replayed_upload_is_the_same_upload_and_adds_nothing(upload, case):
    body, name, kind = REPLAYED[case]
    upload(rank_log(SCENARIO, 1), host="gpu-002", job="job-replay", rank=1)
    first = upload(body, name=name, kind=kind, job="job-replay", rank=0)
    assert first.status_code == 202 and first.json()["duplicate"] is False
    state = (
        Upload.objects.count(),
        Event.objects.count(),
        list(Incident.objects.values_list("pk", "classified_at")),
        list(Upload.objects.values_list("pk", "status", "parsed_at", "error")),
    )
    # Again, then again under another file name: the same bytes for the same host, job,
    # attempt and rank.
    again = upload(body, name=name, kind=kind, job="job-replay", rank=0)
    renamed = upload(body, name="other-name.bin", kind=kind, job="job-replay", rank=0)
    for replay in (again, renamed):
        assert replay.status_code == 202
        assert replay.json() == {
            "id": first.json()["id"],
            "status": Upload.objects.get(pk=first.json()["id"]).status,
            "duplicate": True,
        }
    assert (
        Upload.objects.count(),
        Event.objects.count(),
        list(Incident.objects.values_list("pk", "classified_at")),
        list(Upload.objects.values_list("pk", "status", "parsed_at", "error")),
    ) == state
    assert not Attempt.objects.filter(number=3).exists()
    # The same bytes for another attempt and rank are that attempt's evidence (a restarted job
    # prints the same lines): a new upload, never attempt 0's id.
    restarted = upload(body, name=name, kind=kind, job="job-replay", rank=5, attempt=3)
    assert restarted.status_code == 202 and restarted.json()["duplicate"] is False
    assert restarted.json()["id"] != first.json()["id"]
    assert Attempt.objects.filter(number=3).exists()


def test_a_replay_from_another_host_or_job_is_a_new_upload(upload):
    body = rank_log(SCENARIO, 0)
    ids = {
        upload(body, host=h, job=j).json()["id"]
        for h, j in (("gpu-001", "a"), ("gpu-002", "a"), ("gpu-001", "b"))
    }
    assert len(ids) == 3
