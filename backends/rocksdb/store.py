"""RocksDB store: one RocksDB instance per job under ``<data_dir>/<job>/``."""

from __future__ import annotations

import os
import shutil

from rocksdict import Cache

from statehouse.backends.base.partition import StorePartition
from statehouse.backends.base.store import Store
from statehouse.backends.rocksdb.database import TableFiles
from statehouse.backends.rocksdb.partition import RocksDBPartition
from statehouse.backends.rocksdb.pool import OpenInstances
from statehouse.backends.rocksdb.row_cache import DEFAULT_MAX_BYTES, RowCache
from statehouse.backends.rocksdb.snapshot import MOVE_FILE_BYTES, IncrementalSnapshotStrategy
from statehouse.backends.rocksdb.space import DataVolume
from statehouse.backends.snapshot.full_strategy import FULL, JobStrategy
from statehouse.snapshots.layout import SnapshotKind
from statehouse.snapshots.stored.names import validate_name


class RocksDBStore(Store):
    """A restore builds the new database in ``$staging/<job>`` and swaps the directories:
    ``<job>`` -> ``$retired/<job>``, ``$staging/<job>`` -> ``<job>``. "$" cannot occur in a job
    name, so these never collide with a job's directory."""

    name = "rocksdb"

    def __init__(
        self,
        data_dir: str,
        *,
        incremental_checkpoints: bool = True,
        compact_moving: bool = False,
        max_open: int | None = None,
        disk_reserve_bytes: int = 0,
        block_cache_bytes: int = 0,
        row_cache_bytes: int = DEFAULT_MAX_BYTES,
        files: TableFiles | None = None,
    ) -> None:
        self.data_dir = os.path.abspath(data_dir)
        self.files = files or TableFiles()
        self.incremental_checkpoints = incremental_checkpoints  # Flink's state.backend.incremental
        # Off by default: measured, it saves the loads' downloads but costs the move more time (RESULTS §15).
        self.incremental = IncrementalSnapshotStrategy(MOVE_FILE_BYTES if compact_moving else None)
        # Jobs' databases kept open at once (None: no bound); staged restores are not counted.
        self.instances = OpenInstances(max_open)
        # One cache of table blocks for every job, as Flink shares one per slot (managed memory):
        # memory bounded per replica, not per job, and a busy job gets the room idle ones leave.
        self.block_cache = Cache(block_cache_bytes) if block_cache_bytes > 0 else None
        # In front of it, the rows the jobs' point reads found, as Kafka Streams caches records.
        self.row_cache = RowCache(row_cache_bytes) if row_cache_bytes > 0 else None
        os.makedirs(self.data_dir, exist_ok=True)
        # Writes (restores' too) stop at the reserve, so that every job can still be reopened.
        self.volume = DataVolume(self.data_dir, disk_reserve_bytes)
        self._staging = os.path.join(self.data_dir, "$staging")
        self._retired = os.path.join(self.data_dir, "$retired")
        self._finish_interrupted_swaps()

    def _finish_interrupted_swaps(self) -> None:
        """After a crash during a swap: a job whose directory is missing gets its old one back
        (the restore did not happen); a leftover old directory beside a new one goes."""
        if os.path.isdir(self._retired):
            for job in os.listdir(self._retired):
                if os.path.exists(self._path(job)):
                    shutil.rmtree(os.path.join(self._retired, job), ignore_errors=True)
                else:
                    os.rename(os.path.join(self._retired, job), self._path(job))
        shutil.rmtree(self._staging, ignore_errors=True)

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
        return RocksDBPartition(
            self._path(job),
            max_parallelism,
            frozen_dir,
            self.instances,
            self.volume,
            self.block_cache,
            self.files,
            row_cache=self.row_cache,
        )

    def destroy_partition(self, job: str) -> None:
        shutil.rmtree(self._path(job), ignore_errors=True)
        shutil.rmtree(os.path.join(self.data_dir, "$frozen", job), ignore_errors=True)

    def check_space(self) -> None:
        self.volume.recover()

    def space_problem(self) -> str | None:
        self.volume.above_reserve()  # one statvfs: a probe sees the volume as it is now
        return None if self.volume.ready else self.volume.not_ready_reason()

    def snapshot_strategy(self, kind: SnapshotKind) -> JobStrategy:
        # Savepoints are always canonical (portable to the heap backend and across rescales).
        return self.incremental if kind == "checkpoint" and self.incremental_checkpoints else FULL

    def open_staging(self, job: str, max_parallelism: int) -> RocksDBPartition:
        path = os.path.join(self._staging, validate_name(job, "job"))
        shutil.rmtree(path, ignore_errors=True)
        os.makedirs(self._staging, exist_ok=True)
        frozen_dir = os.path.join(self.data_dir, "$frozen", "$staging", job)
        return RocksDBPartition(path, max_parallelism, frozen_dir, volume=self.volume, files=self.files)

    def promote(self, job: str, live: StorePartition | None, staged: StorePartition) -> StorePartition:
        assert isinstance(staged, RocksDBPartition) and (live is None or isinstance(live, RocksDBPartition))
        target, retired = self._path(job), os.path.join(self._retired, job)
        staged.close()
        if live is None:
            os.rename(staged.path, target)
            return self.open_partition(job, None)
        live.close()
        os.makedirs(self._retired, exist_ok=True)
        shutil.rmtree(retired, ignore_errors=True)
        os.rename(target, retired)
        try:
            os.rename(staged.path, target)
            live.reopen()  # the same partition object, now over the restored database
        except BaseException:
            if os.path.exists(target):
                shutil.rmtree(target, ignore_errors=True)
            os.rename(retired, target)
            live.reopen()
            raise
        shutil.rmtree(retired, ignore_errors=True)
        return live

    def discard_staging(self, job: str, staged: StorePartition) -> None:
        assert isinstance(staged, RocksDBPartition)
        staged.close()
        shutil.rmtree(staged.path, ignore_errors=True)
