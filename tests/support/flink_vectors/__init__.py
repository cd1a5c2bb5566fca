"""Reference vectors from Flink's own classes: key groups and operator-state repartitioning.

``python -m tests.support.flink_vectors --lib <dir of Flink's jars>`` (or ``make flink-vectors``)
compiles ``FlinkVectors.java`` against the jars of the ``apache-flink-libraries`` wheel
(``pyflink/lib``), feeds it the cases generated here from a seed, and writes the inputs with
Flink's answers to ``tests/vectors/flink-vectors.json.gz``. ``tests/engine/test_flink_vectors.py``
checks Statehouse against that file in every run, and regenerates it fresh when
``STATEHOUSE_FLINK_LIB`` names the jars.

Operator cases run Flink's own ``DefaultOperatorStateBackend``: each old subtask is a backend
that registers its states in a given order (list states, split or union, with 0+ elements each;
broadcast states with one entry), snapshots, and ``RoundRobinOperatorStateRepartitioner`` cuts
the handles for the new subtasks, which restore them; element ``i`` of a list on old subtask
``s`` is ``s<s>e<i>``. Kinds: ``random`` (names absent from or empty on some subtasks, subtasks
holding nothing), ``statehouse`` (every subtask holds every name of the operator, each group in
name order), ``collide`` (names sharing a ``HashMap`` bucket), ``many`` (12-49 names: table
resizing), ``treeify`` (8+ names in one bucket: resizing instead of treeifying, tree bins) and
``names`` (about 20 names every subtask registers, each subtask in its own random order).
``operator_chains`` go through two rescales in a row (p0 -> ``via`` -> p1), every old subtask
registering every state of the operator (what a Statehouse snapshot means, see
docs/state-model.md): the second cut depends on the order in which each restored subtask
registered its states. The stored form is compact: per case its ``names``, their ``modes``
(one letter each: S, U, B), per old subtask ``[[name index, count]...]`` in registration order
(or None: nothing registered) and per new subtask its non-empty lists ``[[name index, [[old
subtask, element]...]]...]`` in Flink's order (``mid`` after a chain's first rescale, ``out``
after the last); ``operator_input``/``operator_expected`` expand them.
"""

from __future__ import annotations

import gzip
import json
import os
import random
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

from statehouse.protocol.keygroups import java_string_hash

HERE = Path(__file__).resolve().parent
SOURCE = HERE / "FlinkVectors.java"
VECTORS = HERE.parents[1] / "vectors" / "flink-vectors.json.gz"
LIB_ENV = "STATEHOUSE_FLINK_LIB"
FLINK_VERSION = "2.3.0"
DEFAULT_SEED = 20261123
NAME_CHARS = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-"
COMMON_NAMES = ["offsets", "buffer", "pending", "splits", "watermarks", "src", "sink", "a", "b", "q", "x-1", "x.2"]


# -- running Flink ------------------------------------------------------------------------------


def flink_lib(lib: str | None = None) -> Path | None:
    """The directory of Flink's jars (``pyflink/lib`` of apache-flink-libraries), if there is one."""
    candidate = lib or os.environ.get(LIB_ENV)
    if not candidate:
        return None
    path = Path(candidate)
    if (path / "pyflink" / "lib").is_dir():
        path = path / "pyflink" / "lib"
    return path if any(path.glob("flink-dist-*.jar")) else None


def run_flink(lib: Path, requests: list[str]) -> list[str]:
    """Compile the generator against ``lib`` and answer ``requests`` (one line each)."""
    if shutil.which("javac") is None or shutil.which("java") is None:
        raise RuntimeError("javac and java (17+) are needed")
    classpath = f"{lib}/*"
    with tempfile.TemporaryDirectory(prefix="flink-vectors-") as build:
        subprocess.run(["javac", "-nowarn", "-d", build, "-cp", classpath, str(SOURCE)], check=True)
        done = subprocess.run(
            ["java", "-Xss8m", "-cp", f"{build}{os.pathsep}{classpath}", "FlinkVectors"],
            input="\n".join(requests) + "\n",
            capture_output=True,
            text=True,
            encoding="utf-8",
            check=False,
        )
    if done.returncode != 0:
        raise RuntimeError(f"FlinkVectors failed ({done.returncode}): {done.stderr[-4000:]}")
    answers = done.stdout.split("\n")
    if answers and answers[-1] == "":
        answers.pop()
    if len(answers) != len(requests):
        raise RuntimeError(f"{len(requests)} requests, {len(answers)} answers")
    return answers


