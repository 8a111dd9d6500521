"""Generated training logs: millions of lines of noise with a few incident lines planted in them.

Each *mix* (``MIXES``) imitates what a 2-node, 16-rank PyTorch 2.5 job leaves behind under one
setting: ``info`` (``NCCL_DEBUG=INFO`` with ``NCCL_DEBUG_SUBSYS=COLL``: a third of the lines are
per-collective INFO lines, communicators created often), ``quiet`` (``NCCL_DEBUG=WARN``),
``warn_storm`` (an InfiniBand port flapping: bursts of NET/IB warnings), ``traceback_storm`` (every
rank dumping its stacks now and then) and ``training`` (the first mix: WARN level with a
communicator now and then). The noise is step lines from several frameworks, tqdm bars redrawn with
``\\r``, Python and dynamo warnings, data loader prints; incidents are what a failure prints:
ProcessGroupNCCL watchdog timeouts with their progress line, NCCL WARN lines, an Xid from the
kernel log, a CUDA out-of-memory traceback.

Everything is drawn from one seeded ``random.Random`` and written in chunks, so the same seed
and size give the same bytes, and a 1 GB log costs no more memory than a 2 MB one. The same
seed at a smaller size gives (almost exactly) a prefix of the larger log. ``write_log`` returns
the ``Planted`` manifest: how many lines of each incident kind went in, which is what the
diagnosis pass must find. ``append_failure`` ends a log with a failure of its own.
"""

from __future__ import annotations

import math
import random
from bisect import bisect
from dataclasses import dataclass, field
from itertools import accumulate
from pathlib import Path

# Written to disk in chunks of about this many characters.
FLUSH_CHARS = 1 << 20

HOSTS = ("gpu-node-a07", "gpu-node-a08")
GPUS_PER_HOST = 8
WORLD = len(HOSTS) * GPUS_PER_HOST
BUS_IDS = ("18", "2a", "3a", "5d", "9a", "ab", "ba", "db")
START = 1_732_158_000  # 2024-11-21 03:00:00 UTC, the start of the simulated job

_MONTHS = ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec")
_DAYS = ("Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun")
_BAR = " ▏▎▍▌▋▊▉█"


@dataclass
class Planted:
    """What ``write_log`` wrote: its size and the incident lines it planted, by kind."""

    path: str
    seed: int
    bytes: int = 0
    lines: int = 0
    incident_lines: int = 0
    incidents: dict[str, int] = field(default_factory=dict)

    def count(self, kind: str, n: int = 1) -> None:
        self.incidents[kind] = self.incidents.get(kind, 0) + n


class _Clock:
    """Simulated wall time; formatting is cached per second because it is most of the cost."""

    def __init__(self) -> None:
        self.t = float(START)
        self._sec = -1
        self._parts: tuple[str, str, str] = ("", "", "")

    def tick(self, seconds: float) -> None:
        self.t += seconds

    def parts(self) -> tuple[str, str, str]:
        """(``2024-11-21 03:12:44``, glog ``1121 03:12:44``, dmesg ``Thu Nov 21 03:12:44 2024``)."""
        sec = int(self.t)
        if sec != self._sec:
            import time

            tm = time.gmtime(sec)
            hms = f"{tm.tm_hour:02d}:{tm.tm_min:02d}:{tm.tm_sec:02d}"
            self._parts = (
                f"{tm.tm_year}-{tm.tm_mon:02d}-{tm.tm_mday:02d} {hms}",
                f"{tm.tm_mon:02d}{tm.tm_mday:02d} {hms}",
                f"{_DAYS[tm.tm_wday]} {_MONTHS[tm.tm_mon - 1]} {tm.tm_mday:2d} {hms} {tm.tm_year}",
            )
            self._sec = sec
        return self._parts

    def frac(self, digits: int) -> str:
        return f"{int((self.t % 1) * 10**digits):0{digits}d}"


