"""A snapshot's files move ``transfer_threads`` at a time (``STATEHOUSE_CHECKPOINT_TRANSFER_THREADS``,
Flink's ``state.backend.rocksdb.checkpoint.transfer.thread.num``): an incremental checkpoint's uploads
and a restore's downloads, through ``CheckpointStorage.transfer``."""

from __future__ import annotations

import os
import threading
import time

import pytest

from statehouse.backends.catalog import JobCatalog
from statehouse.backends.rocksdb import RocksDBStore
from statehouse.snapshots.handles import StreamHandle
from statehouse.snapshots.storage import open_storage
from statehouse.snapshots.storage.local import LocalStorage
from statehouse.snapshots.storage.locations import RestoreLocations
from statehouse.snapshots.stored.descriptors import StateDescriptor
from tests.support.job_contents import dump

WAIT_S = 30  # a barrier no file reaches in this long means they did not move together


class Concurrency:
    """How many calls run at once, at most, over a test."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.now = self.most = 0

    def __enter__(self) -> Concurrency:
        with self._lock:
            self.now += 1
            self.most = max(self.most, self.now)
        return self

    def __exit__(self, *_exc: object) -> None:
        with self._lock:
            self.now -= 1


@pytest.mark.parametrize("threads", [1, 3])
def test_files_move_up_to_the_threads_at_once_and_answer_in_order(tmp_path, threads):
    storage = LocalStorage(str(tmp_path), transfer_threads=threads)
    running, together = Concurrency(), threading.Barrier(threads)

    def move(file: int) -> str:
        with running:
            together.wait(WAIT_S)  # each of `threads` files waits for the others: they move at once
            return f"moved {file}"

    assert storage.transfer(move, list(range(7 * threads))) == [f"moved {i}" for i in range(7 * threads)]
    assert running.most == threads


def test_a_failure_is_raised_once_every_file_moving_has_ended(tmp_path):
    storage = LocalStorage(str(tmp_path), transfer_threads=2)
    second_moving = threading.Event()
    started, ended = set(), set()
    lock = threading.Lock()

    class Broken(Exception):
        pass

    def move(file: int) -> int:
        with lock:
            started.add(file)
        try:
            if file == 0:
                second_moving.wait(WAIT_S)  # fails while file 1 moves
                raise Broken("the link went away")
            if file == 1:
                second_moving.set()
            return file
        finally:
            with lock:
                ended.add(file)

    with pytest.raises(Broken):
        storage.transfer(move, list(range(50)))
    assert {0, 1} <= started and started == ended  # none left moving behind the error


def test_no_file_starts_once_one_has_failed(tmp_path):
    """Four files moving when the storage goes away; the first fails, the others a little later:
    the worker the first failure freed starts nothing more (each failed upload may take seconds,
    its abort included), and the first file's error is the one raised."""
    storage = LocalStorage(str(tmp_path), transfer_threads=4)
    all_moving = threading.Barrier(4)
    started = []

    def move(file: int) -> int:
        started.append(file)
        if file < 4:
            all_moving.wait(WAIT_S)
            time.sleep(0.05 * file)
            raise OSError(f"file {file}: the storage went away")
        return file

    with pytest.raises(OSError, match="file 0: the storage went away"):
        storage.transfer(move, list(range(20)))
    assert sorted(started) == [0, 1, 2, 3]


def test_the_setting_reaches_the_storage_and_a_restore_location_opened_from_it(tmp_path):
    assert open_storage(str(tmp_path)).transfer_threads == 4  # Flink's default
    storage = open_storage(str(tmp_path / "checkpoints"), transfer_threads=2)
    assert storage.transfer_threads == 2
    other = tmp_path / "elsewhere"
    other.mkdir()
    locations = RestoreLocations(storage, allowed=(str(other),))
    assert locations.open(str(other)).transfer_threads == 2
    with pytest.raises(ValueError, match="at least 1"):
        LocalStorage(str(tmp_path), transfer_threads=0)


class MeetingStorage(LocalStorage):
    """Local storage whose first two file uploads, and first two downloads, wait for each other:
    they pass only if they move at once."""

    def __init__(self, root: str) -> None:
        super().__init__(root, transfer_threads=2)
        self.uploads, self.downloads = Concurrency(), Concurrency()
        self._meetings = {"upload": threading.Barrier(2), "download": threading.Barrier(2)}
        self._calls = {"upload": 0, "download": 0}
        self._lock = threading.Lock()

    def put_file(self, path: str, local_path: str) -> StreamHandle:
        with self.uploads:
            self._meet("upload")
            return super().put_file(path, local_path)

    def download(self, path: str, local_path: str, size: int | None = None) -> None:
        with self.downloads:
            self._meet("download")
            super().download(path, local_path, size)

    def _meet(self, kind: str) -> None:
        with self._lock:
            self._calls[kind] += 1
            first_two = self._calls[kind] <= 2
        if first_two:
            self._meetings[kind].wait(WAIT_S)


def test_an_incremental_checkpoint_uploads_and_its_restore_downloads_files_together(tmp_path, make_manager):
    catalog = JobCatalog(RocksDBStore(str(tmp_path / "data")))
    job, _ = catalog.create("orders", 128)
    job.register_state(StateDescriptor("v", "value"))
    storage = MeetingStorage(str(tmp_path / "cp"))
    manager = make_manager(catalog, storage)
    try:
        with job.transaction() as tx:
            for i in range(3000):
                tx.value("v").update(f"key-{i:06d}", os.urandom(200))
        manager.trigger("orders", 1)
        done = manager.complete("orders", 1)
        assert done.format == "incremental"
        assert storage.uploads.most == 2
        expected = dump(job)
        with job.transaction() as tx:
            tx.value("v").update("key-000001", b"changed after the checkpoint")
        manager.restore("orders", 1)
        assert dump(catalog.get("orders")) == expected
        assert storage.downloads.most == 2
    finally:
        catalog.close()
