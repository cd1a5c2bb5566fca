"""The stored keys of :mod:`statehouse.snapshots.stored.codec` for whole Arrow columns at once.

``encode_primaries`` gives, row by row, exactly ``codec.encode_primary(key, key_type, namespace)``,
and ``prefixed`` the RocksDB keys ``key group + primary``; ``pack_column`` and
``unpack_column`` are ``codec.pack_value`` and ``codec.decode_value`` of a whole binary or utf8
column. A columnar request carries thousands
of rows, so the bytes are laid out by numpy and Arrow, and Python only receives the results.
Keys and namespaces are checked as :mod:`statehouse.protocol.keygroups.columnar` checks them: a
``TypeError`` for a wrong Arrow type, a ``ValueError`` naming the first bad row.
"""

from __future__ import annotations

import operator
import struct
from collections.abc import Sequence
from typing import Any, NamedTuple, TypeAlias, cast

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from statehouse.protocol.keygroups import KEY_TYPES, KeyType
from statehouse.protocol.keygroups.columnar import ArrowValues, Utf8Column, integer_keys, row_count, utf8_column
from statehouse.snapshots.stored.record_columns import big_endian

__all__ = [
    "EncodedPrimaries",
    "Packed",
    "encode_primaries",
    "pack_column",
    "pack_numbers",
    "prefixed",
    "unpack_column",
]

# A part of every row's bytes: unsigned ints (big-endian, one per row), bytes (the same in every
# row), or a Utf8Column (each row's own bytes).
_Part: TypeAlias = "np.ndarray | bytes | Utf8Column"
_LENGTH = struct.Struct(">I")


class EncodedPrimaries(NamedTuple):
    """The primary keys of a column of rows, with the sizes of their parts.

    ``key_bytes`` and ``namespace_bytes`` (int64, one per row) are the lengths of the encoded
    key and namespace without their 4-byte length headers: what size limits are checked on.
    """

    primaries: list[bytes]
    key_bytes: np.ndarray
    namespace_bytes: np.ndarray


def encode_primaries(
    keys: ArrowValues | Utf8Column, key_type: KeyType, namespaces: ArrowValues | str
) -> EncodedPrimaries:
    """``codec.encode_primary`` of every row; ``namespaces`` is a utf8 column, or one namespace
    for all rows. String keys may come as their checked :class:`Utf8Column`."""
    count = row_count(keys)
    key_parts: list[_Part]
    if key_type == "string":
        key = utf8_column(keys)
        key_bytes = np.diff(key.offsets)
        key_parts = [key_bytes.astype(np.uint32), key]
    elif key_type == "int":  # key + 2**31 (the sign bit flipped): bytes sort as the numbers do
        key_parts = [_LENGTH.pack(4), integer_keys(keys, key_type).view(np.uint32) ^ np.uint32(1 << 31)]
        key_bytes = np.full(count, 4, np.int64)
    elif key_type == "long":
        key_parts = [_LENGTH.pack(8), integer_keys(keys, key_type).view(np.uint64) ^ np.uint64(1 << 63)]
        key_bytes = np.full(count, 8, np.int64)
    else:
        raise ValueError(f"key_type must be one of {', '.join(KEY_TYPES)}; got {key_type!r}")

    namespace_parts: list[_Part]
    if isinstance(namespaces, str):
        encoded = namespaces.encode("utf-8")
        namespace_bytes = np.full(count, len(encoded), np.int64)
        namespace_parts = [_LENGTH.pack(len(encoded)) + encoded]
    else:
        namespace = utf8_column(namespaces, "namespace")
        namespace_bytes = np.diff(namespace.offsets)
        if len(namespace_bytes) != count:
            raise ValueError(f"{len(namespace_bytes)} namespaces for {count} keys: give one per row, or one for all")
        namespace_parts = [namespace_bytes.astype(np.uint32), namespace]
    return EncodedPrimaries(_join_rows([*key_parts, *namespace_parts], count), key_bytes, namespace_bytes)


def prefixed(key_groups: np.ndarray, prefix_width: int, primaries: list[bytes]) -> list[bytes]:
    """RocksDB keys: every row's key group as a ``prefix_width``-byte big-endian prefix (1 or 2,
    see ``codec.key_group_prefix_width``), then its primary key."""
    groups = np.asarray(key_groups)
    if prefix_width not in (1, 2):
        raise ValueError(f"prefix_width must be 1 or 2, got {prefix_width}")
    if len(groups) != len(primaries):
        raise ValueError(f"{len(groups)} key groups for {len(primaries)} primary keys")
    if len(groups) and (groups.min() < 0 or groups.max() >= 1 << (8 * prefix_width)):
        raise ValueError(f"key groups must be in [0, {1 << (8 * prefix_width)}) for a {prefix_width}-byte prefix")
    # One bytes object per prefix straight from numpy, then one C-level loop of concatenations:
    # faster than building the keys in Arrow, which would first have to copy the primaries in.
    prefixes = groups.astype(">u2" if prefix_width == 2 else np.uint8).view(f"V{prefix_width}").tolist()
    return list(map(operator.add, prefixes, primaries))


