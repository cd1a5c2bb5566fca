"""An incremental RocksDB part read back: the one reader a server's restore and the Spark data
source share (a checkpoint reader without a server installs the client distribution's
``checkpoint`` extra, which brings rocksdict).

A part's handle records each table file's key groups (:meth:`IncrementalHandle.files_for`), so
a read of some key groups downloads only the files that can hold them, plus the small private
ones, and rebuilds the MANIFEST from those (RocksDB's repair: every file present at level 0,
where reads resolve a key's versions by sequence number, as in the part's own database). The files are opened
read-only, the database's recorded max parallelism is checked against the part's metadata, and
each table's keys of the wanted key groups are cut back by the backend's key layout
(:mod:`statehouse.snapshots.stored.keys`): one bounded scan per table, as every key group range
is one byte range.
"""

from __future__ import annotations

import logging
import os
import shutil
from collections.abc import Iterator, Sequence
from itertools import islice
from typing import TYPE_CHECKING, Any, cast

from statehouse.protocol.keygroups import KeyGroupRange
from statehouse.snapshots.errors import SnapshotCorrupt
from statehouse.snapshots.handles import IncrementalHandle, StreamHandle
from statehouse.snapshots.metadata import SnapshotPart
from statehouse.snapshots.storage.base import CheckpointStorage
from statehouse.snapshots.stored.keys import (
    DEFAULT_FAMILY,
    MAX_PARALLELISM_KEY,
    column_family,
    key_group_prefix,
    key_group_prefix_width,
    prefix_successor,
    split_key,
)
from statehouse.snapshots.stored.record_columns import Bytes, Groups, bulk_decoding, split_stored_keys

if TYPE_CHECKING:
    from rocksdict import Options, Rdict

logger = logging.getLogger(__name__)

# (key group, primary, secondary, stored value) of one table
Record = tuple[int, bytes, bytes, bytes]


def incremental_handle(part: SnapshotPart) -> IncrementalHandle:
    """The part's keyed handle, which must be an incremental one."""
    keyed = part.metadata.keyed
    if not isinstance(keyed, IncrementalHandle):
        raise SnapshotCorrupt(
            f"part {part.directory} is recorded as {part.metadata.format} but holds no incremental handle"
        )
    return keyed


def _options() -> Options:
    from rocksdict import Options

    options = Options(raw_mode=True)  # the backend stores bytes as they are
    options.create_if_missing(True)
    options.create_missing_column_families(True)
    options.set_disable_auto_compactions(True)  # read once, then removed: nothing to compact
    return options


def _rebuild_manifest(path: str, tables: dict[str, bool]) -> list[str]:
    """Make a database whose MANIFEST lists table files that are not there openable from the
    files that are; a table none of whose files is present gets an empty column family. Returns
    the table files the new MANIFEST lists: a file repair could not read is set aside, not
    listed, so the caller checks."""
    from rocksdict import Rdict

    options = _options()
    Rdict.repair(path, options)
    families = {cf: options for cf in Rdict.list_cf(path, options) if cf != DEFAULT_FAMILY}
    families.update({column_family(t): options for t in tables})
    db = Rdict(path, options, column_families=families)
    try:
        return sorted(os.path.basename(f["name"]) for f in db.live_files())
    finally:
        db.close()