def hex16(s: str) -> str:
    data = s.encode("utf-16-be", "surrogatepass")
    return data.hex()


def unhex16(h: str) -> str:
    return bytes.fromhex(h).decode("utf-16-be", "surrogatepass")


# -- cases --------------------------------------------------------------------------------------


def _random_key(rng: random.Random) -> str:
    roll = rng.random()
    n = rng.choice([0, 1, 2, 5, 8, 16, 40]) if roll < 0.3 else rng.randint(1, 24)
    if roll < 0.55:
        return "".join(rng.choice(NAME_CHARS) for _ in range(n))
    if roll < 0.8:  # any BMP character (no lone surrogates)
        return "".join(chr(rng.choice([rng.randint(0x20, 0xD7FF), rng.randint(0xE000, 0xFFFF)])) for _ in range(n))
    if roll < 0.9:  # astral characters: surrogate pairs in Java
        return "".join(chr(rng.randint(0x10000, 0x10FFFF)) for _ in range(max(1, n // 2)))
    return f"user-{rng.randint(0, 10**9)}"


def _max_parallelism(rng: random.Random) -> int:
    return rng.choice([1, 2, 3, 7, 128, 129, 256, 1000, 4096, 32768, rng.randint(1, 32768), rng.randint(1, 512)])


def key_group_cases(rng: random.Random, n: int) -> list[list[Any]]:
    cases: list[list[Any]] = []
    for i in range(n):
        kind = ("string", "int", "long")[i % 3]
        if kind == "string":
            key: Any = _random_key(rng)
        elif kind == "int":
            key = rng.choice(
                [0, 1, -1, 2**31 - 1, -(2**31), rng.randint(-1000, 1000), rng.randint(-(2**31), 2**31 - 1)]
            )
        else:
            key = rng.choice([0, -1, 2**63 - 1, -(2**63), 2**32, rng.randint(-(2**63), 2**63 - 1), rng.randint(-5, 5)])
        max_parallelism = _max_parallelism(rng)
        parallelism = rng.choice(
            [1, max_parallelism, rng.randint(1, max_parallelism), rng.randint(1, min(8, max_parallelism))]
        )
        cases.append([kind, max_parallelism, parallelism, key])
    return cases


def range_cases(rng: random.Random, n: int) -> list[list[int]]:
    cases = []
    for _ in range(n):
        max_parallelism = _max_parallelism(rng)
        parallelism = rng.choice(
            [1, max_parallelism, rng.randint(1, max_parallelism), rng.randint(1, min(64, max_parallelism))]
        )
        cases.append([max_parallelism, parallelism, rng.randrange(parallelism)])
    return cases


def default_max_cases(rng: random.Random, n: int) -> list[int]:
    edges = [1, 2, 84, 85, 86, 87, 128, 170, 171, 172, 1000, 21845, 21846, 21847, 32767, 32768]
    return edges + [rng.randint(1, 32768) for _ in range(n - len(edges))]


def _random_name(rng: random.Random, lo: int = 1, hi: int = 10) -> str:
    return "".join(rng.choice(NAME_CHARS) for _ in range(rng.randint(lo, hi)))


def spread(name: str) -> int:
    h = java_string_hash(name) & 0xFFFFFFFF
    return h ^ (h >> 16)


def colliding_names(rng: random.Random, bits: int, count: int) -> list[str]:
    """``count`` distinct names whose HashMap hashes agree in the low ``bits`` bits."""
    buckets: dict[int, list[str]] = {}
    mask = (1 << bits) - 1
    while True:
        name = _random_name(rng, 1, 8)
        bucket = buckets.setdefault(spread(name) & mask, [])
        if name not in bucket:
            bucket.append(name)
            if len(bucket) == count:
                return bucket


def hashmap_cases(rng: random.Random, n: int) -> list[list[Any]]:
    cases: list[list[Any]] = []
    for i in range(n):
        how = "put" if i % 2 == 0 else "cia"
        shape = i % 5
        if shape == 0:
            names = [_random_name(rng) for _ in range(rng.randint(0, 80))]
        elif shape == 1:
            names = colliding_names(rng, rng.choice([4, 5, 6, 8]), rng.randint(2, 14))
        elif shape == 2:
            names = colliding_names(rng, rng.choice([6, 8, 10]), rng.randint(8, 30))
            names += [_random_name(rng) for _ in range(rng.randint(0, 60))]
            rng.shuffle(names)
        elif shape == 3:
            names = [_random_name(rng) for _ in range(rng.choice([11, 12, 13, 14, 24, 25, 48, 49, 97]))]
        else:
            names = colliding_names(rng, 4, rng.randint(2, 6)) + [_random_name(rng) for _ in range(rng.randint(0, 20))]
        names = list(dict.fromkeys(names))
        if names and rng.random() < 0.5:  # present keys again: computeIfAbsent resizes on those too
            names += rng.choices(names, k=rng.randint(1, 10))
        capacity = rng.choice([-1, -1, 0, 1, 2, 3, 4, 5, 8, 17, len(names), len(names) * 4 // 3 + 1])
        cases.append([how, capacity, names])
    return cases


def _operator_case(
    rng: random.Random, kind: str, names: list[str], old: int, new: int, union_share: float
) -> dict[str, Any]:
    """A case in the stored form: names, their modes ('S' split, 'U' union, 'B' broadcast), per
    old subtask [[name index, element count]...] in registration order, or None (no handle)."""
    modes = ["U" if rng.random() < union_share else "S" for _ in names]
    if len(names) > 1 and rng.random() < 0.3:  # broadcast states share the handle's name map
        for i in rng.sample(range(len(names)), rng.randint(1, min(3, len(names) - 1))):
            modes[i] = "B"
    max_count = rng.choice([1, 2, 4, 8])
    subtasks: list[list[list[int]] | None] = []
    for _s in range(old):
        if kind == "statehouse":  # list states in name order, then broadcast states in name order
            present = sorted(range(len(names)), key=lambda i: (modes[i] == "B", names[i]))
        elif rng.random() < 0.1:
            subtasks.append(None)  # no handle at all
            continue
        else:
            present = [i for i in range(len(names)) if rng.random() < 0.85]
            rng.shuffle(present)
            present.sort(key=lambda i: modes[i] == "B")  # Flink's snapshot puts broadcast states last
        subtasks.append(
            [[i, 1 if modes[i] == "B" else 0 if rng.random() < 0.25 else rng.randint(1, max_count)] for i in present]
        )
    return {"kind": kind, "old": old, "new": new, "names": names, "modes": "".join(modes), "in": subtasks}


def operator_cases(rng: random.Random, n: int) -> list[dict[str, Any]]:
    cases = []
    kinds = ["random", "random", "statehouse", "statehouse", "collide", "many", "treeify"]
    for i in range(n):
        kind = kinds[i % len(kinds)]
        old = rng.choice([1, 2, 3, 4, 5, 8, rng.randint(1, 12)])
        new = rng.choice([old, old, old + 1, max(1, old - 1), rng.randint(1, 12), rng.randint(1, 3)])
        union_share = rng.choice([0.0, 0.0, 0.2, 0.5])
        if kind in ("random", "statehouse"):
            pool = COMMON_NAMES + [_random_name(rng) for _ in range(8)]
            names = rng.sample(pool, rng.randint(1, 7))
        elif kind == "collide":
            names = colliding_names(rng, rng.choice([4, 4, 5, 6]), rng.randint(2, 4))
            names += [_random_name(rng) for _ in range(rng.randint(0, 6))]
        elif kind == "many":
            names = [_random_name(rng) for _ in range(rng.choice([12, 13, 13, 14, 20, 24, 25, 37, 49]))]
        else:
            names = colliding_names(rng, rng.choice([6, 7, 8]), rng.randint(8, 12))
            names += [_random_name(rng) for _ in range(rng.randint(0, 20))]
        names = list(dict.fromkeys(names))
        if kind in ("many", "treeify"):
            old = min(old, rng.randint(1, 6))
            union_share = min(union_share, 0.2)
            kind_case = _operator_case(
                rng, "statehouse" if rng.random() < 0.5 else "random", names, old, new, union_share
            )
            kind_case["kind"] = kind
            cases.append(kind_case)
        else:
            cases.append(_operator_case(rng, kind, names, old, new, union_share))
    # Two edge cases: a trailing empty subtask, union state at the same parallelism.
    for modes, counts, new in (("S", (5, 1, 0), 2), ("U", (3, 1, 3), 3)):
        names = ["s" if modes == "S" else "u"]
        cases.append(
            {"kind": "issue", "old": 3, "new": new, "names": names, "modes": modes, "in": [[[0, c]] for c in counts]}
        )
    cases += [registration_order_case(rng) for _ in range(max(1, n // 14))]
    return cases


def chain_cases(rng: random.Random, n: int) -> list[dict[str, Any]]:
    """Two rescales in a row, every old subtask registering every state of the operator (what a
    Statehouse snapshot means): its lists in its own random order, then its broadcast states."""
    cases = []
    for i in range(n):
        if i % 3 == 2:
            names = list(dict.fromkeys(_random_name(rng, 1, 8) for _ in range(rng.randint(12, 24))))
        elif i % 3 == 1:
            names = colliding_names(rng, rng.choice([4, 5]), rng.randint(2, 4))
            names += [_random_name(rng) for _ in range(rng.randint(0, 6))]
            names = list(dict.fromkeys(names))
        else:
            names = rng.sample(COMMON_NAMES + [_random_name(rng) for _ in range(8)], rng.randint(1, 7))
        union_share = rng.choice([0.0, 0.0, 0.1, 0.3])
        modes = ["U" if rng.random() < union_share else "S" for _ in names]
        if len(names) > 1 and rng.random() < 0.2:
            modes[rng.randrange(len(names))] = "B"
        p0 = rng.choice([1, 2, 3, 4, 5, rng.randint(1, 8)])
        p1 = rng.choice([p0 + 1, max(1, p0 - 1), rng.randint(1, 8), p0])
        p2 = rng.choice([p1 + 1, max(1, p1 - 1), rng.randint(1, 8), p0])
        max_count = rng.choice([1, 2, 4, 8])
        lists = [i for i, mode in enumerate(modes) if mode != "B"]
        broadcast = sorted((i for i, mode in enumerate(modes) if mode == "B"), key=lambda i: names[i])
        subtasks = []
        for _s in range(p0):
            order = rng.sample(lists, len(lists))
            counts = [[i, 0 if rng.random() < 0.25 else rng.randint(1, max_count)] for i in order]
            subtasks.append(counts + [[i, 1] for i in broadcast])
        cases.append(
            {"kind": "chain", "old": p0, "via": p1, "new": p2, "names": names, "modes": "".join(modes), "in": subtasks}
        )
    return cases


def _lists_answer(case: dict[str, Any], text: str) -> list[list[list[Any]]]:
    """The lists after one rescale (OP and CHAIN answers): per subtask [[name index, [[old subtask,
    element]...]]...]."""
    index = {name: i for i, name in enumerate(case["names"])}
    out = []
    for subtask in text.split(";"):
        entries = []
        for entry in subtask.split(",") if subtask else []:
            name, _mode, elements = entry.split(":")
            pairs = [[int(x) for x in e[1:].split("e")] for e in elements.split(".")]
            entries.append([index[unhex16(name)], pairs])
        out.append(entries)
    return out


def registration_order_case(rng: random.Random) -> dict[str, Any]:
    """About 20 names that every old subtask registers (as operator code does), each subtask in
    its own random order: Flink walks the names of each handle in the order of a ``HashMap``
    filled in that subtask's registration order (kind ``names``; 4 -> 3 among them)."""
    names = list(dict.fromkeys(_random_name(rng, 1, 8) for _ in range(20)))
    old = rng.choice([4, 4, 4, 2, 3, 5, 6])
    new = rng.choice([3, 3, old - 1 or 2, old + 1, rng.randint(1, 8)])
    modes = "".join("U" if rng.random() < 0.05 else "S" for _ in names)
    subtasks = []
    for _s in range(old):
        order = list(range(len(names)))
        rng.shuffle(order)
        subtasks.append([[i, rng.choice([0, 1, 1, 2, 3, 5])] for i in order])
    return {"kind": "names", "old": old, "new": new, "names": names, "modes": modes, "in": subtasks}


# -- requests and answers -----------------------------------------------------------------------


def _op_request(case: dict[str, Any]) -> str:
    names, modes = case["names"], case["modes"]
    subtasks = []
    for entries in case["in"]:
        if entries is None:
            subtasks.append("-")
        else:
            subtasks.append(",".join(f"{hex16(names[i])}:{modes[i]}:{count}" for i, count in entries))
    return f"OP {case['old']} {case['new']} {';'.join(subtasks)}"


def build(seed: int, lib: Path, scale: float = 1.0) -> dict[str, Any]:
    rng = random.Random(seed)
    keys = key_group_cases(rng, int(12_000 * scale))
    ranges = range_cases(rng, int(1_000 * scale))
    defaults = default_max_cases(rng, max(20, int(300 * scale)))
    maps = hashmap_cases(rng, int(600 * scale))
    ops = operator_cases(rng, int(4_200 * scale))
    chains = chain_cases(rng, int(900 * scale))

    requests: list[str] = []
    for kind, max_parallelism, parallelism, key in keys:
        requests.append(f"KG {kind} {max_parallelism} {parallelism} {hex16(key) if kind == 'string' else key}")
    requests += [f"RANGE {m} {p} {i}" for m, p, i in ranges]
    requests += [f"DEFMAX {p}" for p in defaults]
    requests += [f"HM {how} {cap} {' '.join(hex16(n) for n in names)}".rstrip() for how, cap, names in maps]
    requests += [_op_request(case) for case in ops]
    requests += [f"CHAIN {c['old']} {c['via']} {c['new']} {_op_request(c).split(' ', 3)[3]}" for c in chains]
    answers = iter(run_flink(lib, requests))

    for case in keys:
        case.extend(int(x) for x in next(answers).split())  # key group, operator index
    for case in ranges:
        case.extend(int(x) for x in next(answers).split())
    default_pairs = [[p, int(next(answers))] for p in defaults]
    for case in maps:
        line = next(answers)
        case.append([unhex16(h) for h in line.split(" ")] if line else [])
    for case in ops:
        case["out"] = _lists_answer(case, next(answers))
    for case in chains:
        mid, out = next(answers).split(" ")
        case["mid"], case["out"] = _lists_answer(case, mid), _lists_answer(case, out)
    return {
        "flink": FLINK_VERSION,
        "seed": seed,
        "generator": "tests/support/flink_vectors (python -m tests.support.flink_vectors)",
        "key_groups": keys,
        "key_group_ranges": ranges,
        "default_max_parallelism": default_pairs,
        "hashmap_order": maps,
        "operator": ops,
        "operator_chains": chains,
    }


def write(vectors: dict[str, Any], path: Path = VECTORS) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    data = json.dumps(vectors, separators=(",", ":"), ensure_ascii=False).encode()
    path.write_bytes(gzip.compress(data, compresslevel=9, mtime=0))


def load(path: Path = VECTORS) -> dict[str, Any]:
    return json.loads(gzip.decompress(path.read_bytes()))


_MODES = {"S": "split", "U": "union", "B": "broadcast"}


def operator_input(case: dict[str, Any]) -> list[list[tuple[str, str, list[str]]] | None]:
    """Per old subtask its handle, (name, 'split'|'union'|'broadcast', elements) in registration
    order, or None; a broadcast state's one entry is not an element (its list is empty)."""
    names, modes = case["names"], case["modes"]
    return [
        None
        if entries is None
        else [
            (names[i], _MODES[modes[i]], [] if modes[i] == "B" else [f"s{s}e{e}" for e in range(c)]) for i, c in entries
        ]
        for s, entries in enumerate(case["in"])
    ]


def operator_expected(case: dict[str, Any], level: str = "out") -> list[dict[str, tuple[str, list[str]]]]:
    """Flink's list states per new subtask, {name: (mode, elements)}, empty lists left out, after
    the (last) rescale, or for a chain after the first (``level="mid"``). Broadcast states are left
    out (Statehouse keeps one map per operator)."""
    names, modes = case["names"], case["modes"]
    return [
        {names[i]: (_MODES[modes[i]], [f"s{s}e{e}" for s, e in pairs]) for i, pairs in entries}
        for entries in case[level]
    ]


__all__ = ["VECTORS", "build", "flink_lib", "load", "operator_expected", "operator_input", "write"]
