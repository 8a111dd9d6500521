"""``fleetwatch probe``: a collective health probe across a job's ranks.

Run it on every rank like the training job (``torchrun --nproc-per-node 8 -m agents.probe`` or
``fleetwatch probe`` under srun): it measures all-reduce and all-gather latency (small tensors)
and bandwidth (large tensors), then a ping-pong between every pair of ranks (ring neighbours
only past ``--max-pairs``), names the slow rank or link, and rank 0 spools the result for the
agent to upload (and uploads it at once when a server is configured).

A slow *rank* is slow with every partner; a slow *link* is slow between two ranks only. Both
are judged against the upper quartile of the pairs, so the verdict holds on any hardware.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from itertools import combinations

SLOW = 0.5  # a pair at under half the upper-quartile pair bandwidth is slow


def _timed(fn, repeat: int) -> float:
    fn()  # warm-up: connections, buffers
    start = time.perf_counter()
    for _ in range(repeat):
        fn()
    return (time.perf_counter() - start) / repeat


def measure(*, small: int, large: int, repeat: int, max_pairs: int, delay_s: float = 0.0):
    """Run on every rank of an initialised process group; returns rank 0's result (else None).
    ``delay_s`` delays this rank's every message: how tests make a rank slow."""
    import torch
    import torch.distributed as dist

    rank, world = dist.get_rank(), dist.get_world_size()
    device = "cuda" if dist.get_backend() == "nccl" else "cpu"
    if device == "cuda":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank)))
    small_t = torch.ones(small // 4, device=device)
    large_t = torch.ones(large // 4, device=device)

    def sync():
        if device == "cuda":
            torch.cuda.synchronize()

    def all_reduce(t):
        def run():
            if delay_s:
                time.sleep(delay_s)
            dist.all_reduce(t)
            sync()

        return run

    def all_gather(t):
        out = [torch.empty_like(t) for _ in range(world)]

        def run():
            if delay_s:
                time.sleep(delay_s)
            dist.all_gather(out, t)
            sync()

        return run

    mine = {
        "all_reduce_latency_s": _timed(all_reduce(small_t), repeat),
        "all_reduce_s": _timed(all_reduce(large_t), repeat),
        "all_gather_latency_s": _timed(all_gather(small_t), repeat),
        "all_gather_s": _timed(all_gather(large_t), repeat),
    }
    # Bus bandwidth as nccl-tests defines it, so numbers compare with theirs.
    mine["all_reduce_busbw_gbs"] = 2 * (world - 1) / world * large / mine["all_reduce_s"] / 1e9
    mine["all_gather_busbw_gbs"] = (world - 1) / world * large / mine["all_gather_s"] / 1e9

    pairs = list(combinations(range(world), 2))
    if len(pairs) > max_pairs:
        pairs = sorted({tuple(sorted((r, (r + 1) % world))) for r in range(world)})
    pair_s: dict[str, float] = {}
    buf = torch.ones(large // 4, device=device)
    for a, b in pairs:
        dist.barrier()
        if rank not in (a, b):
            continue
        peer = b if rank == a else a

        def ping(a=a, peer=peer):
            if delay_s:
                time.sleep(delay_s)
            if rank == a:
                dist.send(buf, peer)
                dist.recv(buf, peer)
            else:
                dist.recv(buf, peer)
                dist.send(buf, peer)
            sync()

        seconds = _timed(ping, repeat)
        if rank == a:
            pair_s[f"{a}-{b}"] = seconds
    dist.barrier()
    gathered: list = [None] * world
    dist.all_gather_object(gathered, {"rank": rank, "host": os.uname().nodename, **mine,
                                      "pairs": pair_s})  # fmt: skip
    if rank != 0:
        return None
    return analyse(gathered, large)


def analyse(per_rank: list[dict], size: int) -> dict:
    """Name the slow rank or link from every rank's measurements."""
    pairs = {k: v for r in per_rank for k, v in r["pairs"].items()}
    bandwidth = {k: 2 * size / s / 1e9 for k, s in pairs.items() if s > 0}
    median = statistics.median(bandwidth.values()) if bandwidth else 0.0
    # The reference is the upper quartile, not the median: with 3 ranks one slow rank makes
    # two of the three pairs slow, and the median is then a slow pair.
    values = sorted(bandwidth.values())
    reference = (
        statistics.quantiles(values, n=4, method="inclusive")[2] if len(values) >= 2 else median
    )
    slow_pairs = sorted(k for k, bw in bandwidth.items() if reference and bw < SLOW * reference)
    world = len(per_rank)
    counts = {r: 0 for r in range(world)}
    partners = {r: 0 for r in range(world)}
    for key in bandwidth:
        a, b = map(int, key.split("-"))
        partners[a] += 1
        partners[b] += 1
    for key in slow_pairs:
        a, b = map(int, key.split("-"))
        counts[a] += 1
        counts[b] += 1
    slow_ranks = sorted(
        r for r in range(world) if partners[r] >= 2 and counts[r] >= max(2, partners[r] - 1)
    )
    explained = {k for k in slow_pairs if any(int(x) in slow_ranks for x in k.split("-"))}
    slow_links = [k for k in slow_pairs if k not in explained]
    if slow_ranks:
        verdict = f"slow rank {', '.join(map(str, slow_ranks))}: slow with every partner"
    elif slow_links:
        verdict = f"slow link {', '.join(slow_links)}: slow between these ranks only"
    else:
        verdict = "no slow rank or link"
    hosts = {r["rank"]: r["host"] for r in per_rank}
    return {
        "type": "probe",
        "world_size": world,
        "size_bytes": size,
        "median_pair_gbs": round(median, 4),
        "pair_gbs": {k: round(v, 4) for k, v in sorted(bandwidth.items())},
        "slow_ranks": slow_ranks,
        "slow_links": slow_links,
        "verdict": verdict,
        "hosts": hosts,
        "per_rank": [{k: v for k, v in r.items() if k != "pairs"} for r in per_rank],
    }


def publish(result: dict, *, config, ident) -> None:
    """Spool the result as a hw_stats document; upload it now if a server is configured."""
    from . import records
    from .spool import Spool
    from .uploader import Uploader

    spool = Spool(config.spool_dir, max_bytes=config.spool_max_bytes)
    doc = records.document(
        [result], host=config.host, job=ident.job, attempt=ident.attempt, rank=None
    )
    header = records.upload_header(
        host=config.host,
        job=ident.job,
        attempt=ident.attempt,
        rank=None,
        kind="hw_stats",
        filename=f"probe.{int(time.time())}.json",
    )
    spool.put(header, records.encode(doc))
    if config.server:
        Uploader(config, spool).drain(budget_s=30)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="fleetwatch probe", description=__doc__)
    parser.add_argument("--backend", choices=["auto", "gloo", "nccl"], default="auto")
    parser.add_argument("--size-mb", type=float, default=16.0, help="bandwidth tensor (16)")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--max-pairs", type=int, default=64, help="beyond: ring neighbours")
    parser.add_argument("--config", help="agent config (server, key, spool) for the upload")
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    args = parser.parse_args(argv)

    import torch
    import torch.distributed as dist

    from .config import load_config
    from .identity import job_identity

    backend = args.backend
    if backend == "auto":
        backend = "nccl" if torch.cuda.is_available() else "gloo"
    dist.init_process_group(backend)
    try:
        result = measure(
            small=4096,
            large=int(args.size_mb * (1 << 20)),
            repeat=args.repeat,
            max_pairs=args.max_pairs,
        )
    finally:
        dist.destroy_process_group()
    if result is None:
        return 0
    config = load_config(args.config)
    publish(result, config=config, ident=job_identity(os.environ, config.host))
    print(json.dumps(result, indent=None if args.json else 2))
    return 1 if result["slow_ranks"] or result["slow_links"] else 0


if __name__ == "__main__":
    sys.exit(main())
