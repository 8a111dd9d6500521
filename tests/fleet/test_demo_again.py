"""`manage.py demo_fleet --again`: the demo fleet's next day, so that an operator who resolved a
culprit sees it come back as a regression (the on-call loop, end to end, on the demo)."""

import io

import pytest
from django.core.management import CommandError, call_command

from analysis import services
from analysis.models import CulpritScore

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_resolved_demo_culprit_comes_back_as_a_regression_when_the_demo_runs_again():
    call_command("demo_fleet", hosts=16, days=2, user="op", stdout=io.StringIO())
    flagged = list(CulpritScore.objects.filter(flagged=True))
    assert flagged
    for score in flagged:
        assert services.culprit_resolve(score, by="op", note="recabled")
    out = io.StringIO()
    call_command("demo_fleet", hosts=16, again=True, stdout=out)
    back = CulpritScore.objects.filter(regressed_at__isnull=False, status="open")
    assert back.exists(), out.getvalue()
    assert all(s.journal[-1]["action"] == "regression" for s in back)
    assert f"{back.count()} resolved culprit(s) reopened" in out.getvalue()


def test_again_needs_a_demo_fleet_first():
    with pytest.raises(CommandError, match="without --again first"):
        call_command("demo_fleet", again=True, stdout=io.StringIO())
