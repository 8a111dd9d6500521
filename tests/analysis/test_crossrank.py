"""Cross-rank diagnosis from real injected-fault gloo jobs, and the analysis on its own."""

from __future__ import annotations

import shutil

import pytest

from analysis.classify import classify
from analysis.classify.crossrank import fr_analyze
from fleet.cli import diagnose
from ingest.parsers.events import GpuXid
from ingest.parsers.flight_recorder import FrCollective, FrFrontier


@pytest.fixture(scope="session")
def jobs():
    from tests.torchjobs.artifacts import job_artifacts

    return job_artifacts()


@pytest.mark.parametrize(
    ("scenario", "culprit", "rank", "rule"),
    [
        ("slow_loader", "dataloader_cpu", "1", "slow_rank_dataloader"),
        ("skip_collective", "rank_desync_code", "2", "fr_collective_mismatch"),
        ("unseeded_split", "rank_desync_code", "1", "fr_rank_ran_more_steps"),
        ("sync_logging", "storage_io", "0", "slow_rank_storage_io"),
    ],
)
def test_a_real_fault_names_its_rank_and_culprit(jobs, scenario, culprit, rank, rule):
    verdict = diagnose([str(jobs[scenario])])
    assert verdict.culprit == culprit, verdict.summary
    assert verdict.failed
    assert verdict.suspects[0].kind == "rank" and verdict.suspects[0].id == rank
    assert rule in verdict.rule_ids
    assert verdict.evidence and all(e.file for e in verdict.evidence)


def test_dumps_alone_name_the_lagging_rank(jobs, tmp_path):
    # Without traces the cause is unknown, but the rank that never joined is named.
    for path in jobs["slow_loader"].rglob("*"):
        if path.is_file() and "trace" in path.name and "nccl_trace" not in path.name:
            continue
        if path.is_file():
            target = tmp_path / path.relative_to(jobs["slow_loader"])
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(path, target)
    verdict = diagnose([str(tmp_path)])
    assert verdict.culprit == "unknown"
    assert verdict.suspects[0].id == "1"
    assert "never joined collective seq" in verdict.summary


def test_a_partial_set_of_dumps_says_which_are_missing(jobs, tmp_path):
    shutil.copy(jobs["skip_collective"] / "flight_recorder_2.pkl", tmp_path / "rank_2.pkl")
    shutil.copy(jobs["skip_collective"] / "host-a" / "nccl_trace_rank_0", tmp_path)
    verdict = diagnose([str(tmp_path)])
    assert verdict.culprit == "rank_desync_code"
    assert "no Flight Recorder dump from group 0: rank 1" in verdict.summary


def _frontier(rank, enqueued, members="0-3", source=""):
    return FrFrontier(
        line=0,
        text=f"rank {rank} at {enqueued}",
        rank=rank,
        source=source,
        pg="0",
        pg_desc="default_pg",
        members=members,
        pg_size=4,
        last_enqueued=enqueued,
        last_started=enqueued,
        last_completed=enqueued - 1,
    )


def _entry(rank, seq, op="all_reduce", dtype="Float"):
    return FrCollective(
        line=seq,
        text=f"rank {rank} seq {seq} {op}",
        rank=rank,
        pg="0",
        pg_desc="default_pg",
        seq=seq,
        op=op,
        input_sizes="[[8]]",
        output_sizes="[[8]]",
        input_dtypes=(dtype,),
        output_dtypes=(dtype,),
    )


def test_a_missing_rank_on_a_host_with_an_xid_is_bad_hardware():
    events = [_frontier(r, 10 if r != 3 else 9) for r in range(4)]
    events.append(
        GpuXid(
            line=5,
            text="NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus",
            rank=3,
            source="node3/kern.log",
            pci="0000:3b:00",
            code=79,
            primary=True,
        )
    )
    verdict = classify(events)
    assert verdict.culprit == "bad_node_hardware"
    assert "fr_missing_rank_hardware" in verdict.rule_ids
    assert verdict.suspects[0].id == "3"


def test_a_dtype_mismatch_blames_the_minority_rank():
    events = [_frontier(r, 5) for r in range(4)]
    events += [_entry(r, s) for r in range(4) for s in range(1, 5)]
    events += [_entry(r, 5, dtype="BFloat16" if r == 2 else "Float") for r in range(4)]
    analysis = fr_analyze(events)
    (finding,) = analysis.findings
    assert finding.kind == "mismatch" and finding.culprits == [2] and finding.seq == 5
    assert "dtype BFloat16" in finding.detail


def test_ranks_without_a_dump_are_the_suspects_when_the_rest_agree():
    events = [_frontier(r, 7) for r in (0, 1, 3)]
    analysis = fr_analyze(events)
    assert analysis.no_dump == {"0": [2]}
    assert analysis.culprits == [2]


def test_a_rank_behind_in_a_subgroup_is_found_in_that_group():
    events = [_frontier(r, 10, members="0-3") for r in range(4)]
    events += [
        FrFrontier(
            line=0,
            text="tp",
            rank=r,
            pg="5",
            pg_desc="TP",
            members="0-1",
            last_enqueued=40 if r == 0 else 38,
        )
        for r in (0, 1)
    ]
    analysis = fr_analyze(events)
    assert [(f.pg, f.culprits) for f in analysis.findings] == [("5", [1])]
