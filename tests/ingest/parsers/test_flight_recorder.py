"""Flight Recorder dumps: the safe loader, every format version, file naming, real dumps."""

from __future__ import annotations

import gzip
import json
import os
import pickle

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ingest.parsers import parse_artifact
from ingest.parsers.flight_recorder import (
    KEEP_PER_PG,
    UnsafeDump,
    compact_ranks,
    expand_ranks,
    load_dump,
    parse_flight_recorder,
    rank_from_name,
)


def _entry(seq, op="all_reduce", *, pg=("0", "default_pg"), state="scheduled", **extra):
    entry = {
        "record_id": seq - 1,
        "pg_id": 0,
        "process_group": pg,
        "collective_seq_id": seq,
        "p2p_seq_id": 0,
        "op_id": seq,
        "profiling_name": f"nccl:{op}",
        "time_created_ns": 1_000 + seq,
        "input_sizes": [[1024]],
        "output_sizes": [[1024]],
        "input_dtypes": ["Float"],
        "output_dtypes": ["Float"],
        "state": state,
        "frames": [{"name": "train_step", "filename": "train.py", "line": 10 + seq}],
    }
    entry.update(extra)
    return entry


def _dump(version="2.10", n=5, **extra):
    dump = {
        "version": version,
        "pg_config": {"0": {"name": "0", "desc": "default_pg", "ranks": "[0, 1, 2, 3]"}},
        "entries": [_entry(i) for i in range(1, n + 1)],
    }
    dump.update(extra)
    return dump


def test_a_malicious_pickle_is_refused_with_a_clear_error_and_runs_nothing(tmp_path):
    marker = tmp_path / "ran"

    class Touch:
        def __reduce__(self):
            return (os.system, (f"touch {marker}",))

    payload = pickle.dumps({"version": "2.10", "entries": [Touch()]}, protocol=4)
    with pytest.raises(UnsafeDump, match=r"refused.*(posix|os)\.system"):
        load_dump(payload)
    parsed = parse_artifact(payload, source="rank0.pkl")
    assert parsed.events == ()
    assert "refused" in parsed.issues[0].message
    assert not marker.exists()


@pytest.mark.parametrize("protocol", [2, 3, 4, 5])
def test_every_pickle_protocol_of_plain_data_loads(protocol):
    dump = _dump()
    assert load_dump(pickle.dumps(dump, protocol=protocol))["entries"][0]["process_group"] == (
        "0",
        "default_pg",
    )


