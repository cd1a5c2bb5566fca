"""In-memory checkpoint storage for tests: ``memory://<name>/<prefix>``.

Buckets are process-wide by name, so a second storage opened on the same location (a
"restarted" manager in a test) sees the same files.
"""

from __future__ import annotations

import io
import posixpath
import threading
from collections.abc import Iterable

from statehouse.snapshots.errors import InvalidLocation
from statehouse.snapshots.storage.base import DEFAULT_TRANSFER_THREADS, CheckpointOutputStream, CheckpointStorage

_BUCKETS: dict[str, dict[str, bytes]] = {}
_LOCK = threading.Lock()


class MemoryOutputStream(CheckpointOutputStream):
    """A file being written to a :class:`MemoryStorage`: buffered, and stored under its key only
    when committed, so a discarded write leaves nothing."""

    def __init__(self, path: str, key: str, storage: MemoryStorage) -> None:
        super().__init__(path)
        self._key = key
        self._buffer = io.BytesIO()
        self._storage = storage

    def _write(self, data: bytes) -> None:
        self._buffer.write(data)

    def _commit(self) -> None:
        with _LOCK:
            self._storage._files[self._key] = self._buffer.getvalue()
        self._storage._count(written=self.tell())

    def discard(self) -> None:
        self._buffer = io.BytesIO()


class MemoryStorage(CheckpointStorage):
    """Checkpoint storage in process memory (``memory://<name>/<prefix>``), for tests: the files of
    a named bucket are shared by every storage opened on that name, so a restarted manager sees them."""

    def __init__(
        self, name: str = "default", prefix: str = "", *, transfer_threads: int = DEFAULT_TRANSFER_THREADS
    ) -> None:
        super().__init__(transfer_threads)
        with _LOCK:
            self._files = _BUCKETS.setdefault(name, {})
        self.prefix = prefix.strip("/")
        self.location = f"memory://{name}/{self.prefix}".rstrip("/")

    def _key(self, path: str) -> str:
        key = posixpath.normpath(posixpath.join("/", self.prefix, path)).lstrip("/")
        if posixpath.normpath(posixpath.join(self.prefix, path)).startswith(".."):
            raise InvalidLocation(f"path {path!r} leaves the memory bucket")
        return key

    def _rel(self, key: str) -> str:
        return posixpath.relpath("/" + key, "/" + self.prefix)

    def create_output(self, path: str) -> MemoryOutputStream:
        return MemoryOutputStream(path, self._key(path), self)

    def read(self, path: str, offset: int = 0, length: int | None = None) -> bytes:
        with _LOCK:
            data = self._files.get(self._key(path))
        if data is None:
            raise FileNotFoundError(path)
        chunk = data[offset:] if length is None else data[offset : offset + length]
        self._count(read=len(chunk))
        return chunk

    def list(self, prefix: str) -> list[str]:
        base = self._key(prefix)
        base = "" if base == "." else base + "/"
        with _LOCK:
            keys = [k for k in self._files if k.startswith(base)]
        return sorted(self._rel(k) for k in keys)

    def exists(self, path: str) -> bool:
        with _LOCK:
            return self._key(path) in self._files

    def delete(self, paths: Iterable[str]) -> None:
        with _LOCK:
            for path in paths:
                self._files.pop(self._key(path), None)

    def corrupt(self, path: str, data: bytes) -> None:
        """Replace a file's bytes (tests)."""
        with _LOCK:
            self._files[self._key(path)] = data
