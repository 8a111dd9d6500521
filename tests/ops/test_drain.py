"""Drain adapters against doubles that record their calls: a fake ``scontrol`` on PATH and a
fake Kubernetes CoreV1Api. No cluster runs here."""

from __future__ import annotations

import json
import os
import stat
import textwrap
from types import SimpleNamespace

import pytest

from fleet.drain import KubernetesAdapter, SlurmAdapter, parse_scontrol_node

IDLE = "NodeName=gpu-a Arch=x86_64 CoresPerSocket=32\n   State=IDLE ThreadsPerCore=2\n"
OURS = (
    "NodeName=gpu-a Arch=x86_64\n   State=IDLE+DRAIN ThreadsPerCore=2\n"
    "   Reason=fleetwatch: xid 79 [slurm@2026-11-20T10:00:00]\n"
)
THEIRS = (
    "NodeName=gpu-a Arch=x86_64\n   State=IDLE+DRAIN ThreadsPerCore=2\n"
    "   Reason=BIOS upgrade, ticket 4411 [root@2026-11-20T09:00:00]\n"
)


@pytest.fixture
def scontrol(tmp_path, monkeypatch):
    """A fake scontrol on PATH: appends its argv to calls.jsonl, prints node.txt for
    ``show node``."""
    calls, node = tmp_path / "calls.jsonl", tmp_path / "node.txt"
    script = tmp_path / "bin" / "scontrol"
    script.parent.mkdir()
    script.write_text(
        textwrap.dedent(
            f"""\
            #!{os.sys.executable}
            import json, sys
            with open({str(calls)!r}, "a") as f:
                f.write(json.dumps(sys.argv[1:]) + "\\n")
            if sys.argv[1:3] == ["show", "node"]:
                print(open({str(node)!r}).read())
            """
        )
    )
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{script.parent}{os.pathsep}{os.environ['PATH']}")

    class Fake:
        def state(self, text: str) -> None:
            node.write_text(text)

        def calls(self) -> list[list[str]]:
            if not calls.exists():
                return []
            return [json.loads(line) for line in calls.read_text().splitlines()]

    return Fake()


def test_scontrol_reason_keeps_its_spaces():
    fields = parse_scontrol_node(THEIRS)
    assert fields["State"] == "IDLE+DRAIN"
    assert fields["Reason"] == "BIOS upgrade, ticket 4411 [root@2026-11-20T09:00:00]"


def test_slurm_drain_reads_the_node_then_drains_it_with_our_reason(scontrol):
    scontrol.state(IDLE)
    outcome = SlurmAdapter().drain("gpu-a", "xid 79", dry_run=False)
    assert outcome.result == "applied"
    assert scontrol.calls() == [
        ["show", "node", "gpu-a"],
        ["update", "NodeName=gpu-a", "State=DRAIN", "Reason=fleetwatch: xid 79"],
    ]


def test_slurm_drain_leaves_someone_elses_drain_alone(scontrol):
    scontrol.state(THEIRS)
    outcome = SlurmAdapter().drain("gpu-a", "xid 79", dry_run=False)
    assert outcome.result == "left_alone"
    assert "BIOS upgrade" in outcome.output
    assert scontrol.calls() == [["show", "node", "gpu-a"]]


def test_slurm_resume_undoes_only_our_drain(scontrol):
    scontrol.state(OURS)
    assert SlurmAdapter().resume("gpu-a", dry_run=False).result == "applied"
    assert scontrol.calls()[-1] == ["update", "NodeName=gpu-a", "State=RESUME"]
    scontrol.state(THEIRS)
    assert SlurmAdapter().resume("gpu-a", dry_run=False).result == "left_alone"
    scontrol.state(IDLE)
    assert SlurmAdapter().resume("gpu-a", dry_run=False).result == "left_alone"
    assert [c[0] for c in scontrol.calls()] == ["show", "update", "show", "show"]


def test_slurm_dry_run_runs_nothing(scontrol):
    scontrol.state(IDLE)
    outcome = SlurmAdapter().drain("gpu-a", "xid 79", dry_run=True)
    assert outcome.result == "dry_run"
    assert outcome.command.startswith("scontrol update NodeName=gpu-a State=DRAIN")
    assert scontrol.calls() == []


def test_slurm_failure_is_reported_not_raised(tmp_path):
    missing = SlurmAdapter(scontrol=str(tmp_path / "false"), run=_fails)
    assert missing.drain("gpu-a", "x", dry_run=False).result == "failed"


