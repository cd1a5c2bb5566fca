"""The parts behind the ``Job`` and ``RocksDBPartition`` facades, each on its own contract: the
state registry says what a registration changed (the job counts only real changes), the degrade
policy refuses writes and registers a database that ran out of space with its volume, and a
database instance is never closed under a lease and reopens with its data."""

from __future__ import annotations

import errno

import pytest

from statehouse.backends.errors import InsufficientStorage, JobReplaced
from statehouse.backends.heap.partition import HeapPartition
from statehouse.backends.job import Job
from statehouse.backends.rocksdb.database import db_options
from statehouse.backends.rocksdb.degrade import DegradePolicy
from statehouse.backends.rocksdb.instance import DatabaseInstance
from statehouse.backends.rocksdb.pool import OpenInstances
from statehouse.backends.rocksdb.space import DataVolume
from statehouse.snapshots.stored.descriptors import StateDescriptor
from statehouse.snapshots.stored.ttl import TtlConfig


def test_the_registry_says_what_a_registration_changed_and_the_job_counts_only_changes():
    job = Job("j", HeapPartition(128))
    states = job.states
    before = job.changes
    minute, hour = (
        StateDescriptor("v", "value", ttl=TtlConfig(60_000)),
        StateDescriptor("v", "value", ttl=TtlConfig(3_600_000)),
    )
    assert states.register(minute, job.keyspace, loading=False) == "new"
    assert states.register(minute, job.keyspace, loading=False) == "unchanged"
    assert job.register_state(minute) is False
    assert job.changes == before  # the registry counts nothing (the job does); an equal registration changes nothing
    assert job.register_state(hour) is False
    assert job.changes == before + 1  # a compatible change is stored: staged views must replay
    assert job.descriptor("v") == hour and job.descriptors is states.descriptors
    job.drop_state("v")
    assert "v" not in job.partition.tables() and job.changes == before + 2


def test_a_retired_job_refuses_writes_and_a_revived_one_takes_them():
    job = Job("j", HeapPartition(128))
    job.register_state(StateDescriptor("v", "value"))
    job.retire()
    with pytest.raises(JobReplaced), job.transaction() as tx:
        tx.value("v").update("k", 1)
    job.revive()
    with job.transaction() as tx:
        tx.value("v").update("k", 1)
    with job.held_if_free() as held:
        assert held  # nobody else holds the lock, and the partition is open


def test_a_write_that_runs_out_of_space_degrades_and_registers_with_the_volume(tmp_path):
    volume = DataVolume(str(tmp_path), 0)
    policy = DegradePolicy(volume)
    instance = object()  # what the volume asks to recover: only its identity matters here

    def full() -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    with pytest.raises(InsufficientStorage, match="the write was not applied"):
        policy.writing(instance, full)
    assert policy.degraded and volume.degraded_count == 1 and not volume.ready
    with pytest.raises(InsufficientStorage, match="serves reads but takes no writes"):
        policy.require_writable(reserve=False)  # not even a write that frees space
    policy.clear(instance)
    assert not policy.degraded and volume.degraded_count == 0
    policy.require_writable(reserve=True)

    def broken() -> None:
        raise ValueError("not about space")

    with pytest.raises(ValueError):
        policy.writing(instance, broken)
    assert not policy.degraded  # only a lack of space degrades


def test_below_the_reserve_only_writes_that_free_space_go_on(tmp_path):
    volume = DataVolume(str(tmp_path), 1 << 62)  # more than any disk has free
    policy = DegradePolicy(volume)
    with pytest.raises(InsufficientStorage, match="below the reserve"):
        policy.require_writable(reserve=True)
    policy.require_writable(reserve=False)
    assert not policy.degraded  # refused before RocksDB: nothing failed, nothing to recover


def test_an_instance_under_a_lease_stays_open_and_an_idle_one_reopens_with_its_data(tmp_path):
    pool = OpenInstances(1)
    instance = DatabaseInstance(str(tmp_path / "db"), 128, db_options(), pool, DegradePolicy(None))
    instance.acquire()
    instance.add_table("v", nested=False)
    instance.db.put(b"k", b"1")
    assert not instance.close_idle() and instance.is_open  # leased
    instance.release()
    assert instance.close_idle() and not instance.is_open and len(pool) == 0
    instance.acquire()  # reopens
    try:
        assert instance.is_open and len(pool) == 1
        assert instance.db.get(b"k") == b"1" and instance.nested == {"$meta": False, "v": False}
        assert instance.max_parallelism == 128
    finally:
        instance.release()
    instance.close()
    with pytest.raises(RuntimeError, match="is closed"):
        instance.acquire()
    instance.reopen()
    assert instance.is_open and "v" in instance.families
    instance.close()
