"""A bounded, durable on-disk spool: everything the agent sends is written here first.

One item is one file: a JSON header line (where it goes: endpoint, host, job, attempt, rank,
kind, filename) followed by the body bytes, exactly as they will be uploaded. Items are written
to a temporary name, fsynced and renamed into place, then the directory is fsynced: after a
crash (kill -9, power loss) an item is either whole or absent, never half. Uploaded items are
unlinked only after the server answered 202; an item re-sent after a crash between the answer
and the unlink is a duplicate the server recognises (same bytes, same host and job: same id).

The spool is bounded in bytes and in items. When a new item does not fit, the oldest items are
dropped first and counted in ``state.json``, so the server can be told how much evidence was
lost. Names sort by creation time, so the oldest is the first name.

Other processes (the torch integration) write items with ``Spool.put`` too; they never drop or
delete, only the agent does (``enforce_bounds``).
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

ITEM_SUFFIX = ".item"
TMP_PREFIX = ".tmp-"
STATE_FILE = "state.json"
# A temporary file older than this belongs to a writer that died mid-write.
STALE_TMP_S = 300.0


@dataclass(frozen=True)
class Item:
    path: Path
    header: dict
    size: int  # bytes on disk, header included

    @property
    def name(self) -> str:
        return self.path.name

    def body(self) -> bytes:
        with self.path.open("rb") as stream:
            stream.readline()
            return stream.read()


@dataclass
class SpoolState:
    dropped_items: int = 0
    dropped_bytes: int = 0
    extra: dict = field(default_factory=dict)


def fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomic(path: Path, payload: bytes, *, durable: bool = True) -> None:
    """Write ``payload`` to ``path`` so that readers see the old file or the new one, whole."""
    tmp = path.with_name(f"{TMP_PREFIX}{path.name}.{os.getpid()}.{secrets.token_hex(4)}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o640)
    try:
        view = memoryview(payload)
        while view:
            written = os.write(fd, view)
            view = view[written:]
        if durable:
            os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    if durable:
        fsync_dir(path.parent)


class Spool:
    def __init__(
        self, root: str | Path, *, max_bytes: int = 256 << 20, max_items: int = 10_000
    ) -> None:
        self.root = Path(root)
        self.max_bytes = max_bytes
        self.max_items = max_items
        self.root.mkdir(parents=True, exist_ok=True)

    # --- writing -----------------------------------------------------------------------------

    def put(self, header: dict, body: bytes, *, durable: bool = True) -> Path:
        """Store one item; returns its path. The header must be JSON-serialisable."""
        line = json.dumps(header, separators=(",", ":"), sort_keys=True).encode()
        if b"\n" in line:
            raise ValueError("spool header must serialise to one line")
        # time_ns orders items by age; the random tail keeps writers in several processes apart.
        name = f"{time.time_ns():020d}-{os.getpid()}-{secrets.token_hex(3)}{ITEM_SUFFIX}"
        path = self.root / name
        write_atomic(path, line + b"\n" + body, durable=durable)
        return path

    # --- reading -----------------------------------------------------------------------------

    def names(self) -> list[str]:
        try:
            return sorted(n for n in os.listdir(self.root) if n.endswith(ITEM_SUFFIX))
        except FileNotFoundError:
            return []

    def items(self) -> Iterator[Item]:
        """Items oldest first. An unreadable item (damaged by hand) is removed and counted."""
        for name in self.names():
            item = self.read(name)
            if item is not None:
                yield item

    def read(self, name: str) -> Item | None:
        path = self.root / name
        try:
            with path.open("rb") as stream:
                first = stream.readline(1 << 16)
                size = os.fstat(stream.fileno()).st_size
        except FileNotFoundError:
            return None
        try:
            header = json.loads(first)
            if not isinstance(header, dict):
                raise ValueError("header is not an object")
        except ValueError:
            self._drop(path, size)
            return None
        return Item(path, header, size)

    def usage(self) -> tuple[int, int]:
        """(items, bytes) currently spooled."""
        count = total = 0
        for name in self.names():
            try:
                total += (self.root / name).stat().st_size
                count += 1
            except FileNotFoundError:
                continue
        return count, total

    # --- the agent's side --------------------------------------------------------------------

    def remove(self, item: Item) -> None:
        with contextlib.suppress(FileNotFoundError):
            item.path.unlink()

    def enforce_bounds(self, incoming: int = 0) -> int:
        """Drop the oldest items until the spool (plus ``incoming`` bytes) fits; returns how
        many were dropped. Also clears temporary files of writers that died."""
        self._clear_stale_tmp()
        entries = []
        for name in self.names():
            try:
                entries.append((name, (self.root / name).stat().st_size))
            except FileNotFoundError:
                continue
        total = sum(size for _, size in entries) + incoming
        count = len(entries) + (1 if incoming else 0)
        dropped = 0
        for name, size in entries:
            if total <= self.max_bytes and count <= self.max_items:
                break
            self._drop(self.root / name, size, save=False)
            total -= size
            count -= 1
            dropped += 1
        if dropped:
            self._flush_state()
        return dropped

    def _clear_stale_tmp(self) -> None:
        now = time.time()
        try:
            names = [n for n in os.listdir(self.root) if n.startswith(TMP_PREFIX)]
        except FileNotFoundError:
            return
        for name in names:
            path = self.root / name
            try:
                if now - path.stat().st_mtime > STALE_TMP_S:
                    path.unlink()
            except FileNotFoundError:
                continue

    # --- the persisted count of what was dropped ----------------------------------------------

    def state(self) -> SpoolState:
        if not hasattr(self, "_state"):
            try:
                raw = json.loads((self.root / STATE_FILE).read_text())
                self._state = SpoolState(
                    int(raw.get("dropped_items", 0)),
                    int(raw.get("dropped_bytes", 0)),
                    dict(raw.get("extra", {})),
                )
            except (FileNotFoundError, ValueError, TypeError, AttributeError):
                self._state = SpoolState()
        return self._state

    def save_extra(self, key: str, value) -> None:
        self.state().extra[key] = value
        self._flush_state()

    def _drop(self, path: Path, size: int, *, save: bool = True) -> None:
        try:
            path.unlink()
        except FileNotFoundError:
            return
        state = self.state()
        state.dropped_items += 1
        state.dropped_bytes += size
        if save:
            self._flush_state()

    def _flush_state(self) -> None:
        state = self.state()
        payload = json.dumps(
            {
                "dropped_items": state.dropped_items,
                "dropped_bytes": state.dropped_bytes,
                "extra": state.extra,
            },
            sort_keys=True,
        ).encode()
        write_atomic(self.root / STATE_FILE, payload)