class IncrementalPartReader:
    """The ``wanted`` key groups of one incremental part, downloaded into ``directory`` (which
    the caller owns and removes) and opened read-only: :meth:`download`, then, inside ``with``
    (which opens and closes the database), :meth:`records` per table. A restore downloads every
    part first and opens one at a time as it loads."""

    def __init__(self, directory: str, part: SnapshotPart, wanted: KeyGroupRange) -> None:
        self.directory = directory
        self.handle = incremental_handle(part)
        self.max_parallelism = part.metadata.max_parallelism
        self.wanted = part.metadata.key_group_range.intersection(wanted)
        self._db: Rdict | None = None
        self._families: dict[str, Any] = {}

    @classmethod
    def download(
        cls, storage: CheckpointStorage, part: SnapshotPart, wanted: KeyGroupRange, directory: str
    ) -> IncrementalPartReader:
        """Download (verified) the files of ``part`` that can hold ``wanted``'s key groups into
        the empty ``directory``, ready to open."""
        reader = cls(directory, part, wanted)
        handle = reader.handle
        every = {**handle.shared, **handle.private}
        fetched = handle.files_for(reader.wanted)

        def download(files: dict[str, StreamHandle]) -> None:
            def one(name: str) -> None:
                storage.download_verified(files[name].under(part.directory), os.path.join(directory, name))

            storage.transfer(one, list(files))

        download(fetched)
        if len(fetched) < len(every):
            present = _rebuild_manifest(directory, handle.tables)
            if any(n.endswith(".sst") and n not in present for n in fetched):
                # RocksDB's repair sets aside a table file it cannot place: one a load ingested
                # names no column family until a compaction rewrites it. Read the whole part.
                logger.info("part %s: reading every file, repair could not place some", part.directory)
                shutil.rmtree(directory)  # what repair made of it too
                os.mkdir(directory)
                download(every)
        return reader

    def open(self) -> None:
        """Open the downloaded files read-only; refuses a database that is not the part's."""
        from rocksdict import AccessType, Rdict

        options = _options()
        try:
            families = {cf: options for cf in Rdict.list_cf(self.directory, options) if cf != DEFAULT_FAMILY}
            self._db = Rdict(self.directory, options, column_families=families, access_type=AccessType.read_only())
            stored = self._db.get(MAX_PARALLELISM_KEY)
        except Exception as exc:  # rocksdict raises bare Exceptions (a missing column family, a torn file)
            self.close()
            raise SnapshotCorrupt(f"an incremental part's database cannot be read: {exc}") from exc
        if stored is None or int(stored) != self.max_parallelism:
            self.close()
            raise SnapshotCorrupt(
                f"an incremental part's database records max parallelism {stored!r}, its metadata "
                f"{self.max_parallelism}: they disagree"
            )
        self._families = {
            t: self._db.get_column_family(column_family(t)) for t in self.handle.tables if column_family(t) in families
        }

    def tables(self) -> dict[str, bool]:
        """The part's keyed tables, name -> nested."""
        return dict(self.handle.tables)

    def records(self, table: str) -> Iterator[Record]:
        """``table``'s entries in the wanted key groups, in key (so key group) order; the
        database is open."""
        width = key_group_prefix_width(self.max_parallelism)
        nested = self.handle.tables.get(table, False)
        for key, value in self.entries(table):
            yield (*split_key(key, width, nested), value)

    def table_records(self, table: str, size: int) -> Iterator[tuple[Groups, Bytes, Bytes, Sequence[bytes]]]:
        """:meth:`records` as columns, ``size`` entries at a time: key groups, primaries,
        secondaries, values (what a reader builds a table from without a step per record)."""
        width = key_group_prefix_width(self.max_parallelism)
        nested = self.handle.tables.get(table, False)
        entries = self.entries(table)
        while True:
            with bulk_decoding():
                chunk = list(islice(entries, size))
                if not chunk:
                    return
                keys, values = zip(*chunk, strict=True)
            yield (*split_stored_keys(keys, width, nested), values)

    def entries(self, table: str) -> Iterator[tuple[bytes, bytes]]:
        """:meth:`records` as the database stores them: ``(key, value)`` in ascending key order,
        each key in the RocksDB backend's layout for this max parallelism. RocksDB's own iterator
        (no Python step per entry); consume it while the database is open."""
        from rocksdict import ReadOptions

        family = self._families.get(table)
        if family is None or not len(self.wanted):
            return iter(())
        width = key_group_prefix_width(self.max_parallelism)
        lower = key_group_prefix(self.wanted.start, width)
        upper = prefix_successor(key_group_prefix(self.wanted.end, width))
        read_options = ReadOptions()
        read_options.set_iterate_lower_bound(lower)
        if upper is not None:
            read_options.set_iterate_upper_bound(upper)
        return cast(Iterator[tuple[bytes, bytes]], family.items(from_key=lower, read_opt=read_options))

    def close(self) -> None:
        self._families.clear()
        if self._db is not None:
            self._db.close()
            self._db = None

    def __enter__(self) -> IncrementalPartReader:
        self.open()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
