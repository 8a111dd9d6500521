"""Trainers' step lines: each rank's step time and data wait, from the formats trainers print."""

from ingest.parsers import parse_log
from ingest.parsers.progress import HEAD_STEPS, TAIL_STEPS


def steps(text: str):
    return [e for e in parse_log(text.encode()).events if e.kind == "trainer_step"]


def test_mmengine_and_detectron2_lines_give_iteration_and_data_time():
    (mm,) = steps(
        "2024/01/02 10:00:00 - mmengine - INFO - Epoch(train) [1][ 50/1000]  lr: 1.0e-02  "
        "eta: 1:00:00  time: 0.5123  data_time: 0.0123  memory: 5000  loss: 1.2\n"
    )
    assert (mm.step_s, mm.data_s) == (0.5123, 0.0123)
    (d2,) = steps(
        "[01/02 10:00:00 d2.utils.events]:  eta: 0:10:00  iter: 19  total_loss: 2.1  "
        "time: 0.3921  data_time: 0.0122  lr: 0.0002  max_mem: 3000M\n"
    )
    assert (d2.step, d2.step_s, d2.data_s) == (19, 0.3921, 0.0122)


def test_plain_step_time_lines_with_units_and_a_rank_tag_after_the_timestamp():
    (e,) = steps(
        "[2026-11-25 08:28:01,274][rank3] epoch 2 | step 31/32 | global_step 94 | loss 0.0051 "
        "| step_time 0.316s | data_time 299ms\n"
    )
    assert (e.rank, e.step, e.step_s, e.data_s) == (3, 94, 0.316, 0.299)


def test_a_longer_iter_time_beside_step_time_is_the_whole_iteration():
    # Compute flat at 2.1 s, the iteration 12.7 s: the rest went outside the step (logging,
    # writes), and that is the rank's own time per step.
    (e,) = steps(
        "2025-02-11 09:32:19,938 INFO [trainer.py:97] [rank 0] step 1930/30000 loss=2.0434 "
        "step_time=2.13s iter_time=12.71s tok/s/gpu=1289 mem=61.0GB\n"
    )
    assert (e.rank, e.step_s) == (0, 12.71)


def test_espnets_iter_time_is_its_wait_on_the_iterator_and_alone_is_no_step_time():
    assert not steps(
        "[0]<stderr>:[host 2021-02-02 03:22:16,448 (trainer:514) INFO: 3epoch:train:99-112batch: "
        "iter_time=8.416e-05, forward_time=0.162, loss=84.699, optim_step_time=0.310, "
        "train_time=5.510\n"
    )


def test_elapsed_per_step_in_milliseconds_is_a_step_time():
    (e,) = steps(
        "[rank0] 2024-11-02 04:22:57,855 INFO step  1930 | loss 2.0416 | grad_norm 0.457 | "
        "elapsed/step  16482.1 ms | tokens/s/gpu 1988 | mem 61.1G\n"
    )
    assert (e.rank, e.step_s) == (0, 16.4821)


def test_megatrons_single_rank_iteration_time_is_not_read():
    # Printed by one rank of the last pipeline stage only: it says nothing of which rank slowed.
    assert not steps(
        " iteration      100/  500000 | consumed samples:        25600 | elapsed time per "
        "iteration (ms): 1234.5 | learning rate: 1.0E-04 |\n"
    )


def test_a_long_run_keeps_each_ranks_first_and_last_steps_only():
    text = "".join(
        f"[rank{r}]: global_step {i} | step_time 0.1s | data_time 0.01s\n"
        for i in range(2000)
        for r in (0, 1)
    )
    kept = steps(text)
    for rank in (0, 1):
        mine = [e.step for e in kept if e.rank == rank]
        assert mine == list(range(HEAD_STEPS)) + list(range(2000 - TAIL_STEPS, 2000))


def test_lines_that_only_mention_time_in_prose_are_not_steps():
    assert steps("Training time: the data_time column is explained in the docs\n") == []


def stacks(text: str):
    return [e for e in parse_log(text.encode()).events if e.kind == "stack_sample"]


def test_a_py_spy_dump_of_a_rank_blocked_in_its_dataloader_waits_on_data():
    (stack,) = stacks(
        'Thread 47731 (idle): "MainThread"\n'
        "    select (selectors.py:415)\n"
        "    wait (multiprocessing/connection.py:931)\n"
        "    get (multiprocessing/queues.py:107)\n"
        "    _try_get_data (torch/utils/data/dataloader.py:1132)\n"
        "    __next__ (torch/utils/data/dataloader.py:634)\n"
        "    training_step (train.py:88)\n"
        'Thread 47790 (idle): "pin_memory"\n'
    )
    assert stack.waits_on_data and stack.frames[0] == "select (selectors.py)"


