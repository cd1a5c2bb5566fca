"""RocksDB store: one RocksDB instance per job under ``<data_dir>/<job>/``."""

from __future__ import annotations

import os
import shutil

from statehouse.backends.base.store import Store
from statehouse.backends.names import validate_name
from statehouse.backends.rocksdb.partition import RocksDBPartition


class RocksDBStore(Store):
    name = "rocksdb"

    def __init__(self, data_dir: str) -> None:
        self.data_dir = os.path.abspath(data_dir)
        os.makedirs(self.data_dir, exist_ok=True)

    def _path(self, job: str) -> str:
        # The name check keeps a job from reaching outside the data directory.
        return os.path.join(self.data_dir, validate_name(job, "job"))

    def existing(self) -> list[str]:
        return sorted(
            name for name in os.listdir(self.data_dir) if os.path.exists(os.path.join(self.data_dir, name, "CURRENT"))
        )

    def open_partition(self, job: str, max_parallelism: int | None) -> RocksDBPartition:
        # Frozen views (native checkpoints) go where no job name can point: "$" is not
        # allowed in names.
        frozen_dir = os.path.join(self.data_dir, "$frozen", job)
        shutil.rmtree(frozen_dir, ignore_errors=True)  # views of a previous process are stale
        return RocksDBPartition(self._path(job), max_parallelism, frozen_dir)

    def destroy_partition(self, job: str) -> None:
        shutil.rmtree(self._path(job), ignore_errors=True)
        shutil.rmtree(os.path.join(self.data_dir, "$frozen", job), ignore_errors=True)
