"""Key groups of whole Arrow arrays, bit-for-bit the same as :mod:`statehouse.protocol.keygroups`.

A columnar request carries thousands of keys; hashing them one by one in Python costs about a
microsecond each, so here every step runs over numpy arrays: ``String.hashCode`` (UTF-8 decoded
to UTF-16 code units in numpy), ``Integer``/``Long.hashCode``, Flink's ``murmurHash`` and the
modulo. Only the columnar code imports this module (it needs numpy and pyarrow);
:mod:`statehouse.protocol.keygroups` stays dependency-free.

Bad input raises ``TypeError`` (wrong Arrow type) or ``ValueError`` (nulls, invalid UTF-8,
integers out of range), with messages that name the first bad row: they are shown to users.
"""

from __future__ import annotations

from itertools import pairwise
from typing import NamedTuple, TypeAlias

import numpy as np
import pyarrow as pa

from statehouse.protocol.keygroups import (
    INT32_MAX,
    INT32_MIN,
    INT64_MAX,
    INT64_MIN,
    KEY_TYPES,
    KeyType,
    assign_to_key_group,
    check_max_parallelism,
)

__all__ = [
    "ArrowValues",
    "Utf8Column",
    "integer_keys",
    "java_hash_codes",
    "key_groups",
    "murmur_hashes",
    "operator_indexes",
    "row_count",
    "utf8_column",
]

ArrowValues: TypeAlias = "pa.Array | pa.ChunkedArray"

# String.hashCode is sum(u[i] * 31**(n-1-i)) mod 2**32 over a string's UTF-16 units. The units
# of all strings lie end to end; weighting the one at position j by 31**-(j mod _WINDOW) takes
# a slice of one table rather than a gather per unit (31 is odd: it has an inverse mod 2**32).
# Summed per piece (a run of units within one string and one window), times 31**(position of
# the piece's last unit in the window), that is the piece's own hash; the pieces of a string
# then add up shifted by the units after them.
_WINDOW_BITS = 18
_WINDOW = 1 << _WINDOW_BITS
# The multiplicative group mod 2**32 has exponent 2**30: 31**k == 31**(k mod 2**30).
_EXPONENT_BITS = 30
_LOW_BITS = 15  # _pow31 splits k into two table indexes


def _power_table(base: int, count: int) -> np.ndarray:
    """``[base**0, ..., base**(count-1)]`` mod 2**32 (uint32 arithmetic wraps)."""
    table = np.empty(count, np.uint32)
    table[0] = 1
    np.cumprod(np.full(count - 1, base, np.uint32), dtype=np.uint32, out=table[1:])
    return table


_POW = _power_table(31, _WINDOW)  # 31**k
_INV = _power_table(pow(31, -1, 1 << 32), _WINDOW)  # 31**-k
_POW_HIGH = _power_table(pow(31, 1 << _LOW_BITS, 1 << 32), 1 << (_EXPONENT_BITS - _LOW_BITS))  # 31**(k << 15)


def _pow31(exponents: np.ndarray) -> np.ndarray:
    """``31**k`` mod 2**32 for non-negative int64 ``k``."""
    k = exponents & ((1 << _EXPONENT_BITS) - 1)
    return _POW[k & ((1 << _LOW_BITS) - 1)] * _POW_HIGH[k >> _LOW_BITS]


_STRING_START, _WINDOW_START, _PAIR = 1, 2, 4  # why a piece starts where it does


