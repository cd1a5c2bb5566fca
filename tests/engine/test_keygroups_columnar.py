"""The vectorized key groups and stored keys, row for row the same as the scalar functions
(which the client tests check against Flink's own values)."""

from __future__ import annotations

import random
import subprocess
import sys
from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from statehouse.backends.columnar_codec import EncodedPrimaries, encode_primaries, prefixed
from statehouse.protocol.keygroups import (
    INT32_MAX,
    INT32_MIN,
    INT64_MAX,
    INT64_MIN,
    assign_to_key_group,
    columnar,
    java_hash_code,
    murmur_hash,
    operator_index,
)
from statehouse.protocol.keygroups.columnar import java_hash_codes, key_groups, murmur_hashes, operator_indexes
from statehouse.snapshots.stored.codec import encode_primary

MAX_PARALLELISMS = (1, 2, 128, 129, 4096, 32768)
INT_EDGES = [INT32_MIN, INT32_MIN + 1, -(1 << 16), -1, 0, 1, 42, 1 << 16, INT32_MAX - 1, INT32_MAX]
LONG_EDGES = [INT64_MIN, INT64_MIN + 1, INT32_MIN - 1, *INT_EDGES, INT32_MAX + 1, 1 << 32, INT64_MAX - 1, INT64_MAX]
# Code points where UTF-8 and UTF-16 change length, and the ends of the planes (no surrogates:
# Arrow strings are valid UTF-8).
BOUNDARY_CHARS = "\x00\x7f\x80\u07ff\u0800\ud7ff\ue000\uffff\U00010000\U0010ffff"


def assert_rows(got: Sequence[Any] | np.ndarray, expected: Sequence[Any], inputs: Sequence[Any]) -> None:
    """Row for row, naming the first row that differs."""
    got = list(got.tolist() if isinstance(got, np.ndarray) else got)
    assert len(got) == len(expected), f"{len(got)} results for {len(expected)} rows"
    for row, (g, e) in enumerate(zip(got, expected, strict=True)):
        if g != e:
            shown = repr(inputs[row])
            pytest.fail(f"row {row} ({shown[:80]}{'...' if len(shown) > 80 else ''}): got {g!r}, expected {e!r}")


def assert_key_groups(keys: pa.Array | pa.ChunkedArray, key_type: str, values: Sequence[Any]) -> None:
    """Hash codes, and key groups for every max parallelism, against the scalar functions."""
    codes = [java_hash_code(v, key_type) for v in values]
    assert_rows(java_hash_codes(keys, key_type), codes, values)
    murmurs = [murmur_hash(c) for c in codes]
    assert_rows(key_groups(keys, key_type, 128), [assign_to_key_group(v, key_type, 128) for v in values], values)
    for max_parallelism in MAX_PARALLELISMS:  # assign_to_key_group is murmur_hash(code) % max_parallelism
        assert_rows(key_groups(keys, key_type, max_parallelism), [m % max_parallelism for m in murmurs], values)


def random_text(rng: random.Random) -> str:
    """A key from one of several alphabets, of a length from 0 to a few thousand."""
    alphabet = rng.choice(
        [
            [(0x20, 0x7E)],  # ASCII
            [(0x20, 0x7E), (0xA0, 0xFF)],  # Latin-1
            [(0x4E00, 0x9FFF)],  # CJK
            [(0x1F300, 0x1FAFF)],  # emoji: surrogate pairs in UTF-16
            [(0x20, 0x7E), (0x391, 0x3C9), (0x4E00, 0x4E80), (0x1F600, 0x1F64F), (0x10000, 0x10FFFF)],
        ]
    )
    length = rng.choice([0, 1, 2, rng.randint(3, 24), rng.randint(3, 24)])
    if rng.random() < 0.01:
        length = rng.randint(25, 3000)
    chars = []
    for _ in range(length):
        low, high = rng.choice(alphabet)
        chars.append(chr(rng.randint(low, high)))
    if length and rng.random() < 0.1:
        chars[rng.randrange(length)] = rng.choice(BOUNDARY_CHARS)
    return "".join(chars)


