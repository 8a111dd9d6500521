"""The shipped agent unit, checked by systemd's own tools where they exist: `verify` clean and
`security` exposure at most 4.0 (the old unit ran as root and rated 9.2 UNSAFE)."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

UNIT = Path(__file__).resolve().parents[2] / "agents" / "deploy" / "fleetwatch-agent.service"
ANALYZE = shutil.which("systemd-analyze")

pytestmark = pytest.mark.skipif(ANALYZE is None, reason="systemd-analyze is not installed")


def unit_copy(tmp_path: Path) -> Path:
    # The unit names the installed agent; verify checks that the command exists, so the copy
    # points at this environment's.
    agent = Path(sys.executable).with_name("fleetwatch-agent")
    path = tmp_path / UNIT.name
    path.write_text(UNIT.read_text().replace("/usr/local/bin/fleetwatch-agent", str(agent)))
    return path


def test_the_agent_unit_verifies_clean(tmp_path):
    done = subprocess.run(
        [ANALYZE, "verify", str(unit_copy(tmp_path))], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0 and not done.stderr.strip(), done.stderr


def test_the_agent_unit_exposure_is_at_most_4(tmp_path):
    done = subprocess.run(
        [ANALYZE, "security", "--offline=true", "--threshold=40", str(unit_copy(tmp_path))],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stdout[-600:]
    assert "Overall exposure level" in done.stdout


def test_the_shipped_user_and_run_directory_are_created_as_the_unit_expects(tmp_path):
    # The unit runs as User=fleetwatch and writes /var/tmp/fleetwatch: what creates them is
    # shipped beside it, applied here to a scratch root by systemd's own tools.
    sysusers, tmpfiles = shutil.which("systemd-sysusers"), shutil.which("systemd-tmpfiles")
    if sysusers is None or tmpfiles is None:
        pytest.skip("systemd-sysusers / systemd-tmpfiles are not installed")
    if os.geteuid() != 0:
        pytest.skip("systemd-tmpfiles sets root's ownership: it needs root, even on a scratch root")
    deploy = UNIT.parent
    (tmp_path / "etc").mkdir()
    for tool, name in ((sysusers, "sysusers"), (tmpfiles, "tmpfiles")):
        args = [tool, f"--root={tmp_path}", str(deploy / f"fleetwatch-agent.{name}")]
        if name == "tmpfiles":
            args.insert(1, "--create")
        done = subprocess.run(args, capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
    users = (tmp_path / "etc" / "passwd").read_text().splitlines()
    unit = UNIT.read_text()
    assert any(line.startswith("fleetwatch:") for line in users) and "User=fleetwatch" in unit
    run_dir = tmp_path / "var" / "tmp" / "fleetwatch" / "run"
    assert run_dir.is_dir() and run_dir.stat().st_mode & 0o1777 == 0o1777
