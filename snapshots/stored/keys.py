"""The RocksDB key layout (Flink's ``RocksDBKeyedStateBackend``): one column family per table, a
stored key ``key-group prefix + primary + secondary`` (the primary is ``codec.encode_primary``'s
key and namespace fields, the secondary a map entry's user key), the prefix big-endian in 1 byte
when max parallelism <= 128 and 2 bytes otherwise, so every key group, and every range of key
groups, is one contiguous byte range. Shared with the client distribution: a checkpoint reader
opens an incremental part's files and cuts their keys the way the backend wrote them."""

from __future__ import annotations

from statehouse.snapshots.stored.codec import split_nested_key

# A state named "default" would be RocksDB's own default column family (the job's metadata):
# its column family gets a name no state can have ("$" cannot occur in names).
DEFAULT_FAMILY = "default"
_DEFAULT_STATE_FAMILY = "$default"
# The job's max parallelism, a row of the default column family (the job's metadata): a reader
# of a database checks it against the snapshot's metadata before cutting keys by it.
MAX_PARALLELISM_KEY = b"max_parallelism"


def column_family(table: str) -> str:
    """The column family of a (non-meta) table."""
    return _DEFAULT_STATE_FAMILY if table == DEFAULT_FAMILY else table


def key_group_prefix_width(max_parallelism: int) -> int:
    """Flink's rule: 1 byte when max parallelism ≤ 128, else 2."""
    return 1 if max_parallelism <= 128 else 2


def prefix_successor(prefix: bytes) -> bytes | None:
    """The smallest byte string greater than every string starting with ``prefix``."""
    stripped = prefix.rstrip(b"\xff")
    if not stripped:
        return None
    return stripped[:-1] + bytes([stripped[-1] + 1])


def key_group_prefix(key_group: int, width: int) -> bytes:
    return key_group.to_bytes(width, "big")


def split_key(key: bytes, width: int, nested: bool) -> tuple[int, bytes, bytes]:
    """A stored key of a keyed table as ``(key group, primary, secondary)``."""
    key_group = int.from_bytes(key[:width], "big")
    if not nested:
        return key_group, key[width:], b""
    primary, secondary = split_nested_key(key, width)
    return key_group, primary, secondary
