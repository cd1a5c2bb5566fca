"""Stored records read as a table without a Python object per row: what a live scan and a
checkpoint reader hand Spark's data source. The records' bytes go into Arrow buffers once; keys,
namespaces, user keys, TTL expiries and fixed-width values are cut out of them with numpy, and
other values are unpacked in one C loop over the joined bytes.

The row-at-a-time reading (:func:`~statehouse.snapshots.stored.arrow.decode_record` and
:func:`~statehouse.snapshots.stored.arrow.rows_table`) stays the rule: list states and any record
this reading cannot take whole (a malformed primary, a key that is not UTF-8, a value that does
not unpack to one object per record) go through it, so both give the same table or the same error.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Callable, Iterator, Sequence
from typing import Any, TypeAlias

import numpy as np
import pyarrow as pa

from statehouse.snapshots.stored.arrow import (
    KEY_TYPES,
    Row,
    decode_record,
    json_text,
    read_op,
    rows_table,
    schema,
    to_arrow,
    value_type,
)
from statehouse.snapshots.stored.codec import FIELD_HEADER_BYTES, split_timestamped, unpack_joined
from statehouse.snapshots.stored.descriptors import StateDescriptor
from statehouse.snapshots.stored.functions import StateFunction
from statehouse.snapshots.stored.keys import split_key
from statehouse.snapshots.stored.ttl import MAX_LONG, is_expired

_TIMESTAMP_BYTES = 8  # a TTL record: 8-byte big-endian timestamp, then the value
_MSGPACK_FLOAT64 = 0xCB  # msgpack's float 64 marker: then 8 big-endian bytes


Bytes: TypeAlias = "Sequence[bytes] | pa.Array"  # a column of stored bytes: as read, or already in Arrow
Groups: TypeAlias = "Sequence[int] | np.ndarray"
StoredColumns: TypeAlias = "tuple[Groups, Bytes, Bytes, Bytes]"  # key groups, primaries, secondaries, records


@contextlib.contextmanager
def bulk_decoding() -> Iterator[None]:
    """Pause Python's cycle collector while a reader decodes many records into short-lived
    tuples: none of them can form a cycle, yet every few hundred of them would start a
    collection that walks every live object (more than half of a big read's time)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def big_endian(data: np.ndarray, at: np.ndarray, width: int) -> np.ndarray:
    """The unsigned big-endian ``width``-byte integer at each of ``at`` in ``data`` (as int64)."""
    value = data[at].astype(np.int64)
    for i in range(1, width):
        value = (value << 8) | data[at + i]
    return value


class _Unreadable(Exception):
    """The records need the row-at-a-time reading (which names what is wrong, if anything)."""


class _Binary:
    """A column of byte strings as numpy views of one Arrow buffer: start, end, data."""

    def __init__(self, values: Bytes) -> None:
        if isinstance(values, pa.Array):
            array = values if values.type == pa.large_binary() else values.cast(pa.large_binary())
        else:
            array = pa.array(values, pa.large_binary())
        _validity, offsets, data = array.buffers()
        self.count = len(array)
        bounds = np.frombuffer(offsets, dtype=np.int64, count=self.count + 1, offset=array.offset * 8)
        self.starts, self.ends = bounds[:-1], bounds[1:]
        self.data = np.frombuffer(data, dtype=np.uint8) if data is not None else np.zeros(0, np.uint8)

    def u32(self, at: np.ndarray) -> np.ndarray:
        """The big-endian u32 at each position (the caller checked they are in bounds)."""
        return big_endian(self.data, at, 4)

    def fixed(self, at: np.ndarray, width: int, dtype: str) -> np.ndarray:
        """``width`` bytes at each position read as ``dtype`` (big-endian), one per row."""
        taken = self.data[at[:, None] + np.arange(width)]
        return np.ascontiguousarray(taken).view(dtype).ravel()

    def slices(self, at: np.ndarray, lengths: np.ndarray) -> pa.Array:
        """The bytes ``at``..``at + length`` of each row, as one binary column."""
        offsets = np.zeros(len(at) + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        total = int(offsets[-1])
        body = self.data[np.repeat(at - offsets[:-1], lengths) + np.arange(total)] if total else np.zeros(0, np.uint8)
        return pa.Array.from_buffers(pa.large_binary(), len(at), [None, pa.py_buffer(offsets), pa.py_buffer(body)])

    def joined(self, at: np.ndarray, lengths: np.ndarray) -> memoryview:
        """The same slices as one run of bytes (a value per row, for one unpacking loop)."""
        if len(at) and np.array_equal(at[1:], at[:-1] + lengths[:-1]):  # already one run
            return self.data[at[0] : at[-1] + lengths[-1]].data
        return memoryview(self.slices(at, lengths).buffers()[2] or b"")


def records_table(
    descriptor: StateDescriptor,
    key_groups: Groups,
    primaries: Bytes,
    secondaries: Bytes,
    records: Bytes,
    now_ms: int,
) -> pa.Table:
    """Stored records (``secondaries``: a map's user keys, else empty) as a table of
    :func:`~statehouse.snapshots.stored.arrow.schema`, by Flink's TTL visibility at ``now_ms``:
    the table :func:`rows_table` makes of the rows :func:`decode_record` keeps."""
    if descriptor.kind != "list" and len(records):
        try:
            return _columns(descriptor, (key_groups, primaries, secondaries, records), now_ms)
        except _Unreadable:
            pass
    rows: list[Row] = []
    columns = map(_listed, (key_groups, primaries, secondaries, records))
    for kg, primary, secondary, raw in zip(*columns, strict=True):
        decoded = decode_record(descriptor.kind, descriptor.ttl, raw, now_ms)
        if decoded is not None:
            rows.append((kg, primary, secondary, *decoded))
    return rows_table(descriptor, rows)


def _listed(column: Groups | Bytes) -> Sequence[Any]:
    return (
        column.tolist()
        if isinstance(column, np.ndarray)
        else column.to_pylist()
        if isinstance(column, pa.Array)
        else column
    )


def _columns(descriptor: StateDescriptor, found: StoredColumns, now_ms: int) -> pa.Table:
    key_groups, primaries, secondaries, records = found
    stored = _Binary(records)
    value_at, value_lengths = stored.starts, stored.ends - stored.starts
    groups = np.asarray(key_groups, dtype=np.int32)
    kept: np.ndarray | None = None
    expires: np.ndarray | None = None
    ttl = descriptor.ttl
    if ttl is not None:
        if (value_lengths <= _TIMESTAMP_BYTES).any():
            raise _Unreadable
        written = stored.fixed(value_at, _TIMESTAMP_BYTES, ">i8").astype(np.int64)
        expires = np.minimum(written, MAX_LONG - ttl.ttl_ms) + ttl.ttl_ms
        value_at, value_lengths = value_at + _TIMESTAMP_BYTES, value_lengths - _TIMESTAMP_BYTES
        if not ttl.return_expired:
            kept = np.flatnonzero(expires > now_ms)
            expires, value_at, value_lengths, groups = expires[kept], value_at[kept], value_lengths[kept], groups[kept]
    if (value_lengths == 0).any():
        raise _Unreadable
    keys, namespaces = _primaries(descriptor, _taken(primaries, kept))
    columns: dict[str, pa.Array] = {"key": keys, "ns": namespaces}
    if descriptor.kind == "map":
        columns["user_key"] = _text(_Binary(_taken(secondaries, kept)))
    columns["value"] = _values(descriptor, stored, value_at, value_lengths)
    columns["key_group"] = pa.array(groups, pa.int32())
    if expires is not None:
        columns["expires_at"] = pa.array(expires, pa.int64())
    return pa.Table.from_pydict(columns, schema=schema(descriptor))


def _taken(values: Bytes, kept: np.ndarray | None) -> Bytes:
    if kept is None:
        return values
    return values.take(kept) if isinstance(values, pa.Array) else [values[i] for i in kept.tolist()]


def _primaries(descriptor: StateDescriptor, primaries: Bytes) -> tuple[pa.Array, pa.Array]:
    """``(key, namespace)`` columns of primaries (two length-prefixed fields, as
    :func:`~statehouse.snapshots.stored.codec.encode_primary` writes them)."""
    stored = _Binary(primaries)
    head = FIELD_HEADER_BYTES
    if (stored.ends - stored.starts < 2 * head).any():
        raise _Unreadable
    key_lengths = stored.u32(stored.starts)
    ns_at = stored.starts + head + key_lengths
    if (ns_at + head > stored.ends).any():
        raise _Unreadable
    ns_lengths = stored.u32(ns_at)
    if (ns_at + head + ns_lengths != stored.ends).any():
        raise _Unreadable
    key_at = stored.starts + head
    namespaces = _text(stored, ns_at + head, ns_lengths)
    key_type = descriptor.key_type
    if key_type == "string":
        return _text(stored, key_at, key_lengths), namespaces
    width = 4 if key_type == "int" else 8
    if (key_lengths != width).any():
        raise _Unreadable
    if key_type == "int":
        keys = (stored.fixed(key_at, 4, ">u4").astype(np.int64) - (1 << 31)).astype(np.int32)
    else:
        keys = (stored.fixed(key_at, 8, ">u8").astype(np.uint64) ^ np.uint64(1 << 63)).view(np.int64)
    return pa.array(keys, KEY_TYPES[key_type]), namespaces


def _text(stored: _Binary, at: np.ndarray | None = None, lengths: np.ndarray | None = None) -> pa.Array:
    """UTF-8 slices (whole values without ``at``) as a string column."""
    if at is None or lengths is None:
        at, lengths = stored.starts, stored.ends - stored.starts
    try:
        return stored.slices(at, lengths).cast(pa.string())
    except pa.ArrowInvalid:  # not UTF-8: the row reading decodes it the way it always has, or says why not
        raise _Unreadable from None


def _values(descriptor: StateDescriptor, stored: _Binary, at: np.ndarray, lengths: np.ndarray) -> pa.Array:
    op = read_op(descriptor)
    typed = value_type(descriptor, op)
    function = descriptor.state_function if descriptor.kind in ("reducing", "aggregating") else None
    identity = function is None or type(function).result is StateFunction.result
    floats = typed == pa.float64() and identity and len(at) and (lengths == 9).all()
    if floats and (stored.data[at] == _MSGPACK_FLOAT64).all():
        return pa.array(stored.fixed(at + 1, 8, ">f8").astype(np.float64))
    values = unpack_joined(stored.joined(at, lengths), len(at))
    if values is None:
        raise _Unreadable
    if not identity and function is not None:
        values = list(map(function.result, values))
    if typed is None:
        return pa.array([json_text(v) for v in values], pa.string())
    return to_arrow(values, descriptor, op)


def visibility(descriptor: StateDescriptor, now_ms: int) -> Callable[[bytes], bool] | None:
    """Whether a stored record reads as a row at ``now_ms`` (``None``: every record does), for a
    reader that counts rows before it reads them as a table."""
    ttl, kind = descriptor.ttl, descriptor.kind
    if ttl is None or (ttl.return_expired and kind != "list"):
        return None
    if kind == "list":
        return lambda raw: decode_record(kind, ttl, raw, now_ms) is not None
    return lambda raw: not is_expired(split_timestamped(raw)[0], ttl.ttl_ms, now_ms)


def split_stored_keys(keys: Bytes, width: int, nested: bool) -> tuple[Groups, Bytes, Bytes]:
    """Stored keys of a keyed table (a ``width``-byte key group, the primary, a map's user key:
    :func:`~statehouse.snapshots.stored.keys.split_key`'s layout) as key group, primary and
    secondary columns."""
    stored = _Binary(keys)
    lengths = stored.ends - stored.starts
    head = FIELD_HEADER_BYTES
    if (lengths < width).any():
        return _split_one_by_one(keys, width, nested)
    groups = big_endian(stored.data, stored.starts, width).astype(np.int32)
    primary_at = stored.starts + width
    if not nested:
        none = np.zeros(stored.count, dtype=np.int64)
        return groups, stored.slices(primary_at, lengths - width), stored.slices(stored.ends, none)
    if (lengths < width + 2 * head).any():
        return _split_one_by_one(keys, width, nested)
    ns_at = primary_at + head + stored.u32(primary_at)
    if (ns_at + head > stored.ends).any():
        return _split_one_by_one(keys, width, nested)
    secondary_at = ns_at + head + stored.u32(ns_at)
    if (secondary_at > stored.ends).any():
        return _split_one_by_one(keys, width, nested)
    primaries = stored.slices(primary_at, secondary_at - primary_at)
    return groups, primaries, stored.slices(secondary_at, stored.ends - secondary_at)


def _split_one_by_one(keys: Bytes, width: int, nested: bool) -> tuple[Groups, Bytes, Bytes]:
    """The keys the columns cannot cut, split as a restore splits them (which says what is wrong)."""
    split = [split_key(key, width, nested) for key in _listed(keys)]
    return [s[0] for s in split], [s[1] for s in split], [s[2] for s in split]
