"""A store opens, lists and destroys the partitions (one per job) of one backend kind, and
says how its jobs are snapshotted (a Flink state backend owns its snapshot strategies)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING

from statehouse.backends.base.partition import StorePartition

if TYPE_CHECKING:
    from statehouse.backends.snapshot.full_strategy import JobStrategy
    from statehouse.snapshots.layout import SnapshotKind


class Store(ABC):
    """One backend kind's store (heap or RocksDB; Flink's ``StateBackend``): it opens, lists and
    destroys the jobs' partitions, builds a restore's staging partition and swaps it in, and
    names the snapshot strategy its jobs are checkpointed with."""

    name: str

    @abstractmethod
    def existing(self) -> list[str]:
        """Jobs whose partitions survive from an earlier run."""

    @abstractmethod
    def open_partition(self, job: str, max_parallelism: int | None) -> StorePartition:
        """Open (or create) a job's partition; ``None`` reopens one and reads its stored max parallelism."""

    @abstractmethod
    def destroy_partition(self, job: str) -> None: ...

    def check_space(self) -> None:  # noqa: B027 - optional hook: only a store on disk has a volume
        """Read the free space of the store's volume again, and reopen for writing the jobs that
        ran out of it if there is room now (called periodically)."""

    def space_problem(self) -> str | None:
        """Why the store's volume takes no writes now (its free space read again; jobs waiting for
        space as of the last :meth:`check_space`); ``None`` when it does."""
        return None

    @abstractmethod
    def snapshot_strategy(self, kind: SnapshotKind) -> JobStrategy:
        """The strategy that takes a checkpoint or a savepoint (always the canonical format)."""

    # -- restore: a new partition is built beside the live one, then takes its place --------

    @abstractmethod
    def open_staging(self, job: str, max_parallelism: int) -> StorePartition:
        """A new, empty partition for ``job`` that does not touch its live one."""

    @abstractmethod
    def promote(self, job: str, live: StorePartition | None, staged: StorePartition) -> StorePartition:
        """Make ``staged`` the job's partition in place of ``live``; returns it, open.

        Atomic as far as the job's data goes: if it raises, ``live`` holds what it held and is
        open (a crash meanwhile leaves either the old or the new data at the next start).
        """

    @abstractmethod
    def discard_staging(self, job: str, staged: StorePartition) -> None:
        """Close and delete a staged partition that will not be promoted."""
