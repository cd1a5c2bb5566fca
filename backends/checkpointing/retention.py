"""Retention: which completed checkpoints of a job stay, and which files go with the others
(Flink's ``CompletedCheckpointStore`` with its ``SharedStateRegistry``).

This replica keeps its newest ``num_retained`` completed checkpoint parts of each job and
deletes the parts it subsumes; a shared (incremental) file goes once no retained checkpoint
uses it. Savepoints are never deleted. After a live rescale the parts this replica wrote
under the old layout (at the same index: its lineage, the same database) count with its new
ones: its first checkpoint of the new layout reuses their shared files, and it retires them as
its own. Replica 0 also retires the parts of the indexes the new layout does not have, whose
replicas are gone.
"""

from __future__ import annotations

import builtins
import functools
import logging
import threading

from statehouse.backends.checkpointing.catalog import JobHistory
from statehouse.backends.checkpointing.cleaner import CheckpointCleaner
from statehouse.backends.checkpointing.registry import SharedStateRegistry
from statehouse.backends.errors import StateError
from statehouse.snapshots.catalog import read_metadata
from statehouse.snapshots.layout import metadata_name, part_name, snapshot_dir
from statehouse.snapshots.metadata import SnapshotMetadata, SnapshotPart
from statehouse.snapshots.storage.base import CheckpointStorage
from statehouse.snapshots.strategy import Seed

log = logging.getLogger(__name__)


