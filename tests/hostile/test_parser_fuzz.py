"""Whatever bytes an agent (or an attacker holding an agent's key) uploads, every parser entry
point returns: arbitrary bytes, and documents shaped like the real formats with every value of
the wrong type, out of range, NaN, NUL or a lone surrogate. And whatever a parser returns can
be stored: the event columns hold no NUL, no surrogate, no NaN, no rank a column cannot hold."""

from __future__ import annotations

import gzip
import json
import math
import pickle

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ingest.parsers.artifact import parse_artifact
from ingest.parsers.events import MAX_STORED_INT, event_row
from ingest.parsers.hw_stats import parse_hw_stats
from ingest.parsers.log import parse_log
from ingest.parsers.trace import SUMMARY_FORMAT

KINDS = ["", "log", "fr_dump", "trace", "hw_stats", "unknown"]
NAMES = ["rank3.log", "nccl_trace_rank_3.pkl", "fr-rank2.json", "trace_rank1.pt.trace.json", "x"]
FUZZ = settings(
    max_examples=150,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

# Values crafted input carries: every JSON type, numbers past 64 bits and past float range,
# NaN and infinities (json.dumps writes them, json.loads reads them), NUL, lone surrogates.
NASTY_TEXT = ["", "\x00", "\ud800", "a\udfffb", "<script>alert(1)</script>", "9" * 5000, "1e999"]
scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**80), max_value=2**80),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=12),
    st.sampled_from(NASTY_TEXT),
)


SHORT_KEYS = st.text(max_size=6)


def values(keys=SHORT_KEYS):
    return st.recursive(
        scalars,
        lambda inner: st.lists(inner, max_size=4) | st.dictionaries(keys, inner, max_size=4),
        max_leaves=16,
    )


def records(keys: list[str], names: list[str]):
    """Objects with the format's own keys, holding its own strings or anything at all."""
    value = st.one_of(values(), st.sampled_from(names))
    return st.dictionaries(st.sampled_from(keys) | st.text(max_size=4), value, max_size=8)


FR_ENTRY_KEYS = [
    "record_id", "pg_id", "process_group", "collective_seq_id", "seq_id", "p2p_seq_id",
    "profiling_name", "time_created_ns", "input_sizes", "input_dtypes", "output_sizes",
    "output_dtypes", "state", "timeout_ms", "is_p2p", "frames", "retired",
]  # fmt: skip
FR_STRINGS = ["nccl:all_reduce", "gloo:send", "completed", "started", "scheduled", "0", "2.10"]
fr_dumps = st.fixed_dictionaries(
    {
        "version": st.sampled_from(["2.3", "2.10", "9.9"]) | values(),
        "entries": st.lists(records(FR_ENTRY_KEYS, FR_STRINGS), max_size=6) | values(),
    },
    optional={
        "pg_config": st.dictionaries(st.sampled_from(["0", "1", ""]), values()) | values(),
        "pg_status": st.dictionaries(st.sampled_from(["0", "1"]), values()) | values(),
    },
)

TRACE_KEYS = ["ph", "name", "ts", "dur", "cat", "args", "tid", "pid"]
TRACE_STRINGS = [
    "X", "kernel", "ProfilerStep#3", "ncclDevKernel_AllReduce", "ncclKernel_Send",
    "gloo:all_reduce", "record_param_comms", "c10d::allreduce_",
    "enumerate(DataLoader)#_Iter.__next__", "cuda_runtime", "cudaStreamSynchronize",
    "python_function", "torch.save",
]  # fmt: skip
raw_traces = st.fixed_dictionaries(
    {"traceEvents": st.lists(records(TRACE_KEYS, TRACE_STRINGS), max_size=8)},
    optional={"distributedInfo": values(), "deviceProperties": values(), "host_name": values()},
)
SUMMARY_KEYS = [
    "rank", "world_size", "host", "steps", "first_step", "last_step", "step_bucket", "step_ms",
    "comm_ms_per_step", "dataloader_ms_per_step", "io_ms_per_step", "span_us", "gpu",
    "compute_us", "comm_us", "idle_us", "comm_kernels", "comm_calls", "dataloader_us",
    "host_sync_us", "io_us", "collectives",
]  # fmt: skip
summaries = st.dictionaries(st.sampled_from(SUMMARY_KEYS), values(), max_size=10).map(
    lambda d: {"format": SUMMARY_FORMAT, "traceEvents": [], **d}
)

