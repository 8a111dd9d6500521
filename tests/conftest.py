"""Shared fixtures. Django imports stay inside fixtures so pure tests never touch Django."""

from __future__ import annotations

import gzip
import os

import pytest

DB_FIXTURES = frozenset({"db", "transactional_db", "live_server"})


def _uses_db(node, fixturenames) -> bool:
    return bool(DB_FIXTURES & set(fixturenames)) or node.get_closest_marker("django_db") is not None


def pytest_collection_modifyitems(config, items):
    """The PostgreSQL + Redis pass (``make test-services`` sets FLEETWATCH_TEST_PASS=services)
    runs only the tests its backends can change: those with the database or the ``redis``
    marker. The rest (parsers, the core, the agent, the fault stacks that start their own
    services, the real torch jobs) gives the same answer on any backend and runs once, in the
    embedded pass."""
    if os.environ.get("FLEETWATCH_TEST_PASS") != "services":
        return
    keep, same = [], []
    for item in items:
        backend = _uses_db(item, item.fixturenames) or item.get_closest_marker("redis")
        (keep if backend else same).append(item)
    if same:
        config.hook.pytest_deselected(items=same)
        items[:] = keep


def pytest_report_header(config):
    if os.environ.get("FLEETWATCH_TEST_PASS") == "services":
        return "services pass: database and broker tests only (the rest ran in the embedded pass)"
    return None


@pytest.fixture(autouse=True)
def _shared_health_forgotten(request):
    """Each test's database starts afresh, its row ids too: a host health shared by an earlier
    test's rows must not answer for this one's."""
    if _uses_db(request.node, request.fixturenames):
        from fleet.drain import forget_shared_health

        forget_shared_health()
    yield


@pytest.fixture(autouse=True)
def _tasks_run_in_process(request):
    """Tasks run eagerly (and raise) in tests, on both passes; the Redis-worker tests opt out.
    Pure tests (no database) are left alone: they must not even import Django."""
    uses_db = _uses_db(request.node, request.fixturenames)
    if request.node.get_closest_marker("redis") or not uses_db:
        yield
        return
    settings = request.getfixturevalue("settings")
    from fleet.celery import app

    previous = (app.conf.task_always_eager, app.conf.task_eager_propagates)
    app.conf.task_always_eager = True
    app.conf.task_eager_propagates = True
    settings.FLEETWATCH_SETTLE_SECONDS = 0
    yield
    from fleet.celery import eager_countdowns

    eager_countdowns.cancel_all()  # a test's settle timers must not fire into the next test
    app.conf.task_always_eager, app.conf.task_eager_propagates = previous


@pytest.fixture
def make_key(db):
    from ingest.models import AgentKey

    def make(*scopes: str, name: str = "test key") -> str:
        _, key = AgentKey.objects.create_key(name=name, scopes=list(scopes))
        return key

    return make


@pytest.fixture
def api(db):
    from rest_framework.test import APIClient

    return APIClient()


@pytest.fixture
def upload(api, make_key, django_capture_on_commit_callbacks):
    """POST an artifact through the real API and run the tasks it enqueues."""
    default_key = make_key("upload")

    def post(
        body: bytes | str,
        *,
        host="gpu-001",
        job="job-1",
        rank=None,
        attempt=None,
        name="rank.log",
        gz=False,
        key=None,
        kind=None,
    ):
        from django.core.files.uploadedfile import SimpleUploadedFile

        if isinstance(body, str):
            body = body.encode()
        if gz:
            body, name = gzip.compress(body), name + ".gz"
        form = {"file": SimpleUploadedFile(name, body), "host": host, "job": job}
        if rank is not None:
            form["rank"] = rank
        if attempt is not None:
            form["attempt"] = attempt
        if kind is not None:
            form["kind"] = kind
        auth = key if key is not None else default_key
        headers = {"HTTP_AUTHORIZATION": f"Bearer {auth}"} if auth else {}
        with django_capture_on_commit_callbacks(execute=True):
            return api.post("/api/v1/uploads", form, format="multipart", **headers)

    return post


@pytest.fixture
def reader(make_key):
    """A separate client holding a read-scoped key, as a scheduler or dashboard would."""
    from rest_framework.test import APIClient

    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {make_key('read', name='reader')}")
    return client


def services_pass() -> bool:
    return os.environ.get("CELERY_BROKER_URL", "").startswith("redis://")
