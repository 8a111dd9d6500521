"""Real multi-process torch.distributed (gloo, CPU) jobs with one injected fault each.

``python -m tests.torchjobs.jobs SCENARIO OUTDIR`` runs one job and leaves what a real job leaves
behind: every rank's Flight Recorder dump (pickle or JSON, varied file names and per-host
directories, as fr_trace users meet them) and its profiler trace. Each rank watches the store for
a "dump" key, as the NCCL watchdog's dump signal makes every rank dump when one times out, so a
rank stuck outside a collective still leaves its dump.

Scenarios (world size 3, collective timeout ``TIMEOUT_S``):
  - ``slow_loader``: rank 1's dataset is slow on every step, then stalls: others time out.
  - ``skip_collective``: rank 2 skips the metrics broadcast of step 3.
  - ``unseeded_split``: each rank splits the data with its own random state, rank 1 gets two
    more batches and is still training while the others gather the model to save it.
  - ``sync_logging``: rank 0 writes a growing log with fsync every step, then its write stalls.
  - ``straggler``: rank 2 does ``STRAGGLE_S`` of extra host work before every collective; nothing
    times out, the others just wait for it each time. Every rank dumps at the end.
"""

from __future__ import annotations

import contextlib
import datetime
import os
import sys
import threading
import time
from pathlib import Path

WORLD = 3
# Long enough that a healthy collective never times out on a loaded 2-core CI machine.
TIMEOUT_S = 6
SCENARIOS = ("slow_loader", "skip_collective", "unseeded_split", "sync_logging", "straggler")
STRAGGLE_S = 0.04


def _dump_paths(outdir: Path, rank: int) -> tuple[Path, bool]:
    """Varied naming: a per-host directory with fr_trace's prefix+rank, a rank-named pickle, a
    JSON dump; the format alternates by rank."""
    if rank == 0:
        return outdir / "host-a" / "nccl_trace_rank_0", False
    if rank == 1:
        return outdir / "host-b" / f"fr_dump_node-b_rank{rank}.json", True
    return outdir / f"flight_recorder_{rank}.pkl", False


class Dumper:
    def __init__(self, rank: int, outdir: Path, store) -> None:
        self.rank, self.outdir, self.store = rank, outdir, store
        self.lock = threading.Lock()
        self.done = False

    def dump(self) -> None:
        from torch._C._distributed_c10d import _dump_fr_trace, _dump_fr_trace_json

        with self.lock:
            if self.done:
                return
            path, as_json = _dump_paths(self.outdir, self.rank)
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(_dump_fr_trace_json() if as_json else _dump_fr_trace())
            self.done = True

    def signal_all(self) -> None:
        # The store may be gone; our own dump still counts.
        with contextlib.suppress(Exception):
            self.store.set("dump", str(self.rank))

    def watch(self) -> None:
        while not self.done:
            try:
                if self.store.check(["dump"]):
                    self.dump()
                    time.sleep(0.5)
                    os._exit(0)
            except Exception:
                self.dump()
                os._exit(0)
            time.sleep(0.05)


def _rank_main(rank: int, scenario: str, outdir: str, port: int) -> None:
    import torch
    import torch.distributed as dist
    from torch.profiler import ProfilerActivity, profile, schedule

    out = Path(outdir)
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=WORLD,
        timeout=datetime.timedelta(seconds=TIMEOUT_S),
    )
    store = dist.distributed_c10d._get_default_store()
    dumper = Dumper(rank, out, store)
    threading.Thread(target=dumper.watch, daemon=True).start()

    torch.manual_seed(0)
    model = torch.nn.Linear(32, 32)
    steps, stall_step = 8, None
    slow_s = 0.0
    if scenario == "slow_loader" and rank == 1:
        slow_s, stall_step = 0.02, 8
    if scenario == "unseeded_split":
        # random_split with each rank's own (unseeded) generator: the shard sizes differ.
        steps = 8 if rank == 1 else 6
    if scenario in ("slow_loader", "sync_logging"):
        steps = 9

    class Data(torch.utils.data.Dataset):
        def __len__(self) -> int:
            return steps * 4

        def __getitem__(self, i: int):
            if slow_s:
                time.sleep(slow_s if i // 4 != stall_step else TIMEOUT_S * 2.5)
            return torch.randn(32)

    loader = torch.utils.data.DataLoader(Data(), batch_size=4)
    trace_path = out / ("trace_rank0.pt.trace.json.gz" if rank == 0 else f"rank{rank}.trace.json")
    profiled = 8 if scenario != "unseeded_split" else steps

    def export(prof) -> None:
        prof.export_chrome_trace(str(trace_path))

    log_path = out.parent / f"{out.name}-train_log_rank{rank}.txt"  # not an artifact
    metric = torch.zeros(1)
    try:
        with profile(
            activities=[ProfilerActivity.CPU],
            schedule=schedule(wait=0, warmup=0, active=profiled, repeat=1),
            on_trace_ready=export,
            with_stack=scenario == "sync_logging",
        ) as prof:
            for step, x in enumerate(loader):
                loss = model(x).pow(2).mean()
                loss.backward()
                straggle = STRAGGLE_S if scenario == "straggler" and rank == 2 else 0.0
                for p in model.parameters():
                    time.sleep(straggle)
                    dist.all_reduce(p.grad)
                if not (scenario == "skip_collective" and rank == 2 and step == 3):
                    time.sleep(straggle)
                    dist.broadcast(metric, src=0)
                if scenario == "sync_logging" and rank == 0:
                    _write_log(log_path, step, stall=step == 8)
                prof.step()
            # Save: gather the model on every rank (case 2 of DESIGN.md hangs here).
            gathered = [torch.zeros(32 * 32) for _ in range(WORLD)]
            dist.all_gather(gathered, model.weight.detach().reshape(-1))
            dist.barrier()
    except Exception as exc:  # a timed-out collective: dump like the watchdog
        print(f"rank {rank}: {type(exc).__name__}: {str(exc)[:160]}", file=sys.stderr)
        dumper.signal_all()
        dumper.dump()
        time.sleep(1.0)
        os._exit(0)
    dumper.dump()
    os._exit(0)


def _write_log(path: Path, step: int, stall: bool) -> None:
    # Synchronous logging that grows: every step rewrites a bigger file and fsyncs it.
    with path.open("wb") as f:
        f.write(os.urandom(1 << 16) * (8 * (step + 1) ** 2))
        f.flush()
        os.fsync(f.fileno())
    if stall:
        time.sleep(TIMEOUT_S * 2.5)


def run(scenario: str, outdir: str, port: int) -> None:
    import torch.multiprocessing as mp

    os.environ["TORCH_FR_BUFFER_SIZE"] = "2000"
    Path(outdir).mkdir(parents=True, exist_ok=True)
    mp.spawn(_rank_main, args=(scenario, outdir, port), nprocs=WORLD, join=True)


if __name__ == "__main__":
    run(sys.argv[1], sys.argv[2], int(sys.argv[3]))
