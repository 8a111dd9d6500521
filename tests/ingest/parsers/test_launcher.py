"""torchrun / elastic failures, signals, out-of-memory, tracebacks and runtime errors."""

import pytest

from ingest.parsers import parse_log
from ingest.parsers.launcher import signal_name


def events(text: str, kind: str):
    return parse_log(text.encode()).of_kind(kind)


WORKER_FAILED = [
    (
        "2.2+ glog-style prefix",
        "E0321 02:07:26.090000 140204748584768 torch/distributed/elastic/multiprocessing/api.py:"
        "833] failed (exitcode: -6) local_rank: 0 (pid: 48096) of binary: /opt/conda/bin/python",
        {"exitcode": -6, "signal": "SIGABRT", "local_rank": 0, "pid": 48096},
    ),
    (
        "2.0-2.1 bracketed prefix",
        "[2024-02-09 09:09:15,164] torch.distributed.elastic.multiprocessing.api: [ERROR] failed "
        "(exitcode: 1) local_rank: 0 (pid: 170581) of binary: /usr/bin/python3.10",
        {"exitcode": 1, "signal": ""},
    ),
    (
        "1.9-1.13 logging prefix",
        "ERROR:torch.distributed.elastic.multiprocessing.api:failed (exitcode: -9) local_rank: 3 "
        "(pid: 2044) of binary: /usr/bin/python",
        {"exitcode": -9, "signal": "SIGKILL", "local_rank": 3},
    ),
    (
        "a shell reporting a SIGKILLed child",
        "/var/spool/slurmd/job123/slurm_script: line 45: 12345 Killed                  python "
        "train.py",
        {"pid": 12345, "signal": "SIGKILL"},
    ),
    (
        "srun reporting a killed task",
        "srun: error: node12: task 3: Killed",
        {"rank": 3, "signal": "SIGKILL"},
    ),
]


@pytest.mark.parametrize(
    ("what", "line", "expected"), WORKER_FAILED, ids=[w[0] for w in WORKER_FAILED]
)
def test_failed_workers_carry_exit_code_and_signal(what, line, expected):
    (event,) = events(line, "worker_failed")
    for name, value in expected.items():
        assert getattr(event, name) == value, name


@pytest.mark.parametrize(
    ("exitcode", "name"),
    [
        (-9, "SIGKILL"),
        (-6, "SIGABRT"),
        (-11, "SIGSEGV"),
        (-15, "SIGTERM"),
        (137, "SIGKILL"),
        (1, ""),
    ],
)
def test_exit_codes_map_to_signals_both_negative_and_shell_style(exitcode, name):
    assert signal_name(exitcode) == name


def test_agent_closing_signals_are_read():
    line = (
        "[80846] W0321 02:07:20.285000 140204748584768 torch/distributed/elastic/multiprocessing/"
        "api.py:858] Sending process 48099 closing signal SIGTERM"
    )
    (event,) = events(line, "agent_signal")
    assert (event.pid, event.signal) == (48099, "SIGTERM")


CHILD_FAILED = """\
Traceback (most recent call last):
  File "/opt/conda/bin/torchrun", line 8, in <module>
    sys.exit(main())
  File "/opt/conda/lib/python3.10/site-packages/torch/distributed/run.py", line 879, in main
    run(args)
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
============================================================
train.py FAILED
------------------------------------------------------------
Failures:
[1]:
  time      : 2024-03-21_02:07:20
  host      : gpu-node-7
  rank      : 5 (local_rank: 1)
  exitcode  : -15 (pid: 48099)
  error_file: <N/A>
  traceback : Signal 15 (SIGTERM) received by PID 48099
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2024-03-21_02:07:19
  host      : gpu-node-7
  rank      : 4 (local_rank: 0)
  exitcode  : -9 (pid: 48096)
  error_file: <N/A>
  traceback : Signal 9 (SIGKILL) received by PID 48096
============================================================
""".replace("ChildFailedError:\n", "ChildFailedError: \n")  # torchrun leaves a trailing space


def test_the_elastic_failure_table_gives_the_root_cause_rank_host_and_signal():
    records = events(CHILD_FAILED, "failure_record")
    root = [r for r in records if r.root_cause]
    assert len(records) == 2 and len(root) == 1
    (root,) = root
    assert (root.rank, root.local_rank, root.host) == (4, 0, "gpu-node-7")
    assert (root.exitcode, root.pid, root.signal) == (-9, 48096, "SIGKILL")
    other = next(r for r in records if not r.root_cause)
    assert (other.rank, other.signal) == (5, "SIGTERM")


def test_the_child_failed_error_is_also_an_exception_with_its_location():
    (exc,) = events(CHILD_FAILED, "python_exception")
    assert exc.exc_type.endswith("ChildFailedError")
    assert exc.location == "run.py:879 in main"
    assert exc.traceback_line == 1


def test_the_failure_table_pasted_from_its_root_cause_entry_on_is_still_read():
    pasted = CHILD_FAILED[CHILD_FAILED.index("Root Cause") :]
    records = events(pasted, "failure_record")
    assert [(r.rank, r.root_cause, r.signal) for r in records] == [(4, True, "SIGKILL")]


CUT_IN_BARRIER = (
    "Running tokenizer on dataset:  47%|████▋     | 3169000/6811963 "
    "[30:11<38:27, 1578.58 examples/s]Traceback (most recent call last):\n"
    'File "/src/train_sft.py", line 94, in <module>\n'
    "main()\n"
    'File "/envs/site-packages/transformers/training_args.py", line 1891, in main_process_first\n'
    "torch.distributed.barrier()\n"
    'File "/envs/site-packages/torch/distributed/distributed_c10d.py", line 3328, in barrier\n'
    "work = default_pg.barrier(opts=opts)\n"
)


