"""The fault matrix on real torch.distributed jobs (gloo, two simulated hosts, torchrun), read as
`fleetwatch diagnose` reads it: the culprit class and rank each planted fault should get, and no
failure for the healthy job. The jobs and what a right verdict says were written blind to the
rules (tests/torchjobs/matrix/README.md)."""

import pytest

pytest.importorskip("torch")

from fleet.cli import diagnose
from tests.torchjobs.matrix_runs import artifact_files, expected, matrix_runs

pytestmark = pytest.mark.slow

# fault -> (what it answers today, the first rank it suspects): measured, not wished. None
# since the torch integration writes a stopped rank's stack: the rank starved before step 0
# (no step lines, not in a collective) shows its main thread waiting on its DataLoader.
KNOWN_MISSES: dict[str, tuple[str, int]] = {}


def rank_suspects(verdict) -> list[int]:
    return [int(s.id) for s in verdict.suspects if s.kind == "rank" and s.id.isdigit()]


@pytest.mark.parametrize("fault", list(expected()))
def test_a_planted_fault_gets_its_culprit_and_rank_and_a_healthy_job_no_failure(fault):
    want = expected()[fault]
    verdict = diagnose([str(p) for p in artifact_files(matrix_runs()[fault])], jobs=1)
    assert verdict.failed == want["failed"], verdict.summary
    if not want["failed"]:
        assert verdict.culprit == "unknown", verdict.summary
        return
    ranks = rank_suspects(verdict)
    if fault in KNOWN_MISSES:
        assert (verdict.culprit, ranks[0] if ranks else None) == KNOWN_MISSES[fault]
        return
    assert verdict.culprit == want["culprit"], verdict.summary
    if want["culprit_rank"] is not None:
        assert ranks[:1] == [want["culprit_rank"]], verdict.suspects


def test_the_integration_sets_flight_recorder_variables_the_running_torch_does_not_warn_about():
    # PyTorch 2.13 prints "Environment variable TORCH_NCCL_TRACE_BUFFER_SIZE is deprecated; use
    # TORCH_FR_BUFFER_SIZE instead" on every rank given the old name.
    logs = [p for d in matrix_runs().values() for p in d.rglob("rank*.log")]
    assert logs
    for path in logs:
        assert "is deprecated; use TORCH_FR" not in path.read_text(errors="replace"), path


def test_the_heartbeats_carry_the_process_groups_timeout_the_job_set():
    # train.py calls init_process_group(timeout=6 s): the agent's stall trigger reads it.
    import json

    beats = [p for d in matrix_runs().values() for p in d.rglob("run/progress/*.json")]
    assert beats
    assert {json.loads(p.read_text()).get("pg_timeout_s") for p in beats} == {6.0}


def test_each_ranks_heartbeat_names_the_log_its_output_goes_to():
    # What lets an agent attribute rank logs when two jobs write into one directory.
    import json

    for outdir in matrix_runs().values():
        for beat_path in outdir.rglob("run/progress/*.json"):
            beat = json.loads(beat_path.read_text())
            host_dir = beat_path.parents[3]
            assert beat["outputs"] == [str((host_dir / f"rank{beat['rank']}.log").resolve())]
