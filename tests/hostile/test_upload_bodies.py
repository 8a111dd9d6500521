"""POST /api/v1/uploads with hostile bodies: gzip bombs that hide, bodies and fields out of
bounds, invalid UTF-8 in the form, file names that try to leave the artifact store. Each gets a
JSON answer that says what is wrong, stores nothing it should not, and loses nothing accepted.
(Plain gzip bombs, truncated gzip, oversized files and a declared oversized body are in
tests/ingest/test_upload_api.py.)"""

from __future__ import annotations

import gzip
import io
import os
import subprocess
import sys
import zlib
from pathlib import Path

import pytest

from fleet.models import Host
from ingest.models import Event, Upload
from tests.hostile.forms import field, file_part, upload_form

pytestmark = pytest.mark.django_db

WATCHDOG = (
    "[rank1]:[E ProcessGroupNCCL.cpp:632] [Rank 1] Watchdog caught collective operation timeout: "
    "WorkNCCL(SeqNum=812, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=600000) ran for "
    "600042 milliseconds before timing out.\n"
)


def zeros_bomb(inflated: int) -> bytes:
    """One gzip member of ``inflated`` zero bytes: about a thousandth of that on the wire."""
    deflate = zlib.compressobj(9, zlib.DEFLATED, 31)
    block = b"\0" * (1 << 20)
    parts = [deflate.compress(block) for _ in range(inflated >> 20)]
    return b"".join([*parts, deflate.flush()])


# --- gzip that hides how much it inflates to -------------------------------------------------


def test_a_gzip_bomb_behind_a_small_first_member_is_refused_before_anything_is_stored(
    post_form, settings
):
    # Every gzip reader (the parsers' too) inflates all members of a concatenated gzip; a check
    # that stopped at the end of the first member would let the bomb through to the parser.
    settings.FLEETWATCH_MAX_INFLATED_BYTES = 1_000_000
    body = gzip.compress(b"training started\n", mtime=0) + zeros_bomb(20 << 20)
    response = post_form(upload_form(body, "rank0.log.gz"))
    assert response.status_code == 413, response.content
    assert "inflates beyond the 1000000 byte limit" in response.json()["detail"]
    assert not Upload.objects.exists() and not Host.objects.exists()


def test_zero_padding_does_not_hide_a_gzip_bomb_either(post_form, settings):
    settings.FLEETWATCH_MAX_INFLATED_BYTES = 1_000_000
    body = gzip.compress(b"x\n", mtime=0) + b"\0" * 4096 + zeros_bomb(20 << 20)
    response = post_form(upload_form(body, "rank0.log.gz"))
    assert response.status_code == 413
    assert not Upload.objects.exists()


def test_concatenated_gzip_within_the_bound_is_accepted_and_every_member_parsed(post_form):
    # What the bound counts is what the parser reads: the event in the third member is found.
    members = [
        gzip.compress(b"step 1 loss 2.0\n" * 1000, mtime=0),
        b"\0" * 512,  # padding between members, which gzip readers skip
        gzip.compress(b"step 2 loss 1.9\n" * 1000, mtime=0),
        gzip.compress(WATCHDOG.encode(), mtime=0),
    ]
    response = post_form(upload_form(b"".join(members), "rank1.log.gz", rank=1))
    assert response.status_code == 202, response.content
    upload = Upload.objects.get(pk=response.json()["id"])
    assert upload.status == "parsed" and upload.compressed
    assert upload.line_count == 2001
    assert Event.objects.get(upload=upload, kind="watchdog_timeout").line == 2001


def test_members_that_inflate_past_one_read_step_are_counted_whole(post_form):
    # Each member inflates to 3 MiB, past the 1 MiB step _scan inflates in: the end of a member
    # falls inside a bounded step, where zlib leaves what follows in two places at once.
    text = b"step 1 loss 2.0 lr 3e-4 tokens/s 81234\n" * 80_000
    members = [gzip.compress(text, mtime=0), gzip.compress(text + WATCHDOG.encode(), mtime=0)]
    response = post_form(upload_form(b"".join(members), "rank1.log.gz", rank=1))
    assert response.status_code == 202, response.content
    upload = Upload.objects.get(pk=response.json()["id"])
    assert upload.status == "parsed" and upload.line_count == 160_001
    assert Event.objects.get(upload=upload, kind="watchdog_timeout").line == 160_001


