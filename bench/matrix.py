"""The fault matrix end to end (issue 15): real 4-rank torch jobs with one planted fault each
(``tests/torchjobs/matrix/``, written blind to the rules), an agent per simulated host, and the
server as production runs it: gunicorn, a Celery worker on Redis, PostgreSQL and a settle window
of SETTLE_SECONDS (a scratch database and Redis db, taken as the load scenario takes them).

Per fault: whether the incident names the planted class and rank (the healthy job: no
incident), how many verdict revisions it took (goal: one), and how long after the last upload
the final verdict was stored (goal: within 5 s past the settle window). Gates: every job ended
by itself, every spool drained.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from datetime import datetime
from pathlib import Path

from ._services import (
    ROOT,
    Processes,
    drop_database,
    manage,
    postgres_database,
    redis_flush,
    redis_free_db,
)
from .load import service_env, start_services
from .report import scenario

MATRIX = ROOT / "tests" / "torchjobs" / "matrix"
QUICK_FAULTS = ("healthy", "sleep_before_collective", "rank_raises", "loader_starved_midrun")
HOSTS = ("host-a", "host-b")
SETTLE_SECONDS = 2.0
VERDICT_WAIT_S = 120.0


def _run_jobs(faults: list[str], root: Path, say) -> dict[str, Path]:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    out: dict[str, Path] = {}
    for start in range(0, len(faults), 2):  # two at a time: eight ranks on two cores
        running = []
        for i, fault in enumerate(faults[start : start + 2], start=start + 1):
            outdir = root / f"job-{i}"
            log = (root / f"job-{i}.out").open("wb")
            argv = [sys.executable, "-m", "tests.torchjobs.matrix.run", fault, str(outdir)]
            proc = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
            running.append((fault, outdir, log, proc))
        for fault, outdir, log, proc in running:
            proc.wait(timeout=300)
            log.close()
            out[fault] = outdir
        say(f"matrix: {min(start + 2, len(faults))}/{len(faults)} jobs ran")
    return out


MISSES = ROOT / "var" / "bench-misses"


def _keep(outdir: Path, fault: str) -> Path:
    """Copy a job whose verdict was wrong out of the bench's temporary directory (var/ is the
    checkout's own, ignored by git): a verdict that depends on load is read from its artifacts."""
    import shutil

    target = MISSES / f"{fault}-{datetime.now():%Y%m%d-%H%M%S}"
    shutil.copytree(outdir, target, symlinks=True, ignore_dangling_symlinks=True)
    return target


def _job_of(outdir: Path) -> str:
    return "elastic:" + json.loads((outdir / "harness.json").read_text())["job_id"]


def _ship(outdir: Path, server: str, key: str) -> tuple[float, bool]:
    """Both hosts' agents ship what the job left; (when the last item was sent, all drained)."""
    from tests.torchjobs.matrix_runs import host_agent

    drained = True
    for host in HOSTS:
        drained &= host_agent(outdir, host, server, key).flush(timeout_s=120)
    return time.time(), drained


def _get(server: str, key: str, path: str, **query) -> dict:
    url = f"{server}{path}?{urllib.parse.urlencode(query)}"
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {key}"})  # noqa: S310
    with urllib.request.urlopen(request, timeout=30) as answer:  # noqa: S310 (loopback)
        return json.loads(answer.read())


def _final_incident(server: str, key: str, job: str, expected: bool) -> dict | None:
    """The incident once every upload of the job is parsed and the settle window has passed
    with the verdict unchanged (None for a job that gets none). A failed job's missing incident
    is not taken as final before the deadline: a busy worker may classify later than one
    settle window."""
    deadline = time.monotonic() + VERDICT_WAIT_S
    while time.monotonic() < deadline:
        pending = sum(
            _get(server, key, "/api/v1/uploads", job=job, status=status)["count"]
            for status in ("received", "parsing")
        )
        if not pending:
            break
        time.sleep(0.5)
    last = None
    while time.monotonic() < deadline:
        time.sleep(SETTLE_SECONDS + 1.0)
        found = _get(server, key, "/api/v1/incidents", job=job)["results"]
        now = found[0] if found else None
        state = (now or {}).get("classified_at"), len((now or {}).get("revisions", []))
        if state == last and (now is not None or not expected):
            return now
        last = state
    return None


