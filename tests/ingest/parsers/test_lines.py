"""The streaming line reader: true line numbers, gzip, damaged input, odd bytes."""

import gzip
import io

import pytest

from ingest.parsers import parse_log
from ingest.parsers.lines import _MEMMEM, LineScanner, clean, iter_lines


def scan(data: bytes, triggers=(b"HIT",), **kwargs) -> list[tuple[int, str]]:
    return [(line.number, line.text) for line in LineScanner(io.BytesIO(data), triggers, **kwargs)]


def numbered(data: bytes, trigger: str = "HIT") -> list[tuple[int, str]]:
    lines = data.decode("utf-8", "replace").split("\n")
    return [(i + 1, text.rstrip("\r")) for i, text in enumerate(lines) if trigger in text]


def noisy_log(lines: int = 3000) -> bytes:
    return b"".join(
        (b"HIT %d\n" % i) if i % 97 == 0 else (b"noise line %d with some padding\n" % i)
        for i in range(lines)
    )


@pytest.mark.parametrize("chunk_size", [64, 100, 4096, 1 << 20])
def test_hit_line_numbers_are_true_across_chunk_boundaries(chunk_size):
    data = noisy_log()
    assert scan(data, chunk_size=chunk_size) == numbered(data)


@pytest.mark.parametrize("fast", [True, False])
def test_memmem_and_bytes_find_give_the_same_hits(fast):
    data = noisy_log() + b"tail HIT without newline"
    assert scan(data, fast=fast, chunk_size=256) == numbered(data)


def test_the_libc_search_is_used_when_available():
    # Not a correctness requirement, but the benchmark depends on it on Linux.
    import sys

    assert _MEMMEM is not None or not sys.platform.startswith("linux")


def test_lines_seen_counts_every_line_including_an_unterminated_last_one():
    scanner = LineScanner(io.BytesIO(b"a\nb\nHIT c"), (b"HIT",))
    assert [line.number for line in scanner] == [3]
    assert scanner.lines_seen == 3


def test_follow_yields_the_next_lines_whatever_they_hold_even_across_chunks():
    data = b"x\n" * 30 + b"HIT\n" + b"".join(b"frame %d\n" % i for i in range(5)) + b"y\n"
    scanner = LineScanner(io.BytesIO(data), (b"HIT",), chunk_size=16)
    seen = []
    for line in scanner:
        seen.append((line.number, line.text))
        if line.text == "HIT":
            scanner.follow(3)
    assert seen == [(31, "HIT"), (32, "frame 0"), (33, "frame 1"), (34, "frame 2")]


def test_head_triggers_are_only_looked_for_in_the_head():
    data = b"KEY early\n" + b"pad\n" * 100 + b"KEY late\nHIT late\n"
    found = scan(data, head_triggers=(b"KEY",), head_bytes=64, chunk_size=128)
    assert found == [(1, "KEY early"), (103, "HIT late")]


def test_gzip_input_is_read_transparently():
    data = noisy_log()
    assert scan(gzip.compress(data)) == numbered(data)


def test_a_truncated_gzip_gives_what_came_before_the_cut_and_says_so():
    data = noisy_log(20000)
    packed = gzip.compress(data)
    result = parse_log(packed[: len(packed) // 2])
    assert result.complete is False
    assert any("damaged" in issue.message for issue in result.issues)


def test_crlf_line_ends_are_dropped():
    data = b"noise\r\nHIT one\r\nnoise\r\n"
    assert scan(data) == [(2, "HIT one")]


def test_ansi_colour_codes_are_removed():
    data = b"\x1b[31mHIT\x1b[0m red \x1b[1;32mgreen\x1b[0m\n"
    assert scan(data) == [(1, "HIT red green")]


def test_bare_carriage_returns_of_progress_bars_become_spaces():
    assert clean(b"10%|#\r20%|##\rHIT")[0] == "10%|# 20%|## HIT"


def test_a_huge_line_is_cut_but_keeps_its_head_and_its_tail():
    raw = b"HEAD " + b"x" * 100_000 + b" TAIL"
    text, truncated = clean(raw, max_line=1000)
    assert truncated and text.startswith("HEAD ") and text.endswith(" TAIL")
    assert len(text) < 1100


def test_a_huge_line_does_not_shift_the_numbers_of_the_lines_after_it():
    data = b"a\n" + b"y" * 300_000 + b" HIT big\nb\nHIT after\n"
    assert [n for n, _ in scan(data, chunk_size=4096)] == [2, 4]


def test_invalid_utf8_is_replaced_not_fatal():
    assert scan(b"\xff\xfe HIT \xc3\n") == [(1, "\ufffd\ufffd HIT \ufffd")]


def test_iter_lines_numbers_every_line():
    lines = list(iter_lines(io.BytesIO(b"a\r\nb\n\nc"), chunk_size=2))
    assert [(line.number, line.text) for line in lines] == [(1, "a"), (2, "b"), (3, ""), (4, "c")]
