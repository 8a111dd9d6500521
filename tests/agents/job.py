"""A small gloo training job for the agent's end-to-end tests: ``python job.py RANK WORLD``.

Environment: FLEETWATCH_* (the torch integration), JOB_PORT, JOB_MODE (``unseeded`` splits the
data with a different random state on every rank, as in DESIGN.md case 2; ``stall`` makes the
last rank stop stepping), JOB_GO (a file to wait for after epoch start, so a test can look at
the server while no rank has taken a step), JOB_STEPS, JOB_TIMEOUT_S.
"""

import datetime
import os
import random
import sys
import time

import torch
import torch.distributed as dist

from agents import torch as fleetwatch_torch

rank, world = int(sys.argv[1]), int(sys.argv[2])
os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank))
mode = os.environ.get("JOB_MODE", "")
fw = fleetwatch_torch.install(heartbeat_every_s=0.2)
print(f"[rank{rank}]: FR pipe {os.environ['TORCH_NCCL_DEBUG_INFO_PIPE_FILE']}", flush=True)
dist.init_process_group(
    "gloo",
    init_method=f"tcp://127.0.0.1:{os.environ['JOB_PORT']}",
    rank=rank,
    world_size=world,
    timeout=datetime.timedelta(seconds=float(os.environ.get("JOB_TIMEOUT_S", "4"))),
)
samples = list(range(64))
if mode == "unseeded":
    # Each rank filters "randomly" with its own state: lengths and contents differ.
    rng = random.Random(1000 + rank)
    samples = [s for s in samples if rng.random() < 0.7]
dataset = torch.utils.data.TensorDataset(torch.tensor(samples, dtype=torch.float32))
sampler = torch.utils.data.distributed.DistributedSampler(dataset, world, rank, seed=0)
loader = torch.utils.data.DataLoader(dataset, batch_size=2, sampler=sampler)
model = torch.nn.Linear(1, 1)
steps = int(os.environ.get("JOB_STEPS", "0")) or None
go = os.environ.get("JOB_GO")
sampler.set_epoch(0)
fw.epoch_start(0, loader=loader)
if go:
    deadline = time.time() + 60
    while not os.path.exists(go) and time.time() < deadline:
        time.sleep(0.05)
for i, (batch,) in enumerate(loader):
    if steps is not None and i >= steps:
        break
    if mode == "stall" and rank == world - 1 and i == 5:
        print(f"[rank{rank}]: stuck in the data loader", flush=True)
        time.sleep(float(os.environ.get("JOB_STALL_S", "6")))
    loss = model(batch.unsqueeze(1)).sum()
    loss.backward()
    for p in model.parameters():
        dist.all_reduce(p.grad)
    time.sleep(0.02)
    fw.step()
    print(f"[rank{rank}]: step {i} loss {loss.item():.3f}", flush=True)
dist.barrier()
print(f"[rank{rank}]: done", flush=True)
dist.destroy_process_group()
