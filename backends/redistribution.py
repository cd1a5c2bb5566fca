"""Operator-state redistribution on restore, identical to Flink's ``RoundRobinOperatorStateRepartitioner``.

Pure functions over plain values; restore applies them to snapshot contents. Checked against
Flink 2.3's own classes on generated cases (``tests/support/flink_vectors``, ``tests/vectors``).

Flink's order of split-state names is the iteration order of ``java.util.HashMap``s: each old
subtask's handle maps its state names (``CollectionUtil.newHashMapWithExpectedSize``, filled with
``put``), and the repartitioner groups names with ``computeIfAbsent`` into a default ``HashMap``.
:class:`JavaHashMap` reproduces that order exactly: buckets, ``computeIfAbsent`` prepending to a
bucket, resizing (on ``put`` after the insert, on ``computeIfAbsent`` before it, and instead of
treeifying a long bucket while the table is small) and tree bins.
"""

from __future__ import annotations

import itertools
import math
import struct
from dataclasses import dataclass, field
from typing import Any, Literal

from statehouse.protocol.errors import InvalidArgument
from statehouse.protocol.keygroups import UPPER_BOUND_MAX_PARALLELISM, java_string_hash

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
    """What one subtask of one operator holds: list states (mode, elements) and broadcast maps.

    ``lists`` are in the order the subtask registered them. After :func:`redistribute`,
    ``restored_names`` is the order in which a Flink subtask restoring its handles registers
    its list states (see :func:`restored_name_order`).
    """

    lists: dict[str, tuple[str, list[Any]]] = field(default_factory=dict)
    broadcast: dict[str, dict[str, Any]] = field(default_factory=dict)
    restored_names: list[str] = field(default_factory=list)


# -- java.util.HashMap<String, ?> iteration order ---------------------------------------------

_TREEIFY_THRESHOLD = 8
_UNTREEIFY_THRESHOLD = 6
_MIN_TREEIFY_CAPACITY = 64
_MAXIMUM_CAPACITY = 1 << 30


def _int32(x: int) -> int:
    x &= 0xFFFFFFFF
    return x - (1 << 32) if x & 0x80000000 else x


def _spread(name: str) -> int:
    """``HashMap.hash``: ``h ^ (h >>> 16)``, as a signed int (tree bins compare it signed)."""
    h = java_string_hash(name) & 0xFFFFFFFF
    return _int32(h ^ (h >> 16))


def _table_size_for(capacity: int) -> int:
    if capacity <= 1:
        return 1
    return min(1 << (capacity - 1).bit_length(), _MAXIMUM_CAPACITY)


def _java_compare(a: str, b: str) -> int:
    """``String.compareTo``: UTF-16 code units, then length."""
    ua = a.encode("utf-16-be", "surrogatepass")
    ub = b.encode("utf-16-be", "surrogatepass")
    return (ua > ub) - (ua < ub)  # big-endian code units compare as bytes; a prefix sorts first


class _Node:
    __slots__ = ("hash", "key", "left", "next", "parent", "prev", "red", "right", "tree")

    def __init__(self, hash_: int, key: str, next_: _Node | None = None, tree: bool = False) -> None:
        self.hash = hash_
        self.key = key
        self.next = next_
        self.prev: _Node | None = None
        self.parent: _Node | None = None
        self.left: _Node | None = None
        self.right: _Node | None = None
        self.red = False
        self.tree = tree


def _direction(h: int, key: str, p: _Node) -> int:
    if p.hash > h:
        return -1
    if p.hash < h:
        return 1
    return _java_compare(key, p.key)  # distinct Strings never compare equal: no tie-break needed


def _rotate_left(root: _Node, p: _Node) -> _Node:
    r = p.right
    if r is not None:
        rl = p.right = r.left
        if rl is not None:
            rl.parent = p
        pp = r.parent = p.parent
        if pp is None:
            root = r
            r.red = False
        elif pp.left is p:
            pp.left = r
        else:
            pp.right = r
        r.left = p
        p.parent = r
    return root


