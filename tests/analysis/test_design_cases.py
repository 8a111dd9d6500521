"""The five cases of DESIGN.md, each from the artifacts such a job leaves behind: every rank's
log as the real software prints it (PyTorch ProcessGroupNCCL, NCCL INFO, torchrun, the kernel)."""

import json
from pathlib import Path

import pytest

from fleet.cli import diagnose

PG = "[PG ID 0 PG GUID 0(default_pg) Rank {r}]"


def watchdog(r, seq, op, numel_in, numel_out, timeout_ms, enq, done, stamp="E1121 03:12:44.1"):
    return (
        f"[rank{r}]:[{stamp} ProcessGroupNCCL.cpp:632] [Rank {r}] Watchdog caught collective "
        f"operation timeout: WorkNCCL(SeqNum={seq}, OpType={op}, NumelIn={numel_in}, "
        f"NumelOut={numel_out}, Timeout(ms)={timeout_ms}) ran for {timeout_ms + 37} milliseconds "
        "before timing out.\n"
        f"[rank{r}]:[{stamp} ProcessGroupNCCL.cpp:2168] {PG.format(r=r)}  failure detected by "
        f"watchdog at work sequence id: {seq} PG status: last enqueued work: {enq}, last "
        f"completed work: {done}\n"
    )


def dumped_by_peer(r, enq, done):
    return (
        f"[rank{r}]:[E1121 03:12:46.2 ProcessGroupNCCL.cpp:1987] {PG.format(r=r)} Received a dump "
        "signal due to a collective timeout from  rank 1 and we will try our best to dump the "
        f"debug info. Last enqueued NCCL work: {enq}, last completed NCCL work: {done}.This is "
        "most likely caused by incorrect usages of collectives, e.g., wrong sizes used across "
        "ranks, the order of collectives is not same for all ranks or the scheduled collective, "
        "for some reason, didn't run.\n"
    )


def write(tmp_path: Path, files: dict[str, str]) -> list[str]:
    for name, text in files.items():
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return [str(tmp_path)]


def test_case_1_rank_0_logging_to_slow_storage_is_storage_io(tmp_path):
    # FSDP2 pre-training: rank 0 writes TensorBoard logs to NFS; its host's kernel log shows the
    # mount stalling; the other ranks wait in _allgather_base until the 100 s timeout.
    steps = "".join(
        f"[rank0]:[titan] 2026-11-21 02:{s // 60:02d}:{s % 60:02d},000 - root - INFO - step: "
        f"{s:5d}  loss:  3.{s % 97:02d}  memory: 30.51GiB(38.62%)  tps: 5,240  mfu: 30.21%\n"
        for s in range(1790, 1810)
    )
    files = {
        "host-a/rank0.log": steps + dumped_by_peer(0, 90211, 90211),
        "host-a/dmesg.txt": (
            "[1021733.120011] nfs: server fs-logs01 not responding, still trying\n"
            "[1021790.412230] INFO: task python:48213 blocked for more than 120 seconds.\n"
            '[1021790.412244] "echo 0 > /proc/sys/kernel/hung_task_timeout_secs" disables this '
            "message.\n"
        ),
    }
    for r in (1, 2, 3):
        files[f"host-b/rank{r}.log"] = watchdog(
            r, 90212, "_ALLGATHER_BASE", 65667072, 262668288, 100000, 90212, 90211
        )
    verdict = diagnose(write(tmp_path, files))
    assert verdict.culprit == "storage_io"
    assert "local storage" in verdict.fix and "stopgap" in verdict.fix
    assert ("rank", "0") in [(s.kind, s.id) for s in verdict.suspects]


