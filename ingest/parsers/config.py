"""Settings a job prints that a diagnosis needs: NCCL/TORCH/CUDA environment variables, data
loader settings, world size and parallelism degrees, the collective timeout, software versions,
and tqdm progress bars of long preprocessing steps.

Frameworks print these in many shapes; the key spellings below are matched in all of them:
``KEY=value`` / ``export KEY=value`` (env dumps, ``Namespace(…)``, HF ``TrainingArguments(…)``),
``'key': value`` (dict reprs, JSON), ``key: value`` (YAML, loggers), Megatron's
``key ........ value`` and command lines ``--key value`` / ``--key=value``.

Settings are printed when a job starts, so their many spellings are looked for in the head of
each file only (``HEAD_TRIGGERS``); environment variables are also read wherever a global
trigger (``NCCL``) brings their line in, and a progress bar glued to a watchdog line is read too.
"""

from __future__ import annotations

import re

from .events import ConfigValue, Event, ProgressBar
from .lines import Line
from .prefix import Prefix

# PyTorch's DataLoader warns when it starts more workers than the process has CPUs; it does so
# when an epoch's iterator is created, anywhere in a log.
TRIGGERS: tuple[bytes, ...] = (b"suggested max number of worker",)
HEAD_TRIGGERS: tuple[bytes, ...] = (
    b"workers",
    b"CPU(s):",
    b"SLURM_CPUS_ON_NODE",
    b"cpu=",
    b"prefetch",
    b"pin_memory",
    b"world_size",
    b"WORLD_SIZE",
    b"parallel",
    b"degree",
    b"nnodes",
    b"NNODES",
    b"nproc_per_node",
    b"NPROC_PER_NODE",
    b"num_local_procs",
    b"num_processes",
    b"num_machines",
    b"cpu_count",
    b"torchrun",
    b"torch.distributed.",
    b"timeout",
    b"ersion",
    b"TORCH_",
    b"CUDA_",
    b"OMP_NUM_THREADS",
    b"torch==",
    b"CUDA used to build",
    b"%|",
)

