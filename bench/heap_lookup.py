"""The floor of the heap's many-row get, in process: the dicts it keeps against keys held as arrays.

A flat table of ``--keys`` keys in the heap's layout (a dict per key group, 128 of them, of stored
key bytes to stored value bytes: a ~20-byte key, a 100-byte value), read ``--rows`` random keys
at a time, each request's keys new bytes objects as a request's are:

* **dicts**: as ``HeapPartition.get_many`` reads (each row's dict, then its value: two C loops),
  the answer then built as an Arrow binary array;
* **sorted hashes**: the same keys as arrays: a 64-bit hash of each stored key, sorted, with the
  keys and values as Arrow arrays in that order; a request hashes its keys (numpy, over the Arrow
  buffer), finds them with ``np.searchsorted``, checks the keys found (one Arrow take and compare)
  and gathers the values with one take;
* **hash index**: the same, found through a hash table of the 64-bit hashes (pandas'
  ``Index.get_indexer``, a khash table built once).

Every way's answer is checked equal to the dicts'. Thread CPU µs per key, median of ``--rounds``;
each round reads ``--requests`` different requests, so that their keys spread over the table as
a live state's do (the same few requests again would be served from the CPU's caches).

    .venv/bin/python -m bench.heap_lookup --keys 1000000
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from bench.common import print_header, table, write_json

KEY_GROUPS = 128
_PRIME = np.uint64(1_099_511_628_211)  # FNV's 64-bit prime: the hash's polynomial base
_POWERS = np.cumprod(np.full(256, _PRIME, np.uint64), dtype=np.uint64) // _PRIME  # _PRIME**k, wrapping


def hashes(keys: pa.BinaryArray) -> np.ndarray:
    """A 64-bit hash of every key (a polynomial over its bytes, then a multiply-xorshift), from
    the Arrow buffers: one numpy pass, no Python step per key. Keys up to 256 bytes."""
    offsets = np.frombuffer(keys.buffers()[1], np.int32)[keys.offset : keys.offset + len(keys) + 1].astype(np.int64)
    data = np.frombuffer(keys.buffers()[2], np.uint8)[offsets[0] : offsets[-1]].astype(np.uint64)
    starts, lengths = offsets[:-1] - offsets[0], np.diff(offsets)
    position = np.arange(len(data)) - np.repeat(starts, lengths)
    h = np.add.reduceat(data * _POWERS[position], starts)
    h ^= lengths.astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15)
    h *= np.uint64(0xFF51AFD7ED558CCD)
    h ^= h >> np.uint64(33)
    return h


class Arrays:
    """The table as arrays: the keys' hashes, the keys and the values, in one order."""

    def __init__(self, keys: list[bytes], values: list[bytes], *, by_hash: bool) -> None:
        stored, stored_values = pa.array(keys, pa.binary()), pa.array(values, pa.binary())
        found = hashes(stored)
        if len(np.unique(found)) != len(found):
            raise SystemExit("two keys share a 64-bit hash: use other keys")
        if by_hash:  # sorted by hash, for a binary search
            taken = pa.array(np.argsort(found, kind="stable"))
            stored, stored_values, found = stored.take(taken), stored_values.take(taken), found[taken.to_numpy()]
        self.hashes, self.keys, self.values = found, stored, stored_values
        self.index = None
        if not by_hash:  # in a hash table (pandas' Index of unsorted values: a khash engine)
            import pandas as pd  # type: ignore[import-untyped]  # the dev extra's; only this way needs it

            self.index = pd.Index(found)
            self.index.get_indexer(found[:1])  # builds its hash table now, not in the first request

    def gather(self, query: pa.BinaryArray, query_hashes: np.ndarray, positions: np.ndarray) -> pa.Array:
        """The values at ``positions`` where the key there is the query's, else null."""
        positions = np.where(positions < 0, 0, np.minimum(positions, len(self.hashes) - 1))
        taken = pa.array(positions)
        same = pc.and_(pa.array(self.hashes[positions] == query_hashes), pc.equal(self.keys.take(taken), query))
        return pc.if_else(same, self.values.take(taken), pa.scalar(None, pa.binary()))

    def find(self, query: pa.BinaryArray) -> pa.Array:
        query_hashes = hashes(query)
        if self.index is None:
            return self.gather(query, query_hashes, np.searchsorted(self.hashes, query_hashes))
        return self.gather(query, query_hashes, self.index.get_indexer(query_hashes))


def _key_group(key: bytes) -> int:
    return hash(key) % KEY_GROUPS


def measure(cfg: argparse.Namespace) -> dict[str, Any]:
    rng = random.Random(1)
    keys = [f"user-{i:015d}".encode() for i in range(cfg.keys)]
    values = [rng.randbytes(100) for _ in range(cfg.keys)]
    groups: dict[int, dict[bytes, bytes]] = {}
    for key, value in zip(keys, values, strict=True):
        groups.setdefault(_key_group(key), {})[key] = value
    by_hash, in_table = Arrays(keys, values, by_hash=True), Arrays(keys, values, by_hash=False)
    requests = []
    for _ in range(cfg.requests):
        # new bytes objects, as a request's stored keys are; a tenth not in the table
        chosen = [
            bytes(keys[rng.randrange(cfg.keys)]) if rng.random() < 0.9 else b"absent-%d" % i for i in range(cfg.rows)
        ]
        requests.append((chosen, [_key_group(k) for k in chosen], pa.array(chosen, pa.binary())))

    def dicts(chosen: list[bytes], kgs: list[int], _query: pa.BinaryArray) -> pa.Array:
        empty: dict[bytes, bytes] = {}
        found = {kg: groups[kg] for kg in set(kgs) if kg in groups}
        return pa.array(list(map(dict.get, map(found.get, kgs, [empty] * len(kgs)), chosen)), pa.binary())

    ways: dict[str, Callable[[list[bytes], list[int], pa.BinaryArray], pa.Array]] = {
        "dicts": dicts,
        "sorted hashes": lambda _c, _k, query: by_hash.find(query),
        "hash index": lambda _c, _k, query: in_table.find(query),
    }
    for request in requests[:3]:
        expected = dicts(*request)
        for name, way in ways.items():
            if not way(*request).equals(expected):
                raise SystemExit(f"{name} answered otherwise than the dicts")
    per_key: dict[str, list[float]] = {name: [] for name in ways}
    for round_ in range(cfg.rounds):
        order = list(ways.items())
        for name, way in order if round_ % 2 == 0 else reversed(order):
            started = time.thread_time()
            for request in requests:
                way(*request)
            per_key[name].append((time.thread_time() - started) / (cfg.requests * cfg.rows) * 1e6)
    return {name: statistics.median(found) for name, found in per_key.items()}


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--keys", type=int, default=1_000_000)
    p.add_argument("--rows", type=int, default=1_000, help="keys per request")
    p.add_argument("--requests", type=int, default=200, help="different requests per round")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--json")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    cfg = parse(argv)
    print_header("The heap's many-row get: dicts against keys held as arrays (in process)")
    found = measure(cfg)
    print(
        table(
            ["way", "keys", "rows per request", "thread CPU µs per key"],
            [[name, f"{cfg.keys:,}", f"{cfg.rows:,}", f"{us:.3f}"] for name, us in found.items()],
        )
    )
    out = {"config": vars(cfg), "results": found}
    write_json(cfg.json, out)
    return out


if __name__ == "__main__":
    main()
