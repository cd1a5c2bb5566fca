"""A heap checkpoint written as a changelog, read back: its base merged with its deltas.

A delta is a full-format stream (:mod:`statehouse.snapshots.full_format`) whose sections hold,
for each key that changed since the checkpoint before it, the key's whole content as of the
delta's checkpoint: what the delta holds for a key replaces what the base (and the deltas
before) held. A key with no entries left is named by a *reset* record ``[table id, primary]``.
Reading some key groups fetches the same sections of the base and of every delta (ranged reads,
each checked) and applies the deltas to the base key group by key group, so a
reader sees the records the full format would have held: in table, primary and secondary order.
The server's restore and the Spark data source share this reader.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from statehouse.protocol.keygroups import KeyGroupRange
from statehouse.snapshots.errors import SnapshotCorrupt
from statehouse.snapshots.full_format import FetchedKeyGroups, SnapshotHeader, fetch_restrictions
from statehouse.snapshots.handles import ChangelogHandle, KeyGroupSection, StreamHandle
from statehouse.snapshots.storage.base import CheckpointStorage

RESET_RECORD_LENGTH = 2  # [table id, primary]: what follows replaces the key's content


@dataclass(frozen=True, slots=True)
class FetchedDelta:
    """The fetched sections of one delta, by key group, and its table names in id order."""

    tables: list[str]
    sections: dict[int, bytes]
    fetched: FetchedKeyGroups = field(repr=False)


@dataclass(frozen=True, slots=True)
class FetchedChangelog(FetchedKeyGroups):
    """Some key groups of a changelog checkpoint: the base's sections, each read with the deltas
    applied. ``header`` is the newest stream's (the tables and states as of the checkpoint)."""

    base_tables: list[str] = field(default_factory=list)
    deltas: list[FetchedDelta] = field(default_factory=list)

    def _section(self, kg: int, section: bytes, use_list: bool = True) -> list[Any]:
        base = FetchedKeyGroups._section(self, kg, section, use_list)  # (a slots dataclass: no bare super())
        changes = [
            (d.tables, d.fetched._section(kg, d.sections[kg], use_list)) for d in self.deltas if kg in d.sections
        ]
        if not any(records for _tables, records in changes):
            return self._renumbered(kg, base, self.base_tables, use_list)
        ids = {name: i for i, name in enumerate(self.header.tables)}
        # (table id, primary) -> the records the newest delta naming it holds
        replaced: dict[tuple[int, bytes], list[Any]] = {}
        try:
            for names, records in changes:
                named: set[tuple[int, bytes]] = set()  # the keys this delta replaces
                for record in records:
                    table_id = ids.get(names[record[0]])
                    if table_id is None:
                        raise SnapshotCorrupt(
                            f"a delta of key group {kg} names table {names[record[0]]!r}, not in the newest header"
                        )
                    key = (table_id, record[1])
                    if key not in named:
                        named.add(key)
                        replaced[key] = []
                    if len(record) != RESET_RECORD_LENGTH:
                        replaced[key].append(_with_id(record, table_id, use_list))
            gone: dict[int, set[bytes]] = {}
            for table_id, primary in replaced:
                gone.setdefault(table_id, set()).add(primary)
            nothing: set[bytes] = set()
            base = self._renumbered(kg, base, self.base_tables, use_list)
            kept = [r for r in base if r[1] not in gone.get(r[0], nothing)]
        except (TypeError, IndexError, KeyError) as exc:
            raise SnapshotCorrupt(f"key group {kg}: a delta does not apply to its base: {exc}") from None
        # The base's records kept are one sorted run, which the sort keeps as such (it only sorts the
        # deltas' records and merges them in); its comparisons never reach a value, since no two
        # records share table, primary and secondary.
        kept.extend(record for records in replaced.values() for record in records)
        kept.sort()
        return kept

    def _renumbered(self, kg: int, records: list[Any], names: list[str], use_list: bool) -> list[Any]:
        """Records of a stream whose table ids are those of ``names``, under the header's ids."""
        tables = list(self.header.tables)
        if names == tables[: len(names)]:
            return records  # tables are only ever added after the base: its ids stay
        ids = {name: i for i, name in enumerate(tables)}
        try:
            kept = [(ids.get(names[r[0]]), r) for r in records]
        except (TypeError, IndexError) as exc:
            raise SnapshotCorrupt(f"key group {kg} section is unreadable: {exc}") from None
        return sorted(
            (_with_id(r, table_id, use_list) for table_id, r in kept if table_id is not None),
            key=lambda r: (r[0], r[1], r[2]),
        )


def _with_id(record: Any, table_id: int, use_list: bool) -> Any:
    if record[0] == table_id:
        return record
    return [table_id, *record[1:]] if use_list else (table_id, *record[1:])


@dataclass(frozen=True, slots=True)
class FetchedChains(FetchedKeyGroups):
    """Some key groups of a changelog of several chains: each key group read from its chain's."""

    by_key_group: dict[int, FetchedChangelog] = field(default_factory=dict)

    def _section(self, kg: int, section: bytes, use_list: bool = True) -> list[Any]:
        return self.by_key_group[kg]._section(kg, section, use_list)


def section_lengths(handle: ChangelogHandle, key_group: int) -> int:
    """The bytes a read of ``key_group`` fetches: its section in its chain's base and deltas."""
    return sum(stream.offsets.section(key_group).length for stream in handle.chain_of(key_group).streams())


def fetch_changelog(storage: CheckpointStorage, handle: ChangelogHandle, wanted: KeyGroupRange) -> FetchedKeyGroups:
    """Fetch ``wanted``'s sections of each chain's base and deltas (the handle's paths as the
    storage reads them), several streams at once (the storage's transfers)."""
    chains = [c for c in (chain.restricted(wanted) for chain in handle.chains) if c is not None]
    if not chains:
        chains = [handle.chains[0]]  # nothing wanted: the header alone
    streams = [h for chain in chains for h in chain.streams()]
    # A file several chains name (a delta written after their bases) is read once for them all.
    shared: dict[tuple[StreamHandle, KeyGroupSection], list[int]] = {}
    for i, h in enumerate(streams):
        shared.setdefault((h.stream, h.header), []).append(i)
    files = list(shared.values())
    by_file = storage.transfer(lambda f: fetch_restrictions(storage, [streams[i] for i in f], wanted), files)
    placed = {i: part for f, parts in zip(files, by_file, strict=True) for i, part in zip(f, parts, strict=True)}
    fetched = [placed[i] for i in range(len(streams))]
    read: list[FetchedChangelog] = []
    for chain in chains:
        base, deltas, fetched = fetched[0], fetched[1 : len(chain.streams())], fetched[len(chain.streams()) :]
        header: SnapshotHeader = (deltas[-1] if deltas else base).header
        read.append(
            FetchedChangelog(
                header,
                base.sections,
                list(base.header.tables),
                [FetchedDelta(list(d.header.tables), dict(d.sections), d) for d in deltas],
            )
        )
    if len(read) == 1:
        return read[0]
    # Every chain ends with the stream of the checkpoint itself: one header, one numbering of tables.
    header = read[0].header
    if any(r.header.tables != header.tables for r in read):
        raise SnapshotCorrupt("the chains of a changelog end with streams of different tables")
    sections = sorted((kg, s) for r in read for kg, s in r.sections)
    return FetchedChains(header, sections, {kg: r for r in read for kg, _s in r.sections})