class _Fixed(NamedTuple):
    """A part of one width: numpy's type for it, and its value in every row or in all."""

    dtype: np.dtype
    value: np.ndarray | np.void
    per_row: bool


def _fixed(part: _Part) -> _Fixed | None:
    """The part as a field of a numpy structured array, unless its rows differ in length."""
    if isinstance(part, np.ndarray):
        return _Fixed(part.dtype.newbyteorder(">"), part, True)
    if isinstance(part, bytes):
        return _Fixed(np.dtype(f"V{len(part)}"), np.void(part), False)
    lengths = np.diff(part.offsets)
    if len(lengths) and lengths.min() == lengths.max():  # fixed-width ids, say
        width = int(lengths[0])
        return _Fixed(np.dtype(f"V{width}"), part.data.view(f"V{width}") if width else part.data, True)
    return None


def _rows(run: list[_Fixed], count: int) -> np.ndarray:
    """Fixed-width parts side by side: a structured array of ``count`` rows (1 if all are constants)."""
    rows = count if any(f.per_row for f in run) else 1
    joined = np.empty(rows, np.dtype([(f"f{i}", f.dtype) for i, f in enumerate(run)]))  # packed
    for i, f in enumerate(run):
        joined[f"f{i}"] = f.value  # one loop per field, byte-swapping the ints to big-endian
    return joined


def _join_rows(parts: list[_Part], count: int) -> list[bytes]:
    """Row ``i`` of every part, concatenated, for every row."""
    runs: list[list[_Fixed] | Utf8Column] = []  # fixed-width parts together, between varying ones
    for part in parts:
        fixed = _fixed(part)
        if fixed is None:
            assert isinstance(part, Utf8Column)  # only strings vary in length
            runs.append(part)
        elif not fixed.dtype.itemsize:  # e.g. the empty namespace of every row
            continue
        elif runs and isinstance(runs[-1], list):
            runs[-1].append(fixed)
        else:
            runs.append([fixed])
    if len(runs) == 1 and isinstance(runs[0], list):  # every row one width: one structured array
        rows = _rows(runs[0], count)
        rows = np.broadcast_to(rows, (count,)) if len(rows) != count else rows
        return np.ascontiguousarray(rows).view(f"V{rows.dtype.itemsize}").tolist()  # voids' values are bytes
    if not count:
        return []
    # Put all parts in one Arrow array and take its elements row by row: the data of the result
    # is then the rows back to back, and every len(runs)-th offset is where a row starts.
    arrays = [_binary(run if isinstance(run, Utf8Column) else _rows(run, count)) for run in runs]
    firsts = np.cumsum([0] + [len(array) for array in arrays[:-1]])
    order = np.empty((count, len(arrays)), np.int64)
    for i, array in enumerate(arrays):
        order[:, i] = firsts[i] + (np.arange(count) if len(array) == count else 0)
    taken = pa.concat_arrays(arrays).take(order.ravel())
    _, offsets, data = taken.buffers()
    starts = np.frombuffer(offsets, np.int64)[taken.offset : taken.offset + len(taken) + 1 : len(arrays)]
    return pa.Array.from_buffers(pa.large_binary(), count, [None, pa.py_buffer(starts.copy()), data]).to_pylist()


def _binary(part: np.ndarray | Utf8Column) -> pa.Array:
    """A structured array's rows, or a Utf8Column, as a large_binary array (its bytes not copied)."""
    if isinstance(part, np.ndarray):
        rows, width = len(part), part.dtype.itemsize
        offsets = np.arange(0, rows * width + 1, width, dtype=np.int64) if width else np.zeros(rows + 1, np.int64)
        return pa.Array.from_buffers(pa.large_binary(), rows, [None, pa.py_buffer(offsets), pa.py_buffer(part)])
    return pa.Array.from_buffers(
        pa.large_binary(), len(part.offsets) - 1, [None, pa.py_buffer(part.offsets), pa.py_buffer(part.data)]
    )


# msgpack's headers (use_bin_type=True, as codec.pack_value packs): a marker byte, then the
# length big-endian in 1, 2 or 4 bytes; short strings put their length in the marker (fixstr).
_BIN = (0xC4, 0xC5, 0xC6)
_STR = (0xD9, 0xDA, 0xDB)
_FIXSTR, _FIXSTR_MAX = 0xA0, 31


def _kind(kind: pa.DataType) -> bool | None:
    """Whether an Arrow type packs as msgpack bin (True) or str (False); ``None``: neither."""
    if pa.types.is_binary(kind) or pa.types.is_large_binary(kind):
        return True
    if pa.types.is_string(kind) or pa.types.is_large_string(kind):
        return False
    return None


