"""Operator-state redistribution, checked against the reference vectors (Flink's rules)."""

from statehouse.backends.redistribution import OperatorSubtaskState, java_hashmap_order, redistribute


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
    # Same bucket (hash 0 and 16 differ only above the mask): insertion order is kept.
    assert java_hashmap_order(["a", "q"]) == ["a", "q"]


def test_union_goes_to_every_subtask():
    old = [OperatorSubtaskState(lists={"u": ("union", [1, 2])}), OperatorSubtaskState(lists={"u": ("union", [3])})]
    for scale in (2, 3, 1):
        new = redistribute(old, scale)
        assert all(sorted(s.lists["u"][1]) == [1, 2, 3] for s in new)
        assert all(s.lists["u"][0] == "union" for s in new)


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
