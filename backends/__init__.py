"""Statehouse's state engine: Flink's keyed and operator state model, no HTTP inside."""

from backends.catalog import JobCatalog
from backends.descriptors import StateDescriptor
from backends.heap import HeapStore
from backends.job import Job, JobTransaction
from backends.keygroups import KeyGroupRange
from backends.rocksdb import RocksDBStore
from backends.ttl import ManualClock, SystemClock, TtlConfig

__all__ = [
    "HeapStore",
    "Job",
    "JobCatalog",
    "JobTransaction",
    "KeyGroupRange",
    "ManualClock",
    "RocksDBStore",
    "StateDescriptor",
    "SystemClock",
    "TtlConfig",
]
