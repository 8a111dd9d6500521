"""Flight Recorder dumps, profiler traces and hardware stats that are hostile or broken, sent
through the upload API: a pickle that would run code is refused and runs nothing; a malformed
or truncated artifact is accepted, then failed with a message saying why; and none of it
costs the other uploads of the attempt their parse or the attempt its incident."""

from __future__ import annotations

import gzip
import json
import os
import pickle
import subprocess
import sys

import pytest

from analysis.models import Incident
from fleet.demo import JobScenario, rank_log
from ingest.models import Event, Upload

pytestmark = pytest.mark.django_db


def fr_dump(rank: int = 0, last: int = 9) -> dict:
    """A plain Flight Recorder dump (format 2.10) of one rank in the default group."""
    entries = [
        {
            "record_id": seq,
            "pg_id": 0,
            "process_group": ["0", "default_pg"],
            "collective_seq_id": seq,
            "p2p_seq_id": 0,
            "op_id": seq,
            "profiling_name": "nccl:all_reduce",
            "time_created_ns": 1_700_000_000_000_000_000 + seq,
            "input_sizes": [[1024]],
            "input_dtypes": ["Float"],
            "output_sizes": [[1024]],
            "output_dtypes": ["Float"],
            "state": "completed" if seq < last else "scheduled",
            "timeout_ms": 600_000,
            "is_p2p": False,
            "frames": [{"name": "step", "filename": "train.py", "line": 120}],
        }
        for seq in range(1, last + 1)
    ]
    return {
        "version": "2.10",
        "pg_config": {"0": {"name": "0", "desc": "default_pg", "ranks": "[0, 1]"}},
        "pg_status": {
            "0": {
                "last_enqueued_collective": last,
                "last_started_collective": last - 1,
                "last_completed_collective": last - 1,
            }
        },
        "entries": entries,
    }


# --- pickles that would run code -------------------------------------------------------------


class _Call:
    """Pickles as "call ``func(*args)``" (REDUCE): what every code-running pickle does."""

    def __init__(self, func, *args):
        self.func, self.args = func, args

    def __reduce__(self):
        return self.func, self.args


class _Persistent(pickle.Pickler):
    def persistent_id(self, obj):
        return "payload" if isinstance(obj, str) and obj.startswith("persist:") else None


def payloads(marker: str) -> dict[str, bytes]:
    """Pickles that create ``marker`` when unpickled by ``pickle.loads``, by the ways a pickle
    can reach code: a global called through REDUCE at every protocol, the global hidden deep in
    a real-looking dump, exec of source text, and a persistent id."""
    opener = _Call(open, marker, "w")
    dump = fr_dump()
    dump["entries"][3]["frames"] = [opener]
    out = {f"open, protocol {p}": pickle.dumps(opener, protocol=p) for p in (2, 3, 4, 5)}
    out["open inside a real dump"] = pickle.dumps(dump, protocol=4)
    out["exec of source"] = pickle.dumps(_Call(exec, f"open({marker!r}, 'w').close()"), 4)
    out["os.system"] = pickle.dumps(_Call(os.system, f"touch {marker}"), protocol=2)
    out["gzip-wrapped"] = gzip.compress(pickle.dumps(opener, protocol=4), mtime=0)
    return out


UNPICKLE = """
import gzip, pickle, sys
raw = open(sys.argv[1], "rb").read()
pickle.loads(gzip.decompress(raw) if raw[:2] == b"\\x1f\\x8b" else raw)
"""


def run_with_plain_pickle(payload: bytes, tmp_path) -> None:
    """Unpickle with the standard library, in a child process: what the server must never do."""
    path = tmp_path / "payload.pkl"
    path.write_bytes(payload)
    subprocess.run([sys.executable, "-c", UNPICKLE, str(path)], check=False, capture_output=True)