def test_case_2_unseeded_dataset_split_is_rank_desync_code(tmp_path):
    # Fine-tuning on 4 GPUs: ranks split the data with different random states; rank 3 ran
    # fewer steps and went on to save the model while the others still wait in an all-gather.
    files = {
        f"rank{r}.log": "".join(f"[rank{r}]: step {s} loss 1.{s:02d}\n" for s in range(60))
        + watchdog(r, 1474236, "_ALLGATHER_BASE", 262675456, 1050701824, 600000, 1474236, 1474235)
        for r in (0, 1, 2)
    }
    files["rank3.log"] = (
        "".join(f"[rank3]: step {s} loss 1.{s:02d}\n" for s in range(57))
        + "[rank3]: Training completed. Saving model checkpoint to ./output\n"
    )
    verdict = diagnose(write(tmp_path, files))
    assert verdict.culprit == "rank_desync_code"
    assert "seed" in verdict.fix
    assert ("rank", "3") in [(s.kind, s.id) for s in verdict.suspects]


def test_case_3_old_cuda_with_per_rank_csv_loading_is_software_version(tmp_path):
    # CLIP training on CUDA 9.1: ALLGATHER times out near the end of evaluation.
    head = (
        "PyTorch version: 1.4.0\nCUDA used to build PyTorch: 9.1.85\n"
        "Namespace(batch_size=256, csv_img_key='filepath', dataset_type='csv', epochs=32, "
        "workers=8)\n"
    )
    files = {
        f"rank{r}.log": head
        + f"[E ProcessGroupNCCL.cpp:566] [Rank {r}] Watchdog caught collective operation "
        "timeout: WorkNCCL(SeqNum=88412, OpType=ALLGATHER, TensorShape=[512, 1024], "
        "Timeout(ms)=1800000) ran for 1800412 milliseconds before timing out.\n"
        for r in range(4)
    }
    verdict = diagnose(write(tmp_path, files))
    assert verdict.culprit in ("software_version", "dataloader_cpu")
    assert "Upgrade CUDA and NCCL" in verdict.fix or "num_workers" in verdict.fix


def test_case_4_pipeline_degree_8_on_pcie_gpus_is_parallelism_config(tmp_path):
    # DiT inference, PipeFusion degree 8 on L40: rank 0 stuck in its first SEND on one p2p
    # group, other ranks in COALESCED send/recv on another, at different SeqNums.
    head = "INFO 09-23 13:55:20 [config.py:159] pipefusion_parallel_degree=8, ulysses_degree=1\n"
    files = {
        "rank0.log": head
        + " 33%|███▎      | 1/3 [00:02<00:04,  2.19s/it][rank0]:[E923 14:05:28.953176853 "
        "ProcessGroupNCCL.cpp:607] [Rank 0] Watchdog caught collective operation timeout: "
        "WorkNCCL(SeqNum=0, OpType=SEND, NumelIn=7208960, NumelOut=7208960, Timeout(ms)=600000) "
        "ran for 600003 milliseconds before timing out.\n"
        "[rank0]:[E923 14:05:28.953368768 ProcessGroupNCCL.cpp:1664] [PG 37 Rank 0] Exception "
        "(either an error or timeout) detected by watchdog at work: 0, last enqueued NCCL work: "
        "0, last completed NCCL work: 0.\n",
    }
    for r in range(1, 8):
        files[f"rank{r}.log"] = (
            head
            + f"[rank{r}]:[E923 14:05:28.992395601 ProcessGroupNCCL.cpp:607] [Rank {r}] Watchdog "
            "caught collective operation timeout: WorkNCCL(SeqNum=29, OpType=COALESCED, "
            "NumelIn=18446744073709551615, NumelOut=18446744073709551615, Timeout(ms)=600000) "
            "ran for 600009 milliseconds before timing out.\n"
            f"[rank{r}]:[E923 14:05:28.992592726 ProcessGroupNCCL.cpp:1664] [PG 35 Rank {r}] "
            "Exception (either an error or timeout) detected by watchdog at work: 29, last "
            "enqueued NCCL work: 29, last completed NCCL work: 28.\n"
        )
    verdict = diagnose(write(tmp_path, files))
    assert verdict.culprit == "parallelism_config"
    assert "pipeline degree" in verdict.fix


