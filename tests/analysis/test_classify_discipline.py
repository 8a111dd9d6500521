"""Evidence discipline: accuse only what was observed, read contradictions the lines carry, and
name the rank that died first on any backend."""

from analysis.classify import IncidentContext, classify
from ingest.parsers import parse_log


def watchdog(rank: int, seq: int, op: str = "ALLREDUCE", numel: int = 8, era: str = "2.x") -> str:
    work = (
        f"WorkNCCL(SeqNum={seq}, OpType={op}, NumelIn={numel}, NumelOut={numel}, "
        "Timeout(ms)=600000)"
    )
    if era == "1.x":
        work = f"WorkNCCL(SeqNum={seq}, OpType={op}, Timeout(ms)=1800000)"
        return (
            f"[E ProcessGroupNCCL.cpp:737] [Rank {rank}] Watchdog caught collective operation "
            f"timeout: {work} ran for 1804371 milliseconds before timing out.\n"
        )
    return (
        f"[rank{rank}]:[E1121 03:12:44.1 ProcessGroupNCCL.cpp:632] [Rank {rank}] Watchdog caught "
        f"collective operation timeout: {work} ran for 600031 milliseconds before timing out.\n"
    )


def verdict_of(text: str, context: IncidentContext | None = None):
    return classify(parse_log(text.encode(), source="excerpt.log").events, context)


def rank_suspects(verdict) -> list[str]:
    return [s.id for s in verdict.suspects if s.kind == "rank"]


def test_an_excerpt_without_rank_0_does_not_accuse_rank_0():
    for era in ("1.x", "2.x"):
        verdict = verdict_of("".join(watchdog(r, 56693, "BROADCAST", era=era) for r in (3, 2, 1)))
        assert verdict.culprit == "unknown"
        assert "0" not in rank_suspects(verdict)
        assert "no artifacts from rank 0" in verdict.summary


def test_a_rank_whose_lines_are_present_but_show_no_timeout_is_silent_and_suspected():
    text = "".join(watchdog(r, 19) for r in (1, 2, 3)) + (
        "[rank0]:Traceback (most recent call last):\n"
        '[rank0]:  File "train.py", line 3, in <module>\n'
        "[rank0]:StopIteration: data exhausted\n"
    )
    verdict = verdict_of(text)
    assert rank_suspects(verdict)[:1] == ["0"]


def test_a_rank_whose_own_log_was_uploaded_without_a_timeout_is_the_suspect():
    verdict = verdict_of(
        "".join(watchdog(r, 19) for r in (1, 2, 3)),
        IncidentContext(ranks_uploaded=frozenset({0, 1, 2, 3})),
    )
    assert verdict.culprit == "rank_desync_code"
    assert rank_suspects(verdict) == ["0"]


def test_the_same_seqnum_in_different_ops_on_plain_watchdog_lines_is_a_mismatch():
    text = watchdog(0, 9) + watchdog(1, 9) + watchdog(2, 9, "BROADCAST", 1) + watchdog(3, 9)
    verdict = verdict_of(text)
    assert verdict.culprit == "rank_desync_code"
    assert "watchdog_op_mismatch" in verdict.rule_ids
    assert rank_suspects(verdict)[:1] == ["2"]


def test_the_same_seqnum_in_the_same_op_and_size_is_no_mismatch():
    verdict = verdict_of("".join(watchdog(r, 9) for r in range(4)))
    assert "watchdog_op_mismatch" not in verdict.rule_ids


def test_point_to_point_ops_at_one_seqnum_are_not_called_a_mismatch():
    text = watchdog(0, 4, "SEND", 100) + watchdog(1, 4, "RECV", 100) + watchdog(2, 4, "ALLREDUCE")
    assert "watchdog_op_mismatch" not in verdict_of(text).rule_ids