def _rotate_right(root: _Node, p: _Node) -> _Node:
    left = p.left
    if left is not None:
        lr = p.left = left.right
        if lr is not None:
            lr.parent = p
        pp = left.parent = p.parent
        if pp is None:
            root = left
            left.red = False
        elif pp.right is p:
            pp.right = left
        else:
            pp.left = left
        left.right = p
        p.parent = left
    return root


def _balance_insertion(root: _Node, x: _Node) -> _Node:
    x.red = True
    while True:
        xp = x.parent
        if xp is None:
            x.red = False
            return x
        xpp = xp.parent
        if not xp.red or xpp is None:
            return root
        xppl = xpp.left
        if xp is xppl:
            xppr = xpp.right
            if xppr is not None and xppr.red:
                xppr.red = xp.red = False
                xpp.red = True
                x = xpp
            else:
                if x is xp.right:
                    x = xp
                    root = _rotate_left(root, x)
                    xp = x.parent
                    xpp = None if xp is None else xp.parent
                if xp is not None:
                    xp.red = False
                    if xpp is not None:
                        xpp.red = True
                        root = _rotate_right(root, xpp)
        else:
            if xppl is not None and xppl.red:
                xppl.red = xp.red = False
                xpp.red = True
                x = xpp
            else:
                if x is xp.left:
                    x = xp
                    root = _rotate_right(root, x)
                    xp = x.parent
                    xpp = None if xp is None else xp.parent
                if xp is not None:
                    xp.red = False
                    if xpp is not None:
                        xpp.red = True
                        root = _rotate_left(root, xpp)


