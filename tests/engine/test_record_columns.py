"""Stored records read as columns (what a live scan and a checkpoint reader hand Spark) give the
very table the row-at-a-time reading gives: every kind, key type, value type, namespace and TTL
visibility, and the records the column reading hands back to the rows (malformed, not UTF-8).
Stored keys split as columns as a restore splits them one by one."""

from __future__ import annotations

import itertools
import struct
from typing import Any

import pyarrow as pa
import pytest

from statehouse.snapshots.stored.arrow import decode_record, rows_table
from statehouse.snapshots.stored.codec import encode_primary, encode_timestamped, encode_user_key, pack_value
from statehouse.snapshots.stored.descriptors import StateDescriptor
from statehouse.snapshots.stored.keys import key_group_prefix, key_group_prefix_width, split_key
from statehouse.snapshots.stored.record_columns import records_table, split_stored_keys, visibility
from statehouse.snapshots.stored.ttl import TtlConfig

NOW = 2_500
ROWS = 600
TTLS = {
    "none": None,
    "never-expired": TtlConfig(ttl_ms=1_000),
    "expired-if-not-cleaned": TtlConfig(ttl_ms=1_000, visibility="return_expired_if_not_cleaned_up"),
}


def by_rows(descriptor: StateDescriptor, *columns: Any) -> pa.Table:
    """The row-at-a-time reading: the rule the columns must match."""
    rows = []
    for kg, primary, secondary, raw in zip(*columns, strict=True):
        decoded = decode_record(descriptor.kind, descriptor.ttl, raw, NOW)
        if decoded is not None:
            rows.append((kg, primary, secondary, *decoded))
    return rows_table(descriptor, rows)


def key_of(i: int, key_type: str) -> str | int:
    if key_type == "string":
        return f"k{i}-ü{'x' * (i % 5)}"  # multi-byte UTF-8, varying lengths
    if key_type == "int":
        return (i * 7_919 - 2_000_000) % (1 << 32) - (1 << 31)
    return i * 10**15 - (1 << 62)


def value_of(i: int, descriptor: StateDescriptor) -> Any:
    if descriptor.function == "avg":
        return [float(i), 1 + i % 3]
    return {
        "float64": float(i) / 3,
        "int64": i * 12_345 - 10**6 + (1 << 62) * (i % 2),
        "string": f"v{i}é",
        None: {"a": [i, None], "b": "x" * (i % 4)},
    }[descriptor.value_type]


def stored(descriptor: StateDescriptor, namespace: str = "") -> tuple[list, list, list, list]:
    """Records as a backend stores them; written over time, so some have expired by ``NOW``."""
    groups, primaries, secondaries, records = [], [], [], []
    for i in range(ROWS):
        groups.append(i % 128)
        primaries.append(encode_primary(key_of(i, descriptor.key_type), descriptor.key_type, namespace * (i % 2)))
        secondaries.append(encode_user_key(f"u{i}-ß") if descriptor.kind == "map" else b"")
        if descriptor.kind == "list":
            raw = b"".join(
                encode_timestamped(500 + i + j * 400, pack_value(i + j)) if descriptor.ttl else pack_value(i + j)
                for j in range(1 + i % 3)
            )
        else:
            raw = pack_value(value_of(i, descriptor))
            raw = encode_timestamped(i * 5, raw) if descriptor.ttl else raw
        records.append(raw)
    return groups, primaries, secondaries, records


DESCRIPTORS = [
    pytest.param(
        StateDescriptor("s", kind, key_type=key_type, value_type=value_type, ttl=TTLS[ttl]),
        id=f"{kind}-{key_type}-{value_type}-{ttl}",
    )
    for kind, key_type, value_type, ttl in itertools.product(
        ("value", "map"), ("string", "int", "long"), ("float64", "int64", "string", None), TTLS
    )
] + [
    pytest.param(StateDescriptor("r", "reducing", function="sum", value_type="float64"), id="reducing-sum"),
    pytest.param(StateDescriptor("a", "aggregating", function="avg", value_type="float64"), id="aggregating-avg"),
    pytest.param(StateDescriptor("l", "list", value_type="int64", ttl=TTLS["never-expired"]), id="list-ttl"),
    pytest.param(StateDescriptor("l", "list", key_type="long", value_type="int64"), id="list"),
]


