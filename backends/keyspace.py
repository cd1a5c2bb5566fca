"""Where a key lives: the one place that turns a key (of a state or a timer) into its key group,
checks that this replica owns it and that it fits the limits, and builds its stored key.

A :class:`KeySpace` is an immutable value held by the job (``Job.keyspace``): built from the
max parallelism, the replica's place among its replicas (so its owned ``KeyGroupRange``) and
the limits. It locates keys one at a time (a batch's operations, the one-key routes) and as
whole Arrow columns (the columnar doors), with the same rules and the same errors. A layout
that changes at run time replaces the job's value; requests that hold the old one finish with it.

A live rescale freezes the key groups it moves away (and the job's operator state): every
write a transaction makes is checked against the keyspace it began with (:meth:`KeySpace.write_guard`),
whatever door it came through, and one into a frozen key group is refused with a retryable
``rescale_in_progress``; reads go on.

Stored keys (the primary key of a row; a map entry adds its user key as the secondary)::

    state:  key field + namespace field              (``codec.encode_primary``)
    timer:  timestamp (8 bytes big-endian, sign bit flipped) + key type (1 byte) + the same

A field is a 4-byte big-endian length and the bytes (``codec.FIELD_HEADER_BYTES``); the
limits apply to whole fields, header included.
"""

from __future__ import annotations

import operator
import struct
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass, field
from itertools import islice
from typing import TypeAlias, TypeVar

import numpy as np
import pyarrow as pa

from statehouse.backends.columnar_codec import encode_primaries
from statehouse.backends.errors import KeyNotOwned, RescaleInProgress, StateError
from statehouse.backends.limits import Limits
from statehouse.backends.reserved import BROADCAST_TABLE, LIST_TABLE, NON_KEYED_TABLES
from statehouse.protocol.errors import InvalidArgument, InvalidKey
from statehouse.protocol.keygroups import KEY_TYPES, KeyGroupAssigner, KeyGroupRange, KeyType, operator_index
from statehouse.protocol.keygroups.columnar import BadRow, Utf8Column, key_groups, utf8_column
from statehouse.snapshots.stored.codec import FIELD_HEADER_BYTES, encode_key, encode_namespace

Key: TypeAlias = str | int
T = TypeVar("T")
_TS = struct.Struct(">Q")
TIMESTAMP_BYTES = _TS.size
_SIGN = 1 << 63
_SIGN_U64 = np.uint64(_SIGN)
# Operator state's tables: frozen whole while a job's replica is frozen for a move (operator state
# is redistributed when the move commits). The other non-keyed tables (metadata: epochs, state
# registrations; timer clocks) are not state a move carries, and stay writable.
_OPERATOR_TABLES = frozenset({LIST_TABLE, BROADCAST_TABLE})
# One tag byte per key type: a timer's identity includes its key's type ("7" and 7 are two timers).
_KEY_TYPE_TAGS = {kt: bytes([i]) for i, kt in enumerate(KEY_TYPES)}
# Up to this many rows, a column is located row by row in Python (:meth:`KeySpace.locate_column`):
# the whole-column path's ~30 numpy and pyarrow calls cost 70-120 µs however few the rows, a row
# here ~1 µs (its key group memoized) to ~7 µs (a new non-ASCII key hashed): at 32 rows of new
# keys the two cost about the same. Tests force it both ways (tests/engine/test_columns_few_rows.py).
FEW_ROWS = 32
_STRINGS = (pa.string(), pa.large_string())


def encode_timestamp(timestamp: int) -> bytes:
    """8 bytes whose byte order is the timestamps' numeric order (the sign bit flipped)."""
    return _TS.pack(timestamp + _SIGN)


def decode_timestamp(data: bytes) -> int:
    return _TS.unpack_from(data)[0] - _SIGN


def timer_key_type(primary: bytes) -> KeyType:
    """The key type a stored timer's primary names (after its timestamp)."""
    return KEY_TYPES[primary[TIMESTAMP_BYTES]]


def position_bytes(position: tuple[int, bytes]) -> bytes:
    """A listing's position (key group, stored key) as bytes that sort as the positions do: a
    paged listing's cursor (2 bytes hold any key group: max parallelism is at most 2**15)."""
    key_group, primary = position
    return key_group.to_bytes(2, "big") + primary


def position_of(data: bytes | None) -> tuple[int, bytes] | None:
    """The position :func:`position_bytes` gave (``None``: the listing's start)."""
    return (int.from_bytes(data[:2], "big"), data[2:]) if data else None