HW_KEYS = [
    "type", "index", "pci", "name", "ecc_uncorrected_volatile", "row_remap", "throttle_reasons",
    "temperature_c", "disks", "device", "port", "state", "reader", "available", "reason",
    "spool_dropped_items", "epoch", "slow_ranks", "slow_links", "verdict", "world_size", "rank",
]  # fmt: skip
HW_TYPES = ["gpu", "nic", "host", "reader", "agent", "data_order", "progress_stall", "probe"]
HW_TYPES += ["collective_failure"]
hw_documents = st.fixed_dictionaries(
    {
        "hw_stats": st.just("fleetwatch.hw_stats/1"),
        "records": st.lists(records(HW_KEYS, HW_TYPES) | values(), max_size=6) | values(),
    },
    optional={"host": values(), "rank": values(), "at": values()},
)


def encoded(doc, how: str) -> bytes:
    if how == "pickle":
        return pickle.dumps(doc, protocol=4)
    body = json.dumps(doc).encode("utf-8", "surrogatepass")
    return gzip.compress(body, mtime=0) if how == "gzip" else body


def assert_storable(result) -> None:
    for event in result.events:
        row = event_row(event)
        assert row["rank"] is None or 0 <= row["rank"] <= MAX_STORED_INT
        assert 0 <= row["line"] <= MAX_STORED_INT
        stored = json.dumps(row, allow_nan=False)  # jsonb refuses NaN; raises if one is left
        stored.encode("utf-8")  # raises on a lone surrogate
        assert "\\u0000" not in stored and "\x00" not in stored
    for issue in result.issues:
        assert issue.message


@FUZZ
@given(st.binary(max_size=3000), st.sampled_from(KINDS), st.booleans(), st.sampled_from(NAMES))
def test_parse_artifact_returns_on_arbitrary_bytes_of_every_kind(raw, kind, packed, name):
    data = gzip.compress(raw, mtime=0) if packed else raw
    result = parse_artifact(data, kind=kind, source=name)
    assert_storable(result)


@FUZZ
@given(
    st.one_of(
        st.tuples(st.just("fr_dump"), fr_dumps, st.sampled_from(["json", "gzip", "pickle"])),
        st.tuples(st.just("trace"), raw_traces | summaries, st.sampled_from(["json", "gzip"])),
        st.tuples(st.just("hw_stats"), hw_documents, st.sampled_from(["json", "gzip"])),
    ),
    st.booleans(),
    st.sampled_from(NAMES),
)
def test_parse_artifact_returns_on_every_format_with_wrong_values(case, detect, name):
    kind, doc, how = case
    result = parse_artifact(encoded(doc, how), kind="" if detect else kind, source=name)
    assert_storable(result)


@FUZZ
@given(hw_documents, st.sampled_from(["json", "gzip"]))
def test_the_hw_stats_parser_reads_wrong_values_as_absent_without_raising(doc, how):
    # Called directly: parse_artifact's guard would hide an exception as an issue.
    result = parse_hw_stats(encoded(doc, how), source="hw.json")
    assert_storable(result)
    for event in result.events:
        for value in event.attrs().values():
            assert not (isinstance(value, float) and not math.isfinite(value)), event
    assert result.complete == isinstance(doc["records"], list)


@FUZZ
@given(values(), st.sampled_from(["json", "gzip"]))
def test_a_hw_stats_document_that_is_not_one_is_unreadable_with_a_reason(doc, how):
    result = parse_hw_stats(encoded(doc, how), source="hw.json")
    if not (isinstance(doc, dict) and isinstance(doc.get("records"), list)):
        assert not result.complete and not result.events
        assert result.issues[0].message.startswith("not a hardware stats document")


@FUZZ
@given(st.lists(st.sampled_from([*NASTY_TEXT, "\n", "[rank99999999999]: ", "Watchdog caught"])))
def test_log_text_with_nul_surrogates_and_huge_ranks_parses_into_storable_events(pieces):
    line = (
        "[rank{r}]:[E ProcessGroupNCCL.cpp:607] [PG 0 Rank 1] Watchdog caught collective "
        "operation timeout: WorkNCCL(SeqNum=5, OpType=ALLREDUCE, Timeout(ms)=600000) ran for "
        "600001 milliseconds before timing out.\n"
    )
    text = "".join(pieces) + line.format(r="99999999999") + "".join(pieces) + line.format(r=1)
    result = parse_log(text.encode("utf-8", "surrogatepass"))
    assert result.of_kind("watchdog_timeout")
    assert_storable(result)
