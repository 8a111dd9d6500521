"""`fleetwatch-agent check` as Slurm's HealthCheckProgram or an NHC check runs it: the host's
verdict from the API (no Django on the node), a drain through scontrol with a `fleetwatch:`
reason, a resume only of a node it drained itself, and fail-open when the API is away. Slurm
is not installed here: `scontrol` and `sinfo` are recording stand-ins on PATH."""

import os
import stat

import pytest

from agents.cli import main
from tests.ops.helpers import incident_on

pytestmark = pytest.mark.django_db(transaction=True)

SINFO = """#!/bin/sh
cat "$FAKE_SLURM/reason" 2>/dev/null || echo none
"""
SCONTROL = """#!/bin/sh
echo "$@" >> "$FAKE_SLURM/calls"
case "$*" in
  *State=DRAIN*) echo "$*" | sed 's/.*Reason=//' > "$FAKE_SLURM/reason" ;;
  *State=RESUME*) echo none > "$FAKE_SLURM/reason" ;;
esac
"""


@pytest.fixture
def slurm(tmp_path, monkeypatch):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, body in (("sinfo", SINFO), ("scontrol", SCONTROL)):
        path = bin_dir / name
        path.write_text(body)
        path.chmod(path.stat().st_mode | stat.S_IXUSR)
    state = tmp_path / "slurm"
    state.mkdir()
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_SLURM", str(state))

    class Slurm:
        def calls(self) -> list[str]:
            path = state / "calls"
            return path.read_text().splitlines() if path.exists() else []

        def set_reason(self, text: str) -> None:
            (state / "reason").write_text(text + "\n")

    return Slurm()


def run_check(tmp_path, server: str, key: str, host: str, *extra: str) -> int:
    (tmp_path / "key").write_text(key)
    config = tmp_path / "agent.toml"
    config.write_text(
        f'[agent]\nserver = "{server}"\nkey_file = "{tmp_path / "key"}"\nhost = "{host}"\n'
        f'spool_dir = "{tmp_path / "spool"}"\nrun_dir = "{tmp_path / "run"}"\n'
    )
    return main(["--config", str(config), "check", *extra])


def test_a_drain_verdict_drains_once_with_a_fleetwatch_reason(
    tmp_path, live_server, make_key, slurm, capsys
):
    incident_on("gpu-bad")
    key = make_key("read")
    assert run_check(tmp_path, live_server.url, key, "gpu-bad", "--drain") == 2
    [call] = slurm.calls()
    assert "NodeName=gpu-bad" in call and "State=DRAIN" in call and "Reason=fleetwatch:" in call
    assert "drained" in capsys.readouterr().out
    # Checked again (HealthCheckInterval): already drained by us, nothing more sent.
    assert run_check(tmp_path, live_server.url, key, "gpu-bad", "--drain") == 2
    assert len(slurm.calls()) == 1


def test_only_a_node_fleetwatch_drained_is_resumed(tmp_path, live_server, make_key, slurm):
    from fleet.models import Host

    Host.objects.create(hostname="gpu-fine")
    key = make_key("read")
    slurm.set_reason("admin: fan replaced, burn-in")
    assert run_check(tmp_path, live_server.url, key, "gpu-fine", "--drain") == 0
    assert slurm.calls() == []  # someone else's drain stays
    slurm.set_reason("fleetwatch: GPU fell off the bus")
    assert run_check(tmp_path, live_server.url, key, "gpu-fine", "--drain") == 0
    assert slurm.calls() == ["update NodeName=gpu-fine State=RESUME"]


def test_without_the_api_it_fails_open_and_touches_nothing(tmp_path, slurm, capsys):
    # Port 9 (discard) on loopback: nothing listens; the connection is refused at once.
    assert run_check(tmp_path, "http://127.0.0.1:9", "k", "gpu-bad", "--drain") == 0
    assert slurm.calls() == []
    assert "failing open" in capsys.readouterr().err


