"""Fixtures for hostile-input tests: keys of each scope, hand-built multipart posts, and
uploads whose parse is held back so that the order of parses can be chosen."""

from __future__ import annotations

import pytest


@pytest.fixture
def upload_key(make_key):
    return make_key("upload", name="agent")


@pytest.fixture
def post_form(api, upload_key, django_capture_on_commit_callbacks):
    """POST hand-built multipart parts as an agent; the tasks it enqueues run."""
    from tests.hostile.forms import post_multipart

    def post(parts, *, key=None, path="/api/v1/uploads"):
        with django_capture_on_commit_callbacks(execute=True):
            return post_multipart(api, key or upload_key, parts, path=path)

    return post


@pytest.fixture
def held_upload(api, upload_key, django_capture_on_commit_callbacks):
    """POST an upload but hold its parse back; returns (response, release) where release()
    runs the parse (and what it enqueues) when the test chooses."""
    from django.core.files.uploadedfile import SimpleUploadedFile

    def post(body: bytes, *, name: str, **fields):
        form = {"file": SimpleUploadedFile(name, body), "host": "gpu-001", "job": "job-1"}
        form.update({k: v for k, v in fields.items() if v is not None})
        with django_capture_on_commit_callbacks(execute=False) as held:
            response = api.post(
                "/api/v1/uploads",
                form,
                format="multipart",
                HTTP_AUTHORIZATION=f"Bearer {upload_key}",
            )

        def release():
            with django_capture_on_commit_callbacks(execute=True):
                for callback in held:
                    callback()

        return response, release

    return post