def run(workdir: Path, *, quick: bool, say) -> list[dict]:
    expected = json.loads((MATRIX / "expected.json").read_text())
    faults = list(QUICK_FAULTS if quick else expected)
    root = workdir / "matrix"
    root.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    jobs = _run_jobs(faults, root, say)
    jobs_s = time.perf_counter() - started
    ended = sum(not (d / "DEADLINE_KILLED.txt").exists() for d in jobs.values())

    name = f"fleetwatch_matrix_{os.getpid()}"
    database_url = postgres_database(name)
    redis = redis_free_db()
    if database_url is None or redis is None:
        raise RuntimeError("the matrix scenario needs PostgreSQL and a free Redis db on loopback")
    redis_flush(redis)
    env = service_env(database_url, redis, root / "server")
    env["FLEETWATCH_SETTLE_SECONDS"] = str(SETTLE_SECONDS)
    right = revisions = late = 0
    worst_after_s = 0.0
    notes, drained_all = [], True
    try:
        with Processes(root / "logs") as processes:
            manage("migrate", "-v0", env=env)
            key = manage("agentkey", "create", "bench-matrix", "--scopes", "upload,read", env=env)
            key = key.strip().splitlines()[-1]
            port = start_services(
                processes, env, gunicorn_workers=2, assignments=[["ingest", "analysis"]]
            )
            server = f"http://127.0.0.1:{port}"
            for fault, outdir in jobs.items():
                want = expected[fault]
                last_send, drained = _ship(outdir, server, key)
                drained_all &= drained
                incident = _final_incident(server, key, _job_of(outdir), want["failed"])
                if not want["failed"]:
                    ok = incident is None
                    right += ok
                    notes.append(f"{fault}: {'no incident' if ok else incident['culprit']}")
                    continue
                if incident is None:
                    notes.append(f"{fault}: no incident")
                    continue
                ranks = [int(s["id"]) for s in incident["suspects"] if s["kind"] == "rank"]
                ok = incident["culprit"] == want["culprit"] and (
                    want["culprit_rank"] is None or ranks[:1] == [want["culprit_rank"]]
                )
                right += ok
                n = len(incident["revisions"])
                revisions += n
                final_at = datetime.fromisoformat(incident["revisions"][-1]["at"]).timestamp()
                after = max(0.0, final_at - last_send - SETTLE_SECONDS)
                worst_after_s = max(worst_after_s, after)
                late += after > 5.0
                notes.append(f"{fault}: {incident['culprit']} rank {ranks[:1]}, {n} revision(s)")
                if not ok:  # what it said instead, and the job's artifacts, to be read later
                    kept = _keep(outdir, fault)
                    notes.append(
                        f"{fault} said: {incident['summary'][:400]} (rules "
                        f"{', '.join(incident.get('rule_ids', [])) or 'none'}; "
                        f"artifacts kept in {kept})"
                    )
    finally:
        drop_database(name)
        redis_flush(redis)
    failed_faults = sum(expected[f]["failed"] for f in faults)
    return [
        scenario(
            "matrix",
            "jobs that ended by themselves",
            float(ended),
            "jobs run",
            float(len(faults)),
            "==",
            1,
            gate=True,
            note=f"{jobs_s:.0f}s of jobs",
        ),
        scenario(
            "matrix",
            "agents whose spools drained",
            float(drained_all),
            "all of them",
            1.0,
            "==",
            1,
            gate=True,
        ),
        scenario(
            "matrix",
            "faults with their class and rank (healthy: no incident)",
            float(right),
            "faults",
            float(len(faults)),
            "==",
            1,
            note="; ".join(notes),
        ),
        scenario(
            "matrix",
            "failed jobs",
            float(failed_faults),
            "verdict revisions stored for them",
            float(max(1, revisions)),
            "==",
            1,
            note="goal: one verdict per failed job; below 1, extra revisions",
        ),
        scenario(
            "matrix",
            "final verdicts within 5 s past the settle window after the last upload",
            float(failed_faults - late),
            "failed jobs",
            float(max(1, failed_faults)),
            "==",
            1,
            note=f"worst {worst_after_s:.1f}s past the settle window",
        ),
    ]