SCAN_IN_A_CHILD = """
import io, resource, sys, django
# Not a measure of speed (the scan needs well under a second of CPU): a guard that turns the
# endless loop this test is about into a failure instead of a suite that never ends.
resource.setrlimit(resource.RLIMIT_CPU, (30, 30))
resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))
django.setup()
from ingest.services import UploadRejected, _scan
try:
    _scan(io.BytesIO(sys.stdin.buffer.read()))
except UploadRejected as exc:
    print(exc.status, exc)
"""


ONE_STEP_PAST = gzip.compress(b"step 1 loss 2.0\n" * 131_072, mtime=0)  # 2 MiB inflated


@pytest.mark.parametrize(
    ("body", "answer"),
    [
        (gzip.compress(b"x" * (3 << 20), mtime=0) + b"trailing bytes" * 20_000, "400 gzip stream"),
        (ONE_STEP_PAST * 40, ""),  # 40 members in one read block: accepted
    ],
    ids=["trailing bytes", "many members"],
)
def test_a_member_ending_inside_an_inflate_step_is_scanned_once(body, answer):
    # Before the fix the scan spun for ever on both (memory growing by what follows the member
    # each turn); in a child with bounded memory and CPU, a regression fails here instead of
    # hanging the suite.
    root = Path(__file__).resolve().parents[2]
    done = subprocess.run(
        [sys.executable, "-c", SCAN_IN_A_CHILD],
        input=body,
        capture_output=True,
        cwd=root,
        env={**os.environ, "DJANGO_SETTINGS_MODULE": "fleet.settings"},
        check=False,
    )
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    assert done.stdout.decode().startswith(answer)
    assert bool(answer) == bool(done.stdout)


def test_bytes_after_the_last_gzip_member_are_a_corrupt_stream_not_a_silent_cut(post_form):
    # The parsers stop at such bytes; accepting the file would keep only part of it.
    body = gzip.compress(b"step 1\n", mtime=0) + b"not gzip at all, appended by something"
    response = post_form(upload_form(body, "rank0.log.gz"))
    assert response.status_code == 400
    assert "gzip stream is corrupt" in response.json()["detail"]
    assert not Upload.objects.exists()


@pytest.mark.parametrize("kind", ["fr_dump", "trace", "hw_stats"])
def test_a_gzip_inside_a_gzip_is_inflated_once_and_fails_as_unreadable(post_form, kind, settings):
    # The inner bomb would inflate to 20 MB; the bound is 1 MB. Inflated once (what the bound
    # measured) it is gzip bytes, which no parser of these kinds reads as a document.
    settings.FLEETWATCH_MAX_INFLATED_BYTES = 1_000_000
    body = gzip.compress(zeros_bomb(20 << 20), mtime=0)
    response = post_form(upload_form(body, f"rank0.{kind}.gz", kind=kind))
    assert response.status_code == 202, response.content
    upload = Upload.objects.get(pk=response.json()["id"])
    assert upload.status == "failed"
    assert upload.error and upload.event_count == 0


def test_a_gzip_inside_a_gzip_sent_as_a_log_is_refused_as_binary(post_form):
    response = post_form(upload_form(gzip.compress(gzip.compress(b"x\n" * 100)), "r.log.gz"))
    assert response.status_code == 400
    assert "binary" in response.json()["detail"]


# --- bodies and fields out of bounds ---------------------------------------------------------


def test_a_form_field_larger_than_the_form_limit_is_a_413_with_a_json_detail(post_form):
    response = post_form(upload_form(b"x\n", job="j" * (3 << 20)))
    assert response.status_code == 413
    assert response["Content-Type"] == "application/json"
    assert "byte limit" in response.json()["detail"]
    assert not Upload.objects.exists() and not Host.objects.exists()


