"""Statehouse against Flink's own answers (``tests/vectors``, written by ``tests/support/flink_vectors``
from Flink 2.3's ``KeyGroupRangeAssignment`` and ``RoundRobinOperatorStateRepartitioner``):
key groups, key ownership, replica ranges, default max parallelism, ``java.util.HashMap``
iteration order and operator-state redistribution, with zero mismatches. With
``STATEHOUSE_FLINK_LIB`` naming Flink's jars, the generator also runs fresh."""

from __future__ import annotations

import random
import time
from collections import Counter
from typing import Any

import pytest

from statehouse.backends.catalog import JobCatalog
from statehouse.backends.heap import HeapStore
from statehouse.backends.operator_state import encode_names, operator_names_row, operator_subtasks_row
from statehouse.backends.redistribution import JavaHashMap, OperatorSubtaskState, redistribute
from statehouse.backends.snapshot.operator_format import OperatorSnapshot, merge_for_replica
from statehouse.protocol.keygroups import (
    MEMO_KEY_CHARS,
    KeyGroupAssigner,
    KeyGroupRange,
    assign_to_key_group,
    default_max_parallelism,
    operator_index,
)
from statehouse.snapshots.stored.codec import encode_value, iter_values
from tests.support.flink_vectors import (
    DEFAULT_SEED,
    VECTORS,
    build,
    flink_lib,
    load,
    operator_cases,
    operator_expected,
    operator_input,
    spread,
)

pytestmark = [pytest.mark.http]


@pytest.fixture(scope="module")
def vectors() -> dict[str, Any]:
    return load()


def _mismatches(cases, check) -> list:
    return [case for case in cases if not check(case)]


# -- key groups ---------------------------------------------------------------------------------


def test_key_groups_and_owners(vectors):
    keys = vectors["key_groups"]
    assert len(keys) >= 10_000 and {k[0] for k in keys} == {"string", "int", "long"}
    assigners: dict[int, KeyGroupAssigner] = {}

    def check(case):
        key_type, max_parallelism, parallelism, key, key_group, owner = case
        assigner = assigners.setdefault(max_parallelism, KeyGroupAssigner(max_parallelism))
        return (
            assign_to_key_group(key, key_type, max_parallelism) == key_group
            and assigner(key, key_type) == key_group
            and operator_index(max_parallelism, parallelism, key_group) == owner
            and key_group in KeyGroupRange.for_operator(max_parallelism, parallelism, owner)
        )

    assert _mismatches(keys, check) == []


def test_the_memo_keeps_no_long_string_key():
    assigner = KeyGroupAssigner(128)
    cases = [("k" * MEMO_KEY_CHARS, "string"), ("é" * (MEMO_KEY_CHARS + 1), "string"), (7, "int")]
    for key, key_type in cases * 2:  # answered alike from the memo or not
        assert assigner(key, key_type) == assign_to_key_group(key, key_type, 128)
    kept = assigner._memo
    assert "k" * MEMO_KEY_CHARS in kept["string"] and len(kept["string"]) == 1 and 7 in kept["int"]


def test_key_groups_columnar(vectors):
    columnar = pytest.importorskip("statehouse.protocol.keygroups.columnar")
    pa = pytest.importorskip("pyarrow")
    by_shape: dict[tuple[str, int, int], list[list[Any]]] = {}
    for case in vectors["key_groups"]:
        by_shape.setdefault((case[0], case[1], case[2]), []).append(case)
    for (key_type, max_parallelism, parallelism), cases in by_shape.items():
        keys = pa.array([c[3] for c in cases], pa.string() if key_type == "string" else pa.int64())
        groups = columnar.key_groups(keys, key_type, max_parallelism)
        assert groups.tolist() == [c[4] for c in cases]
        owners = columnar.operator_indexes(groups, max_parallelism, parallelism)
        assert owners.tolist() == [c[5] for c in cases]


def test_key_group_ranges_and_default_max_parallelism(vectors):
    ranges = vectors["key_group_ranges"]
    assert _mismatches(ranges, lambda c: KeyGroupRange.for_operator(*c[:3]).as_list() == c[3:]) == []
    defaults = vectors["default_max_parallelism"]
    assert _mismatches(defaults, lambda c: default_max_parallelism(c[0]) == c[1]) == []


# -- java.util.HashMap and the repartitioner ----------------------------------------------------


def test_java_hashmap_order(vectors):
    def check(case):
        how, capacity, names, order = case
        hash_map = JavaHashMap(None if capacity < 0 else capacity)
        for name in names:
            (hash_map.put if how == "put" else hash_map.compute_if_absent)(name)
        return hash_map.order() == order

    assert _mismatches(vectors["hashmap_order"], check) == []


