"""Operator-state redistribution: Flink's rules on small examples (tests/engine/test_flink_vectors.py
checks thousands of cases against Flink's own code)."""

from statehouse.backends.redistribution import JavaHashMap, OperatorSubtaskState, java_hashmap_order, redistribute


def split(*subtasks, name="s"):
    return [OperatorSubtaskState(lists={name: ("split", list(elements))}) for elements in subtasks]


def lists(states, name="s"):
    return [s.lists.get(name, ("split", []))[1] for s in states]


def test_even_split_scale_up():
    assert lists(redistribute(split("abc", "de"), 3)) == [["a", "b"], ["c", "d"], ["e"]]


def test_even_split_scale_down():
    assert lists(redistribute(split(["x0"], ["x1"], ["x2"]), 2)) == [["x0", "x1"], ["x2"]]


def test_one_handle_split_four_ways():
    assert lists(redistribute(split("abcdef"), 4)) == [["a", "b"], ["c", "d"], ["e"], ["f"]]


def test_split_start_carries_over_between_names():
    old = [
        OperatorSubtaskState(lists={"a": ("split", list("abc")), "b": ("split", ["p", "q"])}),
        OperatorSubtaskState(lists={"a": ("split", list("de")), "b": ("split", ["r", "s"])}),
    ]
    new = redistribute(old, 3)
    assert lists(new, "a") == [["a", "b"], ["c", "d"], ["e"]]
    assert lists(new, "b") == [["r"], ["s"], ["p", "q"]]


def test_hashmap_order_follows_buckets():
    assert java_hashmap_order(["b", "a"]) == ["a", "b"]  # buckets 2 and 1
    # Same bucket ("a" and "q" hash 97 and 113, equal mod 16): put keeps insertion order,
    # computeIfAbsent (how Flink groups state names) puts a new key first in its bucket.
    assert java_hashmap_order(["a", "q"]) == ["a", "q"]
    assert java_hashmap_order(["a", "q"], "computeIfAbsent") == ["q", "a"]


def test_hashmap_resizes_like_java():
    # 13 names: put resizes to 32 buckets after the 13th; computeIfAbsent only before a 14th
    # call, even one for a key already there.
    names = [f"n{i}" for i in range(13)]
    put, lazy = JavaHashMap(), JavaHashMap()
    for name in names:
        put.put(name)
        lazy.compute_if_absent(name)
    assert put.table is not None and lazy.table is not None
    assert (len(put.table), len(lazy.table)) == (32, 16)
    lazy.compute_if_absent("n0")
    assert len(lazy.table) == 32
    # A 9th key in one bucket of a small table resizes it instead of making a tree bin.
    small = JavaHashMap()
    for name in ["a", "q", "\x81", "\x91", "\xa1", "\xb1", "\xc1", "\xd1", "\xe1"]:  # hashes equal mod 16
        small.put(name)
    assert len(small.table or []) == 32


def test_empty_old_subtasks_count():
    """Flink splits over every old subtask's list, empty ones too: 5/1/0 to two subtasks is 3 and 3."""
    assert lists(redistribute(split("abcde", "f", ""), 2)) == [["a", "b", "c"], ["d", "e", "f"]]


def test_union_goes_to_every_subtask():
    old = [OperatorSubtaskState(lists={"u": ("union", [1, 2])}), OperatorSubtaskState(lists={"u": ("union", [3])})]
    for scale in (2, 3, 1):
        new = redistribute(old, scale)
        assert all(sorted(s.lists["u"][1]) == [1, 2, 3] for s in new)
        assert all(s.lists["u"][0] == "union" for s in new)


def test_union_at_same_parallelism_goes_to_every_subtask():
    old = [OperatorSubtaskState(lists={"u": ("union", list(e))}) for e in ("abc", "d", "efg")]
    assert [s.lists["u"][1] for s in redistribute(old, 3)] == [list("abcdefg")] * 3


def test_same_parallelism_keeps_own_split_state_and_gets_union():
    old = [
        OperatorSubtaskState(lists={"s": ("split", [1]), "u": ("union", ["a"])}),
        OperatorSubtaskState(lists={"s": ("split", [2]), "u": ("union", ["b"])}),
    ]
    new = redistribute(old, 2)
    assert lists(new) == [[1], [2]]
    assert [sorted(s.lists["u"][1]) for s in new] == [["a", "b"], ["a", "b"]]


def test_broadcast_copy_i_mod_old():
    old = [OperatorSubtaskState(broadcast={"b": {"from": 0}}), OperatorSubtaskState(broadcast={"b": {"from": 1}})]
    assert [s.broadcast["b"]["from"] for s in redistribute(old, 3)] == [0, 1, 0]


def test_no_element_lost_or_duplicated():
    old = split(range(0, 7), range(7, 10), range(10, 23))
    for p in (1, 2, 4, 5, 8):  # p == 3 keeps every subtask's own state
        new = lists(redistribute(old, p))
        assert sorted(e for chunk in new for e in chunk) == list(range(23))
        sizes = [len(chunk) for chunk in new]
        assert max(sizes) - min(sizes) <= 1
