"""Cross-rank scenario: the Flight Recorder desync finder against PyTorch's ``fr_trace``, and the
streaming trace summary against HolisticTraceAnalysis and a bare ``json.load``.

Dumps are generated from the real 2.10 schema (the keys ``_dump_fr_trace`` writes), 2,000
entries per rank, with two planted faults: one rank never enqueues the last collective (missing
rank) — both analyzers must name it. Traces are Kineto-shaped GPU traces with kernel names HTA
recognises (``ncclKernel_*``) so both tools produce numbers; step and communication times must
agree within 1%.

Every side runs in a fresh child process (``python -m bench.crossrank --child …``) so that wall
time and peak RSS (``wait4``) are measured alike.
"""

from __future__ import annotations

import json
import math
import os
import pickle
import random
import re
import subprocess
import sys
import time
from pathlib import Path

from .report import scenario

ENTRIES = 2000
CHILD_TIMEOUT_S = 900


def _entry(seq: int, rank: int) -> dict:
    return {
        "frames": [
            {"name": "train_step", "filename": "/app/train.py", "line": 120},
            {"name": "main", "filename": "/app/train.py", "line": 300},
        ],
        "record_id": seq - 1,
        "pg_id": 0,
        "process_group": ("0", "default_pg"),
        "thread_name": "pt_nccl_watchdg",
        "thread_id": "140000000000000",
        "collective_seq_id": seq,
        "p2p_seq_id": 0,
        "op_id": seq,
        "profiling_name": "nccl:all_reduce" if seq % 3 else "nccl:broadcast",
        "time_created_ns": 1_700_000_000_000_000_000 + seq * 1_000_000 + rank,
        "input_sizes": [[4096, 1024]],
        "input_dtypes": ["BFloat16"],
        "output_sizes": [[4096, 1024]],
        "output_dtypes": ["BFloat16"],
        "state": "completed",
        "time_discovered_started_ns": 1,
        "time_discovered_completed_ns": 2,
        "retired": True,
        "timeout_ms": 600000,
        "is_p2p": False,
    }


def write_dumps(root: Path, ranks: int, culprit: int) -> None:
    root.mkdir(parents=True, exist_ok=True)
    config = {"0": {"name": "0", "desc": "default_pg", "ranks": str(list(range(ranks)))}}
    for rank in range(ranks):
        last = ENTRIES - 1 if rank == culprit else ENTRIES
        entries = [_entry(seq, rank) for seq in range(1, last + 1)]
        if rank != culprit:
            entries[-1]["state"] = "started"
        dump = {
            "version": "2.10",
            "comm_lib_version": "2.21.5",
            "pg_config": config,
            "pg_status": {
                "0": {
                    "last_enqueued_collective": last,
                    "last_started_collective": last,
                    "last_completed_collective": last - (rank != culprit),
                }
            },
            "entries": entries,
        }
        (root / f"rank_{rank}").write_bytes(pickle.dumps(dump, protocol=4))


def _ours_fr(root: str) -> dict:
    from analysis.classify.crossrank import fr_analyze
    from ingest.parsers import parse_artifact

    events = []
    for path in sorted(Path(root).iterdir()):
        with path.open("rb") as stream:
            events.extend(parse_artifact(stream, source=str(path)).events)
    return {"culprits": fr_analyze(events).culprits}


def _peer_fr(root: str) -> dict:
    done = subprocess.run(
        [sys.executable, "-m", "torch.distributed.flight_recorder.fr_trace", root, "-p", "rank_"],
        capture_output=True,
        text=True,
        timeout=CHILD_TIMEOUT_S,
        check=False,
    )
    found = re.findall(r"missing ranks: \{([\d, ]+)\}", done.stdout + done.stderr)
    culprits = sorted({int(r) for group in found for r in group.split(",")})
    return {"culprits": culprits}


# --- traces -------------------------------------------------------------------------------------