def test_a_rank_timing_out_in_two_unlabelled_works_makes_equal_seqs_say_nothing():
    # Two groups in play (FSDP shard + replicate), lines that do not name their group.
    text = (
        watchdog(0, 5, "ALLREDUCE")
        + watchdog(0, 7, "_ALLGATHER_BASE", 64)
        + watchdog(1, 5, "_ALLGATHER_BASE", 64)
    )
    assert "watchdog_op_mismatch" not in verdict_of(text).rule_ids


ELASTIC_TABLE = """\
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
============================================================
train.py FAILED
------------------------------------------------------------
Failures:
[1]:
  time      : 2026-11-25_09:01:12
  host      : node-b
  rank      : 3 (local_rank: 1)
  exitcode  : 1 (pid: 4243)
  error_file: <N/A>
  traceback : To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-11-25_09:01:10
  host      : node-b
  rank      : {rank} (local_rank: 0)
  exitcode  : {code} (pid: 4242)
  error_file: <N/A>
  traceback : To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html
============================================================
"""

GLOO_ECHO = (
    "[rank{r}]:RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection "
    "closed by peer [127.0.0.1]:41234\n"
)


def test_on_gloo_the_rank_that_raised_first_is_named_and_the_echoes_are_not_crashes():
    text = (
        "[rank2]:Traceback (most recent call last):\n"
        '[rank2]:  File "train.py", line 40, in <module>\n'
        "[rank2]:RuntimeError: injected failure in the loss\n"
        + GLOO_ECHO.format(r=0)
        + GLOO_ECHO.format(r=1)
        + ELASTIC_TABLE.format(rank=2, code=1)
    )
    verdict = verdict_of(text)
    assert verdict.culprit == "oom_or_crash"
    assert rank_suspects(verdict)[:1] == ["2"]


def test_a_watchdog_abort_as_root_cause_is_not_called_a_crash():
    text = "".join(watchdog(r, 19) for r in range(4)) + ELASTIC_TABLE.format(rank=0, code=-6)
    assert verdict_of(text).culprit != "oom_or_crash"


def test_a_sigkilled_root_cause_names_that_rank():
    table = ELASTIC_TABLE.format(rank=1, code=-9).replace(
        "  exitcode  : -9 (pid: 4242)", "  exitcode  : -9 (pid: 4242)"
    )
    verdict = verdict_of(GLOO_ECHO.format(r=0) + table)
    assert verdict.culprit == "oom_or_crash"
    assert rank_suspects(verdict)[:1] == ["1"]


def test_a_peer_advertising_loopback_on_a_multi_host_job_is_a_network_problem():
    text = (
        "[rank10]:torch.distributed.DistBackendError: NCCL error in: ProcessGroupNCCL.cpp:1331, "
        "unhandled system error (run with NCCL_DEBUG=INFO for details), NCCL version 2.18.5\n"
        "[rank10]:Last error:\n"
        "[rank10]:socketStartConnect: Connect to 127.0.0.1<45069> failed : Software caused "
        "connection abort\n"
    )
    verdict = verdict_of(text)
    assert verdict.culprit == "network_transport"
    assert "loopback" in verdict.summary


def test_the_same_cause_on_other_ranks_and_seqs_has_one_signature_and_another_cause_another():
    from analysis.memory import incident_fingerprint

    one = verdict_of(watchdog(0, 9) + watchdog(1, 9) + watchdog(2, 9, "BROADCAST", 1))
    two = verdict_of(
        watchdog(4, 77123)
        + watchdog(5, 77123)
        + watchdog(6, 77123)
        + watchdog(7, 77123, "BROADCAST", 1)
    )
    split = verdict_of(
        "".join(watchdog(r, 19) for r in (1, 2, 3)),
        IncidentContext(ranks_uploaded=frozenset({0, 1, 2, 3})),
    )
    assert one.culprit == two.culprit == split.culprit == "rank_desync_code"
    assert one.signature == two.signature
    assert one.signature != split.signature
    assert incident_fingerprint(one.culprit, None, one.signature) == incident_fingerprint(
        two.culprit, None, two.signature
    )
    assert incident_fingerprint(one.culprit, None, one.signature) != incident_fingerprint(
        split.culprit, None, split.signature
    )


