"""Property-based API tests (schemathesis) against the OpenAPI schema, in process over WSGI:
no 5xx, and every status code answered is one the schema documents."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings

from tests.ops.helpers import incident_on

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
