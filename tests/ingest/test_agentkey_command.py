"""manage.py agentkey: the key is printed once, as the last line, and it works."""

import io

import pytest
from django.core.management import CommandError, call_command

pytestmark = pytest.mark.django_db


def run(*args) -> str:
    out = io.StringIO()
    call_command("agentkey", *args, stdout=out)
    return out.getvalue()


def test_create_prints_the_new_key_as_the_last_line_and_it_authenticates(upload):
    key = run("create", "rack-7 agents", "--scopes", "upload,read").strip().splitlines()[-1]
    assert upload("hello\n", key=key).status_code == 202


def test_only_a_hash_of_the_key_is_stored():
    from ingest.models import AgentKey

    key = run("create", "x").strip().splitlines()[-1]
    row = AgentKey.objects.get()
    assert key.split(".")[1] not in row.hashed_key
    assert row.scopes == ["upload"]


def test_an_unknown_scope_is_refused_with_the_valid_choices():
    with pytest.raises(CommandError, match="choose from upload, read, operate"):
        run("create", "x", "--scopes", "upload,admin")


def test_revoke_stops_a_key_from_working(upload):
    from ingest.models import AgentKey

    key = run("create", "old").strip().splitlines()[-1]
    run("revoke", AgentKey.objects.get(name="old").prefix)
    assert upload("x\n", key=key).status_code == 401
    assert "revoked" in run("list")
