"""A store opens, lists and destroys the partitions (one per job) of one backend kind."""

from __future__ import annotations

from abc import ABC, abstractmethod

from statehouse.backends.base.partition import StorePartition


class Store(ABC):
    name: str

    @abstractmethod
    def existing(self) -> list[str]:
        """Jobs whose partitions survive from an earlier run."""

    @abstractmethod
    def open_partition(self, job: str, max_parallelism: int | None) -> StorePartition:
        """Open (or create) a job's partition; ``None`` reopens one and reads its stored max parallelism."""

    @abstractmethod
    def destroy_partition(self, job: str) -> None: ...
