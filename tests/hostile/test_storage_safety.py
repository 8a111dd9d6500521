"""Content that parses but that a database column cannot hold as-is: a NUL (PostgreSQL refuses
it in text and jsonb), a lone surrogate (no UTF-8 encoder takes one), NaN (jsonb refuses it), a
rank past 32 bits, invalid UTF-8. Each is stored, on SQLite and on PostgreSQL, with the rest of
its upload, instead of failing the upload and losing every event in it."""

from __future__ import annotations

import json

import pytest

from ingest.models import Event, Upload
from ingest.parsers.trace import SUMMARY_FORMAT

pytestmark = pytest.mark.django_db

WATCHDOG = (
    "[rank{rank}]:[E ProcessGroupNCCL.cpp:632] [Rank 1] Watchdog caught collective operation "
    "timeout: WorkNCCL(SeqNum=812, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=600000) "
    "ran for 600042 milliseconds before timing out.{tail}\n"
)


def hw_document(**fields) -> bytes:
    doc = {"hw_stats": "fleetwatch.hw_stats/1", "host": "gpu-001", "rank": 1, **fields}
    return json.dumps(doc).encode("utf-8", "surrogatepass")


CASES = {
    # A text log passes the binary sniff on its first 4 KB; what follows can hold anything.
    "log: NUL after the sniffed head": (
        "log",
        b"step 1 loss 2.0\n" * 400 + WATCHDOG.format(rank=1, tail=" \x00\x00 ok").encode(),
        "watchdog_timeout",
    ),
    "log: invalid UTF-8 in the evidence line": (
        "log",
        WATCHDOG.format(rank=1, tail=" caf\xe9").encode("latin-1") + b"\xff\xfe\xc3\n",
        "watchdog_timeout",
    ),
    "log: a rank past 32 bits": (
        "log",
        WATCHDOG.format(rank=99_999_999_999, tail="").encode(),
        "watchdog_timeout",
    ),
    "hw_stats: NUL and lone surrogates in strings": (
        "hw_stats",
        hw_document(
            host="gpu\x00-001\ud800",
            records=[
                {"type": "reader", "reader": "nvml\x00", "available": False, "reason": "\udfff"}
            ],
        ),
        "reader_status",
    ),
    "hw_stats: NaN and infinite readings": (
        "hw_stats",
        hw_document(records=[{"type": "gpu", "index": 0, "temperature_c": float("nan")}])
        .replace(b"NaN", b"NaN")
        .replace(b'"index": 0', b'"index": Infinity'),
        "gpu_health",
    ),
    "hw_stats: a rank past 64 bits": (
        "hw_stats",
        hw_document(rank=10**20, records=[{"type": "agent", "spool_dropped_items": 10**30}]),
        "agent_spool",
    ),
    "trace: summary with NaN, NUL and a huge rank": (
        "trace",
        f'{{"format": "{SUMMARY_FORMAT}", "traceEvents": [], "rank": {10**20}, '
        '"host": "gpu\\u0000\\ud800", "span_us": NaN, "comm_us": Infinity, '
        '"step_ms": [1.0, NaN]}'.encode(),
        "trace_summary",
    ),
    "fr_dump: NUL and surrogates in group names and ops": (
        "fr_dump",
        json.dumps(
            {
                "version": "2.10",
                "entries": [
                    {
                        "process_group": ["0\x00", "default\ud800"],
                        "collective_seq_id": 1,
                        "profiling_name": "nccl:all_reduce\x00",
                        "state": "completed",
                    }
                ],
            }
        ).encode(),
        "fr_frontier",
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_content_a_column_cannot_hold_as_is_is_stored_with_its_upload(upload, reader, case):
    kind, body, event_kind = CASES[case]
    name = {"log": "rank1.log", "hw_stats": "hw.json"}.get(kind, "rank1.json")
    response = upload(body, name=name, kind=kind, rank=1)
    assert response.status_code == 202, response.json()
    row = Upload.objects.get(pk=response.json()["id"])
    assert row.status == "parsed", row.error
    events = list(Event.objects.filter(upload=row))
    assert any(e.kind == event_kind for e in events), [e.kind for e in events]
    for event in events:
        assert "\x00" not in event.text
        assert event.rank is None or 0 <= event.rank < 2**31
        stored = json.dumps(event.attrs, allow_nan=False)  # read back: no NaN survived
        assert "\\u0000" not in stored
        event.text.encode("utf-8")
    # And the API shows it.
    assert reader.get(f"/api/v1/uploads/{row.pk}").status_code == 200


def test_a_nul_in_the_reason_a_dump_is_refused_does_not_lose_the_reason(upload):
    # The refusal names the global the pickle asked for; a crafted module name holds a NUL.
    body = b"\x80\x04" + b"\x8c\x04os\x00x" + b"\x8c\x06system" + b"\x93."  # STACK_GLOBAL
    row = Upload.objects.get(pk=upload(body, name="fr_rank0.pkl").json()["id"])
    assert row.status == "failed"
    assert "refused" in row.error and "\x00" not in row.error


def test_an_impossible_rank_in_the_content_falls_back_to_the_rank_the_agent_sent(upload):
    row_id = upload(WATCHDOG.format(rank=99_999_999_999, tail=""), rank=3).json()["id"]
    assert Event.objects.get(upload_id=row_id, kind="watchdog_timeout").rank == 3
