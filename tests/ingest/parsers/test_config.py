"""Settings, versions and progress bars that jobs print."""

import pytest

from ingest.parsers import parse_log
from ingest.parsers.log import HEAD_BYTES


def settings(text: str) -> dict[str, str]:
    return {e.key: e.value for e in parse_log(text.encode()).of_kind("config_value")}


def numbers(text: str) -> dict[str, float | None]:
    return {e.key: e.number for e in parse_log(text.encode()).of_kind("config_value")}


CASES = [
    # (source, line, canonical key, value)
    ("env dump", "NCCL_DEBUG=INFO", "nccl_debug", "INFO"),
    ("shell export", "export NCCL_SOCKET_IFNAME=eth0", "nccl_socket_ifname", "eth0"),
    ("os.environ repr", "{'NCCL_DEBUG': 'INFO', 'PATH': '/usr/bin'}", "nccl_debug", "INFO"),
    ("torch env", "TORCH_NCCL_ASYNC_ERROR_HANDLING=1", "torch_nccl_async_error_handling", "1"),
    ("visible devices", "CUDA_VISIBLE_DEVICES=0,1,2,3", "cuda_visible_devices", "0,1,2,3"),
    ("YAML conf (wenet)", "  num_workers: 4", "num_workers", "4"),
    ("YAML conf (wenet)", "  prefetch: 250", "prefetch", "250"),
    ("argparse Namespace", "Namespace(batch_size=8, num_workers=16, seed=1)", "num_workers", "16"),
    ("HF TrainingArguments", "dataloader_num_workers=0,", "num_workers", "0"),
    ("HF TrainingArguments", "dataloader_pin_memory=True,", "pin_memory", "True"),
    (
        "DataLoader kwargs",
        "'prefetch_factor': 2, 'persistent_workers': True",
        "prefetch_factor",
        "2",
    ),
    (
        "Megatron args",
        "  tensor_model_parallel_size ...................... 8",
        "tensor_parallel",
        "8",
    ),
    (
        "Megatron args",
        "  pipeline_model_parallel_size .................... 4",
        "pipeline_parallel",
        "4",
    ),
    (
        "Megatron args",
        "  data_parallel_size .............................. 2",
        "data_parallel",
        "2",
    ),
    (
        "xDiT command line",
        "python sample.py --pipefusion_parallel_degree 8 --ulysses_degree 1",
        "pipeline_parallel",
        "8",
    ),
    (
        "xDiT command line",
        "torchrun --nproc_per_node=8 sample.py --pp-degree 8",
        "pipeline_parallel",
        "8",
    ),
    ("torchrun launch config", "  nproc_per_node   : 8", "nproc_per_node", "8"),
    ("torchrun command line", "torchrun --nnodes=4 --nproc_per_node=4 train.py", "nnodes", "4"),
    ("environment", "WORLD_SIZE=16", "world_size", "16"),
    ("logger", "world_size: 16", "world_size", "16"),
    ("collect_env", "PyTorch version: 2.3.1+cu121", "torch_version", "2.3.1+cu121"),
    ("print(torch.__version__)", "torch.__version__ = 2.1.0", "torch_version", "2.1.0"),
    ("pip freeze", "torch==2.3.1", "torch_version", "2.3.1"),
    ("collect_env", "CUDA used to build PyTorch: 12.1", "cuda_version", "12.1"),
    (
        "nvidia-smi header",
        "| NVIDIA-SMI 535.104.05   Driver Version: 535.104.05   CUDA Version: 12.2     |",
        "driver_version",
        "535.104.05",
    ),
    (
        # The driver's newest supported CUDA, not the job's runtime: never cuda_version.
        "nvidia-smi header, its CUDA",
        "| NVIDIA-SMI 418.226.00   Driver Version: 418.226.00   CUDA Version: 10.1     |",
        "driver_cuda_version",
        "10.1",
    ),
    # The CPUs a host gives the job, and the processes that share them.
    ("lscpu / collect_env", "CPU(s):                          32", "host_cpus", "32"),
    ("Slurm environment", "SLURM_CPUS_ON_NODE=16", "host_cpus", "16"),
    (
        "sacct AllocTRES (per node)",
        "4421907      u2pp-16g   v100x4 billing=48,cpu=48,gres/gpu=16,mem=720G,node=4  FAILED",
        "host_cpus",
        "12",
    ),
    ("a script's print", "host resources: os.cpu_count()=64 local_world_size=8", "host_cpus", "64"),
    (
        "PyTorch's DataLoader warning",
        "UserWarning: This DataLoader will create 16 worker processes in total. Our suggested max "
        "number of worker in current system is 12, which is smaller than what this DataLoader is "
        "going to create.",
        "process_cpus",
        "12",
    ),
    (
        "reference scripts' -j",
        "python -m torch.distributed.launch --nproc_per_node=8 train.py /data --model r50 -j 8",
        "num_workers",
        "8",
    ),
    ("DeepSpeed launcher", "nnodes=2, num_local_procs=8, node_rank=0", "nproc_per_node", "8"),
    (
        "accelerate launch",
        "accelerate launch --multi_gpu --num_machines 4 --num_processes 16 train.py",
        "world_size",
        "16",
    ),
]


