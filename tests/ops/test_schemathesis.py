"""Property-based API tests (schemathesis) against the OpenAPI schema, in process over WSGI:
no 5xx, and every status code answered is one the schema documents. The write operations
(multipart uploads, attempt reports, drains, repairs) are fuzzed too, with a key that holds
every scope, their answers held to the documented response schemas, and what an upload
enqueues (its parse, the classification) run, so a fuzzed body goes the whole way."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings

from tests.ops.helpers import flagged_host, incident_on

pytestmark = pytest.mark.django_db


@pytest.fixture
def connections_kept_open():
    """The WSGI app closes the database connection at the end of each request, which would
    end the test's transaction on PostgreSQL; Django's own test client switches that off too."""
    from django.core.signals import request_finished, request_started
    from django.db import close_old_connections

    request_started.disconnect(close_old_connections)
    request_finished.disconnect(close_old_connections)
    yield
    request_started.connect(close_old_connections)
    request_finished.connect(close_old_connections)


def test_read_endpoints_hold_to_their_schema(make_key, connections_kept_open):
    import schemathesis
    from drf_spectacular.generators import SchemaGenerator
    from schemathesis.checks import not_a_server_error
    from schemathesis.specs.openapi.checks import status_code_conformance

    from fleet.wsgi import application

    incident_on("gpu-bad")
    key = make_key("read", "operate")
    document = SchemaGenerator().get_schema(request=None, public=True)
    schema = schemathesis.openapi.from_dict(document)
    schema.app = application
    operations = [r.ok() for r in schema.get_all_operations()]
    ran = 0
    for operation in operations:
        if operation.method.upper() != "GET":
            continue

        @given(case=operation.as_strategy())
        @settings(
            max_examples=8,
            deadline=None,
            database=None,
            suppress_health_check=list(HealthCheck),
        )
        def call(case):
            case.call_and_validate(
                headers={"Authorization": f"Bearer {key}"},
                checks=[not_a_server_error, status_code_conformance],
            )

        call()
        ran += 1
    assert ran >= 8


def _schema():
    import schemathesis
    from drf_spectacular.generators import SchemaGenerator

    from fleet.wsgi import application

    document = SchemaGenerator().get_schema(request=None, public=True)
    schema = schemathesis.openapi.from_dict(document)
    schema.app = application
    return schema


_REQUEST_ID = [0]
_OBJECT_ID = {"incidents": 0, "culprits": 0}
INCIDENT_STEPS = ("acknowledge", "assign", "resolve", "snooze", "reopen")


def _fuzz_write(operation, key: str, run_on_commit) -> set[int]:
    """Fuzz one write operation; the status codes it answered."""
    from schemathesis.checks import not_a_server_error
    from schemathesis.specs.openapi.checks import (
        content_type_conformance,
        response_schema_conformance,
        status_code_conformance,
    )

    seen: set[int] = set()

    @given(case=operation.as_strategy())
    @settings(
        max_examples=40 if operation.path == "/api/v1/uploads" else 25,
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    def call(case):
        # Drain and repair paths mostly name hosts that do not exist (404): half of them name
        # the host the fleet has, so that the write itself is fuzzed too.
        path = case.path_parameters or {}
        if "hostname" in path and len(path["hostname"]) % 2:
            path["hostname"] = "gpu-bad"
        if "id" in path and isinstance(path["id"], int) and path["id"] % 2:
            # The artifact request, incident or culprit that exists.
            kind = operation.path.split("/")[3]
            path["id"] = _OBJECT_ID.get(kind) or _REQUEST_ID[0]
        with run_on_commit(execute=True):  # the parse and classification an upload enqueues
            response = case.call_and_validate(
                headers={"Authorization": f"Bearer {key}"},
                checks=[
                    not_a_server_error,
                    status_code_conformance,
                    content_type_conformance,
                    response_schema_conformance,
                ],
            )
        seen.add(response.status_code)

    if operation.path.endswith("/reopen"):
        # Only a resolved item reopens: resolve the one that exists, so that the step does work.
        from analysis.models import CulpritScore, Incident

        model = Incident if "/incidents/" in operation.path else CulpritScore
        kind = operation.path.split("/")[3]
        model.objects.filter(pk=_OBJECT_ID[kind]).update(status="resolved")
    call()
    return seen


def test_write_endpoints_hold_to_their_schema(
    make_key, connections_kept_open, django_capture_on_commit_callbacks
):
    from django.test import override_settings

    from ingest.models import ArtifactRequest, Upload

    host, incident = incident_on("gpu-bad")
    _REQUEST_ID[0] = ArtifactRequest.objects.create(
        job_id=incident.job_id, attempt_id=incident.attempt_id, host=host, rank=0
    ).pk
    _OBJECT_ID["incidents"] = incident.pk
    _OBJECT_ID["culprits"] = flagged_host("gpu-bad").pk
    key = make_key("upload", "read", "operate")
    statuses = {}
    # Fuzzing sends hundreds of requests with one key: rate limits would only answer 429.
    with override_settings(FLEETWATCH_RATE_LIMITS={}):
        for result in _schema().get_all_operations():
            operation = result.ok()
            if operation.method.upper() == "POST":
                statuses[f"POST {operation.path}"] = _fuzz_write(
                    operation, key, django_capture_on_commit_callbacks
                )
    assert set(statuses) == {
        "POST /api/v1/uploads",
        "POST /api/v1/attempts",
        "POST /api/v1/artifact-requests/{id}/answer",
        "POST /api/v1/hosts/{hostname}/drain",
        "POST /api/v1/hosts/{hostname}/repaired",
        *(f"POST /api/v1/incidents/{{id}}/{step}" for step in INCIDENT_STEPS),
        *(f"POST /api/v1/culprits/{{id}}/{step}" for step in (*INCIDENT_STEPS, "mute")),
    }, statuses
    # Not only refusals: every operation also did its work at least once.
    assert {op: codes for op, codes in statuses.items() if not {200, 202} & codes} == {}
    assert Upload.objects.exclude(status__in=["received", "parsing"]).exists()