# Spelling → canonical key. Framework of origin in the comment.
_KEYS: dict[str, str] = {
    "num_workers": "num_workers",  # torch DataLoader, Lightning, wenet, FunASR, Megatron
    "dataloader_num_workers": "num_workers",  # HF Trainer
    "workers": "num_workers",  # timm / torchvision reference scripts (--workers)
    "num_data_workers": "num_workers",
    "prefetch_factor": "prefetch_factor",  # torch DataLoader
    "dataloader_prefetch_factor": "prefetch_factor",  # HF Trainer
    "prefetch": "prefetch",  # wenet/FunASR dataset conf (samples per worker)
    "pin_memory": "pin_memory",
    "dataloader_pin_memory": "pin_memory",  # HF Trainer
    "world_size": "world_size",  # torch.distributed, every framework; WORLD_SIZE env
    "tensor_model_parallel_size": "tensor_parallel",  # Megatron
    "tensor_parallel_size": "tensor_parallel",  # vLLM, DeepSpeed, NeMo
    "tp_size": "tensor_parallel",
    "tp_degree": "tensor_parallel",
    "pipeline_model_parallel_size": "pipeline_parallel",  # Megatron
    "pipeline_parallel_size": "pipeline_parallel",
    "pp_degree": "pipeline_parallel",  # xDiT --pp-degree
    "pipefusion_parallel_degree": "pipeline_parallel",  # xDiT PipeFusion
    "pp_size": "pipeline_parallel",
    "data_parallel_size": "data_parallel",  # Megatron, DeepSpeed
    "data_parallel_degree": "data_parallel",  # xDiT
    "dp_degree": "data_parallel",
    "ulysses_degree": "sequence_parallel",  # xDiT / DeepSpeed-Ulysses
    "ring_degree": "sequence_parallel_ring",  # xDiT
    "context_parallel_size": "context_parallel",  # Megatron
    "nnodes": "nnodes",  # torchrun, DeepSpeed launcher
    "nproc_per_node": "nproc_per_node",  # torchrun
    "gpus_per_node": "nproc_per_node",  # Megatron launch scripts
    "num_local_procs": "nproc_per_node",  # DeepSpeed launcher ("nnodes=2, num_local_procs=8")
    "num_processes": "world_size",  # accelerate launch (all machines' processes)
    "num_machines": "nnodes",  # accelerate launch
    "cpu_count": "host_cpus",  # os.cpu_count() / psutil.cpu_count() as scripts print them
    "omp_num_threads": "omp_num_threads",
    "distributed_timeout_minutes": "distributed_timeout",  # Megatron (minutes)
    "ddp_timeout": "distributed_timeout",  # HF Trainer (seconds)
    "dist_timeout": "distributed_timeout",
}
_KEY_NAMES = sorted(_KEYS, key=len, reverse=True)
# Cheap substring test before the big alternation: every key spelling holds one of these
# (with "-" for "_" in command-line spellings), so a line holding none cannot match _SETTING.
_KEY_HINTS = (
    "worker",
    "procs",
    "processes",
    "machines",
    "cpu_count",
    "prefetch",
    "pin",
    "size",
    "degree",
    "nnodes",
    "nproc",
    "gpus",
    "omp",
    "timeout",
)
_SETTING = re.compile(
    r"(?<![\w-])(?:--|\$|')?(?P<key>"
    + "|".join(k.replace("_", "[_-]") for k in _KEY_NAMES)
    + r")(?:\(\))?['\"]?(?:\s*[=:]\s*|\s+\.{2,}\s*|\s+)['\"]?(?P<value>[\w.+\-/,:]*?)['\"]?"
    r"(?=[,;)}\]\s'\"]|$)",
    re.IGNORECASE,
)
# "-j 8": DataLoader workers on the command line of PyTorch's reference training scripts
# (pytorch/examples imagenet, torchvision's references, timm: "-j, --workers"), read only on a
# line that launches one through torch's launchers.
_LAUNCH = re.compile(r"torchrun|torch\.distributed\.(?:launch|run)")
_DASH_J = re.compile(r"\s-j\s*(?P<value>\d+)\b")

