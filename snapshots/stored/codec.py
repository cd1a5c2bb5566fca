"""How keys and values become bytes, the same for every backend.

Stored layout (so a snapshot is independent of the backend and of the wire format):

* primary key: ``key bytes + namespace`` (the key group is kept beside it; the RocksDB
  backend prepends it as a 1- or 2-byte big-endian prefix, as Flink does)
  - the key as a field (4-byte big-endian length + bytes): UTF-8 for string keys; 4 (int)
    or 8 (long) big-endian bytes with the sign bit flipped, so byte order is numeric order
  - the namespace as a field of UTF-8
* secondary key: the map user key as UTF-8 (empty for the other kinds)
* value: msgpack; with TTL, an 8-byte big-endian timestamp first (Flink's ``TtlValue``)
* list: the elements' records concatenated, so ``add`` appends bytes without decoding
"""

from __future__ import annotations

import functools
import math
import re
import struct
from collections.abc import Iterator, Sequence
from typing import Any

import msgpack

from statehouse.protocol.errors import InvalidKey, InvalidValue, ValueTooDeep
from statehouse.protocol.keygroups import INT32_MAX, INT32_MIN, INT64_MAX, INT64_MIN, KeyType

_LEN = struct.Struct(">I")
FIELD_HEADER_BYTES = _LEN.size  # a stored field: its length, then its bytes
_TS = struct.Struct(">q")
_I32 = struct.Struct(">I")
_I64 = struct.Struct(">Q")

_packer = msgpack.Packer(use_bin_type=True)


# What a value may hold: what both wire formats read back as they were written. JSON has no
# NaN or infinities and only string object keys; msgpack's ext types have no JSON form at all.
# (Integers outside [-2**63, 2**64) are refused by the packer; bytes read back base64 in JSON.)
_SCALARS = frozenset({str, int, bool, bytes, type(None)})
_SCALARS_OR_FLOAT = _SCALARS | {float}


# How deep lists and objects may nest in a value: every answer format must write back what was
# stored, and orjson writes no more than 254 levels (a deeper value could be stored, and every JSON
# read of it would be a 500). 64 leaves room for any answer's envelope and is Arrow IPC's own limit.
MAX_DEPTH = 64
_CONTAINERS = (list, tuple, dict)


def check_value(value: Any) -> None:
    """Refuse a value that would not read back as written through every wire format, or that
    nests lists and objects deeper than :data:`MAX_DEPTH`. Iterative: a value nested thousands of
    levels deep is refused, not a ``RecursionError``."""
    kind = type(value)
    if kind in _SCALARS:
        return
    if kind not in _CONTAINERS:
        _check_leaf(value)
        return
    pending: list[tuple[Any, int]] = [(value, 1)]
    while pending:
        container, depth = pending.pop()
        if type(container) is dict:
            for key in container:
                if type(key) is not str:
                    raise InvalidValue(
                        f"object keys must be strings; got {type(key).__name__} {key!r} (JSON cannot carry it)"
                    )
            items = container.values()
        else:
            items = container
        for item in items:
            kind = type(item)
            if kind in _SCALARS:
                continue
            if kind in _CONTAINERS:
                if depth == MAX_DEPTH:
                    raise InvalidValue(
                        f"the value nests lists or objects deeper than {MAX_DEPTH} levels: store it flatter "
                        "(or as a string or bytes)"
                    )
                pending.append((item, depth + 1))
            else:
                _check_leaf(item)


def _check_leaf(value: Any) -> None:
    kind = type(value)
    if kind is not float:
        raise InvalidValue(
            f"a {kind.__name__} cannot be stored: use null, booleans, numbers, strings, bytes, lists, objects"
        )
    if not math.isfinite(value):
        raise InvalidValue(f"{value} is not a number JSON can carry: send a finite number")