def test_a_faulthandler_dump_in_a_collective_does_not_wait_on_data():
    (stack,) = stacks(
        "Current thread 0x00007f3a2b4c1740 (most recent call first):\n"
        '  File "/venv/torch/distributed/distributed_c10d.py", line 2050 in all_reduce\n'
        '  File "/home/user/train.py", line 120 in train_step\n'
        '  File "/home/user/train.py", line 200 in <module>\n'
    )
    assert not stack.waits_on_data and len(stack.frames) == 3


def phases(text: str):
    return [e for e in parse_log(text.encode()).events if e.kind == "phase_duration"]


def test_phases_that_report_their_own_length_in_the_shapes_loggers_print():
    found = phases(
        "INFO:torchtune.utils._logging:Saving checkpoint took 965.61 secs\n"
        "[2026-11-25 10:01:02,003] [INFO] [rank0] Tokenization finished in 31.5 minutes\n"
        "2026-11-25 10:05:00 | evaluate | Evaluation completed in 0:31:02.118\n"
        "[rank2]: Loading weights done in 850 ms\n"
    )
    got = {(p.desc, p.elapsed_s, p.rank) for p in found}
    assert got == {
        ("Saving checkpoint", 965.61, None),
        ("Tokenization", 1890.0, None),
        ("Evaluation", 1862.0, None),
        ("Loading weights", 0.85, 2),
    }


def test_a_training_loops_length_is_no_phase_and_a_phase_keeps_its_longest_report():
    assert (
        phases("Epoch 3 took 2100.0 s\nstep 500 took 1.2s\nTraining completed in 3:10:00\n") == []
    )
    (save,) = phases(
        "Saving checkpoint took 12 s\nSaving checkpoint took 700 s\nSaving checkpoint took 30 s\n"
    )
    assert save.elapsed_s == 700.0


def test_the_imagenet_examples_time_and_data_meters_are_a_step_and_its_data_wait():
    (e,) = steps(
        "2021-06-14 21:47:16,101 INFO [rank2] Epoch: [7][1400/2150]\tTime  2.808 ( 0.892)\t"
        "Data  2.265 ( 0.345)\tLoss 1.3588e+00 (1.3447e+00)\tAcc@1  58.33 ( 65.05)\n"
    )
    # The batch's own values, not the running averages in parentheses.
    assert (e.rank, e.step_s, e.data_s) == (2, 2.808, 2.265)
    later = steps(
        "Epoch: [7][1500/2150]\tTime  1.0 ( 1.0)\tData  0.5 ( 0.5)\n"
        "Epoch: [8][   0/2150]\tTime  1.0 ( 1.0)\tData  0.5 ( 0.5)\n"
    )
    assert later[0].step < later[1].step  # ordered by epoch, then batch


def test_pipe_separated_data_and_step_times_with_their_units():
    (e,) = steps(
        "2024-01-17 10:44:20,178 INFO [rank 2] ep 3 it 1150/1562 | loss 0.9325 | "
        "data 528ms | step 1.755s | clips/s 4.6\n"
    )
    assert (e.rank, e.step_s, e.data_s) == (2, 1.755, 0.528)


def test_a_pdsh_host_prefix_is_not_part_of_the_line():
    from ingest.parsers.prefix import split_prefix

    pre = split_prefix("ip-10-0-7-12: [rank12]: RuntimeError: DataLoader worker exited")
    assert (pre.rank, pre.rest) == (12, "RuntimeError: DataLoader worker exited")
    # A logger's "name: message" with no digit in the name is left alone.
    assert split_prefix("INFO: task started").rest == "INFO: task started"


def test_each_py_spy_dump_carries_its_own_process_id():
    """py-spy --subprocesses prints one dump per process; a dump's main-thread stack is that
    process's, even when the next header follows its last frame with no blank line."""
    text = (
        "Process 3834: /usr/bin/python3 -u train.py\n"
        'Thread 3834 (idle): "MainThread"\n'
        "    get (queue.py:180)\n"
        "    _next_data (torch/utils/data/dataloader.py:1465)\n"
        "Process 4104: /usr/bin/python3 -u train.py\n"
        'Thread 4104 (active+gil): "MainThread"\n'
        "    sub (re/__init__.py:185)\n"
        "    __getitem__ (/srv/data/dataset.py:88)\n"
        "    fetch (torch/utils/data/_utils/fetch.py:52)\n"
        "    _worker_loop (torch/utils/data/_utils/worker.py:349)\n"
    )
    samples = [e for e in parse_log(text.encode()).events if e.kind == "stack_sample"]
    assert [(s.pid, s.waits_on_data) for s in samples] == [(3834, True), (4104, False)]
