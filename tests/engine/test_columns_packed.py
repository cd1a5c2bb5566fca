"""A columnar put of a binary or utf8 column packs the values for the whole column at once, and a
typed get unpacks them (``columnar_codec.pack_column`` / ``unpack_column``): the same bytes as one
value at a time, and the same rules (value types, the size limit naming the row, TTL, defaults,
nulls clearing, duplicate keys)."""

import random

import pyarrow as pa
import pytest

from statehouse.backends.columnar_codec import pack_column, unpack_column
from statehouse.backends.columns import ColumnOp, apply_columns
from statehouse.backends.errors import StateError
from statehouse.protocol.errors import InvalidValue
from statehouse.snapshots.stored.codec import decode_value, pack_value
from statehouse.snapshots.stored.descriptors import StateDescriptor
from statehouse.snapshots.stored.ttl import TtlConfig

ROWS = 300  # above the size where a put packs the column at once
LENGTHS = (0, 1, 31, 32, 100, 255, 256, 65_535, 65_536, 70_000)


def _value(kind: pa.DataType, length: int, fill: str = "a"):
    text = fill * length
    return text.encode() if pa.types.is_binary(kind) or pa.types.is_large_binary(kind) else text


@pytest.mark.parametrize("kind", [pa.binary(), pa.large_binary(), pa.string(), pa.large_string()])
def test_pack_column_gives_the_bytes_of_pack_value(kind):
    rnd = random.Random(13)
    cases = [[_value(kind, n)] * 3 for n in LENGTHS]  # one length: one header for all rows
    cases += [[_value(kind, 300), _value(kind, 1_000)], [_value(kind, 40), _value(kind, 200)]]  # one size class
    for _ in range(20):  # mixed classes, nulls, non-ASCII text
        cases.append([None if rnd.random() < 0.2 else _value(kind, rnd.choice(LENGTHS), "é") for _ in range(12)])
    for values in cases:
        array = pa.array(values, kind)
        for sliced, expected in ((array, values), (array.slice(1), values[1:])):
            packed = pack_column(sliced)
            assert packed.payloads == [None if v is None else pack_value(v) for v in expected]
            assert packed.longest == max((len(p) for p in packed.payloads if p is not None), default=0)
            assert packed.deletes == (None in expected)
    assert pack_column(pa.array([1, 2])) is None


@pytest.mark.parametrize("kind", [pa.binary(), pa.large_binary(), pa.string(), pa.large_string()])
def test_unpack_column_decodes_as_decode_value(kind):
    rnd = random.Random(7)
    cases = [[_value(kind, n)] * 3 for n in LENGTHS] + [[None, None], []]
    for _ in range(30):
        cases.append([None if rnd.random() < 0.2 else _value(kind, rnd.choice(LENGTHS), "é") for _ in range(12)])
    for values in cases:
        stored = [None if v is None else pack_value(v) for v in values]
        column = unpack_column(stored, kind)
        assert column is not None and column.type == kind
        assert column.to_pylist() == [None if p is None else decode_value(p) for p in stored]
    other = pa.string() if kind in (pa.binary(), pa.large_binary()) else pa.binary()
    for foreign in ([pack_value(1)], [pack_value(_value(other, 3))], [b"\xc4\x05ab"], [b"\xc5\x00"], [b"\xa2\xff\xfe"]):
        assert unpack_column(foreign, kind) is None  # not a value of this kind: decoded one by one


def columns(job, state, op, **cols):
    with job.transaction() as tx:
        result = apply_columns(tx, ColumnOp.parse(state, op, pa.table(cols)))
    return None if result is None else result.to_pylist()


def stored(job, state, keys):
    with job.transaction() as tx:
        return [tx.value(state).get(k) for k in keys]


@pytest.mark.parametrize(
    ("value_type", "kind"),
    [(None, pa.binary()), (None, pa.string()), ("binary", pa.binary()), ("string", pa.large_string())],
)
def test_a_packed_put_reads_back_per_op_and_follows_rows_in_order(job, value_type, kind):
    job.register_state(StateDescriptor("v", "value", value_type=value_type))
    keys = [f"k{i % 200}" for i in range(ROWS)]  # 100 keys twice: the later row wins
    values = [None if i % 7 == 0 else _value(kind, i % 40 + 250 * (i % 3), "ü") for i in range(ROWS)]
    columns(job, "v", "put", key=keys, value=pa.array([_value(kind, 1)] * ROWS, kind))
    columns(job, "v", "put", key=keys, value=pa.array(values, kind))
    expected = dict(zip(keys, values, strict=True))
    assert stored(job, "v", list(expected)) == list(expected.values())
    with job.transaction() as tx:  # the per-op path writes the same bytes
        tx.value("v").update_many(tx.value("v").locate_many(keys, [""] * ROWS), values)
    assert stored(job, "v", list(expected)) == list(expected.values())


def test_a_put_of_many_rows_keeps_the_later_row_of_a_key(job):
    # RocksDB writes a big put in key-group order: stably, so a later row of a key still wins.
    job.register_state(StateDescriptor("v", "value", value_type="binary"))
    keys = [f"k{i % 100}" for i in range(3 * ROWS)]  # every key nine times, the rows of a key apart
    values = [str(i).encode() for i in range(3 * ROWS)]
    columns(job, "v", "put", key=keys, value=pa.array(values))
    expected = dict(zip(keys, values, strict=True))
    assert stored(job, "v", list(expected)) == list(expected.values())


def test_a_packed_put_of_the_wrong_type_is_refused_as_any_put(job):
    job.register_state(StateDescriptor("v", "value", value_type="string"))
    with pytest.raises(InvalidValue) as caught:
        columns(job, "v", "put", key=[f"k{i}" for i in range(ROWS)], value=pa.array([b"x"] * ROWS))
    assert caught.value.extra["row"] == 0