def test_cpu_lists_and_make_flags_are_not_cpu_counts_or_workers():
    assert "host_cpus" not in settings("On-line CPU(s) list:             0-31")
    assert "host_cpus" not in settings("NUMA node0 CPU(s):               0-31")
    assert "num_workers" not in settings("make -j 8 install")


def test_nvidia_smis_cuda_is_not_taken_for_the_runtimes():
    assert "cuda_version" not in settings(
        "| NVIDIA-SMI 418.226.00   Driver Version: 418.226.00   CUDA Version: 10.1     |"
    )


@pytest.mark.parametrize(("source", "line", "key", "value"), CASES, ids=[c[0] for c in CASES])
def test_settings_are_read_in_every_framework_shape(source, line, key, value):
    assert settings(line).get(key) == value


TIMEOUTS = [
    ("Megatron, minutes", "  distributed_timeout_minutes ..................... 30", 1800.0),
    ("Megatron command line", "--distributed-timeout-minutes 60", 3600.0),
    ("HF Trainer, seconds", "ddp_timeout=1800,", 1800.0),
    (
        "init_process_group",
        "init_process_group(backend='nccl', timeout=timedelta(minutes=10))",
        600.0,
    ),
    ("init_process_group repr", "timeout=datetime.timedelta(seconds=5400)", 5400.0),
]


@pytest.mark.parametrize(("source", "line", "seconds"), TIMEOUTS, ids=[t[0] for t in TIMEOUTS])
def test_the_distributed_timeout_is_given_in_seconds(source, line, seconds):
    assert numbers(line)["distributed_timeout"] == seconds


def test_a_word_after_a_key_in_prose_is_not_a_setting():
    assert settings("Spawning workers for the data loader, world_size unknown yet") == {}


def test_each_setting_is_reported_once_even_when_every_rank_prints_it():
    log = "".join(f"[rank{r}]: num_workers: 4\n" for r in range(8))
    assert len(parse_log(log.encode()).of_kind("config_value")) == 1


def test_a_long_preprocessing_bar_reports_its_elapsed_time():
    bar = "".join(
        f"\rRunning tokenizer on dataset:   {p}%|██      | {p * 1000}/2969526 [{m:02d}:55<4:48:08,"
        f" 155.57 examples/s]"
        for p, m in ((1, 3), (5, 15), (9, 29))
    )
    (event,) = parse_log(bar.encode()).of_kind("progress_bar")
    assert (event.desc, event.elapsed_s, event.done, event.total) == (
        "Running tokenizer on dataset",
        29 * 60 + 55,
        9000,
        2969526,
    )


def test_a_bar_glued_to_a_watchdog_line_is_read_anywhere_in_the_file():
    noise = b"step 1 loss 0.5\n" * (HEAD_BYTES // 16 + 10)
    line = (
        b"Running tokenizer on dataset:   9%|\xe2\x96\x88\xe2\x96\x88 | 280000/2969526 "
        b"[29:55<4:48:08, 155.57 examples/s][E ProcessGroupNCCL.cpp:475] [Rank 2] Watchdog caught "
        b"collective operation timeout: WorkNCCL(SeqNum=2, OpType=ALLREDUCE, NumelIn=1, "
        b"NumelOut=1, Timeout(ms)=1800000) ran for 1800328 milliseconds before timing out.\n"
    )
    (event,) = parse_log(noise + line).of_kind("progress_bar")
    assert event.elapsed_s == 1795


def test_short_training_bars_are_not_reported():
    log = "".join(f" {i}%|█     | {i}/100 [00:0{i % 10}<00:10,  2.19it/s]\n" for i in range(50))
    assert parse_log(log.encode()).of_kind("progress_bar") == []


def test_settings_far_from_the_start_of_a_big_file_are_not_looked_for():
    # Settings are printed at start-up; looking for every spelling everywhere would cost one
    # pass over the file per spelling. Environment variables (global trigger) still count.
    noise = b"step 1 loss 0.5\n" * (HEAD_BYTES // 16 + 10)
    found = settings((noise + b"num_workers: 4\nNCCL_DEBUG=WARN\n").decode())
    assert found == {"nccl_debug": "WARN"}


def test_a_unit_scaled_bar_gives_its_counts_and_elapsed_time():
    from ingest.parsers import parse_log

    text = "[rank0]:reading headers:  33%|███▎      | 2.01M/6.18M [04:47<09:47, 7.10kimg/s]\n"
    (bar,) = [e for e in parse_log(text.encode()).events if e.kind == "progress_bar"]
    assert (bar.desc, bar.elapsed_s, bar.done, bar.total) == (
        "reading headers",
        287,
        2_010_000,
        6_180_000,
    )
