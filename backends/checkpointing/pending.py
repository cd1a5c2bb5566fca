"""One replica part of a checkpoint being taken (Flink's ``PendingCheckpoint``): its report,
where it writes, its upload, and what completing or aborting it does to its files."""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import threading
import time
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout

from statehouse.backends.checkpointing.info import PENDING, CheckpointInfo, CheckpointStatus
from statehouse.backends.errors import StateError
from statehouse.protocol.keygroups import KeyGroupRange
from statehouse.snapshots.metadata import SnapshotMetadata
from statehouse.snapshots.strategy import SnapshotContext, SnapshotResult

log = logging.getLogger(__name__)


class PendingCheckpoint:
    """One replica's part of a checkpoint being taken (Flink's ``PendingCheckpoint``): it owns the
    part's report, its snapshot context (storage, written files, cancel flag) and its upload's
    future, and decides what completing, failing or aborting does to the files it wrote."""

    def __init__(self, info: CheckpointInfo, ctx: SnapshotContext) -> None:
        self._info = info
        self.ctx = ctx
        self.started = time.monotonic()
        self.future: Future[None] | None = None  # the upload's: done once it has discarded what it must
        self.ended: Future[None] = Future()  # done once the report has left in_progress
        self.result: SnapshotResult | None = None
        self._lock = threading.Lock()

    @property
    def checkpoint_id(self) -> int:
        return self._info.checkpoint_id

    @property
    def kind(self) -> str:
        return self._info.kind

    @property
    def status(self) -> str:
        return self._info.status

    @property
    def pending(self) -> bool:
        return self._info.status in PENDING

    @property
    def rescale_version(self) -> object:
        """The live rescale this checkpoint is taken for (its metadata's ``rescale_version``), if any."""
        return self._info.metadata.get("rescale_version")

    def info(self) -> CheckpointInfo:
        """A copy of its report, as of now."""
        with self._lock:
            return dataclasses.replace(self._info)

    def _set_status(self, status: CheckpointStatus) -> None:
        self._info.status = status
        if status != "in_progress" and not self.ended.done():
            self.ended.set_result(None)

    def _elapsed_ms(self) -> int:
        return int((time.monotonic() - self.started) * 1000)

    def uploaded(self, result: SnapshotResult | None, error: BaseException | None) -> None:
        """The asynchronous part ended (called on the upload thread)."""
        with self._lock:
            if self._info.status == "aborted":
                return  # abort discards the files
            if result is not None:
                self.result = result
                self._set_status("uploaded")
                self._info.bytes_uploaded = result.bytes_uploaded
                self._info.bytes_reused = result.bytes_reused
                self._info.committed_epoch = result.committed_epoch
                self._info.committed_batch = result.committed_batch
                self._info.duration_ms = self._elapsed_ms()
                return
            assert error is not None
            if not isinstance(error, InterruptedError):
                log.warning("checkpoint %s of job %s failed: %s", self.checkpoint_id, self._info.job, error)
            self._fail(error)
        self.discard_files()

    def fail(self, exc: BaseException) -> None:
        with self._lock:
            self._fail(exc)

    def _fail(self, exc: BaseException) -> None:
        self._set_status("failed")
        detail = exc.detail if isinstance(exc, StateError) else str(exc)
        self._info.error = f"{type(exc).__name__}: {detail}"
        self._info.duration_ms = self._elapsed_ms()

    def wait(self, timeout: float | None) -> None:
        if self.future is not None:
            with contextlib.suppress(FutureTimeout):
                self.future.result(timeout)

    def metadata(self, backend: str) -> SnapshotMetadata:
        """The ``_metadata`` of an uploaded part."""
        with self._lock:
            result, info = self.result, self._info
            assert result is not None, "only an uploaded checkpoint has metadata"
            return SnapshotMetadata(
                job=info.job,
                checkpoint_id=info.checkpoint_id,
                kind=info.kind,
                format=result.format,
                replica_index=info.replica_index,
                replica_count=info.replica_count,
                max_parallelism=result.max_parallelism,
                key_group_range=KeyGroupRange(*info.key_group_range),
                backend=backend,
                timestamp_ms=int(time.time() * 1000),
                states=result.states,
                keyed=result.keyed,
                operator=result.operator,
                bytes_uploaded=result.bytes_uploaded,
                bytes_reused=result.bytes_reused,
                duration_ms=info.duration_ms,
                user_metadata=info.metadata,
                committed_epoch=result.committed_epoch,
                committed_batch=result.committed_batch,
            )

    def mark_completed(self) -> CheckpointInfo:
        with self._lock:
            self._set_status("completed")
            return dataclasses.replace(self._info)

    def abort(self, wait_s: float = 0.0) -> None:
        """notifyCheckpointAborted: cancel the upload and discard what it wrote. The upload sees
        the cancel between requests, and one request to a storage that stopped answering can take
        minutes: the abort waits up to ``wait_s`` only (0 for a driver's abort, which must answer
        while the link is down), and the files go when the upload ends."""
        with self._lock:
            if self._info.status in ("aborted", "completed"):
                return
            self.ctx.cancel.set()
        self.wait(wait_s)
        with self._lock:
            self._set_status("aborted")
            running = self.future is not None and not self.future.done()
        if running and self.future is not None:
            log.warning("checkpoint %s still uploading after abort; its files go when it ends", self.checkpoint_id)
            self.future.add_done_callback(lambda _: self.discard_files())
        else:
            self.discard_files()

    def discard_files(self) -> None:
        """Delete what an unsuccessful attempt wrote (its uploads are registered nowhere)."""
        try:
            self.ctx.storage.delete(self.ctx.written)
        except Exception as exc:  # best effort: storage may be what failed
            log.warning("could not delete the files of checkpoint %s: %s", self.checkpoint_id, exc)
