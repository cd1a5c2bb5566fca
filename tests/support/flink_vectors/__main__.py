"""``python -m tests.support.flink_vectors [--lib DIR] [--seed N] [--out FILE]``: regenerate the vectors.

DIR is the directory of Flink's jars, e.g. after
``pip install --target /tmp/flinklibs apache-flink-libraries==2.3.0``: ``/tmp/flinklibs/pyflink/lib``
(or set STATEHOUSE_FLINK_LIB). Needs javac/java 17.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from tests.support.flink_vectors import DEFAULT_SEED, LIB_ENV, VECTORS, build, flink_lib, write


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.support.flink_vectors", description=__doc__)
    parser.add_argument("--lib", help=f"directory of Flink's jars (default: ${LIB_ENV})")
    parser.add_argument("--seed", type=int, default=DEFAULT_SEED)
    parser.add_argument("--out", type=Path, default=VECTORS)
    args = parser.parse_args(argv)
    lib = flink_lib(args.lib)
    if lib is None:
        parser.error(f"no Flink jars: pass --lib or set {LIB_ENV} to apache-flink-libraries' pyflink/lib")
    vectors = build(args.seed, lib)
    write(vectors, args.out)
    print(
        f"{args.out}: {len(vectors['key_groups'])} keys, {len(vectors['key_group_ranges'])} ranges, "
        f"{len(vectors['default_max_parallelism'])} default max parallelisms, "
        f"{len(vectors['hashmap_order'])} HashMap orders, {len(vectors['operator'])} operator cases, "
        f"{len(vectors['operator_chains'])} chained "
        f"({args.out.stat().st_size} bytes)",
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