# Environment variables of interest, all shapes ("NCCL_DEBUG=INFO", "export NCCL_IB_HCA=mlx5",
# "'NCCL_DEBUG': 'INFO'", "NCCL_DEBUG: INFO").
_ENV = re.compile(
    r"(?<![\w])(?P<key>(?:NCCL|TORCH|TORCHELASTIC|CUDA|PYTORCH)_[A-Z0-9_]+)['\"]?\s*(?:=|:)\s*"
    r"['\"]?(?P<value>[^'\"\s;}]*)"
)
# PyTorch's timeout argument: "timeout=datetime.timedelta(seconds=1800)", "timedelta(minutes=30)".
_TIMEDELTA = re.compile(
    r"timeout\s*[=:]\s*(?:datetime\.)?timedelta\((?P<args>[^)]*)\)|timeout\s*[=:]\s*"
    r"(?P<hms>\d+:\d\d:\d\d)\b"
)
# Versions: torch.utils.collect_env ("PyTorch version: 2.3.1+cu121", "CUDA used to build PyTorch:
# 12.1"), prints of torch.__version__ ("torch version: 2.3.1", "torch.__version__ = 2.3.1"),
# pip freeze ("torch==2.3.1"), nvidia-smi's header ("Driver Version: 535.104.05  CUDA Version:
# 12.2") and nvcc ("Cuda compilation tools, release 12.1").
_DRIVER_CUDA = re.compile(r"Driver [Vv]ersion\s*:?\s*[\d.]+\s+CUDA Version\s*:?\s*(?P<v>\d+\.\d+)")
_VERSIONS = (
    (
        "torch_version",
        re.compile(
            r"(?:PyTorch|[Tt]orch)(?:\.__version__| version)\s*[:=]?\s*['\"]?(?P<v>\d+\.\d+[\w.+]*)"
            r"|\btorch==(?P<v2>\d+\.\d+[\w.+]*)"
        ),
    ),
    (
        # Not from nvidia-smi's header: its "CUDA Version" (after "Driver Version") is the newest
        # CUDA the driver supports, not the runtime the job runs (NVIDIA's CUDA compatibility
        # guide); that line gives driver_cuda_version.
        "cuda_version",
        re.compile(
            r"CUDA (?:[Vv]ersion|used to build PyTorch|runtime version)\s*:?\s*"
            r"(?P<v>\d+\.\d+[\d.]*)"
        ),
    ),
    ("driver_cuda_version", _DRIVER_CUDA),
    ("driver_version", re.compile(r"Driver [Vv]ersion\s*:?\s*(?P<v>\d+\.\d+[\d.]*)")),
)
# The CPUs a host gives the job, as jobs print them:
# - PyTorch's DataLoader (torch/utils/data/dataloader.py, _check_worker_number_rationality, 1.9+):
#   "This DataLoader will create 12 worker processes in total. Our suggested max number of worker
#   in current system is 8, which is smaller …": len(os.sched_getaffinity(0)), the CPUs the
#   process may run on, or os.cpu_count() when "(`cpuset` is not taken into account)";
# - lscpu and torch.utils.collect_env (which prints lscpu): "CPU(s):  96", logical CPUs;
# - Slurm: SLURM_CPUS_ON_NODE (the CPUs allocated on this node, sbatch(1) output environment),
#   and a job's TRES as sacct/scontrol print it ("cpu=48,mem=720G,node=4": 12 per node).
_LOADER_WARNING = re.compile(
    r"DataLoader will create (?P<workers>\d+) worker processes in total\. Our suggested max "
    r"number of worker in current system is (?P<cpus>\d+)"
)
_LSCPU = re.compile(r"^\s*CPU\(s\):\s*(?P<cpus>\d+)\s*$")
_SLURM_CPUS = re.compile(r"\bSLURM_CPUS_ON_NODE\s*[=:]\s*['\"]?(?P<cpus>\d+)")
_TRES = re.compile(r"\bcpu=(?P<cpus>\d+)(?:,[\w/:.-]+=[\w.]+)*?,node=(?P<nodes>\d+)\b")