def test_the_nhc_check_fails_on_a_drain_verdict_only(tmp_path, live_server, make_key):
    import subprocess
    import sys
    from pathlib import Path

    from fleet.models import Host

    nhc = Path(__file__).resolve().parents[2] / "agents" / "deploy" / "fleetwatch.nhc"
    incident_on("gpu-bad")
    Host.objects.create(hostname="gpu-fine")
    (tmp_path / "key").write_text(make_key("read"))
    results = {}
    for host in ("gpu-bad", "gpu-fine"):
        config = tmp_path / f"{host}.toml"
        config.write_text(
            f'[agent]\nserver = "{live_server.url}"\nkey_file = "{tmp_path / "key"}"\n'
            f'host = "{host}"\nspool_dir = "{tmp_path / "spool"}"\nrun_dir = "{tmp_path / "run"}"\n'
        )
        # NHC provides die(); here it records what NHC would mark the node offline with.
        script = f'die() {{ echo "DIE $*"; }}; source "{nhc}"; check_fleetwatch; echo "rc=$?"'
        env = {
            "FLEETWATCH_AGENT": str(Path(sys.executable).with_name("fleetwatch-agent")),
            "FLEETWATCH_AGENT_CONFIG": str(config),
        }
        done = subprocess.run(["bash", "-c", script], env=env, capture_output=True, text=True)
        results[host] = done.stdout
    assert "DIE 1 fleetwatch: drain" in results["gpu-bad"] and "rc=1" in results["gpu-bad"]
    assert "DIE" not in results["gpu-fine"] and "rc=0" in results["gpu-fine"]


def test_a_node_someone_else_drained_is_neither_taken_over_nor_resumed(
    tmp_path, live_server, make_key, slurm, capsys
):
    incident_on("gpu-bad")
    key = make_key("read")
    slurm.set_reason("admin: RMA pending")
    assert run_check(tmp_path, live_server.url, key, "gpu-bad", "--drain") == 2
    assert slurm.calls() == []  # the operator's reason stays, so the node stays theirs
    assert "left alone" in capsys.readouterr().out
    # Its reason is not ours, so once the verdict clears it is not resumed either
    # (test_only_a_node_fleetwatch_drained_is_resumed).


def test_a_missing_configuration_fails_open_under_nhc_too(tmp_path, slurm):
    import subprocess
    import sys
    from pathlib import Path

    missing = tmp_path / "nowhere.toml"
    assert main(["--config", str(missing), "check", "--drain"]) == 0
    assert slurm.calls() == []
    nhc = Path(__file__).resolve().parents[2] / "agents" / "deploy" / "fleetwatch.nhc"
    script = f'die() {{ echo "DIE $*"; }}; source "{nhc}"; check_fleetwatch; echo "rc=$?"'
    env = {
        "FLEETWATCH_AGENT": str(Path(sys.executable).with_name("fleetwatch-agent")),
        "FLEETWATCH_AGENT_CONFIG": str(missing),
    }
    done = subprocess.run(["bash", "-c", script], env=env, capture_output=True, text=True)
    assert "DIE" not in done.stdout and "rc=0" in done.stdout


def test_the_health_check_program_drains_with_no_arguments_and_no_path(
    tmp_path, live_server, make_key, slurm
):
    import subprocess
    import sys
    from pathlib import Path

    deploy = Path(__file__).resolve().parents[2] / "agents" / "deploy"
    incident_on("gpu-bad")
    (tmp_path / "key").write_text(make_key("read"))
    config = tmp_path / "agent.toml"
    config.write_text(
        f'[agent]\nserver = "{live_server.url}"\nkey_file = "{tmp_path / "key"}"\n'
        f'host = "gpu-bad"\nspool_dir = "{tmp_path / "spool"}"\nrun_dir = "{tmp_path / "run"}"\n'
    )
    # As slurmd runs HealthCheckProgram: no arguments, no PATH; the exit code is ignored.
    env = {
        "FLEETWATCH_AGENT": str(Path(sys.executable).with_name("fleetwatch-agent")),
        "FLEETWATCH_AGENT_CONFIG": str(config),
        "FLEETWATCH_SLURM_PATH": os.environ["PATH"],  # where the recording scontrol is
        "FAKE_SLURM": os.environ["FAKE_SLURM"],
    }
    done = subprocess.run(
        ["/bin/sh", str(deploy / "slurm-healthcheck.sh")], env=env, capture_output=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    [call] = slurm.calls()
    assert "NodeName=gpu-bad" in call and "State=DRAIN" in call and "Reason=fleetwatch:" in call