def _case_5_files(cpus: int | None) -> dict[str, str]:
    # ASR training on 4 hosts x 4 V100: NCCL runs over sockets (no IB); each GPU process has
    # num_workers=4 with prefetch 250; ALLREDUCE times out after 30 minutes. The job script runs
    # lscpu first when the host's CPU count is known.
    files = {}
    for host in range(4):
        for local in range(4):
            r = host * 4 + local
            nccl = (
                f"node{host}:{3100 + local}:{3100 + local} [{local}] NCCL INFO NET/IB : No "
                "device found.\n"
                f"node{host}:{3100 + local}:{3100 + local} [{local}] NCCL INFO NET/Socket : Using "
                f"[0]eth0:10.0.0.{host + 1}<0>\n"
                f"node{host}:{3100 + local}:{3100 + local} [{local}] NCCL INFO Using network "
                "Socket\n"
                f"node{host}:{3100 + local}:{3177 + local} [{local}] NCCL INFO comm 0x55d0c3a0 "
                f"rank {r} nranks 16 cudaDev {local} busId {local + 1}a000 - Init COMPLETE\n"
            )
            lscpu = f"Architecture:     x86_64\nCPU(s):           {cpus}\n" if cpus else ""
            conf = (
                "2026-11-20 10:00:01,000 INFO dataset_conf: {'batch_conf': {'batch_size': 16}, "
                "'shuffle': True, 'sort': True, 'prefetch': 250}\n"
                "2026-11-20 10:00:01,001 INFO num_workers: 4, pin_memory: True\n"
            )
            files[f"node{host}/rank{r}.log"] = (
                lscpu
                + conf
                + nccl
                + watchdog(r, 15734, "ALLREDUCE", 46331904, 46331904, 1800000, 15734, 15733)
            )
    return files


def test_case_5_dataloader_oversubscription_beats_the_socket_red_herring(tmp_path):
    # 4 GPU processes x 4 workers = 16 worker processes on hosts of 12 CPUs.
    verdict = diagnose(write(tmp_path, _case_5_files(cpus=12)))
    assert verdict.culprit == "dataloader_cpu"
    assert "num_workers" in verdict.fix
    assert "network_transport" in [a.culprit for a in verdict.alternatives]


def test_case_5_without_the_hosts_cpus_names_no_loader(tmp_path):
    # The same settings on hosts whose CPU count nothing shows: too many workers for what? The
    # settings alone do not accuse the loader; with 16 CPUs or more they fit.
    for cpus in (None, 16, 64):
        verdict = diagnose(write(tmp_path / str(cpus), _case_5_files(cpus=cpus)))
        assert verdict.culprit != "dataloader_cpu", verdict.summary


@pytest.mark.parametrize("case", ["storage", "desync"])
def test_case_verdicts_cite_evidence_lines_that_exist(tmp_path, case):
    files = {"rank0.log": watchdog(0, 5, "ALLREDUCE", 1, 1, 600000, 5, 4), "rank1.log": ""}
    if case == "storage":
        files["dmesg"] = "[1.0] INFO: task python:1 blocked for more than 120 seconds.\n"
    verdict = diagnose(write(tmp_path, files))
    for item in verdict.evidence:
        lines = Path(item.file).read_text().splitlines()
        assert item.text == lines[item.line - 1][: len(item.text)]


def test_case_5_reads_the_hosts_cpus_from_the_agents_host_readings(tmp_path):
    # No CPU count in the logs; each host's agent reported its CPUs (psutil.cpu_count()).
    files = _case_5_files(cpus=None)
    for host in range(4):
        files[f"node{host}/hw_stats.json"] = json.dumps(
            {
                "hw_stats": "fleetwatch.hw_stats/1",
                "host": f"node{host}",
                "at": 1763632800,
                "records": [{"type": "host", "cpu_percent": 97.0, "cpu_count": 12}],
            }
        )
    verdict = diagnose(write(tmp_path, files))
    assert verdict.culprit == "dataloader_cpu", verdict.summary
    assert "12 CPUs" in verdict.summary
