"""Real-shaped artifacts for the demo fleet and the tests.

The lines are formatted exactly as the named PyTorch releases print them, so the demo exercises
the same parsers a real incident does. Nothing here is used by the diagnosis itself.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from datetime import datetime, timedelta

DEFAULT_PG_TAG = "[PG ID 0 PG GUID 0(default_pg) Rank {rank}]"


@dataclass
class JobScenario:
    job: str
    hosts: list[str]
    world: int
    era: str = "2.5"  # "2.5" (PG ID/GUID tags), "2.3" (PG n tags), "1.13" (bare [Rank n])
    lagging: int | None = None  # rank that never enqueued the collective the others wait in
    silent: int | None = None  # rank that left the loop: its log has no NCCL error at all
    seq: int = 48213
    op: str = "ALLREDUCE"
    numel: int = 25_165_824
    timeout_ms: int = 600_000
    noise_lines: int = 200
    attempt: int = 0
    start: datetime = field(default_factory=lambda: datetime(2026, 11, 20, 3, 0, 0))
    rank_extra: dict[int, str] = field(default_factory=dict)  # appended to a rank's log
    host_logs: dict[str, str] = field(default_factory=dict)  # kernel logs, uploaded per host

    def host_of(self, rank: int) -> str:
        per_host = max(1, self.world // len(self.hosts))
        return self.hosts[min(rank // per_host, len(self.hosts) - 1)]


def _stamp(t: datetime) -> str:
    # glog style used by c10 since PyTorch 2.2: E1121 03:12:44.123456789
    return f"{t:%m%d %H:%M:%S}.{t.microsecond:06d}123"


def _noise(rank: int, lines: int, rng: random.Random, start: datetime) -> list[str]:
    out = []
    loss = 2.9
    for step in range(lines):
        loss = max(0.8, loss - rng.random() * 0.004)
        t = start + timedelta(seconds=2 * step)
        out.append(
            f"{t:%Y-%m-%d %H:%M:%S} INFO train.py:212 [rank{rank}] step {step} loss {loss:.4f} "
            f"lr 3.0e-04 grad_norm {0.5 + rng.random():.3f} tokens/s {11800 + rng.randint(0, 900)}"
        )
    return out


def rank_log(s: JobScenario, rank: int, seed: int = 0) -> str:
    rng = random.Random(f"{s.job}/{rank}/{seed}")
    fail_at = s.start + timedelta(seconds=2 * s.noise_lines + s.timeout_ms / 1000)
    lines = _noise(rank, s.noise_lines, rng, s.start)
    if rank in s.rank_extra:
        lines.append(s.rank_extra[rank].rstrip("\n"))
    if rank == s.silent:
        lines.append(f"{fail_at:%Y-%m-%d %H:%M:%S} INFO train.py:240 [rank{rank}] epoch done")
        return "\n".join(lines) + "\n"
    stamp = _stamp(fail_at)
    prefix = f"[rank{rank}]:"
    if rank == s.lagging:
        # The lagging rank did not time out: it is told to dump by a rank that did.
        lines.append(
            f"{prefix}[E{stamp} ProcessGroupNCCL.cpp:1987] {DEFAULT_PG_TAG.format(rank=rank)} "
            f"Received a dump signal due to a collective timeout from  rank "
            f"{0 if rank else 1} and we will try our best to dump the debug info. Last enqueued "
            f"NCCL work: {s.seq - 1}, last completed NCCL work: {s.seq - 1}.This is most likely "
            "caused by incorrect usages of collectives, e.g., wrong sizes used across ranks, the "
            "order of collectives is not same for all ranks or the scheduled collective, for some "
            "reason, didn't run. Additionally, this can be caused by GIL deadlock or other "
            "reasons such as network errors or bugs in the communications library (e.g. NCCL), "
            "etc."
        )
        return "\n".join(lines) + "\n"
    ran = s.timeout_ms + rng.randint(1, 90)
    if s.era == "1.13":
        lines.append(
            f"[E ProcessGroupNCCL.cpp:737] [Rank {rank}] Watchdog caught collective operation "
            f"timeout: WorkNCCL(SeqNum={s.seq}, OpType={s.op}, Timeout(ms)={s.timeout_ms}) ran "
            f"for {ran} milliseconds before timing out."
        )
    elif s.era == "2.3":
        lines.append(
            f"{prefix}[E ProcessGroupNCCL.cpp:563] [Rank {rank}] Watchdog caught collective "
            f"operation timeout: WorkNCCL(SeqNum={s.seq}, OpType={s.op}, NumelIn={s.numel}, "
            f"NumelOut={s.numel}, Timeout(ms)={s.timeout_ms}) ran for {ran} milliseconds before "
            "timing out."
        )
        lines.append(
            f"{prefix}[E ProcessGroupNCCL.cpp:1537] [PG 0 Rank {rank}] Timeout at NCCL work: "
            f"{s.seq}, last enqueued NCCL work: {s.seq}, last completed NCCL work: {s.seq - 1}."
        )
    else:
        lines.append(
            f"{prefix}[E{stamp} ProcessGroupNCCL.cpp:632] [Rank {rank}] Watchdog caught "
            f"collective operation timeout: WorkNCCL(SeqNum={s.seq}, OpType={s.op}, "
            f"NumelIn={s.numel}, NumelOut={s.numel}, Timeout(ms)={s.timeout_ms}) ran for {ran} "
            "milliseconds before timing out."
        )
        lines.append(
            f"{prefix}[E{stamp} ProcessGroupNCCL.cpp:2168] {DEFAULT_PG_TAG.format(rank=rank)}  "
            f"failure detected by watchdog at work sequence id: {s.seq} PG status: last enqueued "
            f"work: {s.seq + 1}, last completed work: {s.seq - 1}"
        )
    lines.append(
        f"{prefix}[E{stamp} ProcessGroupNCCL.cpp:681] [Rank {rank}] Some NCCL operations have "
        "failed or timed out. Due to the asynchronous nature of CUDA kernels, subsequent GPU "
        "operations might run on corrupted/incomplete data."
    )
    return "\n".join(lines) + "\n"


def healthy_log(s: JobScenario, rank: int) -> str:
    rng = random.Random(f"{s.job}/{rank}/healthy")
    return "\n".join(_noise(rank, s.noise_lines, rng, s.start)) + "\nTraining complete.\n"


OOM_TRACEBACK = """Traceback (most recent call last):
  File "/workspace/train.py", line 412, in <module>
    main()
  File "/workspace/train.py", line 388, in train_step
    loss.backward()
torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 3.88 GiB. GPU 3 has a total \
capacity of 79.11 GiB of which 1.02 GiB is free. Of the allocated memory 74.20 GiB is allocated \
by PyTorch, and 2.31 GiB is reserved by PyTorch but unallocated."""

IB_ERROR = (
    "gpu-d02:48122:48391 [2] transport/net_ib.cc:1295 NCCL WARN NET/IB : Got completion from peer "
    "10.10.4.17<40211> with status=12 opcode=0 len=0 vendor err 129 (Recv) localGid "
    "::ffff:10.10.4.18 remoteGids ::ffff:10.10.4.17 hca mlx5_2\n"
    "gpu-d02:48122:48391 [2] NCCL INFO transport/net.cc:1298 -> 6"
)

XID_79 = (
    "[1821733.120011] NVRM: Xid (PCI:0000:3b:00): 79, pid=48211, name=python, GPU has fallen "
    "off the bus.\n"
    "[1821733.120388] NVRM: GPU 0000:3b:00.0: GPU has fallen off the bus.\n"
)

NFS_STALL = (
    "[1021733.120011] nfs: server fs-logs01 not responding, still trying\n"
    "[1021790.412230] INFO: task python:48213 blocked for more than 120 seconds.\n"
)


def demo_scenarios() -> list[tuple[JobScenario, bool]]:
    """(scenario, failed?) — a small, varied fleet for a first look at the UI."""
    return [
        (
            JobScenario(
                "moe-pretrain-1121",
                ["gpu-c01", "gpu-c02"],
                world=8,
                seq=20411,
                rank_extra={3: OOM_TRACEBACK},
                silent=3,
            ),
            True,
        ),
        (
            JobScenario(
                "llama-sft-0931",
                ["gpu-e05", "gpu-e06"],
                world=8,
                lagging=6,
                seq=7731,
                host_logs={"gpu-e06": XID_79},
            ),
            True,
        ),
        (
            JobScenario(
                "dit-train-77",
                ["gpu-d01", "gpu-d02"],
                world=8,
                seq=1302,
                rank_extra={6: IB_ERROR},
            ),
            True,
        ),
        (
            JobScenario(
                "fsdp2-pretrain-1120",
                ["gpu-f01", "gpu-f02"],
                world=8,
                lagging=0,
                seq=90212,
                op="_ALLGATHER_BASE",
                timeout_ms=100_000,
                host_logs={"gpu-f01": NFS_STALL},
            ),
            True,
        ),
        (
            JobScenario("llama-pretrain-20261120-a", ["gpu-a01", "gpu-a02"], world=8, lagging=5),
            True,
        ),
        (
            JobScenario(
                "asr-finetune-7781",
                ["gpu-b11"],
                world=4,
                era="2.3",
                silent=0,
                seq=19,
                numel=1,
                timeout_ms=1_800_000,
            ),
            True,
        ),
        (
            JobScenario(
                "vit-sweep-lr3e-4",
                ["gpu-c07"],
                world=2,
                era="1.13",
                seq=5,
                op="BROADCAST",
                timeout_ms=1_800_000,
            ),
            True,
        ),
        (JobScenario("llama-pretrain-20261119-b", ["gpu-a01", "gpu-a03"], world=8), False),
    ]
