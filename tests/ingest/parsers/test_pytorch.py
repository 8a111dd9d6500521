"""ProcessGroupNCCL lines of every PyTorch era, as the real software prints them."""

import pytest

from ingest.parsers import parse_log


def events(text: str, kind: str):
    return parse_log(text.encode()).of_kind(kind)


WATCHDOG = [
    # (era, line, expected attributes)
    (
        "1.8: no SeqNum",
        "[E ProcessGroupNCCL.cpp:566] [Rank 1] Watchdog caught collective operation timeout: "
        "WorkNCCL(OpType=BROADCAST, Timeout(ms)=1800000) ran for 1800461 milliseconds before "
        "timing out.",
        {"rank": 1, "seq": None, "op": "BROADCAST", "timeout_ms": 1800000, "ran_for_ms": 1800461},
    ),
    (
        "1.11: TensorShape",
        "[E ProcessGroupNCCL.cpp:737] [Rank 3] Watchdog caught collective operation timeout: "
        "WorkNCCL(SeqNum=60, OpType=ALLREDUCE, TensorShape=[1, 2], Timeout(ms)=1800000) ran for "
        "1806123 milliseconds before timing out.",
        {"rank": 3, "seq": 60, "op": "ALLREDUCE", "numel_in": None, "timeout_ms": 1800000},
    ),
    (
        "2.1: NumelIn/NumelOut",
        "[E ProcessGroupNCCL.cpp:475] [Rank 2] Watchdog caught collective operation timeout: "
        "WorkNCCL(SeqNum=2, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=1800000) ran "
        "for 1800328 milliseconds before timing out.",
        {"rank": 2, "seq": 2, "numel_in": 1, "numel_out": 1, "ran_for_ms": 1800328},
    ),
    (
        "2.4: [rankN]: prefix and glog timestamp",
        "[rank0]:[E923 14:05:28.953176853 ProcessGroupNCCL.cpp:607] [Rank 0] Watchdog caught "
        "collective operation timeout: WorkNCCL(SeqNum=0, OpType=SEND, NumelIn=7208960, "
        "NumelOut=7208960, Timeout(ms)=600000) ran for 600003 milliseconds before timing out.",
        {"rank": 0, "seq": 0, "op": "SEND", "numel_in": 7208960},
    ),
    (
        "2.5+: PG ID/GUID tag",
        "[rank1]:[E1105 10:48:14.617000 ProcessGroupNCCL.cpp:616] [PG ID 0 PG GUID "
        "0(default_pg) Rank 1] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=5, "
        "OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=1000) ran for 1005 milliseconds "
        "before timing out.",
        {"rank": 1, "pg": "default_pg", "pg_rank": 1, "seq": 5, "timeout_ms": 1000},
    ),
    (
        "2.2-2.3: PG tag with name inside an exception",
        "[rank5]:[E117 08:28:16.358824199 ProcessGroupNCCL.cpp:1534] [PG 0 (default_pg) Rank 5] "
        "Process group watchdog thread terminated with exception: [Rank 5] Watchdog caught "
        "collective operation timeout: WorkNCCL(SeqNum=67, OpType=ALLREDUCE, NumelIn=1, "
        "NumelOut=1, Timeout(ms)=600000) ran for 600042 milliseconds before timing out.",
        {"rank": 5, "pg": "default_pg", "seq": 67},
    ),
    (
        "COALESCED prints NumelIn=-1 as an unsigned 64-bit number",
        "[rank3]:[E923 14:05:28.992395601 ProcessGroupNCCL.cpp:607] [Rank 3] Watchdog caught "
        "collective operation timeout: WorkNCCL(SeqNum=29, OpType=COALESCED, "
        "NumelIn=18446744073709551615, NumelOut=18446744073709551615, Timeout(ms)=600000) ran "
        "for 600009 milliseconds before timing out.",
        {"rank": 3, "op": "COALESCED", "numel_in": -1, "numel_out": -1},
    ),
    (
        "1.8-1.9 blocking wait: raised from WorkNCCL::wait, no 'Watchdog'",
        "RuntimeError: [Rank 0] Caught collective operation timeout: WorkNCCL(OpType=ALLGATHER, "
        "TensorShape=[2500, 1024], Timeout(ms)=1800000) ran for 1801683 milliseconds before "
        "timing out.",
        {"op": "ALLGATHER", "timeout_ms": 1800000, "ran_for_ms": 1801683},
    ),
    (
        "a tqdm bar glued in front of an inline [rank0]: prefix",
        " 33%|███▎      | 1/3 [00:02<00:04,  2.19s/it][rank0]:[E923 14:05:28.953176853 "
        "ProcessGroupNCCL.cpp:607] [Rank 0] Watchdog caught collective operation timeout: "
        "WorkNCCL(SeqNum=0, OpType=SEND, NumelIn=7208960, NumelOut=7208960, Timeout(ms)=600000) "
        "ran for 600003 milliseconds before timing out.",
        {"rank": 0, "op": "SEND"},
    ),
]


