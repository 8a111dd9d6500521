"""Profiler traces: the streaming summary, both NCCL kernel namings, summaries as input."""

from __future__ import annotations

import gzip
import json

import pytest

from ingest.parsers import parse_artifact
from ingest.parsers import trace as trace_module
from ingest.parsers.trace import MAX_POINTS, TraceError, summarize_trace


def _trace(steps=4, kernel="ncclDevKernel_AllReduce_Sum_f32_RING_LL", rank=2):
    events = [{"ph": "M", "name": "process_name", "pid": 1, "args": {"name": "python"}}]
    t = 1000.0
    for step in range(steps):
        events.append(
            {
                "ph": "X",
                "cat": "user_annotation",
                "name": f"ProfilerStep#{step}",
                "ts": t,
                "dur": 100.0,
                "pid": 1,
                "tid": 1,
            }
        )
        events.append(
            {
                "ph": "X",
                "cat": "user_annotation",
                "name": "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__",
                "ts": t + 1,
                "dur": 10.0,
                "pid": 1,
                "tid": 1,
            }
        )
        events.append(
            {
                "ph": "X",
                "cat": "kernel",
                "name": "sm80_xmma_gemm",
                "ts": t + 20,
                "dur": 30.0,
                "pid": 0,
                "tid": 7,
            }
        )
        events.append(
            {
                "ph": "X",
                "cat": "kernel",
                "name": kernel,
                "ts": t + 60,
                "dur": 20.0,
                "pid": 0,
                "tid": 8,
                "args": {},
            }
        )
        events.append(
            {
                "ph": "X",
                "cat": "cpu_op",
                "name": "record_param_comms",
                "ts": t + 55,
                "dur": 2.0,
                "pid": 1,
                "tid": 1,
                "args": {"Seq": step + 1, "Collective name": "allreduce"},
            }
        )
        t += 100.0
    return {
        "schemaVersion": 1,
        "distributedInfo": {"rank": rank, "world_size": 8},
        "traceEvents": events,
        "traceName": "x",
    }


@pytest.mark.parametrize(
    "kernel", ["ncclKernel_AllReduce_RING_LL_Sum_float", "ncclDevKernel_AllReduce_Sum_f32_RING_LL"]
)
def test_both_nccl_kernel_namings_count_as_communication(kernel):
    summary = summarize_trace(json.dumps(_trace(kernel=kernel)).encode())
    assert summary["comm_kernels"] == 4 and summary["comm_us"] == pytest.approx(80.0)
    assert summary["compute_us"] == pytest.approx(120.0)
    # GPU span: first kernel at 1020, last ends at 1380: 360 us, 200 busy.
    assert summary["idle_us"] == pytest.approx(160.0)
    assert summary["steps"] == 4 and summary["step_ms"] == [0.1] * 4
    assert summary["comm_ms_per_step"] == [0.02] * 4
    assert summary["dataloader_ms_per_step"] == [0.01] * 4
    assert summary["rank"] == 2
    assert [c[0] for c in summary["collectives"]] == [1, 2, 3, 4]


def test_the_stream_survives_tiny_read_blocks(monkeypatch):
    raw = json.dumps(_trace(steps=20), indent=1).encode()
    expected = summarize_trace(raw)
    monkeypatch.setattr(trace_module, "BLOCK", 7)
    assert summarize_trace(raw) == expected


def test_a_long_run_keeps_a_bounded_step_series():
    summary = summarize_trace(json.dumps(_trace(steps=3000)).encode())
    assert summary["steps"] == 3000
    assert len(summary["step_ms"]) <= 2 * MAX_POINTS and summary["step_bucket"] >= 8
    assert summary["step_ms"][0] == pytest.approx(0.1)
    assert len(json.dumps(summary)) < 40_000


def test_gzip_traces_and_summaries_both_parse_as_trace_kind():
    raw = json.dumps(_trace()).encode()
    from_gz = parse_artifact(gzip.compress(raw), source="node1/rank2.pt.trace.json.gz")
    (event,) = from_gz.events
    assert event.kind == "trace_summary" and event.rank == 2 and event.steps == 4
    summary = json.dumps(summarize_trace(raw)).encode()
    (again,) = parse_artifact(summary, source="rank2.summary.json").events
    assert again == event.__class__(**{**_fields(event), "source": "rank2.summary.json"})


def _fields(event):
    import dataclasses

    return {f.name: getattr(event, f.name) for f in dataclasses.fields(event)}


def test_damaged_traces_give_an_issue():
    raw = json.dumps(_trace()).encode()
    for bad in (raw[: len(raw) // 2], b'{"traceEvents": [1, 2', gzip.compress(raw)[:50]):
        parsed = parse_artifact(bad, kind="trace", source="rank0.trace.json")
        assert parsed.events == () and parsed.issues
    with pytest.raises(TraceError):
        summarize_trace(b'{"traceEvents": [{"ph": "X"} {"ph": "X"}]}')


def test_a_real_gloo_trace_summarises(jobs):
    path = jobs["sync_logging"] / "trace_rank0.pt.trace.json.gz"
    (event,) = parse_artifact(path.read_bytes(), source=str(path)).events
    # Timing on a loaded 2-core machine varies: assert the shape, not exact figures.
    assert event.rank == 0 and event.steps >= 6 and not event.gpu
    assert event.comm_us > 0 and event.comm_calls > 0
    assert event.io_us > 0  # the fsync'd log writes, seen through with_stack frames
    # The log rewritten each step grows 16x from step 1 to step 7: its write time must grow.
    assert max(event.io_ms_per_step[-2:]) > min(event.io_ms_per_step[:2])


@pytest.fixture(scope="session")
def jobs():
    from tests.torchjobs.artifacts import job_artifacts

    return job_artifacts()


def test_gloo_collective_calls_are_kept_in_order_on_the_unix_clock():
    # gloo traces have no record_param_comms: the c10d:: calls are kept with their order among
    # the group collectives (p2p calls have their own sequence in the recorder, so they neither
    # appear nor take a number), and the clock base is kept.
    events = []
    for i, name in enumerate(
        ["c10d::allreduce_", "c10d::send", "c10d::broadcast_", "c10d::barrier"]
    ):
        events.append({"ph": "X", "cat": "cpu_op", "name": name, "ts": 100.0 + i, "dur": 0.5})
    trace = {"baseTimeNanoseconds": 1_795_000_000_000_000_000, "traceEvents": events}
    summary = summarize_trace(json.dumps(trace).encode())
    assert summary["calls"] == [
        [0, 100.0, 0.5, "allreduce_"],
        [1, 102.0, 0.5, "broadcast_"],
        [2, 103.0, 0.5, "barrier"],
    ]
    assert summary["comm_calls"] == 4 and summary["clock_base_us"] == 1_795_000_000_000_000.0
    (event,) = parse_artifact(json.dumps(summary).encode(), source="rank1.summary.json").events
    assert event.calls[1] == (1, 102.0, 0.5, "broadcast_")
    assert event.clock_base_us == 1_795_000_000_000_000.0


def test_record_param_comms_keeps_its_group_and_old_four_field_rows_still_read():
    summary = summarize_trace(json.dumps(_trace()).encode())
    assert summary["collectives"][0] == [1, 1055.0, 2.0, "allreduce", ""]
    summary["collectives"] = [[7, 1.0, 2.0, "allreduce"], ["x", 1, 2, "bad"]]
    (event,) = parse_artifact(json.dumps(summary).encode(), source="rank2.summary.json").events
    assert event.collectives == ((7, 1.0, 2.0, "allreduce", ""),)
