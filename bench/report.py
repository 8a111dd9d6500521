"""The benchmark report: a list of scenario rows, the machine they ran on, JSON and Markdown.

A scenario row is a plain dict so that later scenarios (ingest, API, agents) only have to
return more rows: ``name``, ``metric``, ``value``, ``peer``, ``peer_value``, ``ratio``
(value / peer_value), ``goal`` (e.g. ``ratio >= 10``), ``met``, and optionally ``gate`` (the row
checks that the measurement itself is valid, not a performance goal) and ``note``.
"""

from __future__ import annotations

import operator
import os
import platform
import subprocess
import sys
from importlib import metadata
from pathlib import Path

_OPS = {">=": operator.ge, "<=": operator.le, "==": operator.eq}


def scenario(
    name: str,
    metric: str,
    value: float,
    peer: str,
    peer_value: float,
    op: str,
    goal: float,
    *,
    note: str = "",
    gate: bool = False,
) -> dict:
    ratio = value / peer_value if peer_value else None
    met = ratio is not None and _OPS[op](round(ratio, 6), goal)
    return {
        "name": name,
        "metric": metric,
        "value": value,
        "peer": peer,
        "peer_value": peer_value,
        "ratio": ratio,
        "goal": f"ratio {op} {goal:g}",
        "met": met,
        "gate": gate,
        "note": note,
    }


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as cpuinfo:
            for line in cpuinfo:
                key, _, value = line.partition(":")
                if key.strip() in ("model name", "Hardware", "Processor", "cpu model"):
                    return value.strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _commit(repo: Path) -> str:
    try:
        done = subprocess.run(
            ["git", "-C", str(repo), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return ""
    return done.stdout.strip()


def _version(package: str) -> str:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return "not installed"


def _service_versions() -> dict:
    """PostgreSQL and Redis server versions the load and fleet scenarios ran on, when
    reachable (loopback, the bench's defaults)."""
    versions = {}
    try:
        import psycopg

        from ._services import PG_ADMIN

        with psycopg.connect(PG_ADMIN, connect_timeout=3) as conn:
            versions["postgresql"] = conn.execute("SHOW server_version").fetchone()[0]
    except Exception as exc:
        versions["postgresql"] = f"not reachable ({type(exc).__name__})"
    try:
        import redis

        from ._services import REDIS

        client = redis.Redis.from_url(f"{REDIS}/0", socket_connect_timeout=3, socket_timeout=5)
        versions["redis"] = client.info("server")["redis_version"]
        client.close()
    except Exception as exc:
        versions["redis"] = f"not reachable ({type(exc).__name__})"
    return versions


def machine(repo: Path) -> dict:
    return {
        "platform": platform.platform(),
        "machine": platform.machine(),
        "cpu_count": os.cpu_count(),
        "cpu_model": _cpu_model(),
        "python": sys.version.split()[0],
        "implementation": platform.python_implementation(),
        "drain3": _version("drain3"),
        "commit": _commit(repo),
        **_service_versions(),
    }


def _num(value: float | None) -> str:
    if value is None:
        return "—"
    if isinstance(value, int) or float(value).is_integer():
        return f"{int(value):,}"
    if abs(value) >= 100:
        return f"{value:,.0f}"
    return f"{value:.3g}"


def _ratio(value: float) -> str:
    if value >= 10:
        return f"{value:.1f}"
    if value >= 0.1:
        return f"{value:.2f}"
    return f"{value:.3f}"


def markdown(report: dict) -> str:
    m = report["machine"]
    out = [
        f"# Fleetwatch benchmark — {report['run']}",
        "",
        f"{m['cpu_model']}, {m['cpu_count']} CPUs, {m['platform']}, "
        f"{m['implementation']} {m['python']}, drain3 {m['drain3']}, "
        f"PostgreSQL {m.get('postgresql', '?')}, Redis {m.get('redis', '?')}"
        + (f", commit {m['commit']}" if m["commit"] else ""),
        "",
        "| scenario | metric | value | peer | peer value | ratio | goal | met |",
        "|---|---|---:|---|---:|---:|---|---|",
    ]
    for row in report["scenarios"]:
        ratio = "—" if row["ratio"] is None else f"{_ratio(row['ratio'])}×"
        out.append(
            f"| {row['name']} | {row['metric']} | {_num(row['value'])} | {row['peer']} | "
            f"{_num(row['peer_value'])} | {ratio} | {row['goal']} | "
            f"{'yes' if row['met'] else '**no**'} |"
        )
    notes = [f"- {row['name']}: {row['note']}" for row in report["scenarios"] if row["note"]]
    if notes:
        out += ["", *notes]
    out += ["", *[f"- {line}" for line in report.get("notes", [])]]
    return "\n".join(out).rstrip() + "\n"
