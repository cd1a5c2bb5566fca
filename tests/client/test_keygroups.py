"""Flink's key-group math, checked against the reference test vectors."""

import pytest

from statehouse.protocol.keygroups import (
    INT32_MAX,
    INT32_MIN,
    KeyGroupRange,
    assign_to_key_group,
    default_max_parallelism,
    java_long_hash,
    java_string_hash,
    murmur_hash,
    operator_index,
)


def test_murmur_trace_for_42():
    assert murmur_hash(42) == 1134849565


@pytest.mark.parametrize(
    ("key", "murmur", "kg128", "kg32768"),
    [
        (0, 593689054, 94, 31198),
        (1, 68075478, 86, 16342),
        (42, 1134849565, 29, 28189),
        (-1, 1982413648, 80, 15184),
        (INT32_MAX, 1653689534, 62, 19646),
        (INT32_MIN, 1718298732, 108, 10348),
    ],
)
def test_int_keys(key, murmur, kg128, kg32768):
    assert murmur_hash(key) == murmur
    assert assign_to_key_group(key, "int", 128) == kg128
    assert assign_to_key_group(key, "int", 32768) == kg32768


def test_long_keys():
    assert java_long_hash(-1) == 0
    assert assign_to_key_group(-1, "long", 128) == 94
    assert assign_to_key_group(-1, "int", 128) == 80
    assert java_long_hash(1 << 32) == 1
    assert assign_to_key_group(1 << 32, "long", 128) == 86


@pytest.mark.parametrize(
    ("key", "hash_code", "murmur", "kg"),
    [
        ("", 0, 593689054, 94),
        ("a", 97, 1455541201, 81),
        ("hello", 99162322, 1715862179, 35),
        ("flink", 97520992, 1330823394, 98),
        ("user-1", -836031825, 1662039673, 121),
        ("日本", 835047, 1762503263, 95),
    ],
)
def test_string_keys(key, hash_code, murmur, kg):
    assert java_string_hash(key) == hash_code
    assert murmur_hash(hash_code) == murmur
    assert assign_to_key_group(key, "string", 128) == kg


def test_string_hash_uses_utf16_code_units():
    # U+1F600 is the surrogate pair D83D DE00 in UTF-16: 31 * 0xD83D + 0xDE00
    assert java_string_hash("\U0001f600") == 31 * 0xD83D + 0xDE00


@pytest.mark.parametrize(
    ("max_p", "p", "ranges"),
    [
        (128, 3, [(0, 42), (43, 85), (86, 127)]),
        (128, 4, [(0, 31), (32, 63), (64, 95), (96, 127)]),
        (10, 3, [(0, 3), (4, 6), (7, 9)]),
    ],
)
def test_range_for_operator(max_p, p, ranges):
    assert [KeyGroupRange.for_operator(max_p, p, i) for i in range(p)] == [KeyGroupRange(s, e) for s, e in ranges]
    for i, (start, end) in enumerate(ranges):
        assert operator_index(max_p, p, start) == i
        assert operator_index(max_p, p, end) == i


def test_operator_index_vectors():
    assert [operator_index(128, 3, kg) for kg in (42, 43, 85, 86)] == [0, 1, 1, 2]


@pytest.mark.parametrize(
    ("p", "expected"), [(1, 128), (85, 128), (86, 256), (100, 256), (1000, 2048), (21845, 32768), (30000, 32768)]
)
def test_default_max_parallelism(p, expected):
    assert default_max_parallelism(p) == expected


def test_range_preconditions():
    with pytest.raises(ValueError):
        KeyGroupRange.for_operator(128, 129, 0)
    with pytest.raises(ValueError):
        KeyGroupRange.for_operator(1 << 16, 1, 0)
    with pytest.raises(ValueError):
        KeyGroupRange.for_operator(128, 2, 2)


def test_range_value_type():
    r = KeyGroupRange(10, 20)
    assert len(r) == 11 and 10 in r and 20 in r and 21 not in r
    assert r.intersection(KeyGroupRange(15, 30)) == KeyGroupRange(15, 20)
    assert len(r.intersection(KeyGroupRange(21, 30))) == 0


def test_memoized_assigner_matches_and_stays_bounded():
    from statehouse.protocol.keygroups import KeyGroupAssigner

    assign = KeyGroupAssigner(128, capacity=10)
    for _ in range(2):  # a second pass answers from the memo
        assert [assign(f"user-{i}", "string") for i in range(25)] == [
            assign_to_key_group(f"user-{i}", "string", 128) for i in range(25)
        ]
    assert assign(-1, "int") == 80 and assign(-1, "long") == 94  # one memo per key type
    assert all(len(memo) <= 10 for memo in assign._memo.values())