def _subtask_state(handle) -> OperatorSubtaskState:
    return OperatorSubtaskState(
        lists={n: (m, e) for n, m, e in handle or [] if m != "broadcast"},
        broadcast={n: {} for n, m, _e in handle or [] if m == "broadcast"},
    )


def _redistributed(case) -> list[dict[str, tuple[str, list[str]]]]:
    old = [_subtask_state(handle) for handle in operator_input(case)]
    return [{n: (m, e) for n, (m, e) in s.lists.items() if e} for s in redistribute(old, case["new"])]


def test_operator_state_redistribution(vectors):
    cases = vectors["operator"]
    kinds = Counter(c["kind"] for c in cases)
    assert len(cases) >= 4000 and set(kinds) >= {"random", "statehouse", "collide", "many", "treeify", "issue", "names"}
    assert {(c["old"] == c["new"], "U" in c["modes"]) for c in cases} == {(a, b) for a in (1, 0) for b in (1, 0)}
    assert _mismatches(cases, lambda c: _redistributed(c) == operator_expected(c)) == []


def test_the_issue_cases(vectors):
    """Old subtasks holding 5/1/0 elements to 2 subtasks: 3 and 3; union state 3/1/3 at the same
    parallelism: all 7 everywhere."""
    issue = [c for c in vectors["operator"] if c["kind"] == "issue"]
    assert [[len(s.get("s", ("", []))[1]) for s in _redistributed(c)] for c in issue[:1]] == [[3, 3]]
    assert [[len(s["u"][1]) for s in _redistributed(c)] for c in issue[1:]] == [[7, 7, 7]]
    assert [operator_expected(c) == _redistributed(c) for c in issue] == [True, True]


# -- restore: the snapshot's operator state, merged for each replica ----------------------------


def _statehouse_shaped(case) -> bool:
    """Every old subtask holds every name, list states then broadcast states, each in name
    order: what a snapshot means."""
    order = sorted(range(len(case["names"])), key=lambda i: (case["modes"][i] == "B", case["names"][i]))
    return all(handle is not None and [i for i, _c in handle] == order for handle in case["in"])


def _every_subtask_registers_every_name(case) -> bool:
    """Every old subtask holds every name, list states (in any order) then broadcast states in
    name order: what a snapshot means when the subtasks' writes are recorded in that order."""
    lists = {i for i, mode in enumerate(case["modes"]) if mode != "B"}
    broadcast = sorted((i for i, mode in enumerate(case["modes"]) if mode == "B"), key=lambda i: case["names"][i])
    return all(
        handle is not None
        and {i for i, _c in handle[: len(lists)]} == lists
        and [i for i, _c in handle[len(lists) :]] == broadcast
        for handle in case["in"]
    )


def _snapshot_parts(case, operator: str, old_replicas: int) -> list[OperatorSnapshot]:
    """The operator state parts ``old_replicas`` replicas write: the lists of their subtasks
    (non-empty only), every mode, the subtask count each replica recorded and each subtask's
    order of names (its handle's)."""
    parts = [OperatorSnapshot() for _ in range(old_replicas)]
    for s, handle in enumerate(operator_input(case)):
        part = parts[s % old_replicas]
        part.meta[operator_subtasks_row(operator)] = str(s + 1).encode()
        order = [name for name, mode, _e in handle or [] if mode != "broadcast"]
        part.meta[operator_names_row(operator, s)] = encode_names(order)
        for name, mode, elements in handle or []:
            if mode == "broadcast":
                part.broadcast[(operator, name)] = {b"k": encode_value(s)}
                continue
            for p in parts:
                p.modes[(operator, name)] = mode
            if elements:
                part.lists[(operator, name, s)] = b"".join(encode_value(e) for e in elements)
    return parts


def _restored(parts: list[OperatorSnapshot], replicas: int, parallelism: int | None) -> list[OperatorSnapshot]:
    """Each of ``replicas`` replicas' operator state after restoring ``parts`` (and so what its
    next snapshot holds)."""
    rescale = None if parallelism is None else {"op": parallelism}
    return [merge_for_replica(parts, replica, replicas, rescale) for replica in range(replicas)]


def _lists(replicas: list[OperatorSnapshot], parallelism: int) -> list[dict[str, tuple[str, list[Any]]]]:
    """The restored lists per subtask, {name: (mode, elements)}; each replica records the count
    restored to and holds only its own subtasks."""
    got: list[dict[str, tuple[str, list[Any]]]] = [{} for _ in range(parallelism)]
    for replica, merged in enumerate(replicas):
        assert merged.meta[operator_subtasks_row("op")] == str(parallelism).encode()
        for (_op, name, sub), raw in merged.lists.items():
            assert sub % len(replicas) == replica
            got[sub][name] = (merged.modes[("op", name)], list(iter_values(raw)))
    return got