def test_gloo_failing_to_connect_its_ranks_is_a_network_problem():
    text = (
        "(RayWorkerWrapper pid=1061) [rank2]:[E212 02:14:01.179080356 ProcessGroupGloo.cpp:143] "
        "Gloo connectFullMesh failed with [../third_party/gloo/gloo/transport/tcp/pair.cc:144] "
        "no error\n"
    )
    assert verdict_of(text).culprit == "network_transport"


def test_a_gpu_the_driver_says_must_be_reset_is_a_hardware_fault():
    text = (
        "[Sun Jan 11 09:52:01 2026] NVRM: nvAssertOkFailedNoLog: Assertion failed: Reset required "
        "[NV_ERR_RESET_REQUIRED] (0x00000062) returned from status @ kernel_channel.c:2874\n"
    )
    assert verdict_of(text).culprit == "bad_node_hardware"


def test_the_wrappers_mismatch_error_is_a_desync_even_with_its_fingerprints_cut_off():
    text = (
        "RuntimeError: Detected mismatch between collectives on ranks. Rank 0 is running "
        "inconsistent collective: CollectiveFingerPrint(OpType=ALLGATHER, TensorShape\n"
    )
    assert verdict_of(text).culprit == "rank_desync_code"


def test_two_ranks_on_one_gpu_is_the_launch_layout():
    text = (
        "torch.distributed.DistBackendError: NCCL error in: ../torch/csrc/distributed/c10d/"
        "ProcessGroupNCCL.cpp:1691, invalid usage (run with NCCL_DEBUG=WARN for details), NCCL "
        "version 2.19.3\nLast error:\n"
        "Duplicate GPU detected : rank 0 and rank 1 both on CUDA device 2000\n"
    )
    verdict = verdict_of(text)
    assert verdict.culprit == "parallelism_config"
    assert "LOCAL_RANK" in verdict.fix


def test_ranks_timing_out_in_one_call_at_different_seqnums_ran_different_step_counts():
    text = "".join(
        watchdog(r, seq, "_ALLGATHER_BASE", 262675456)
        for r, seq in ((0, 28178), (1, 28151), (2, 28202))
    )
    verdict = verdict_of(text)
    assert verdict.culprit == "rank_desync_code"
    assert "watchdog_seq_spread" in verdict.rule_ids


def test_ranks_timing_out_in_one_call_at_one_seqnum_show_no_spread():
    text = "".join(watchdog(r, 28178, "_ALLGATHER_BASE", 262675456) for r in range(3))
    assert "watchdog_seq_spread" not in verdict_of(text).rule_ids


def test_a_collective_timeout_raised_as_an_exception_is_a_failure():
    # gloo, and NCCL with blocking wait, raise the timeout instead of the watchdog reporting it.
    for line in (
        "[rank1]: RuntimeError: [/pytorch/third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:"
        "78] Timed out waiting 6000ms for recv operation to complete\n",
        "RuntimeError: NCCL error: unhandled system error, Operation timed out!\n",
    ):
        assert verdict_of(line).failed, line


def test_a_timeout_outside_collectives_is_no_failure():
    assert not verdict_of(
        "requests.exceptions.ReadTimeout: Read timed out. (read timeout=10)\n"
    ).failed


def rule_ids(verdict) -> set[str]:
    return {m.rule_id for m in verdict.matches}


def test_a_long_running_bar_beside_a_training_sized_collective_is_no_preprocessing_wait():
    # A training loop's bar runs for hours in any long job: beside a gradient all-reduce that
    # hung it says nothing about a rank busy preprocessing while the others waited.
    bar = "Epoch 3:  41%|████      | 4100/10000 [2:10:05<3:07:12,  1.91s/it, loss=1.23]\n"
    text = bar + "".join(watchdog(r, 90211, numel=67108864) for r in (0, 1, 2, 3))
    assert "preprocessing_outlasted_timeout" not in rule_ids(verdict_of(text))


