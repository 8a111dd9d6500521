"""Cross-rank diagnosis from real injected-fault gloo jobs, and the analysis on its own."""

from __future__ import annotations

import shutil

import pytest

from analysis.classify import classify
from analysis.classify.crossrank import fr_analyze, last_to_start
from fleet.cli import diagnose
from ingest.parsers import parse_log
from ingest.parsers.events import GpuXid
from ingest.parsers.flight_recorder import FrCollective, FrFrontier
from ingest.parsers.trace import TraceSummary


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


# --- the straggler: which rank starts each collective last ---------------------------------------


def test_a_rank_that_sleeps_before_every_collective_is_named_the_straggler(jobs):
    verdict = diagnose([str(jobs["straggler"])])
    assert "straggler_last_to_start" in verdict.rule_ids
    assert verdict.suspects[0].kind == "rank" and verdict.suspects[0].id == "2"
    assert "rank 2 started" in verdict.summary and "collectives last" in verdict.summary


def test_the_straggler_is_found_by_joining_gloo_calls_to_flight_recorder_seqs(jobs):
    from ingest.parsers import parse_artifact

    events = []
    for path in sorted(p for p in jobs["straggler"].rglob("*") if p.is_file()):
        events += parse_artifact(path.read_bytes(), source=str(path)).events
    traces = [e for e in events if e.kind == "trace_summary"]
    assert all(t.calls and not t.collectives for t in traces)  # gloo: no record_param_comms
    straggler = last_to_start(traces, events)
    assert straggler is not None and straggler.rank == 2
    # The job's first collective is seq 1 in the recorder; 8 steps of 3 collectives each.
    assert straggler.seqs == (1, 24) and straggler.joined == 24
    assert straggler.late_ms > 10
    # Without the recorder, gloo calls have no seq to match ranks by: no answer, not a guess.
    assert last_to_start(traces) is None


def _summary(rank, starts, *, host="node0", calls=False, base=0.0):
    """A trace summary whose collective seq k (k = 1, 2, …) started at starts[k-1] µs."""
    rows = tuple((seq, start, 50.0, "allreduce", "0") for seq, start in enumerate(starts, 1))
    return TraceSummary(
        line=0,
        text=f"rank {rank}",
        rank=rank,
        source=f"rank{rank}.json",
        host=host,
        collectives=() if calls else rows,
        calls=tuple((i, start, 50.0, "allreduce_") for i, start in enumerate(starts))
        if calls
        else (),
        clock_base_us=base,
    )


def test_a_rank_last_into_most_collectives_by_a_clear_margin_is_a_straggler():
    late = {3: 5000.0}  # rank 3 arrives 5 ms after the others, except in one collective
    summaries = []
    for rank in range(4):
        # Otherwise rank 0 is 30 µs behind rank 3: it is last once.
        starts = [k * 1e5 + (3 - rank) * 10 + late.get(rank, 0.0) * (k != 4) for k in range(10)]
        summaries.append(_summary(rank, starts, host=f"node{rank // 2}"))
    straggler = last_to_start(summaries)
    assert (straggler.rank, straggler.last, straggler.joined, straggler.runner_up) == (3, 9, 10, 1)
    assert 4.9 < straggler.late_ms < 5.1 and straggler.hosts == 2
    verdict = classify(summaries)
    assert "straggler_last_to_start" in verdict.rule_ids
    assert "assumes their clocks agree" in verdict.summary  # two hosts: says what it assumes


def test_no_straggler_when_the_last_rank_rotates_or_is_barely_late():
    rotating = [
        _summary(rank, [k * 100_000.0 + (3000.0 if k % 4 == rank else 0.0) for k in range(12)])
        for rank in range(4)
    ]
    assert last_to_start(rotating) is None
    barely = [
        _summary(rank, [k * 100_000.0 + (200.0 if rank == 1 else 0.0) for k in range(12)])
        for rank in range(4)
    ]
    assert last_to_start(barely) is None  # 0.2 ms: below what start order can tell


def test_call_order_becomes_seq_through_the_recorder_entry_created_during_the_call():
    # The profiler window starts at seq 101; each rank's recorder kept its last entries, created
    # 30 µs into the call that enqueued them (Unix ns on the trace clock base + ts).
    base = 1_795_000_000_000_000.0
    summaries, recorded = [], []
    for rank in range(3):
        starts = [k * 50_000.0 + (8000.0 if rank == 1 else 0.0) for k in range(10)]
        summaries.append(_summary(rank, starts, calls=True, base=base))
        for k in range(6, 10):
            recorded.append(
                FrCollective(
                    line=k,
                    text="",
                    rank=rank,
                    pg="0",
                    seq=101 + k,
                    op="all_reduce",
                    time_created_ns=int((base + starts[k] + 30) * 1000),
                )
            )
    straggler = last_to_start(summaries, recorded)
    assert straggler.rank == 1 and straggler.seqs == (101, 110)


def _entry_at(rank, seq, created_s):
    from dataclasses import replace

    return replace(_entry(rank, seq), time_created_ns=int(created_s * 1e9))


def test_a_rank_that_entered_a_whole_timeout_after_its_peers_is_the_one_they_waited_for():
    # Every rank reached seq 300 (nothing is missing), but rank 0 got there 6.1 s after the
    # others, past their 6 s timeout: they had given up before it arrived.
    events = [_frontier(r, 300) for r in range(4)]
    events += [_entry_at(r, 300, 984.16 if r == 0 else 978.05) for r in range(4)]
    (finding,) = fr_analyze(events, limit_s=6.0).findings
    assert (finding.kind, finding.culprits) == ("late", [0])
    # Within the timeout it is no finding; without the timeout, nothing can be said.
    assert not fr_analyze(events, limit_s=7.0).findings
    assert not fr_analyze(events).findings


def _steps(rank: int, times: list[float]):
    """Trainer step lines as a hand-written loop prints them (step_time/data_time)."""
    text = "".join(
        f"[rank{rank}]: step={i} loss=1.25 step_time={t:.3f} data_time=0.002\n"
        for i, t in enumerate(times)
    )
    return list(parse_log(text.encode()).events)


def _never_joined_with(times_by_rank: dict[int, list[float]], laggard: int):
    events = [_frontier(r, 307 if r != laggard else 306) for r in range(4)]
    events += [_entry(r, 307) for r in range(4) if r != laggard]
    for rank, times in times_by_rank.items():
        events += _steps(rank, times)
    return classify(events)


def test_a_loaded_host_slowing_every_rank_alike_does_not_hide_a_rank_that_left_the_path():
    # Every rank's step time includes its waits: a busy machine grows them all together, which
    # says nothing of the rank that never joined.
    grown = [0.03] * 20 + [0.06] * 10
    verdict = _never_joined_with({r: grown for r in range(4)}, laggard=2)
    assert verdict.culprit == "rank_desync_code", verdict.summary
    assert verdict.suspects[0].id == "2"


def test_rank_0_whose_steps_grew_is_left_to_the_logging_rank_reading():
    grown = [0.03] * 20 + [0.09] * 10
    verdict = _never_joined_with({r: grown for r in range(4)}, laggard=0)
    assert "laggard_left_path" not in verdict.rule_ids
    assert verdict.culprit == "storage_io", verdict.summary