class Packed(NamedTuple):
    """``codec.pack_value`` of each row (``None`` for a null one), with what is known of them all."""

    payloads: list[bytes | None]
    longest: int  # bytes of the longest payload (0 when there is none)
    deletes: bool  # whether a payload is None


def pack_column(values: pa.Array) -> Packed | None:
    """``codec.pack_value`` of every row of a binary or utf8 array (a null row: ``None``): the
    headers built in numpy, joined to the values' bytes in Arrow. ``None`` for another type."""
    binary = _kind(values.type)
    if binary is None:
        return None
    count = len(values)
    _, offset_buffer, data_buffer = values.buffers()
    width = np.int32 if pa.types.is_binary(values.type) or pa.types.is_string(values.type) else np.int64
    offsets = np.frombuffer(offset_buffer, width)[values.offset : values.offset + count + 1].astype(np.int64)
    lengths = np.diff(offsets)
    data = np.frombuffer(data_buffer, np.uint8) if data_buffer is not None else np.empty(0, np.uint8)
    payloads = Utf8Column(offsets - offsets[0], data[offsets[0] : offsets[-1]], False)
    packed = cast("list[bytes | None]", _join_rows([*_headers(lengths, binary), payloads], count))
    if values.null_count:
        for row in np.flatnonzero(values.is_null().to_numpy(zero_copy_only=False)).tolist():
            packed[row] = None
    # The longest payload is the longest value's (a header grows with its value; a null row's
    # slot, if it has bytes, only makes this an overestimate).
    longest = int(lengths.max()) if count else 0
    header = 1 if not binary and longest <= _FIXSTR_MAX else 2 if longest < 256 else 3 if longest < 65536 else 5
    return Packed(packed, longest + header if count > values.null_count else 0, values.null_count > 0)


# msgpack's integer formats as its packer picks them (the smallest that holds the value): the
# range each covers, its marker (None: the value is its own byte, a fixint) and its field.
_INT_FORMATS = (
    (0, 0x7F, None, "u1"),  # positive fixint
    (-32, -1, None, "i1"),  # negative fixint
    (0x80, 0xFF, 0xCC, ">u1"),
    (0x100, 0xFFFF, 0xCD, ">u2"),
    (0x1_0000, 0xFFFF_FFFF, 0xCE, ">u4"),
    (-0x80, -33, 0xD0, ">i1"),
    (-0x8000, -0x81, 0xD1, ">i2"),
    (-0x8000_0000, -0x8001, 0xD2, ">i4"),
)
_FLOAT64 = 0xCB


def pack_numbers(values: Sequence[Any]) -> Packed | None:
    """``codec.pack_value`` of every value, built in numpy at once, when they are all finite
    Python floats (msgpack float64: a marker and 8 bytes big-endian) or all ints of one of
    msgpack's integer formats (the usual column of sums and counts): the same bytes the packer
    gives, one by one. ``None`` otherwise (pack them one by one: checks included)."""
    kinds = set(map(type, values))
    if kinds == {float}:
        numbers = np.array(values, np.float64)
        if not np.isfinite(numbers).all():
            return None  # refused by the checks, with the row named
        rows = np.empty(len(values), np.dtype([("m", "u1"), ("v", ">f8")]))
        rows["m"], rows["v"] = _FLOAT64, numbers
        return Packed(rows.view("V9").tolist(), 9, False)
    if kinds != {int}:
        return None
    try:
        numbers = np.array(values, np.int64)
    except OverflowError:
        return None
    low, high = int(numbers.min()), int(numbers.max())
    found = next((f for f in _INT_FORMATS if f[0] <= low and high <= f[1]), None)
    if found is None:
        return None  # several formats, or 8-byte ints: one by one
    _first, _last, marker, field = found
    width = np.dtype(field).itemsize
    if marker is None:
        return Packed(numbers.astype(field).view("V1").tolist(), 1, False)
    rows = np.empty(len(values), np.dtype([("m", "u1"), ("v", field)]))
    rows["m"], rows["v"] = marker, numbers
    return Packed(rows.view(f"V{width + 1}").tolist(), width + 1, False)