def first_page(
    items: Iterable[T], limit: int, position: Callable[[T], tuple[int, bytes]]
) -> tuple[list[T], bytes | None]:
    """Up to ``limit`` of ``items``, and the position (bytes) the next page starts after when
    more follow (``None``: this page ends the listing)."""
    page = list(islice(items, limit + 1))
    if len(page) <= limit:
        return page, None
    return page[:limit], position_bytes(position(page[limit - 1]))


@dataclass(frozen=True, slots=True)
class Rows:
    """Many rows of one request, located: each row's key group and stored primary key. The
    ``*_many`` methods of the states take them, apply the same rules as the one-key methods,
    and read and write the transaction once per request."""

    key_groups: list[int]
    primaries: list[bytes]

    def __len__(self) -> int:
        return len(self.primaries)


@dataclass(frozen=True)
class KeySpace:
    """The key groups ``max_parallelism`` splits keys into, the ones replica ``replica_index`` of
    ``replica_count`` owns, and the limits a stored key must fit. ``job`` and ``layout_version``
    only name the job and the topology in errors (a ``key_not_owned`` tells the client where to go).

    ``frozen_version`` nonzero: a live rescale to that topology version froze this job here;
    writes into the ``frozen`` key groups and to operator state are refused until the keyspace is
    replaced. ``serving=False``: the job owns (serves) no key group: it holds key groups loaded
    for a move that has not switched to them yet, or its replica was removed by one
    (``replica_index >= replica_count``); a 421 still names each key group's owner."""

    job: str
    max_parallelism: int
    replica_index: int = 0
    replica_count: int = 1
    limits: Limits = field(default_factory=Limits)
    layout_version: int = 0
    frozen: tuple[KeyGroupRange, ...] = ()
    frozen_version: int = 0
    serving: bool = True
    owned: KeyGroupRange = field(init=False)
    # Memoized key groups (keys repeat in streams); part of the value, not of its identity.
    _assign: KeyGroupAssigner = field(init=False, repr=False, compare=False)
    _frozen_groups: frozenset[int] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.serving:
            owned = KeyGroupRange.for_operator(self.max_parallelism, self.replica_count, self.replica_index)
        else:  # joining a move, or removed by one (its index past the count): owner_of still answers
            owned = KeyGroupRange.empty()
        object.__setattr__(self, "owned", owned)
        object.__setattr__(self, "_assign", KeyGroupAssigner(self.max_parallelism))
        object.__setattr__(self, "_frozen_groups", frozenset(kg for r in self.frozen for kg in r))

    # -- a live rescale: frozen key groups -------------------------------------------------------

    def write_guard(self) -> Callable[[str, Collection[int]], None] | None:
        """What a transaction checks its writes with (``None``: nothing is frozen, nothing to check)."""
        return self.check_writes if self.frozen_version else None

    def check_not_frozen(self, what: str) -> None:
        """``rescale_in_progress`` if a live rescale froze the job: ``what`` changes every key group."""
        if self.frozen_version:
            raise RescaleInProgress(
                f"job {self.job!r} is being rescaled to topology version {self.frozen_version}: {what} waits for "
                "the move to commit; retry",
                version=self.frozen_version,
            )

    def check_writes(self, table: str, key_groups: Collection[int]) -> None:
        """``rescale_in_progress`` if a write to ``table`` in these key groups must wait for a move."""
        if table in NON_KEYED_TABLES:
            if table in _OPERATOR_TABLES:  # redistributed when the move commits
                self.check_not_frozen("writing its operator state")
            return
        frozen = self._frozen_groups
        if frozen and not frozen.isdisjoint(key_groups):
            key_group = next(kg for kg in key_groups if kg in frozen)
            raise RescaleInProgress(
                f"key group {key_group} of job {self.job!r} is moving to another replica (topology version "
                f"{self.frozen_version}); reads are served, writes wait for the move to commit: retry",
                version=self.frozen_version,
            )

    # -- key groups and owners -----------------------------------------------------------------

    def key_group(self, key: Key, key_type: KeyType) -> int:
        """Flink's key group of a key already well typed (``codec.encode_key`` checks that)."""
        return self._assign(key, key_type)

    def owner_of(self, key_group: int) -> int:
        return operator_index(self.max_parallelism, self.replica_count, key_group)

    def check_owned(self, key_group: int) -> None:
        """``key_not_owned`` (naming the owner) unless this replica owns ``key_group``; while a move
        is pending here, ``rescale_in_progress`` instead: the request comes from a client that
        learned the new layout from a replica that committed first, and this replica serves the
        key group once it commits too (a 421 naming the old version could not be acted on)."""
        owned = self.owned
        if not owned.start <= key_group <= owned.end:
            if self.frozen_version:
                raise RescaleInProgress(
                    f"key group {key_group} of job {self.job!r} is not served here until the live rescale to "
                    f"topology version {self.frozen_version} commits on this replica; retry",
                    version=self.frozen_version,
                )
            owner = self.owner_of(key_group)
            holds = f"key groups {owned.start}-{owned.end}" if len(owned) else "none"
            raise KeyNotOwned(
                f"key group {key_group} of job {self.job!r} belongs to replica {owner}, not to replica "
                f"{self.replica_index} (which owns {holds})",
                key_group=key_group,
                owner=owner,
                version=self.layout_version,
            )

    def check_key_group(self, key_group: int, what: str = "key_group") -> None:
        """A key group a caller names (a listing's filter, a raw stream's): an integer below the
        max parallelism (422), owned here (421)."""
        if isinstance(key_group, bool) or not isinstance(key_group, int) or not 0 <= key_group < self.max_parallelism:
            raise InvalidArgument(f"{what} must be an integer in [0, {self.max_parallelism - 1}]; got {key_group!r}")
        self.check_owned(key_group)

    def owned_part(self, start: int | None, end: int | None) -> KeyGroupRange:
        """Of the key groups a caller names, ``start..end`` (each by default the owned range's),
        the ones this replica owns (the rest are other replicas'): a read of a range (a scan, the
        sizes); 422 unless it is a range within the max parallelism."""
        owned = self.owned
        first, last = owned.start if start is None else start, owned.end if end is None else end
        if not 0 <= first <= last < self.max_parallelism:
            raise InvalidArgument(
                f"key_group_start..key_group_end must be a range within 0..{self.max_parallelism - 1} (this replica "
                f"owns {owned.start}..{owned.end}); got {first}..{last}"
            )
        return owned.intersection(KeyGroupRange(first, last))

    def key_group_range(self, given: tuple[int, int] | list[int]) -> KeyGroupRange:
        """A range of key groups a caller names, ``[start, end]`` within the max parallelism."""
        start, end = given
        if not 0 <= start <= end < self.max_parallelism:
            raise InvalidArgument(
                f"key_groups must be [start, end] with 0 <= start <= end < max_parallelism ({self.max_parallelism})"
            )
        return KeyGroupRange(start, end)

    # -- one key -------------------------------------------------------------------------------

    def locate(self, key: Key, key_type: KeyType, namespace: str) -> tuple[int, bytes]:
        """Key group and stored primary key of (key, namespace); refuses a key of the wrong type,
        over the limits, or of another replica."""
        key_bytes = encode_key(key, key_type)  # validates the key's type first
        self.limits.check_key(key_bytes)
        if type(namespace) is not str:
            raise InvalidKey(f"a namespace is a string; got {type(namespace).__name__}")
        key_group = self._assign(key, key_type)
        owned = self.owned
        if not owned.start <= key_group <= owned.end:
            self.check_owned(key_group)  # raises key_not_owned
        ns_bytes = encode_namespace(namespace)
        self.limits.check_key(ns_bytes, "namespace")
        return key_group, key_bytes + ns_bytes

    def key_prefix(self, key: Key, key_type: KeyType) -> tuple[int, bytes]:
        """Key group and the start every stored key of ``key`` shares, whatever its namespace
        (a scan's point reads; no owner check: a scan keeps to the key groups it reads)."""
        key_bytes = encode_key(key, key_type)
        return self._assign(key, key_type), key_bytes

    def locate_timer(self, key: Key, key_type: KeyType, namespace: str, timestamp: int) -> tuple[int, bytes]:
        """:meth:`locate` for a timer (its ``timestamp`` already checked): the timer's stored key."""
        key_group, primary = self.locate(key, key_type, namespace)
        return key_group, encode_timestamp(timestamp) + _KEY_TYPE_TAGS[key_type] + primary

    # -- Arrow columns -------------------------------------------------------------------------

    def locate_column(self, keys: pa.Array, key_type: KeyType, namespaces: pa.Array | str, subject: str) -> Rows:
        """:meth:`locate` for every row: key groups and stored keys at once, the same checks; an
        error names its row. ``subject`` names what the keys are of in errors (``state 'v'``)."""
        if len(keys) <= FEW_ROWS:
            few = self._locate_few(keys, key_type, namespaces)
            if few is not None:
                return few
        column: pa.Array | Utf8Column = keys
        try:
            if key_type == "string":  # checked and taken apart once, for key groups and stored keys
                column = utf8_column(keys)
                # before hashing: Java's hash of a long key caches powers of 31 as long as the key
                self._refuse_too_long(np.diff(column.offsets), "key")
            groups = key_groups(column, key_type, self.max_parallelism)
        except (TypeError, ValueError) as exc:
            where = {"row": exc.row} if isinstance(exc, BadRow) else {}
            raise InvalidKey(f"column 'key' of {subject} ({key_type} keys): {exc}", **where) from None
        owned = self.owned
        foreign = np.flatnonzero((groups < owned.start) | (groups > owned.end))
        if foreign.size:
            row = int(foreign[0])
            try:
                self.check_owned(int(groups[row]))
            except StateError as exc:
                raise exc.within(f"row {row}", row=row) from None
        encoded = encode_primaries(column, key_type, namespaces)
        if key_type != "string":  # 4 or 8 bytes: over a limit set below 12 bytes
            self._refuse_too_long(encoded.key_bytes, "key")
        self._refuse_too_long(encoded.namespace_bytes, "namespace")
        return Rows(groups.tolist(), encoded.primaries)

    def _locate_few(self, keys: pa.Array, key_type: KeyType, namespaces: pa.Array | str) -> Rows | None:
        """:meth:`locate_column` of a few rows, one at a time as :meth:`locate` does (the same
        stored keys, the memoized key groups), when every row passes every check; ``None`` for
        anything else: the whole-column path then finds the first bad row and names it, so a
        refusal reads the same whichever path met it."""
        if not isinstance(keys, pa.Array) or keys.null_count:
            return None
        if not (keys.type in _STRINGS if key_type == "string" else pa.types.is_integer(keys.type)):
            return None
        spaces: list[str] | None = None
        try:
            keys.validate(full=True)  # offsets in bounds and valid UTF-8, before reading the values
            if not isinstance(namespaces, str):
                if namespaces.type not in _STRINGS or namespaces.null_count or len(namespaces) != len(keys):
                    return None
                namespaces.validate(full=True)
                spaces = namespaces.to_pylist()
        except pa.ArrowInvalid:
            return None
        limit, owned, assign = self.limits.max_key_bytes, self.owned, self._assign
        one_space = encode_namespace(namespaces) if spaces is None else b""
        groups, primaries = [], []
        for row, key in enumerate(keys.to_pylist()):
            try:
                key_bytes = encode_key(key, key_type)  # an integer out of its type's range: refused
            except InvalidKey:
                return None
            ns_bytes = one_space if spaces is None else encode_namespace(spaces[row])
            if len(key_bytes) > limit or len(ns_bytes) > limit:
                return None
            key_group = assign(key, key_type)  # after the length check: a long key is not hashed
            if not owned.start <= key_group <= owned.end:
                return None
            groups.append(key_group)
            primaries.append(key_bytes + ns_bytes)
        return Rows(groups, primaries)

    def locate_timer_column(
        self, keys: pa.Array, key_type: KeyType, namespaces: pa.Array | str, timestamps: np.ndarray
    ) -> Rows:
        """:meth:`locate_timer` for every row (``timestamps``: int64, one per row)."""
        rows = self.locate_column(keys, key_type, namespaces, "the timers")
        stamps = (timestamps.astype(np.int64).view(np.uint64) ^ _SIGN_U64).astype(">u8").view("V8").tolist()
        tag = _KEY_TYPE_TAGS[key_type]
        return Rows(rows.key_groups, list(map(operator.add, (s + tag for s in stamps), rows.primaries)))

    def _refuse_too_long(self, lengths: np.ndarray, what: str) -> None:
        """``key_too_large`` (413) naming the first row whose stored ``what`` (its field: the
        header and the bytes) is over the limit."""
        too_long = np.flatnonzero(lengths + FIELD_HEADER_BYTES > self.limits.max_key_bytes)
        if too_long.size:
            row = int(too_long[0])
            raise self.limits.key_error(int(lengths[row]) + FIELD_HEADER_BYTES, what).within(f"row {row}", row=row)
