"""What one crafted artifact can make a parser hold: bounded by the format's limits, not by
what the artifact claims. Measured with tracemalloc (Python allocations, this process)."""

from __future__ import annotations

import gzip
import json
import tracemalloc
import zlib

from ingest.parsers import hw_stats
from ingest.parsers.artifact import parse_artifact
from ingest.parsers.log import parse_log


def peak_bytes(work) -> tuple[object, int]:
    tracemalloc.start()
    try:
        result = work()
        return result, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_a_hw_stats_gzip_bomb_is_inflated_no_further_than_the_document_bound():
    deflate = zlib.compressobj(9, zlib.DEFLATED, 31)
    bomb = b"".join(deflate.compress(b"\0" * (1 << 20)) for _ in range(256)) + deflate.flush()
    assert len(bomb) < 1 << 20  # 256 MiB inflated
    result, peak = peak_bytes(lambda: hw_stats.parse_hw_stats(bomb, source="hw.json"))
    assert not result.complete and "larger than" in result.issues[0].message
    assert peak < 4 * hw_stats.MAX_DOCUMENT, peak


def test_a_hw_stats_document_over_the_bound_is_refused_unread():
    body = b'{"records": [' + b'{"type": "agent"},' * (hw_stats.MAX_DOCUMENT // 18) + b"{}]}"
    for data in (body, gzip.compress(body, mtime=0)):
        result = hw_stats.parse_hw_stats(data, source="hw.json")
        assert not result.complete and not result.events
        assert result.issues[0].message.endswith(f"larger than {hw_stats.MAX_DOCUMENT} bytes")


def test_a_hw_stats_document_of_many_records_is_read_to_the_record_bound():
    records = [{"type": "agent", "spool_dropped_items": i} for i in range(50_000)]
    records += [{"type": "nonsense"}] * 50_000
    doc = json.dumps({"hw_stats": "fleetwatch.hw_stats/1", "records": records}).encode()
    result = hw_stats.parse_hw_stats(doc, source="hw.json")
    assert len(result.events) == hw_stats.MAX_RECORDS
    assert result.issues[0].message == f"100000 records: only the first {hw_stats.MAX_RECORDS} read"
    unknown = hw_stats.parse_hw_stats(
        json.dumps({"records": [{"type": "x"}] * 50_000}).encode(), source="hw.json"
    )
    assert len(unknown.issues) == hw_stats.MAX_ISSUES


def test_a_log_of_nothing_but_incident_lines_keeps_a_bounded_number_of_events(monkeypatch):
    # The bound is 100,000 events; at 300 the same code path is shown in a fraction of the time.
    monkeypatch.setattr("ingest.parsers.log.MAX_EVENTS", 300)
    line = (
        b"[rank3]:[E ProcessGroupNCCL.cpp:632] [Rank 3] Watchdog caught collective operation "
        b"timeout: WorkNCCL(SeqNum=812, OpType=ALLREDUCE, Timeout(ms)=600000) ran for 600042 "
        b"milliseconds before timing out.\n"
    )
    result = parse_log(gzip.compress(line * 5000, mtime=0))
    # The first quarter, a fifth of the middle's reserve for this one kind, the newest half.
    assert len(result.events) == 75 + 15 + 150
    assert result.dropped_events == 5000 - 240
    assert result.lines == 5000


def test_past_the_bound_a_storm_of_one_kind_cannot_push_out_the_failures_before_it(monkeypatch):
    monkeypatch.setattr("ingest.parsers.log.MAX_EVENTS", 300)
    timeout = (
        b"[rank3]:[E ProcessGroupNCCL.cpp:632] [Rank 3] Watchdog caught collective operation "
        b"timeout: WorkNCCL(SeqNum=812, OpType=ALLREDUCE, Timeout(ms)=600000) ran for 600042 "
        b"milliseconds before timing out.\n"
    )
    progress = b"[rank0]: step=%d loss=1.25 step_time=0.91 data_time=0.01\n"
    storm = b"".join(progress % i for i in range(2000))
    result = parse_log(storm + timeout + storm)
    assert len(result.of_kind("watchdog_timeout")) == 1
    assert result.dropped_events > 0
    assert "trainer_step" in result.issues[0].message


def test_a_wide_json_value_in_a_hw_stats_string_field_is_not_rendered_whole():
    # str() of a list would render all of it before the cut; a field that should be text
    # and holds a list is read as absent.
    wide = list(range(100_000))
    doc = {
        "records": [{"type": "gpu", "pci": wide, "name": wide, "throttle_reasons": wide}],
        "host": wide,
    }
    result = parse_artifact(json.dumps(doc).encode(), kind="hw_stats")
    (event,) = result.events
    assert event.pci == "" and event.name == "" and event.host == "" and event.throttle == ()
    assert len(event.text) < 500


def test_flight_recorder_container_bombs_are_refused_before_decoding():
    from ingest.parsers import flight_recorder

    n = flight_recorder.MAX_CONTAINERS * 4
    # A pickle of millions of empty dicts (EMPTY_DICT is one byte each; gzip makes it ~16 KB)
    # and the same as JSON: each would build gigabytes of objects if decoded.
    pickled = b"\x80\x02}X\x07\x00\x00\x00entries](" + b"}" * n + b"eu."
    as_json = b'{"entries": [' + b"{}," * n + b"{}]}"
    for body in (pickled, as_json):
        bomb = gzip.compress(body, compresslevel=9, mtime=0)
        assert len(bomb) < 200_000
        result, peak = peak_bytes(
            lambda bomb=bomb: flight_recorder.parse_flight_recorder(bomb, source="fr.rank0")
        )
        assert not result.complete and not result.events
        assert "containers" in result.issues[0].message
        # The inflated bytes are held to count them; nothing is built from them.
        assert peak < 2 * len(body) + (8 << 20), peak


def test_a_flight_recorder_dump_past_any_buffers_size_is_refused_unread():
    from ingest.parsers import flight_recorder

    body = b'{"entries": [], "pad": "' + b"x" * flight_recorder.MAX_DUMP_BYTES + b'"}'
    result = flight_recorder.parse_flight_recorder(gzip.compress(body, mtime=0), source="r0")
    assert not result.complete and "MiB" in result.issues[0].message


def test_a_trace_summary_past_any_real_ones_size_is_refused_undecoded():
    from ingest.parsers import trace

    head = json.dumps({"format": trace.SUMMARY_FORMAT}).encode()[:-1]
    body = head + b', "pad": [' + b"{}," * (1 << 20) + b"{}]}"
    result = parse_artifact(gzip.compress(body, mtime=0), kind="trace", source="t.rank0.json")
    assert not result.complete and not result.events
    assert f"over {trace.MAX_SUMMARY_BYTES >> 20} MiB" in result.issues[0].message
