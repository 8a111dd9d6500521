"""The load harness (bench/load.py): its client honours Retry-After, and at a tiny size the
whole burst — real gunicorn, a real Celery worker, PostgreSQL and Redis — is acknowledged,
stored once and classified naming the planted rank. Speed is the bench's business, not
asserted here."""

from __future__ import annotations

import email.utils
import json
import os
import random
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

import pytest

from bench import load

SERVICES = os.environ.get("DATABASE_URL", "").startswith("postgres") and os.environ.get(
    "CELERY_BROKER_URL", ""
).startswith("redis://")


class _Busy(BaseHTTPRequestHandler):
    """Answers each path's scripted statuses in turn: 429 and 503 carry Retry-After."""

    script: dict[str, list[int]] = {}

    def log_message(self, *args):
        pass

    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        status = self.script[self.path].pop(0)
        body = json.dumps({"id": 7, "status": "received", "duplicate": False}).encode()
        self.send_response(status)
        if status in (429, 503):
            self.send_header("Retry-After", "1")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


@pytest.fixture
def busy_server():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Busy)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


def test_the_client_waits_as_long_as_retry_after_asks_then_is_acknowledged(busy_server):
    _Busy.script = {"/up": [429, 503, 202]}
    waits: list[float] = []
    sent = load.deliver(
        busy_server.server_port,
        load.Request("POST", "/up", b"x"),
        random.Random(1),
        deadline=time.monotonic() + 30,
        sleep=waits.append,
    )
    assert sent.status == 202
    assert sent.attempts == 3
    assert sent.deferred == {429: 1, 503: 1}
    assert len(waits) == 2 and min(waits) >= 1.0, waits  # Retry-After: 1


def test_the_client_gives_up_on_an_answer_that_sending_again_cannot_change(busy_server):
    _Busy.script = {"/bad": [400]}
    sent = load.deliver(
        busy_server.server_port,
        load.Request("POST", "/bad", b"x"),
        random.Random(1),
        deadline=time.monotonic() + 30,
    )
    assert (sent.status, sent.attempts) == (400, 1)


def test_retry_after_reads_seconds_and_http_dates():
    assert load.retry_after("3") == 3.0
    assert load.retry_after(None) == 0.0
    assert load.retry_after("soon") == 0.0
    assert load.retry_after("Wed, 21 Oct 2015 07:28:00 GMT") == 0.0  # already past
    assert 3 < load.retry_after(email.utils.formatdate(time.time() + 5, usegmt=True)) <= 5


def test_every_host_bundle_holds_its_eight_ranks_and_one_is_the_planted_culprit():
    import gzip

    fleet = load.make_fleet(4)
    assert fleet.world == 32 and len(fleet.bundles) == 4
    text = gzip.decompress(fleet.bundles[fleet.culprit // 8]).decode()
    assert f"[rank{fleet.culprit}]:" in text
    assert "Received a dump signal" in text
    assert all(
        "Watchdog caught collective operation timeout" in gzip.decompress(b).decode()
        for b in fleet.bundles
    )


@pytest.mark.slow
@pytest.mark.redis
@pytest.mark.skipif(
    not SERVICES,
    reason="needs DATABASE_URL=postgres://… and CELERY_BROKER_URL=redis://… (make test)",
)
def test_a_tiny_burst_is_acknowledged_stored_once_and_names_the_planted_rank(tmp_path):
    fleet = load.make_fleet(16)
    broker = urlsplit(os.environ["CELERY_BROKER_URL"])
    result = load.run_once(
        fleet,
        tmp_path,
        workers=1,
        concurrency=8,
        gunicorn_workers=2,
        pg_admin=os.environ["DATABASE_URL"],
        redis_base=f"redis://{broker.netloc}",
        # Not the bench's first choice (13): a bench running beside the suite keeps its db.
        redis_dbs=(12, 11, 10, 9, 8),
        replays=16,
    )
    assert result["gates"] == {
        "acknowledged": True,
        "none_lost": True,
        "none_duplicated": True,
        "culprit_named": True,
    }, result
    assert result["counts"]["uploads"] == result["parsed"] == 16
    assert result["replays_ok"] == 16
    assert result["incident_ranks"][0] == str(fleet.culprit)
    rows = load.rows_for(result, classify_s=0.1)
    assert all(row["met"] for row in rows if row["gate"])