@pytest.fixture(scope="module")
def unicode_keys() -> list[str]:
    rng = random.Random(20240607)
    keys = [random_text(rng) for _ in range(100_000)]
    # Strings longer than a hashing window, so one string spans windows, with pairs in them.
    keys[500] = "a\U0001f600é中" * 80_000
    keys[77_777] = "x" * (columnar._WINDOW + 3)
    return keys


@pytest.mark.slow
def test_string_keys_match_the_scalar_hash_on_100k_random_unicode_keys(unicode_keys):
    units = sum(len(k.encode("utf-16-le")) // 2 for k in unicode_keys)
    assert units > 4 * columnar._WINDOW  # pieces cross windows
    assert_key_groups(pa.array(unicode_keys), "string", unicode_keys)


def test_sliced_chunked_and_large_string_arrays(unicode_keys):
    keys = unicode_keys[:30_000]
    array = pa.array(keys)
    assert_key_groups(array.slice(1_234, 20_000), "string", keys[1_234:21_234])
    assert_key_groups(pa.array(keys, pa.large_string()).slice(7, 5_000), "string", keys[7:5_007])
    assert_key_groups(pa.array(keys, pa.string_view()), "string", keys)
    chunked = pa.chunked_array([array.slice(0, 100), pa.array([], pa.string()), array.slice(100, 9_000), array[9_100:]])
    assert_key_groups(chunked, "string", keys)
    assert_key_groups(pa.chunked_array([array.slice(5, 10)]), "string", keys[5:15])
    assert_key_groups(pa.chunked_array([], pa.string()), "string", [])
    assert_key_groups(array.slice(10, 10_000).dictionary_encode(), "string", keys[10:10_010])
    categories = pa.chunked_array([pa.array(["b", "a", "b"]).dictionary_encode(), pa.array(["c"]).dictionary_encode()])
    assert_key_groups(categories, "string", ["b", "a", "b", "c"])


@pytest.mark.parametrize(
    "keys",
    [
        pytest.param([f"user-{i:010d}" for i in range(5_000)], id="ascii-one-length"),
        pytest.param([f"user-{i}" * (i % 7) for i in range(5_000)], id="ascii-lengths-vary"),
        pytest.param(["" for _ in range(100)], id="all-empty"),
        pytest.param(["", "a", "", "", "bc", ""], id="empty-between"),
        pytest.param(["中文字" for _ in range(100)] + ["日本", "ß"], id="bmp-lengths-vary"),
        pytest.param(["中文字", "éèê", "ab\u0800"], id="bmp-one-length"),
        pytest.param(["\U0001f600", "a\U0001f600", "\U0001f600b", "\U0001f600\U0001f601", ""], id="pairs"),
        pytest.param([*BOUNDARY_CHARS, BOUNDARY_CHARS, BOUNDARY_CHARS[::-1]], id="boundaries"),
        pytest.param(["x"], id="one"),
        pytest.param([], id="none"),
    ],
)
def test_string_keys_on_each_path(keys):
    assert_key_groups(pa.array(keys, pa.string()), "string", keys)


def test_flink_reference_values():
    # From Flink (tests/client/test_keygroups.py): the columnar functions agree without the scalar ones.
    keys = pa.array(["", "a", "hello", "flink", "user-1", "日本"])
    assert java_hash_codes(keys, "string").tolist() == [0, 97, 99162322, 97520992, -836031825, 835047]
    assert key_groups(keys, "string", 128).tolist() == [94, 81, 35, 98, 121, 95]
    ints = pa.array([0, 1, 42, -1, INT32_MAX, INT32_MIN], pa.int32())
    assert key_groups(ints, "int", 128).tolist() == [94, 86, 29, 80, 62, 108]
    assert key_groups(ints, "int", 32768).tolist() == [31198, 16342, 28189, 15184, 19646, 10348]
    assert key_groups(pa.array([-1, 1 << 32]), "long", 128).tolist() == [94, 86]


INT_TYPES = [pa.int8(), pa.int16(), pa.int32(), pa.int64(), pa.uint8(), pa.uint16(), pa.uint32(), pa.uint64()]


def fitting(values: list[int], kind: pa.DataType) -> list[int]:
    bits = kind.bit_width
    low, high = (0, (1 << bits) - 1) if pa.types.is_unsigned_integer(kind) else (-(1 << bits - 1), (1 << bits - 1) - 1)
    return [v for v in values if low <= v <= high]


@pytest.mark.parametrize("kind", INT_TYPES, ids=str)
def test_int_keys_of_every_integer_type(kind):
    rng = random.Random(7)
    values = fitting(INT_EDGES + [rng.randint(INT32_MIN, INT32_MAX) for _ in range(20_000)], kind)
    values = fitting([v for v in values if INT32_MIN <= v <= INT32_MAX], kind)
    assert_key_groups(pa.array(values, kind), "int", values)


@pytest.mark.parametrize("kind", INT_TYPES, ids=str)
def test_long_keys_of_every_integer_type(kind):
    rng = random.Random(8)
    values = fitting(LONG_EDGES + [rng.randint(INT64_MIN, INT64_MAX) for _ in range(20_000)], kind)
    values = [v for v in values if v <= INT64_MAX]
    assert_key_groups(pa.array(values, kind), "long", values)


def test_integer_keys_sliced_and_chunked():
    values = list(range(-5_000, 5_000, 3))
    array = pa.array(values, pa.int64())
    assert_key_groups(array.slice(100, 1_000), "int", values[100:1_100])
    assert_key_groups(pa.chunked_array([array.slice(0, 10), array.slice(10)]), "long", values)


def murmur_input_for_min_value() -> int:
    """The one int32 whose murmur mix is Integer.MIN_VALUE (Flink then returns 0): the steps inverted."""
    m = (1 << 32) - 1

    def rotr(x: int, r: int) -> int:
        return ((x >> r) | (x << (32 - r))) & m

    h = 0x80000000
    h ^= h >> 16
    h = h * pow(0xC2B2AE35, -1, 1 << 32) & m
    h ^= (h >> 13) ^ (h >> 26)
    h = h * pow(0x85EBCA6B, -1, 1 << 32) & m
    h ^= h >> 16
    h ^= 4
    h = (h - 0xE6546B64) * pow(5, -1, 1 << 32) & m
    h = rotr(h, 13) * pow(0x1B873593, -1, 1 << 32) & m
    h = rotr(h, 15) * pow(0xCC9E2D51, -1, 1 << 32) & m
    return h - (1 << 32) if h >= 1 << 31 else h


def test_murmur_hashes():
    special = murmur_input_for_min_value()
    assert murmur_hash(special) == 0
    rng = random.Random(9)
    codes = [*INT_EDGES, special, *(rng.randint(INT32_MIN, INT32_MAX) for _ in range(50_000))]
    got = murmur_hashes(np.array(codes, np.int32))
    assert got.dtype == np.int32 and (got >= 0).all()
    assert_rows(got, [murmur_hash(c) for c in codes], codes)


@pytest.mark.parametrize("max_parallelism", MAX_PARALLELISMS)
def test_operator_indexes(max_parallelism):
    groups = np.arange(max_parallelism, dtype=np.int32)
    for parallelism in sorted({1, 2, 3, 7, max_parallelism // 3, max_parallelism - 1, max_parallelism}):
        if not 0 < parallelism <= max_parallelism:
            continue
        expected = [operator_index(max_parallelism, parallelism, int(g)) for g in groups]
        assert_rows(operator_indexes(groups, max_parallelism, parallelism), expected, groups.tolist())


no_surrogates = st.characters(blacklist_categories=("Cs",))


@settings(deadline=None, max_examples=200)
@given(
    st.lists(st.text(alphabet=no_surrogates, max_size=40), max_size=60),
    st.integers(1, 32768),
)
def test_string_keys_property(keys, max_parallelism):
    got = key_groups(pa.array(keys, pa.string()), "string", max_parallelism)
    assert_rows(got, [assign_to_key_group(k, "string", max_parallelism) for k in keys], keys)


@settings(deadline=None, max_examples=200)
@given(st.lists(st.integers(INT32_MIN, INT32_MAX), max_size=60), st.integers(1, 32768))
def test_int_keys_property(keys, max_parallelism):
    got = key_groups(pa.array(keys, pa.int64()), "int", max_parallelism)
    assert_rows(got, [assign_to_key_group(k, "int", max_parallelism) for k in keys], keys)


@settings(deadline=None, max_examples=200)
@given(st.lists(st.integers(INT64_MIN, INT64_MAX), max_size=60), st.integers(1, 32768))
def test_long_keys_property(keys, max_parallelism):
    got = key_groups(pa.array(keys, pa.int64()), "long", max_parallelism)
    assert_rows(got, [assign_to_key_group(k, "long", max_parallelism) for k in keys], keys)


def unchecked(data: bytes, offsets: list[int]) -> pa.Array:
    """A string array as an IPC payload may carry it: Arrow does not check it."""
    buffers = [None, pa.py_buffer(np.array(offsets, np.int32)), pa.py_buffer(data)]
    return pa.Array.from_buffers(pa.string(), len(offsets) - 1, buffers)


@pytest.mark.parametrize(
    ("keys", "key_type", "error", "message"),
    [
        (pa.array(["a", "b", None, None]), "string", ValueError, "row 2: key is null"),
        (pa.chunked_array([["a", "b"], ["c", None]]), "string", ValueError, "row 3: key is null"),
        (pa.array([1, None], pa.int32()), "int", ValueError, "row 1: key is null"),
        (pa.array([1, 2, 3, None], pa.int64()), "long", ValueError, "row 3: key is null"),
        (pa.array([1, 2]), "string", TypeError, "keys must be strings (an Arrow utf8, large_utf8 or string_view"),
        (pa.array(["1"]), "int", TypeError, "int keys must be integers (an Arrow int8 to int64 or uint8 to uint64"),
        (pa.array([1.0]), "long", TypeError, "long keys must be integers"),
        (pa.array([True]), "int", TypeError, "got bool"),
        (["a", "b"], "string", TypeError, "keys must be a pyarrow Array or ChunkedArray, got list"),
        (pa.array([0, INT32_MAX + 1]), "int", ValueError, "row 1: int key 2147483648 is outside the 32-bit range"),
        (pa.array([0, 5, INT32_MIN - 1]), "int", ValueError, "row 2: int key -2147483649 is outside the 32-bit range"),
        (pa.array([1 << 32], pa.uint64()), "int", ValueError, "row 0: int key 4294967296 is outside the 32-bit range"),
        (pa.array([0, 1 << 63], pa.uint64()), "long", ValueError, "row 1: long key 9223372036854775808 is outside"),
        (unchecked(b"ok\x80ab", [0, 2, 3, 5]), "string", ValueError, "row 1: key is not valid UTF-8"),
        (unchecked(b"ok\xe4\xb8ab", [0, 2, 4, 6]), "string", ValueError, "row 1: key is not valid UTF-8"),
        (unchecked(b"abcdef", [0, 4, 2, 6]), "string", ValueError, "keys are not a valid Arrow array"),
        (pa.array(["a"]), "str", ValueError, "key_type must be one of string, int, long; got 'str'"),
    ],
)
@pytest.mark.parametrize("whole_arrays", [False, True], ids=["few-keys-one-by-one", "whole-array"])
def test_bad_keys(keys, key_type, error, message, whole_arrays, monkeypatch):
    if whole_arrays:  # these few keys through the numpy path too
        monkeypatch.setattr(columnar, "SCALAR_ROWS", -1)
    with pytest.raises(error) as raised:
        key_groups(keys, key_type, 128)
    assert message in str(raised.value)


@pytest.mark.parametrize("max_parallelism", [128, 129, 32768])
def test_a_few_keys_one_by_one_match_the_whole_array_path(unicode_keys, max_parallelism, monkeypatch):
    rng = random.Random(max_parallelism)
    batches = [rng.sample(unicode_keys[:5_000], n) for n in range(columnar.SCALAR_ROWS + 2) for _ in range(20)]
    ints = [[rng.randint(INT64_MIN, INT64_MAX) for _ in range(n)] for n in range(columnar.SCALAR_ROWS + 2)]
    few = [key_groups(pa.array(b, pa.string()), "string", max_parallelism) for b in batches]
    columns = [columnar.utf8_column(pa.array(b, pa.string())) for b in batches]
    few_columns = [key_groups(column, "string", max_parallelism) for column in columns]
    few_longs = [key_groups(pa.array(b, pa.int64()), "long", max_parallelism) for b in ints]
    few_ints = [key_groups(pa.array([k >> 32 for k in b], pa.int64()), "int", max_parallelism) for b in ints]
    monkeypatch.setattr(columnar, "SCALAR_ROWS", -1)
    for batch, got, got_from_column in zip(batches, few, few_columns, strict=True):
        expected = key_groups(pa.array(batch, pa.string()), "string", max_parallelism)
        assert got.dtype == expected.dtype == np.int32
        assert got.tolist() == got_from_column.tolist() == expected.tolist()
    for batch, got_long, got_int in zip(ints, few_longs, few_ints, strict=True):
        assert got_long.tolist() == key_groups(pa.array(batch, pa.int64()), "long", max_parallelism).tolist()
        as_int = pa.array([k >> 32 for k in batch], pa.int64())
        assert got_int.tolist() == key_groups(as_int, "int", max_parallelism).tolist()


@pytest.mark.parametrize("max_parallelism", [0, -1, 32769])
def test_bad_max_parallelism(max_parallelism):
    with pytest.raises(ValueError, match="max_parallelism must be in"):
        key_groups(pa.array(["a"]), "string", max_parallelism)
    with pytest.raises(ValueError, match="max_parallelism must be in"):
        operator_indexes(np.zeros(1, np.int32), max_parallelism, 1)


def test_bad_parallelism():
    with pytest.raises(ValueError, match="parallelism must be in"):
        operator_indexes(np.zeros(1, np.int32), 128, 129)


def test_the_scalar_module_needs_neither_numpy_nor_pyarrow():
    code = "import sys, statehouse.protocol.keygroups; print(sorted({'numpy', 'pyarrow'} & set(sys.modules)))"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]"


# ---- stored keys ----


def assert_primaries(encoded: EncodedPrimaries, keys: list[Any], key_type: str, namespaces: list[str]) -> None:
    expected = [encode_primary(k, key_type, ns) for k, ns in zip(keys, namespaces, strict=True)]
    assert_rows(encoded.primaries, expected, keys)
    key_bytes = [len(k.encode()) if key_type == "string" else 4 if key_type == "int" else 8 for k in keys]
    assert_rows(encoded.key_bytes, key_bytes, keys)
    assert_rows(encoded.namespace_bytes, [len(ns.encode()) for ns in namespaces], namespaces)


NAMESPACES = ["", "window-1", "ns", "时间窗口", "\U0001f600"]


@pytest.mark.parametrize("namespace", ["", "window-2024-06-07", "时间窗口"])
@pytest.mark.parametrize(
    ("keys", "key_type"),
    [
        pytest.param([f"user-{i:06d}" for i in range(3_000)], "string", id="string-one-length"),
        pytest.param([f"u{i}" * (i % 5) for i in range(3_000)], "string", id="string-lengths-vary"),
        pytest.param(["é中", "\U0001f600", "", "plain", "ß" * 100], "string", id="string-unicode"),
        pytest.param(INT_EDGES, "int", id="int"),
        pytest.param(LONG_EDGES, "long", id="long"),
        pytest.param([], "string", id="none"),
    ],
)
def test_encode_primaries(keys, key_type, namespace):
    kind = pa.string() if key_type == "string" else pa.int64()
    rows = len(keys)
    assert_primaries(encode_primaries(pa.array(keys, kind), key_type, namespace), keys, key_type, [namespace] * rows)
    per_row = [NAMESPACES[i % len(NAMESPACES)] for i in range(rows)]
    encoded = encode_primaries(pa.array(keys, kind), key_type, pa.array(per_row, pa.string()))
    assert_primaries(encoded, keys, key_type, per_row)
    same_length = [f"w{i % 10}" for i in range(rows)]
    assert_primaries(
        encode_primaries(pa.array(keys, kind), key_type, pa.array(same_length, pa.string())),
        keys,
        key_type,
        same_length,
    )


def test_encode_primaries_of_empty_strings():
    keys, namespaces = ["", "", ""], ["", "", ""]
    assert_primaries(encode_primaries(pa.array(keys), "string", pa.array(namespaces)), keys, "string", namespaces)
    assert_primaries(encode_primaries(pa.array(keys), "string", ""), keys, "string", namespaces)
    categories = pa.array(["a", "bc", "a"]).dictionary_encode()
    encoded = encode_primaries(pa.array([1, 2, 3]), "int", categories)
    assert_primaries(encoded, [1, 2, 3], "int", ["a", "bc", "a"])


def test_encode_primaries_of_random_unicode_keys(unicode_keys):
    keys = [k for k in unicode_keys[:20_000] if len(k) < 10_000]
    namespaces = [NAMESPACES[len(k) % len(NAMESPACES)] for k in keys]
    array = pa.chunked_array([pa.array(keys[:7]), pa.array(keys[7:], pa.string())])
    assert_primaries(encode_primaries(array, "string", pa.array(namespaces)), keys, "string", namespaces)
    assert_primaries(encode_primaries(array, "string", "ns"), keys, "string", ["ns"] * len(keys))


def test_encode_primaries_refuses_bad_namespaces():
    with pytest.raises(ValueError, match="row 1: namespace is null"):
        encode_primaries(pa.array(["a", "b"]), "string", pa.array(["x", None]))
    with pytest.raises(ValueError, match="3 namespaces for 2 keys"):
        encode_primaries(pa.array(["a", "b"]), "string", pa.array(["x", "y", "z"]))
    with pytest.raises(TypeError, match="namespaces must be strings"):
        encode_primaries(pa.array(["a", "b"]), "string", pa.array([1, 2]))
    with pytest.raises(ValueError, match="row 0: key is null"):
        encode_primaries(pa.array([None, "b"]), "string", "")


@pytest.mark.parametrize(("prefix_width", "max_parallelism"), [(1, 128), (2, 129), (2, 32768)])
def test_prefixed(prefix_width, max_parallelism, unicode_keys):
    keys = pa.array(unicode_keys[:5_000])
    primaries = encode_primaries(keys, "string", "ns").primaries
    groups = key_groups(keys, "string", max_parallelism)
    groups[:2] = [0, max_parallelism - 1]
    expected = [int(g).to_bytes(prefix_width, "big") + p for g, p in zip(groups.tolist(), primaries, strict=True)]
    assert_rows(prefixed(groups, prefix_width, primaries), expected, unicode_keys[:5_000])
    assert prefixed(groups[:0], prefix_width, []) == []


def test_prefixed_refuses_what_does_not_fit():
    with pytest.raises(ValueError, match=r"key groups must be in \[0, 256\) for a 1-byte prefix"):
        prefixed(np.array([0, 256]), 1, [b"a", b"b"])
    with pytest.raises(ValueError, match="prefix_width must be 1 or 2"):
        prefixed(np.array([0]), 3, [b"a"])
    with pytest.raises(ValueError, match="2 key groups for 1 primary keys"):
        prefixed(np.array([0, 1]), 2, [b"a"])