@pytest.mark.parametrize(("era", "line", "expected"), WATCHDOG, ids=[w[0] for w in WATCHDOG])
def test_watchdog_timeouts_of_every_era_are_read(era, line, expected):
    (event,) = events(line, "watchdog_timeout")
    for name, value in expected.items():
        assert getattr(event, name) == value, name


PROGRESS = [
    (
        "2.2-2.3",
        "[rank2]:[E ProcessGroupNCCL.cpp:1537] [PG 0 Rank 2] Timeout at NCCL work: 19, last "
        "enqueued NCCL work: 19, last completed NCCL work: 18.",
        {"rank": 2, "pg": "0", "failed_seq": 19, "last_enqueued": 19, "last_completed": 18},
    ),
    (
        "2.4",
        "[rank3]:[E321 02:07:08.465224069 ProcessGroupNCCL.cpp:1664] [PG 1 Rank 3] Exception "
        "(either an error or timeout) detected by watchdog at work: 1580, last enqueued NCCL "
        "work: 1582, last completed NCCL work: 1579.",
        {"rank": 3, "pg": "1", "failed_seq": 1580, "last_enqueued": 1582, "last_completed": 1579},
    ),
    (
        "2.5+",
        "[rank0]:[E1105 10:48:14.618000 ProcessGroupNCCL.cpp:1834] [PG ID 0 PG GUID "
        "0(default_pg) Rank 0] failure detected by watchdog at work sequence id: 5 PG status: "
        "last enqueued work: 5, last completed work: 4",
        {"rank": 0, "pg": "default_pg", "failed_seq": 5, "last_completed": 4},
    ),
]


@pytest.mark.parametrize(("era", "line", "expected"), PROGRESS, ids=[p[0] for p in PROGRESS])
def test_progress_lines_of_every_era_give_the_last_completed_work(era, line, expected):
    (event,) = events(line, "work_progress")
    for name, value in expected.items():
        assert getattr(event, name) == value, name


def test_sub_group_pg_rank_is_not_taken_for_the_global_rank():
    line = (
        "[E ProcessGroupNCCL.cpp:1537] [PG 37 Rank 0] Timeout at NCCL work: 1, last enqueued "
        "NCCL work: 1, last completed NCCL work: 0."
    )
    (event,) = events(line, "work_progress")
    assert event.pg == "37" and event.pg_rank == 0 and event.rank is None


def test_dump_signals_say_which_rank_asked():
    log = (
        "[rank1]:[E1105 10:48:15.1 ProcessGroupNCCL.cpp:1595] [PG ID 0 PG GUID 0(default_pg) "
        "Rank 1] Received a dump signal due to a collective timeout from  rank 0 and we will try "
        "our best to dump the debug info. Last enqueued NCCL work: 5, last completed NCCL work: "
        "5.This is most likely caused by incorrect usages of collectives.\n"
        "[rank0]:[E1105 10:48:15.1 ProcessGroupNCCL.cpp:1595] [PG ID 0 PG GUID 0(default_pg) "
        "Rank 0] Received a dump signal due to a collective timeout from this local rank and we "
        "will try our best to dump the debug info. Last enqueued NCCL work: 5, last completed "
        "NCCL work: 4.\n"
        "[rank2]:[E1105 10:48:15.2 ProcessGroupNCCL.cpp:1640] [PG ID 0 PG GUID 0(default_pg) "
        "Rank 2] Observed flight recorder dump signal from another rank via TCPStore.\n"
    )
    first, second, third = events(log, "dump_signal")
    assert (first.rank, first.from_rank, first.last_completed) == (1, 0, 5)
    assert (second.rank, second.from_rank, second.last_completed) == (0, None, 4)
    assert third.via_store and third.rank == 2


def test_heartbeat_monitor_timeouts_are_read():
    line = (
        "[rank2]:[E ProcessGroupNCCL.cpp:1357] [PG 0 Rank 2] Heartbeat monitor timed out! "
        "Process will be terminated after dumping debug info. workMetaList_.size()=1"
    )
    (event,) = events(line, "heartbeat_timeout")
    assert event.rank == 2


def test_stack_of_the_failed_collective_collects_its_frames():
    log = (
        "[rank0]:[E1105 10:48:14.6 ProcessGroupNCCL.cpp:1683] [PG ID 0 PG GUID 0(default_pg) "
        "Rank 0] Stack trace of the failed collective: \n"
        "[rank0]:#0 all_reduce from /usr/lib/python3/dist-packages/torch/distributed/"
        "distributed_c10d.py:2501\n"
        "[rank0]:#1 wrapper from /usr/lib/python3/dist-packages/torch/distributed/"
        "c10d_logger.py:83\n"
        "[rank0]:#2 train_step from /workspace/train.py:120\n"
        "step 12 loss 0.3\n"
    )
    (event,) = events(log, "collective_stack")
    assert event.rank == 0
    assert event.frames[-1] == "train_step from /workspace/train.py:120"
    assert len(event.frames) == 3