def write_trace(path: Path, steps: int, rank: int, seed: int) -> dict:
    """A GPU trace; returns the truth (step durations and comm kernel time)."""
    rng = random.Random(seed + rank)
    t = 1_000_000.0
    step_us, comm_us = [], 0.0
    with path.open("w") as out:
        out.write(
            f'{{"schemaVersion": 1, "distributedInfo": {{"rank": {rank}, "world_size": 8}},\n'
        )
        out.write('"traceEvents": [\n')
        first = True

        def emit(ev: dict) -> None:
            nonlocal first
            out.write(("" if first else ",\n") + json.dumps(ev))
            first = False

        for step in range(steps):
            dur = 2000.0 + rng.random() * 100 + (step * 5 if step > steps // 2 else 0)
            step_us.append(dur)
            emit(
                {
                    "ph": "X",
                    "cat": "user_annotation",
                    "name": f"ProfilerStep#{step}",
                    "pid": 1,
                    "tid": 1,
                    "ts": t,
                    "dur": dur,
                    "args": {},
                }
            )
            k = t + 10
            for i in range(40):
                kd = 20.0 + rng.random() * 10
                emit(
                    {
                        "ph": "X",
                        "cat": "cpu_op",
                        "name": "aten::mm",
                        "pid": 1,
                        "tid": 1,
                        "ts": k - 5,
                        "dur": 4.0,
                        "args": {"External id": i},
                    }
                )
                emit(
                    {
                        "ph": "X",
                        "cat": "kernel",
                        "name": "sm80_xmma_gemm_bf16",
                        "pid": 0,
                        "tid": 7,
                        "ts": k,
                        "dur": kd,
                        "args": {"device": 0, "stream": 7, "correlation": i, "External id": i},
                    }
                )
                k += kd + 2
            for i in range(4):
                cd = 150.0 + rng.random() * 50
                comm_us += cd
                emit(
                    {
                        "ph": "X",
                        "cat": "kernel",
                        "name": "ncclKernel_AllReduce_RING_LL_Sum_bfloat16",
                        "pid": 0,
                        "tid": 13,
                        "ts": k,
                        "dur": cd,
                        "args": {
                            "device": 0,
                            "stream": 13,
                            "correlation": 100 + i,
                            "External id": 100 + i,
                        },
                    }
                )
                k += cd + 3
            t += dur + 50
        out.write(f'\n], "traceName": "{path.name}"}}\n')
    return {"step_us": step_us, "comm_us": comm_us}


def _ours_trace(path: str) -> dict:
    from ingest.parsers.trace import summarize_trace

    with open(path, "rb") as stream:
        summary = summarize_trace(stream)
    return {
        "step_ms_mean": sum(summary["step_ms"]) / len(summary["step_ms"]),
        "steps": summary["steps"],
        "comm_us": summary["comm_us"],
        "idle_us": summary["idle_us"],
    }


def _peer_trace(path: str) -> dict:
    import logging

    logging.disable(logging.WARNING)
    from hta.trace_analysis import TraceAnalysis

    analyzer = TraceAnalysis(trace_dir=str(Path(path).parent))
    breakdown = analyzer.get_gpu_kernel_breakdown(visualize=False)[0]
    comm = float(breakdown[breakdown["kernel_type"] == "COMMUNICATION"]["sum"].sum())
    temporal = analyzer.get_temporal_breakdown(visualize=False)
    df = analyzer.t.get_trace(int(temporal["rank"].iloc[0]))
    names = analyzer.t.symbol_table.get_sym_table()
    steps = df[df["name"].map(lambda i: names[i].startswith("ProfilerStep"))]
    return {
        "step_ms_mean": float(steps["dur"].mean()) / 1000,
        "steps": len(steps),
        "comm_us": comm,
        "idle_us": float(temporal["idle_time(us)"].iloc[0]),
    }


def _floor_trace(path: str) -> dict:
    with open(path, "rb") as stream:
        return {"events": len(json.load(stream)["traceEvents"])}


CHILDREN = {
    "ours_fr": _ours_fr,
    "peer_fr": _peer_fr,
    "ours_trace": _ours_trace,
    "peer_trace": _peer_trace,
    "floor_trace": _floor_trace,
}


def measure(which: str, arg: str) -> tuple[float, int, dict]:
    """Wall seconds, peak RSS bytes (the child and its own children), the child's answer."""
    start = time.perf_counter()
    proc = subprocess.Popen(
        [sys.executable, "-m", "bench.crossrank", "--child", which, arg],
        stdout=subprocess.PIPE,
        cwd=Path(__file__).resolve().parent.parent,
    )
    out, _ = proc.communicate(timeout=CHILD_TIMEOUT_S)
    elapsed = time.perf_counter() - start
    lines = out.decode().strip().splitlines()
    answer = json.loads(lines[-1]) if lines else {}
    return elapsed, int(answer.pop("_maxrss_kb", 0)) * 1024, answer


def run(workdir: Path, *, quick: bool, say=print) -> list[dict]:
    rows: list[dict] = []
    counts = (16, 64) if quick else (64, 256, 1024)
    times: dict[int, tuple[float, float]] = {}
    for ranks in counts:
        root = workdir / f"fr{ranks}"
        culprit = (ranks * 7) // 11
        write_dumps(root, ranks, culprit)
        say(f"crossrank: {ranks} rank dumps written; fr_trace and ours")
        ours_s, ours_mem, ours = measure("ours_fr", str(root))
        peer_s, peer_mem, peer = measure("peer_fr", str(root))
        times[ranks] = (ours_s, peer_s)
        same = ours["culprits"] == peer["culprits"] == [culprit]
        rows.append(
            scenario(
                f"fr desync {ranks} ranks",
                "same culprit ranks",
                float(same),
                "fr_trace",
                1.0,
                "==",
                1,
                gate=True,
                note=f"ours {ours['culprits']}, fr_trace {peer['culprits']}, planted {culprit}",
            )
        )
        rows.append(
            scenario(
                f"fr desync {ranks} ranks",
                "speed (1/s)",
                1 / ours_s,
                "fr_trace",
                1 / peer_s,
                ">=",
                10,
                note=f"ours {ours_s:.2f}s, fr_trace {peer_s:.2f}s",
            )
        )
        rows.append(
            scenario(
                f"fr desync {ranks} ranks",
                "peak RSS (MB)",
                ours_mem / 2**20,
                "fr_trace",
                peer_mem / 2**20,
                "<=",
                0.2,
            )
        )
    lo, hi = counts[0], counts[-1]
    slope = {
        side: math.log(times[hi][i] / times[lo][i]) / math.log(hi / lo)
        for i, side in enumerate(("ours", "fr_trace"))
    }
    rows.append(
        scenario(
            "fr desync scaling",
            "time exponent vs ranks",
            slope["ours"],
            "fr_trace",
            slope["fr_trace"],
            "<=",
            1.0,
            note="log-log slope of time over rank count; 1 = linear",
        )
    )

    steps = 300 if quick else 3000
    path = workdir / "traces" / "rank0.pt.trace.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    truth = write_trace(path, steps, 0, 4187)
    size = path.stat().st_size / 2**20
    say(f"crossrank: {size:.0f} MB trace written; summary, HTA, json.load")
    ours_s, ours_mem, ours = measure("ours_trace", str(path))
    floor_s, floor_mem, _ = measure("floor_trace", str(path))
    try:
        peer_s, peer_mem, peer = measure("peer_trace", str(path))
    except (subprocess.SubprocessError, json.JSONDecodeError, OSError) as exc:
        peer_s, peer_mem, peer = 0.0, 0, {}
        say(f"crossrank: HTA failed: {exc}")
    if peer:
        agree = all(
            abs(ours[k] - peer[k]) <= 0.01 * max(abs(peer[k]), 1e-9)
            for k in ("step_ms_mean", "comm_us")
        )
        rows.append(
            scenario(
                f"trace summary {size:.0f} MB",
                "step+comm within 1%",
                float(agree),
                "HTA",
                1.0,
                "==",
                1,
                gate=True,
                note=f"ours {ours}, HTA {peer}, truth comm {truth['comm_us']:.0f} us",
            )
        )
        rows.append(
            scenario(
                f"trace summary {size:.0f} MB",
                "speed (1/s)",
                1 / ours_s,
                "HTA",
                1 / peer_s,
                ">=",
                3,
                note=f"ours {ours_s:.2f}s, HTA {peer_s:.2f}s",
            )
        )
        rows.append(
            scenario(
                f"trace summary {size:.0f} MB",
                "peak RSS (MB)",
                ours_mem / 2**20,
                "HTA",
                peer_mem / 2**20,
                "<=",
                0.2,
            )
        )
    rows.append(
        scenario(
            f"trace summary {size:.0f} MB",
            "speed (1/s)",
            1 / ours_s,
            "json.load",
            1 / floor_s,
            ">=",
            0.2,
            note=f"json.load {floor_s:.2f}s, {floor_mem / 2**20:.0f} MB",
        )
    )
    return rows


def _child(which: str, arg: str) -> None:
    import resource

    answer = CHILDREN[which](arg)
    usage = max(
        resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
        resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss,
    )
    answer["_maxrss_kb"] = usage
    print(json.dumps(answer))


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "--child":
        os.environ.setdefault("PYTHONWARNINGS", "ignore")
        _child(sys.argv[2], sys.argv[3])
