"""`fleetwatch diagnose`: files, directories and .gz in; one verdict out; no server, no database."""

import gzip
import json
import os
import subprocess
import sys

import pytest

from fleet.cli import main

TIMEOUT = (
    "[rank{r}]:[E1121 03:12:44.1 ProcessGroupNCCL.cpp:632] [Rank {r}] Watchdog caught collective "
    "operation timeout: WorkNCCL(SeqNum=19, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, "
    "Timeout(ms)=1800000) ran for 1800093 milliseconds before timing out.\n"
)


def logs(tmp_path):
    (tmp_path / "rank0.log").write_text("step 10 loss 1.0\nTraining finished.\n")
    for r in (1, 2):
        (tmp_path / f"rank{r}.log").write_text(TIMEOUT.format(r=r))
    (tmp_path / "rank3.log.gz").write_bytes(gzip.compress(TIMEOUT.format(r=3).encode()))
    return tmp_path


def test_json_output_has_every_documented_field(tmp_path, capsys):
    assert main(["diagnose", "--json", str(logs(tmp_path))]) == 0
    verdict = json.loads(capsys.readouterr().out)
    assert set(verdict) == {
        "culprit",
        "confidence",
        "summary",
        "fix",
        "suspects",
        "evidence",
        "alternatives",
        "ruleset_version",
        "similar",
    }
    assert isinstance(verdict["similar"], list)
    assert verdict["culprit"] == "rank_desync_code"
    assert {"kind": "rank", "id": "0"} in [
        {k: s[k] for k in ("kind", "id")} for s in verdict["suspects"]
    ]
    assert {e["file"].rsplit("/", 1)[-1] for e in verdict["evidence"]} >= {"rank3.log.gz"}
    assert all({"file", "line", "signal", "text"} == set(e) for e in verdict["evidence"])


def test_human_output_names_culprit_fix_and_evidence(tmp_path, capsys):
    assert main(["diagnose", str(logs(tmp_path))]) == 0
    out = capsys.readouterr().out
    assert out.startswith("Culprit:    rank_desync_code")
    assert "Fix:" in out and "Evidence:" in out


def test_a_log_without_a_failure_is_an_honest_unknown_with_exit_0(tmp_path, capsys):
    (tmp_path / "a.log").write_text("step 1 loss 2\n")
    assert main(["diagnose", "--json", str(tmp_path / "a.log")]) == 0
    assert json.loads(capsys.readouterr().out)["culprit"] == "unknown"


def test_a_missing_path_exits_2_with_a_clear_message(tmp_path, capsys):
    assert main(["diagnose", str(tmp_path / "nope")]) == 2
    assert "no such file or directory" in capsys.readouterr().err


def test_an_empty_directory_exits_2(tmp_path, capsys):
    assert main(["diagnose", str(tmp_path)]) == 2
    assert "no files found" in capsys.readouterr().err


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads a file whatever its mode")
def test_an_unreadable_file_exits_2(tmp_path, capsys):
    target = tmp_path / "secret.log"
    target.write_text("x")
    target.chmod(0)
    try:
        assert main(["diagnose", str(target)]) == 2
    finally:
        target.chmod(0o600)
    assert "Permission denied" in capsys.readouterr().err


def test_the_console_script_runs_without_django(tmp_path):
    code = (
        "import sys; from fleet.cli import main; rc = main(['diagnose', sys.argv[1]]); "
        "assert 'django' not in sys.modules, 'django imported'; sys.exit(rc)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, str(logs(tmp_path))],
        capture_output=True,
        text=True,
        env={"PYTHONPATH": "."},
    )
    assert out.returncode == 0, out.stderr
    assert "rank_desync_code" in out.stdout


def test_files_parsed_in_several_processes_give_the_same_verdict(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr("ingest.parsers.artifact.POOL_MIN_BYTES", 0)  # a pool even for 4 files
    assert main(["diagnose", "--json", "--jobs", "1", str(logs(tmp_path))]) == 0
    alone = json.loads(capsys.readouterr().out)
    assert main(["diagnose", "--json", "--jobs", "3", str(tmp_path)]) == 0
    assert json.loads(capsys.readouterr().out) == alone


def test_a_file_that_cannot_be_read_in_a_pool_raises_as_it_would_alone(tmp_path, monkeypatch):
    monkeypatch.setattr("ingest.parsers.artifact.POOL_MIN_BYTES", 0)
    logs(tmp_path)
    (tmp_path / "rank9.log").mkdir()  # a directory where a file was named: read fails
    from ingest.parsers import parse_files

    with pytest.raises(OSError):
        list(parse_files([tmp_path / "rank1.log", tmp_path / "rank9.log"], jobs=2))


def test_diagnose_says_when_events_past_the_bound_were_dropped(tmp_path, capsys):
    from ingest.parsers.log import MAX_EVENTS

    lines = (
        f"n{i % 64}:{1000 + i}:{2000 + i} [0] NCCL INFO comm 0x{i:x} rank {i % 8} nranks 8 "
        f"cudaDev 0 busId 1000 commId 0x{i:x} - Init COMPLETE\n"
        for i in range(MAX_EVENTS + 10_000)
    )
    log = tmp_path / "rank0.log"
    log.write_text("".join(lines))
    assert main(["diagnose", str(log)]) == 0
    err = capsys.readouterr().err
    assert "were dropped" in err and "the newest" in err