def test_a_preprocessing_bar_as_long_as_the_store_wait_that_expired_names_the_timeout():
    bar = "Map (num_proc=16):  57%|█████▋    | 76614/135065 [29:59<24:54, 39.10 examples/s]\n"
    store = (
        "[rank3]:[W516 14:34:56.8 socket.cpp:489] [c10d] waitForInput: socket SocketImpl(fd=79, "
        "addr=[localhost]:41170, remote=[localhost]:29500) timed out after 1800000ms\n"
    )
    verdict = verdict_of(bar + store)
    assert "preprocessing_outlasted_timeout" in rule_ids(verdict)
    # Without the expired wait nothing failed: a long map alone is no incident.
    assert "preprocessing_outlasted_timeout" not in rule_ids(verdict_of(bar))


def test_a_data_preparation_bar_places_a_wait_whose_watchdog_line_names_no_seqnum():
    # PyTorch before 1.12 names neither SeqNum nor sizes: where the wait was is unknown, so only
    # a bar that prepares data (not a training bar) says the others waited for it.
    def unplaced(rank: int) -> str:
        return (
            f"[E ProcessGroupNCCL.cpp:566] [Rank {rank}] Watchdog caught collective operation "
            "timeout: WorkNCCL(OpType=BROADCAST, Timeout(ms)=120000) ran for 121503 milliseconds "
            "before timing out.\n"
        )

    waits = "".join(unplaced(r) for r in (1, 2, 3))
    for bar in (
        "Running tokenizer on dataset:  61%|██████    | 61000/100000 [01:58<01:15, 516.2 ex/s]\n",
        "val: Scanning '/data/val2017' images and labels...4200 found, 0 missing:  84%|████████▍"
        " | 4200/5000 [02:03<00:23, 34.1it/s]\n",
    ):
        verdict = verdict_of(bar + waits)
        assert verdict.culprit == "timeout_too_short", bar
        assert "preprocessing_outlasted_timeout" in rule_ids(verdict)
    # A training bar as long says nothing about a wait that could be a training step's.
    train = "Epoch 0:  12%|█▏        | 120/1000 [02:10<15:52,  1.08s/it, loss=2.31]\n"
    assert "preprocessing_outlasted_timeout" not in rule_ids(verdict_of(train + waits))
    # Nor does a preparation bar well inside the limit.
    short = "Map (num_proc=8):  20%|██        | 2000/10000 [00:31<02:04, 64.2 examples/s]\n"
    assert "preprocessing_outlasted_timeout" not in rule_ids(verdict_of(short + waits))


def test_nccl_failing_to_allocate_its_buffers_is_an_oom_even_with_no_timeout_yet():
    # NCCL's CUDACHECK returns ncclUnhandledCudaError after the WARN: nothing recovers from it,
    # unlike a trainer's warning that quotes an OOM it skipped.
    text = (
        "node7:88:88 [2] NCCL INFO Channel 00 : 2[2] -> 3[3] via P2P/IPC\n"
        "node7:88:88 [2] alloc.h:58 NCCL WARN Cuda failure 'out of memory'\n"
        "node7:88:88 [2] NCCL INFO transport/p2p.cc:164 -> 1\n"
        "node7:88:88 [2] NCCL INFO init.cc:792 -> 1\n"
    )
    assert verdict_of(text).culprit == "oom_or_crash"
    other = text.replace("out of memory", "invalid resource handle")
    assert "oom" not in verdict_of(other).summary


def test_gloos_pair_closure_after_a_timeout_is_a_collective_failure():
    verdict = verdict_of("[rank2]: RuntimeError: Application timeout caused pair closure\n")
    assert verdict.failed