class JavaHashMap:
    """The structure of a ``java.util.HashMap<String, ?>`` (JDK 17), for its iteration order.

    ``put`` and ``compute_if_absent`` insert a new key as ``HashMap.put`` and
    ``HashMap.computeIfAbsent`` do; `order()` iterates as ``keySet()`` does.
    """

    def __init__(self, initial_capacity: int | None = None) -> None:
        self.table: list[_Node | None] | None = None
        self.size = 0
        # Like Java, an initial capacity waits in the threshold until the first insert.
        self.threshold = 0 if initial_capacity is None else _table_size_for(initial_capacity)

    @classmethod
    def with_expected_size(cls, expected: int) -> JavaHashMap:
        """Flink's ``CollectionUtil.newHashMapWithExpectedSize``."""
        if expected <= 2:
            return cls(expected + 1)
        return cls(math.ceil(float(struct.unpack("f", struct.pack("f", expected / 0.75))[0])))

    def order(self) -> list[str]:
        out: list[str] = []
        for first in self.table or ():
            node = first
            while node is not None:
                out.append(node.key)
                node = node.next
        return out

    def __contains__(self, key: str) -> bool:
        if not self.table:
            return False
        node = self.table[(len(self.table) - 1) & _spread(key)]
        while node is not None:
            if node.key == key:
                return True
            node = node.next
        return False

    # -- inserts ---------------------------------------------------------------------------

    def put(self, key: str) -> None:
        """``HashMap.put``: a new key goes to the end of its bucket (a long bucket becomes a tree bin),
        resizing after the insert."""
        h = _spread(key)
        tab = self.table if self.table else self._resize()
        i = (len(tab) - 1) & h
        p = tab[i]
        if p is None:
            tab[i] = _Node(h, key)
        elif p.tree:
            if key in self:
                return
            self._put_tree_val(tab, p, h, key)
        else:
            bin_count = 0
            while True:
                if p.key == key:
                    return
                if p.next is None:
                    p.next = _Node(h, key)
                    if bin_count >= _TREEIFY_THRESHOLD - 1:
                        self._treeify_bin(tab, h)
                    break
                p = p.next
                bin_count += 1
        self.size += 1
        if self.size > self.threshold:
            self._resize()

    def compute_if_absent(self, key: str) -> None:
        """``HashMap.computeIfAbsent``: resizing before the lookup, a new key to the front of its bucket."""
        h = _spread(key)
        tab = self.table
        if self.size > self.threshold or not tab:
            tab = self._resize()  # before the lookup: a call for a present key resizes too
        if key in self:
            return
        i = (len(tab) - 1) & h
        first = tab[i]
        if first is not None and first.tree:
            self._put_tree_val(tab, first, h, key)
        else:
            bin_count = 0
            node = first
            while node is not None:
                bin_count += 1
                node = node.next
            tab[i] = _Node(h, key, first)  # a new key goes to the front of its bucket
            if bin_count >= _TREEIFY_THRESHOLD - 1:
                self._treeify_bin(tab, h)
        self.size += 1

    # -- table -----------------------------------------------------------------------------

    def _resize(self) -> list[_Node | None]:
        old = self.table
        old_cap = len(old) if old else 0
        old_thr = self.threshold
        new_thr = 0
        if old_cap > 0:
            if old_cap >= _MAXIMUM_CAPACITY:
                self.threshold = (1 << 31) - 1
                return old  # type: ignore[return-value]
            new_cap = old_cap << 1
            if new_cap < _MAXIMUM_CAPACITY and old_cap >= 16:
                new_thr = old_thr << 1
        elif old_thr > 0:
            new_cap = old_thr
        else:
            new_cap, new_thr = 16, 12
        if new_thr == 0:
            ft = new_cap * 0.75
            new_thr = int(ft) if new_cap < _MAXIMUM_CAPACITY and ft < _MAXIMUM_CAPACITY else (1 << 31) - 1
        self.threshold = new_thr
        tab: list[_Node | None] = [None] * new_cap
        self.table = tab
        for j in range(old_cap):
            e = old[j]  # type: ignore[index]
            if e is None:
                continue
            if e.next is None:
                tab[e.hash & (new_cap - 1)] = e
            elif e.tree:
                self._split(tab, e, j, old_cap)
            else:  # keep the order in both halves
                lo: list[_Node] = []
                hi: list[_Node] = []
                while e is not None:
                    (lo if e.hash & old_cap == 0 else hi).append(e)
                    e = e.next
                for half, index in ((lo, j), (hi, j + old_cap)):
                    if half:
                        for a, b in itertools.pairwise(half):
                            a.next = b
                        half[-1].next = None
                        tab[index] = half[0]
        return tab

    def _treeify_bin(self, tab: list[_Node | None], h: int) -> None:
        if len(tab) < _MIN_TREEIFY_CAPACITY:
            self._resize()
            return
        index = (len(tab) - 1) & h
        e = tab[index]
        previous: _Node | None = None
        while e is not None:
            e.tree = True
            e.prev = previous
            previous = e
            e = e.next
        head = tab[index]
        if head is not None:
            self._treeify(tab, head)

    @staticmethod
    def _move_root_to_front(tab: list[_Node | None], root: _Node) -> None:
        index = (len(tab) - 1) & root.hash
        first = tab[index]
        if root is not first:
            tab[index] = root
            rp, rn = root.prev, root.next
            if rn is not None:
                rn.prev = rp
            if rp is not None:
                rp.next = rn
            if first is not None:
                first.prev = root
            root.next = first
            root.prev = None

    def _treeify(self, tab: list[_Node | None], head: _Node) -> None:
        root: _Node | None = None
        x: _Node | None = head
        while x is not None:
            following = x.next
            x.left = x.right = None
            if root is None:
                x.parent = None
                x.red = False
                root = x
            else:
                p = root
                while True:
                    direction = _direction(x.hash, x.key, p)
                    xp = p
                    child = p.left if direction <= 0 else p.right
                    if child is None:
                        x.parent = xp
                        if direction <= 0:
                            xp.left = x
                        else:
                            xp.right = x
                        root = _balance_insertion(root, x)
                        break
                    p = child
            x = following
        if root is not None:
            self._move_root_to_front(tab, root)

    def _put_tree_val(self, tab: list[_Node | None], first: _Node, h: int, key: str) -> None:
        root = first
        while root.parent is not None:
            root = root.parent
        p = root
        while True:
            direction = _direction(h, key, p)
            xp = p
            child = p.left if direction <= 0 else p.right
            if child is None:
                xpn = xp.next
                x = _Node(h, key, xpn, tree=True)
                if direction <= 0:
                    xp.left = x
                else:
                    xp.right = x
                xp.next = x
                x.parent = x.prev = xp
                if xpn is not None:
                    xpn.prev = x
                self._move_root_to_front(tab, _balance_insertion(root, x))
                return
            p = child

    def _split(self, tab: list[_Node | None], b: _Node, index: int, bit: int) -> None:
        lo: list[_Node] = []
        hi: list[_Node] = []
        e: _Node | None = b
        while e is not None:
            following = e.next
            (lo if e.hash & bit == 0 else hi).append(e)
            e = following
        for half, other, at in ((lo, hi, index), (hi, lo, index + bit)):
            if not half:
                continue
            for k, node in enumerate(half):
                node.prev = half[k - 1] if k else None
                node.next = half[k + 1] if k + 1 < len(half) else None
            if len(half) <= _UNTREEIFY_THRESHOLD:
                for node in half:  # back to plain nodes, same order
                    node.tree = False
                    node.prev = node.parent = node.left = node.right = None
                    node.red = False
                tab[at] = half[0]
            else:
                tab[at] = half[0]
                if other:  # else the tree is already there, whole
                    self._treeify(tab, half[0])


