"""Statehouse's state engine: Flink's keyed and operator state model, no HTTP inside.

Exports load lazily, so light modules (``backends.keygroups``, used by the Spark client)
import without pulling in RocksDB.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "HeapStore": "backends.heap",
    "Job": "backends.job",
    "JobCatalog": "backends.catalog",
    "JobTransaction": "backends.job",
    "KeyGroupRange": "backends.keygroups",
    "ManualClock": "backends.ttl",
    "RocksDBStore": "backends.rocksdb",
    "StateDescriptor": "backends.descriptors",
    "SystemClock": "backends.ttl",
    "TtlConfig": "backends.ttl",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'backends' has no attribute {name!r}")
    return getattr(importlib.import_module(_EXPORTS[name]), name)