def _polynomial_hashes(values: np.ndarray, offsets: np.ndarray, pairs: np.ndarray | None = None) -> np.ndarray:
    """``sum(u[j] * 31**(n-1-j))`` mod 2**32 (uint32) for every string ``values[offsets[i]:offsets[i+1]]``.

    ``offsets`` is int64 from 0. An element is one UTF-16 unit, except at the sorted indices
    ``pairs``: a surrogate pair, valued ``high * 31 + low``.
    """
    count, total = len(offsets) - 1, int(offsets[-1])
    hashes = np.zeros(count, np.uint32)
    if total == 0:
        return hashes
    lengths = np.diff(offsets)
    if pairs is None and lengths.min() == lengths.max():  # e.g. fixed-width ids: one matrix product
        length = int(lengths[0])
        return values.reshape(count, length) @ _pow31(np.arange(length - 1, -1, -1))

    products = np.empty(total, np.uint32)
    full = total - total % _WINDOW
    np.multiply(values[:full].reshape(-1, _WINDOW), _INV, out=products[:full].reshape(-1, _WINDOW))
    np.multiply(values[full:], _INV[: total - full], out=products[full:])
    # Empty strings have no piece: reduceat over an empty segment gives the element there, not 0.
    nonempty = lengths > 0
    starts, ends = offsets[:-1][nonempty], offsets[1:][nonempty]
    if pairs is None and total <= _WINDOW:  # the pieces are the strings
        hashes[nonempty] = np.add.reduceat(products, starts, dtype=np.uint32) * _POW[ends - 1]
        return hashes

    # Pieces start at every string start, every window start and every pair (so that past its
    # first element, one element of a piece is one unit).
    kind = np.zeros(total, np.uint8)
    kind[::_WINDOW] = _WINDOW_START
    if pairs is not None:
        kind[pairs] |= _PAIR
    kind[starts] |= _STRING_START
    cuts = np.flatnonzero(kind != 0)
    kinds = kind[cuts]
    is_start = (kinds & _STRING_START) != 0
    piece_ends = np.empty_like(cuts)
    piece_ends[:-1] = cuts[1:]
    piece_ends[-1] = total
    pieces = np.add.reduceat(products, cuts, dtype=np.uint32) * _POW[(piece_ends - 1) & (_WINDOW - 1)]

    string_starts = np.flatnonzero(is_start)  # the first piece of each string
    string_of_piece = np.cumsum(is_start, dtype=np.int64) - 1
    after = ends[string_of_piece] - piece_ends  # units after the piece in its string ...
    if pairs is not None:  # ... where pairs count twice
        pairs_so_far = np.cumsum((kinds & _PAIR) != 0, dtype=np.int64)  # a pair heads its piece
        last_piece = np.empty_like(string_starts)
        last_piece[:-1] = string_starts[1:] - 1
        last_piece[-1] = len(cuts) - 1
        after += pairs_so_far[last_piece][string_of_piece] - pairs_so_far
    pieces *= _pow31(after)
    hashes[nonempty] = np.add.reduceat(pieces, string_starts, dtype=np.uint32)
    return hashes


