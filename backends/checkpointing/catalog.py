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
from statehouse.snapshots.catalog import find_parts, job_listing, read_metadata
from statehouse.snapshots.layout import (
    SnapshotKind,
    metadata_name,
    parse_job_listing,
    parse_snapshot_dir_ids,
    part_name,
    snapshot_dir,
)
from statehouse.snapshots.metadata import SnapshotMetadata, SnapshotPart
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

    def listing(self, job: str) -> builtins.list[str]:
        """Every file of ``job`` in storage, relative to its directory: what :meth:`history` and
        :meth:`other_layouts` read, listed once when a caller needs both."""
        return job_listing(self.storage, job)

    def history(self, job: str, listing: builtins.list[str] | None = None) -> JobHistory:
        """What storage holds of ``job`` for this replica: the ids no new checkpoint may take, this
        replica's completed parts (their metadata read; an unreadable one is skipped with a warning),
        the completed checkpoint parts of other replica counts, and those of them at this index (read too).
        ``listing``: the job's :meth:`listing`, when the caller has it."""
        listing = self.listing(job) if listing is None else listing
        # Ids in use: this replica's own parts (complete or not), and every snapshot that was
        # completed under another replica count (ids keep increasing across a rescale).
        # Other replicas' parts of this layout are the same checkpoints, not conflicts.
        history = JobHistory(known_ids=parse_snapshot_dir_ids(listing, self.part))
        index, count = self.replica
        wanted: builtins.list[tuple[SnapshotKind, int, int, int]] = []
        for kind, checkpoint_id, part_index, part_count in parse_job_listing(listing):
            lineage = part_index == index and part_count != count and kind == "checkpoint"
            if part_count != count:
                history.known_ids.add(checkpoint_id)
                if kind == "checkpoint":
                    history.foreign.setdefault(checkpoint_id, []).append((part_index, part_count))
            if (part_index, part_count) == self.replica or lineage:
                wanted.append((kind, checkpoint_id, part_index, part_count))
        for (_kind, checkpoint_id, _index, part_count), metadata in zip(wanted, self._read(job, wanted), strict=True):
            if metadata is not None:
                (history.completed if part_count == count else history.lineage)[checkpoint_id] = metadata
        return history

    def other_layouts(self, job: str, listing: builtins.list[str] | None = None) -> builtins.list[SnapshotMetadata]:
        """The snapshots of the job completed under another replica count (every part's
        ``_metadata`` there): restorable on this layout too. Their replica 0's metadata each.
        ``listing``: the job's :meth:`listing`, when the caller has it."""
        parts: dict[tuple[SnapshotKind, int, int], set[int]] = {}
        for kind, checkpoint_id, part_index, part_count in parse_job_listing(
            self.listing(job) if listing is None else listing
        ):
            if part_count != self.replica[1]:
                parts.setdefault((kind, checkpoint_id, part_count), set()).add(part_index)
        # Complete ones only: a part gone (retention removing it) or never completed is not restorable.
        wanted = [
            (kind, i, 0, count) for (kind, i, count), indexes in sorted(parts.items()) if indexes == set(range(count))
        ]
        return [metadata for metadata in self._read(job, wanted) if metadata is not None]

    def _read(
        self, job: str, parts: builtins.list[tuple[SnapshotKind, int, int, int]]
    ) -> builtins.list[SnapshotMetadata | None]:
        """The ``_metadata`` of each ``(kind, id, index, count)`` part, read several at once (each
        is a request to storage: one at a time, a listing after a rescale waits out each in turn);
        ``None`` for one that is unreadable, skipped with a warning."""

        def read(part: tuple[SnapshotKind, int, int, int]) -> SnapshotMetadata | None:
            kind, checkpoint_id, index, count = part
            try:
                return read_metadata(self.storage, snapshot_dir(job, checkpoint_id, kind), metadata_name(index, count))
            except StateError as exc:
                log.warning("ignoring checkpoint %s of job %s: %s", checkpoint_id, job, exc)
                return None

        return self.storage.transfer(read, parts)

    def parts(self, job: str, checkpoint_id: int | None) -> tuple[str, builtins.list[SnapshotPart]]:
        """The directory of checkpoint or savepoint ``checkpoint_id``, else of the latest completed
        checkpoint of the job (any replica layout), and the snapshot's completed parts there."""
        return find_parts(self.storage, job, checkpoint_id)