@pytest.mark.parametrize("namespace", ["", "window-1"])
@pytest.mark.parametrize("descriptor", DESCRIPTORS)
def test_records_read_as_columns_equal_the_rows_read_one_by_one(descriptor: StateDescriptor, namespace: str) -> None:
    columns = stored(descriptor, namespace)
    expected = by_rows(descriptor, *columns)
    assert expected.num_rows > 0
    found = records_table(descriptor, *columns, NOW)
    assert found.schema == expected.schema
    assert found.equals(expected)
    if descriptor.ttl is not None and not descriptor.ttl.return_expired:
        assert expected.num_rows < ROWS  # the case reads past expired records
    keeps = visibility(descriptor, NOW)
    kept = ROWS if keeps is None else sum(map(keeps, columns[3]))
    assert kept == expected.num_rows  # what a scan counts toward its page is what it returns


def test_an_empty_read_is_an_empty_table_of_the_states_columns() -> None:
    descriptor = StateDescriptor("s", "value", value_type="float64", ttl=TTLS["never-expired"])
    assert records_table(descriptor, [], [], [], [], NOW).equals(by_rows(descriptor, [], [], [], []))
    expired = [[0], [encode_primary("k", "string", "")], [b""], [encode_timestamped(0, pack_value(1.0))]]
    assert records_table(descriptor, *expired, NOW).num_rows == 0


def test_floats_stored_as_integers_read_as_floats_like_the_rows() -> None:
    descriptor = StateDescriptor("s", "value", value_type="float64")
    groups, primaries, secondaries, records = stored(descriptor)
    records[7] = pack_value(7)  # a float64 state holding an int, as a sum of ints could leave it
    assert records_table(descriptor, groups, primaries, secondaries, records, NOW).equals(
        by_rows(descriptor, groups, primaries, secondaries, records)
    )


@pytest.mark.parametrize(
    "damage",
    ["primary-too-short", "primary-overlong-key", "primary-trailing-bytes", "key-not-utf8", "value-two-objects"],
)
def test_records_the_columns_cannot_take_read_row_by_row_with_the_same_result(damage: str) -> None:
    descriptor = StateDescriptor("s", "value", value_type="int64")
    groups, primaries, secondaries, records = stored(descriptor)
    if damage == "primary-too-short":
        primaries[3] = b"\x00\x00"
    elif damage == "primary-overlong-key":
        primaries[3] = b"\x00\x00\x00\xff" + primaries[3][4:]
    elif damage == "primary-trailing-bytes":
        primaries[3] += b"\x01"
    elif damage == "key-not-utf8":
        primaries[3] = b"\x00\x00\x00\x01\xff\x00\x00\x00\x00"  # one key byte, 0xff: never UTF-8
    else:
        records[3] = pack_value(1) + pack_value(2)
    columns = (groups, primaries, secondaries, records)
    expected = outcome(lambda: by_rows(descriptor, *columns))
    found = outcome(lambda: records_table(descriptor, *columns, NOW))
    if isinstance(expected, pa.Table):
        assert isinstance(found, pa.Table) and found.equals(expected)
    else:
        assert found is expected


def outcome(read: Any) -> Any:
    """The table read, or the type of what the reading raised."""
    try:
        return read()
    except Exception as exc:
        return type(exc)


@pytest.mark.parametrize("max_parallelism", [128, 32_768])
@pytest.mark.parametrize("nested", [False, True], ids=["flat", "nested"])
def test_stored_keys_split_as_columns_as_a_restore_splits_them(max_parallelism: int, nested: bool) -> None:
    width = key_group_prefix_width(max_parallelism)
    keys = [
        key_group_prefix(i * 37 % max_parallelism, width)
        + encode_primary(key_of(i, "string"), "string", "ns" * (i % 2))
        + (encode_user_key(f"u{i}") if nested else b"")
        for i in range(ROWS)
    ]
    groups, primaries, secondaries = split_stored_keys(keys, width, nested)
    split = [split_key(key, width, nested) for key in keys]
    assert list(groups) == [s[0] for s in split]
    assert primaries.to_pylist() == [s[1] for s in split]
    assert secondaries.to_pylist() == [s[2] for s in split]
    if nested:  # a key too short for its primary's fields: split one by one, which says so
        with pytest.raises(struct.error):
            split_stored_keys([*keys, key_group_prefix(1, width) + b"\x00\x00\x00\x09ab"], width, nested)
