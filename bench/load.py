"""The load scenario: a 16,384-rank job times out and its 2,048 hosts upload at once.

Real parts, really started, loopback only: gunicorn (sync workers, production's layout) and
Celery worker processes on a scratch PostgreSQL database and a Redis db number of their own.
Every host uploads one gzip bundle — its 8 ranks' logs, ProcessGroupNCCL watchdog lines and
all, one rank planted as the culprit that never joined the collective — through a bounded pool
of client connections released together. Clients behave like the agent: 202 is done, 400-ish
answers are final, anything else (429/503 with ``Retry-After``, a reset connection) is retried
after the asked-for wait, with jittered backoff, a bounded number of times.

What must hold (gates; a run where one fails measured nothing): every upload acknowledged,
every one stored once (Upload rows == hosts, natural keys distinct, each upload's events stored
once), replays answered ``duplicate=true`` with the first id, and the incident classified
naming the planted rank.

What is measured, each against a peer measured in the same run:
  - rows/s stored (Upload + Event rows, from the release of the burst to the last upload parsed)
    against a raw psycopg ``COPY`` of the same rows into the same tables (goal >= 0.3);
  - uploads/s and p50/p99 time to acknowledgment against ``GET /healthz`` (one ``SELECT 1``)
    through the same gunicorn, client and concurrency: the bare cost of a request here;
  - seconds from the last upload's 202 to the incident classified, against the floor: the
    settle window plus the pure diagnosis core run in this process on the same events;
  - all of it with one Celery worker process, two, and two with a queue each (as
    docker-compose.yml runs them); prefork, concurrency 1 each. Each layout runs on fresh
    services, and against the one-worker run in rows of its own.

``python -m bench.load [--hosts N] [--layouts 1 2 2split]`` runs it alone (every figure to
standard error as JSON, the rows to standard output).
"""

from __future__ import annotations

import argparse
import email.utils
import gzip
import http.client
import io
import json
import math
import os
import random
import secrets
import sys
import tempfile
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from ._services import (
    PG_ADMIN,
    REDIS,
    ROOT,
    Processes,
    drop_database,
    exit_on_sigterm,
    free_port,
    gunicorn_argv,
    manage,
    postgres_database,
    redis_clients,
    redis_flush,
    redis_free_db,
    wait_http,
)
from .report import scenario

GPUS_PER_HOST = 8
SEQ = 48213
# The settle window the services run with: short, so the classification figure is the
# pipeline's, not the wait an operator configures (production defaults to 10 s).
SETTLE_SECONDS = 1.0
# Redis db numbers the bench may take, first free one wins (`make test` uses 15): the bench's
# tasks must not meet another checkout's worker. The chosen one is flushed before and after.
REDIS_DBS = (13, 12, 11, 10, 9)
CONCURRENCY = 256
GUNICORN_WORKERS = 4  # docker-compose.yml's web tier
# Answers the agent drops an item on (agents/uploader.py PERMANENT): sending again cannot help.
PERMANENT = {400, 404, 405, 410, 413, 415, 422}
MAX_ATTEMPTS = 12
BACKOFF_BASE_S, BACKOFF_CAP_S = 0.25, 5.0
REQUEST_TIMEOUT_S = 120.0
# Bounds on one run: the burst, and the wait for the pipeline to finish behind it.
BURST_DEADLINE_S = 600.0
PIPELINE_DEADLINE_S = 900.0
# No upload parsed and no classification for this long: the run is stuck, say why and stop.
STALL_S = 120.0
NOISE_LINES = 24  # training-step lines per rank before the failure


# --- the job that failed ---------------------------------------------------------------------


@dataclass(frozen=True)
class Fleet:
    """One failed attempt of a ``hosts`` x 8 rank job: each host's gzip bundle and the culprit."""

    job: str
    hosts: list[str]
    world: int
    culprit: int
    bundles: list[bytes]  # gzip, one per host, in host order

    def filename(self, i: int) -> str:
        return f"{self.hosts[i]}-ranks.log.gz"


def host_name(i: int) -> str:
    return f"gpu-{i // 32:03d}-{i % 32:02d}"  # racks of 32 hosts


