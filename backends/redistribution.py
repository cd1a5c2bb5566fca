"""Operator-state redistribution on a parallelism change, following Flink's
``RoundRobinOperatorStateRepartitioner`` (see flink-state-semantics.md §2).

Pure functions over plain values; restore applies them to snapshot contents.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from statehouse.backends.errors import InvalidArgument
from statehouse.keygroups import UPPER_BOUND_MAX_PARALLELISM, java_string_hash

# Flink caps an operator's parallelism at the largest max parallelism: subtask indexes and
# subtask counts stay below it, so no request or snapshot can make a restore allocate more.
MAX_SUBTASKS = UPPER_BOUND_MAX_PARALLELISM


def check_parallelism(parallelism: object, what: str = "parallelism") -> int:
    if isinstance(parallelism, bool) or not isinstance(parallelism, int) or not 1 <= parallelism <= MAX_SUBTASKS:
        raise InvalidArgument(f"{what} must be an integer in [1, {MAX_SUBTASKS}]; got {parallelism!r}")
    return parallelism


def check_subtask(subtask: object) -> int:
    if isinstance(subtask, bool) or not isinstance(subtask, int) or not 0 <= subtask < MAX_SUBTASKS:
        raise InvalidArgument(f"subtask index must be an integer in [0, {MAX_SUBTASKS - 1}]; got {subtask!r}")
    return subtask


@dataclass
class OperatorSubtaskState:
    """What one subtask of one operator holds: list states (mode, elements) and broadcast maps."""

    lists: dict[str, tuple[str, list[Any]]] = field(default_factory=dict)
    broadcast: dict[str, dict[str, Any]] = field(default_factory=dict)


def java_hashmap_order(names: list[str]) -> list[str]:
    """Iteration order of a ``java.util.HashMap<String, ?>`` filled with ``names`` in order.

    Bucket ``(h ^ h >>> 16) & (capacity - 1)``; capacity starts at 16 and doubles when the
    size exceeds 0.75 * capacity; within a bucket, insertion order is kept.
    """
    capacity = 16
    while len(names) > capacity * 3 // 4:
        capacity *= 2

    def bucket(name: str) -> int:
        h = java_string_hash(name) & 0xFFFFFFFF
        return (h ^ (h >> 16)) & (capacity - 1)

    return [n for _b, _i, n in sorted((bucket(n), i, n) for i, n in enumerate(names))]


def _split_name(entries: list[tuple[int, list[Any]]], parallelism: int, start: int):
    """Flink's even split of one SPLIT_DISTRIBUTE state; returns per-subtask parts and the next start."""
    out: list[list[tuple[int, list[Any]]]] = [[] for _ in range(parallelism)]
    total = sum(len(e) for _h, e in entries)
    base, rem = divmod(total, parallelism)
    li = off = 0
    new_start = start
    for i in range(parallelism):
        idx = (i + start) % parallelism
        n = base
        if rem > 0:
            n += 1
            rem -= 1
        elif rem == 0:
            new_start = idx
            rem -= 1
        while n > 0:
            handle, elements = entries[li]
            remaining = len(elements) - off
            if remaining > n:
                part = elements[off : off + n]
                off += n
            else:
                part = elements[off:]
                off = 0
                li += 1
            n -= remaining
            out[idx].append((handle, part))
    return out, new_start


def redistribute(old: list[OperatorSubtaskState], parallelism: int) -> list[OperatorSubtaskState]:
    """New subtask states for ``parallelism`` subtasks from the old subtasks' states."""
    check_parallelism(parallelism)
    new = [OperatorSubtaskState() for _ in range(parallelism)]
    split_names: list[str] = []
    union_names: list[str] = []
    for subtask in old:
        for name, (mode, _elements) in subtask.lists.items():
            names = union_names if mode == "union" else split_names
            if name not in names:
                names.append(name)

    if len(old) == parallelism and not union_names:
        for target, source in zip(new, old, strict=True):
            target.lists = {n: (m, list(e)) for n, (m, e) in source.lists.items()}
            target.broadcast = {n: dict(m) for n, m in source.broadcast.items()}
        return new

    def entries(name: str) -> list[tuple[int, list[Any]]]:
        return [(h, s.lists[name][1]) for h, s in enumerate(old) if name in s.lists]

    if len(old) == parallelism:
        # Same parallelism: every subtask keeps its own split states.
        for target, source in zip(new, old, strict=True):
            for name in split_names:
                if name in source.lists:
                    target.lists[name] = ("split", list(source.lists[name][1]))
    else:
        start = 0
        for name in java_hashmap_order(split_names):
            parts, start = _split_name(entries(name), parallelism, start)
            for target, chunks in zip(new, parts, strict=True):
                # A subtask's list concatenates its chunks in old-subtask (handle) order.
                elements = [e for _h, chunk in sorted(chunks, key=lambda c: c[0]) for e in chunk]
                target.lists[name] = ("split", elements)

    for name in union_names:
        union = [e for _h, elements in entries(name) for e in elements]
        for target in new:
            target.lists[name] = ("union", list(union))

    if old:
        for i, target in enumerate(new):
            source = old[i % len(old)]
            target.broadcast = {n: dict(m) for n, m in source.broadcast.items()}
    return new
