"""Run one 4-rank job of the fault matrix as two simulated hosts of two ranks each.

    python -m tests.torchjobs.matrix.run FAULT OUTDIR [--planted-rank N] [--job-id ID]
                                          [--deadline SECONDS] [--shared-root DIR]

Two torchrun invocations (--nnodes=2 --nproc-per-node=2, --node-rank 0 and 1, static
rendezvous on 127.0.0.1 with a free port) run train.py. Static rendezvous fixes the placement:
global ranks 0-1 on host-a, 2-3 on host-b. OUTDIR gets:

  host-a/, host-b/   what the host keeps: rank<R>.log (stdout+stderr of global rank R),
                     torchrun.log (the launcher's console), fleetwatch/ (FLEETWATCH_ROOT: the
                     spool, run/fr Flight Recorder dumps, run/progress heartbeats), runs/
                     (the trainer's own log dir, rank 0 writes there), torchelastic/ (torchrun's
                     --log-dir: per-rank error.json of ranks that raised)
  exit_codes.json    {"0": code, ...} per global rank: the trainer's exit code, negative for a
                     signal, null if it was never recorded (killed at the deadline)
  harness.json       job id, port, wall time, the launchers' exit codes, whether the deadline hit
  DEADLINE_KILLED.txt  only when the deadline killed the job

With --shared-root DIR, each host's Fleetwatch root and rank logs live under DIR/<host>/
instead (fleetwatch/, logs/<job>.rank<R>.log), shared with any other job run with the same DIR.

Nothing under OUTDIR names the fault. Exits 0 when the job ended by itself (whatever its
outcome), 124 when the deadline killed it.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import socket
import stat
import subprocess
import sys
import time
import uuid
from pathlib import Path

import psutil

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[2]
TRAIN = HERE / "train.py"
HOSTS = ("host-a", "host-b")
NPROC = 2
DEADLINE_S = 90.0
STRAGGLER_GRACE_S = 10.0

sys.path.insert(0, str(HERE))
from catalog import FAULTS  # noqa: E402


def host_of(rank: int) -> str:
    return HOSTS[rank // NPROC]


def expected_for(fault: str, planted_rank: int | None = None) -> dict:
    """expected.json's entry for ``fault``, moved to ``planted_rank`` when it is planted
    elsewhere than by default."""
    entry = dict(json.loads((HERE / "expected.json").read_text())[fault])
    if planted_rank is not None and entry.get("culprit_rank") is not None and fault != "slow_mount":
        entry["culprit_rank"] = planted_rank
        entry["culprit_host"] = host_of(planted_rank)
    return entry


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def host_env(fleetwatch_root: Path, host: str) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("FLEETWATCH_", "TORCH_NCCL_", "TORCH_FR_", "TORCHELASTIC_", "MASTER_"))
        and k
        not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "GROUP_RANK", "NODE_RANK", "LOCAL_WORLD_SIZE")
    }
    env.update(
        FLEETWATCH_ROOT=str(fleetwatch_root),
        FLEETWATCH_HOST=host,
        PYTHONPATH=os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p),
        PYTHONDONTWRITEBYTECODE="1",
        PYTHONUNBUFFERED="1",
        OMP_NUM_THREADS="1",
    )
    return env


def launch(
    node_rank: int,
    outdir: Path,
    port: int,
    job_id: str,
    train_args: list[str],
    shared_root: Path | None = None,
) -> subprocess.Popen:
    host = HOSTS[node_rank]
    host_dir = outdir / host
    host_dir.mkdir(parents=True)
    # --shared-root: the host's Fleetwatch root (spool, run dir) and its log directory are
    # shared with whatever other job runs on that host at the same time, and rank logs are
    # named by job (as `--output=%j.%t.log` names them), so two jobs write side by side.
    fleetwatch_root = (shared_root / host if shared_root else host_dir) / "fleetwatch"
    log_dir = shared_root / host / "logs" if shared_root else host_dir
    log_dir.mkdir(parents=True, exist_ok=True)
    env = host_env(fleetwatch_root, host)
    if shared_root:
        env["MATRIX_LOG_NAME"] = job_id + ".rank{rank}.log"
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nnodes=2",
        f"--nproc-per-node={NPROC}",
        f"--node-rank={node_rank}",
        "--rdzv-backend=static",
        "--master-addr=127.0.0.1",
        f"--master-port={port}",
        f"--rdzv-id={job_id}",
        "--max-restarts=0",
        "--monitor-interval=0.1",
        f"--log-dir={host_dir / 'torchelastic'}",
        "-m",
        "tests.torchjobs.matrix.rankexec",
        str(log_dir),
        str(outdir / ".exit"),
        "--",
        str(TRAIN),
        *train_args,
    ]
    console = (host_dir / "torchrun.log").open("wb")
    try:
        return subprocess.Popen(
            cmd,
            cwd=host_dir,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=console,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group, so a hung launcher can be killed
        )
    finally:
        console.close()


class Tree:
    """Every process the launchers start, remembered by pid and start time so that only they
    are ever signalled (a recycled pid is someone else's)."""

    def __init__(self) -> None:
        self.known: dict[int, float] = {}

    def scan(self, roots: list[subprocess.Popen]) -> None:
        for root in roots:
            try:
                for p in psutil.Process(root.pid).children(recursive=True):
                    self.known.setdefault(p.pid, p.create_time())
            except psutil.Error:
                continue

    def alive(self) -> list[psutil.Process]:
        out = []
        for pid, created in self.known.items():
            try:
                p = psutil.Process(pid)
                if p.create_time() == created and p.status() != psutil.STATUS_ZOMBIE:
                    out.append(p)
            except psutil.Error:
                continue
        return out

    def kill(self) -> list[int]:
        mine = os.getpgrp()
        killed = []
        for p in self.alive():
            try:
                pgid = os.getpgid(p.pid)
                if pgid != mine and pgid == p.pid:
                    os.killpg(pgid, signal.SIGKILL)
                else:
                    p.kill()
                killed.append(p.pid)
            except (OSError, psutil.Error):
                continue
        return killed


def remove_fifos(root: Path) -> None:
    """The integration's debug pipes are FIFOs: useless after the job, and a copy of OUTDIR
    that opens them would block."""
    for path in root.rglob("*"):
        try:
            if stat.S_ISFIFO(path.lstat().st_mode):
                path.unlink()
        except OSError:
            continue


def run(
    fault: str,
    outdir: str | Path,
    planted_rank: int | None = None,
    job_id: str | None = None,
    deadline_s: float = DEADLINE_S,
    shared_root: str | Path | None = None,
) -> dict:
    if fault not in FAULTS:
        raise SystemExit(f"unknown fault {fault!r}; one of {', '.join(FAULTS)}")
    outdir = Path(outdir).resolve()
    outdir.mkdir(parents=True, exist_ok=True)
    if any((outdir / h).exists() for h in HOSTS):
        raise SystemExit(f"{outdir} already holds a job")
    job_id = job_id or f"matrix-{uuid.uuid4().hex[:10]}"
    port = free_port()
    train_args = ["--fault", fault]
    if planted_rank is not None:
        train_args += ["--planted-rank", str(planted_rank)]

    started = time.monotonic()
    shared = Path(shared_root).resolve() if shared_root else None
    launchers = [launch(k, outdir, port, job_id, train_args, shared) for k in range(len(HOSTS))]
    tree = Tree()
    deadline_hit = False
    while any(p.poll() is None for p in launchers):
        tree.scan(launchers)
        if time.monotonic() - started > deadline_s:
            deadline_hit = True
            break
        time.sleep(0.2)
    launchers_ended = time.monotonic() - started
    killed: list[int] = []
    if deadline_hit:
        for p in launchers:
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                    killed.append(p.pid)
                except OSError:
                    pass
        killed += tree.kill()
        for p in launchers:
            p.wait()
    # Ranks' loader workers notice a dead parent on their own within a few seconds.
    grace_end = time.monotonic() + STRAGGLER_GRACE_S
    while tree.alive() and time.monotonic() < grace_end:
        time.sleep(0.2)
    stragglers = tree.kill()
    wall = time.monotonic() - started

    codes: dict[str, int | None] = {}
    world = NPROC * len(HOSTS)
    for rank in range(world):
        path = outdir / ".exit" / f"rank{rank}.json"
        try:
            codes[str(rank)] = json.loads(path.read_text())["exit_code"]
            path.unlink()
        except (OSError, ValueError, KeyError):
            codes[str(rank)] = None
    (outdir / "exit_codes.json").write_text(json.dumps(codes, indent=1) + "\n")
    with contextlib.suppress(OSError):
        (outdir / ".exit").rmdir()
    remove_fifos(outdir)
    if deadline_hit:
        (outdir / "DEADLINE_KILLED.txt").write_text(
            f"The job was still running after {deadline_s:.0f} s: the harness killed its "
            f"process groups with SIGKILL (pids {sorted(killed)}). Exit codes that are null in "
            "exit_codes.json were never recorded.\n"
        )
    summary = {
        "job_id": job_id,
        "master_port": port,
        "wall_s": round(wall, 2),
        "launchers_ended_s": round(launchers_ended, 2),
        "deadline_s": deadline_s,
        "deadline_hit": deadline_hit,
        "launcher_exit_codes": {h: p.returncode for h, p in zip(HOSTS, launchers, strict=True)},
        "stragglers_killed": stragglers,
    }
    (outdir / "harness.json").write_text(json.dumps(summary, indent=1) + "\n")
    return {**summary, "exit_codes": codes}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="Run one fault-matrix job (4 ranks, 2 hosts).")
    p.add_argument("fault", choices=FAULTS)
    p.add_argument("outdir", type=Path)
    p.add_argument("--planted-rank", type=int, default=None)
    p.add_argument("--job-id", default=None)
    p.add_argument("--deadline", type=float, default=DEADLINE_S)
    p.add_argument(
        "--shared-root",
        type=Path,
        default=None,
        help="hosts' Fleetwatch root and log directory shared with other jobs running now",
    )
    args = p.parse_args(argv)
    if args.planted_rank is not None and not 0 <= args.planted_rank < NPROC * len(HOSTS):
        p.error("--planted-rank must be 0..3")
    result = run(
        args.fault,
        args.outdir,
        args.planted_rank,
        args.job_id,
        args.deadline,
        shared_root=args.shared_root,
    )
    print(json.dumps({"fault": args.fault, **result}))
    return 124 if result["deadline_hit"] else 0


if __name__ == "__main__":
    sys.exit(main())