def all_plain(values: Sequence[Any]) -> bool:
    """Whether every value passes :func:`check_value` by its type alone (the usual column), or
    is a finite float; otherwise check them one by one."""
    kinds = set(map(type, values))
    if kinds <= _SCALARS:
        return True
    return kinds <= _SCALARS_OR_FLOAT and all(map(math.isfinite, (v for v in values if type(v) is float)))


def encode_value(value: Any) -> bytes:
    check_value(value)
    return pack_value(value)


def pack_value(value: Any) -> bytes:
    """:func:`encode_value` of a value already checked."""
    try:
        return _packer.pack(value)
    except (TypeError, ValueError, OverflowError) as exc:
        raise InvalidValue(f"value cannot be stored: {exc} (integers must be in [-2**63, 2**64))") from None


def too_deep(answer: str) -> ValueTooDeep:
    """The problem of a stored value nested deeper than ``answer`` can carry."""
    return ValueTooDeep(
        f"a stored value nests lists or objects deeper than {answer} (it was stored before values "
        f"were limited to {MAX_DEPTH} levels, or restored from such a snapshot)"
    )


def _undecodable() -> ValueTooDeep:
    return too_deep("msgpack can be decoded here (1024 levels): no format can answer it; clear or overwrite the key")


def decode_value(data: bytes) -> Any:
    try:
        return msgpack.unpackb(data, raw=False, strict_map_key=False)
    except msgpack.StackError:
        raise _undecodable() from None


def decode_many(raws: list[bytes | None]) -> list[Any]:
    """:func:`decode_value` of many stored values (``None`` stays ``None``) in one C loop."""
    present = [raw for raw in raws if raw is not None]
    if not present:
        return [None] * len(raws)
    values = unpack_joined(b"".join(present), len(present))
    if values is None:
        values = [decode_value(raw) for raw in present]
    if len(present) == len(raws):
        return values
    decoded = iter(values)
    return [None if raw is None else next(decoded) for raw in raws]


def unpack_joined(data: bytes | memoryview, count: int) -> list[Any] | None:
    """``count`` stored values written one after the other, decoded in one C loop; ``None`` when
    the bytes are not exactly ``count`` msgpack objects (a stored value is one: never trust it
    blindly; decode them one by one to learn which is not)."""
    unpacker = msgpack.Unpacker(raw=False, strict_map_key=False, max_buffer_size=max(len(data), 1))
    unpacker.feed(data)
    try:
        values = list(unpacker)
    except msgpack.StackError:
        raise _undecodable() from None
    except (ValueError, msgpack.UnpackException):
        return None
    return values if len(values) == count else None


def iter_values(data: bytes) -> Iterator[Any]:
    """Decode a concatenation of msgpack values (a stored list)."""
    unpacker = msgpack.Unpacker(raw=False, strict_map_key=False)
    unpacker.feed(data)
    try:
        yield from unpacker
    except msgpack.StackError:
        raise _undecodable() from None


def encode_timestamped(timestamp: int, payload: bytes) -> bytes:
    return _TS.pack(timestamp) + payload


def split_timestamped(data: bytes) -> tuple[int, bytes]:
    return _TS.unpack_from(data)[0], data[8:]


def iter_timestamped(data: bytes) -> Iterator[tuple[int, Any]]:
    """Decode a stored TTL list: records of 8-byte timestamp + msgpack value."""
    unpacker = msgpack.Unpacker(raw=False, strict_map_key=False)
    unpacker.feed(data)
    while True:
        try:
            head = unpacker.read_bytes(8)
        except msgpack.OutOfData:  # pragma: no cover - read_bytes returns short instead
            return
        if len(head) < 8:
            return
        try:
            value = unpacker.unpack()
        except msgpack.StackError:
            raise _undecodable() from None
        yield _TS.unpack(head)[0], value


def _field(data: bytes) -> bytes:
    return _LEN.pack(len(data)) + data


_DECIMAL = re.compile(r"0|-?[1-9][0-9]*")  # one form per number: no "-0"