def _utf16_elements(data: np.ndarray, offsets: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """Decode valid UTF-8 for :func:`_polynomial_hashes`: ``(values, offsets, pairs)``.

    One element per code point (the offsets count code points). A supplementary-plane one is a
    surrogate pair in Java's UTF-16, high then low: listed in ``pairs``, valued ``high * 31 + low``.
    """
    leads = np.flatnonzero(data.view(np.int8) >= -0x40)  # every byte but continuations 10xxxxxx
    points = data[leads].astype(np.uint32)
    offsets = np.searchsorted(leads, offsets)
    # 110xxxxx starts 2 bytes, 1110xxxx 3, 11110xxx 4: take in one continuation byte at a time
    multi = np.flatnonzero(points >= 0xC0)
    if not len(multi):
        return points, offsets, None
    lead, at = points[multi], leads[multi] + 1
    value = ((lead & 0x1F) << 6) | (data[at] & 0x3F)
    longer = np.flatnonzero(lead >= 0xE0)
    lead, at = lead[longer], at[longer] + 1
    value3 = ((lead & 0x0F) << 12) | ((value[longer] & 0x3F) << 6) | (data[at] & 0x3F)
    four = np.flatnonzero(lead >= 0xF0)
    pairs = None
    if len(four):
        at = at[four] + 1
        above = (((lead[four] & 0x07) << 18) | ((value3[four] & 0xFFF) << 6) | (data[at] & 0x3F)) - 0x10000
        value3[four] = (0xD800 + (above >> 10)) * 31 + 0xDC00 + (above & 0x3FF)
        pairs = multi[longer[four]]
    value[longer] = value3
    points[multi] = value
    return points, offsets, pairs


class Utf8Column(NamedTuple):
    """A checked string array as numpy views: row ``i`` is ``data[offsets[i]:offsets[i+1]]``."""

    offsets: np.ndarray  # int64, rows + 1 of them, from 0
    data: np.ndarray  # uint8, valid UTF-8
    ascii: bool  # every byte < 0x80, so every byte is a UTF-16 code unit

    @property
    def rows(self) -> int:
        return len(self.offsets) - 1


def row_count(values: ArrowValues | Utf8Column) -> int:
    """How many values: of an Arrow array, or of a column :func:`utf8_column` made."""
    return values.rows if isinstance(values, Utf8Column) else len(values)


def _one_array(values: ArrowValues, what: str) -> pa.Array:
    """One array of plain values (chunks joined, a dictionary decoded: a pandas categorical, say)."""
    if isinstance(values, pa.ChunkedArray):
        chunks = values.chunks
        if pa.types.is_dictionary(values.type):
            chunks = [chunk.dictionary_decode() for chunk in chunks]
        if len(chunks) == 1:
            return chunks[0]
        kind = chunks[0].type if chunks else values.type
        kind = kind.value_type if pa.types.is_dictionary(kind) else kind
        if pa.types.is_string(kind):  # joined, 32-bit offsets could overflow
            chunks = [chunk.cast(pa.large_string()) for chunk in chunks]
        return pa.concat_arrays(chunks) if chunks else pa.array([], kind)
    if isinstance(values, pa.Array):
        return values.dictionary_decode() if pa.types.is_dictionary(values.type) else values
    raise TypeError(f"{what}s must be a pyarrow Array or ChunkedArray, got {type(values).__name__}")


class BadRow(ValueError):
    """A value of one row that cannot be used; ``row`` says which (the message says it too)."""

    def __init__(self, row: int, problem: str) -> None:
        super().__init__(f"row {row}: {problem}")
        self.row = row


def _check_no_nulls(array: pa.Array, what: str) -> None:
    if array.null_count:
        row = int(np.flatnonzero(array.is_null().to_numpy(zero_copy_only=False))[0])
        raise BadRow(row, f"{what} is null")


def utf8_column(values: ArrowValues | Utf8Column, what: str = "key") -> Utf8Column:
    """The bytes of a utf8, large_utf8 or string_view array without nulls, checked to be valid UTF-8;
    a column made by this function is taken as it is (checked once, used more than once).

    ``what`` names the values in error messages ("row 3: namespace is null").
    """
    if isinstance(values, Utf8Column):
        return values
    array = _one_array(values, what)
    kind = array.type
    if pa.types.is_string_view(kind):
        array = array.cast(pa.large_string())
    elif not (pa.types.is_string(kind) or pa.types.is_large_string(kind)):
        raise TypeError(f"{what}s must be strings (an Arrow utf8, large_utf8 or string_view array), got {kind}")
    _check_no_nulls(array, what)
    if not len(array):
        return Utf8Column(np.zeros(1, np.int64), np.empty(0, np.uint8), True)
    # What the hashing relies on, checked here (an IPC reader does not): offsets in order and in
    # bounds, and valid UTF-8 (which Arrow checks only where there are non-ASCII bytes: faster).
    try:
        array.validate()
    except pa.ArrowInvalid as exc:
        raise ValueError(f"{what}s are not a valid Arrow array: {exc}") from None
    _, offset_buffer, data_buffer = array.buffers()
    width = np.int64 if pa.types.is_large_string(array.type) else np.int32
    offsets = np.frombuffer(offset_buffer, width)[array.offset : array.offset + len(array) + 1].astype(np.int64)
    first, last = int(offsets[0]), int(offsets[-1])
    size = 0 if data_buffer is None else data_buffer.size
    if first < 0 or last > size or np.any(offsets[1:] < offsets[:-1]):
        raise ValueError(f"{what}s are not a valid Arrow array: offsets out of order or out of bounds")
    data = np.frombuffer(data_buffer, np.uint8)[first:last] if last > first else np.empty(0, np.uint8)
    offsets -= first
    ascii = not len(data) or int(data.max()) < 0x80
    if not ascii:
        try:
            array.validate(full=True)
        except pa.ArrowInvalid as exc:
            raise ValueError(_invalid_utf8(offsets, data, what) or f"{what}s are not valid: {exc}") from None
    return Utf8Column(offsets, data, ascii)


def _invalid_utf8(offsets: np.ndarray, data: np.ndarray, what: str) -> str | None:
    """Which row is not UTF-8 (slow: only for the error message)."""
    for row in range(len(offsets) - 1):
        try:
            data[offsets[row] : offsets[row + 1]].tobytes().decode("utf-8")
        except UnicodeDecodeError:
            return f"row {row}: {what} is not valid UTF-8"
    return None


def integer_keys(keys: ArrowValues, key_type: KeyType) -> np.ndarray:
    """Integer keys as numpy, checked: int32 for ``"int"`` keys, int64 for ``"long"``."""
    array = _one_array(keys, "key")
    if not pa.types.is_integer(array.type):
        raise TypeError(
            f"{key_type} keys must be integers (an Arrow int8 to int64 or uint8 to uint64 array), got {array.type}"
        )
    _check_no_nulls(array, "key")
    values = array.to_numpy()
    low, high, bits = (INT32_MIN, INT32_MAX, 32) if key_type == "int" else (INT64_MIN, INT64_MAX, 64)
    limits = np.iinfo(values.dtype)
    if len(values) and (limits.min < low or limits.max > high) and (values.min() < low or values.max() > high):
        row = int(np.argmax((values < low) | (values > high)))
        raise BadRow(row, f"{key_type} key {values[row]} is outside the {bits}-bit range")
    return values.astype(np.int32 if bits == 32 else np.int64, copy=False)


def java_hash_codes(keys: ArrowValues | Utf8Column, key_type: KeyType) -> np.ndarray:
    """Java's ``hashCode`` of every key (int32): ``String``, ``Integer`` or ``Long``. String keys
    may come as their checked :class:`Utf8Column` (made once for more than one use)."""
    if key_type == "string":
        column = utf8_column(keys)
        if column.ascii:  # the bytes are the UTF-16 units
            hashes = _polynomial_hashes(column.data, column.offsets)
        else:
            hashes = _polynomial_hashes(*_utf16_elements(column.data, column.offsets))
        return hashes.view(np.int32)
    if key_type == "int":
        return integer_keys(keys, "int").copy()  # not a read-only view of the Arrow buffer
    if key_type == "long":
        values = integer_keys(keys, "long").view(np.uint64)
        return (values ^ (values >> np.uint64(32))).astype(np.uint32).view(np.int32)
    raise ValueError(f"key_type must be one of {', '.join(KEY_TYPES)}; got {key_type!r}")


def murmur_hashes(codes: np.ndarray) -> np.ndarray:
    """Flink's ``MathUtils.murmurHash`` of int32 hash codes, non-negative (int32)."""
    h = np.asarray(codes).astype(np.int32).view(np.uint32)  # a copy: the steps below work in place
    h *= np.uint32(0xCC9E2D51)
    h = (h << np.uint32(15)) | (h >> np.uint32(17))
    h *= np.uint32(0x1B873593)
    h = (h << np.uint32(13)) | (h >> np.uint32(19))
    h *= np.uint32(5)
    h += np.uint32(0xE6546B64)
    h ^= np.uint32(4)
    h ^= h >> np.uint32(16)
    h *= np.uint32(0x85EBCA6B)
    h ^= h >> np.uint32(13)
    h *= np.uint32(0xC2B2AE35)
    h ^= h >> np.uint32(16)
    signed = h.view(np.int32)
    np.abs(signed, out=signed)  # -code for negative codes; Integer.MIN_VALUE stays negative ...
    np.maximum(signed, 0, out=signed)  # ... and becomes 0, as in Flink
    return signed


# Up to this many keys, hashing each in Python (~2 µs a key) costs less than the ~30 numpy calls
# of the whole-array path (~35 µs however few the keys).
SCALAR_ROWS = 12


def key_groups(keys: ArrowValues | Utf8Column, key_type: KeyType, max_parallelism: int) -> np.ndarray:
    """Flink's ``assignToKeyGroup`` for every key (int32). String keys may come as their
    checked :class:`Utf8Column`."""
    check_max_parallelism(max_parallelism)
    if row_count(keys) <= SCALAR_ROWS:
        return _key_groups_one_by_one(keys, key_type, max_parallelism)
    hashes = murmur_hashes(java_hash_codes(keys, key_type))
    if max_parallelism & (max_parallelism - 1) == 0:  # a power of two (the default): a mask is cheaper
        hashes &= max_parallelism - 1
    else:
        hashes %= max_parallelism
    return hashes


def _key_groups_one_by_one(keys: ArrowValues | Utf8Column, key_type: KeyType, max_parallelism: int) -> np.ndarray:
    """:func:`key_groups` of a few keys, each by :func:`statehouse.protocol.keygroups.assign_to_key_group`
    after the same checks."""
    values: list[str] | list[int]
    if key_type == "string":
        column = utf8_column(keys)
        data, bounds = column.data.tobytes(), column.offsets.tolist()
        values = [data[a:b].decode("utf-8") for a, b in pairwise(bounds)]
    elif key_type in ("int", "long"):
        values = integer_keys(keys, key_type).tolist()
    else:
        raise ValueError(f"key_type must be one of {', '.join(KEY_TYPES)}; got {key_type!r}")
    return np.array([assign_to_key_group(v, key_type, max_parallelism) for v in values], np.int32)


def operator_indexes(key_groups: np.ndarray, max_parallelism: int, parallelism: int) -> np.ndarray:
    """``computeOperatorIndexForKeyGroup`` for every key group (int32): the owning subtask."""
    check_max_parallelism(max_parallelism)
    if not 0 < parallelism <= max_parallelism:
        raise ValueError(f"parallelism must be in [1, max_parallelism={max_parallelism}], got {parallelism}")
    return (np.asarray(key_groups, np.int64) * parallelism // max_parallelism).astype(np.int32)
