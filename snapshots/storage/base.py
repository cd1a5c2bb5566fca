"""Checkpoint storage: where snapshot files live (Flink's ``CheckpointStorageAccess`` and
``CheckpointStreamFactory``).

Paths are ``/``-separated and relative to the storage root; ``..`` segments are resolved
(handles refer to ``../shared/...``) but can never leave the root's own container.
Nothing written through an output stream is visible under its final path until
:meth:`CheckpointOutputStream.close_and_get_handle` returned, and then it is durable.
"""

from __future__ import annotations

import builtins
import hashlib
import os
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from typing import TypeVar

from statehouse.snapshots.errors import SnapshotCorrupt
from statehouse.snapshots.handles import StreamHandle

_CHUNK = 1 << 20
# Files one snapshot uploads or downloads at once: Flink's
# state.backend.rocksdb.checkpoint.transfer.thread.num, and its default.
DEFAULT_TRANSFER_THREADS = 4

Item = TypeVar("Item")
Result = TypeVar("Result")


class _NotStarted(Exception):
    """A file of a transfer not started because another one had failed."""


class CheckpointOutputStream(ABC):
    """A file being written; hashes what it writes so the handle carries the checksum."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._digest = hashlib.sha256()
        self._size = 0

    def write(self, data: bytes) -> int:
        self._digest.update(data)
        self._size += len(data)
        self._write(data)
        return len(data)

    def tell(self) -> int:
        return self._size

    def close_and_get_handle(self) -> StreamHandle:
        """Make the bytes durable under :attr:`path`; only then return the handle."""
        self._commit()
        return StreamHandle(self.path, self._size, self._digest.hexdigest())

    @abstractmethod
    def _write(self, data: bytes) -> None: ...

    @abstractmethod
    def _commit(self) -> None: ...

    @abstractmethod
    def discard(self) -> None:
        """Drop everything written; nothing appears under the path."""

    def __enter__(self) -> CheckpointOutputStream:
        return self

    def __exit__(self, exc_type, *_exc: object) -> None:
        if exc_type is not None:
            self.discard()


class CheckpointStorage(ABC):
    """One storage root (a directory, an S3 prefix, a memory bucket)."""

    location: str  # the root as a location string, e.g. "s3://bucket/prefix"

    def __init__(self, transfer_threads: int = DEFAULT_TRANSFER_THREADS) -> None:
        if transfer_threads < 1:
            raise ValueError(f"transfer_threads must be at least 1, got {transfer_threads}")
        self.transfer_threads = transfer_threads
        self._counter_lock = threading.Lock()
        self.bytes_read = 0  # counters for metrics and tests
        self.bytes_written = 0
        self.reads = 0  # files or ranges of them read (GET requests on S3)

    def _count(self, read: int | None = None, written: int = 0) -> None:
        """Count a read of ``read`` bytes (one request) or ``written`` bytes written."""
        with self._counter_lock:
            if read is not None:
                self.bytes_read += read
                self.reads += 1
            self.bytes_written += written

    # -- primitives each storage implements ------------------------------------------------

    @abstractmethod
    def create_output(self, path: str) -> CheckpointOutputStream: ...

    @abstractmethod
    def read(self, path: str, offset: int = 0, length: int | None = None) -> bytes:
        """Bytes ``[offset, offset+length)`` of a file (a ranged GET on S3, a seek locally)."""

    @abstractmethod
    def list(self, prefix: str) -> list[str]:
        """Paths of all files under a directory prefix (recursive), sorted."""

    @abstractmethod
    def delete(self, paths: Iterable[str]) -> None:
        """Delete files; missing ones are ignored."""

    def exists(self, path: str) -> bool:
        parent = path.rsplit("/", 1)[0] if "/" in path else ""
        return path in self.list(parent)

    def delete_prefix(self, prefix: str) -> None:
        self.delete(self.list(prefix))

    def put_file(self, path: str, local_path: str) -> StreamHandle:
        """Upload a local file (S3 overrides this with a multipart-capable upload)."""
        with open(local_path, "rb") as source, self.create_output(path) as out:
            while chunk := source.read(_CHUNK):
                out.write(chunk)
            return out.close_and_get_handle()

    def download(self, path: str, local_path: str, size: int | None = None) -> None:
        """Copy a file of storage to ``local_path``; ``size``: its size, when the caller knows it."""
        with open(local_path, "wb") as target:
            target.write(self.read(path))

    def transfer(self, move: Callable[[Item], Result], files: Sequence[Item]) -> builtins.list[Result]:
        """``move`` (an upload or a download of one file) for each of ``files``, up to
        ``transfer_threads`` at once; the results in the files' order. One at a time, a snapshot
        of several files waits out each request's latency in turn, and a small checkpoint beside a
        large one (a rescale's copy) waits most. On a failure, no other file starts (a failed
        upload may take seconds to abort, and a worker freed meanwhile must not start the next
        file against a storage that is away), the ones moving are waited for (so that the caller
        knows every file written), and the error of the first file that failed, in the files' order, is raised."""
        if self.transfer_threads == 1 or len(files) <= 1:
            return [move(file) for file in files]
        failed_once = threading.Event()

        def guarded(file: Item) -> Result:
            if failed_once.is_set():
                raise _NotStarted
            try:
                return move(file)
            except BaseException:
                failed_once.set()
                raise

        with ThreadPoolExecutor(
            min(self.transfer_threads, len(files)), thread_name_prefix="statehouse-transfer"
        ) as pool:
            futures = [pool.submit(guarded, file) for file in files]
            wait(futures, return_when=FIRST_EXCEPTION)
            if failed_once.is_set():
                for future in futures:
                    future.cancel()
                wait(futures)
                raise next(
                    error
                    for future in futures
                    if not future.cancelled()
                    and (error := future.exception()) is not None
                    and not isinstance(error, _NotStarted)
                )
            return [future.result() for future in futures]

    # -- verified reads ----------------------------------------------------------------------

    def read_verified(self, handle: StreamHandle) -> bytes:
        data = self.read_existing(handle)
        check_bytes(handle.path, data, handle.size, handle.sha256)
        return data

    def download_verified(self, handle: StreamHandle, local_path: str) -> None:
        try:
            self.download(handle.path, local_path, handle.size)
        except FileNotFoundError:
            raise SnapshotCorrupt(f"snapshot file {handle.path!r} is missing from {self.location}") from None
        found = file_handle(handle.path, local_path)
        if found != handle:
            raise SnapshotCorrupt(
                f"snapshot file {handle.path!r} in {self.location} fails its checksum "
                f"(expected {handle.size} bytes sha256 {handle.sha256[:12]}..., got {found.size} bytes)"
            )

    def read_existing(self, handle: StreamHandle, offset: int = 0, length: int | None = None) -> bytes:
        """Bytes of a snapshot file, unverified (the caller checks them); a missing file is corrupt."""
        try:
            return self.read(handle.path, offset, length)
        except FileNotFoundError:
            raise SnapshotCorrupt(f"snapshot file {handle.path!r} is missing from {self.location}") from None

    def sweep_abandoned(self) -> int:
        """Clean up what failed or killed uploads left invisible in storage (S3: in-progress
        multipart uploads, billed until aborted); the number cleaned. Local and memory storage
        leave nothing of the kind: a local file is renamed into place only when complete."""
        return 0

    def close(self) -> None:  # noqa: B027 - optional hook: only S3 holds a client
        """Release clients and connections."""


def file_handle(path: str, local_path: str) -> StreamHandle:
    """The handle of a local file's bytes, to be stored at ``path``: size and SHA-256."""
    with open(local_path, "rb") as f:
        return StreamHandle(path, os.fstat(f.fileno()).st_size, hashlib.file_digest(f, "sha256").hexdigest())


def check_bytes(what: str, data: bytes, size: int, sha256: str) -> None:
    if len(data) != size:
        raise SnapshotCorrupt(f"snapshot file {what!r} is truncated: expected {size} bytes, found {len(data)}")
    if hashlib.sha256(data).hexdigest() != sha256:
        raise SnapshotCorrupt(f"snapshot file {what!r} fails its sha256 checksum; it is corrupt")


def fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