def _fails(argv, **kwargs):
    return SimpleNamespace(returncode=1, stdout="", stderr="slurm_load_node error: Invalid node")


@pytest.mark.django_db
def test_api_drain_and_repair_through_slurm_are_audited(scontrol, settings, make_key):
    from rest_framework.test import APIClient

    from analysis.models import DrainAction
    from fleet.drain import drain_resume
    from fleet.models import Host

    settings.FLEETWATCH_DRAIN = "slurm"
    host = Host.objects.create(hostname="gpu-a")
    scontrol.state(IDLE)
    operator = APIClient()
    operator.credentials(HTTP_AUTHORIZATION=f"Bearer {make_key('operate')}")
    body = operator.post("/api/v1/hosts/gpu-a/drain", {"reason": "xid 79"}, format="json").json()
    assert (body["result"], body["dry_run"], body["adapter"]) == ("applied", False, "slurm")
    scontrol.state(OURS)
    resumed = drain_resume(host, by="alice")
    assert (resumed.action, resumed.result, resumed.by) == ("resume", "applied", "alice")
    assert list(DrainAction.objects.order_by("at").values_list("action", "result")) == [
        ("drain", "applied"),
        ("resume", "applied"),
    ]
    assert scontrol.calls()[-1] == ["update", "NodeName=gpu-a", "State=RESUME"]


class FakeCoreV1:
    """Records calls the way kubernetes.client.CoreV1Api would receive them."""

    def __init__(self, unschedulable=False, taints=()):
        self.node = SimpleNamespace(
            spec=SimpleNamespace(
                unschedulable=unschedulable,
                taints=[SimpleNamespace(key=k, value=v, effect=e) for k, v, e in taints],
            )
        )
        self.calls: list[tuple] = []

    def read_node(self, name):
        self.calls.append(("read_node", name))
        return self.node

    def patch_node(self, name, body):
        self.calls.append(("patch_node", name, body))

    def patch_node_status(self, name, body):
        self.calls.append(("patch_node_status", name, body))


def test_kubernetes_drain_cordons_taints_and_sets_a_condition():
    api = FakeCoreV1(taints=[("gpu", "h100", "NoSchedule")])
    assert KubernetesAdapter(api).drain("gpu-a", "xid 79", dry_run=False).result == "applied"
    (_, _), (_, _, spec), (_, _, status) = api.calls
    assert spec["spec"]["unschedulable"] is True
    assert spec["spec"]["taints"] == [
        {"key": "gpu", "value": "h100", "effect": "NoSchedule"},
        {"key": "fleetwatch.io/unhealthy", "value": "true", "effect": "NoSchedule"},
    ]
    condition = status["status"]["conditions"][0]
    assert (condition["type"], condition["status"]) == ("FleetwatchUnhealthy", "True")
    assert condition["message"] == "fleetwatch: xid 79"


def test_kubernetes_leaves_someone_elses_cordon_alone():
    api = FakeCoreV1(unschedulable=True)
    assert KubernetesAdapter(api).drain("gpu-a", "x", dry_run=False).result == "left_alone"
    assert KubernetesAdapter(api).resume("gpu-a", dry_run=False).result == "left_alone"
    assert [c[0] for c in api.calls] == ["read_node", "read_node"]


def test_kubernetes_resume_removes_only_our_taint():
    api = FakeCoreV1(
        unschedulable=True,
        taints=[("gpu", "h100", "NoSchedule"), ("fleetwatch.io/unhealthy", "true", "NoSchedule")],
    )
    assert KubernetesAdapter(api).resume("gpu-a", dry_run=False).result == "applied"
    spec = api.calls[1][2]["spec"]
    assert spec == {
        "unschedulable": False,
        "taints": [{"key": "gpu", "value": "h100", "effect": "NoSchedule"}],
    }
    assert api.calls[2][2]["status"]["conditions"][0]["status"] == "False"


def test_kubernetes_dry_run_and_errors():
    api = FakeCoreV1()
    assert KubernetesAdapter(api).drain("gpu-a", "x", dry_run=True).result == "dry_run"
    assert api.calls == []

    class Broken(FakeCoreV1):
        def patch_node(self, name, body):
            raise RuntimeError("403 Forbidden")

    outcome = KubernetesAdapter(Broken()).drain("gpu-a", "x", dry_run=False)
    assert outcome.result == "failed" and "403" in outcome.output