def test_a_phase_that_reported_outlasting_the_timeout_is_what_the_barrier_waited_on():
    save = "INFO:torchtune.utils._logging:Saving checkpoint took 965.61 secs\n"
    barrier = "".join(watchdog(r, 28956, numel=1) for r in (4, 5))  # 600 s limit
    verdict = verdict_of(barrier + save)
    assert verdict.culprit == "timeout_too_short"
    assert "preprocessing_outlasted_timeout" in rule_ids(verdict)
    # A phase well inside the limit, or one beside a gradient-sized collective, explains nothing.
    assert "preprocessing_outlasted_timeout" not in rule_ids(
        verdict_of(barrier + "Saving checkpoint took 65 secs\n")
    )
    step = "".join(watchdog(r, 28956, numel=67108864) for r in (4, 5))
    assert "preprocessing_outlasted_timeout" not in rule_ids(verdict_of(step + save))
    # And without an expired wait nothing failed.
    assert not verdict_of(save).failed


def test_a_bootstrap_socket_failure_is_the_network_unless_a_crash_explains_it():
    trace = (
        "node-03:2330:2658 [2] NCCL INFO misc/socket.cc:567 -> 2\n"
        "node-03:2330:2658 [2] NCCL INFO bootstrap.cc:270 -> 2\n"
    )
    verdict = verdict_of(trace)
    assert verdict.culprit == "network_transport"
    assert "nccl_bootstrap_socket_failed" in rule_ids(verdict)
    assert "node-03" in [s.id for s in verdict.suspects if s.kind == "host"]
    # A rank that ran out of memory closes its sockets too: then the crash is the cause.
    oom = "[rank1]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB\n"
    assert "nccl_bootstrap_socket_failed" not in rule_ids(verdict_of(oom + trace))


def test_an_oom_a_trainer_recovered_from_is_no_failure_one_followed_by_a_crash_is_the_cause():
    warning = (
        "2020-11-06 22:55:35 | WARNING | fairseq.trainer | OOM: Ran out of memory with "
        "exception: CUDA out of memory. Tried to allocate 28.00 MiB (GPU 1; 10.92 GiB total "
        "capacity; 10.13 GiB already allocated)\n"
        "2020-11-06 22:55:35 | WARNING | fairseq.trainer | attempting to recover from OOM in "
        "forward/backward pass\n"
    )
    recovered = verdict_of(warning + "2020-11-06 22:56:01 | INFO | train | epoch 002 | loss 4.1\n")
    assert not recovered.failed and recovered.culprit == "unknown"
    crashed = verdict_of(
        warning + 'Traceback (most recent call last):\n  File "train.py", line 9, in <module>\n'
        "Exception: process 1 terminated with exit code 1\n"
    )
    assert crashed.culprit == "oom_or_crash"


def test_past_the_event_bound_the_logs_end_is_kept_and_the_drop_is_said():
    from ingest.parsers.log import MAX_EVENTS

    # A log heavy in communicator start-up lines (each a distinct event) whose end is a GPU that
    # fell off the bus and the timeouts it caused: the end is what names the cause.
    init = "".join(
        f"node-{i % 64:02d}:{1000 + i}:{2000 + i} [0] NCCL INFO comm 0x{i:x} rank {i % 8} nranks 8 "
        f"cudaDev 0 busId 1000 commId 0x{i:x} - Init COMPLETE\n"
        for i in range(MAX_EVENTS + 30_000)
    )
    end = (
        "[1821733.120011] NVRM: Xid (PCI:0000:3b:00): 79, pid=48211, name=python, GPU has "
        "fallen off the bus.\n" + "".join(watchdog(r, 90211) for r in (0, 1, 2))
    )
    parsed = parse_log((init + end).encode(), source="big.log")
    assert parsed.dropped_events > 0
    assert "dropped" in parsed.issues[0].message
    assert parsed.of_kind("gpu_xid") and parsed.of_kind("watchdog_timeout")
    assert classify(parsed.events).culprit == "bad_node_hardware"


def old_watchdog(rank: int, seq: int, numel: int, ran_ms: int) -> str:
    """torch 2.1: no launcher prefix, no process group named, "[Rank N]" the group's rank."""
    return (
        f"[E ProcessGroupNCCL.cpp:475] [Rank {rank}] Watchdog caught collective operation "
        f"timeout: WorkNCCL(SeqNum={seq}, OpType=ALLREDUCE, NumelIn={numel}, NumelOut={numel}, "
        f"Timeout(ms)=180000) ran for {ran_ms} milliseconds before timing out.\n"
    )


