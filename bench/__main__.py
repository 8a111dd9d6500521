"""``python -m bench [--quick] [--only SCENARIO ...] [--size-mb N] [--out DIR]``."""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

from . import accuracy, crossrank, diagnosis, matrix
from . import agent as agent_bench
from . import fleet as fleet_bench
from . import load as load_bench
from ._services import exit_on_sigterm
from .report import machine, markdown, scenario

MIB = 1 << 20


SCENARIOS = ("accuracy", "diagnosis", "crossrank", "agent", "matrix", "fleet", "load")


def _args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    parser.add_argument(
        "--quick",
        action="store_true",
        help="a CI-sized run: 20 MB log, Drain3 on 2 MB, smaller fleets, 128-host load burst",
    )
    parser.add_argument(
        "--size-mb",
        type=int,
        default=None,
        help="each generated log's size (1024; 20 with --quick)",
    )
    parser.add_argument(
        "--drain-mb",
        type=int,
        default=None,
        help="prefix Drain3 and the pass both read (32; 2 with --quick)",
    )
    parser.add_argument("--seed", type=int, default=4187, help="generator seed (4187)")
    parser.add_argument("--out", type=Path, default=Path("bench-results"), help="bench-results/")
    parser.add_argument(
        "--only",
        nargs="+",
        choices=SCENARIOS,
        default=SCENARIOS,
        help="run these scenarios only (the report holds just their rows)",
    )
    args = parser.parse_args(argv)
    if args.size_mb is None:
        args.size_mb = 20 if args.quick else 1024
    if args.drain_mb is None:
        args.drain_mb = 2 if args.quick else 32
    if args.size_mb < 1 or args.drain_mb < 1:
        parser.error("--size-mb and --drain-mb must be at least 1")
    return args


def _notes(args: argparse.Namespace, elapsed: float) -> list[str]:
    notes = []
    if "diagnosis" in args.only:
        notes += [
            f"Diagnosis: {args.size_mb} MiB generated log per mix (seed {args.seed}); every pass "
            "reads it from the page cache, right after it was written.",
            f"Drain3 and the diagnosis pass both read the first {args.drain_mb} MiB of each mix: "
            "at Drain3's speed the whole file would take far longer than the run should.",
        ]
    notes.append("Timed figures are the best of 3 alternated runs; ratios only, no absolute goals.")
    if "load" in args.only:
        notes.append(
            f"Load: {'128 hosts, one worker' if args.quick else '2,048 hosts, each layout'}; "
            f"gunicorn x{load_bench.GUNICORN_WORKERS} sync workers, Celery prefork concurrency 1 "
            f"per worker, FLEETWATCH_SETTLE_SECONDS={load_bench.SETTLE_SECONDS:g}, "
            f"{load_bench.CONCURRENCY} clients on loopback, a scratch PostgreSQL database and "
            "a free Redis db number; the processes share this machine's CPUs."
        )
    notes.append(f"Whole run: {elapsed:.0f}s.")
    return notes


def main(argv: list[str] | None = None) -> int:
    args = _args(argv)
    started = time.perf_counter()

    def say(message: str) -> None:
        print(f"[{time.perf_counter() - started:6.1f}s] {message}", file=sys.stderr, flush=True)

    def guarded(name: str, run) -> list[dict]:
        """A scenario that cannot run (a service down, a crash) is an invalid row in the
        report, not a missing report."""
        try:
            return run()
        except Exception as exc:
            say(f"{name}: failed: {type(exc).__name__}: {exc}")
            return [
                scenario(
                    name,
                    "scenario ran",
                    0.0,
                    "ran to the end",
                    1.0,
                    "==",
                    1,
                    gate=True,
                    note=f"{type(exc).__name__}: {str(exc)[:300]}",
                )
            ]

    exit_on_sigterm()
    details: dict = {}
    load_details: dict = {}
    with tempfile.TemporaryDirectory(prefix="fleetwatch-bench-") as workdir:
        work = Path(workdir)
        scenarios: list[dict] = []
        if "diagnosis" in args.only:
            result = diagnosis.run(
                work, args.size_mb * MIB, args.drain_mb * MIB, seed=args.seed, say=say
            )
            details["diagnosis"] = result["details"]
            scenarios += result["scenarios"]
        runs = {
            "accuracy": lambda: accuracy.run(quick=args.quick, say=say),
            "crossrank": lambda: crossrank.run(work, quick=args.quick, say=say),
            "agent": lambda: agent_bench.run(work, quick=args.quick, say=say),
            "matrix": lambda: matrix.run(work, quick=args.quick, say=say),
            "fleet": lambda: fleet_bench.run(work, quick=args.quick, say=say),
            "load": lambda: load_bench.run(work, quick=args.quick, say=say, details=load_details),
        }
        for name, run in runs.items():
            if name in args.only:
                scenarios += guarded(name, run)
    details["load"] = load_details
    elapsed = time.perf_counter() - started
    report = {
        "run": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "args": {
            "quick": args.quick,
            "size_mb": args.size_mb,
            "drain_mb": args.drain_mb,
            "seed": args.seed,
            "only": list(args.only),
        },
        "machine": machine(diagnosis.REPO),
        "seconds": elapsed,
        "scenarios": scenarios,
        "details": details,
        "notes": _notes(args, elapsed),
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "bench.json").write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    text = markdown(report)
    (args.out / "bench.md").write_text(text, encoding="utf-8")
    print(text)
    invalid = list(
        dict.fromkeys(row["name"] for row in report["scenarios"] if row["gate"] and not row["met"])
    )
    if invalid:
        print(
            f"INVALID RUN: {', '.join(invalid)}: a gate failed (what was planted was not found, "
            "an upload was lost or stored twice, or a scenario did not run), so the figures "
            "beside it mean nothing.",
            file=sys.stderr,
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
