"""Local artifact storage whose blobs are whole or absent.

``upload_receive`` trusts ``storage.exists(name)`` for a content-addressed name: the same bytes
arriving again reuse the blob. Django's ``FileSystemStorage`` writes straight to the final name,
so a full disk (or a process killed mid-write) would leave a truncated blob there that every
later copy of those bytes would then reuse. Here a blob is written to a hidden temporary file in
its directory and renamed into place only when complete; on any error the temporary file is
removed. (S3-compatible stores need none of this: an object PUT is atomic.)
"""

from __future__ import annotations

import contextlib
import filecmp
import os
import tempfile

from django.core.files.storage import FileSystemStorage

PARTIAL_PREFIX = ".partial-"


class ArtifactFileSystemStorage(FileSystemStorage):
    def _save(self, name, content):
        full_path = self.path(name)
        directory = os.path.dirname(full_path)
        os.makedirs(directory, exist_ok=True)
        descriptor, partial = tempfile.mkstemp(dir=directory, prefix=PARTIAL_PREFIX)
        try:
            with os.fdopen(descriptor, "wb") as out:
                if hasattr(content, "seek"):
                    content.seek(0)
                for chunk in content.chunks():
                    out.write(chunk if isinstance(chunk, bytes) else chunk.encode())
                out.flush()
                os.fsync(out.fileno())
            # mkstemp creates 0600; give the blob the mode FileSystemStorage would.
            os.chmod(partial, self.file_permissions_mode or 0o644)
            # A link, not a rename: it fails if the name appeared meanwhile (another request
            # with other bytes under a colliding name never has its blob replaced).
            while True:
                try:
                    os.link(partial, full_path)
                    break
                except FileExistsError:
                    if filecmp.cmp(partial, full_path, shallow=False):
                        # The same bytes, written by a concurrent request for the same
                        # content-addressed name: that blob is this one. A second copy under
                        # another name would be orphaned when this request's row loses the race.
                        break
                    name = self.get_available_name(name)
                    full_path = self.path(name)
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(partial)
        return str(name).replace("\\", "/")
