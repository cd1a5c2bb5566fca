"""Domain errors of checkpointing and restore.

Each is a :class:`statehouse.protocol.errors.StateError` with a stable ``code``; the HTTP layer maps
codes to statuses in one place (``statehouse.app.problems.STATUS_BY_CODE``), and docs/api.md
says what each code means and what to do.
"""

from __future__ import annotations

from statehouse.protocol.errors import StateError


class CheckpointNotFound(StateError):
    code = "checkpoint_not_found"


class CheckpointConflict(StateError):
    code = "checkpoint_conflict"


class CheckpointNotReady(StateError):
    code = "checkpoint_not_ready"


class CheckpointFailed(StateError):
    code = "checkpoint_failed"


class RestoreIncomplete(StateError):
    code = "restore_incomplete"


class RestoreIncompatible(StateError):
    code = "restore_incompatible"


class SnapshotCorrupt(StateError):
    code = "snapshot_corrupt"


class InvalidLocation(StateError):
    code = "invalid_location"


class StorageUnavailable(StateError):
    code = "storage_unavailable"
