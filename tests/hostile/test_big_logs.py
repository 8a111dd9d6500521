"""A ten-million-line log, gzip on the wire (a few MB), parses to its last line in memory that
does not grow with it: measured as the peak RSS of a child process that parses it, against the
same measure for a log ten times smaller, in the same run."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
from pathlib import Path

import pytest

from ingest.models import Event, Upload

ROOT = Path(__file__).resolve().parents[2]
BLOCK_LINES = 200
XID = "NVRM: Xid (PCI:0000:3b:00): 79, pid=4242, name=python, GPU has fallen off the bus."
WATCHDOG = (
    "[rank3]:[E ProcessGroupNCCL.cpp:632] [Rank 3] Watchdog caught collective operation timeout: "
    "WorkNCCL(SeqNum=812, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=600000) ran for "
    "600042 milliseconds before timing out."
)


def block() -> bytes:
    """200 lines of training noise with an NCCL INFO line (a trigger the scanner must look at
    and drop) every 50: small enough for deflate's window, so the file is small on the wire."""
    lines = []
    for i in range(BLOCK_LINES):
        if i % 50 == 0:
            lines.append(f"gpu-003:4242:4300 [3] NCCL INFO Channel {i // 50:02d}/0 : 3[3] -> 4[4]")
        else:
            lines.append(f"[rank3]:I1121 03:{i % 60:02d}:00 train.py:120] step {i} loss 2.{i:03d}")
    return ("\n".join(lines) + "\n").encode()


def write_log(path: Path, lines: int) -> Path:
    """``lines`` lines, gzip: noise, an Xid half way, the watchdog timeout as the last line.

    Written as concatenated gzip members (as ``cat`` of rotated logs makes, and which every gzip
    reader takes as one stream): a member of noise compressed once and repeated, so that making
    ten million lines costs a fraction of a second rather than deflating a gigabyte."""
    noise_lines = lines - 2
    per_member = 1000 * BLOCK_LINES
    member = gzip.compress(block() * 1000, mtime=0)
    rest = noise_lines % per_member
    tail = (block() * (rest // BLOCK_LINES + 1)).splitlines(keepends=True)[:rest]
    with path.open("wb") as out:
        for i in range(noise_lines // per_member):
            out.write(member)
            if i == noise_lines // per_member // 2:
                out.write(gzip.compress(XID.encode() + b"\n", mtime=0))
        out.write(gzip.compress(b"".join(tail) + WATCHDOG.encode() + b"\n", mtime=0))
    return path


PARSE_IN_A_CHILD = """
import json, resource, sys
from ingest.parsers.artifact import parse_artifact
with open(sys.argv[1], "rb") as stream:
    result = parse_artifact(stream, kind="log", source="rank3.log")
print(json.dumps({
    "lines": result.lines,
    "complete": result.complete,
    "events": [[e.kind, e.line] for e in result.events],
    "peak_kib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
}))
"""


def parse_in_a_child(path: Path) -> dict:
    done = subprocess.run(
        [sys.executable, "-c", PARSE_IN_A_CHILD, str(path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(done.stdout)


@pytest.fixture(scope="module")
def ten_million_lines(tmp_path_factory) -> Path:
    return write_log(tmp_path_factory.mktemp("big") / "rank3.log.gz", 10_000_001)


@pytest.mark.slow
def test_a_ten_million_line_log_parses_to_its_end_in_memory_that_does_not_grow(
    ten_million_lines, tmp_path
):
    peer = parse_in_a_child(write_log(tmp_path / "peer.log.gz", 1_000_001))
    big = parse_in_a_child(ten_million_lines)
    assert ten_million_lines.stat().st_size < 16 << 20  # small on the wire

    assert big["complete"] and big["lines"] == 10_000_001
    assert ["watchdog_timeout", 10_000_001] in big["events"]  # the very last line
    assert "gpu_xid" in {kind for kind, _ in big["events"]}
    assert peer["lines"] == 1_000_001 and ["watchdog_timeout", 1_000_001] in peer["events"]
    # Ten times the lines, the same memory (a parser that kept lines, or events per trigger
    # hit, would grow tenfold with them).
    assert big["peak_kib"] < 1.3 * peer["peak_kib"], (big["peak_kib"], peer["peak_kib"])


@pytest.mark.slow
@pytest.mark.django_db
def test_a_ten_million_line_log_goes_through_the_upload_api_whole(upload, ten_million_lines):
    response = upload(ten_million_lines.read_bytes(), name="rank3.log", rank=3)
    assert response.status_code == 202, response.json()
    row = Upload.objects.get(pk=response.json()["id"])
    assert row.status == "parsed" and row.compressed
    assert row.line_count == 10_000_001
    assert Event.objects.get(upload=row, kind="watchdog_timeout").line == 10_000_001
    # The parse left its line index: the artifact page of the last line seeks near it.
    assert len(row.line_index) >= 10 and row.line_index[-1][0] > 9_000_000
    from analysis.selectors import artifact_window

    window = artifact_window(row, 10_000_001)
    assert window.lines[-1][0] == 10_000_001 and "Watchdog caught" in window.lines[-1][1]