class CompletedCheckpoints:
    """This replica's completed parts of one job, the shared files they use, and retention."""

    def __init__(
        self,
        job: str,
        storage: CheckpointStorage,
        replica: tuple[int, int],
        num_retained: int,
        history: JobHistory,
        cleaner: CheckpointCleaner | None = None,
    ) -> None:
        if num_retained < 1:
            raise ValueError("num_retained must be at least 1")
        self.job = job
        self.storage = storage
        self.replica = replica
        self.num_retained = num_retained
        self._cleaner = cleaner
        self._lock = threading.Lock()
        self._completed = dict(history.completed)
        self._lineage = dict(history.lineage)
        # Other layouts' parts at indexes this layout does not have (the replicas that left).
        count = replica[1]
        gone = {i: [(index, n) for index, n in parts if index >= count] for i, parts in history.foreign.items()}
        self._foreign = {i: parts for i, parts in gone.items() if parts}
        # A pending live rescale's checkpoints (hold): kept past num_retained until it ends, since
        # its loads read them while the query's checkpoints go on.
        self._held: set[int] = set()
        self.registry = SharedStateRegistry()
        for _, metadata in sorted({**self._lineage, **self._parts()}.items()):  # in id order: as it was
            self.register_shared(metadata)

    def _checkpoint_ids(self) -> builtins.list[int]:
        return sorted(self._parts())

    def _parts(self) -> dict[int, SnapshotMetadata]:
        """This layout's completed checkpoint parts (not its savepoints)."""
        return {i: m for i, m in self._completed.items() if m.kind == "checkpoint"}

    # -- queries ---------------------------------------------------------------------------

    def get(self, checkpoint_id: int) -> SnapshotMetadata | None:
        with self._lock:
            return self._completed.get(checkpoint_id)

    def all(self) -> dict[int, SnapshotMetadata]:
        with self._lock:
            return dict(self._completed)

    def latest_checkpoint(self) -> SnapshotPart | None:
        """The newest completed checkpoint part (what an incremental checkpoint builds on); before
        this layout has one, the newest of the lineage (the files of the database it still holds)."""
        with self._lock:
            parts = self._parts() or self._lineage
            if not parts:
                return None
            latest = parts[max(parts)]
        return SnapshotPart(snapshot_dir(self.job, latest.checkpoint_id, "checkpoint"), latest)

    # -- completing ------------------------------------------------------------------------

    def hold(self, checkpoint_id: int) -> None:
        """Keep ``checkpoint_id`` however many newer ones complete, until :meth:`release`."""
        with self._lock:
            self._held.add(checkpoint_id)

    def release(self) -> None:
        """Let retention take the held checkpoints again (with the next one that completes)."""
        with self._lock:
            self._held.clear()

    def register_seed(self, seed: Seed) -> None:
        """Files uploaded ahead of a first checkpoint, used by none yet: the checkpoint that reuses
        one registers it again; the next retention deletes the others."""
        for handle in seed.files.values():
            self.registry.register_reference(handle.path, handle, 0)

    def register_shared(self, metadata: SnapshotMetadata) -> None:
        """Flink registers shared state before finalizing: from here its files are retained."""
        directory = snapshot_dir(metadata.job, metadata.checkpoint_id, metadata.kind)
        for handle in metadata.shared_handles().values():
            root_handle = handle.under(directory)
            self.registry.register_reference(root_handle.path, root_handle, metadata.checkpoint_id)

    def add(self, metadata: SnapshotMetadata, *, keep_shared: bool = False) -> None:
        """A part whose ``_metadata`` is written; then apply retention if it is a checkpoint.
        ``keep_shared``: an older checkpoint still uploading will name shared files that only
        subsumed ones use now, so none goes yet (the next retention without it takes them)."""
        with self._lock:
            self._completed[metadata.checkpoint_id] = metadata
        if metadata.kind == "checkpoint":
            self._retain(keep_shared)

    def _retain(self, keep_shared: bool = False) -> None:
        """Keep the newest ``num_retained`` completed checkpoints; delete unreachable shared files."""
        with self._lock:
            checkpoints = self._checkpoint_ids()
            # The lineage counts with this layout's parts, newest first (its ids are all older).
            every = sorted(self._lineage) + checkpoints
            keep = set(every[-self.num_retained :]) | self._held
            subsumed = [self._completed.pop(i) for i in checkpoints if i not in keep]
            subsumed += [self._lineage.pop(i) for i in sorted(self._lineage) if i not in keep]
            retained = [i for i in every if i in keep]
            unused = [] if keep_shared else self.registry.unregister_unused(retained[0])
        if not subsumed and not unused and not (self._foreign and self.replica[0] == 0):
            return
        clean = functools.partial(self._delete, subsumed, [h.path for h in unused], retained)
        if self._cleaner is None:
            clean()
        else:
            self._cleaner.submit(clean)

    def _delete(
        self, subsumed: builtins.list[SnapshotMetadata], doomed: builtins.list[str], retained: builtins.list[int]
    ) -> None:
        """Delete the parts retention let go and the shared files no retained part uses."""
        # Each subsumed part's files and the unused shared files go in one request after the
        # metadata (a checkpoint after every micro-batch: on S3 each request costs the replica
        # ~3 ms of CPU, and listing a part ~7; its metadata names every file of it).
        for metadata in subsumed:
            directory = snapshot_dir(self.job, metadata.checkpoint_id, "checkpoint")
            try:
                # Metadata first: a half-deleted checkpoint must never look restorable.
                self.storage.delete([f"{directory}/{metadata_name(metadata.replica_index, metadata.replica_count)}"])
            except Exception as exc:
                log.warning(
                    "could not delete subsumed checkpoint %s of job %s: %s", metadata.checkpoint_id, self.job, exc
                )
                continue
            doomed += [f"{directory}/{path}" for path in metadata.part_files()]
        try:
            self.storage.delete(doomed)
        except Exception as exc:
            log.warning("could not delete %d files of subsumed checkpoints of job %s: %s", len(doomed), self.job, exc)
        if self._foreign and self.replica[0] == 0:
            self._retain_foreign(retained)

    def _retain_foreign(self, retained: builtins.list[int]) -> None:
        """After a rescale, replica 0 also subsumes the other layouts' parts at indexes this layout
        does not have.

        Their replicas are gone, so nobody else will. They count towards ``num_retained``
        with this layout's checkpoints (all newer); their shared files go once no remaining
        such part references them (no other database's part can: each uploads its own).
        """
        with self._lock:
            foreign = {i: list(parts) for i, parts in self._foreign.items()}
        keep = set(sorted(set(retained) | set(foreign))[-self.num_retained :])
        doomed = sorted(i for i in foreign if i not in keep)
        if not doomed:
            return
        still_used: set[str] = set()
        for checkpoint_id in keep & set(foreign):
            for index, count in foreign[checkpoint_id]:
                still_used |= self._shared_of(checkpoint_id, index, count)
        for checkpoint_id in doomed:
            directory = snapshot_dir(self.job, checkpoint_id, "checkpoint")
            parts = foreign[checkpoint_id]
            try:
                shared = set().union(*(self._shared_of(checkpoint_id, i, n) for i, n in parts))
                self.storage.delete([f"{directory}/{metadata_name(i, n)}" for i, n in parts])
                for index, count in parts:
                    self.storage.delete_prefix(f"{directory}/{part_name(index, count)}")
                self.storage.delete(sorted(shared - still_used))
            except Exception as exc:
                log.warning("could not delete old-layout checkpoint %s of job %s: %s", checkpoint_id, self.job, exc)
                continue
            with self._lock:
                del self._foreign[checkpoint_id]

    def _shared_of(self, checkpoint_id: int, index: int, count: int) -> set[str]:
        directory = snapshot_dir(self.job, checkpoint_id, "checkpoint")
        try:
            metadata = read_metadata(self.storage, directory, metadata_name(index, count))
        except StateError:
            return set()
        return {h.under(directory).path for h in metadata.shared_handles().values()}
