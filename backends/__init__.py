"""Statehouse's state engine: Flink's keyed and operator state model, no HTTP inside.

Exports load lazily, so a heap-only process or a light module (``statehouse.backends.ttl``)
imports without pulling in RocksDB. Key-group math lives in ``statehouse.keygroups``, which
the client distribution ships too.
"""

from __future__ import annotations

from statehouse.backends.lazy import lazy_exports

_EXPORTS = {
    "HeapStore": "statehouse.backends.heap",
    "Job": "statehouse.backends.job",
    "JobCatalog": "statehouse.backends.catalog",
    "JobTransaction": "statehouse.backends.job",
    "ManualClock": "statehouse.backends.ttl",
    "RocksDBStore": "statehouse.backends.rocksdb",
    "StateDescriptor": "statehouse.backends.descriptors",
    "SystemClock": "statehouse.backends.ttl",
    "TtlConfig": "statehouse.backends.ttl",
}

__all__ = sorted(_EXPORTS)

__getattr__ = lazy_exports(__name__, _EXPORTS)
