"""Follow log files like ``tail -F``, across rotation and truncation, in whole lines.

A followed file is known by (device, inode) and a hash of its first bytes. Each poll:

- another inode at the path: the file was rotated (``mv`` + reopen). The old file is read to
  its end through the descriptor we still hold, then the new one is followed from 0;
- the same inode but smaller than our offset: truncated in place (``copytruncate``): from 0;
- the same inode but other first bytes: rewritten in place: from 0.

Only whole lines are shipped (a line cut between two uploads would be two broken lines), in
chunks of at most ``chunk_bytes``, when that much is waiting or ``flush_s`` has passed since
the oldest unshipped byte appeared. A line longer than a chunk is shipped cut.
"""

from __future__ import annotations

import glob
import hashlib
import os
from dataclasses import dataclass, field

HEAD_BYTES = 64
MAX_FOLLOWED = 512


@dataclass(frozen=True)
class Chunk:
    path: str
    dev: int
    ino: int
    start: int
    end: int
    body: bytes


@dataclass
class Followed:
    path: str
    dev: int
    ino: int
    offset: int = 0
    head: str = ""
    waiting_since: float | None = None
    fd: int | None = field(default=None, repr=False)

    def key(self) -> list:
        return [self.dev, self.ino, self.offset, self.head]


def _head_hash(fd: int, length: int) -> str:
    """``<n>:<hash>`` of the first n bytes already read (n <= HEAD_BYTES): a file that only grew
    keeps its head; one rewritten in place does not."""
    head = os.pread(fd, min(length, HEAD_BYTES), 0)
    return f"{len(head)}:{hashlib.sha1(head, usedforsecurity=False).hexdigest()[:12]}"


def _same_head(fd: int, head: str) -> bool:
    length = int(head.split(":", 1)[0]) if ":" in head else 0
    return _head_hash(fd, length) == head


class Follower:
    def __init__(
        self,
        patterns: tuple[str, ...] | list[str],
        *,
        chunk_bytes: int = 4 << 20,
        flush_s: float = 10.0,
        offsets: dict | None = None,
    ) -> None:
        self.patterns = tuple(patterns)
        self.chunk_bytes = chunk_bytes
        self.flush_s = flush_s
        self.files: dict[str, Followed] = {}
        # path -> [dev, ino, offset, head] from a previous run of the agent
        self.resume = dict(offsets or {})

    def offsets(self) -> dict:
        return {path: f.key() for path, f in self.files.items()}

    def paths(self) -> list[str]:
        found: list[str] = []
        for pattern in self.patterns:
            matches = glob.glob(pattern) if glob.has_magic(pattern) else [pattern]
            found.extend(p for p in matches if os.path.isfile(p))
        return sorted(set(found))[:MAX_FOLLOWED]

    def poll(self, now: float, *, final: bool = False) -> list[Chunk]:
        """New whole lines of every followed file. ``final`` ships what waits, now."""
        chunks: list[Chunk] = []
        present = set(self.paths())
        for path in sorted(present | set(self.files)):
            chunks.extend(self._poll_one(path, now, final or path not in present))
        return chunks

    def rewind(self, chunk: Chunk) -> None:
        """Read ``chunk`` again on the next poll (it could not be attributed yet)."""
        followed = self.files.get(chunk.path)
        if followed is not None and (followed.dev, followed.ino) == (chunk.dev, chunk.ino):
            followed.offset = min(followed.offset, chunk.start)
            followed.waiting_since = None

    def close(self) -> None:
        for followed in self.files.values():
            if followed.fd is not None:
                os.close(followed.fd)
                followed.fd = None

    def _open(self, path: str) -> Followed | None:
        try:
            fd = os.open(path, os.O_RDONLY)
        except OSError:
            return None
        st = os.fstat(fd)
        followed = Followed(path, st.st_dev, st.st_ino, 0, _head_hash(fd, 0), fd=fd)
        before = self.resume.pop(path, None)
        if (
            before
            and list(before[:2]) == [st.st_dev, st.st_ino]
            and int(before[2]) <= st.st_size
            and _same_head(fd, str(before[3]))
        ):
            followed.offset, followed.head = int(before[2]), str(before[3])
        return followed

    def _poll_one(self, path: str, now: float, final: bool) -> list[Chunk]:
        followed = self.files.get(path)
        out: list[Chunk] = []
        try:
            st = os.stat(path)
        except OSError:
            st = None
        if followed is None:
            if st is None:
                return out
            followed = self._open(path)
            if followed is None:
                return out
            self.files[path] = followed
        elif st is None or (st.st_dev, st.st_ino) != (followed.dev, followed.ino):
            # Rotated or removed: what was written to the old file before the switch is still
            # readable through our descriptor.
            out.extend(self._read(followed, now, final=True))
            if followed.fd is not None:
                os.close(followed.fd)
            del self.files[path]
            return out + (self._poll_one(path, now, final) if st is not None else [])
        else:
            if st.st_size < followed.offset or not _same_head(followed.fd, followed.head):
                followed.offset, followed.waiting_since = 0, None
                followed.head = _head_hash(followed.fd, 0)
        out.extend(self._read(followed, now, final=final))
        return out

    def _read(self, followed: Followed, now: float, *, final: bool) -> list[Chunk]:
        if followed.fd is None:
            return []
        out = []
        while True:
            size = os.fstat(followed.fd).st_size
            waiting = size - followed.offset
            if waiting <= 0:
                followed.waiting_since = None
                return out
            if followed.waiting_since is None:
                followed.waiting_since = now
            due = final or now - followed.waiting_since >= self.flush_s
            if waiting < self.chunk_bytes and not due:
                return out
            body = os.pread(followed.fd, min(waiting, self.chunk_bytes), followed.offset)
            full = len(body) >= self.chunk_bytes
            cut = body.rfind(b"\n") + 1
            if cut == 0:
                if len(body) < self.chunk_bytes and not final:
                    return out  # a line still being written
                cut = len(body)
            elif not final or len(body) < waiting:
                body = body[:cut]
            else:
                cut = len(body)
            body = body[:cut]
            start = followed.offset
            followed.offset += cut
            if int(followed.head.split(":", 1)[0]) < HEAD_BYTES:
                followed.head = _head_hash(followed.fd, followed.offset)
            followed.waiting_since = now if followed.offset < size else None
            out.append(Chunk(followed.path, followed.dev, followed.ino, start, start + cut, body))
            if not full and not final:
                return out
