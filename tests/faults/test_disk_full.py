"""The artifact disk is full: a clear 507, nothing half-written, and room again works again.

The artifact directory is a 256 KiB tmpfs, so the disk really fills: the kernel answers ENOSPC
part-way through writing the blob."""

from __future__ import annotations

import os
import secrets
import subprocess
from pathlib import Path

import pytest

from .stack import json_of

pytestmark = pytest.mark.slow


@pytest.fixture
def small_artifact_disk(stack):
    """``<data dir>/artifacts`` (where local artifacts go) as a 256 KiB tmpfs."""
    mount_point = stack.data_dir / "artifacts"
    mount_point.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(mount_point)],
        capture_output=True,
        text=True,
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here (needs root): {mounted.stderr.strip()}")
    try:
        yield mount_point
    finally:
        stack.stop_all()  # nothing may hold a file in it any more
        subprocess.run(["umount", str(mount_point)], check=True)


def files_under(root: Path) -> list[str]:
    return sorted(
        os.path.relpath(os.path.join(d, f), root) for d, _, names in os.walk(root) for f in names
    )


def test_an_upload_bigger_than_the_free_space_is_refused_507_and_leaves_nothing(
    stack, small_artifact_disk
):
    web = stack.gunicorn(stack.env(), workers=1)
    db = stack.database
    # Random hex, so that it is a text log that no filesystem compresses: 640 KB.
    too_big = "".join(f"step {i} {secrets.token_hex(32)}\n" for i in range(8000)).encode()

    response = web.upload(stack.key, too_big, filename="big.log", host="gpu-d1", job="job-full")
    assert response.status == 507, json_of(response)
    assert "artifact storage is full" in json_of(response)["detail"]
    assert int(response.headers["Retry-After"]) > 0  # the agent keeps the file and comes back
    assert files_under(small_artifact_disk) == []  # no blob, no partial file
    assert db.value("SELECT count(*) FROM ingest_upload") == 0

    small = b"step 1 loss 2.0\nstep 2 loss 1.9\nTraining complete.\n"
    response = web.upload(stack.key, small, filename="small.log", host="gpu-d1", job="job-full")
    assert response.status == 202, json_of(response)
    [(blob, size)] = db.rows("SELECT blob, size FROM ingest_upload")
    assert (small_artifact_disk / blob).read_bytes() == small
    assert size == len(small)
    assert files_under(small_artifact_disk) == [blob]


def test_a_request_body_that_fills_the_upload_spool_is_refused_507_and_leaves_nothing(
    stack, small_artifact_disk
):
    # Bodies over 2 MiB are spooled to FLEETWATCH_UPLOAD_TMP while the request is read: here the
    # same small tmpfs, so the disk fills before the upload code even runs.
    web = stack.gunicorn(stack.env(FLEETWATCH_UPLOAD_TMP=str(small_artifact_disk)), workers=1)
    too_big = "".join(f"step {i} {secrets.token_hex(32)}\n" for i in range(40_000)).encode()

    response = web.upload(stack.key, too_big, filename="big.log", host="gpu-d2", job="job-full")
    assert response.status == 507, json_of(response)
    assert "no room" in json_of(response)["detail"]
    assert int(response.headers["Retry-After"]) > 0
    assert files_under(small_artifact_disk) == []
    assert stack.database.value("SELECT count(*) FROM ingest_upload") == 0
