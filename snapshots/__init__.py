"""Checkpoints and savepoints of Statehouse jobs, no HTTP inside.

What does not depend on a backend: checkpoint storage (local directory, S3, memory) and where
restores may read (:mod:`~statehouse.snapshots.storage`), the canonical snapshot format and
the handles that locate its bytes, the shared-state registry and retention, a small strategy
runner, the catalog of what storage holds, and restore with rescaling.
:class:`CheckpointManager` is the entry point the service calls. A backend's own strategies
live with the backend (``statehouse.backends.rocksdb.snapshot``).

Exports load lazily: a backend imports ``statehouse.snapshots.strategy`` without pulling in
the manager (which imports the backends).
"""

from __future__ import annotations

from statehouse.backends.lazy import lazy_exports

_EXPORTS = {
    "CheckpointConflict": "statehouse.snapshots.errors",
    "CheckpointFailed": "statehouse.snapshots.errors",
    "CheckpointInfo": "statehouse.snapshots.info",
    "CheckpointManager": "statehouse.snapshots.manager",
    "CheckpointNotFound": "statehouse.snapshots.errors",
    "CheckpointNotReady": "statehouse.snapshots.errors",
    "CheckpointStorage": "statehouse.snapshots.storage",
    "InvalidLocation": "statehouse.snapshots.errors",
    "RestoreIncompatible": "statehouse.snapshots.errors",
    "RestoreIncomplete": "statehouse.snapshots.errors",
    "RestoreInfo": "statehouse.snapshots.info",
    "SnapshotCorrupt": "statehouse.snapshots.errors",
    "StorageUnavailable": "statehouse.snapshots.errors",
    "open_storage": "statehouse.snapshots.storage",
}

__all__ = sorted(_EXPORTS)

__getattr__ = lazy_exports(__name__, _EXPORTS)