def test_a_watchdog_rank_two_processes_print_is_a_group_rank_and_accuses_no_one_by_absence():
    # Tensor-parallel groups of 4 on 16 ranks, every rank's log here: each group's rank 0 says
    # "[Rank 0]". Read as global ranks, "[Rank 0-3]" would make ranks 4-15 silent.
    text = "".join(
        old_watchdog(r, 715431, 8388608, 180100 + 37 * g + r) for g in range(4) for r in range(4)
    )
    verdict = verdict_of(text, IncidentContext(ranks_uploaded=frozenset(range(16))))
    assert not any(m.rule_id == "rank_left_early" for m in verdict.matches)
    assert rank_suspects(verdict) == []


def test_one_process_repeating_its_own_watchdog_line_keeps_its_rank():
    line = old_watchdog(2, 85, 1677721600, 180177)
    # The watchdog's line, then the same text inside "terminated with exception" and what():
    text = (
        line
        + line.replace(
            "Watchdog caught",
            "NCCL watchdog thread terminated with exception: [Rank 2] Watchdog caught",
        )
        + line
    )
    parsed = parse_log(text.encode()).of_kind("watchdog_timeout")
    assert {e.rank_from for e in parsed} == {"watchdog"}
    from analysis.classify.facts import _group_local_numbers

    assert _group_local_numbers(list(parsed)) == set()
    assert _group_local_numbers(
        list(
            parse_log(old_watchdog(2, 85, 8, 180300).encode() + text.encode()).of_kind(
                "watchdog_timeout"
            )
        )
    ) == {2}


def test_a_launcher_prefix_names_the_global_rank_whatever_the_watchdog_says():
    (event,) = parse_log(watchdog(5, 19).encode()).of_kind("watchdog_timeout")
    assert (event.rank, event.rank_from) == (5, "launcher")


NFS_TIMEOUT = (
    "[E ProcessGroupNCCL.cpp:821] [Rank 6] Watchdog caught collective operation timeout: "
    "WorkNCCL(SeqNum=62541, OpType=ALLREDUCE, Timeout(ms)=300000) ran for 300130 milliseconds "
    "before timing out.\n"
)


def nfs(at: str, what: str) -> str:
    return f"[Thu Oct 19 {at} 2023] nfs: server nas02 {what}\n"


def test_an_nfs_stall_that_answered_again_within_the_timeout_is_not_the_wait():
    text = nfs("09:46:58", "not responding, still trying") + nfs("09:47:12", "OK") + NFS_TIMEOUT
    verdict = verdict_of(text)
    assert not any(m.rule_id == "storage_stall" for m in verdict.matches)


def test_an_nfs_stall_longer_than_the_timeout_or_never_over_is_the_storage():
    longer = nfs("09:46:58", "not responding, still trying") + nfs("09:58:12", "OK") + NFS_TIMEOUT
    never = nfs("09:46:58", "not responding, still trying") + NFS_TIMEOUT
    unclocked = (
        "nfs: server nas02 not responding, still trying\nnfs: server nas02 OK\n" + NFS_TIMEOUT
    )
    other = (
        nfs("09:46:58", "not responding, still trying")
        + nfs("09:47:12", "OK").replace("nas02", "nas07")
        + NFS_TIMEOUT
    )
    for text in (longer, never, unclocked, other):
        assert verdict_of(text).culprit == "storage_io", text


OOM_KILL = (
    "[1204233.517467] Out of memory: Killed process 2811043 (pt_main_thread) "
    "total-vm:249516080kB, anon-rss:65676212kB, file-rss:92112kB, shmem-rss:0kB, UID:1004\n"
)


def test_the_oom_killer_ending_a_training_process_is_the_crash():
    # Read since the first parser; until 2026.11.26.4 the rule asked the event for a field it
    # never had, and any log holding the kill failed to classify.
    text = OOM_KILL + "".join(watchdog(r, 19) for r in (1, 2, 3))
    verdict = verdict_of(text)
    assert verdict.culprit == "oom_or_crash"


