"""Which keys of some key groups changed since a point in time: a pre-copy move's delta.

A live rescale that pre-copies (docs/rescale.md, "Pre-copy") loads the bulk of the moving key
groups from a checkpoint taken while writes go on, then, at the cut, only what changed since.
The old owner starts a :class:`ChangeTracker` under the job's lock before that checkpoint is
triggered, so every write after it is either in the checkpoint or noted here; at the cut (the key
groups frozen) each noted key's whole current content is the delta. Noting more than changed is
harmless (the delta carries current content); noting less would lose a write, so every keyed
write notes before it is written (``PartitionTransaction.commit``), and a change the tracker
cannot follow key by key (a state dropped, the job replaced by a restore) invalidates it: the
move then loads those key groups whole.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence

from statehouse.backends.base.partition import FlatChanges, RowChanges, WriteOp
from statehouse.backends.reserved import NON_KEYED_TABLES
from statehouse.protocol.keygroups import KeyGroupRange

log = logging.getLogger(__name__)

# A tracker that has noted this many keys stops noting and is invalid: a delta as large as the
# state it updates saves nothing over loading the key groups whole, and memory stays bounded.
MAX_TRACKED_KEYS = 2_000_000


class ChangeTracker:
    """The keys ``(table, key group, primary)`` of keyed tables written in ``ranges`` since the
    tracker started, named by ``token`` (a delta is only applied over a copy taken while the same
    tracker ran). The caller holds the job's lock for every call."""

    def __init__(self, token: str, ranges: Sequence[KeyGroupRange], max_keys: int = MAX_TRACKED_KEYS) -> None:
        self.token = token
        self.ranges = [r for r in ranges if len(r)]
        self._key_groups = frozenset(kg for r in self.ranges for kg in r)
        self.touched: set[tuple[str, int, bytes]] = set()
        # Catch-up rounds taken: ``touched`` holds what changed since the last one's keys were taken.
        self.round = 0
        self.invalid_reason: str | None = None
        self.max_keys = max_keys

    @property
    def valid(self) -> bool:
        return self.invalid_reason is None

    def invalidate(self, reason: str) -> None:
        """The changes cannot be told key by key from here on: the delta is not to be used."""
        if self.invalid_reason is None:
            log.info("change tracking %s stops: %s", self.token, reason)
            self.invalid_reason = reason
            self.touched = set()

    def take_round(self) -> set[tuple[str, int, bytes]]:
        """The keys noted in this round, and the next round begun with none: a catch-up's delta
        carries their content as it is when read; whatever is written after this is noted again."""
        touched, self.touched = self.touched, set()
        self.round += 1
        return touched

    def note(self, flat: Mapping[str, FlatChanges], ops: Iterable[WriteOp]) -> None:
        """A transaction's changes, before they are written."""
        if self.invalid_reason is not None or not self._key_groups:
            return
        key_groups, touched = self._key_groups, self.touched
        for table, changes in flat.items():
            if table in NON_KEYED_TABLES:
                continue
            if isinstance(changes, RowChanges):
                pairs: Iterable[tuple[int, bytes]] = zip(changes.key_groups, changes.primaries, strict=True)
            else:
                pairs = changes.keys()
            touched.update((table, kg, primary) for kg, primary in pairs if kg in key_groups)
        for op in ops:
            if op.key_group in key_groups and op.table not in NON_KEYED_TABLES:
                touched.add((op.table, op.key_group, op.primary))
        if len(touched) > self.max_keys:
            self.invalidate(f"more than {self.max_keys} keys changed")


# A key's whole content now, as a delta carries it: (key group, table, primary, [(secondary, value)]);
# no pair: the key holds nothing.
Changed = tuple[int, str, bytes, list[tuple[bytes, bytes]]]