def test_too_many_form_fields_are_a_400_with_a_json_detail(post_form):
    parts = upload_form(b"x\n") + [field(f"extra{i}", "v") for i in range(1200)]
    response = post_form(parts)
    assert response.status_code == 400
    assert response.json()["detail"] == "too many form fields in one request"
    assert not Upload.objects.exists()


def test_too_many_files_are_a_400_with_a_json_detail(post_form):
    parts = upload_form(b"x\n") + [file_part(f"f{i}.log", b"x\n") for i in range(150)]
    response = post_form(parts)
    assert response.status_code == 400
    assert response.json()["detail"] == "too many files in one request"
    assert not Upload.objects.exists()


@pytest.mark.parametrize(
    ("fields", "named"),
    [
        ({"host": "h" * 10_000}, "host"),
        ({"job": "j" * 100_000}, "job"),
        ({"rank": "9" * 5000}, "rank"),
        ({"rank": "99999999999"}, "rank"),
        ({"attempt": "1" * 100}, "attempt"),
        ({"kind": "k" * 100_000}, "kind"),
    ],
    ids=["host", "job", "rank-digits", "rank-range", "attempt", "kind"],
)
def test_an_oversized_field_is_named_in_a_400_and_nothing_is_stored(post_form, fields, named):
    response = post_form(upload_form(b"x\n", **fields))
    assert response.status_code == 400
    body = response.json()
    assert named in body["errors"] and named in body["detail"]
    assert len(response.content) < 2000  # the answer does not echo the value back
    assert not Upload.objects.exists() and not Host.objects.exists()


def test_a_file_name_longer_than_the_multipart_header_limit_is_a_clear_400(post_form):
    response = post_form(upload_form(b"x\n", "n" * 20_000 + ".log"))
    assert response.status_code == 400
    assert "header size" in response.json()["detail"]
    assert not Upload.objects.exists()


def test_a_long_file_name_is_kept_to_the_column_and_its_extension(post_form):
    response = post_form(upload_form(b"x\n", "n" * 400 + ".log"))
    assert response.status_code == 202
    name = Upload.objects.get().filename
    assert len(name) <= 255 and name.endswith(".log")


# --- invalid UTF-8 in the form ---------------------------------------------------------------


@pytest.mark.parametrize("name", ["host", "job", "rank", "attempt", "kind"])
def test_invalid_utf8_in_a_form_field_is_named_in_a_400(post_form, name):
    parts = [
        p
        for p in upload_form(b"x\n", rank=0, attempt=0, kind="log")
        if f'"{name}"'.encode() not in p[0]
    ]
    response = post_form([*parts, field(name, b"gpu\xff\xfe\xc3")])
    assert response.status_code == 400, response.content
    assert name in response.json()["errors"]
    assert not Upload.objects.exists() and not Host.objects.exists()


def test_a_file_name_of_invalid_utf8_is_a_400_naming_the_file(post_form):
    # Django drops a Content-Disposition it cannot decode, so the part carries no file.
    response = post_form(upload_form(b"x\n", b"rank\xff\xfe.log"))
    assert response.status_code == 400
    assert "file" in response.json()["errors"]
    assert not Upload.objects.exists()


def test_a_percent_encoded_invalid_utf8_file_name_is_stored_replaced(post_form, api):
    # RFC 5987 filename*: decoded with replacement characters, never raw bytes.
    disposition = b"Content-Disposition: form-data; name=\"file\"; filename*=UTF-8''rank%FF%FE.log"
    parts = [(disposition, b"x\n"), field("host", "gpu-001"), field("job", "j")]
    response = post_form(parts)
    assert response.status_code == 202, response.content
    name = Upload.objects.get().filename
    assert name.endswith(".log") and "\ufffd" in name
    name.encode("utf-8")  # storable and showable


# --- file names that try to leave the artifact store -----------------------------------------


