"""A small torchrun training script: a next-value regressor over windows of synthetic recordings.

    torchrun --nnodes=2 --nproc-per-node=2 ... train.py [--fault NAME] [--planted-rank N]

It reads RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR/PORT from torchrun's environment, calls
``agents.torch.install()`` before ``init_process_group`` (gloo, 6 s collective timeout), trains a
tiny MLP under DistributedDataParallel with a DataLoader over a DistributedSampler, all-reduces
its loss every step for the progress line, validates each epoch, then gathers the model on every
rank and rank 0 saves it. ``--fault`` plants one real fault on one rank (see README.md); the
script prints what a trainer prints and nothing about the fault.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import signal
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
from catalog import DEFAULT_PLANTED, FAULTS  # beside this script
from torch.distributed.elastic.multiprocessing.errors import record
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, Dataset, default_collate
from torch.utils.data.distributed import DistributedSampler

try:
    from agents import torch as fleetwatch_torch
except ImportError:  # run from a checkout without the package installed
    sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
    from agents import torch as fleetwatch_torch

TIMEOUT_S = 6.0  # every collective; a healthy one never comes close on a busy 2-core machine
STALL_S = 3 * TIMEOUT_S  # how long a planted stall blocks: well past the peers' timeout
WINDOW = 16
BATCH = 4
HIDDEN = 512
EPOCHS = 4
LR = 0.02
# Recordings ("documents") and how many windows each yields: split by recording, so the number
# of training windows depends on which recordings are held out.
RECORDING_WINDOWS = (6, 9, 14, 20, 28, 38, 50, 64, 80, 100, 124, 150)
HELD_OUT = 4
DATA_SEED = 1234
FAULT_STEP = 100  # global step (epoch 3, a few steps in) where mid-run faults strike
SLOW_FROM = FAULT_STEP - 12  # where rank 0's synchronous log writes start to grow
LOADER_SLOW_FROM = FAULT_STEP - 10  # batch where the starving loader starts to slow down


# --- data -----------------------------------------------------------------------------------


def recordings() -> list[np.ndarray]:
    """The same synthetic recordings on every rank (seeded): noisy sums of two sines."""
    rng = np.random.default_rng(DATA_SEED)
    out = []
    for n in RECORDING_WINDOWS:
        t = np.arange(n * WINDOW + 1, dtype=np.float64)
        f1, f2 = rng.uniform(0.02, 0.2, size=2)
        x = np.sin(f1 * t) + 0.5 * np.sin(f2 * t + rng.uniform(0, 6)) + rng.normal(0, 0.05, t.size)
        out.append(x.astype(np.float32))
    return out


def split_recordings(n: int, seed: int | None) -> tuple[list[int], list[int]]:
    """Hold out whole recordings for validation (no leakage between windows of one recording)."""
    rng = np.random.default_rng(seed)
    held = set(rng.choice(n, size=HELD_OUT, replace=False).tolist())
    return [i for i in range(n) if i not in held], sorted(held)


class Collate:
    """The loader's collate step, where this rank's per-batch loading cost lands (the
    loader-starvation faults). It runs in the loader worker, which is persistent, so its batch
    count runs on across epochs."""

    def __init__(self, fault: str, planted: bool) -> None:
        self.fault = fault if planted else "healthy"
        self.batches = 0

    def __call__(self, samples):
        self.pace(self.batches)
        self.batches += 1
        return default_collate(samples)

    def pace(self, batch: int) -> None:
        if self.fault == "loader_starved_start" and batch == 0:
            _blocked_read(STALL_S)
        elif self.fault == "loader_starved_midrun" and batch >= LOADER_SLOW_FROM:
            k = batch - LOADER_SLOW_FROM
            if k >= 8:
                _blocked_read(STALL_S)
            else:
                _decode(0.05 * 1.6**k)  # per-batch decoding cost grows: 0.05 s .. 1.3 s


def _decode(seconds: float) -> None:
    """CPU-bound decoding work for about ``seconds``."""
    end = time.perf_counter() + seconds
    buf = np.random.default_rng(0).standard_normal(1 << 14)
    while time.perf_counter() < end:
        buf = np.abs(np.fft.irfft(np.fft.rfft(buf), n=buf.size)) + 1e-3


def _blocked_read(seconds: float) -> None:
    """A read that does not come back (a source that stopped answering)."""
    time.sleep(seconds)


class Windows(Dataset):
    """Non-overlapping windows of the given recordings: WINDOW values in, the next one out."""

    def __init__(self, series: list[np.ndarray], which: list[int]) -> None:
        self.series = series
        self.items = [(r, k * WINDOW) for r in which for k in range(len(series[r]) // WINDOW)]

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, index: int):
        r, start = self.items[index]
        s = self.series[r]
        return torch.from_numpy(s[start : start + WINDOW].copy()), torch.tensor(s[start + WINDOW])


# --- the slow log path (rank 0) ----------------------------------------------------------------


class MetricsLog:
    """Rank 0's training log. Normally a buffered JSONL append. On the slow path every step also
    rewrites an event snapshot that grows with the run, in 4 KiB records opened O_DSYNC (what a
    mount with synchronous writes does to every record: one round trip to the disk each), until
    a write does not come back."""

    RECORD = 1 << 12

    def __init__(self, log_dir: Path, slow: bool) -> None:
        log_dir.mkdir(parents=True, exist_ok=True)
        self.dir = log_dir
        self.slow = slow
        self.jsonl = (log_dir / "metrics.jsonl").open("a", buffering=1 << 16)

    def write(self, global_step: int, record: dict) -> None:
        self.jsonl.write(json.dumps(record) + "\n")
        if not self.slow or global_step < SLOW_FROM:
            return
        k = global_step - SLOW_FROM + 1
        self.jsonl.flush()
        payload = os.urandom(self.RECORD)
        fd = os.open(
            self.dir / "events.snapshot", os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_DSYNC, 0o644
        )
        try:
            # 64 KiB x k^2 (64 KiB .. 9 MiB): from a few ms to a second or two of synchronous I/O
            for i in range(16 * k * k):
                os.write(fd, payload)
                if k > 12 and i == 0:
                    _blocked_read(STALL_S)  # the mount stops acknowledging writes
        finally:
            os.close(fd)

    def close(self) -> None:
        self.jsonl.close()


# --- training -----------------------------------------------------------------------------------


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--fault", default="healthy", choices=FAULTS)
    p.add_argument("--planted-rank", type=int, default=None)
    p.add_argument("--log-dir", default="runs")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--workers", type=int, default=1)
    return p.parse_args(argv)


def say(rank: int, text: str) -> None:
    now = time.time()
    stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(now)) + f",{int(now % 1 * 1000):03d}"
    print(f"[{stamp}][rank{rank}] {text}", flush=True)


@record
def main(argv=None) -> None:
    args = parse_args(argv)
    rank = int(os.environ["RANK"])
    world = int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    fault = args.fault
    planted_rank = args.planted_rank
    if planted_rank is None:
        planted_rank = DEFAULT_PLANTED[fault]
    if fault == "slow_mount":
        planted_rank = 0
    planted = planted_rank is not None and rank == planted_rank

    fw = fleetwatch_torch.install()
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=TIMEOUT_S))
    say(
        rank,
        f"init | world_size {world} | local_rank {local_rank} | node_rank "
        f"{os.environ.get('GROUP_RANK', '?')} | backend {dist.get_backend()} | torch "
        f"{torch.__version__} | pid {os.getpid()}",
    )
    torch.manual_seed(args.seed)

    series = recordings()
    # Every rank must hold out the same recordings: the split is seeded, or each rank draws its
    # own (unseeded) split.
    seed = None if fault == "unseeded_split" else args.seed
    train_ids, val_ids = split_recordings(len(series), seed)
    train_set = Windows(series, train_ids)
    val_set = Windows(series, val_ids)
    sampler = DistributedSampler(train_set, num_replicas=world, rank=rank, shuffle=True, seed=0)
    loader = DataLoader(
        train_set,
        batch_size=BATCH,
        sampler=sampler,
        num_workers=args.workers,
        collate_fn=Collate(fault, planted),
        persistent_workers=args.workers > 0,
    )
    val_sampler = DistributedSampler(val_set, num_replicas=world, rank=rank, shuffle=False)
    val_loader = DataLoader(val_set, batch_size=16, sampler=val_sampler)
    say(
        rank,
        f"data | recordings {len(series)} | train windows {len(train_set)} | val windows "
        f"{len(val_set)} | batch {BATCH} | steps/epoch {len(loader)} | workers {args.workers}",
    )

    model = torch.nn.Sequential(
        torch.nn.Linear(WINDOW, HIDDEN),
        torch.nn.Tanh(),
        torch.nn.Linear(HIDDEN, HIDDEN),
        torch.nn.Tanh(),
        torch.nn.Linear(HIDDEN, 1),
    )
    ddp = DistributedDataParallel(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=LR, momentum=0.9)
    log = MetricsLog(Path(args.log_dir), slow=fault == "slow_mount") if rank == 0 else None

    global_step = 0
    t_start = t_prev = time.perf_counter()
    for epoch in range(EPOCHS):
        sampler.set_epoch(epoch)
        fw.epoch_start(epoch, loader=loader)
        steps = len(loader)
        t_fetch = time.perf_counter()
        for i, (x, y) in enumerate(loader):
            data_time = time.perf_counter() - t_fetch
            if planted and global_step == FAULT_STEP and fault == "rank_raises":
                x = x.clone()
                x[0, 3] = float("nan")  # a corrupt sample reaches this rank's batch
            pred = ddp(x).squeeze(-1)
            loss = torch.nn.functional.mse_loss(pred, y)
            if not torch.isfinite(loss):
                raise RuntimeError(
                    f"loss is {loss.item()} at epoch {epoch} step {i} (global step {global_step})"
                )
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            if planted and global_step == FAULT_STEP and fault == "rank_sigkilled":
                os.kill(os.getpid(), signal.SIGKILL)

            stats = torch.tensor([loss.item() * len(x), float(len(x))])
            if planted and global_step == FAULT_STEP:
                if fault == "sleep_before_collective":
                    time.sleep(STALL_S)
                elif fault == "collective_mismatch":
                    gnorm = sum(float(p.grad.norm()) ** 2 for p in ddp.parameters()) ** 0.5
                    stats = torch.cat([stats, torch.tensor([gnorm])])
            dist.all_reduce(stats)
            fw.step()
            now = time.perf_counter()
            step_time, t_prev = now - t_prev, now  # everything since the last step ended
            mean_loss = (stats[0] / stats[1]).item()
            if log is not None:
                log.write(
                    global_step,
                    {"step": global_step, "epoch": epoch, "loss": mean_loss, "t": time.time()},
                )
            say(
                rank,
                f"epoch {epoch} | step {i + 1}/{steps} | global_step {global_step} | loss "
                f"{mean_loss:.4f} | step_time {step_time:.3f}s | data_time {data_time:.3f}s",
            )
            global_step += 1
            t_fetch = time.perf_counter()

        # Validation on this rank's shard of the held-out recordings (no collective).
        ddp.eval()
        with torch.no_grad():
            total, count = 0.0, 0
            for x, y in val_loader:
                pred = ddp.module(x).squeeze(-1)
                total, count = total + float(((pred - y) ** 2).sum()), count + len(y)
        ddp.train()
        say(rank, f"epoch {epoch} done | val_loss {total / max(count, 1):.4f} ({count} windows)")

    # Save: gather the full model on every rank, rank 0 writes it.
    flat = torch.nn.utils.parameters_to_vector(model.parameters()).detach()
    full = torch.empty(world * flat.numel())
    dist.all_gather_into_tensor(full, flat)
    if rank == 0:
        ckpt = Path(args.log_dir) / "checkpoint.pt"
        torch.save({"params": full[: flat.numel()].clone(), "steps": global_step}, ckpt)
        say(rank, f"saved {ckpt} ({flat.numel()} params)")
    dist.barrier()
    if log is not None:
        log.close()
    say(rank, f"done | {global_step} steps in {time.perf_counter() - t_start:.1f}s")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