CASES = [
    "open, protocol 2",
    "open, protocol 3",
    "open, protocol 4",
    "open, protocol 5",
    "open inside a real dump",
    "exec of source",
    "os.system",
    "gzip-wrapped",
]


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("given_kind", ["fr_dump", None], ids=["kind-given", "kind-detected"])
def test_a_pickle_that_would_run_code_is_refused_and_runs_nothing(
    upload, case, given_kind, tmp_path
):
    marker = tmp_path / "pwned"
    payload = payloads(str(marker))[case]
    # The payload is live: the standard unpickler runs it.
    run_with_plain_pickle(payload, tmp_path)
    assert marker.exists(), "the test payload must be one that runs code"
    marker.unlink()

    response = upload(payload, name="nccl_trace_rank_0.pkl", kind=given_kind)
    assert response.status_code == 202, response.json()
    row = Upload.objects.get(pk=response.json()["id"])
    assert not marker.exists()
    assert row.kind == "fr_dump"
    assert row.status == "failed"
    assert "refused" in row.error and "global" in row.error
    assert row.event_count == 0 and not Event.objects.filter(upload=row).exists()


def test_a_pickle_with_a_persistent_id_is_refused(upload, tmp_path):
    import io

    buffer = io.BytesIO()
    _Persistent(buffer, protocol=4).dump({"version": "2.10", "entries": ["persist:x"]})
    response = upload(buffer.getvalue(), name="nccl_trace_rank_0.pkl")
    row = Upload.objects.get(pk=response.json()["id"])
    assert row.status == "failed" and "persistent" in row.error


def test_a_protocol_0_pickle_is_text_never_unpickled(upload, tmp_path):
    marker = tmp_path / "pwned"
    payload = pickle.dumps(_Call(open, str(marker), "w"), protocol=0)
    run_with_plain_pickle(payload, tmp_path)
    assert marker.exists()
    marker.unlink()
    detected = Upload.objects.get(pk=upload(payload, name="rank0.pkl", job="a").json()["id"])
    forced = Upload.objects.get(
        pk=upload(payload, name="rank0.pkl", kind="fr_dump", job="b").json()["id"]
    )
    assert not marker.exists()
    assert detected.kind == "log" and detected.status == "parsed"  # read as text, if at all
    assert forced.status == "failed" and "neither a pickle nor JSON" in forced.error


# --- malformed and truncated artifacts: accepted, then failed with the reason ----------------

