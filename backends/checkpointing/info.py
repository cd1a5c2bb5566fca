"""What the service reports about a checkpoint or a restore: one definition of each report.

The HTTP layer derives its response schemas from these (``statehouse.app.models``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from statehouse.snapshots.layout import SnapshotKind
from statehouse.snapshots.metadata import SnapshotFormat, SnapshotMetadata

CheckpointStatus = Literal["in_progress", "uploaded", "completed", "failed", "aborted"]
PENDING: tuple[CheckpointStatus, ...] = ("in_progress", "uploaded")


@dataclass
class CheckpointInfo:
    """This replica's view of one checkpoint or savepoint."""

    job: str
    checkpoint_id: int
    kind: SnapshotKind
    status: CheckpointStatus
    error: str | None = None
    bytes_uploaded: int = 0  # bytes this replica uploaded for it
    bytes_reused: int = 0  # bytes referenced from earlier checkpoints (incremental)
    duration_ms: int = 0
    location: str = ""
    format: SnapshotFormat = "full"
    replica_index: int = 0
    replica_count: int = 1
    key_group_range: tuple[int, int] = (0, -1)
    metadata: dict[str, Any] = field(default_factory=dict)  # given at trigger, e.g. the coordinator's batch id
    committed_epoch: int = 0  # what the frozen state holds (once uploaded): the last committed epoch
    committed_batch: int | None = None  # and the micro-batch it applied

    @classmethod
    def completed(cls, metadata: SnapshotMetadata, location: str) -> CheckpointInfo:
        """The report of a completed part, from its ``_metadata``."""
        return cls(
            job=metadata.job,
            checkpoint_id=metadata.checkpoint_id,
            kind=metadata.kind,
            status="completed",
            bytes_uploaded=metadata.bytes_uploaded,
            bytes_reused=metadata.bytes_reused,
            duration_ms=metadata.duration_ms,
            location=location,
            format=metadata.format,
            replica_index=metadata.replica_index,
            replica_count=metadata.replica_count,
            key_group_range=(metadata.key_group_range.start, metadata.key_group_range.end),
            metadata=metadata.user_metadata,
            committed_epoch=metadata.committed_epoch,
            committed_batch=metadata.committed_batch,
        )


@dataclass
class RestoreInfo:
    """What one replica's restore of a job read and replaced."""

    job: str
    checkpoint_id: int
    kind: SnapshotKind
    format: SnapshotFormat
    location: str
    max_parallelism: int
    key_group_range: tuple[int, int]
    parts: list[str]  # the replica parts read, e.g. "replica-0-of-2"
    entries_restored: int
    bytes_read: int
    duration_ms: int
    aborted_checkpoints: list[int]  # this replica's pending checkpoints of the job, aborted first
