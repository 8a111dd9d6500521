"""``fleetwatch-agent``: the node agent.

fleetwatch-agent run [--config FILE]          follow, spool and upload until SIGTERM
fleetwatch-agent once [--config FILE]         one collection pass, then upload what it can
fleetwatch-agent report-attempt --job J --event start|end [--status S] [--rank N …]
fleetwatch-agent status                       what the spool holds (per job) and has dropped
fleetwatch-agent check [--drain] [--node N]   this host's verdict for Slurm/NHC (agents/check.py)
"""

from __future__ import annotations

import argparse
import json
import logging
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from . import records
from .agent import Agent
from .config import ConfigError, load_config
from .identity import job_identity
from .readers import lower_priority
from .spool import Spool


def _report_attempt(config, args) -> int:
    import os

    ident = job_identity(os.environ, config.host)
    report = {
        "job": args.job or ident.job,
        "attempt": args.attempt if args.attempt is not None else ident.attempt,
        "event": args.event,
        "host": config.host,
        "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    if args.status:
        report["status"] = args.status
    if args.rank:
        report["ranks"] = args.rank
    if args.world_size:
        report["world_size"] = args.world_size
    if ident.job_name:
        report["job_name"] = ident.job_name
    spool = Spool(config.spool_dir, max_bytes=config.spool_max_bytes)
    spool.put(records.attempt_header(), records.encode(report))
    # Try now; if the server is away the running agent sends it later.
    agent = Agent(config)
    agent.uploader.drain(budget_s=10)
    print(json.dumps(report))
    return 0


def _check(config, args) -> int:
    from . import check

    try:
        key = Path(config.read_key_file).read_text().strip() if config.read_key_file else ""
        verdict = check.host_verdict(
            config.server, key or config.api_key(), config.host, args.timeout
        )
    except Exception as exc:  # any failure to ask: fail open, never drain on an outage
        check.warn(f"no verdict ({exc}); failing open")
        return 0
    node = args.node or config.host.split(".")[0]
    try:
        done = check.apply(node, verdict, drain=args.drain)
    except (OSError, subprocess.SubprocessError) as exc:
        check.warn(f"slurm: {exc}")
        done = f"slurm failed: {exc}"
    reasons = "; ".join(verdict.get("reasons") or ()) or "-"
    print(f"{config.host}: {verdict['verdict']} ({reasons}); action: {done}")
    return check.EXIT[verdict["verdict"]]


# A stop (SIGTERM, SIGINT) ends the agent within this many seconds, whatever the spool holds.
SHUTDOWN_S = 4.0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="fleetwatch-agent", description=__doc__)
    parser.add_argument("--config", help="TOML or INI file (else FLEETWATCH_CONFIG)")
    parser.add_argument("-v", "--verbose", action="store_true")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("run", help="follow, spool and upload until SIGTERM")
    sub.add_parser("once", help="one collection pass and upload")
    sub.add_parser("status", help="spool usage and losses, as JSON")
    report = sub.add_parser("report-attempt", help="mark an attempt start or end")
    report.add_argument("--job", help="job id (else from the scheduler environment)")
    report.add_argument("--attempt", type=int)
    report.add_argument("--event", choices=["start", "end"], required=True)
    report.add_argument("--status", choices=["succeeded", "failed", "unknown"])
    report.add_argument("--rank", type=int, action="append", help="a rank on this host")
    report.add_argument("--world-size", type=int)
    check = sub.add_parser(
        "check", help="this host's verdict for Slurm/NHC: exit 0 ok, 1 watch, 2 drain"
    )
    check.add_argument("--drain", action="store_true", help="drain/resume the node via scontrol")
    check.add_argument("--node", help="Slurm node name (else the configured host)")
    check.add_argument("--timeout", type=float, default=10.0)
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s fleetwatch-agent %(levelname)s %(message)s",
    )
    try:
        config = load_config(args.config)
    except (ConfigError, OSError) as exc:
        if args.command == "check":
            # 2 is "drain" to NHC and to a HealthCheckProgram wrapper: a broken or missing
            # configuration must not take the node offline. It fails open, and says so.
            from .check import warn

            warn(f"configuration: {exc}; failing open")
            return 0
        print(f"fleetwatch-agent: {exc}", file=sys.stderr)
        return 2

    if args.command == "report-attempt":
        if args.event == "end" and not args.status:
            parser.error("--event end needs --status")
        return _report_attempt(config, args)
    if args.command == "check":
        return _check(config, args)
    if args.command == "status":
        spool = Spool(config.spool_dir, max_bytes=config.spool_max_bytes)
        items, size = spool.usage()
        state = spool.state()
        # What is waiting, per job and attempt: whose evidence is queued behind whose.
        by_job: dict[str, dict[str, int]] = {}
        for item in spool.items():
            job = str(item.header.get("job") or "(attempt reports)")
            key = f"{job}#{int(item.header.get('attempt') or 0)}"
            row = by_job.setdefault(key, {"items": 0, "bytes": 0})
            row["items"] += 1
            row["bytes"] += item.size
        print(
            json.dumps(
                {
                    "items": items,
                    "bytes": size,
                    "dropped_items": state.dropped_items,
                    "dropped_bytes": state.dropped_bytes,
                    "rejected": state.extra.get("rejected", 0),
                    "by_job": dict(sorted(by_job.items())),
                }
            )
        )
        return 0

    applied = lower_priority(config.nice, config.io_idle)
    agent = Agent(config)
    logging.getLogger("fleetwatch.agent").info(
        "agent up: host %s, server %s, spool %s (%s)",
        config.host,
        config.server or "(none: spooling only)",
        config.spool_dir,
        ", ".join(applied) or "default priority",
    )
    if args.command == "once":
        return 0 if agent.flush(timeout_s=30) else 1
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    # The loop runs beside the main thread so that a stop is honoured within SHUTDOWN_S
    # whatever it is doing: an upload to a server that does not answer blocks its thread for up
    # to request_timeout_s, and a full spool can hold thousands of items. Nothing is lost by
    # leaving early: the spool is on disk, and an upload cut off mid-request is sent again on
    # the next start (the server answers a repeat with the first upload's id).
    loop = threading.Thread(target=agent.run, args=(stop,), name="agent-loop", daemon=True)
    loop.start()
    while loop.is_alive() and not stop.is_set():
        stop.wait(1.0)
    loop.join(timeout=SHUTDOWN_S / 2)
    if not loop.is_alive():
        # One short last pass: what the job wrote last, sent if the server answers at once.
        agent.uploader.request_timeout_s = 1.0
        agent.flush(timeout_s=SHUTDOWN_S / 4)
    logging.getLogger("fleetwatch.agent").info(
        "agent stopped; %d items left in the spool for the next start", len(agent.spool.names())
    )
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