def test_a_packed_value_over_the_limit_names_its_row_and_applies_nothing(job):
    job.register_state(StateDescriptor("v", "value", value_type="binary"))
    limit = job.limits.max_value_bytes
    values = [b"x"] * ROWS
    values[200] = b"x" * limit  # its msgpack header takes it over
    keys = [f"k{i}" for i in range(ROWS)]
    with pytest.raises(StateError) as caught:
        columns(job, "v", "put", key=keys, value=pa.array(values))
    assert caught.value.code == "value_too_large" and caught.value.extra["row"] == 200
    assert stored(job, "v", keys[:3]) == [None, None, None]


def test_a_packed_put_into_a_ttl_state_expires(job, clock):
    job.register_state(StateDescriptor("v", "value", value_type="binary", ttl=TtlConfig(100)))
    keys = [f"k{i}" for i in range(ROWS)]
    columns(job, "v", "put", key=keys, value=pa.array([b"abc"] * ROWS))
    assert columns(job, "v", "get", key=keys[:2]) == [b"abc", b"abc"]
    clock.advance(200)
    assert columns(job, "v", "get", key=keys[:2]) == [None, None]


def test_rows_kept_as_columns_read_as_their_last_values_and_stay_theirs():
    from statehouse.backends.base.transaction import PartitionTransaction, StagedView
    from statehouse.backends.heap.partition import HeapPartition

    partition = HeapPartition(128)
    partition.create_table("t", nested=False)
    request = PartitionTransaction(partition)
    request.put_many("t", [1, 1, 2], [b"a", b"a", b"b"], [b"x", b"y", None])  # in order: the last row wins
    assert request.get("t", 1, b"a") == b"y" and request.get("t", 2, b"b") is None
    request = PartitionTransaction(partition)
    request.put_many("t", [1, 1], [b"a", b"a"], [b"x", b"y"])
    flat, ops = request.changes()
    view = StagedView(partition)  # takes the rows over, then changes its own copy
    view.write_changes(flat, ops)
    view.put("t", 1, b"a", b"z")
    assert view.get("t", 1, b"a") == b"z"
    assert dict(flat["t"]) == {(1, b"a"): b"y"} and request.get("t", 1, b"a") == b"y"
    request.commit()
    assert partition.get("t", 1, b"a") == b"y"


@pytest.mark.parametrize(("value_type", "kind"), [("binary", pa.binary()), ("string", pa.string())])
def test_a_typed_get_of_many_rows_reads_what_the_per_op_path_reads(job, value_type, kind):
    job.register_state(StateDescriptor("v", "value", value_type=value_type))
    keys = [f"k{i}" for i in range(ROWS)]
    values = [None if i % 5 == 0 else _value(kind, i % 70 + 200 * (i % 2), "ß") for i in range(ROWS)]
    columns(job, "v", "put", key=keys, value=pa.array(values, kind))
    assert columns(job, "v", "get", key=keys) == values == stored(job, "v", keys)


def test_a_typed_get_of_values_stored_untyped_decodes_them_one_by_one(job):
    from statehouse.snapshots.stored.arrow import UntypedValues

    job.register_state(StateDescriptor("v", "value", value_type="binary"))
    keys = [f"k{i}" for i in range(ROWS)]
    columns(job, "v", "put", key=keys, value=pa.array([b"x"] * (ROWS - 1) + [b"y"]))
    with job.transaction() as tx:  # a value the type does not allow (say, restored from an older state)
        state = tx.value("v")
        tx._tx.put("v", *job.keyspace.locate(keys[0], state.descriptor.key_type, ""), pack_value(7))
    with pytest.raises(UntypedValues):  # as any read of such values answers
        columns(job, "v", "get", key=keys)
    assert columns(job, "v", "get", key=keys[1:])[-1] == b"y"


def test_a_typed_get_of_many_rows_follows_ttl_and_defaults(job, clock):
    ttl = TtlConfig(100, visibility="return_expired_if_not_cleaned_up", cleanup_incremental_size=0)
    job.register_state(StateDescriptor("v", "value", value_type="string", ttl=ttl))
    job.register_state(StateDescriptor("d", "value", value_type="string", default="none"))
    keys = [f"k{i % 150}" for i in range(ROWS)]  # every key twice
    columns(job, "v", "put", key=keys[:150], value=pa.array(["a"] * 150))
    clock.advance(200)
    read = columns(job, "v", "get", key=keys)
    assert read == ["a"] * 150 + [None] * 150  # expired: returned once, then cleared
    assert columns(job, "d", "get", key=keys) == ["none"] * ROWS


def test_numbers_packed_at_once_are_the_packers_bytes():
    """A column of floats, or of ints of one msgpack format, packs in numpy to exactly what
    ``pack_value`` gives one by one; anything else is left to it (``None``)."""
    from statehouse.backends.columnar_codec import pack_numbers
    from statehouse.snapshots.stored.codec import pack_value

    packed = [
        [0, 1, 127], [-1, -32], [128, 255], [256, 65535], [65536, 2**32 - 1], [-33, -128], [-129, -32768],
        [-32769, -(2**31)], [1.5, -0.0, 1e300, 5e-324, 0.1],
    ]  # fmt: skip
    for values in packed:
        numbers = pack_numbers(values)
        assert numbers is not None, values
        assert numbers.payloads == [pack_value(v) for v in values], values
        assert numbers.longest == max(map(len, numbers.payloads)) and not numbers.deletes
    for values in ([2**32], [0, 128], [1, -1], [True], [1, 2.0], [float("nan")], [2**63], [None, 1.0], []):
        assert pack_numbers(values) is None, values