def make_fleet(hosts: int, job: str = "llm-pretrain-16k-0042") -> Fleet:
    """Each host's bundle holds its 8 ranks' logs as ``fleet.demo`` writes them (PyTorch 2.5
    ProcessGroupNCCL lines), after the NCCL init lines a real ``NCCL_DEBUG=INFO`` job prints.
    One rank lags: it never enqueued the collective the other ranks time out in."""
    from fleet.demo import JobScenario, rank_log

    names = [host_name(i) for i in range(hosts)]
    world = hosts * GPUS_PER_HOST
    culprit = (world * 7) // 11
    job_scenario = JobScenario(
        job, names, world=world, lagging=culprit, seq=SEQ, noise_lines=NOISE_LINES
    )
    bundles = []
    for i, host in enumerate(names):
        parts = []
        for local in range(GPUS_PER_HOST):
            rank = i * GPUS_PER_HOST + local
            head = f"[rank{rank}]:{host}:{4100 + local}:{4100 + local} [{local}] NCCL INFO"
            parts.append(
                f"{head} NCCL version 2.21.5+cuda12.4\n"
                f"{head} Using network IB\n"
                f"{head} comm 0x55d0c3a0 rank {rank} nranks {world} cudaDev {local} "
                f"busId {local + 1}b000 - Init COMPLETE\n"
            )
            parts.append(rank_log(job_scenario, rank))
        bundles.append(gzip.compress("".join(parts).encode(), compresslevel=6, mtime=0))
    return Fleet(job, names, world, culprit, bundles)


def classify_floor(fleet: Fleet) -> tuple[float, list[str]]:
    """The pure diagnosis core on the same bundles in this process: (seconds of ``classify``,
    the rank suspects it names). Parsing is not timed: that is the workers' share, counted in
    rows/s."""
    from analysis.classify import classify
    from ingest.parsers import parse_artifact

    events = []
    for i, bundle in enumerate(fleet.bundles):
        events += parse_artifact(io.BytesIO(bundle), kind="log", source=fleet.filename(i)).events
    started = time.perf_counter()
    verdict = classify(events)
    seconds = time.perf_counter() - started
    return seconds, [s.id for s in verdict.suspects if s.kind == "rank"]


# --- the clients -----------------------------------------------------------------------------


@dataclass
class Request:
    method: str
    path: str
    body: bytes = b""
    headers: dict[str, str] = field(default_factory=dict)


@dataclass
class Sent:
    status: int = 0  # the final answer; 0 when none came
    answer: dict = field(default_factory=dict)
    attempts: int = 0
    deferred: Counter = field(default_factory=Counter)  # 429, 503, "ConnectionResetError", ...
    started: float = 0.0  # monotonic: the first attempt
    done: float = 0.0  # monotonic: the final answer read
    error: str = ""


def multipart(fields: dict[str, str], filename: str, content: bytes) -> tuple[str, bytes]:
    boundary = "fleetwatch-" + secrets.token_hex(12)
    out = io.BytesIO()
    for name, value in fields.items():
        out.write(
            f'--{boundary}\r\nContent-Disposition: form-data; name="{name}"\r\n\r\n'
            f"{value}\r\n".encode()
        )
    out.write(
        f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="{filename}"\r\n'
        "Content-Type: application/gzip\r\n\r\n".encode()
    )
    out.write(content)
    out.write(f"\r\n--{boundary}--\r\n".encode())
    return f"multipart/form-data; boundary={boundary}", out.getvalue()


def upload_requests(fleet: Fleet, key: str) -> list[Request]:
    requests = []
    for i, bundle in enumerate(fleet.bundles):
        content_type, body = multipart(
            {"host": fleet.hosts[i], "job": fleet.job, "attempt": "0"}, fleet.filename(i), bundle
        )
        requests.append(
            Request(
                "POST",
                "/api/v1/uploads",
                body,
                {"Authorization": f"Bearer {key}", "Content-Type": content_type},
            )
        )
    return requests


def retry_after(value: str | None) -> float:
    """Seconds asked for by ``Retry-After`` (delta-seconds or an HTTP date); 0 when absent."""
    if not value:
        return 0.0
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        return max(0.0, email.utils.parsedate_to_datetime(value).timestamp() - time.time())
    except (TypeError, ValueError):
        return 0.0


def _send(port: int, request: Request) -> tuple[int, str | None, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=REQUEST_TIMEOUT_S)
    try:
        conn.request(request.method, request.path, body=request.body, headers=request.headers)
        response = conn.getresponse()
        return response.status, response.getheader("Retry-After"), response.read()
    finally:
        conn.close()


def deliver(
    port: int, request: Request, rng: random.Random, deadline: float, sleep=time.sleep
) -> Sent:
    """One item, as the agent sends it: until acknowledged, finally refused, or out of tries."""
    sent = Sent(started=time.monotonic())
    failures = 0
    while True:
        sent.attempts += 1
        asked = 0.0
        try:
            status, after, body = _send(port, request)
        except (OSError, http.client.HTTPException) as exc:
            status, why = 0, type(exc).__name__
            sent.error = f"{why}: {exc}"
        else:
            why = status
            if status in (200, 201, 202) or status in PERMANENT:
                sent.status, sent.done = status, time.monotonic()
                try:
                    sent.answer = json.loads(body or b"{}")
                except ValueError:
                    sent.answer = {"raw": body[:300].decode("utf-8", "replace")}
                return sent
            asked = retry_after(after)
            sent.error = f"HTTP {status}: {body[:200].decode('utf-8', 'replace')}"
        sent.deferred[why] += 1
        failures += 1
        delay = max(
            rng.uniform(0.0, min(BACKOFF_CAP_S, BACKOFF_BASE_S * 2**failures)), min(asked, 30.0)
        )
        if sent.attempts >= MAX_ATTEMPTS or time.monotonic() + delay > deadline:
            sent.status, sent.done = status, time.monotonic()
            return sent
        sleep(delay)