@pytest.mark.parametrize(("old_replicas", "new_replicas"), [(1, 1), (2, 3), (3, 2)])
def test_restore_gives_each_subtask_flinks_lists(vectors, old_replicas, new_replicas):
    cases = [c for c in vectors["operator"] if _every_subtask_registers_every_name(c)]
    assert len(cases) > 1000 and sum(c["kind"] == "names" for c in cases) >= 300

    def check(case):
        parallelism = None if case["new"] == case["old"] else case["new"]
        restored = _restored(_snapshot_parts(case, "op", old_replicas), new_replicas, parallelism)
        return _lists(restored, case["new"]) == operator_expected(case)

    assert _mismatches(cases, check) == []


@pytest.mark.parametrize("replicas", [(1, 1, 1), (2, 3, 2), (3, 1, 2)])
def test_two_rescales_in_a_row_give_each_subtask_flinks_lists(vectors, replicas):
    """Flink's own backend snapshots, repartitions and restores twice (p0 -> p1 -> p2): a restored
    subtask's next snapshot walks its names in the order its restore registered them, so the
    second rescale cuts every split list where Flink does, whatever the replica count."""
    cases = vectors["operator_chains"]
    assert len(cases) >= 800 and sum(c["old"] != c["via"] != c["new"] for c in cases) >= 300

    def check(case):
        first = _restored(_snapshot_parts(case, "op", replicas[0]), replicas[1], case["via"])
        second = _restored(first, replicas[2], case["new"])
        return _lists(first, case["via"]) == operator_expected(case, "mid") and _lists(
            second, case["new"]
        ) == operator_expected(case, "out")

    assert _mismatches(cases, check) == []


def test_writes_record_the_subtask_count_and_name_order():
    """A subtask that wrote or cleared a list counts, whatever it holds now; each subtask's
    names are recorded in the order it first wrote them."""
    job, _ = JobCatalog(HeapStore()).create("j", 128)
    with job.transaction() as tx:
        tx.operator.list_update("op", 0, "s", [1])
        assert tx.operator.subtask_count("op") == 1
        tx.operator.list_update("op", 4, "s", [])
        tx.operator.list_clear("op", 2, "s")
        tx.operator.list_add("op", 1, "s", [2])
        assert tx.operator.subtask_count("op") == 5 and tx.operator.subtask_count("other") is None
        tx.operator.list_add("op", 1, "b", [3])
        tx.operator.list_clear("op", 1, "a")
        tx.operator.list_add("op", 1, "s", [4])
        assert tx.operator.name_order("op", 1) == ["s", "b", "a"]  # first writes, in order
        assert tx.operator.name_order("op", 3) == []


def test_restore_of_a_snapshot_without_recorded_subtask_counts():
    """Snapshots written before the count was recorded restore as before: the highest stored
    subtask + 1 is the old parallelism."""
    snap = OperatorSnapshot(
        lists={("op", "s", 0): encode_value("a") + encode_value("b"), ("op", "s", 1): encode_value("c")},
        modes={("op", "s"): "split"},
    )
    merged = merge_for_replica([OperatorSnapshot.from_bytes(snap.to_bytes())], 0, 1, {"op": 3})
    assert {k: list(iter_values(v)) for k, v in merged.lists.items()} == {
        ("op", "s", 0): ["a"],
        ("op", "s", 1): ["b"],
        ("op", "s", 2): ["c"],
    }
    assert merged.meta[operator_subtasks_row("op")] == b"3"
    same = merge_for_replica([snap], 0, 1)
    assert same.lists == snap.lists and same.meta[operator_subtasks_row("op")] == b"2"


# -- over HTTP ----------------------------------------------------------------------------------


def _buckets_shared(names: list[str]) -> bool:
    return len({spread(n) & 15 for n in names}) < len(names)


def _http_cases(vectors) -> list[dict[str, Any]]:
    """A few restore cases with empty trailing subtasks, union state, colliding names, rescaling."""
    pool = [c for c in vectors["operator"] if _statehouse_shaped(c) and len(c["names"]) <= 8 and c["old"] <= 6]
    chosen = [c for c in vectors["operator"] if c["kind"] == "issue"]
    wanted = [
        lambda c: c["old"] != c["new"] and _buckets_shared(c["names"]),
        lambda c: "U" in c["modes"] and "S" in c["modes"] and c["old"] == c["new"],
        lambda c: "U" in c["modes"] and c["old"] < c["new"],
        lambda c: c["old"] > c["new"] and not any(n for _i, n in c["in"][-1]),
        lambda c: c["old"] != c["new"] and len(c["names"]) >= 4 and c["modes"].count("S") >= 3,
    ]
    for want in wanted:
        chosen.append(next(c for c in pool if want(c)))
    # Names written in another order on each subtask, 4 subtasks to 3.
    chosen.append(next(c for c in vectors["operator"] if c["kind"] == "names" and (c["old"], c["new"]) == (4, 3)))
    return chosen


