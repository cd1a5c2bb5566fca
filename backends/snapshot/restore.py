"""Reading a snapshot part back, by its format: the canonical full format's (here: ranged reads
of just the wanted key-group sections), a heap checkpoint's changelog (the same sections of its
base and deltas, applied in order) and RocksDB's incremental one
(:class:`~statehouse.backends.rocksdb.snapshot.IncrementalPartRestore`). The restore above
(``statehouse.backends.checkpointing.restore``) asks :func:`part_reader` for a part's reader and
loads what it fetches, whichever format and backend wrote it.
"""

from __future__ import annotations

from collections.abc import Callable

from statehouse.backends.base.partition import Guard, StorePartition
from statehouse.backends.base.snapshot import PartReader
from statehouse.backends.rocksdb.snapshot import INCREMENTAL_RESTORE
from statehouse.protocol.keygroups import KeyGroupRange
from statehouse.snapshots.changelog import fetch_changelog, section_lengths
from statehouse.snapshots.errors import SnapshotCorrupt
from statehouse.snapshots.full_format import FetchedKeyGroups, fetch_key_groups
from statehouse.snapshots.handles import ChangelogHandle, KeyGroupsHandle
from statehouse.snapshots.metadata import SnapshotFormat, SnapshotPart
from statehouse.snapshots.storage.base import CheckpointStorage


def key_groups_handle(part: SnapshotPart) -> KeyGroupsHandle:
    """The part's keyed handle, which must be a full one, its stream's path root-relative."""
    keyed = part.metadata.keyed
    if not isinstance(keyed, KeyGroupsHandle):
        raise SnapshotCorrupt(f"part {part.directory} is recorded as {part.metadata.format} but holds no full handle")
    return keyed.under(part.directory)


def _chunks(
    part: SnapshotPart, wanted: KeyGroupRange, max_bytes: int, length: Callable[[int], int]
) -> list[KeyGroupRange]:
    """``wanted`` ∩ the part's key groups cut into runs of about ``max_bytes`` of sections each."""
    share = part.metadata.key_group_range.intersection(wanted)
    if not len(share):
        return []
    chunks, start, size = [], share.start, 0
    for kg in share:
        section = length(kg)
        if size and size + section > max_bytes:
            chunks.append(KeyGroupRange(start, kg - 1))
            start, size = kg, 0
        size += section
    chunks.append(KeyGroupRange(start, share.end))
    return chunks


class FetchedFullPart:
    """Verified, still compressed sections of some key groups of a full part, in memory."""

    def __init__(self, fetched: FetchedKeyGroups, work_dir: str) -> None:
        self.fetched = fetched
        self.work_dir = work_dir

    def tables(self) -> dict[str, bool]:
        return dict(self.fetched.header.tables)

    def load_into(self, partition: StorePartition, guard: Guard) -> int:
        fetched = self.fetched
        return partition.load_sections(list(fetched.header.tables), fetched.section_tuples(), self.work_dir, guard)

    def release(self) -> None:
        """Nothing on disk; the sections go with this object."""


class FullPartRestore(PartReader):
    """The canonical format's restore (heap checkpoints, RocksDB full checkpoints, savepoints):
    the header and one ranged read of the wanted key groups' sections, each checked."""

    def chunks(self, part: SnapshotPart, wanted: KeyGroupRange, max_bytes: int) -> list[KeyGroupRange]:
        """The handle knows each section's length before anything is read."""
        offsets = key_groups_handle(part).offsets
        return _chunks(part, wanted, max_bytes, lambda kg: offsets.section(kg).length)

    def fetch(
        self, storage: CheckpointStorage, part: SnapshotPart, wanted: KeyGroupRange, work_dir: str
    ) -> FetchedFullPart:
        return FetchedFullPart(fetch_key_groups(storage, key_groups_handle(part), wanted), work_dir)


FULL_RESTORE = FullPartRestore()


def changelog_handle(part: SnapshotPart) -> ChangelogHandle:
    """The part's keyed handle, which must be a changelog, its streams' paths root-relative."""
    keyed = part.metadata.keyed
    if not isinstance(keyed, ChangelogHandle):
        raise SnapshotCorrupt(f"part {part.directory} is recorded as {part.metadata.format} but holds no changelog")
    return keyed.under(part.directory)


class ChangelogPartRestore(PartReader):
    """A heap checkpoint's changelog: the wanted key groups' sections of its base and of each
    delta, applied in order as they are read (:mod:`statehouse.snapshots.changelog`)."""

    def chunks(self, part: SnapshotPart, wanted: KeyGroupRange, max_bytes: int) -> list[KeyGroupRange]:
        handle = changelog_handle(part)
        return _chunks(part, wanted, max_bytes, lambda kg: section_lengths(handle, kg))

    def fetch(
        self, storage: CheckpointStorage, part: SnapshotPart, wanted: KeyGroupRange, work_dir: str
    ) -> FetchedFullPart:
        return FetchedFullPart(fetch_changelog(storage, changelog_handle(part), wanted), work_dir)


CHANGELOG_RESTORE = ChangelogPartRestore()

_READERS: dict[SnapshotFormat, PartReader] = {
    "full": FULL_RESTORE,
    "incremental": INCREMENTAL_RESTORE,
    "changelog": CHANGELOG_RESTORE,
}


def part_reader(part: SnapshotPart) -> PartReader:
    """The reader of ``part``'s format."""
    reader = _READERS.get(part.metadata.format)
    if reader is None:
        raise SnapshotCorrupt(f"part {part.directory} has an unknown format {part.metadata.format!r}")
    return reader
