"""Two requests with the same bytes race to store one content-addressed blob: both pass the
``exists`` check, the first links its file into place, the second finds the name taken. The
second must reuse that blob, not store a copy under another name (which its losing row would
never point at: an orphan per race)."""

from django.core.files.base import ContentFile

from ingest.storage import PARTIAL_PREFIX, ArtifactFileSystemStorage


def test_the_loser_of_a_race_for_the_same_bytes_reuses_the_winners_blob(tmp_path):
    storage = ArtifactFileSystemStorage(location=tmp_path)
    name = "uploads/ab/abcdef.gz"
    # What each request does after its own exists() said no: _save straight to the name.
    first = storage._save(name, ContentFile(b"rank 3 log\n" * 100))
    second = storage._save(name, ContentFile(b"rank 3 log\n" * 100))
    assert first == second == name
    assert sorted(p.name for p in (tmp_path / "uploads" / "ab").iterdir()) == ["abcdef.gz"]


def test_other_bytes_under_a_taken_name_never_replace_the_blob(tmp_path):
    storage = ArtifactFileSystemStorage(location=tmp_path)
    name = "uploads/ab/abcdef.gz"
    storage._save(name, ContentFile(b"the first bytes"))
    other = storage._save(name, ContentFile(b"other bytes"))
    assert other != name
    assert (tmp_path / name).read_bytes() == b"the first bytes"
    assert (tmp_path / other).read_bytes() == b"other bytes"
    leftovers = [
        p for p in (tmp_path / "uploads" / "ab").iterdir() if p.name.startswith(PARTIAL_PREFIX)
    ]
    assert leftovers == []
