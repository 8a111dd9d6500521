"""Learning from resolutions: an operator's reclassification or noted resolution is a label. It
becomes evidence on the next incident of the same cause, and `manage.py export_corpus` writes
the labelled incidents in the corpus format that `fleetwatch eval --cases` scores."""

import io
import json

import pytest
from django.core.management import call_command

from analysis import services
from analysis.models import Incident
from fleet.cli import main as fleetwatch
from tests.analysis.test_fleet_memory import run_job

pytestmark = pytest.mark.django_db


def test_a_reclassification_is_evidence_on_the_next_incident_of_the_same_cause(upload):
    first = run_job(upload, "sft-a", ["gpu-1", "gpu-bad"], lagging=3, seq=410)
    services.incident_reclassify(
        first, culprit="storage_io", by="alice", note="rank 3 writes checkpoints to NFS"
    )
    second = run_job(upload, "sft-b", ["gpu-2", "gpu-bad"], lagging=3, seq=977)
    assert second.fingerprint and second.fingerprint == first.fingerprint
    label = Incident.objects.get(pk=second.pk).evidence[0]
    assert label["signal"] == "operator_label" and label["incident"] == first.pk
    assert label["text"] == (
        f"reclassified as storage_io on incident {first.pk} by alice: "
        "rank 3 writes checkpoints to NFS"
    )


def test_an_incident_of_another_cause_gets_no_label(upload):
    first = run_job(upload, "sft-a", ["gpu-1", "gpu-bad"], lagging=3, seq=410)
    services.incident_resolve(first, by="alice", note="replaced the GPU")
    other = run_job(upload, "vit-c", ["gpu-7", "gpu-8"], lagging=1, seq=55)
    assert other.fingerprint != first.fingerprint
    assert all(e["signal"] != "operator_label" for e in Incident.objects.get(pk=other.pk).evidence)


def test_labelled_incidents_export_as_a_corpus_that_eval_scores(upload, tmp_path, capsys):
    labelled = run_job(upload, "sft-a", ["gpu-1", "gpu-bad"], lagging=3, seq=410)
    services.incident_reclassify(
        labelled, culprit="storage_io", by="alice", note="rank 3 writes checkpoints to NFS"
    )
    noted = run_job(upload, "sft-b", ["gpu-2", "gpu-3"], lagging=2, seq=977)
    services.incident_resolve(noted, by="bob", note="the job's own bug, fixed in v2")
    unlabelled = run_job(upload, "sft-c", ["gpu-4", "gpu-5"], lagging=1, seq=31)
    services.incident_acknowledge(unlabelled, by="carol")

    out = io.StringIO()
    call_command("export_corpus", str(tmp_path), stdout=out)
    assert "2 labelled incident(s)" in out.getvalue()
    metas = [json.loads(p.read_text()) for p in sorted(tmp_path.glob("*.json"))]
    assert {m["primary"] for m in metas} == {
        "storage_io",
        Incident.objects.get(pk=noted.pk).culprit,
    }
    case = next(m for m in metas if m["primary"] == "storage_io")
    assert case["quote"] == "rank 3 writes checkpoints to NFS"
    assert "alice reclassified it" in case["thread_only"]
    log = (tmp_path / f"{case['id']}.log").read_text()
    assert "[rank3]: " in log and "Watchdog caught collective operation timeout" in log

    capsys.readouterr()
    assert fleetwatch(["eval", "--cases", str(tmp_path), "--json", "--no-perturb"]) == 0
    figures = json.loads(capsys.readouterr().out)
    assert figures["split"] == str(tmp_path)
    assert figures["cases"] == 2


def test_eval_refuses_a_folder_that_is_not_a_corpus_saying_why(tmp_path, capsys):
    (tmp_path / "bad.json").write_text(json.dumps({"id": "bad", "source_url": "x"}))
    assert fleetwatch(["eval", "--cases", str(tmp_path)]) == 2
    assert "bad.json: missing primary" in capsys.readouterr().err
    (tmp_path / "bad.json").write_text(
        json.dumps({"id": "bad", "source_url": "x", "primary": "cosmic_rays"})
    )
    assert fleetwatch(["eval", "--cases", str(tmp_path)]) == 2
    assert "not a culprit class" in capsys.readouterr().err


def test_the_rules_page_shows_each_rules_precision_on_this_fleets_labels(admin_client):
    from fleet.models import Attempt, Job

    def incident(n: int, culprit: str, rule: str) -> Incident:
        job = Job.objects.create(external_id=f"j-{n}")
        return Incident.objects.create(
            attempt=Attempt.objects.create(job=job),
            job=job,
            culprit=culprit,
            matches=[{"rule_id": rule, "culprit": culprit, "confidence": 0.9}],
        )

    kept = incident(1, "oom_or_crash", "rank_crashed_first")
    services.incident_resolve(kept, by="alice", note="the OOM was it: batch halved")
    overturned = incident(2, "oom_or_crash", "rank_crashed_first")
    services.incident_reclassify(overturned, culprit="storage_io", by="bob", note="NFS hung")
    silent = incident(3, "network_transport", "network_errors")
    services.incident_resolve(silent, by="carol")  # no note: no label
    page = admin_client.get("/rules/").content.decode()
    row = page[page.index('id="rule-rank_crashed_first"') :]
    assert "0.50 (1 of 2)" in row[: row.index("</tr>")]
    row = page[page.index('id="rule-network_errors"') :]
    assert "no labels yet" in row[: row.index("</tr>")]