def traversal_names(target_dir) -> dict[str, tuple[bytes, str]]:
    """Hostile names -> the name Fleetwatch keeps. ``target_dir`` is where a naive
    implementation that trusted the name would write (relative climbs and absolute paths)."""
    climb = "../" * 30 + str(target_dir).lstrip("/")
    return {
        "relative climb": (b"../../etc/passwd", "passwd"),
        "absolute path": (b"/etc/passwd", "passwd"),
        "windows separators": (b"..\\..\\windows\\system32\\drivers.log", "drivers.log"),
        "climb in the middle": (b"logs/../../../../tmp/x.log", "x.log"),
        "nul byte": (b"rank0.log\x00.sh", "rank0.log.sh"),
        "html entities": (b"&#46;&#46;&#47;&#46;&#46;&#47;y.log", "y.log"),
        "climb to a test directory": (climb.encode() + b"/climbed.log", "climbed.log"),
        "absolute test directory": (str(target_dir).encode() + b"/absolute.log", "absolute.log"),
    }


@pytest.mark.parametrize(
    "case",
    [
        "relative climb",
        "absolute path",
        "windows separators",
        "climb in the middle",
        "nul byte",
        "html entities",
        "climb to a test directory",
        "absolute test directory",
    ],
)
def test_a_file_name_never_chooses_where_the_artifact_is_written(post_form, reader, case, tmp_path):
    hostile, kept = traversal_names(tmp_path)[case]
    content = f"log sent as {case}\n".encode()
    response = post_form(upload_form(content, hostile))
    assert response.status_code == 202, response.content
    upload = Upload.objects.get(pk=response.json()["id"])

    assert upload.filename == kept
    assert not {"/", "\\", "\x00"} & set(upload.filename)
    storage = upload.blob.storage
    root = os.path.realpath(storage.location)
    blob = os.path.realpath(storage.path(upload.blob.name))
    assert os.path.commonpath([root, blob]) == root
    assert upload.blob.name == f"uploads/{upload.sha256[:2]}/{upload.sha256}"
    with upload.blob.open("rb") as f:
        assert f.read() == content
    assert list(tmp_path.iterdir()) == []  # nothing landed where the name pointed
    assert reader.get(f"/api/v1/uploads/{upload.pk}").json()["filename"] == kept


@pytest.mark.parametrize("hostile", [b"..", b".", b"/", b"../"])
def test_a_file_name_that_is_only_a_path_is_refused_naming_the_file(post_form, hostile):
    response = post_form(upload_form(b"x\n", hostile))
    assert response.status_code == 400
    assert "file" in response.json()["errors"]
    assert not Upload.objects.exists()


def test_hostile_bodies_lose_nothing_already_accepted(post_form, settings):
    settings.FLEETWATCH_MAX_INFLATED_BYTES = 1_000_000
    good = post_form(upload_form(WATCHDOG.encode(), "rank1.log", rank=1)).json()["id"]
    post_form(upload_form(gzip.compress(b"x", mtime=0) + zeros_bomb(5 << 20), "b.log.gz"))
    post_form(upload_form(b"x\n", job="j" * (3 << 20)))
    post_form(upload_form(b"x\n") + [field(f"f{i}", "v") for i in range(1200)])
    post_form(upload_form(b"x\n", host="\xff"))
    kept = Upload.objects.get()
    assert kept.pk == good and kept.status == "parsed"
    assert Event.objects.filter(upload=kept, kind="watchdog_timeout").count() == 1
    with kept.blob.open("rb") as f:
        assert f.read() == WATCHDOG.encode()


def test_the_bounds_do_not_refuse_an_ordinary_compressed_log(post_form, settings):
    # The other side of every bound above: a real log, gzip, many lines, goes through.
    settings.FLEETWATCH_MAX_INFLATED_BYTES = 1_000_000
    body = io.BytesIO()
    with gzip.GzipFile(fileobj=body, mode="wb", mtime=0) as f:
        f.write(b"step 1 loss 2.0 lr 3e-4\n" * 20_000 + WATCHDOG.encode())
    response = post_form(upload_form(body.getvalue(), "rank1.log.gz", rank=1))
    assert response.status_code == 202
    assert Upload.objects.get().status == "parsed"