DUMP_PICKLE = pickle.dumps(fr_dump(), protocol=4)
DUMP_JSON = json.dumps(fr_dump()).encode()
TRACE = json.dumps(
    {
        "traceEvents": [
            {"ph": "X", "name": "ProfilerStep#1", "ts": 0, "dur": 100, "cat": "user_annotation"}
        ],
        "distributedInfo": {"rank": 0, "world_size": 2},
    }
).encode()
BROKEN = {
    "fr_dump: pickle cut in half": ("fr_dump", DUMP_PICKLE[: len(DUMP_PICKLE) // 2], "pickle"),
    "fr_dump: pickle header then garbage": ("fr_dump", b"\x80\x04" + b"\x13" * 64, "pickle"),
    "fr_dump: JSON cut in half": ("fr_dump", DUMP_JSON[: len(DUMP_JSON) // 2], "JSON"),
    "fr_dump: JSON with no entries": ("fr_dump", b'{"version": "2.10", "entries": 7}', "entries"),
    "fr_dump: JSON nested a million deep": (
        "fr_dump",
        b'{"version": "2.10", "entries": ' + b"[" * 500_000 + b"]" * 500_000 + b"}",
        "nested too deeply",
    ),
    "trace: cut in half": ("trace", TRACE[: len(TRACE) // 2], "trace"),
    "trace: not JSON": ("trace", b"this is no trace\n" * 10, "trace"),
    "trace: nested a million deep": (
        "trace",
        b'{"traceEvents": [' + b'{"a": ' * 300_000 + b"1" + b"}" * 300_000 + b"]}",
        "nested too deeply",
    ),
    "hw_stats: cut in half": ("hw_stats", b'{"hw_stats": "fleetwatch.hw_stats/1", "reco', "JSON"),
    "hw_stats: no records": ("hw_stats", b'{"hw_stats": "fleetwatch.hw_stats/1"}', "records"),
    "hw_stats: nested a million deep": (
        "hw_stats",
        b'{"records": ' + b"[" * 500_000 + b"]" * 500_000 + b"}",
        "nested too deeply",
    ),
}


@pytest.mark.parametrize("case", list(BROKEN))
def test_a_broken_artifact_is_accepted_then_failed_with_the_reason(upload, reader, case):
    kind, body, reason = BROKEN[case]
    response = upload(body, name="rank0.bin", kind=kind)
    assert response.status_code == 202, response.json()
    shown = reader.get(f"/api/v1/uploads/{response.json()['id']}").json()
    assert shown["status"] == "failed"
    assert reason in shown["error"], shown["error"]
    assert shown["event_count"] == 0


@pytest.mark.parametrize("kind", ["fr_dump", "trace", "hw_stats"])
def test_a_gzip_cut_short_is_refused_at_the_door_for_every_kind(upload, kind):
    packed = gzip.compress(DUMP_JSON * 50, mtime=0)
    response = upload(packed[: len(packed) // 2], name=f"rank0.{kind}.gz", kind=kind)
    assert response.status_code == 400
    assert "truncated" in response.json()["detail"]
    assert not Upload.objects.exists()


def test_a_readable_dump_is_parsed_not_failed(upload):
    # The other side: the same path with a good dump (pickle and JSON) gives frontier events.
    for name, body in (("fr_rank0.pkl", DUMP_PICKLE), ("fr_rank0.json", DUMP_JSON)):
        row = Upload.objects.get(pk=upload(body, name=name, kind="fr_dump").json()["id"])
        assert row.status == "parsed", row.error
        assert Event.objects.filter(upload=row, kind="fr_frontier").exists()


# --- nothing else accepted is lost -----------------------------------------------------------

TWO_RANKS = JobScenario("job-1", ["gpu-001", "gpu-002"], world=2, lagging=1, seq=812)
HOSTILE_PEERS = {
    "code-running pickle": lambda tmp: payloads(str(tmp / "pwned"))["open inside a real dump"],
    "fr dump nested a million deep": lambda tmp: BROKEN["fr_dump: JSON nested a million deep"][1],
    "trace nested a million deep": lambda tmp: BROKEN["trace: nested a million deep"][1],
    "truncated pickle dump": lambda tmp: BROKEN["fr_dump: pickle cut in half"][1],
}


@pytest.mark.parametrize("hostile", list(HOSTILE_PEERS))
def test_a_hostile_artifact_parsed_last_still_lets_the_attempt_be_classified(
    upload, held_upload, reader, hostile, tmp_path
):
    # The hostile upload arrives first and its parse finishes last: the attempt waits for it
    # (it is not settled while the upload is received), so its failure must still classify.
    kind = "trace" if "trace" in hostile else "fr_dump"
    response, release = held_upload(
        HOSTILE_PEERS[hostile](tmp_path), name="rank1.bin", kind=kind, rank=1
    )
    assert response.status_code == 202
    for rank in (0, 1):
        log = rank_log(TWO_RANKS, rank)
        assert upload(log, host=TWO_RANKS.host_of(rank), rank=rank).status_code == 202
    assert not Incident.objects.exists()  # waiting for the held parse

    release()

    hostile_row = Upload.objects.get(pk=response.json()["id"])
    assert hostile_row.status == "failed" and hostile_row.error
    assert not (tmp_path / "pwned").exists()
    logs = Upload.objects.exclude(pk=hostile_row.pk)
    assert [u.status for u in logs] == ["parsed", "parsed"]
    body = reader.get("/api/v1/incidents", {"job": "job-1"}).json()
    assert body["count"] == 1
    assert "rank 1 lagged" in body["results"][0]["summary"]
