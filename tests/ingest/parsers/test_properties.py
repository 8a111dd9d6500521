"""Whatever bytes arrive, parse_log returns: a crashing job prints anything."""

import gzip
import io

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from ingest.parsers import parse_log
from ingest.parsers.lines import GZIP_MAGIC, LineScanner
from ingest.parsers.log import default_parsers

# Fragments of real incident lines, so that random input reaches deep into the parsers.
FRAGMENTS = [
    b"[rank3]:[E ProcessGroupNCCL.cpp:607] [PG ID 0 PG GUID 0(default_pg) Rank 3] ",
    b"Watchdog caught collective operation timeout: WorkNCCL(SeqNum=",
    b"OpType=COALESCED, NumelIn=18446744073709551615, Timeout(ms)=600000) ran for ",
    b" milliseconds before timing out.",
    b"last enqueued NCCL work: ",
    b"Stack trace of the failed collective: \n#0 all_reduce from x.py:1\n",
    b"gpu-a:1:2 [0] NCCL INFO comm 0x1 rank 3 nranks 8 cudaDev 3 busId 47000 - Init COMPLETE",
    b"NCCL WARN NET/IB : Got completion from peer 1.2.3.4<5> with error 12, opcode 0",
    b"NCCL INFO Channel 00/0 : 0[0] -> 1[1] via NET/IB/0/GDRDMA",
    b"NVRM: Xid (PCI:0000:3b:00): 79, pid=1, name=python, ",
    b"PCIe Bus Error: severity=Corrected, type=",
    b"Traceback (most recent call last):\n",
    b'  File "a.py", line 1, in f\n',
    b"torch.distributed.elastic.multiprocessing.errors.ChildFailedError: \n",
    b"Root Cause (first observed failure):\n[0]:\n  rank      : 3 (local_rank: 3)\n",
    b"  exitcode  : -9 (pid: 1)\n",
    b"failed (exitcode: -6) local_rank: 0 (pid: 48096) of binary",
    b"torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB",
    b"Out of memory: Killed process 12 (python)",
    b"num_workers: 4",
    b"timeout=timedelta(minutes=",
    b"Running tokenizer on dataset:   9%|## | 1/2 [29:55<",
    b"\r",
    b"\n",
    b"\x1b[31m",
    b"\xff\xfe\xc3",
    "日本語のログ".encode(),
    "ёжик".encode("cp1251"),
]

log_bytes = st.lists(
    st.one_of(st.sampled_from(FRAGMENTS), st.binary(max_size=64)), max_size=60
).map(b"".join)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(log_bytes)
def test_arbitrary_bytes_never_make_parse_log_raise(data):
    result = parse_log(data)
    assert all(issue.message for issue in result.issues)


@settings(max_examples=200, deadline=None)
@given(log_bytes)
def test_no_parser_raises_on_any_line(data):
    # parse_log would catch it, but a parser must not rely on that: exceptions end up as issues.
    result = parse_log(data)
    assert not [i for i in result.issues if "Parser:" in i.message]


@settings(max_examples=50, deadline=None)
@given(log_bytes, st.integers(min_value=1, max_value=200_000))
def test_huge_lines_never_make_parse_log_raise(data, size):
    result = parse_log(data + b"x" * size + data)
    assert result.lines >= 1


@settings(max_examples=100, deadline=None)
@given(log_bytes, st.floats(min_value=0.0, max_value=1.0))
def test_gzip_cut_anywhere_never_raises(data, fraction):
    packed = gzip.compress(data * 3)
    parse_log(packed[: int(len(packed) * fraction)])


@settings(max_examples=100, deadline=None)
@given(log_bytes, st.sampled_from([16, 64, 1000]))
def test_line_numbers_do_not_depend_on_the_chunk_size(data, chunk_size):
    # Bytes that open with gzip's magic are read as a (here damaged) gzip stream, not as lines.
    assume(not data.startswith(GZIP_MAGIC))
    triggers = tuple({t for p in default_parsers() for t in p.triggers})

    def numbers(size):
        return [ln.number for ln in LineScanner(io.BytesIO(data), triggers, chunk_size=size)]

    assert numbers(chunk_size) == numbers(1 << 20)


