"""JSON bodies of the write endpoints (attempt reports, drains, repairs) that are hostile:
nested past the decoder's limit, larger than the body limit, keys a column cannot hold,
values echoed back at any size. Each is a 4xx with a JSON ``detail``; nothing is stored."""

from __future__ import annotations

import json

import pytest

from analysis.models import DrainAction, HostRepair
from fleet.models import Attempt, Host, Job

pytestmark = pytest.mark.django_db

ENDPOINTS = {
    "attempt report": ("/api/v1/attempts", "upload", Attempt),
    "drain": ("/api/v1/hosts/gpu-001/drain", "operate", DrainAction),
    "repaired": ("/api/v1/hosts/gpu-001/repaired", "operate", HostRepair),
}


@pytest.fixture
def post_json(api, make_key):
    Host.objects.create(hostname="gpu-001")

    def post(endpoint: str, body: bytes | str, content_type: str = "application/json"):
        path, scope, _ = ENDPOINTS[endpoint]
        return api.generic(
            "POST",
            path,
            body,
            content_type=content_type,
            HTTP_AUTHORIZATION=f"Bearer {make_key(scope)}",
        )

    return post


def nothing_stored(endpoint: str) -> bool:
    return not ENDPOINTS[endpoint][2].objects.exists() and not Job.objects.exists()


@pytest.mark.parametrize("endpoint", list(ENDPOINTS))
@pytest.mark.parametrize(
    "body",
    [
        "[" * 1_000_000 + "]" * 1_000_000,
        '{"job": "j", "event": "start", "config": ' + '{"a": ' * 200_000 + "1" + "}" * 200_001,
    ],
    ids=["arrays", "objects-inside-a-field"],
)
def test_json_nested_past_the_decoders_limit_is_a_400_not_a_500(post_json, endpoint, body):
    response = post_json(endpoint, body)
    assert response.status_code == 400, response.content[:300]
    assert response.json()["detail"] == "JSON parse error - the body is nested too deeply"
    assert nothing_stored(endpoint)


@pytest.mark.parametrize("endpoint", list(ENDPOINTS))
def test_a_json_body_over_the_limit_is_a_413_with_a_json_detail(post_json, endpoint):
    body = json.dumps({"job": "j", "event": "start", "reason": "r", "note": "x" * (3 << 20)})
    response = post_json(endpoint, body)
    assert response.status_code == 413
    assert response["Content-Type"] == "application/json"
    assert "byte limit" in response.json()["detail"]
    assert nothing_stored(endpoint)


@pytest.mark.parametrize("endpoint", list(ENDPOINTS))
@pytest.mark.parametrize(
    "body",
    [b'{"reason": "\xff\xfe"}', b"\xef\xbb\xbf{", b'{"reason": NaN, "note": Infinity}'],
    ids=["invalid-utf8", "bom-then-cut", "nan"],
)
def test_a_body_that_is_not_json_is_a_400_saying_so(post_json, endpoint, body):
    response = post_json(endpoint, body)
    assert response.status_code == 400, response.content[:300]
    assert response.json()["detail"]
    assert nothing_stored(endpoint)


@pytest.mark.parametrize(
    "config",
    [{"a\x00b": "1"}, {"\ud800": "1"}, {"k" * 101: "1"}, {"": "1"}, {"NCCL\nIB": "1"}],
    ids=["nul", "lone-surrogate", "101-chars", "empty", "newline"],
)
@pytest.mark.parametrize("field", ["config", "versions"])
def test_a_setting_name_a_column_cannot_hold_is_a_400_naming_the_field(post_json, config, field):
    body = json.dumps({"job": "j", "event": "start", field: config})
    response = post_json("attempt report", body)
    assert response.status_code == 400, response.content[:300]
    assert field in response.json()["errors"]
    assert nothing_stored("attempt report")


def test_ordinary_setting_names_are_kept(post_json):
    config = {"NCCL_IB_HCA": "mlx5", "dataloader.num_workers": "4", "k" * 100: "v"}
    body = json.dumps({"job": "j", "event": "start", "config": config, "versions": {"torch": "2"}})
    assert post_json("attempt report", body).status_code == 200
    assert Attempt.objects.get().config == config


@pytest.mark.parametrize(("field", "value"), [("event", "e" * 100_000), ("status", "s" * 100_000)])
def test_an_invalid_choice_is_named_without_echoing_the_value(post_json, field, value):
    body = {"job": "j", "event": "end", "status": "failed", field: value}
    response = post_json("attempt report", json.dumps(body))
    assert response.status_code == 400
    assert field in response.json()["errors"]
    assert len(response.content) < 1000