class _Job:
    """The state the noise is drawn from: ranks, pids, step counter, collective sequence."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.clock = _Clock()
        self.step = 0
        self.seq = 1000  # collective SeqNum on the default process group
        self.pids = [rng.randrange(20_000, 4_000_000) for _ in range(WORLD)]
        self.loss = 10.5
        self.bar = 0

    def rank(self) -> int:
        return self.rng.randrange(WORLD)

    def where(self, rank: int) -> tuple[str, int, int]:
        return HOSTS[rank // GPUS_PER_HOST], self.pids[rank], rank % GPUS_PER_HOST

    def nccl_head(self, rank: int, tid: bool = False) -> str:
        host, pid, dev = self.where(rank)
        thread = pid + self.rng.randrange(1, 3000) if tid else pid
        return f"{host}:{pid}:{thread} [{dev}]"


# --- noise ------------------------------------------------------------------------------------
# Each emitter returns (text, number of lines); text has no trailing newline.


def _step_line(job: _Job) -> tuple[str, int]:
    rng = job.rng
    job.step += 1
    job.seq += rng.randrange(2, 9)
    job.clock.tick(rng.uniform(0.2, 1.5))
    day, _, _ = job.clock.parts()
    job.loss = 1.9 + 8.6 * math.exp(-job.step / 80_000)
    loss = job.loss + rng.gauss(0, 0.05)
    # linear warmup, then cosine decay to a tenth over a million steps
    lr = 3e-4 * min(1.0, job.step / 2000) * (0.55 + 0.45 * math.cos(math.pi * job.step / 1e6))
    style = rng.randrange(8)
    if style == 0:  # Megatron-LM
        return (
            f" [{day}] iteration {job.step:>8d}/  500000 | consumed samples: "
            f"{job.step * 1024:>12d} | elapsed time per iteration (ms): "
            f"{rng.uniform(900, 1300):.1f} | learning rate: {lr:.6E} | global batch size:  1024 "
            f"| lm loss: {loss:.6E} | loss scale: 1.0 | grad norm: {rng.uniform(0.2, 2):.3f} | "
            "number of skipped iterations:   0 | number of nan iterations:   0 |",
            1,
        )
    if style <= 2:  # Hugging Face Trainer
        return (
            f"{{'loss': {loss:.4f}, 'grad_norm': {rng.uniform(0.2, 2):.4f}, "
            f"'learning_rate': {lr:.4e}, 'epoch': {job.step / 40000:.2f}}}",
            1,
        )
    if style <= 4:  # a hand-written loop behind torchrun's [rankN]: prefix
        return (
            f"[rank0]: step={job.step} loss={loss:.4f} lr={lr:.2e} "
            f"tokens/s={rng.randrange(380_000, 420_000)} mfu={rng.uniform(38, 44):.1f}%",
            1,
        )
    if style <= 6:  # Python logging
        return (
            f"{day},{rng.randrange(1000):03d} - train - INFO - step {job.step}/500000 | "
            f"loss {loss:.4f} | lr {lr:.4e} | tok/s {rng.randrange(380_000, 420_000):,} | "
            f"{rng.uniform(0.8, 1.2):.2f} s/it",
            1,
        )
    # DeepSpeed
    return (
        f"[rank0]: [{day},{rng.randrange(1000):03d}] [INFO] [logging.py:128:log_dist] [Rank 0] "
        f"step={job.step}, skipped=0, lr=[{lr:.6e}], mom=[(0.9, 0.95)]",
        1,
    )


def _tqdm_line(job: _Job) -> tuple[str, int]:
    """A bar redrawn several times with bare CRs before the newline, as tqdm writes to a file."""
    rng = job.rng
    total = 40_000
    redraws = []
    for _ in range(rng.choice((1, 1, 1, 2, 3))):
        job.bar = (job.bar + rng.randrange(1, 40)) % total
        done = job.bar / total
        cells = int(done * 80)
        bar = "█" * (cells // 8) + (_BAR[cells % 8] if cells % 8 else "")
        rate = rng.uniform(1.4, 1.8)
        left = int((total - job.bar) / rate)
        redraws.append(
            f"\rTraining: {int(done * 100):3d}%|{bar:<10}| {job.bar}/{total} "
            f"[{job.bar // 3600:02d}:{job.bar // 60 % 60:02d}<{left // 3600}:"
            f"{left // 60 % 60:02d}:{left % 60:02d}, {rate:.2f}it/s, loss={job.loss:.3f}]"
        )
    return "".join(redraws), 1


_PY_WARNINGS = (
    (
        "torch/utils/checkpoint.py:464: UserWarning: torch.utils.checkpoint: the use_reentrant "
        "parameter should be passed explicitly. In version 2.5 we will raise an exception if "
        "use_reentrant is not passed. use_reentrant=False is recommended, but if you need to "
        "preserve the current default behavior, you can pass use_reentrant=True. Refer to docs "
        "for more details on the differences between the two variants.",
        "  return fn(*args, **kwargs)",
    ),
    (
        "torch/_utils.py:831: UserWarning: TypedStorage is deprecated. It will be removed in the "
        "future and UntypedStorage will be the only storage class. This should only matter to "
        "you if you are using storages directly.  To access UntypedStorage directly, use "
        "tensor.untyped_storage() instead of tensor.storage()",
        "  return self.fget.__get__(instance, owner)()",
    ),
    (
        "torch/distributed/fsdp/_state_dict_utils.py:773: FutureWarning: FSDP.state_dict_type() "
        "and FSDP.set_state_dict_type() are being deprecated. Please use APIs, get_state_dict() "
        "and set_state_dict(), which can support different parallelisms, FSDP1, FSDP2, DDP.",
        "  warnings.warn(",
    ),
    (
        "transformers/tokenization_utils_base.py:1617: FutureWarning: "
        "`clean_up_tokenization_spaces` was not set. It will be set to `True` by default.",
        "  warnings.warn(",
    ),
    (
        "torch/autograd/graph.py:825: UserWarning: c10d::broadcast_: an autograd kernel was not "
        "registered to the Autograd key(s) but we are trying to backprop through it.",
        "  return Variable._execution_engine.run_backward(  # Calls into the C++ engine",
    ),
)


def _py_warning(job: _Job) -> tuple[str, int]:
    head, tail = job.rng.choice(_PY_WARNINGS)
    prefix = f"[rank{job.rank()}]:"
    site = "/usr/local/lib/python3.11/site-packages/"
    return f"{prefix}{site}{head}\n{prefix}{tail}", 2


_DYNAMO = (
    "torch/_dynamo/convert_frame.py:844] [{f}/8] torch._dynamo hit config.cache_size_limit (8)",
    "torch/_dynamo/convert_frame.py:844] [{f}/8]    function: 'forward' (/workspace/model.py:212)",
    "torch/_dynamo/convert_frame.py:844] [{f}/8]    last reason: 0/0: L['self']._modules['attn']"
    ".training == True",
    "torch/_dynamo/variables/tensor.py:776] [{f}/0] Graph break from `Tensor.item()`, consider "
    "setting:",
    "torch/_inductor/utils.py:1137] [{f}/0] Not enough SMs to use max_autotune_gemm mode",
    "torch/_logging/_internal.py:1081] [{f}/0] Profiler function <class "
    "'torch.autograd.profiler.record_function'> will be ignored",
)


def _dynamo_warning(job: _Job) -> tuple[str, int]:
    _, glog, _ = job.clock.parts()
    rank = job.rank()
    _, pid, _ = job.where(rank)
    body = job.rng.choice(_DYNAMO).format(f=job.rng.randrange(6))
    return f"[rank{rank}]:W{glog}.{job.clock.frac(6)} {pid} {body}", 1


def _loader_line(job: _Job) -> tuple[str, int]:
    rng = job.rng
    rank = job.rank()
    style = rng.randrange(5)
    if style == 0:
        shard = rng.randrange(1024)
        return (
            f"[rank{rank}]: DataLoader worker {rng.randrange(8)}: loaded shard "
            f"/data/fineweb-edu/train-{shard:05d}-of-01024.parquet "
            f"({rng.randrange(90_000, 130_000)} rows) in {rng.uniform(0.4, 3):.2f}s",
            1,
        )
    if style == 1:
        return (
            f"[rank{rank}]: [dataloader] prefetch queue {rng.randrange(9)}/8, "
            f"waited {rng.uniform(0, 0.02):.4f}s for batch {job.step}",
            1,
        )
    if style == 2:
        return (
            f"[rank{rank}]: Tokenized {rng.randrange(10_000, 99_999)} documents "
            f"({rng.randrange(10**7, 10**8)} tokens) from /data/fineweb-edu/cache",
            1,
        )
    if style == 3:
        day, _, _ = job.clock.parts()
        return (
            f"{day},{rng.randrange(1000):03d} - data - INFO - epoch 0 progress "
            f"{job.step * 1024}/{40000 * 1024} samples, num_workers=8 prefetch_factor=2 "
            "pin_memory=True",
            1,
        )
    return (
        f"[rank{rank}]: memory: allocated {rng.uniform(40, 70):.2f} GiB, reserved "
        f"{rng.uniform(70, 76):.2f} GiB, max allocated {rng.uniform(70, 75):.2f} GiB",
        1,
    )


def _misc_line(job: _Job) -> tuple[str, int]:
    rng = job.rng
    rank = job.rank()
    style = rng.randrange(4)
    if style == 0:
        return f"[rank0]: Saving checkpoint to /checkpoints/run-4187/step_{job.step:07d} ...", 1
    if style == 1:
        return f"[rank0]: Checkpoint saved in {rng.uniform(8, 40):.2f}s", 1
    if style == 2:
        return (
            f"[rank{rank}]: eval step {job.step}: val_loss={job.loss + 0.1:.4f} "
            f"ppl={2.718 ** (job.loss + 0.1):.2f}",
            1,
        )
    return f"[rank{rank}]: throughput: {rng.uniform(150, 170):.1f} TFLOPS/GPU", 1


def _nccl_init(job: _Job, rank: int | None = None) -> tuple[str, int]:
    """The INFO block one rank prints when a communicator is created (NCCL 2.21)."""
    rng = job.rng
    rank = job.rank() if rank is None else rank
    dev = rank % GPUS_PER_HOST
    head = job.nccl_head(rank)
    comm = f"0x{rng.getrandbits(48):012x}"
    comm_id = f"0x{rng.getrandbits(64):016x}"
    bus = f"{BUS_IDS[dev]}000"
    ip = f"10.0.0.{11 + rank // GPUS_PER_HOST}"
    prefix = f"[rank{rank}]:" if rng.random() < 0.5 else ""
    lines = [
        f"{head} NCCL INFO cudaDriverVersion 12040",
        f"{head} NCCL INFO Bootstrap : Using eth0:{ip}<0>",
        f"{head} NCCL INFO NET/Plugin: No plugin found (libnccl-net.so)",
        f"{head} NCCL INFO NET/IB : Using [0]mlx5_0:1/IB [1]mlx5_1:1/IB [2]mlx5_2:1/IB "
        f"[3]mlx5_3:1/IB ; OOB eth0:{ip}<0>",
        f"{head} NCCL INFO Using network IB",
        f"{head} NCCL INFO comm {comm} rank {rank} nranks {WORLD} cudaDev {dev} nvmlDev {dev} "
        f"busId {bus} commId {comm_id} - Init START",
        f"{head} NCCL INFO Setting affinity for GPU {dev} to ffffffff,00000000,ffffffff",
        f"{head} NCCL INFO comm {comm} rank {rank} nRanks {WORLD} nNodes {len(HOSTS)} "
        f"localRanks {GPUS_PER_HOST} localRank {dev} MNNVL 0",
        f"{head} NCCL INFO Trees [0] {(rank + 1) % WORLD}/-1/-1->{rank}->{(rank - 1) % WORLD} "
        f"[1] {(rank + 1) % WORLD}/-1/-1->{rank}->{(rank - 1) % WORLD}",
        f"{head} NCCL INFO P2P Chunksize set to 524288",
    ]
    nxt = (rank + 1) % WORLD
    for channel in range(rng.choice((8, 16, 24))):
        tid_head = job.nccl_head(rank, tid=True)
        if nxt // GPUS_PER_HOST == rank // GPUS_PER_HOST:
            path = "via P2P/IPC/read" if channel % 2 else "via P2P/IPC"
            lines.append(
                f"{tid_head} NCCL INFO Channel {channel:02d}/0 : {rank}[{dev}] -> {nxt}"
                f"[{nxt % GPUS_PER_HOST}] {path}"
            )
        else:
            lines.append(
                f"{tid_head} NCCL INFO Channel {channel:02d}/0 : {rank}[{dev}] -> {nxt}"
                f"[{nxt % GPUS_PER_HOST}] [send] via NET/IB/{channel % 4}/GDRDMA"
            )
    lines += [
        f"{head} NCCL INFO Connected all rings",
        f"{head} NCCL INFO Connected all trees",
        f"{head} NCCL INFO threadThresholds 8/8/64 | 128/8/64 | 512 | 512",
        f"{head} NCCL INFO 24 coll channels, 24 collnet channels, 0 nvls channels, 32 p2p "
        "channels, 32 p2p channels per peer",
        f"{head} NCCL INFO ncclCommInitRank comm {comm} rank {rank} nranks {WORLD} cudaDev {dev} "
        f"nvmlDev {dev} busId {bus} commId {comm_id} - Init COMPLETE",
        f"{head} NCCL INFO Init timings: rank {rank} nranks {WORLD} total "
        f"{rng.uniform(0.5, 3):.2f} (kernels 0.21, alloc 0.05, bootstrap 0.61, allgathers 0.02, "
        "topo 0.12, graphs 0.01, connections 0.18, rest 0.03)",
    ]
    return "\n".join(prefix + line for line in lines), len(lines)


def _nccl_coll(job: _Job) -> tuple[str, int]:
    """What ``NCCL_DEBUG_SUBSYS=COLL`` prints for every collective on every rank (NCCL 2.21,
    src/enqueue.cc: ``INFO(NCCL_COLL, "%s: opCount %lx sendbuff %p recvbuff %p count %zu datatype
    %d op %d root %d comm %p [nranks=%d] stream %p", …)``): a third of a real INFO log."""
    rng = job.rng
    job.seq += 1
    op, dtype = rng.choice((("AllReduce", 7), ("AllGather", 9), ("ReduceScatter", 9)))
    count = rng.choice((25_165_824, 4_194_304, 131_072, 1))
    lines = []
    for rank in rng.sample(range(WORLD), rng.randrange(2, 6)):
        buf = 0x7F0000000000 + (job.pids[rank] << 12)
        lines.append(
            f"{job.nccl_head(rank, tid=True)} NCCL INFO {op}: opCount {job.seq:x} sendbuff "
            f"0x{buf:x} recvbuff 0x{buf + 0x4000000:x} count {count} datatype {dtype} op 0 "
            f"root 0 comm 0x{0x55D000000000 + job.pids[rank]:x} [nranks={WORLD}] stream "
            f"0x{0x55E000000000 + job.pids[rank]:x}"
        )
    return "\n".join(lines), len(lines)


def _ib_port_flap(job: _Job) -> tuple[str, int]:
    """An InfiniBand port going down and up for a while: NCCL's async event thread warns on every
    event on every rank of the host (src/transport/net_ib.cc, ``ncclIbAsyncThreadMain``: "NET/IB
    : %s:%d Got async event : %s", the event named by ``ibv_event_type_str``), the subnet
    manager's GID change with it; hundreds of lines a burst."""
    rng = job.rng
    host = rng.randrange(len(HOSTS))
    hca = f"mlx5_{rng.randrange(4)}:1"
    lines = []
    for _ in range(rng.randrange(20, 80)):
        job.clock.tick(rng.uniform(0.05, 2))
        rank = host * GPUS_PER_HOST + rng.randrange(GPUS_PER_HOST)
        head = job.nccl_head(rank, tid=True)
        event = rng.choice(("port error", "GID table change", "port active"))
        lines.append(f"{head} NCCL WARN NET/IB : {hca} Got async event : {event}")
    return "\n".join(lines), len(lines)


_STACK_FRAMES = (
    ("/usr/lib/python3.11/threading.py", 327, "wait"),
    ("/usr/lib/python3.11/threading.py", 629, "wait"),
    (
        "/usr/local/lib/python3.11/site-packages/torch/utils/data/_utils/pin_memory.py",
        54,
        "do_one_step",
    ),
    (
        "/usr/local/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py",
        2501,
        "all_reduce",
    ),
    ("/usr/local/lib/python3.11/site-packages/torch/nn/parallel/distributed.py", 1636, "forward"),
    ("/workspace/train.py", 388, "main"),
    ("/workspace/train.py", 412, "<module>"),
)


def _stack_dump(job: _Job) -> tuple[str, int]:
    """Every rank dumping its threads' stacks at once (``faulthandler.dump_traceback`` from a
    SIGUSR handler, as a hang detector triggers it) or dying with a Python traceback: a burst of
    a few hundred lines."""
    rng = job.rng
    lines = []
    fatal = rng.random() < 0.3
    for rank in range(WORLD):
        pre = f"[rank{rank}]:"
        if not fatal:
            for depth in (0, 2):
                lines.append(
                    f"{pre}Thread 0x{0x7F0000000000 + rng.getrandbits(32):016x} (most recent "
                    "call first):"
                )
                for path, line, fn in _STACK_FRAMES[depth:]:
                    lines.append(f'{pre}  File "{path}", line {line} in {fn}')
        else:
            lines.append(f"{pre}Traceback (most recent call last):")
            for path, line, fn in reversed(_STACK_FRAMES[3:]):
                lines.append(f'{pre}  File "{path}", line {line}, in {fn}')
                lines.append(f"{pre}    {fn}(...)")
            lines.append(f"{pre}KeyboardInterrupt")
    return "\n".join(lines), len(lines)


# What each mix is made of: (emitter, weight) pairs, and one incident per how many lines.
#   training: a job with NCCL_DEBUG=WARN and a communicator now and then (the original mix)
#   info:     NCCL_DEBUG=INFO with NCCL_DEBUG_SUBSYS=COLL: a third of the lines are per-collective
#             INFO lines, communicators are created often (sub-groups), incidents every ~20k lines
#   quiet:    NCCL_DEBUG=WARN, no NCCL line except the incidents'
#   warn_storm: an IB port flapping under a quiet job, bursts of NET/IB warnings (~5% of lines)
#   traceback_storm: every rank dumping its stacks now and then (~5% of lines)
MIXES: dict[str, tuple[tuple[tuple[object, float], ...], int]] = {
    "training": (
        (
            (_step_line, 30),
            (_tqdm_line, 14),
            (_loader_line, 18),
            (_misc_line, 8),
            (_py_warning, 4),
            (_dynamo_warning, 6),
            (_nccl_init, 0.01),  # a new communicator now and then; ~0.3% of lines
        ),
        70_000,
    ),
    "info": (
        (
            (_step_line, 24),
            (_tqdm_line, 8),
            (_loader_line, 10),
            (_misc_line, 4),
            (_py_warning, 2),
            (_dynamo_warning, 4),
            (_nccl_coll, 12),  # ~3.5 lines each: ~30% of lines
            (_nccl_init, 0.15),  # ~30 lines each: ~4% of lines
        ),
        20_000,
    ),
    "quiet": (
        (
            (_step_line, 40),
            (_tqdm_line, 14),
            (_loader_line, 18),
            (_misc_line, 8),
            (_py_warning, 4),
            (_dynamo_warning, 6),
        ),
        70_000,
    ),
    "warn_storm": (
        (
            (_step_line, 30),
            (_tqdm_line, 10),
            (_loader_line, 14),
            (_misc_line, 6),
            (_ib_port_flap, 0.1),
        ),
        70_000,
    ),
    "traceback_storm": (
        (
            (_step_line, 30),
            (_tqdm_line, 10),
            (_loader_line, 14),
            (_misc_line, 6),
            (_stack_dump, 0.05),
        ),
        70_000,
    ),
}


def _job_start(job: _Job) -> tuple[str, int]:
    """What torchrun and every rank print before the first step: the default process group's
    communicator init on each rank."""
    host, pid, _ = job.where(0)
    lines = [
        "W1121 03:00:00.000000 140 torch/distributed/run.py:793] *****************************",
        "W1121 03:00:00.000000 140 torch/distributed/run.py:793] Setting OMP_NUM_THREADS "
        "environment variable for each process to be 1 in default, to avoid your system being "
        "overloaded, please further tune the variable for optimal performance in your "
        "application as needed.",
        f"[rank0]:{host}:{pid}:{pid} [0] NCCL INFO NCCL version 2.21.5+cuda12.4",
    ]
    blocks = [_nccl_init(job, rank) for rank in range(WORLD)]
    text = "\n".join(lines + [b for b, _ in blocks])
    return text, len(lines) + sum(n for _, n in blocks)


# --- incidents --------------------------------------------------------------------------------

_OPS = (
    ("ALLREDUCE", 1),
    ("_ALLGATHER_BASE", WORLD),
    ("_REDUCE_SCATTER_BASE", 1),
    ("BROADCAST", 1),
)


def _watchdog_line(tag: str, rank: int, seq: int, op: str, numel: int, out: int, late_ms: int):
    """ProcessGroupNCCL's watchdog line (PyTorch 2.5) for a 600 s timeout overrun by late_ms."""
    return (
        f"{tag}632] [Rank {rank}] Watchdog caught collective operation timeout: "
        f"WorkNCCL(SeqNum={seq}, OpType={op}, NumelIn={numel}, NumelOut={out}, "
        f"Timeout(ms)=600000) ran for {600_000 + late_ms} milliseconds before timing out."
    )


def _timeouts(job: _Job, planted: Planted) -> list[str]:
    """ProcessGroupNCCL as PyTorch 2.5 prints a collective timeout: on each rank that timed out,
    the watchdog line (bare ``[Rank N]`` tag) and the progress line (``[PG ID … Rank N]``)."""
    rng = job.rng
    seq = job.seq
    op, gather = rng.choice(_OPS)
    numel = rng.choice((25_165_824, 50_331_648, 4_194_304, 131_072_000))
    ranks = rng.sample(range(WORLD), rng.randrange(1, 4))
    _, glog, _ = job.clock.parts()
    lines = []
    for rank in ranks:
        ns = job.clock.frac(9)
        tag = f"[rank{rank}]:[E{glog}.{ns} ProcessGroupNCCL.cpp:"
        lines.append(
            _watchdog_line(tag, rank, seq, op, numel, numel * gather, rng.randrange(1, 90))
        )
        lines.append(
            f"{tag}2168] [PG ID 0 PG GUID 0(default_pg) Rank {rank}]  failure detected by "
            f"watchdog at work sequence id: {seq} PG status: last enqueued work: {seq + 1}, "
            f"last completed work: {seq - 1}"
        )
        job.clock.tick(0.0003)
    planted.count("watchdog_timeout", len(ranks))
    planted.count("work_progress", len(ranks))
    return lines


def _nccl_warn(job: _Job, planted: Planted) -> list[str]:
    rng = job.rng
    rank = job.rank()
    head = job.nccl_head(rank, tid=True)
    peer = HOSTS[1 - rank // GPUS_PER_HOST]
    peer_ip = f"10.0.0.{12 - rank // GPUS_PER_HOST}"
    lines = [
        f"{head} transport/net_ib.cc:1696 NCCL WARN NET/IB : Got completion from peer "
        f"{peer_ip}<{rng.randrange(30000, 60000)}> with status=12 opcode=0 len=0 vendor err 129 "
        f"(Recv) localGid ::ffff:10.0.0.{11 + rank // GPUS_PER_HOST} remoteGids::ffff:{peer_ip} "
        f"hca mlx5_{rng.randrange(4)}",
        f"{head} misc/socket.cc:49 NCCL WARN socketProgress: Connection closed by remote peer "
        f"{peer}<{rng.randrange(30000, 60000)}>",
    ]
    planted.count("nccl_warn", len(lines))
    return lines


def _xid(job: _Job, planted: Planted) -> list[str]:
    """A kernel log line copied into the job log (``dmesg -T``), as NVIDIA's driver prints it."""
    _, _, dmesg = job.clock.parts()
    bus = job.rng.choice(BUS_IDS)
    planted.count("xid")
    return [
        f"[{dmesg}] NVRM: Xid (PCI:0000:{bus}:00): 79, pid={job.rng.randrange(20_000, 4_000_000)},"
        " name=python, GPU has fallen off the bus."
    ]


def _oom(job: _Job, planted: Planted) -> list[str]:
    rank = job.rank()
    dev = rank % GPUS_PER_HOST
    site = "/usr/local/lib/python3.11/site-packages/torch"
    body = [
        "Traceback (most recent call last):",
        '  File "/workspace/train.py", line 412, in <module>',
        "    main()",
        '  File "/workspace/train.py", line 388, in main',
        "    loss.backward()",
        f'  File "{site}/_tensor.py", line 581, in backward',
        "    torch.autograd.backward(",
        f'  File "{site}/autograd/graph.py", line 825, in _engine_run_backward',
        "    return Variable._execution_engine.run_backward(  # Calls into the C++ engine to run "
        "the backward pass",
        f"torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU {dev} has a "
        "total capacity of 79.15 GiB of which 1.23 GiB is free. Process "
        f"{job.pids[rank]} has 77.91 GiB memory in use. Of the allocated memory 74.12 GiB is "
        "allocated by PyTorch, and 2.31 GiB is reserved by PyTorch but unallocated. If reserved "
        "but unallocated memory is large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:"
        "True to avoid fragmentation.  See documentation for Memory Management  "
        "(https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)",
    ]
    planted.count("oom", 1)
    return [f"[rank{rank}]: {line}" for line in body]


def _incident(job: _Job, planted: Planted) -> tuple[str, int]:
    lines = _timeouts(job, planted)
    extra = job.rng.choice((None, _nccl_warn, _xid, _oom))
    if extra is not None:
        lines = extra(job, planted) + lines if extra is _xid else lines + extra(job, planted)
    planted.incident_lines += len(lines)
    return "\n".join(lines), len(lines)


# --- writer -----------------------------------------------------------------------------------


def write_log(
    path: str | Path,
    size_bytes: int,
    seed: int = 4187,
    mix: str = "training",
    *,
    incidents: bool = True,
) -> Planted:
    """Write about ``size_bytes`` of ``mix`` (see MIXES) to ``path``; return what was planted.
    ``incidents=False`` writes the noise alone (a healthy stretch of the same job)."""
    noise, incident_every = MIXES[mix]
    if not incidents:
        incident_every = 1 << 62
    emitters = tuple(e for e, _ in noise)
    cumulative = tuple(accumulate(w for _, w in noise))
    rng = random.Random(seed)
    job = _Job(rng)
    planted = Planted(path=str(path), seed=seed)
    # The first incident comes early so that even a small log has one to find; after that, one
    # at a random line of every block of the mix's incident interval.
    next_incident = rng.randrange(1_000, 5_000) if incidents else incident_every
    block_end = 0
    written = 0
    pending: list[str] = []
    pending_chars = 0
    lines = 0
    random_ = rng.random
    total_weight = cumulative[-1]
    with open(path, "wb") as out:
        text, lines = _job_start(job)
        pending.append(text)
        pending_chars = len(text) + 1
        while written + pending_chars < size_bytes:
            if lines >= next_incident:
                text, n = _incident(job, planted)
                next_incident = block_end + rng.randrange(incident_every)
                block_end += incident_every
            else:
                emit = emitters[bisect(cumulative, random_() * total_weight)]
                text, n = emit(job)  # type: ignore[operator]
            pending.append(text)
            pending_chars += len(text) + 1
            lines += n
            if pending_chars >= FLUSH_CHARS:
                written += out.write(("\n".join(pending) + "\n").encode())
                pending.clear()
                pending_chars = 0
        if pending:
            written += out.write(("\n".join(pending) + "\n").encode())
    planted.bytes = written
    planted.lines = lines
    return planted


def append_failure(path: str | Path, seed: int = 4187) -> Planted:
    """End the log at ``path`` the way a job dies of a GPU falling off the bus: the kernel's Xid 79
    for one GPU, then every other rank's watchdog timing out on the collective it never joined.
    Returns what was appended."""
    job = _Job(random.Random(seed))
    job.clock.tick(3 * 24 * 3600)  # days into the job: after anything write_log printed
    planted = Planted(path=str(path), seed=seed)
    lines = _xid(job, planted)
    seq = job.seq
    _, glog, _ = job.clock.parts()
    for rank in range(1, WORLD):
        tag = f"[rank{rank}]:[E{glog}.{job.clock.frac(9)} ProcessGroupNCCL.cpp:"
        lines.append(_watchdog_line(tag, rank, seq, "ALLREDUCE", 25_165_824, 25_165_824, 11))
        job.clock.tick(0.001)
    planted.count("watchdog_timeout", WORLD - 1)
    text = "\n".join(lines) + "\n"
    with open(path, "ab") as out:
        planted.bytes = out.write(text.encode())
    planted.lines = len(lines)
    planted.incident_lines = len(lines)
    return planted