def java_hashmap_order(names: list[str], how: Literal["put", "computeIfAbsent"] = "put") -> list[str]:
    """Iteration order of a default ``java.util.HashMap<String, ?>`` filled with ``names`` in order."""
    hash_map = JavaHashMap()
    for name in names:
        if how == "put":
            hash_map.put(name)
        else:
            hash_map.compute_if_absent(name)
    return hash_map.order()


def _copied(names: list[str]) -> list[str]:
    """A backend's registry (a default ``HashMap``, filled in registration order) as its snapshot
    copies it (``newHashMapWithExpectedSize``): the order the snapshot writes those states."""
    registry = JavaHashMap()
    for name in names:
        registry.put(name)
    copy = JavaHashMap.with_expected_size(len(names))
    for name in registry.order():
        copy.put(name)
    return copy.order()


@dataclass(frozen=True)
class SnapshotNameOrder:
    """The orders of state names in a ``DefaultOperatorStateBackend`` snapshot whose list and
    broadcast states were registered in a given order.

    ``lists`` is the order of the list states' metadata in the stream (a restore registers them
    in it); ``handle`` the order of the handle's map of every state (the repartitioner walks it).
    """

    lists: list[str]
    handle: list[str]

    @classmethod
    def of(cls, lists: list[str], broadcast: list[str]) -> SnapshotNameOrder:
        written = _copied(lists)
        handle = JavaHashMap.with_expected_size(len(lists) + len(broadcast))
        for name in (*written, *_copied(broadcast)):
            handle.put(name)
        return cls(written, handle.order())


def restored_name_order(orders: list[list[str]]) -> list[str]:
    """The registration order of a Flink subtask restoring handles whose list states were
    written in ``orders`` (one per handle, in restore order): each handle's states in turn,
    every one first registered by the first handle that holds it."""
    return list(dict.fromkeys(name for order in orders for name in order))


