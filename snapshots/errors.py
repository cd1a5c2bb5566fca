"""Domain errors of checkpointing and restore.

Each is a :class:`backends.errors.StateError` with a stable ``code``; the HTTP layer maps
codes to statuses in one place. Intended mapping:

=====================  ======  =====================================================
code                   status  meaning
=====================  ======  =====================================================
checkpoint_not_found   404     no such checkpoint/savepoint (in memory or in storage)
checkpoint_conflict    409     the id exists already, or is not newer than the latest
checkpoint_not_ready   409     ``complete`` while the upload is still running (retry)
checkpoint_failed      409     ``complete`` of a failed or aborted checkpoint
restore_incomplete     409     the parts found do not cover this replica's key groups
restore_incompatible   409     the snapshot cannot be restored here (e.g. its max
                               parallelism is below the replica count)
snapshot_corrupt       422     a file is missing, truncated or fails its checksum
invalid_location       400     a storage location that cannot be parsed
storage_unavailable    503     checkpoint storage unreachable or failing (retry later)
=====================  ======  =====================================================
"""

from __future__ import annotations

from statehouse.backends.errors import StateError


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