def parse_decimal(text: str) -> int | None:
    """The integer a text names in its one canonical form (ASCII digits, no sign but ``-``, no
    leading zeros, no spaces or ``_``), else ``None``: ``int()`` would also take ``" +1_000 "``
    and other scripts' digits, so one key would have many names."""
    return int(text) if _DECIMAL.fullmatch(text) and len(text) <= 20 else None


def parse_key(text: str, key_type: KeyType) -> str | int:
    """A key given as text (a URL path segment): itself for string keys, the canonical decimal
    form for int and long keys."""
    if key_type == "string":
        return text
    key = parse_decimal(text)
    if key is None:
        raise InvalidKey(
            f"this state has {key_type} keys; {text!r} is not an integer in canonical form "
            "(ASCII digits, optional leading '-', no leading zeros, no spaces, no '-0')"
        )
    return key


def encode_key(key: str | int, key_type: KeyType) -> bytes:
    """A length-prefixed field, so a primary key is self-delimiting whatever the key type."""
    if key_type == "string":
        if not isinstance(key, str):
            raise InvalidKey(f"this state has string keys; got {type(key).__name__} {key!r}")
        return _field(key.encode("utf-8", "surrogatepass"))
    if isinstance(key, bool) or not isinstance(key, int):
        raise InvalidKey(f"this state has {key_type} keys; got {type(key).__name__} {key!r}")
    if key_type == "int":
        if not INT32_MIN <= key <= INT32_MAX:
            raise InvalidKey(f"int key {key} is outside the 32-bit range")
        return _field(_I32.pack(key + (1 << 31)))
    if not INT64_MIN <= key <= INT64_MAX:
        raise InvalidKey(f"long key {key} is outside the 64-bit range")
    return _field(_I64.pack(key + (1 << 63)))


@functools.lru_cache(maxsize=1024)
def encode_namespace(namespace: str) -> bytes:
    # Cached: a job uses few namespaces (often only ""), and every keyed operation encodes one.
    return _field(namespace.encode("utf-8"))


def encode_primary(key: str | int, key_type: KeyType, namespace: str) -> bytes:
    return encode_key(key, key_type) + encode_namespace(namespace)


def encode_fields(*parts: str) -> bytes:
    """A primary key of length-prefixed UTF-8 fields (operator state uses two)."""
    return b"".join(_field(p.encode("utf-8")) for p in parts)


def _read_fields(data: bytes, pos: int, count: int) -> tuple[list[bytes], int]:
    fields = []
    for _ in range(count):
        (n,) = _LEN.unpack_from(data, pos)
        fields.append(data[pos + 4 : pos + 4 + n])
        pos += 4 + n
    return fields, pos


def split_nested_key(key: bytes, offset: int) -> tuple[bytes, bytes]:
    """Cut ``prefix + primary + secondary`` after the primary's two fields."""
    _fields, end = _read_fields(key, offset, 2)
    return key[offset:end], key[end:]


def decode_primary(primary: bytes, key_type: KeyType) -> tuple[str | int, str]:
    """Inverse of :func:`encode_primary`: ``(key, namespace)``."""
    (raw_key, raw_ns), _end = _read_fields(primary, 0, 2)
    if key_type == "string":
        key: str | int = raw_key.decode("utf-8", "surrogatepass")
    elif key_type == "int":
        key = _I32.unpack(raw_key)[0] - (1 << 31)
    else:
        key = _I64.unpack(raw_key)[0] - (1 << 63)
    return key, raw_ns.decode("utf-8")


def decode_fields(primary: bytes, count: int) -> list[str]:
    return [f.decode("utf-8") for f in _read_fields(primary, 0, count)[0]]


def encode_user_key(user_key: str) -> bytes:
    if not isinstance(user_key, str):
        raise InvalidKey(f"map user keys are strings; got {type(user_key).__name__} {user_key!r}")
    return user_key.encode("utf-8")


def decode_user_key(data: bytes) -> str:
    return data.decode("utf-8")