# -- the repartitioner ------------------------------------------------------------------------


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
    """New subtask states for ``parallelism`` subtasks from the old subtasks' states, as Flink assigns them.

    ``old[s]`` is old subtask ``s`` (one entry per old subtask: its list is empty if it held
    nothing); its ``lists`` then its ``broadcast`` states are its handle, names in the order they
    were registered (that order and the broadcast names decide Flink's order of names). Same
    parallelism: every subtask keeps its own lists and, if there is union state, receives every
    union list of every old subtask. Changed parallelism: split states are cut (name by name in
    Flink's ``HashMap`` order, the start index carried over), union states go to every subtask.
    A new subtask's list concatenates its parts in old-subtask order (Flink: handle order,
    which Flink leaves unspecified).
    """
    check_parallelism(parallelism)
    new = [OperatorSubtaskState() for _ in range(parallelism)]
    union_names: list[str] = []
    grouped = JavaHashMap()  # groupByStateMode: split names, first seen subtask by subtask
    seen: set[str] = set()
    orders: dict[tuple[tuple[str, ...], tuple[str, ...]], SnapshotNameOrder] = {}
    written: list[SnapshotNameOrder | None] = []
    for subtask in old:
        broadcast = tuple(n for n in subtask.broadcast if n not in subtask.lists)
        key = (tuple(subtask.lists), broadcast)
        snapshot = orders.get(key)
        if snapshot is None:
            snapshot = orders[key] = SnapshotNameOrder.of(list(key[0]), list(broadcast))
        written.append(snapshot if key != ((), ()) else None)  # a backend holding nothing writes no handle
        order = [n for n in snapshot.handle if n in subtask.lists]
        split_names = [n for n in order if subtask.lists[n][0] != "union"]
        if seen.issuperset(split_names):
            # Calls for names already there change nothing but the first one's table resize.
            if split_names:
                grouped.compute_if_absent(split_names[0])
        else:
            for name in split_names:
                grouped.compute_if_absent(name)
            seen.update(split_names)
        for name in order:
            if subtask.lists[name][0] == "union" and name not in union_names:
                union_names.append(name)

    def entries(name: str) -> list[tuple[int, list[Any]]]:
        return [(h, s.lists[name][1]) for h, s in enumerate(old) if name in s.lists]

    handles: list[set[int]] = [set() for _ in range(parallelism)]  # the old subtasks' handles each one gets
    if len(old) == parallelism:
        # Same parallelism: every subtask keeps its own handle (RoundRobinOperatorStateRepartitioner
        # returns the old states as they are when there is no union state).
        for index, (target, source) in enumerate(zip(new, old, strict=True)):
            target.lists = {n: (m, list(e)) for n, (m, e) in source.lists.items()}
            if written[index] is not None:
                handles[index].add(index)
    else:
        start = 0
        for name in grouped.order():
            parts, start = _split_name(entries(name), parallelism, start)
            for index, (target, chunks) in enumerate(zip(new, parts, strict=True)):
                # A chunk, even an empty one, brings its old subtask's handle.
                handles[index].update(h for h, _chunk in chunks)
                if chunks:
                    # A subtask's list concatenates its chunks in old-subtask (handle) order.
                    elements = [e for _h, chunk in sorted(chunks, key=lambda c: c[0]) for e in chunk]
                    target.lists[name] = ("split", elements)

    for name in union_names:
        held = entries(name)
        union = [e for _h, elements in held for e in elements]
        for index, target in enumerate(new):
            target.lists[name] = ("union", list(union))
            handles[index].update(h for h, _elements in held)

    if old:
        broadcast_holders = [h for h, s in enumerate(old) if s.broadcast]
        for i, target in enumerate(new):
            source = old[i % len(old)]
            target.broadcast = {n: dict(m) for n, m in source.broadcast.items()}
            if broadcast_holders and len(old) != parallelism:  # the repartitioner's broadcast step
                handles[i].add(broadcast_holders[i % len(broadcast_holders)])
    for target, sources in zip(new, handles, strict=True):
        target.restored_names = restored_name_order(
            [snapshot.lists for h in sorted(sources) if (snapshot := written[h]) is not None]
        )
    return new