@settings(max_examples=200, deadline=None)
@given(log_bytes, st.sampled_from([4096, 1 << 20]), st.booleans())
def test_the_scanner_yields_exactly_the_lines_holding_a_trigger(data, chunk_size, fast):
    # Bytes that open with the gzip magic are read as gzip (tested with the gzip cases).
    assume(not data.startswith(GZIP_MAGIC))
    # The oracle is a plain split of the bytes: no chunking, no search library.
    triggers = tuple({t for p in default_parsers() for t in p.triggers})
    raw_lines = data.split(b"\n") if data else []
    if data.endswith(b"\n"):
        raw_lines.pop()
    expected = [n for n, raw in enumerate(raw_lines, 1) if any(t in raw for t in triggers)]
    scanner = LineScanner(io.BytesIO(data), triggers, chunk_size=chunk_size, fast=fast)
    assert [ln.number for ln in scanner] == expected
    assert scanner.lines_seen == len(raw_lines)


@given(st.binary(max_size=512))
def test_looks_binary_counts_control_bytes_as_the_rule_says(sample):
    # The rule, spelt out: NUL anywhere, or more than 5% bytes below space that are not
    # tab, newline, vertical tab, form feed or carriage return.
    from ingest.parsers.detect import looks_binary

    control = sum(1 for b in sample if b < 9 or 13 < b < 32)
    expected = bool(sample) and (0 in sample or control / len(sample) > 0.05)
    assert looks_binary(sample) == expected


# Pieces of the lines the NCCL trigger meets, good and bad: INFO lines skip drops, INFO lines it
# keeps, the near-misses of " INFO" that must still count as another NCCL line.
NCCL_PIECES = [
    b"NCCL",
    b"NCCL INFO",
    b"NCCL INF",
    b"NCCL IN",
    b"NCCL I",
    b"NCCL ",
    b" INFO",
    b"NCCL WARN ",
    b"ProcessGroupNCCL.cpp:1",
    b"AllReduce: opCount 3 sendbuff 0x7f count 1 datatype 7 [nranks=8]",
    b"Channel 00/0 : 0[0] -> 1[1]",
    b" via ",
    b"P2P/IPC",
    b"NET/IB/0",
    b"Using network IB",
    b"Init COMPLETE",
    b"NCCL version 2.21.5",
    b"rror",
    b"failed",
    b"h:1:2 [0] ",
    b"\r",
    b"\n",
    b" ",
]
nccl_bytes = st.lists(st.sampled_from(NCCL_PIECES), max_size=40).map(b"".join)


@settings(max_examples=300, deadline=None)
@given(nccl_bytes, st.sampled_from([64, 1 << 20]))
def test_trigger_shapes_drop_only_lines_that_skip_would_drop(data, chunk_size):
    # The pattern scanner reads the NCCL trigger as the shapes skip_raw may keep; the plain
    # scanner reads it as a literal. After skip, both must hand the parsers the same lines.
    from ingest.parsers.lines import _HYPERSCAN
    from ingest.parsers.nccl import TRIGGER_SHAPES, NcclParser

    if _HYPERSCAN is None:
        pytest.skip("no Hyperscan on this machine: shapes are not used")

    def kept(fast: bool) -> list[tuple[int, str]]:
        parser = NcclParser()
        scanner = LineScanner(
            io.BytesIO(data),
            (b"NCCL",),
            chunk_size=chunk_size,
            fast=fast,
            skip=parser.skip_raw,
            shapes=TRIGGER_SHAPES,
        )
        return [(ln.number, ln.text) for ln in scanner]

    assert kept(True) == kept(False)
