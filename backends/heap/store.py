"""Heap store: partitions live in memory only; durability comes from checkpoints."""

from __future__ import annotations

from statehouse.backends.base.partition import StorePartition
from statehouse.backends.base.store import Store
from statehouse.backends.heap.partition import HeapPartition
from statehouse.backends.heap.snapshot import DELTA_WEIGHT, ChangelogSnapshotStrategy
from statehouse.backends.snapshot.full_strategy import FULL, JobStrategy
from statehouse.protocol.keygroups import default_max_parallelism
from statehouse.snapshots.layout import SnapshotKind


class HeapStore(Store):
    """The heap backend's store (Flink's ``HashMapStateBackend``): partitions in memory only, so no
    job survives a restart but through a checkpoint; snapshots are copy-on-write freezes in the
    canonical full format, checkpoints as a changelog over a full base (``incremental_checkpoints``)."""

    name = "heap"

    def __init__(
        self, incremental_checkpoints: bool = True, delta_weight: float = DELTA_WEIGHT, background_bases: bool = False
    ) -> None:
        self.incremental_checkpoints = incremental_checkpoints  # checkpoints as a changelog
        self.changelog = ChangelogSnapshotStrategy(delta_weight, background_bases)

    def existing(self) -> list[str]:
        return []

    def open_partition(self, job: str, max_parallelism: int | None) -> HeapPartition:
        return HeapPartition(max_parallelism or default_max_parallelism(1), track_changes=self.incremental_checkpoints)

    def destroy_partition(self, job: str) -> None:
        """Nothing on disk; the partition is dropped with its job."""

    def snapshot_strategy(self, kind: SnapshotKind) -> JobStrategy:
        return self.changelog if kind == "checkpoint" and self.incremental_checkpoints else FULL

    def open_staging(self, job: str, max_parallelism: int) -> HeapPartition:
        return HeapPartition(max_parallelism, track_changes=self.incremental_checkpoints)

    def promote(self, job: str, live: StorePartition | None, staged: StorePartition) -> StorePartition:
        return staged  # the live partition's dicts go with the old Job object

    def discard_staging(self, job: str, staged: StorePartition) -> None:
        staged.close()
