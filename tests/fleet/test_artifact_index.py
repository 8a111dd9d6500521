"""The artifact page seeks near a line through the parse's line index (one entry per 4 MiB block
scanned) instead of reading every line before it, and shows exactly what a full read shows."""

import gzip
import io

import pytest
from django.core.files.base import ContentFile

from analysis.selectors import artifact_window
from ingest.models import Upload
from ingest.parsers import parse_log


def log_bytes(lines: int) -> bytes:
    # Lines of varying length, some long, so blocks end inside lines.
    out = io.BytesIO()
    for n in range(1, lines + 1):
        out.write(f"line {n} ".encode() + b"." * (n % 97) + (b"#" * 3000 if n % 5000 == 0 else b""))
        out.write(b"\n")
    return out.getvalue()


RAW = log_bytes(120_000)  # about 10 MiB: three blocks


@pytest.fixture
def local_blobs(tmp_path, settings):
    """Blobs in a directory of this test's own."""
    settings.STORAGES = {
        **settings.STORAGES,
        "default": {
            "BACKEND": "django.core.files.storage.FileSystemStorage",
            "OPTIONS": {"location": tmp_path},
        },
    }


def test_each_index_entry_is_where_its_line_starts():
    index = parse_log(RAW).line_index
    assert len(index) >= 2
    for line, offset in index:
        assert RAW[offset - 1 : offset] == b"\n"
        assert RAW.count(b"\n", 0, offset) == line - 1


def test_the_index_is_in_the_decompressed_streams_coordinates():
    assert parse_log(gzip.compress(RAW, 1)).line_index == parse_log(RAW).line_index


@pytest.mark.parametrize("packed", [False, True], ids=["plain", "gzip"])
def test_a_window_read_through_the_index_is_the_window_read_from_the_start(local_blobs, packed):
    body = gzip.compress(RAW, 1) if packed else RAW
    indexed = Upload(line_index=[list(e) for e in parse_log(body).line_index])
    indexed.blob.save("t.log", ContentFile(body), save=False)
    scanned = Upload(line_index=[], blob=indexed.blob.name)
    for line in (1, 41, 45_000, 45_001, 60_000, 100_000, 119_990, 200_000):
        fast, slow = artifact_window(indexed, line), artifact_window(scanned, line)
        assert fast == slow, line
    assert artifact_window(indexed, 100_001).lines[40][:2] == (
        100_001,
        "line 100001 " + "." * (100_001 % 97),
    )


class _Counting(io.RawIOBase):
    """A file that counts the bytes handed to its reader."""

    def __init__(self, inner, counter: list[int]):
        self.inner, self.counter = inner, counter

    def readable(self):
        return True

    def seekable(self):
        return True

    def seek(self, offset, whence=0):
        return self.inner.seek(offset, whence)

    def tell(self):
        return self.inner.tell()

    def readinto(self, buffer):
        data = self.inner.read(len(buffer))
        buffer[: len(data)] = data
        self.counter[0] += len(data)
        return len(data)

    def close(self):
        self.inner.close()
        super().close()


def test_a_window_near_the_end_reads_from_the_last_indexed_block_not_the_whole_file(
    local_blobs, monkeypatch
):
    from django.core.files import File
    from django.core.files.storage import FileSystemStorage

    indexed = Upload(line_index=[list(e) for e in parse_log(RAW).line_index])
    indexed.blob.save("t.log", ContentFile(RAW), save=False)
    scanned = Upload(line_index=[], blob=indexed.blob.name)
    read = [0]
    opened = FileSystemStorage._open
    monkeypatch.setattr(
        FileSystemStorage,
        "_open",
        lambda self, name, mode="rb": File(
            io.BufferedReader(_Counting(opened(self, name, mode), read))
        ),
    )
    artifact_window(scanned, 119_990)
    whole, read[0] = read[0], 0
    artifact_window(indexed, 119_990)
    assert whole >= len(RAW) * 0.9
    assert read[0] < len(RAW) / 2