def _write_over_http(http, job: str, case) -> None:
    http.put(job, json={"max_parallelism": 128}).raise_for_status()
    for s, handle in enumerate(operator_input(case)):
        for name, mode, elements in handle or []:
            if mode == "broadcast":
                http.put(f"{job}/operators/op/broadcast/{name}/entries/k", json={"value": s}).raise_for_status()
                continue
            path = f"{job}/operators/op/subtasks/{s}/lists/{name}"
            http.put(path, params={"mode": mode}, json={"value": elements}).raise_for_status()


def _restore_over_http(http, job: str, checkpoint: int, old: int, new: int) -> None:
    """Checkpoint ``job``, complete it and restore it with ``new`` subtasks of operator ``op``."""
    http.post(f"{job}/checkpoints", json={"checkpoint_id": checkpoint}).raise_for_status()
    deadline = time.monotonic() + 20
    while http.get(f"{job}/checkpoints/{checkpoint}").json()["status"] != "uploaded":
        assert time.monotonic() < deadline, "checkpoint stuck"
        time.sleep(0.05)
    http.post(f"{job}/checkpoints/{checkpoint}/complete").raise_for_status()
    body: dict[str, Any] = {"checkpoint_id": checkpoint}
    if new != old:
        body["operator_parallelism"] = {"op": new}
    http.post(f"{job}/restore", json=body).raise_for_status()


def _check_over_http(http, job: str, case, subtasks: int, expected) -> None:
    for sub in range(subtasks):
        for name in (n for n, m in zip(case["names"], case["modes"], strict=True) if m != "B"):
            r = http.get(f"{job}/operators/op/subtasks/{sub}/lists/{name}")
            want = expected[sub].get(name) if sub < len(expected) else None
            if want is None:
                assert r.status_code == 404, (case, sub, name, r.text)
            else:
                assert r.status_code == 200 and (r.json()["mode"], r.json()["value"]) == want, (case, sub, name)


def test_restore_over_http(http, job_name, vectors):
    for number, case in enumerate(_http_cases(vectors)):
        job = f"/jobs/{job_name}-{number}"
        _write_over_http(http, job, case)
        _restore_over_http(http, job, 1, case["old"], case["new"])
        _check_over_http(http, job, case, max(case["new"], case["old"]), operator_expected(case))


def test_two_restores_over_http(http, job_name, vectors):
    """Rescaled twice: the second restore cuts the lists the first one gave, where Flink does."""
    case = next(
        c
        for c in vectors["operator_chains"]
        if len(c["names"]) >= 12 and c["old"] < c["via"] > c["new"] > 1 and "U" not in c["modes"]
    )
    job = f"/jobs/{job_name}"
    _write_over_http(http, job, case)
    _restore_over_http(http, job, 1, case["old"], case["via"])
    _check_over_http(http, job, case, max(case["old"], case["via"]), operator_expected(case, "mid"))
    _restore_over_http(http, job, 2, case["via"], case["new"])
    _check_over_http(http, job, case, case["via"], operator_expected(case))


# -- Flink itself, when its jars are here --------------------------------------------------------

needs_flink = pytest.mark.skipif(flink_lib() is None, reason="STATEHOUSE_FLINK_LIB does not name Flink's jars")


@needs_flink
def test_generator_reproduces_the_committed_vectors(vectors):
    lib = flink_lib()
    assert lib is not None
    fresh = build(DEFAULT_SEED, lib)
    assert fresh == vectors, f"regenerate {VECTORS} with `make flink-vectors`"


@needs_flink
def test_fresh_cases_from_flink():
    lib = flink_lib()
    assert lib is not None
    fresh = build(random.randrange(1 << 30), lib, scale=0.2)
    assert _mismatches(fresh["operator"], lambda c: _redistributed(c) == operator_expected(c)) == []
    assert [c for c in fresh["key_groups"] if assign_to_key_group(c[3], c[0], c[1]) != c[4]] == []


def test_case_generation_is_seeded():
    assert operator_cases(random.Random(7), 50) == operator_cases(random.Random(7), 50)
