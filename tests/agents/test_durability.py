"""The spool under crashes: SIGKILL mid-upload, the server down and back, a full spool."""

from __future__ import annotations

import gzip
import hashlib
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from agents.spool import Spool

from .fake_server import FakeServer

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow


def write_log(path: Path, first: int, count: int, *, noise: bool = False) -> None:
    with path.open("a") as log:
        for i in range(first, first + count):
            tail = os.urandom(30).hex() if noise else "x" * 60
            log.write(f"[rank0]: step {i} loss {i * 0.001:.4f} {tail}\n")


def start_agent(tmp_path: Path, server: str, **env) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "agents.cli", "run"],
        cwd=REPO,
        stdout=open(tmp_path / "agent.out", "ab"),
        stderr=subprocess.STDOUT,
        env={
            "PATH": os.environ.get("PATH", ""),
            "PYTHONPATH": str(REPO),
            "FLEETWATCH_SERVER": server,
            "FLEETWATCH_KEY": "k",
            "FLEETWATCH_HOST": "gpu-dur",
            "FLEETWATCH_JOB": "dur-job",
            "FLEETWATCH_SPOOL_DIR": str(tmp_path / "spool"),
            "FLEETWATCH_RUN_DIR": str(tmp_path / "run"),
            "FLEETWATCH_LOGS": str(tmp_path / "rank0.log"),
            "FLEETWATCH_KERNEL_LOGS": "",
            "FLEETWATCH_POLL_S": "0.1",
            "FLEETWATCH_LOG_FLUSH_S": "0.1",
            "FLEETWATCH_CHUNK_BYTES": "4096",
            "FLEETWATCH_STATS_INTERVAL_S": "3600",
            "FLEETWATCH_BACKOFF_BASE_S": "0.1",
            "FLEETWATCH_BACKOFF_MAX_S": "0.5",
            **env,
        },
    )


def wait_until(predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def test_sigkill_mid_upload_and_a_server_outage_lose_and_duplicate_nothing(tmp_path):
    from . import fake_server

    bodies: dict[str, bytes] = {}
    original_parse = fake_server.parse_multipart

    def parse(body, content_type):
        fields = original_parse(body, content_type)
        if "file" in fields:
            bodies[fields.get("job", "") + "|" + hashlib.sha256(fields["file"]).hexdigest()] = (
                fields["file"]
            )
        return fields

    fake_server.parse_multipart = parse
    try:
        log = tmp_path / "rank0.log"
        write_log(log, 0, 3000)  # ~300 KB: ~75 chunks of 4 KiB
        with FakeServer(delay_s=0.03) as server:
            agent = start_agent(tmp_path, server.url)
            wait_until(lambda: len(server.accepted) >= 15, 30, "some uploads")
            os.kill(agent.pid, signal.SIGKILL)  # mid-upload: the server is slow on purpose
            agent.wait()
            spooled_at_kill = len(Spool(tmp_path / "spool").names())
            assert spooled_at_kill > 0
            port = int(server.url.rsplit(":", 1)[1])
        # The server is gone; the restarted agent keeps collecting into the spool.
        write_log(log, 3000, 500)
        agent = start_agent(tmp_path, f"http://127.0.0.1:{port}")
        time.sleep(1.5)
        with FakeServer(port=port) as back:
            back.accepted.update(server.accepted)  # the same database, back up
            wait_until(
                lambda: (
                    not Spool(tmp_path / "spool").names()
                    and len(back.accepted) > len(server.accepted)
                ),
                60,
                "the spool to drain",
            )
            time.sleep(0.5)
            agent.send_signal(signal.SIGTERM)
            agent.wait(timeout=20)
            accepted = back.accepted
    finally:
        fake_server.parse_multipart = original_parse
    chunks = []
    for (_host, job, sha), _ in accepted.items():
        body = bodies[f"{job}|{sha}"]
        if body[:2] != b"\x1f\x8b":
            continue  # the agent's own stats document, not a log chunk
        chunks.append(gzip.decompress(body))
    # Every accepted chunk is a distinct piece of the log; together they are the log, once.
    text = log.read_bytes()
    assert sum(len(c) for c in chunks) == len(text)
    rebuilt = sorted(chunks, key=lambda c: text.index(c))
    assert b"".join(rebuilt) == text


def test_a_full_spool_drops_the_oldest_counts_them_and_stays_bounded(tmp_path):
    log = tmp_path / "rank0.log"
    write_log(log, 0, 4000, noise=True)  # ~400 KB that barely compresses: beyond the spool
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}"
    agent = start_agent(tmp_path, dead, FLEETWATCH_SPOOL_MAX_BYTES="65536")

    def newest_end() -> int:
        ends = [i.header["end"] for i in Spool(tmp_path / "spool").items() if "end" in i.header]
        return max(ends, default=-1)

    try:
        wait_until(lambda: Spool(tmp_path / "spool").state().dropped_items > 0, 60, "drops")
        # A condition, not a fixed second: on a busy machine the agent may still be reading.
        size_written = log.stat().st_size
        wait_until(lambda: newest_end() == size_written, 120, "the log's last byte spooled")
    finally:
        agent.send_signal(signal.SIGKILL)
        agent.wait()
    _, size = Spool(tmp_path / "spool").usage()
    assert size <= 65536
    fresh = Spool(tmp_path / "spool").state()  # persisted across the kill
    assert fresh.dropped_items > 0 and fresh.dropped_bytes > 0
    # What is left is the newest: the last line written is in the spool.
    newest = max(
        (i for i in Spool(tmp_path / "spool").items() if "end" in i.header),
        key=lambda i: i.header["end"],
    )
    assert newest.header["end"] == log.stat().st_size


def test_sigterm_ends_the_agent_while_an_upload_hangs_and_the_spool_keeps_everything(tmp_path):
    """A server that accepts the connection and never answers holds an upload for the whole
    read timeout (30 s); SIGTERM must not wait for it (agents/cli.py SHUTDOWN_S, 4 s), and
    what was spooled stays for the next start."""
    log = tmp_path / "rank0.log"
    write_log(log, 0, 2000, noise=True)
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(64)  # the kernel completes connections; nobody ever reads or answers
        server = f"http://127.0.0.1:{silent.getsockname()[1]}"
        agent = start_agent(tmp_path, server, FLEETWATCH_REQUEST_TIMEOUT_S="30")
        try:
            wait_until(lambda: Spool(tmp_path / "spool").names(), 60, "items spooled")
            wait_until(lambda: b"agent up" in (tmp_path / "agent.out").read_bytes(), 60, "agent up")
            agent.send_signal(signal.SIGTERM)
            # Far below the 30 s the hanging upload alone would take, with room for a busy
            # machine: the design bound is 4 s.
            assert agent.wait(timeout=20) == 0
        finally:
            if agent.poll() is None:
                agent.kill()
                agent.wait()
    assert Spool(tmp_path / "spool").names()