def burst(port: int, requests: list[Request], concurrency: int) -> tuple[list[Sent], float, float]:
    """Every request sent by ``concurrency`` client threads released together. Returns the
    results in request order and the time of the release (monotonic, and wall clock to set
    beside the database's timestamps)."""
    results: list[Sent | None] = [None] * len(requests)
    cursor = iter(range(len(requests)))
    lock = threading.Lock()
    threads = min(concurrency, len(requests))
    gate = threading.Barrier(threads + 1)
    deadline = time.monotonic() + BURST_DEADLINE_S

    def client(seed: int) -> None:
        rng = random.Random(seed)
        gate.wait()
        while True:
            with lock:
                index = next(cursor, None)
            if index is None:
                return
            results[index] = deliver(port, requests[index], rng, deadline)

    pool = [threading.Thread(target=client, args=(n,), daemon=True) for n in range(threads)]
    for thread in pool:
        thread.start()
    gate.wait()
    released, wall = time.monotonic(), time.time()
    for thread in pool:
        thread.join(timeout=max(1.0, deadline - time.monotonic() + REQUEST_TIMEOUT_S))
    return [r if r is not None else Sent(error="never sent") for r in results], released, wall


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile; 0 for no values."""
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q / 100 * len(ordered)) - 1))]


# --- the services ----------------------------------------------------------------------------

_QUEUES = """
import json
from django.conf import settings as s
names = {q.name for q in (getattr(s, "CELERY_TASK_QUEUES", None) or ())}
names.add(getattr(s, "CELERY_TASK_DEFAULT_QUEUE", "celery"))
routes = getattr(s, "CELERY_TASK_ROUTES", None) or {}
names |= {r["queue"] for r in routes.values() if isinstance(r, dict) and "queue" in r}
print(json.dumps(sorted(names)))
"""


def service_env(database_url: str, redis_url: str, data_dir: Path) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("DATABASE_URL", "CELERY_BROKER_URL", "REDIS_URL")
        and not k.startswith("FLEETWATCH_")
    }
    env.update(
        {
            "DATABASE_URL": database_url,
            "CELERY_BROKER_URL": redis_url,
            "REDIS_URL": redis_url,
            "FLEETWATCH_DATA_DIR": str(data_dir),
            "FLEETWATCH_SETTLE_SECONDS": str(SETTLE_SECONDS),
            # Fleet memory's after-incident recompute would run after the measurement ends.
            "FLEETWATCH_CORRELATE_SECONDS": "0",
            "DEBUG": "false",
            "SECRET_KEY": secrets.token_urlsafe(50),
            "LOG_LEVEL": "WARNING",
            "PYTHONUNBUFFERED": "1",
        }
    )
    return env


def start_services(
    processes: Processes, env: dict, *, gunicorn_workers: int, assignments: list[list[str]]
) -> int:
    """gunicorn on a free loopback port and one Celery worker per entry of ``assignments``
    (the queues it consumes); returns the port once all of them are ready."""
    port = free_port()
    processes.start(
        "gunicorn",
        gunicorn_argv(
            port,
            workers=gunicorn_workers,
            timeout=int(REQUEST_TIMEOUT_S),
            extra=("--backlog", "2048", "--log-level", "warning"),
        ),
        env,
    )
    for n, queues in enumerate(assignments, 1):
        processes.start(
            f"worker{n}",
            [
                sys.executable,
                "-m",
                "celery",
                "-A",
                "fleet",
                "worker",
                "--pool=prefork",
                "--concurrency=1",
                "-Q",
                ",".join(queues),
                "-n",
                f"load{n}@%h",
                # INFO for the "ready." line waited on below.
                "--loglevel=INFO",
                "--without-heartbeat",
                "--without-mingle",
                "--without-gossip",
            ],
            env,
        )
    wait_http(f"http://127.0.0.1:{port}/healthz", 90, processes)
    for n in range(1, len(assignments) + 1):
        processes.wait_for_log(f"worker{n}", " ready.", 90)
    return port


def layout(queues: list[str], workers: int, split: bool) -> list[list[str]]:
    """Every worker on every queue, or (``split``) the queues dealt out among the workers, as
    docker-compose.yml runs one worker per queue."""
    if not split:
        return [list(queues)] * workers
    if workers != len(queues):
        raise ValueError(f"a split layout needs one worker per queue ({queues})")
    return [[queue] for queue in queues]


def label(workers: int, split: bool) -> str:
    return f"{workers} worker{'s' if workers > 1 else ''}" + (", a queue each" if split else "")


def warm_up(
    port: int, key: str, conn, gunicorn_workers: int, processes: Processes, redis: str
) -> None:
    """A small job of its own through every stage first, so that the burst meets a warm
    service (imports done, connections open), as a deployed one is."""
    warm = make_fleet(max(2, gunicorn_workers * 2), job="bench-warm-up")
    sent, _, _ = burst(port, upload_requests(warm, key), len(warm.hosts))
    if any(s.status != 202 for s in sent):
        raise RuntimeError(f"warm-up upload refused: {[s.error for s in sent if s.error][:3]}")
    wait_for_pipeline(conn, warm.job, len(warm.hosts), processes, redis)


# --- what the database holds ------------------------------------------------------------------


def _pipeline_state(conn, job: str) -> dict:
    row = conn.execute(
        """
        SELECT count(*),
               count(*) FILTER (WHERE u.status = 'parsed'),
               count(*) FILTER (WHERE u.status = 'failed'),
               max(u.parsed_at)
        FROM ingest_upload u JOIN fleet_job j ON j.id = u.job_id
        WHERE j.external_id = %s
        """,
        (job,),
    ).fetchone()
    incident = conn.execute(
        """
        SELECT i.classified_at, a.last_parsed_at, i.suspects, i.culprit
        FROM analysis_incident i
        JOIN fleet_attempt a ON a.id = i.attempt_id
        JOIN fleet_job j ON j.id = a.job_id
        WHERE j.external_id = %s
        """,
        (job,),
    ).fetchone()
    state = {"uploads": row[0], "parsed": row[1], "failed": row[2], "last_parsed": row[3]}
    if incident is not None:
        classified_at, last_parsed_at, suspects, culprit = incident
        state["incident"] = {
            # The incident reflects every upload only if it was classified after the last one
            # parsed; an earlier classification (a lull mid-burst) is redone by a later task.
            "final": last_parsed_at is not None and classified_at >= last_parsed_at,
            "ranks": [s["id"] for s in suspects if s.get("kind") == "rank"],
            "culprit": culprit,
        }
    return state


def wait_for_pipeline(
    conn, job: str, expected: int, processes: Processes, redis: str
) -> tuple[dict, float]:
    """Poll until every upload is parsed and the incident is classified on all of them.
    Returns the final state and the monotonic time it was first seen."""
    deadline = time.monotonic() + PIPELINE_DEADLINE_S
    progress, moved = None, time.monotonic()
    while True:
        state = _pipeline_state(conn, job)
        seen = time.monotonic()
        incident = state.get("incident")
        if state["parsed"] + state["failed"] >= expected and incident and incident["final"]:
            return state, seen
        if state["failed"]:
            return state, seen
        if (state["parsed"], incident) != progress:
            progress, moved = (state["parsed"], incident), seen
        elif seen - moved > STALL_S:
            raise TimeoutError(
                f"pipeline stuck for {STALL_S:.0f}s at {state}; {redis_clients(redis)} "
                f"connections on {redis} (another worker on this db would take the tasks)"
            )
        if seen > deadline:
            raise TimeoutError(f"pipeline unfinished after {PIPELINE_DEADLINE_S:.0f}s: {state}")
        processes.check_alive()
        time.sleep(0.1)


def integrity(conn, job: str) -> dict:
    """Counts that show nothing was lost or stored twice."""
    uploads, distinct, events, declared = conn.execute(
        """
        SELECT count(*), count(DISTINCT (u.sha256, u.host_id, u.job_id)),
               (SELECT count(*) FROM ingest_event e WHERE e.upload_id IN
                    (SELECT u2.id FROM ingest_upload u2 WHERE u2.job_id = j.id)),
               coalesce(sum(u.event_count), 0)
        FROM ingest_upload u JOIN fleet_job j ON j.id = u.job_id
        WHERE j.external_id = %s
        GROUP BY j.id
        """,
        (job,),
    ).fetchone() or (0, 0, 0, 0)
    # An event stored twice shows as one (upload, line, kind) more than once.
    twice = conn.execute(
        """
        SELECT count(*) FROM (
            SELECT 1 FROM ingest_event e JOIN ingest_upload u ON u.id = e.upload_id
            JOIN fleet_job j ON j.id = u.job_id
            WHERE j.external_id = %s
            GROUP BY e.upload_id, e.line, e.kind HAVING count(*) > 1
        ) AS doubled
        """,
        (job,),
    ).fetchone()[0]
    hosts = conn.execute(
        "SELECT count(DISTINCT u.host_id) FROM ingest_upload u JOIN fleet_job j "
        "ON j.id = u.job_id WHERE j.external_id = %s",
        (job,),
    ).fetchone()[0]
    return {
        "uploads": uploads,
        "distinct_uploads": distinct,
        "hosts": hosts,
        "events": events,
        "events_declared": int(declared),
        "events_twice": twice,
    }


# --- the peer: a raw COPY of the same rows --------------------------------------------------

UPLOAD_COLUMNS = (
    "id, sha256, kind, size, compressed, filename, rank, blob, status, error, received_at, "
    "parsed_at, line_count, event_count, ranks, parse_tries, attempt_id, host_id, job_id, key_id"
)
EVENT_COLUMNS = "kind, rank, line, text, attrs, attempt_id, upload_id"


def _copy_out(conn, query) -> bytes:
    buffer = io.BytesIO()
    with conn.cursor().copy(query) as copy:
        for block in copy:
            buffer.write(block)
    return buffer.getvalue()


def copy_peer(database_url: str, job: str) -> dict:
    """COPY the job's Upload and Event rows, as stored, into the same tables under a twin job
    (the natural key forbids the same job twice): rows/s of the COPY and its commit."""
    import psycopg
    from psycopg import sql

    with psycopg.connect(database_url, autocommit=True) as conn:
        job_id, attempt_id = conn.execute(
            "SELECT j.id, a.id FROM fleet_job j JOIN fleet_attempt a ON a.job_id = j.id "
            "WHERE j.external_id = %s AND a.number = 0",
            (job,),
        ).fetchone()
        twin_job = conn.execute(
            "INSERT INTO fleet_job (external_id, name, created_at) "
            "SELECT external_id || '-copy', name, created_at FROM fleet_job WHERE id = %s "
            "RETURNING id",
            (job_id,),
        ).fetchone()[0]
        twin_attempt = conn.execute(
            "INSERT INTO fleet_attempt (number, status, started_at, ended_at, last_parsed_at, "
            "classified_at, job_id, config, versions, world_size) "
            "SELECT number, status, started_at, ended_at, last_parsed_at, classified_at, %s, "
            "config, versions, world_size FROM fleet_attempt WHERE id = %s RETURNING id",
            (twin_job, attempt_id),
        ).fetchone()[0]
        offset = conn.execute("SELECT coalesce(max(id), 0) FROM ingest_upload").fetchone()[0]
        lit = {
            "offset": sql.Literal(offset),
            "job": sql.Literal(job_id),
            "twin_job": sql.Literal(twin_job),
            "twin_attempt": sql.Literal(twin_attempt),
        }
        uploads = _copy_out(
            conn,
            sql.SQL(
                "COPY (SELECT id + {offset}, sha256, kind, size, compressed, filename, rank, "
                "blob, status, error, received_at, parsed_at, line_count, event_count, ranks, "
                "parse_tries, {twin_attempt}, host_id, {twin_job}, key_id FROM ingest_upload "
                "WHERE job_id = {job} ORDER BY id) TO STDOUT"
            ).format(**lit),
        )
        events = _copy_out(
            conn,
            sql.SQL(
                "COPY (SELECT e.kind, e.rank, e.line, e.text, e.attrs, {twin_attempt}, "
                "e.upload_id + {offset} FROM ingest_event e JOIN ingest_upload u "
                "ON u.id = e.upload_id WHERE u.job_id = {job} ORDER BY e.id) TO STDOUT"
            ).format(**lit),
        )
        rows = uploads.count(b"\n") + events.count(b"\n")
        started = time.perf_counter()
        with conn.transaction(), conn.cursor() as cursor:
            with cursor.copy(f"COPY ingest_upload ({UPLOAD_COLUMNS}) FROM STDIN") as copy:
                copy.write(uploads)
            with cursor.copy(f"COPY ingest_event ({EVENT_COLUMNS}) FROM STDIN") as copy:
                copy.write(events)
        seconds = time.perf_counter() - started
    return {"rows": rows, "seconds": seconds, "rows_per_s": rows / seconds}


# --- one run ---------------------------------------------------------------------------------


def run_once(
    fleet: Fleet,
    workdir: Path,
    *,
    workers: int,
    split: bool = False,
    concurrency: int = CONCURRENCY,
    gunicorn_workers: int = GUNICORN_WORKERS,
    pg_admin: str = PG_ADMIN,
    redis_base: str = REDIS,
    redis_dbs: tuple[int, ...] = REDIS_DBS,
    replays: int = 128,
    say=print,
) -> dict:
    """The whole scenario once, on fresh services (a scratch database, a free Redis db number,
    new processes): the result's ``gates`` say whether it is valid, the rest is what was
    measured."""
    import psycopg

    redis = redis_free_db(redis_base, redis_dbs)
    if redis is None:
        raise RuntimeError(
            f"no free Redis db among {redis_dbs} at {redis_base} (unreachable, or all in use)"
        )
    name = f"fleetwatch_load_{os.getpid()}_{workers}w{'_split' if split else ''}"
    database_url = postgres_database(name, admin=pg_admin)
    if database_url is None:
        raise RuntimeError(f"PostgreSQL is not reachable at {pg_admin}")
    redis_flush(redis)
    rundir = workdir / name
    env = service_env(database_url, redis, rundir / "data")
    try:
        with Processes(rundir / "logs") as processes:
            manage("migrate", "-v0", env=env)
            queues = json.loads(manage("shell", "-c", _QUEUES, env=env).strip().splitlines()[-1])
            key = manage("agentkey", "create", "bench-load", "--scopes", "upload", env=env)
            key = key.strip().splitlines()[-1]
            assignments = layout(queues, workers, split)
            port = start_services(
                processes, env, gunicorn_workers=gunicorn_workers, assignments=assignments
            )
            say(
                f"load: {len(fleet.hosts)} hosts; {label(workers, split)} on "
                f"{' + '.join(','.join(q) for q in assignments)} ({redis}); "
                f"gunicorn x{gunicorn_workers}; {concurrency} clients"
            )
            requests = upload_requests(fleet, key)
            with psycopg.connect(database_url, autocommit=True) as conn:
                warm_up(port, key, conn, gunicorn_workers, processes, redis)
                health, health_released, _ = burst(
                    port, [Request("GET", "/healthz")] * len(fleet.hosts), concurrency
                )
                sent, released, wall_released = burst(port, requests, concurrency)
                # How far the workers had got when the web tier went idle: the rest of the
                # parse is the workers' own speed (their drain rate).
                at_burst_end = _pipeline_state(conn, fleet.job)["parsed"]
                acked = [s for s in sent if s.status == 202]
                last_ack = max((s.done for s in acked), default=released)
                say(
                    f"load: {len(acked)}/{len(sent)} acknowledged in {last_ack - released:.1f}s;"
                    f" {at_burst_end} parsed by then"
                )
                state, classified_seen = wait_for_pipeline(
                    conn, fleet.job, len(fleet.hosts), processes, redis
                )
                counts = integrity(conn, fleet.job)
                # Replays: the same bytes again, as an agent that lost the answer sends them.
                step = max(1, len(requests) // max(1, replays))
                picked = list(range(0, len(requests), step))[:replays]
                again, _, _ = burst(port, [requests[i] for i in picked], concurrency)
                replay_ok = sum(
                    1
                    for i, answer in zip(picked, again, strict=True)
                    if answer.status == 202
                    and answer.answer.get("duplicate") is True
                    and answer.answer.get("id") == sent[i].answer.get("id")
                )
                # Give a replay's (wrongly) enqueued parse time to show before counting again.
                time.sleep(SETTLE_SECONDS)
                after_replays = integrity(conn, fleet.job)
            copy = copy_peer(database_url, fleet.job)
    finally:
        drop_database(name, admin=pg_admin)
        redis_flush(redis)
    say(f"load: classified {classified_seen - last_ack:.1f}s after the last 202")
    burst_s = last_ack - released
    last_parsed = state["last_parsed"].timestamp() - wall_released if state["last_parsed"] else 0
    rows = counts["uploads"] + counts["events"]
    incident = state.get("incident") or {}
    latencies = [s.done - s.started for s in acked]
    health_ok = [h for h in health if h.status == 200]
    health_last = max((h.done for h in health_ok), default=health_released)
    ids = [s.answer.get("id") for s in acked]
    n = len(fleet.hosts)
    return {
        "hosts": n,
        "world": fleet.world,
        "workers": workers,
        "split": split,
        "label": label(workers, split),
        "queues": assignments,
        "redis": redis,
        "concurrency": concurrency,
        "gunicorn_workers": gunicorn_workers,
        "settle_s": SETTLE_SECONDS,
        "acknowledged": len(acked),
        "refused": dict(Counter(s.status for s in sent if s.status != 202)),
        "deferred": dict(sum((s.deferred for s in sent), Counter())),
        "errors": [s.error for s in sent if s.status != 202][:5],
        "burst_s": burst_s,
        "uploads_per_s": len(acked) / max(1e-9, burst_s),
        "p50_s": percentile(latencies, 50),
        "p99_s": percentile(latencies, 99),
        "healthz_ok": len(health_ok),
        "healthz_per_s": len(health_ok) / max(1e-9, health_last - health_released),
        "healthz_p50_s": percentile([h.done - h.started for h in health_ok], 50),
        "healthz_p99_s": percentile([h.done - h.started for h in health_ok], 99),
        "parsed": state["parsed"],
        "failed": state["failed"],
        "parsed_at_burst_end": at_burst_end,
        "last_parsed_s": last_parsed,
        "parsed_after_last_ack_s": last_parsed - burst_s,
        "drain_per_s": (n - at_burst_end) / max(1e-9, last_parsed - burst_s),
        "rows": rows,
        "rows_per_s": rows / max(1e-9, last_parsed),
        "copy": copy,
        "classified_after_last_ack_s": classified_seen - last_ack,
        "incident_ranks": incident.get("ranks", []),
        "incident_culprit": incident.get("culprit", ""),
        "planted_rank": fleet.culprit,
        "counts": counts,
        "after_replays": after_replays,
        "replays": len(picked),
        "replays_ok": replay_ok,
        "gates": {
            "acknowledged": len(acked) == n,
            "none_lost": counts["uploads"] == n and counts["hosts"] == n and state["parsed"] == n,
            "none_duplicated": counts["distinct_uploads"] == counts["uploads"]
            and counts["events"] == counts["events_declared"]
            and counts["events_twice"] == 0
            and len(set(ids)) == len(ids)
            and after_replays == counts
            and replay_ok == len(picked),
            "culprit_named": incident.get("ranks", [None])[:1] == [str(fleet.culprit)],
        },
    }


# --- the bench rows -------------------------------------------------------------------------

# The "classified within a stated number of seconds of the last upload", for a burst of
# up to 2,048 hosts on one machine.
CLASSIFIED_WITHIN_S = 60.0


def rows_for(result: dict, classify_s: float) -> list[dict]:
    n = result["hosts"]
    name = f"load {n:,} hosts, {result['label']}"
    gates = result["gates"]
    floor = result["settle_s"] + classify_s
    return [
        scenario(
            name,
            "uploads acknowledged (202)",
            result["acknowledged"],
            "uploads sent",
            n,
            "==",
            1,
            gate=True,
            note=f"told to come back and retried: {result['deferred'] or 'never'}; refused: "
            f"{result['refused'] or 'none'}",
        ),
        scenario(
            name,
            "uploads stored and parsed (none lost)",
            result["counts"]["uploads"] if gates["none_lost"] else 0,
            "uploads sent",
            n,
            "==",
            1,
            gate=True,
            note=f"{result['counts']['uploads']} Upload rows from {result['counts']['hosts']} "
            f"hosts; {result['parsed']} parsed, {result['failed']} failed",
        ),
        scenario(
            name,
            "rows stored once (none duplicated)",
            result["rows"] if gates["none_duplicated"] else 0,
            "Upload + Event rows",
            result["rows"],
            "==",
            1,
            gate=True,
            note=f"{result['replays_ok']}/{result['replays']} replays answered duplicate=true "
            f"with the first id; {result['counts']['events_twice']} events stored twice",
        ),
        scenario(
            name,
            "incident names the planted rank",
            float(gates["culprit_named"]),
            "planted rank",
            1.0,
            "==",
            1,
            gate=True,
            note=f"planted rank {result['planted_rank']} of {result['world']}; rank suspects "
            f"{result['incident_ranks'][:3]}, culprit class {result['incident_culprit']}",
        ),
        scenario(
            name,
            "rows/s stored",
            result["rows_per_s"],
            "psycopg COPY of the same rows",
            result["copy"]["rows_per_s"],
            ">=",
            0.3,
            note=f"{result['rows']:,} rows ({n:,} Upload + {result['counts']['events']:,} "
            f"Event) stored {result['last_parsed_s']:.1f}s after the release; the COPY "
            f"{result['copy']['seconds']:.2f}s",
        ),
        scenario(
            name,
            "uploads/s",
            result["uploads_per_s"],
            "GET /healthz/s, same server and clients",
            result["healthz_per_s"],
            ">=",
            0.25,
            note=f"{n:,} uploads acknowledged in {result['burst_s']:.1f}s, {result['concurrency']}"
            f" clients, gunicorn x{result['gunicorn_workers']} sync",
        ),
        scenario(
            name,
            "p50 time to 202 (s)",
            result["p50_s"],
            "p50 of GET /healthz",
            result["healthz_p50_s"],
            "<=",
            4,
        ),
        scenario(
            name,
            "p99 time to 202 (s)",
            result["p99_s"],
            "p99 of GET /healthz",
            result["healthz_p99_s"],
            "<=",
            4,
        ),
        scenario(
            name,
            "s from last 202 to incident classified",
            result["classified_after_last_ack_s"],
            "settle + pure classify in-process",
            floor,
            "<=",
            2,
            note=f"{result['parsed_at_burst_end']:,} of {n:,} parsed at the last 202, the rest "
            f"{result['parsed_after_last_ack_s']:.1f}s later ({result['drain_per_s']:.1f}/s); "
            f"settle {result['settle_s']:g}s; the pure core on the same events {classify_s:.1f}s",
        ),
        scenario(
            name,
            "s from last 202 to incident classified",
            result["classified_after_last_ack_s"],
            "stated bound",
            CLASSIFIED_WITHIN_S,
            "<=",
            1,
        ),
    ]


def scale_rows(one: dict, more: dict) -> list[dict]:
    """A layout of more workers against one worker, both measured in this run."""
    name = f"load {one['hosts']:,} hosts: {more['label']} vs 1"
    note = f"{os.cpu_count()} CPUs shared by gunicorn, the workers, PostgreSQL, Redis, clients"
    return [
        scenario(
            name,
            "rows/s stored",
            more["rows_per_s"],
            "1 worker",
            one["rows_per_s"],
            ">=",
            1.5,
            note=note,
        ),
        scenario(
            name,
            "uploads parsed/s after the burst (drain)",
            more["drain_per_s"],
            "1 worker",
            one["drain_per_s"],
            ">=",
            1.5,
            note=f"left to parse at the last 202: {one['hosts'] - one['parsed_at_burst_end']:,} "
            f"(1 worker), {more['hosts'] - more['parsed_at_burst_end']:,} ({more['label']})",
        ),
        scenario(
            name,
            "s from last 202 to incident classified",
            more["classified_after_last_ack_s"],
            "1 worker",
            one["classified_after_last_ack_s"],
            "<=",
            0.67,
        ),
    ]


# (workers, split) per run: one worker on both queues; two, each on both; two, a queue each.
LAYOUTS = ((1, False), (2, False), (2, True))


def measure(
    hosts: int,
    layouts: tuple[tuple[int, bool], ...],
    workdir: Path,
    *,
    say=print,
    details: dict | None = None,
    **options,
) -> list[dict]:
    """Make the fleet, measure the floor, run the scenario per layout; the bench rows.
    ``details`` (when given) receives every measured figure."""
    fleet = make_fleet(hosts)
    classify_s, floor_ranks = classify_floor(fleet)
    say(f"load: {hosts} bundles made; the pure core classifies them in {classify_s:.1f}s")
    results = [
        run_once(fleet, workdir, workers=workers, split=split, say=say, **options)
        for workers, split in layouts
    ]
    rows = [row for result in results for row in rows_for(result, classify_s)]
    single = next((r for r in results if r["workers"] == 1), None)
    if single is not None:
        rows += [row for r in results if r["workers"] > 1 for row in scale_rows(single, r)]
    if details is not None:
        details.update(
            {
                "classify_s": classify_s,
                "classify_ranks": floor_ranks[:3],
                "runs": {r["label"]: r for r in results},
            }
        )
    return rows


def run(workdir: Path, *, quick: bool, say=print, details: dict | None = None) -> list[dict]:
    """The ``python -m bench`` scenario: 2,048 hosts in every layout; ``--quick`` 128 hosts
    with one worker."""
    hosts, layouts = (128, LAYOUTS[:1]) if quick else (2048, LAYOUTS)
    return measure(hosts, layouts, workdir, say=say, details=details)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.load",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--hosts", type=int, default=2048, help="hosts, 8 ranks each (2048)")
    parser.add_argument(
        "--layouts",
        nargs="+",
        default=["1", "2", "2split"],
        help="worker layouts: N (N workers on every queue) or Nsplit (a queue each); "
        "default 1 2 2split",
    )
    parser.add_argument("--concurrency", type=int, default=CONCURRENCY, help="clients (256)")
    parser.add_argument("--gunicorn-workers", type=int, default=GUNICORN_WORKERS, help="(4)")
    args = parser.parse_args(argv)
    try:
        layouts = tuple((int(v.removesuffix("split")), v.endswith("split")) for v in args.layouts)
    except ValueError:
        parser.error("--layouts takes N or Nsplit, e.g. 1 2 2split")
    if args.hosts < 2 or min(w for w, _ in layouts) < 1 or args.concurrency < 1:
        parser.error("--hosts must be at least 2, workers and --concurrency at least 1")
    exit_on_sigterm()
    from .report import machine, markdown

    details: dict = {}
    with tempfile.TemporaryDirectory(prefix="fleetwatch-load-") as workdir:
        rows = measure(
            args.hosts,
            layouts,
            Path(workdir),
            say=lambda m: print(m, file=sys.stderr, flush=True),
            details=details,
            concurrency=args.concurrency,
            gunicorn_workers=args.gunicorn_workers,
        )
    print(json.dumps(details, indent=2, default=str), file=sys.stderr)
    print(markdown({"run": "bench.load", "machine": machine(ROOT), "scenarios": rows}))
    return 0 if all(r["met"] for r in rows if r["gate"]) else 1


if __name__ == "__main__":
    sys.exit(main())