def _headers(lengths: np.ndarray, binary: bool) -> list[_Part]:
    """Each row's msgpack header for a value of ``lengths`` bytes: one constant when the values
    are one length, a marker and a length field of one width when they are one size class, else
    a column of headers."""
    codes = _BIN if binary else _STR
    low, high = (int(lengths.min()), int(lengths.max())) if len(lengths) else (0, 0)
    if not binary and high <= _FIXSTR_MAX:
        return [(lengths | _FIXSTR).astype(np.uint8)]
    floor = 0 if binary else _FIXSTR_MAX + 1
    for code, field, limit in zip(codes, (np.uint8, np.uint16, np.uint32), (1 << 8, 1 << 16, 1 << 32), strict=True):
        if floor <= low and high < limit:
            if low == high:
                return [bytes([code]) + low.to_bytes(np.dtype(field).itemsize, "big")]
            return [bytes([code]), lengths.astype(field)]
        floor = limit
    size = np.where(lengths < 256, 1, np.where(lengths < 65536, 2, 4))  # bytes of the length
    marker = np.where(size == 1, codes[0], np.where(size == 2, codes[1], codes[2]))
    if not binary:
        short = lengths <= _FIXSTR_MAX
        marker = np.where(short, _FIXSTR | lengths, marker)
        size = np.where(short, 0, size)
    table = np.zeros((len(lengths), 5), np.uint8)
    table[:, 0] = marker
    big_endian = lengths.astype(">u4").view(np.uint8).reshape(-1, 4)
    for n in (1, 2, 4):
        rows = size == n
        if rows.any():
            table[rows, 1 : 1 + n] = big_endian[rows, 4 - n :]
    widths = size + 1
    header_offsets = np.zeros(len(lengths) + 1, np.int64)
    np.cumsum(widths, out=header_offsets[1:])
    return [Utf8Column(header_offsets, table[np.arange(5) < widths[:, None]], False)]


def unpack_column(payloads: list[bytes | None], kind: pa.DataType) -> pa.Array | None:
    """``codec.decode_value`` of stored values as one array of ``kind`` (binary or utf8; ``None``
    read as null), when every value is a msgpack bin (or str) whose header agrees with its size:
    the values go into Arrow as they are, and the headers are cut off there. ``None`` otherwise
    (values of another type: decode them one by one)."""
    binary = _kind(kind)
    if binary is None:
        return None
    try:
        stored = pa.array(payloads, pa.binary())
    except (pa.ArrowException, TypeError):
        return None
    count = len(stored)
    if count == stored.null_count:
        return pa.nulls(count, kind)
    _, offset_buffer, data_buffer = stored.buffers()
    offsets = np.frombuffer(offset_buffer, np.int32)[: count + 1].astype(np.int64)
    data = np.frombuffer(data_buffer, np.uint8)
    absent = stored.is_null().to_numpy(zero_copy_only=False) if stored.null_count else None
    present = ~absent if absent is not None else slice(None)
    starts, sizes = offsets[:-1][present], np.diff(offsets)[present]
    if sizes.min() < 1:
        return None
    marker = data[starts].astype(np.int64)
    codes = _BIN if binary else _STR
    if (marker == marker[0]).all() and int(marker[0]) in codes:  # one header size: the usual column
        width = (1, 2, 4)[codes.index(int(marker[0]))]
        if sizes.min() <= width or not np.array_equal(_length_fields(data, starts, width) + width + 1, sizes):
            return None
        return _checked(pc.binary_slice(stored, width + 1, (1 << 31) - 1), kind)
    field = np.full(len(starts), -1, np.int64)  # bytes of the length field; -1: not a value of this kind
    for width, code in zip((1, 2, 4), codes, strict=True):
        field[marker == code] = width
    if not binary:
        field[(marker & 0xE0) == _FIXSTR] = 0
    if field.min() < 0 or (sizes <= field).any():  # (a length field is then inside its value)
        return None
    declared = np.where(field == 0, marker & 0x1F, 0)
    for width in (1, 2, 4):
        rows = np.flatnonzero(field == width)
        if len(rows):
            declared[rows] = _length_fields(data, starts[rows], width)
    if not np.array_equal(declared + field + 1, sizes):
        return None
    # Each value as two pieces, its header and its bytes: take the bytes (Arrow copies them).
    bounds = np.empty(2 * count + 1, np.int64)
    bounds[0:-1:2], bounds[1::2], bounds[-1] = offsets[:-1], offsets[:-1], offsets[-1]
    bounds[1:-1:2][present] += field + 1
    pieces = pa.Array.from_buffers(pa.large_binary(), 2 * count, [None, pa.py_buffer(bounds), data_buffer])
    odd = np.arange(1, 2 * count, 2)
    indexes = pa.array(odd, mask=absent) if absent is not None else pa.array(odd)
    return _checked(pieces.take(indexes), kind)


def _length_fields(data: np.ndarray, starts: np.ndarray, width: int) -> np.ndarray:
    """The big-endian ``width``-byte length after the marker at each of ``starts``."""
    return big_endian(data, starts + 1, width)


def _checked(values: pa.Array, kind: pa.DataType) -> pa.Array | None:
    """``values`` as ``kind``, utf8 checked (stored bytes are not trusted blindly); else ``None``."""
    try:
        return values.cast(kind)
    except pa.ArrowException:
        return None