def test_the_oom_killer_ending_a_process_that_is_not_the_jobs_accuses_nothing():
    text = OOM_KILL.replace("pt_main_thread", "java") + "".join(watchdog(r, 19) for r in (1, 2, 3))
    assert verdict_of(text).culprit != "oom_or_crash"


def test_kernel_lines_of_a_previous_boot_say_nothing_about_this_job():
    xid = "[812088.402125] NVRM: Xid (PCI:0000:c1:00): 79, pid=0, GPU has fallen off the bus.\n"
    boot = (
        "[    0.000000] Linux version 5.15.0-119-generic (buildd@lcy02-amd64-075) (gcc (Ubuntu "
        "11.4.0-1ubuntu1~22.04) 11.4.0, GNU ld (GNU Binutils for Ubuntu) 2.38) #129-Ubuntu SMP\n"
    )
    timeouts = "".join(watchdog(r, 19) for r in (1, 2, 3))
    assert verdict_of(xid + boot + timeouts).culprit != "bad_node_hardware"
    assert verdict_of(boot + xid + timeouts).culprit == "bad_node_hardware"


def test_an_srun_task_id_below_the_rank_the_watchdog_names_is_a_node_not_a_rank():
    # srun --label in front of a node's torchrun: task 3 printing global rank 31's timeout.
    line = (
        "3: [E ProcessGroupNCCL.cpp:475] [Rank 31] Watchdog caught collective operation timeout: "
        "WorkNCCL(SeqNum=102407, OpType=ALLREDUCE, NumelIn=6553600, NumelOut=6553600, "
        "Timeout(ms)=1800000) ran for 1800795 milliseconds before timing out.\n"
    )
    (event,) = parse_log(line.encode()).of_kind("watchdog_timeout")
    assert (event.rank, event.rank_from) == (31, "watchdog")
    # One task per rank: the task id is the rank, and agrees with the watchdog's.
    (same,) = parse_log(line.replace("3: ", "31: ").encode()).of_kind("watchdog_timeout")
    assert (same.rank, same.rank_from) == (31, "launcher")


def test_deepspeeds_launcher_exit_code_is_a_worker_that_died():
    line = (
        "0: [2024-07-16 22:20:56,729] [ERROR] [launch.py:325:sigkill_handler] ['/opt/conda/bin/"
        "python', '-u', 'train.py', '--local_rank=7'] exits with return code = -9\n"
    )
    (event,) = parse_log(line.encode()).of_kind("worker_failed")
    # The command printed is the last one the launcher built: it names no rank.
    assert (event.exitcode, event.signal, event.rank) == (-9, "SIGKILL", None)
    verdict = verdict_of(line + "".join(watchdog(r, 19) for r in (8, 9, 10)))
    assert verdict.culprit == "oom_or_crash"
    assert not any(m.rule_id == "rank_left_early" for m in verdict.matches)


def test_a_worker_that_died_of_a_fault_signal_crashed_on_its_own():
    table = (
        "E1104 12:00:01.000000 140 torch/distributed/elastic/multiprocessing/api.py:869] failed "
        "(exitcode: -11) local_rank: 2 (pid: 4811) of binary: /usr/bin/python3\n"
    )
    verdict = verdict_of(table + "".join(watchdog(r, 19) for r in (0, 1, 3)))
    assert verdict.culprit == "oom_or_crash" and "SIGSEGV" in verdict.summary
    # SIGABRT is the watchdog's own doing after a timeout: no crash.
    aborted = verdict_of(table.replace("-11", "-6") + "".join(watchdog(r, 19) for r in (0, 1, 3)))
    assert aborted.culprit != "oom_or_crash"


