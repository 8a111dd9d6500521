"""Values in a Flight Recorder dump or a profiler trace that a parser must read without
raising and without walking more than the file holds: JSON nested past the decoder's limit,
numbers no writer produces, containers where a name belongs, and pickles that name one list
many times over (their memo), so that a few hundred bytes are a structure of 2**40 leaves.
Each returns what could be read, or an issue saying why nothing could."""

from __future__ import annotations

import json
import pickle
import tracemalloc

import pytest

from ingest.parsers.flight_recorder import parse_flight_recorder
from ingest.parsers.trace import SUMMARY_FORMAT, parse_trace

DEEP = 100_000  # far past the JSON decoder's recursion limit, yet a 200 KB file


def nested(depth: int) -> str:
    return "[" * depth + "]" * depth


FR_CASES = {
    "json nested deeper than the decoder's limit": f'{{"version": "2.10", "entries": '
    f"{nested(DEEP)}}}".encode(),
    "pg_config ranks of 5000 digits": json.dumps(
        {"version": "2.10", "entries": [{"pg_id": "0"}], "pg_config": {"0": {"ranks": "9" * 5000}}}
    ).encode(),
    "input_dtypes an object, not a list": json.dumps(
        {"version": "2.10", "entries": [{"pg_id": "0", "input_dtypes": {"a": 1}}]}
    ).encode(),
    "a seq wider than 64 bits": pickle.dumps(
        {"version": "2.10", "entries": [{"process_group": ["0", ""], "collective_seq_id": 10**40}]}
    ),
    "an int of 5000 digits where a name belongs": pickle.dumps(
        {"version": "2.10", "entries": [{"pg_id": "0", "profiling_name": 10**5000}]}
    ),
}


@pytest.mark.parametrize("dump", FR_CASES.values(), ids=FR_CASES.keys())
def test_the_flight_recorder_parser_reads_or_refuses_without_raising(dump):
    result = parse_flight_recorder(dump, source="fr_rank0.json")
    assert result.events or result.issues


def test_deep_json_in_a_dump_is_refused_saying_why():
    result = parse_flight_recorder(FR_CASES["json nested deeper than the decoder's limit"])
    assert not result.complete
    assert "nested too deeply" in result.issues[0].message


def test_group_members_keep_only_what_can_be_a_rank():
    dump = {
        "version": "2.10",
        "entries": [{"process_group": ["0", "default_pg"], "collective_seq_id": 1}],
        "pg_config": {"0": {"desc": "default_pg", "ranks": f"[0, 1, {'9' * 5000}, 123456789]"}},
    }
    (frontier, _) = parse_flight_recorder(json.dumps(dump).encode(), source="r0.json").events
    assert frontier.members == "0-1"


TRACE_CASES = {
    "raw trace nested deeper than the decoder's limit": b'{"traceEvents": ['
    + b'{"a":' * DEEP
    + b"1"
    + b"}" * DEEP
    + b"]}",
    "summary nested deeper than the decoder's limit": f'{{"format": "{SUMMARY_FORMAT}", '
    f'"traceEvents": [], "x": {nested(DEEP)}}}'.encode(),
    "summary collective seq infinite": f'{{"format": "{SUMMARY_FORMAT}", "traceEvents": [], '
    '"collectives": [[Infinity, 1, 2, "x"]]}'.encode(),
    "summary numbers NaN and too wide": f'{{"format": "{SUMMARY_FORMAT}", "traceEvents": [], '
    f'"comm_us": NaN, "steps": {10**400}, "step_ms": [1, Infinity, -Infinity, NaN, 2], '
    '"calls": [[1e400, 1, 2, "x"]], "host": ["not", "a", "name"]}'.encode(),
    "raw trace event tid a list": json.dumps(
        {"traceEvents": [{"ph": "X", "name": "gloo:all_reduce", "ts": 1, "tid": [1]}]}
    ).encode(),
}


@pytest.mark.parametrize("trace", TRACE_CASES.values(), ids=TRACE_CASES.keys())
def test_the_trace_parser_reads_or_refuses_without_raising(trace):
    result = parse_trace(trace, source="trace_rank0.json")
    assert result.events or result.issues


def test_a_summary_keeps_its_finite_numbers_and_drops_the_rest():
    result = parse_trace(TRACE_CASES["summary numbers NaN and too wide"], source="r0.json")
    (summary,) = result.events
    assert summary.step_ms == (1.0, 2.0)
    assert summary.comm_us == 0.0 and summary.steps == 0 and summary.calls == ()
    assert summary.host == ""


def shared_references(depth: int) -> list:
    """``depth`` lists, each holding the one before twice: ``depth`` small opcodes in a pickle,
    but 2**depth leaves to anything that walks them (json.dumps, str): a pickle "billion
    laughs"."""
    value: list = [1]
    for _ in range(depth):
        value = [value, value]
    return value


def bomb_dump(depth: int) -> bytes:
    x = shared_references(depth)
    entry = {
        "process_group": ["0", "default_pg"],
        "collective_seq_id": 1,
        "profiling_name": x,
        "state": x,
        "input_sizes": x,
        "input_dtypes": [x],
        "frames": [x, {"filename": x, "line": x, "name": x}],
    }
    dump = {"version": x, "entries": [entry], "pg_config": {"0": {"name": x, "ranks": x}}}
    return pickle.dumps(dump, protocol=4)


def peak_bytes_parsing(depth: int) -> int:
    data = bomb_dump(depth)
    assert len(data) < 2000
    tracemalloc.start()
    try:
        result = parse_flight_recorder(data, source="fr_rank0.pkl")
        assert result.events
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_a_pickle_of_shared_references_parses_in_memory_bounded_by_its_size():
    # Each level doubles what a walk of the structure costs; a parse bounded by the pickle's
    # size costs about the same at depth 2 and depth 40 (a walk at 40 would never end).
    small, large = peak_bytes_parsing(2), peak_bytes_parsing(40)
    assert large < 4 * small + (256 << 10), (small, large)