def test_truncated_and_garbage_dumps_give_issues_not_exceptions():
    raw = pickle.dumps(_dump())
    for bad in (raw[: len(raw) // 2], b"\x80\x04garbage", b"{not json", b"[1, 2]", b""):
        parsed = parse_flight_recorder(bad, source="rank3.pkl")
        assert parsed.events == ()
        assert parsed.issues and not parsed.complete


@settings(max_examples=60, deadline=None)
@given(st.binary(max_size=400))
def test_arbitrary_bytes_never_raise(data):
    parse_flight_recorder(b"\x80\x04" + data, source="rank0.pkl")
    parse_flight_recorder(data, source="rank0.json")


@pytest.mark.parametrize(
    ("name", "rank"),
    [
        ("nccl_trace_rank_3", 3),
        ("dumps/host-a/nccl_trace_rank_12", 12),
        ("fr_dump_node07_rank5.json", 5),
        ("trace-rank-7.pkl.gz", 7),
        ("host-b/flight_recorder_2.pkl", 2),
        ("host1/dump_15", 15),
        ("no_rank_here.pkl", None),
    ],
)
def test_the_rank_comes_from_any_file_naming(name, rank):
    assert rank_from_name(name) == rank


def test_compact_ranks_round_trip():
    ranks = [0, 1, 2, 3, 8, 10, 11]
    assert compact_ranks(ranks) == "0-3,8,10-11"
    assert expand_ranks(compact_ranks(ranks)) == ranks


def test_version_2_10_json_with_string_status():
    dump = _dump(
        pg_status={
            "0": {
                "last_enqueued_collective": "5",
                "last_started_collective": "4",
                "last_completed_collective": "3",
            }
        }
    )
    for entry in dump["entries"]:
        del entry["frames"]  # JSON dumps carry no frames
    parsed = parse_artifact(json.dumps(dump).encode(), source="rank1.json")
    (frontier,) = parsed.of_kind("fr_frontier")
    assert (frontier.last_enqueued, frontier.last_started, frontier.last_completed) == (5, 4, 3)
    assert frontier.rank == 1 and frontier.members == "0-3" and frontier.pg_desc == "default_pg"


def test_version_2_3_without_status_or_dtypes_derives_the_frontier_from_entries():
    entries = [_entry(i, state="completed") for i in range(1, 4)] + [_entry(4, state="started")]
    for entry in entries:
        for key in ("input_dtypes", "output_dtypes"):
            del entry[key]
    dump = {"version": "2.3", "pg_config": {"0": {"desc": "default_pg", "ranks": "[0, 1]"}}}
    dump["entries"] = entries
    parsed = parse_flight_recorder(gzip.compress(pickle.dumps(dump)), source="r/rank0.pkl.gz")
    (frontier,) = parsed.of_kind("fr_frontier")
    assert (frontier.last_enqueued, frontier.last_started, frontier.last_completed) == (4, 4, 3)
    assert parsed.issues == ()


def test_an_unknown_version_is_read_but_reported():
    parsed = parse_flight_recorder(pickle.dumps(_dump(version="1.0")), source="rank0.pkl")
    assert parsed.of_kind("fr_frontier")
    assert "not in 2.3-2.10" in parsed.issues[0].message


def test_only_the_entries_near_the_frontier_are_kept():
    parsed = parse_flight_recorder(pickle.dumps(_dump(n=2000)), source="rank0.pkl")
    collectives = parsed.of_kind("fr_collective")
    assert len(collectives) == KEEP_PER_PG
    assert collectives[-1].seq == 2000 and collectives[-1].frames == (
        "train.py:2010 in train_step",
    )
    assert collectives[0].frames == ()  # frames only for the newest entries
    assert parsed.of_kind("fr_frontier")[0].entries == 2000


def test_groups_are_separate_frontiers():
    dump = _dump(n=3)
    dump["pg_config"]["7"] = {"name": "7", "desc": "TP", "ranks": "[0, 1]"}
    dump["entries"] += [_entry(i, pg=("7", "TP")) for i in range(1, 10)]
    frontiers = {
        f.pg: f
        for f in parse_flight_recorder(pickle.dumps(dump), source="rank0").events
        if f.kind == "fr_frontier"
    }
    assert frontiers["0"].last_enqueued == 3 and frontiers["7"].last_enqueued == 9
    assert frontiers["7"].members == "0-1"


# --- real dumps from a gloo job -----------------------------------------------------------------


@pytest.fixture(scope="session")
def jobs():
    from tests.torchjobs.artifacts import job_artifacts

    return job_artifacts()


def test_real_pickle_and_json_dumps_parse(jobs):
    root = jobs["slow_loader"]
    pickled = parse_artifact(
        (root / "host-a" / "nccl_trace_rank_0").read_bytes(), source="host-a/nccl_trace_rank_0"
    )
    as_json = parse_artifact(
        (root / "host-b" / "fr_dump_node-b_rank1.json").read_bytes(),
        source="host-b/fr_dump_node-b_rank1.json",
    )
    for parsed, rank in ((pickled, 0), (as_json, 1)):
        assert parsed.issues == ()
        (frontier,) = parsed.of_kind("fr_frontier")
        assert frontier.rank == rank and frontier.members == "0-2" and frontier.version == "2.10"
        assert frontier.backend == "gloo" and not frontier.tracks_state
    ops = {c.op for c in pickled.of_kind("fr_collective")}
    assert {"all_reduce", "broadcast"} <= ops
    assert any("jobs.py" in c.frames[0] for c in pickled.of_kind("fr_collective") if c.frames)


# --- the fast scan, the dump's own rank, empty dumps --------------------------------------------


def _scan_both(dump, monkeypatch):
    """The fast scan's events and the entry-by-entry scan's, for the same dump."""
    from ingest.parsers import flight_recorder as fr

    raw = pickle.dumps(dump)
    fast = parse_flight_recorder(raw, source="rank0.pkl")

    def refuse(entries):
        raise fr._Irregular

    monkeypatch.setattr(fr, "_scan_fast", refuse)
    return fast, parse_flight_recorder(raw, source="rank0.pkl")


def _mixed_dump():
    dump = _dump(n=40)
    dump["pg_config"]["7"] = {"name": "7", "desc": "TP", "ranks": "[0, 1]"}
    entries = []
    for i in range(1, 41):
        state = "completed" if i < 38 else ("started" if i == 38 else "scheduled")
        entries.append(_entry(i, state=state, timeout_ms=600000))
        if i % 3 == 0:
            entries.append(_entry(i // 3, "all_gather", pg=("7", "TP"), state="completed"))
        if i % 5 == 0:  # p2p entries carry their own seq and never move a group's frontier
            entries.append(_entry(900 + i, "send 0->1", is_p2p=True, state="completed"))
    dump["entries"] = entries
    return dump


def test_the_fast_scan_and_the_entry_by_entry_scan_agree(monkeypatch):
    fast, slow = _scan_both(_mixed_dump(), monkeypatch)
    assert fast.events == slow.events and fast.issues == slow.issues
    frontiers = {f.pg: f for f in fast.of_kind("fr_frontier")}
    assert (frontiers["0"].last_enqueued, frontiers["0"].last_started) == (40, 38)
    assert frontiers["0"].last_completed == 37 and frontiers["0"].timeout_ms == 600000
    assert frontiers["0"].entries == 48 and frontiers["7"].last_enqueued == 13
    # Tails keep each entry's index in the dump.
    assert [c.line for c in fast.of_kind("fr_collective") if c.pg == "7"][-1] == 58


def test_the_one_group_fast_path_keeps_entry_indices_and_states(monkeypatch):
    dump = _dump(n=30)
    for entry in dump["entries"][:27]:
        entry["state"] = "completed"
    dump["entries"][27]["state"] = "started"
    fast, slow = _scan_both(dump, monkeypatch)
    assert fast.events == slow.events
    (frontier,) = fast.of_kind("fr_frontier")
    assert (frontier.last_started, frontier.last_completed) == (28, 27)
    assert [c.line for c in fast.of_kind("fr_collective")] == list(range(14, 30))


def test_irregular_entries_fall_back_to_the_entry_by_entry_scan():
    dump = _dump(n=6)
    dump["entries"][2] = ["not", "a", "mapping"]
    dump["entries"][3]["collective_seq_id"] = "4"  # a string seq, as some writers leave them
    parsed = parse_flight_recorder(pickle.dumps(dump), source="rank0.pkl")
    (frontier,) = parsed.of_kind("fr_frontier")
    assert frontier.last_enqueued == 6 and frontier.entries == 5
    assert any("not a mapping" in issue.message for issue in parsed.issues)


def test_a_dump_that_records_its_rank_needs_no_rank_in_its_name():
    parsed = parse_flight_recorder(pickle.dumps(_dump(rank=5)), source="dumps/host-a/trace.pkl")
    (frontier,) = parsed.of_kind("fr_frontier")
    assert frontier.rank == 5 and parsed.issues == ()
    as_string = parse_artifact(json.dumps(_dump(rank="6")).encode(), source="x/latest.json")
    assert as_string.of_kind("fr_frontier")[0].rank == 6
    nameless = parse_flight_recorder(pickle.dumps(_dump()), source="dumps/host-a/trace.pkl")
    assert nameless.of_kind("fr_frontier")[0].rank is None
    assert "no rank in the dump or its file name" in nameless.issues[0].message


def test_the_dumps_own_rank_wins_over_its_file_name_and_the_conflict_is_reported():
    parsed = parse_flight_recorder(pickle.dumps(_dump(rank=3)), source="rank_1.pkl")
    assert parsed.of_kind("fr_frontier")[0].rank == 3
    assert "records rank 3, its file name says 1" in parsed.issues[0].message


# What torch 2.13 (format 2.10) writes for a rank that recorded no collective yet: no "entries".
EMPTY_JSON_DUMP = (
    b'{"comm_lib_version":"","nccl_comm_state":{},"pg_config":{"":{"desc":"","name":"",'
    b'"ranks":"[0, 1, 2]"}},"pg_status":{},"version":"2.10"}'
)


def test_an_empty_json_dump_is_a_dump_not_a_log():
    from ingest.parsers.detect import detect_kind

    assert detect_kind(EMPTY_JSON_DUMP, "dumps/host-c/latest.json") == "fr_dump"
    assert detect_kind(gzip.decompress(gzip.compress(EMPTY_JSON_DUMP))) == "fr_dump"
    # A trace's distributedInfo carries a pg_config too: still a trace.
    trace_head = b'{"schemaVersion": 1, "distributedInfo": {"pg_config": []}, "traceEvents": ['
    assert detect_kind(trace_head, "rank0.json") == "trace"


def test_an_empty_dump_puts_its_rank_at_seq_zero_so_it_is_named_as_the_one_missing():
    from analysis.classify.crossrank import fr_analyze

    parsed = parse_artifact(EMPTY_JSON_DUMP, source="host-c/fr_rank2.json")
    assert parsed.issues == ()
    (frontier,) = parsed.of_kind("fr_frontier")
    assert (frontier.rank, frontier.pg, frontier.last_enqueued) == (2, "0", 0)
    others = []
    for rank in (0, 1):
        dump = _dump(n=3)
        dump["pg_config"] = {"": {"name": "", "desc": "", "ranks": "[0, 1, 2]"}}
        others += parse_flight_recorder(pickle.dumps(dump), source=f"rank{rank}.pkl").events
    analysis = fr_analyze([*others, *parsed.events])
    assert analysis.culprits == [2]
    assert "never joined collective seq 1" in analysis.findings[0].detail


def test_the_safe_unpickler_is_the_c_unpickler_with_globals_refused():
    # The pure-Python pickle._Unpickler is ~20x slower on a 2,000-entry dump; only find_class
    # and persistent_load are overridden, so every opcode but a global runs in C.
    import _pickle

    from ingest.parsers.flight_recorder import SafeUnpickler

    assert _pickle.Unpickler in SafeUnpickler.__mro__
    # STACK_GLOBAL os.system, then a call: refused at the lookup, before anything could run.
    payload = b"\x80\x04\x8c\x02os\x94\x8c\x06system\x94\x93\x8c\x04true\x94\x85R."
    with pytest.raises(UnsafeDump, match=r"refused.*os\.system"):
        load_dump(payload)
    # A protocol-0 pickle is not taken for a dump at all.
    with pytest.raises(ValueError, match="neither a pickle nor JSON"):
        load_dump(b"cos\nsystem\n(S'true'\ntR.")
