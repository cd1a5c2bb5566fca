"""What checkpoint storage holds: the snapshots of a job, their parts, and their metadata.

Storage is the truth after a restart: this replica's completed parts are the
``_metadata.replica-<i>-of-<n>`` files it wrote, and ids only grow across a rescale, so the
parts written under another replica count take ids too.
"""

from __future__ import annotations

import builtins
import logging
from dataclasses import dataclass, field

from statehouse.backends.errors import StateError
from statehouse.snapshots.catalog import find_snapshot, job_listing, read_metadata
from statehouse.snapshots.layout import (
    SnapshotKind,
    metadata_name,
    parse_job_listing,
    parse_snapshot_dir_ids,
    part_name,
    snapshot_dir,
)
from statehouse.snapshots.metadata import SnapshotMetadata
from statehouse.snapshots.storage.base import CheckpointStorage

log = logging.getLogger(__name__)


@dataclass
class JobHistory:
    """One job's snapshots in storage, as this replica sees them."""

    known_ids: set[int] = field(default_factory=set)  # ids no new checkpoint may take
    completed: dict[int, SnapshotMetadata] = field(default_factory=dict)  # this replica's parts
    # completed checkpoint parts written under another replica count: id -> [(index, count)]
    foreign: dict[int, builtins.list[tuple[int, int]]] = field(default_factory=dict)
    # Those of them written at this replica's index (the same replica before a live rescale, whose
    # database it still holds): its lineage, whose shared files its next checkpoint may reuse.
    lineage: dict[int, SnapshotMetadata] = field(default_factory=dict)


class SnapshotCatalog:
    """This replica's reading of one checkpoint storage."""

    def __init__(self, storage: CheckpointStorage, replica_index: int, replica_count: int) -> None:
        self.storage = storage
        self.replica = (replica_index, replica_count)
        self.part = part_name(replica_index, replica_count)

    def location(self, directory: str) -> str:
        return f"{self.storage.location.rstrip('/')}/{directory}"

    def history(self, job: str) -> JobHistory:
        """What storage holds of ``job`` for this replica: the ids no new checkpoint may take, this
        replica's completed parts (their metadata read; an unreadable one is skipped with a warning),
        the completed checkpoint parts of other replica counts, and those of them at this index (read too)."""
        listing = job_listing(self.storage, job)
        # Ids in use: this replica's own parts (complete or not), and every snapshot that was
        # completed under another replica count (ids keep increasing across a rescale).
        # Other replicas' parts of this layout are the same checkpoints, not conflicts.
        history = JobHistory(known_ids=parse_snapshot_dir_ids(listing, self.part))
        index, count = self.replica
        for kind, checkpoint_id, part_index, part_count in parse_job_listing(listing):
            lineage = part_index == index and part_count != count and kind == "checkpoint"
            if part_count != count:
                history.known_ids.add(checkpoint_id)
                if kind == "checkpoint":
                    history.foreign.setdefault(checkpoint_id, []).append((part_index, part_count))
            if (part_index, part_count) != self.replica and not lineage:
                continue
            directory = snapshot_dir(job, checkpoint_id, kind)
            try:
                metadata = read_metadata(self.storage, directory, metadata_name(part_index, part_count))
            except StateError as exc:
                log.warning("ignoring checkpoint %s of job %s: %s", checkpoint_id, job, exc)
                continue
            (history.lineage if lineage else history.completed)[checkpoint_id] = metadata
        return history

    def other_layouts(self, job: str) -> builtins.list[SnapshotMetadata]:
        """The snapshots of the job completed under another replica count (every part's
        ``_metadata`` there): restorable on this layout too. Their replica 0's metadata each."""
        parts: dict[tuple[SnapshotKind, int, int], set[int]] = {}
        for kind, checkpoint_id, part_index, part_count in parse_job_listing(job_listing(self.storage, job)):
            if part_count != self.replica[1]:
                parts.setdefault((kind, checkpoint_id, part_count), set()).add(part_index)
        found = []
        for (kind, checkpoint_id, count), indexes in sorted(parts.items()):
            if indexes != set(range(count)):
                continue  # some part is gone (retention removing it) or never completed: not restorable
            try:
                found.append(
                    read_metadata(self.storage, snapshot_dir(job, checkpoint_id, kind), metadata_name(0, count))
                )
            except StateError as exc:
                log.warning("ignoring checkpoint %s of job %s: %s", checkpoint_id, job, exc)
        return found

    def find(self, job: str, checkpoint_id: int | None) -> str:
        """The directory of checkpoint or savepoint ``checkpoint_id``, else of the latest
        completed checkpoint of the job (any replica layout)."""
        return find_snapshot(self.storage, job, checkpoint_id)
