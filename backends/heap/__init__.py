"""Heap backend: state as Python dicts per key group, copy-on-write for snapshots."""

from statehouse.backends.heap.partition import HeapPartition
from statehouse.backends.heap.store import HeapStore

__all__ = ["HeapPartition", "HeapStore"]