def test_a_zeros_bomb_under_the_default_bounds_is_refused_as_a_bomb_before_it_is_inflated(
    post_form,
):
    # Over DEFLATE's reach for anything but one byte value: refused within the first
    # BOMB_CHECK_AFTER bytes inflated, well inside every bound (4 GiB inflated; what the request
    # inflates), so the size of the bomb beyond that changes nothing.
    from ingest import services

    body = zeros_bomb(4 * services.BOMB_CHECK_AFTER)
    inflated_by_the_check = []
    real = services.zlib.decompressobj

    def counting(*args):
        inflater = real(*args)

        class Counting:
            def __getattr__(self, name):
                return getattr(inflater, name)

            def decompress(self, data, max_length=0):
                out = inflater.decompress(data, max_length)
                inflated_by_the_check.append(len(out))
                return out

        return Counting()

    services.zlib.decompressobj = counting
    try:
        response = post_form(upload_form(body, "rank0.log.gz"))
    finally:
        services.zlib.decompressobj = real
    assert response.status_code == 413, response.content
    assert "decompression bomb" in response.json()["detail"]
    assert sum(inflated_by_the_check) < 2 * services.BOMB_CHECK_AFTER
    assert not Upload.objects.exists()


def test_a_log_that_inflates_past_what_the_request_checks_is_accepted_and_parsed(
    post_form, settings
):
    # One line repeated (about 300x compressed, so no bomb) to more than the request inflates:
    # stored, and the parse reads on to the watchdog line at its end.
    settings.FLEETWATCH_MAX_INFLATED_BYTES = 1 << 40
    settings.FLEETWATCH_REQUEST_INFLATE_BYTES = 4 << 20  # the default (256 MiB) works alike
    line = b"[rank1]:[W ProcessGroupNCCL.cpp:1234] Warning: a flood of one line\n"
    repeat = settings.FLEETWATCH_REQUEST_INFLATE_BYTES * 2 // len(line)
    deflate = zlib.compressobj(6, zlib.DEFLATED, 31)
    parts = [deflate.compress(line * 100_000) for _ in range(repeat // 100_000 + 1)]
    body = b"".join([*parts, deflate.compress(WATCHDOG.encode()), deflate.flush()])
    response = post_form(upload_form(body, "rank1.log.gz"))
    assert response.status_code == 202, response.content
    upload = Upload.objects.get()
    assert upload.compressed and upload.status == Upload.Status.PARSED, upload.error
    assert Event.objects.filter(upload=upload, kind="watchdog_timeout").exists()


@pytest.mark.django_db(transaction=True)
def test_a_chunked_upload_without_a_length_is_a_411_saying_so(live_server, upload_key):
    """Sent straight to the WSGI server (no nginx in front to add the length): the body would
    arrive empty and fail as a missing file; the answer says what is wrong instead."""
    import json
    import socket
    from urllib.parse import urlsplit

    url = urlsplit(live_server.url)
    body = b'--b\r\nContent-Disposition: form-data; name="host"\r\n\r\ngpu-1\r\n--b--\r\n'
    request = (
        b"POST /api/v1/uploads HTTP/1.1\r\n"
        + f"Host: {url.netloc}\r\nAuthorization: Bearer {upload_key}\r\n".encode()
        + b"Content-Type: multipart/form-data; boundary=b\r\nTransfer-Encoding: chunked\r\n"
        b"Connection: close\r\n\r\n" + f"{len(body):x}\r\n".encode() + body + b"\r\n0\r\n\r\n"
    )
    with socket.create_connection((url.hostname, url.port), timeout=30) as sock:
        sock.sendall(request)
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    head, _, payload = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 411"), head
    assert "chunked" in json.loads(payload)["detail"]
    assert not Upload.objects.exists()
