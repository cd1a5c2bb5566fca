"""Heap store: partitions live in memory only; durability comes from checkpoints."""

from __future__ import annotations

from statehouse.backends.base.partition import StorePartition
from statehouse.backends.base.store import Store
from statehouse.backends.heap.partition import HeapPartition
from statehouse.backends.snapshot.full_strategy import FULL, JobStrategy
from statehouse.protocol.keygroups import default_max_parallelism
from statehouse.snapshots.layout import SnapshotKind


class HeapStore(Store):
    """The heap backend's store (Flink's ``HashMapStateBackend``): partitions in memory only, so no
    job survives a restart but through a checkpoint; snapshots are copy-on-write freezes in the
    canonical full format."""

    name = "heap"

    def existing(self) -> list[str]:
        return []

    def open_partition(self, job: str, max_parallelism: int | None) -> HeapPartition:
        return HeapPartition(max_parallelism or default_max_parallelism(1))

    def destroy_partition(self, job: str) -> None:
        """Nothing on disk; the partition is dropped with its job."""

    def snapshot_strategy(self, kind: SnapshotKind) -> JobStrategy:
        return FULL  # copy-on-write freeze, canonical format: checkpoints and savepoints alike

    def open_staging(self, job: str, max_parallelism: int) -> HeapPartition:
        return HeapPartition(max_parallelism)

    def promote(self, job: str, live: StorePartition | None, staged: StorePartition) -> StorePartition:
        return staged  # the live partition's dicts go with the old Job object

    def discard_staging(self, job: str, staged: StorePartition) -> None:
        staged.close()