def test_desync_report_lines_below_the_watchdog_line_are_followed():
    log = (
        "[E ProcessGroupNCCL.cpp:456] [Rank 0] Watchdog caught collective operation timeout: "
        "WorkNCCL(SeqNum=7, OpType=ALLREDUCE, NumelIn=4, NumelOut=4, Timeout(ms)=5000) ran for "
        "5004 milliseconds before timing out.\n"
        "\t - To our best knowledge, ranks [1, 3] are the lagging ranks that caused this "
        "timeout. They never joined any collectives\n"
    )
    (event,) = events(log, "desync_report")
    assert event.never_joined == (1, 3)


def test_desync_report_under_a_rank_header_line_is_followed():
    log = (
        "[E1105 10:48:14.6 ProcessGroupNCCL.cpp:1421] Rank 0\n"
        " - To our best knowledge, the lagging/dead/mismatched ranks that caused the desync are:"
        "\n   - [47] joined but didn't finish collective #41207 (count from 1)\n"
    )
    (event,) = events(log, "desync_report")
    assert event.not_finished == (47,) and event.seq == 41207


MISMATCH = [
    (
        "1.10-1.13: no sequence number",
        "RuntimeError: Detected mismatch between collectives on ranks. Rank 0 is running "
        "inconsistent collective: CollectiveFingerPrint(OpType=ALLREDUCE, TensorShape=[10], "
        "TensorDtypes=Float), but Rank 1 is running inconsistent collective: "
        "CollectiveFingerPrint(OpType=BROADCAST, TensorShape=[1], TensorDtypes=Long)",
        {"seq": None, "rank_a": 0, "op_a": "ALLREDUCE", "rank_b": 1, "op_b": "BROADCAST"},
    ),
    (
        "2.x: SequenceNumber",
        "RuntimeError: Detected mismatch between collectives on ranks. Rank 1 is running "
        "collective: CollectiveFingerPrint(SequenceNumber=485, OpType=ALLREDUCE, "
        "TensorShape=[25], TensorDtypes=Float), but Rank 0 is running collective: "
        "CollectiveFingerPrint(SequenceNumber=485, OpType=BROADCAST, TensorShape=[1], "
        "TensorDtypes=Long)",
        {"seq": 485, "shape_a": "[25]", "shape_b": "[1]"},
    ),
]


@pytest.mark.parametrize(("era", "line", "expected"), MISMATCH, ids=[m[0] for m in MISMATCH])
def test_collective_mismatches_name_both_ranks(era, line, expected):
    (event,) = events(line, "collective_mismatch")
    for name, value in expected.items():
        assert getattr(event, name) == value, name


def test_a_watchdog_line_wrapped_over_three_lines_is_one_timeout():
    text = (
        "[rank1]:[E ... ProcessGroupNCCL.cpp:689] [Rank 1] Watchdog caught collective operation "
        "timeout:\nWorkNCCL(SeqNum=34036, OpType=ALLGATHER, NumelIn=8, NumelOut=64, "
        "Timeout(ms)=5400000)\nran for 5400073 milliseconds before timing out.\n"
    )
    (timeout,) = [e for e in parse_log(text.encode()).events if e.kind == "watchdog_timeout"]
    assert (timeout.rank, timeout.seq, timeout.op, timeout.timeout_ms) == (
        1,
        34036,
        "ALLGATHER",
        5400000,
    )


def test_a_cut_watchdog_line_does_not_swallow_the_next_timeout():
    text = (
        "[Rank 11] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=52, OpType=ALLRE\n"
        "[E ProcessGroupNCCL.cpp:737] [Rank 3] Watchdog caught collective operation timeout: "
        "WorkNCCL(SeqNum=56693, OpType=BROADCAST, Timeout(ms)=1800000) ran for 1804371 "
        "milliseconds before timing out.\n"
    )
    timeouts = [e for e in parse_log(text.encode()).events if e.kind == "watchdog_timeout"]
    assert [(t.rank, t.seq) for t in timeouts] == [(3, 56693)]


def test_a_c10d_store_wait_that_expired_is_read_with_its_limit():
    (event,) = events(
        "Tokenizing Prompts (num_proc=64):  92%|█████████▏| 328986/359152 [29:58<12:05, 41.59 "
        "examples/s][rank1]:[W516 14:34:56.854597329 socket.cpp:489] [c10d] waitForInput: socket "
        "SocketImpl(fd=79, addr=[localhost]:41170, remote=[localhost]:29500) timed out after "
        "1800000ms",
        "store_timeout",
    )
    assert (event.rank, event.timeout_ms) == (1, 1800000)


def test_the_poll_warning_before_the_store_timeout_is_not_a_second_one():
    assert not events(
        "[rank1]:[W516 14:34:56.853490829 socket.cpp:464] [c10d] waitForInput: poll for socket "
        "SocketImpl(fd=79) returned 0, likely a timeout",
        "store_timeout",
    )
