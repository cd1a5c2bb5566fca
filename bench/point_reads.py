"""The floor of a point read through rocksdict, with the server's options (RESULTS §16 addendum).

Two column families of ``--keys`` keys each (a key group's two bytes and a msgpack string, as the
replica stores a user's key; one msgpack float as the value), written in ten sorted batches and
flushed, then ten micro-batches of 25,000 random updates (a flush after every third): the files a
replica's state leaves. Then sorted multi-gets of 25,000 random keys per family (as
``RocksDBPartition.get_many`` reads), unsorted ones, keys that are not there, and the same after a
full compaction; thread CPU per key, median of ``--rounds``. ``--variant`` changes one table option
against the server's (``backends/rocksdb/database.py``), or the level shape (``files-4m``, ``files-2m``).

    .venv/bin/python -m bench.point_reads --keys 1000000
    .venv/bin/python -m bench.point_reads --keys 1000000 --variant hash
"""

from __future__ import annotations

import argparse
import random
import statistics
import tempfile
import time

import msgpack
from rocksdict import BlockBasedOptions, Cache, DataBlockIndexType, DBCompressionType, Options, Rdict, WriteBatch

from statehouse.backends.rocksdb.database import TableFiles, db_options

VARIANTS = ("server", "hash", "block-16k", "cache-index", "no-compression", "row-cache", "files-4m", "files-2m")
# Level shapes (table file / base level sizes) against the server's.
SHAPES = {"files-4m": TableFiles(4 << 20, 16 << 20), "files-2m": TableFiles(2 << 20, 4 << 20)}
READS = 25_000


def options(variant: str, cache: Cache) -> Options:
    """The server's options with the block cache ``cache``, ``variant`` changing one of them."""
    opts = db_options(block_cache=cache, files=SHAPES.get(variant))
    table = BlockBasedOptions()
    table.set_bloom_filter(10, False)
    table.set_block_cache(cache)
    if variant == "hash":
        table.set_data_block_index_type(DataBlockIndexType.binary_and_hash())
    elif variant == "block-16k":
        table.set_block_size(16 << 10)
    elif variant == "cache-index":
        table.set_cache_index_and_filter_blocks(True)
        table.set_pin_l0_filter_and_index_blocks_in_cache(True)
    opts.set_block_based_table_factory(table)
    if variant == "no-compression":
        opts.set_compression_type(DBCompressionType.none())
    elif variant == "row-cache":
        opts.set_row_cache(Cache(128 << 20))
    return opts


def stored_key(i: int) -> bytes:
    return ((i * 2_654_435_761) % 128).to_bytes(2, "big") + msgpack.packb(f"user-{i}")


def per_key(read: list[bytes], families: list[Rdict]) -> float:
    """Thread CPU µs per key of one multi-get of ``read`` in each family."""
    started = time.thread_time()
    for family in families:
        family.get(read)
    return (time.thread_time() - started) / (len(read) * len(families)) * 1e6


def main(argv: list[str] | None = None) -> dict[str, float]:
    """Run the probe; per measure, the median µs per key."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--keys", type=int, default=1_000_000, help="keys per column family")
    p.add_argument("--variant", choices=VARIANTS, default="server")
    p.add_argument("--rounds", type=int, default=6)
    args = p.parse_args(argv)
    results: dict[str, float] = {}
    rng = random.Random(1)
    cache = Cache(256 << 20)
    with tempfile.TemporaryDirectory(prefix="statehouse-point-reads-") as path:
        db = Rdict(path, options(args.variant, cache), column_families={n: options(args.variant, cache) for n in "ab"})
        handles = [db.get_column_family_handle(n) for n in "ab"]
        families = [db.get_column_family(n) for n in "ab"]
        keys = [stored_key(i) for i in range(args.keys)]
        value = msgpack.packb(1.5)
        order = list(range(args.keys))
        rng.shuffle(order)
        chunk = max(1, args.keys // 10)
        for start in range(0, args.keys, chunk):
            for handle in handles:
                batch = WriteBatch(raw_mode=True)
                for i in sorted(order[start : start + chunk], key=keys.__getitem__):
                    batch.put(keys[i], value, handle)
                db.write(batch)
            db.flush()
        for micro_batch in range(10):
            for handle in handles:
                batch = WriteBatch(raw_mode=True)
                for i in sorted(rng.choices(range(args.keys), k=READS)):
                    batch.put(keys[i], value, handle)
                db.write(batch)
            if micro_batch % 3 == 2:
                db.flush()
        time.sleep(3)  # the compactions those flushes start

        def measure(label: str, sort: bool = True, missing: bool = False) -> None:
            runs = []
            for _ in range(args.rounds):
                picked = rng.choices(range(args.keys), k=READS)
                read = [stored_key(args.keys + i) if missing else keys[i] for i in picked]
                runs.append(per_key(sorted(read) if sort else read, families))
            results[label] = statistics.median(runs)
            print(f"{args.variant:15} {label:24} {results[label]:5.2f} µs/key (min {min(runs):.2f})")

        measure("sorted multi-get")
        measure("unsorted multi-get", sort=False)
        measure("keys not there", missing=True)
        for family in families:
            family.compact_range(None, None)
        measure("after a full compaction")
        db.close()
    return results


if __name__ == "__main__":
    main()
