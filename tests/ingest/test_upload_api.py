"""POST /api/v1/uploads: the path from an agent's artifact to a classified incident."""

import gzip
import io

import pytest

from fleet.demo import JobScenario, rank_log
from ingest.models import Event, Upload

pytestmark = pytest.mark.django_db

TWO_RANKS = JobScenario("job-4821", ["gpu-001", "gpu-002"], world=2, lagging=1, seq=812)


def test_two_ranks_logs_make_one_incident_that_names_the_lagging_rank(upload, reader):
    for rank in (0, 1):
        response = upload(
            rank_log(TWO_RANKS, rank), host=TWO_RANKS.host_of(rank), job="job-4821", rank=rank
        )
        assert response.status_code == 202, response.json()

    body = reader.get("/api/v1/incidents", {"job": "job-4821"}).json()
    assert body["count"] == 1
    incident = body["results"][0]
    assert incident["job"] == "job-4821"
    assert {"kind": "rank", "id": "1"} in [
        {k: s[k] for k in ("kind", "id")} for s in incident["suspects"]
    ]
    assert "rank 1 lagged" in incident["summary"]
    assert {"id", "culprit", "confidence", "summary", "fix"} <= incident.keys()
    assert incident["hosts"] == ["gpu-001", "gpu-002"]


def test_gzip_and_plain_uploads_parse_the_same(upload):
    text = rank_log(TWO_RANKS, 0)
    plain = upload(text, job="plain").json()["id"]
    packed = upload(text, job="packed", gz=True).json()["id"]
    a, b = Upload.objects.get(pk=plain), Upload.objects.get(pk=packed)
    assert a.status == b.status == "parsed"
    assert b.compressed and not a.compressed
    assert a.event_count == b.event_count > 0


def test_the_same_bytes_for_the_same_host_and_job_answer_the_same_id(upload):
    first = upload("hello\n", job="j").json()
    again = upload("hello\n", job="j").json()
    assert again["id"] == first["id"]
    assert again["duplicate"] is True
    assert Upload.objects.count() == 1


def test_the_same_bytes_for_another_attempt_or_rank_are_that_ones_evidence(upload):
    from fleet.models import Attempt

    first = upload("same lines\n", job="j", attempt=0, rank=5).json()["id"]
    restarted = upload("same lines\n", job="j", attempt=1, rank=5).json()
    other_rank = upload("same lines\n", job="j", attempt=1, rank=6).json()
    assert len({first, restarted["id"], other_rank["id"]}) == 3
    assert not restarted["duplicate"] and not other_rank["duplicate"]
    assert Attempt.objects.filter(job__external_id="j", number=1).exists()
    # A retry of any of them is still a no-op, with or without a rank.
    assert upload("same lines\n", job="j", attempt=1, rank=5).json()["id"] == restarted["id"]
    no_rank = upload("same lines\n", job="j", attempt=1).json()["id"]
    assert upload("same lines\n", job="j", attempt=1).json()["id"] == no_rank
    assert Upload.objects.count() == 4


def test_the_same_bytes_from_another_host_are_a_new_upload(upload):
    a = upload("same\n", host="gpu-a").json()["id"]
    b = upload("same\n", host="gpu-b").json()["id"]
    assert a != b


def test_an_upload_without_a_key_is_refused_with_401_and_a_reason(upload):
    response = upload("x\n", key="")
    assert response.status_code == 401
    assert "credentials" in response.json()["detail"].lower()


def test_an_unknown_key_is_refused_with_401(upload):
    response = upload("x\n", key="nope.nope")
    assert response.status_code == 401
    assert response.json()["detail"] == "Unknown or revoked key."


def test_a_revoked_key_is_refused(upload, make_key):
    from ingest.models import AgentKey

    key = make_key("upload", name="old")
    AgentKey.objects.filter(name="old").update(revoked=True)
    assert upload("x\n", key=key).status_code == 401


def test_a_read_only_key_cannot_upload(upload, make_key):
    response = upload("x\n", key=make_key("read"))
    assert response.status_code == 403
    assert "upload" in response.json()["detail"]


def test_an_empty_file_is_refused_with_400(upload):
    response = upload(b"")
    assert response.status_code == 400
    assert response.json()["detail"] == "file is empty"


