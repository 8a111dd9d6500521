"""Fleet memory at fleet scale: a simulated fleet with planted culprits, end to end.

``manage.py simulate_fleet`` sends every attempt and every failure's artifacts through the real
API and task path into a fresh database (PostgreSQL when reachable, as production runs), then
``evaluate_fleet`` scores the flagged culprits against the planted truth. Reported as ratios:
planted culprits found, precision, incidents needed before flagging, and wall time against an
hour (the goal is minutes, not hours).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from ._services import ROOT, drop_database, postgres_database
from .report import scenario


def run(workdir: Path, *, quick: bool, say) -> list[dict]:
    hosts, days, seed = (128, 3, 2) if quick else (1000, 7, 11)
    name = f"fleetwatch_bench_{os.getpid()}"
    url = postgres_database(name)
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "CELERY_BROKER_URL")}
    env["FLEETWATCH_DATA_DIR"] = str(workdir / "fleet")
    engine = "PostgreSQL" if url else "SQLite"
    if url:
        env["DATABASE_URL"] = url
    manage = [sys.executable, str(ROOT / "manage.py")]
    truth = workdir / "fleet-truth.json"
    say(f"fleet memory: {hosts} hosts x {days} days on {engine}")
    try:
        subprocess.run([*manage, "migrate", "-v0"], env=env, check=True, cwd=ROOT)
        started = time.perf_counter()
        subprocess.run(
            [
                *manage,
                "simulate_fleet",
                "--hosts",
                str(hosts),
                "--days",
                str(days),
                "--seed",
                str(seed),
                "--truth",
                str(truth),
            ],
            env=env,
            check=True,
            cwd=ROOT,
            stdout=subprocess.DEVNULL,
        )
        wall = time.perf_counter() - started
        out = subprocess.run(
            [*manage, "evaluate_fleet", "--truth", str(truth)],
            env=env,
            check=True,
            cwd=ROOT,
            capture_output=True,
            text=True,
        ).stdout
    finally:
        if url:
            drop_database(name)
    result = json.loads(out)
    plants = result["plants"]
    found = sum(p["flagged"] for p in plants)
    after = [p["after_incidents"] for p in plants if p["after_incidents"] is not None]
    note = (
        f"{hosts} hosts, {days} days, seed {seed}, {engine}: {result['attempts']} attempts, "
        f"{result['failures']} failures ({result['noise_failures']} background noise); "
        + "; ".join(f"{p['id']} after {p['after_incidents']}" for p in plants)
    )
    say(f"fleet memory: {found}/{len(plants)} found, precision {result['precision']}, {wall:.0f} s")
    return [
        scenario(
            "fleet: planted culprits flagged",
            "culprits",
            found,
            "planted culprits",
            len(plants),
            ">=",
            1.0,
            note=note,
        ),
        scenario(
            "fleet: precision of flagged culprits",
            "precision",
            result["precision"],
            "perfect precision",
            1.0,
            ">=",
            0.9,
            note=f"false positives: {result['false_positives'] or 'none'}",
        ),
        scenario(
            "fleet: incidents before flagging (worst plant)",
            "incidents",
            max(after) if after else 0,
            "goal of 3",
            3,
            "<=",
            1.0,
            note=f"mean {sum(after) / len(after):.1f}" if after else "",
        ),
        scenario(
            "fleet: simulate + analyse wall time",
            "seconds",
            round(wall, 1),
            "one hour",
            3600.0,
            "<=",
            0.25,
            note=f"{engine}, this machine",
        ),
    ]
