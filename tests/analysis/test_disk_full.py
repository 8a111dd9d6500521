"""ENOSPC names storage only when the write was to a filesystem: the same errno from /dev/shm is
a DataLoader's or NCCL's shared memory (rule disk_full)."""

# ruff: noqa: E501 - log lines are kept as the software prints them

from analysis.classify import classify
from ingest.parsers import parse_log


def verdict_of(text: str):
    return classify(parse_log(text.encode()).events)


CACHE_FULL = """\
Traceback (most recent call last):
  File "/opt/conda/lib/python3.10/site-packages/datasets/builder.py", line 1894, in _prepare_split_single
    writer.write_table(table)
  File "/opt/conda/lib/python3.10/site-packages/datasets/arrow_writer.py", line 575, in write_table
    self.pa_writer.write_table(pa_table, writer_batch_size)
  File "/opt/conda/lib/python3.10/site-packages/fsspec/implementations/local.py", line 382, in write
    return self.f.write(*args, **kwargs)
OSError: [Errno 28] No space left on device
"""

CHECKPOINT_FULL = """\
[rank0]: Traceback (most recent call last):
[rank0]:   File "/workspace/train.py", line 301, in <module>
[rank0]:     torch.save(state, path)
[rank0]:   File "/usr/local/lib/python3.11/site-packages/torch/serialization.py", line 652, in save
[rank0]:     with _open_zipfile_writer(f) as opened_zipfile:
[rank0]:   File "/usr/local/lib/python3.11/site-packages/torch/serialization.py", line 499, in __exit__
[rank0]:     self.file_like.write_end_of_file()
[rank0]: OSError: [Errno 28] No space left on device
E1104 12:00:01.000000 140 torch/distributed/elastic/multiprocessing/api.py:869] failed (exitcode: 1) local_rank: 0 (pid: 4811) of binary: /usr/bin/python3
"""

SEMAPHORE_IN_SHM = """\
  File "/usr/lib/python3.10/multiprocessing/synchronize.py", line 57, in __init__
    sl = self._semlock = _multiprocessing.SemLock(
OSError: [Errno 28] No space left on device
"""

LOADER_SHM = """\
Traceback (most recent call last):
  File "/usr/lib/python3.10/multiprocessing/queues.py", line 244, in _feed
    obj = _ForkingPickler.dumps(obj)
  File "/usr/local/lib/python3.10/dist-packages/torch/multiprocessing/reductions.py", line 568, in reduce_storage
    fd, size = storage._share_fd_cpu_()
RuntimeError: unable to write to file </torch_2231_1859262307_0>: No space left on device (28)
"""


def test_a_full_cache_disk_is_storage():
    verdict = verdict_of(CACHE_FULL)
    assert verdict.culprit == "storage_io"
    assert "disk_full" in verdict.rule_ids


def test_a_full_checkpoint_volume_outranks_the_crash_it_caused():
    verdict = verdict_of(CHECKPOINT_FULL)
    assert verdict.culprit == "storage_io", verdict.summary


def test_enospc_from_shared_memory_is_not_storage():
    for text in (SEMAPHORE_IN_SHM, LOADER_SHM, CACHE_FULL + LOADER_SHM):
        assert verdict_of(text).culprit != "storage_io"


def test_enospc_without_its_frames_is_not_enough():
    # No traceback: the errno alone could be /dev/shm's as well as a disk's.
    assert verdict_of("OSError: [Errno 28] No space left on device\n").culprit != "storage_io"


def test_torch_saves_writer_refused_by_the_filesystem_is_storage():
    # caffe2/serialize/inline_container.cc: a short write, then the bytes it finds missing.
    verdict = verdict_of(
        "Traceback (most recent call last):\n"
        '  File "/opt/conda/lib/python3.10/site-packages/torch/serialization.py", line 441, in save\n'
        "    _save(obj, opened_zipfile, pickle_module, pickle_protocol)\n"
        "RuntimeError: [enforce fail at inline_container.cc:471] . PytorchStreamWriter failed "
        "writing file data/1: file write failed\n"
    )
    assert verdict.culprit == "storage_io"
    assert "disk_full" in verdict.rule_ids
