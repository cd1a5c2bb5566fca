"""Checkpoint storage in a local directory (the embedded default).

Durability: a file is written under a temporary name, fsynced, renamed into place and its
directory fsynced, so a crash leaves either no file or the whole file.
"""

from __future__ import annotations

import contextlib
import os
import posixpath
import uuid
from collections.abc import Iterable

from statehouse.snapshots.errors import InvalidLocation, StorageUnavailable
from statehouse.snapshots.storage.base import (
    DEFAULT_TRANSFER_THREADS,
    CheckpointOutputStream,
    CheckpointStorage,
    fsync_dir,
)


class LocalOutputStream(CheckpointOutputStream):
    """A file being written to a :class:`LocalStorage`: written under a temporary name, then fsynced
    and renamed into place on commit (its directory fsynced too), so a crash leaves no half file."""

    def __init__(self, path: str, target: str, storage: LocalStorage) -> None:
        super().__init__(path)
        self._target = target
        self._temp = f"{target}.tmp-{uuid.uuid4().hex}"
        self._storage = storage
        try:
            os.makedirs(os.path.dirname(target), exist_ok=True)
            self._file = open(self._temp, "wb")  # noqa: SIM115 - closed in _commit/discard
        except OSError as exc:
            raise StorageUnavailable(f"cannot write checkpoint file {target}: {exc}") from exc

    def _write(self, data: bytes) -> None:
        try:
            self._file.write(data)
        except OSError as exc:
            raise StorageUnavailable(f"cannot write checkpoint file {self._target}: {exc}") from exc

    def _commit(self) -> None:
        try:
            self._file.flush()
            os.fsync(self._file.fileno())
            self._file.close()
            os.replace(self._temp, self._target)
            fsync_dir(os.path.dirname(self._target))
        except OSError as exc:
            self.discard()
            raise StorageUnavailable(f"cannot write checkpoint file {self._target}: {exc}") from exc
        self._storage._count(written=self.tell())

    def discard(self) -> None:
        self._file.close()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self._temp)


class LocalStorage(CheckpointStorage):
    """Checkpoint storage in a local directory (Flink's ``FileSystemCheckpointStorage`` on a local
    path): paths resolve under ``root`` and may not leave it; unfinished writes are not listed,
    and deleting files removes the directories they leave empty."""

    def __init__(self, root: str, *, transfer_threads: int = DEFAULT_TRANSFER_THREADS) -> None:
        super().__init__(transfer_threads)
        self.root = os.path.abspath(root)
        self.location = self.root

    def _abs(self, path: str) -> str:
        resolved = posixpath.normpath(posixpath.join(self.root, path))
        if not resolved.startswith("/"):
            raise InvalidLocation(f"path {path!r} leaves the storage root")
        return resolved

    def create_output(self, path: str) -> LocalOutputStream:
        return LocalOutputStream(path, self._abs(path), self)

    def read(self, path: str, offset: int = 0, length: int | None = None) -> bytes:
        try:
            with open(self._abs(path), "rb") as f:
                f.seek(offset)
                data = f.read() if length is None else f.read(length)
        except FileNotFoundError:
            raise
        except OSError as exc:
            raise StorageUnavailable(f"cannot read checkpoint file {path}: {exc}") from exc
        self._count(read=len(data))
        return data

    def list(self, prefix: str) -> list[str]:
        base = self._abs(prefix)
        found = []
        for directory, _dirs, files in os.walk(base):
            for name in files:
                if ".tmp-" in name:
                    continue  # an unfinished write
                found.append(posixpath.relpath(os.path.join(directory, name), self.root))
        return sorted(found)

    def exists(self, path: str) -> bool:
        return os.path.isfile(self._abs(path))

    def delete(self, paths: Iterable[str]) -> None:
        parents = set()
        for path in paths:
            target = self._abs(path)
            try:
                os.unlink(target)
            except FileNotFoundError:
                continue
            parents.add(os.path.dirname(target))
        # Remove directories left empty (a subsumed chk-<id>/), never the root itself.
        for parent in sorted(parents, key=len, reverse=True):
            while parent.startswith(self.root + os.sep):
                try:
                    os.rmdir(parent)
                except OSError:
                    break
                parent = os.path.dirname(parent)