# tqdm: "Running tokenizer on dataset:   9%|███▊   | 280000/2969526 [29:55<4:48:08, 155.57
# examples/s]" (tqdm 4.x, all versions); redraws are separated by CR, which lines.clean turns
# into spaces, so the last match on a line is the bar's latest state.
# Counts as tqdm prints them: "7726/1219862", or with unit_scale "2.01M/6.18M".
_COUNT = r"\d+(?:\.\d+)?[kMGTPEZY]?"
_BAR = re.compile(
    r"(?:(?P<desc>[^\s|:\[\]][^|:\[\]]{0,160}?):\s*)?(?P<pct>\d{1,3})%\|[^|]{0,200}\|\s*"
    rf"(?P<done>{_COUNT})/(?P<total>{_COUNT}|\?)\s*\[(?P<el>(?:\d+:)?\d{{1,2}}:\d{{2}})<"
)
_SCALE = {"k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15, "E": 1e18, "Z": 1e21, "Y": 1e24}


def _count(text: str) -> int:
    """A tqdm count, unit-scaled or not, as a number ("2.01M" is 2010000)."""
    if text[-1] in _SCALE:
        return round(float(text[:-1]) * _SCALE[text[-1]])
    return int(float(text))


# Every word without which no pattern of ConfigParser.feed can match, lower-case: the settings'
# spellings (with "_" or "-"), and what bars, environment dumps, timeouts and versions contain.
_WORDS: tuple[str, ...] = tuple(
    sorted(
        {k for k in _KEYS}
        | {k.replace("_", "-") for k in _KEYS}
        | {"%|", "nccl_", "torch", "cuda_", "timeout", "ersion", "cuda used"}
        | {"suggested max number of worker", "cpu(s):", "slurm_cpus_on_node", "cpu="}
    )
)

# One search for all of them: the same answer as ``any(w in low for w in _WORDS)``, in C.
_ANY_WORD = re.compile("|".join(re.escape(w) for w in _WORDS))

# The head of a bar, up to its percentage: "Scanning '…' images and labels...:   6%|".
_CUT_BAR = re.compile(r"(?P<desc>[^\s|:\[\]][^|:\[\]]{0,160}?):\s*(?P<pct>\d{1,3})%\|")
MAX_BARS = 100
# A bar line holding one of these carries something else (a setting, a glued log line).
_BAR_KEEP = (b"NCCL", b"Error", b"_", b"=", b"ersion")


def _number(value: str) -> float | None:
    try:
        return float(value)
    except ValueError:
        return None


def _elapsed(value: str) -> int:
    seconds = 0
    for part in value.split(":"):
        seconds = seconds * 60 + int(part)
    return seconds


def _timedelta_seconds(args: str) -> float | None:
    units = {"days": 86400, "hours": 3600, "minutes": 60, "seconds": 1, "milliseconds": 0.001}
    total = 0.0
    found = False
    for name, value in re.findall(r"(\w+)\s*=\s*([\d.]+)", args):
        if name in units:
            total += float(value) * units[name]
            found = True
    return total if found else None


class ConfigParser:
    """Stateful to report each setting once and each progress bar at its furthest point."""

    triggers = TRIGGERS
    head_triggers = HEAD_TRIGGERS

    def __init__(self) -> None:
        self._seen: set[tuple[str, str]] = set()
        self._bars: dict[str, ProgressBar] = {}

    def feed(self, line: Line, pre: Prefix, follow) -> list[Event]:
        text = pre.rest
        if "NCCL INFO" in text or "NCCL WARN" in text:
            return []  # nccl.py reads NCCL's own report of its settings
        low = text.lower()
        if _ANY_WORD.search(low) is None:
            # Decoded for another parser (a trainer's step line, say): nothing here can match
            # a setting, a bar, a timeout or a version, and the setting regex is costly.
            return []
        out: list[Event] = []
        ctx = {"line": line.number, "text": line.text, "rank": pre.rank}
        if "%|" in text:
            self._bar(ctx, text)
        if "NCCL_" in text or "TORCH" in text or "CUDA_" in text:
            for m in _ENV.finditer(text):
                value = m.group("value").rstrip(",")
                out.extend(self._emit(ctx, m.group("key"), value, m.group("key")))
        settings = _SETTING.finditer(text) if any(h in low for h in _KEY_HINTS) else ()
        for m in settings:
            raw = m.group("key")
            key = _KEYS.get(raw.lower().replace("-", "_"))
            if key is None:
                continue
            value = m.group("value").strip(",")
            number = _number(value)
            sep = text[m.end("key") : m.start("value")]
            if (
                not sep.strip(" '\"")
                and number is None
                and value.lower()
                not in (
                    "true",
                    "false",
                )
            ):
                continue  # "key value" with a word after it is prose, not a setting
            if (
                key == "num_workers"
                and raw.lower() == "workers"
                and not m.group(0).startswith("--")
            ):
                continue
            if key == "distributed_timeout" and number is not None:
                number *= 60 if "minute" in raw.lower() else 1
            out.extend(self._emit(ctx, key, value, raw, number))
        if " -j" in text and _LAUNCH.search(text):
            m = _DASH_J.search(text)
            if m:
                out.extend(self._emit(ctx, "num_workers", m.group("value"), "-j"))
        if "timeout" in text:
            m = _TIMEDELTA.search(text)
            if m:
                if m.group("args") is not None:
                    seconds = _timedelta_seconds(m.group("args"))
                    value = f"timedelta({m.group('args')})"
                else:
                    seconds, value = float(_elapsed(m.group("hms"))), m.group("hms")
                out.extend(self._emit(ctx, "distributed_timeout", value, "timeout", seconds))
        if "CPU" in text or "cpu=" in text or "worker in current" in text:
            out.extend(self._cpus(ctx, text))
        if "ersion" in text or "torch==" in text or "CUDA used" in text:
            driver_line = "Driver" in text and _DRIVER_CUDA.search(text)
            for key, pattern in _VERSIONS:
                if key == "cuda_version" and driver_line:
                    continue  # nvidia-smi's header: that CUDA version is the driver's
                m = pattern.search(text)
                if m:
                    value = m.group("v") or (m.groupdict().get("v2") or "")
                    if value:
                        out.extend(self._emit(ctx, key, value, key))
        return out

    def _cpus(self, ctx: dict, text: str) -> list[Event]:
        m = _LOADER_WARNING.search(text)
        if m:
            return self._emit(
                ctx, "num_workers", m.group("workers"), "DataLoader will create"
            ) + self._emit(ctx, "process_cpus", m.group("cpus"), "suggested max number of worker")
        m = _LSCPU.match(text) or _SLURM_CPUS.search(text)
        if m:
            return self._emit(ctx, "host_cpus", m.group("cpus"), "CPU(s)")
        m = _TRES.search(text)
        if m and int(m.group("nodes")) > 0:
            per_node = int(m.group("cpus")) // int(m.group("nodes"))
            return self._emit(ctx, "host_cpus", str(per_node), f"cpu=…,node={m.group('nodes')}")
        return []

    def _emit(
        self, ctx: dict, key: str, value: str, raw: str, number: float | None = None
    ) -> list[Event]:
        canonical = key.lower()
        if not value or (canonical, value) in self._seen or len(self._seen) > 5000:
            return []
        self._seen.add((canonical, value))
        if number is None:
            number = _number(value)
        return [ConfigValue(**ctx, key=canonical, value=value[:200], raw_key=raw, number=number)]

    def _bar(self, ctx: dict, text: str) -> None:
        # The last redraw is the bar's latest state. A description is short, except where a
        # loader counts into it (yolov5: "Scanning '…/labels/train' images and labels...43718
        # found, 110 missing, 0 empty, 7 corrupted"): up to 160 characters.
        cut = text.rfind("%|")
        last = None
        if "<" in text[cut:]:
            last = _BAR.search(text, max(0, cut - 200, text.rfind("]", 0, cut) + 1))
        if last is None:
            # A bar cut before its counts (a line glued onto it, an excerpt that stops there):
            # its description and that it was still drawing are all it says.
            self._cut_bar(ctx, text, cut)
            return
        desc = (last.group("desc") or "").strip()
        elapsed = _elapsed(last.group("el"))
        old = self._bars.get(desc)
        if old is not None and (old.elapsed_s or 0) > elapsed:
            return
        if old is None and len(self._bars) >= MAX_BARS:
            return
        total = last.group("total")
        self._bars[desc] = ProgressBar(
            **ctx,
            desc=desc,
            elapsed_s=elapsed,
            done=_count(last.group("done")),
            total=_count(total) if total != "?" else None,
            percent=int(last.group("pct")),
        )

    def _cut_bar(self, ctx: dict, text: str, cut: int) -> None:
        m = _CUT_BAR.search(text, max(0, cut - 200), cut + 2)
        if m is None:
            return
        desc = m.group("desc").strip()
        if desc in self._bars or len(self._bars) >= MAX_BARS:
            return
        self._bars[desc] = ProgressBar(**ctx, desc=desc, percent=int(m.group("pct")))

    def skip_raw(self, raw: bytes) -> bool:
        """A tqdm bar whose latest redraw shows less than a minute elapsed, on a line that
        holds nothing else of interest: training progress bars, thousands of them."""
        cut = raw.rfind(b"%|")
        if cut < 0:
            return False
        start = raw.find(b"[", cut)
        if start < 0 or raw[start + 1 : start + 4] != b"00:" or raw[start + 6 : start + 7] != b"<":
            return False
        return raw.count(b"%|") == 1 and not any(w in raw for w in _BAR_KEEP)

    def flush(self) -> list[Event]:
        bars = sorted(self._bars.values(), key=lambda bar: bar.line)
        self._bars.clear()
        return list(bars)
