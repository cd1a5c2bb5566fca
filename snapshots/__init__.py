"""Checkpoints and savepoints of Statehouse jobs, no HTTP inside.

Checkpoint storage (local directory, S3, memory), the full (canonical) and incremental
(RocksDB) snapshot formats, the shared-state registry and retention, and restore with
rescaling. :class:`CheckpointManager` is the entry point the service calls.
"""

from statehouse.snapshots.errors import (
    CheckpointConflict,
    CheckpointFailed,
    CheckpointNotFound,
    CheckpointNotReady,
    InvalidLocation,
    RestoreIncompatible,
    RestoreIncomplete,
    SnapshotCorrupt,
    StorageUnavailable,
)
from statehouse.snapshots.manager import CheckpointInfo, CheckpointManager, RestoreInfo
from statehouse.snapshots.storage import CheckpointStorage, open_storage

__all__ = [
    "CheckpointConflict",
    "CheckpointFailed",
    "CheckpointInfo",
    "CheckpointManager",
    "CheckpointNotFound",
    "CheckpointNotReady",
    "CheckpointStorage",
    "InvalidLocation",
    "RestoreIncompatible",
    "RestoreIncomplete",
    "RestoreInfo",
    "SnapshotCorrupt",
    "StorageUnavailable",
    "open_storage",
]