def test_a_traceback_cut_inside_a_collective_call_says_which_call_raised():
    # Pasted flush left, ending before its exception line.
    (cut,) = events(CUT_IN_BARRIER, "traceback_cut")
    assert (cut.call, cut.location) == ("barrier", "distributed_c10d.py:3328 in barrier")
    assert cut.line == 6


def test_a_traceback_cut_elsewhere_or_ending_in_its_exception_is_no_cut_collective():
    elsewhere = CUT_IN_BARRIER.rsplit('File "', 1)[0]
    assert events(elsewhere, "traceback_cut") == []
    finished = CUT_IN_BARRIER + "RuntimeError: Socket Timeout\n"
    assert events(finished, "traceback_cut") == []
    (exc,) = events(finished, "python_exception")
    assert exc.location == "distributed_c10d.py:3328 in barrier"


def test_a_traceback_is_followed_to_its_last_line():
    log = (
        "[rank2]: Traceback (most recent call last):\n"
        '[rank2]:   File "/workspace/train.py", line 120, in save_model\n'
        "[rank2]:     torch.save(state, path)\n"
        "[rank2]: OSError: [Errno 28] No space left on device\n"
    )
    (exc,) = events(log, "python_exception")
    assert (exc.exc_type, exc.rank) == ("OSError", 2)
    assert exc.message == "[Errno 28] No space left on device"
    assert exc.location == "train.py:120 in save_model"


def test_interleaved_tracebacks_of_two_ranks_do_not_mix():
    log = (
        "[rank0]: Traceback (most recent call last):\n"
        "[rank1]: Traceback (most recent call last):\n"
        '[rank0]:   File "a.py", line 1, in f\n'
        '[rank1]:   File "b.py", line 2, in g\n'
        "[rank1]: KeyboardInterrupt\n"
        "[rank0]: ValueError: bad shape\n"
    )
    found = {(e.rank, e.exc_type, e.location) for e in events(log, "python_exception")}
    assert found == {(0, "ValueError", "a.py:1 in f"), (1, "KeyboardInterrupt", "b.py:2 in g")}


OOM = [
    (
        "2.1+ allocator message",
        "[rank2]: torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 336.00 MiB. "
        "GPU 0 has a total capacity of 79.15 GiB of which 141.25 MiB is free.",
        {"gpu": 0, "requested_bytes": 336 << 20, "free_bytes": int(141.25 * (1 << 20))},
    ),
    (
        "1.x-2.0 allocator message",
        "RuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB (GPU 3; 79.15 GiB total "
        "capacity; 75.01 GiB already allocated; 1.20 GiB free; 76.00 GiB reserved in total by "
        "PyTorch)",
        {"gpu": 3, "requested_bytes": 2 << 30, "capacity_bytes": int(79.15 * (1 << 30))},
    ),
]


@pytest.mark.parametrize(("what", "line", "expected"), OOM, ids=[o[0] for o in OOM])
def test_cuda_out_of_memory_gives_the_gpu_and_sizes(what, line, expected):
    (event,) = events(line, "cuda_oom")
    for name, value in expected.items():
        assert getattr(event, name) == value, name


HOST_OOM = [
    (
        "[123.4] Out of memory: Killed process 1234 (python) total-vm:1234kB, anon-rss:99kB",
        (1234, "python", False),
    ),
    (
        "Memory cgroup out of memory: Killed process 4321 (pt_main_thread) total-vm:1kB",
        (4321, "pt_main_thread", True),
    ),
    (
        "Killed process 77 (python3) total-vm:9981kB, anon-rss:8123kB, file-rss:0kB",
        (77, "python3", False),
    ),
]


@pytest.mark.parametrize(("line", "expected"), HOST_OOM)
def test_the_host_oom_killer_names_the_process(line, expected):
    (event,) = events(line, "host_oom_kill")
    assert (event.pid, event.process, event.cgroup) == expected


CUDA_ERRORS = [
    (
        "RuntimeError: CUDA error: an illegal memory access was encountered",
        ("an illegal memory access was encountered", False),
    ),
    (
        "RuntimeError: CUDA error: uncorrectable ECC error encountered",
        ("uncorrectable ecc error encountered", True),
    ),
    (  # PyTorch <= 1.4, THC
        "RuntimeError: cuda runtime error (39) : uncorrectable ECC error encountered at "
        "/pytorch/aten/src/THC/THCCachingHostAllocator.cpp:265",
        ("uncorrectable ecc error encountered", True),
    ),
    (
        "RuntimeError: cuda runtime error (2) : out of memory at /pytorch/aten/src/THC/generic/"
        "THCStorage.cu:58",
        ("out of memory", False),
    ),
]


@pytest.mark.parametrize(("line", "expected"), CUDA_ERRORS)
def test_cuda_runtime_errors_say_whether_the_hardware_is_at_fault(line, expected):
    (event,) = events(line, "cuda_error")
    assert (event.error, event.hardware) == expected


RENDEZVOUS = [
    ("torch.distributed.DistStoreError: Socket Timeout", ("DistStoreError", "Socket Timeout")),
    (
        "torch.distributed.elastic.rendezvous.api.RendezvousTimeoutError: ",
        ("RendezvousTimeoutError", ""),
    ),
]


@pytest.mark.parametrize(("line", "expected"), RENDEZVOUS)
def test_rendezvous_and_store_failures_are_read(line, expected):
    (event,) = events(line, "rendezvous_error")
    assert (event.error_type, event.message) == expected