def test_binary_garbage_is_refused_with_400(upload):
    response = upload(bytes(range(256)) * 64, name="core")
    assert response.status_code == 400
    assert "binary" in response.json()["detail"]


def test_a_truncated_gzip_is_refused_with_400(upload):
    packed = gzip.compress(("line\n" * 10_000).encode())
    response = upload(packed[: len(packed) // 2], name="cut.log.gz")
    assert response.status_code == 400
    assert "truncated" in response.json()["detail"]


def test_a_file_over_the_size_limit_is_refused_with_413(upload, settings):
    settings.FLEETWATCH_MAX_UPLOAD_BYTES = 1000
    response = upload("x" * 2000)
    assert response.status_code == 413
    assert "limit" in response.json()["detail"]


def test_a_declared_body_over_the_limit_is_refused_before_reading_it(api, make_key, settings):
    settings.FLEETWATCH_MAX_UPLOAD_BYTES = 1000
    response = api.generic(
        "POST",
        "/api/v1/uploads",
        b"",
        content_type="multipart/form-data; boundary=x",
        HTTP_AUTHORIZATION=f"Bearer {make_key('upload')}",
        CONTENT_LENGTH=str(2 * 1024**3),
    )
    assert response.status_code == 413


def test_a_gzip_bomb_is_refused_without_inflating_it_whole(upload, settings):
    settings.FLEETWATCH_MAX_INFLATED_BYTES = 1_000_000
    bomb = io.BytesIO()
    with gzip.GzipFile(fileobj=bomb, mode="wb") as f:
        for _ in range(100):
            f.write(b"\0" * 100_000)
    response = upload(bomb.getvalue(), name="bomb.log.gz")
    assert response.status_code == 413
    assert "inflates" in response.json()["detail"]


@pytest.mark.parametrize(
    ("form_change", "field"),
    [
        ({"host": ""}, "host"),
        ({"host": "../../etc"}, "host"),
        ({"job": "x" * 300}, "job"),
        ({"rank": -1}, "rank"),
        ({"kind": "executable"}, "kind"),
    ],
)
def test_invalid_fields_are_named_in_the_400_answer(api, make_key, form_change, field):
    from django.core.files.uploadedfile import SimpleUploadedFile

    form = {"file": SimpleUploadedFile("a.log", b"x\n"), "host": "h", "job": "j", **form_change}
    response = api.post(
        "/api/v1/uploads",
        form,
        format="multipart",
        HTTP_AUTHORIZATION=f"Bearer {make_key('upload')}",
    )
    assert response.status_code == 400
    body = response.json()
    assert field in body["errors"]
    assert field in body["detail"]


def test_a_missing_file_part_is_a_clear_400(api, make_key):
    response = api.post(
        "/api/v1/uploads",
        {"host": "h", "job": "j"},
        format="multipart",
        HTTP_AUTHORIZATION=f"Bearer {make_key('upload')}",
    )
    assert response.status_code == 400
    assert "file" in response.json()["errors"]


def test_bad_input_loses_nothing_already_accepted(upload):
    good = upload(rank_log(TWO_RANKS, 0), job="keep").json()["id"]
    upload(b"")
    upload(bytes(range(256)) * 64)
    upload(gzip.compress(b"abc" * 1000)[:20], name="x.gz")
    after = upload(rank_log(TWO_RANKS, 1), job="keep", rank=1)
    assert after.status_code == 202
    assert Upload.objects.filter(job__external_id="keep").count() == 2
    assert Upload.objects.get(pk=good).status == "parsed"
    assert Upload.objects.get(pk=good).blob.read()  # the artifact is still in storage


def test_the_blob_lives_in_storage_not_in_the_row(upload):
    text = rank_log(TWO_RANKS, 0)
    row = Upload.objects.get(pk=upload(text).json()["id"])
    assert row.blob.name.startswith("uploads/")
    with row.blob.open("rb") as f:
        assert f.read() == text.encode()


def test_events_keep_the_line_they_came_from(upload):
    text = "noise\n" * 10 + rank_log(TWO_RANKS, 0)
    upload_id = upload(text).json()["id"]
    timeout = Event.objects.get(upload_id=upload_id, kind="watchdog_timeout")
    lines = text.splitlines()
    assert "Watchdog caught collective operation timeout" in lines[timeout.line - 1]
    assert timeout.attrs["seq"] == 812