def test_a_helper_threads_wait_in_a_crash_dump_is_not_the_rank_waiting_on_data():
    dump = (
        "[rank6]:Fatal Python error: Segmentation fault\n"
        "[rank6]:\n"
        "[rank6]:Thread 0x00007f5c3affd640 (most recent call first):\n"
        '[rank6]:  File "/opt/conda/lib/python3.10/selectors.py", line 416 in select\n'
        '[rank6]:  File "/opt/conda/lib/python3.10/multiprocessing/connection.py", line 931 '
        "in wait\n"
        '[rank6]:  File "/opt/conda/lib/python3.10/site-packages/torch/utils/data/_utils/'
        'pin_memory.py", line 28 in do_one_step\n'
        "[rank6]:\n"
        "[rank6]:Current thread 0x00007f5f9b4b4740 (most recent call first):\n"
        '[rank6]:  File "/work/ops/knn.py", line 40 in forward\n'
    )
    samples = parse_log(dump.encode()).of_kind("stack_sample")
    assert [(s.thread, s.waits_on_data) for s in samples] == [("thread", False), ("current", False)]


def test_a_bootstrap_connect_that_ran_out_of_retries_is_the_bootstrap_failing():
    trace = (
        "ip-172-31-27-91:8814:8914 [2] misc/socket.cc:525 NCCL WARN socketPollConnect: exceeded "
        "timeouts (3)\n"
        "ip-172-31-27-91:8814:8914 [2] NCCL INFO misc/socket.cc:570 -> 6\n"
        "ip-172-31-27-91:8814:8914 [2] NCCL INFO bootstrap.cc:275 -> 6\n"
    )
    (event,) = parse_log(trace.encode()).of_kind("nccl_bootstrap_failed")
    assert event.code == 6
    assert verdict_of(trace).culprit == "network_transport"
    # Another return code (an invalid argument, 4) through the bootstrap is no socket failure.
    assert not parse_log(trace.replace("-> 6", "-> 4").encode()).of_kind("nccl_bootstrap_failed")


def test_an_uploads_declared_rank_outranks_the_watchdogs_group_rank():
    from ingest.parsers.events import event_row

    line = old_watchdog(0, 85, 1677721600, 180177)  # "[Rank 0]" of a tensor-parallel group
    (event,) = parse_log(line.encode()).of_kind("watchdog_timeout")
    row = event_row(event, default_rank=5)  # the agent uploaded it as rank 5's own log
    assert (row["rank"], row["attrs"]["rank_from"]) == (5, "file")
    # A launcher's prefix is the global rank already: the declared rank fills nothing in.
    (prefixed,) = parse_log(watchdog(3, 19).encode()).of_kind("watchdog_timeout")
    assert event_row(prefixed, default_rank=5)["rank"] == 3


STORE_WAIT_FAILED = (
    "RuntimeError: [3] is setting up NCCL communicator and retrieving ncclUniqueId from [0] via "
    "c10d key-value store by key '0', but store->get('0') got error: Socket Timeout\n"
)


def prep_bar(elapsed: str, percent: int = 47) -> str:
    return (
        f"Running tokenizer on dataset:  {percent}%|████▋     | 3169000/6811963 "
        f"[{elapsed}<38:27, 1578.58 examples/s]\n"
    )


def test_a_default_timeout_read_only_where_the_bar_ran_about_that_long():
    # No wait is stated anywhere: the defaults (30 min; 10 min for NCCL from PyTorch 2.2) are
    # what ended it only when the unfinished preparation ran about that long.
    for elapsed in ("29:58", "30:05", "09:59"):
        verdict = verdict_of(prep_bar(elapsed) + STORE_WAIT_FAILED)
        assert verdict.culprit == "timeout_too_short", (elapsed, verdict.summary)
    # Far past a default (or past the 10 minutes by more than a teardown, short of the 30): the
    # job had another timeout, unknown here. Finished: it was not what the others waited for.
    # Without a failed wait: nothing failed that a timeout explains.
    for text in (
        prep_bar("3:00:12") + STORE_WAIT_FAILED,
        prep_bar("20:00") + STORE_WAIT_FAILED,
        prep_bar("30:05", percent=100) + STORE_WAIT_FAILED,
        prep_bar("30:05"),
    ):
        assert verdict_of(text).culprit != "timeout_too_short", text
