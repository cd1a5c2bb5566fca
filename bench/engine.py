"""The engine's CPU per operation, in process (no HTTP: on a loaded machine the server's own work
is what moves least): every door's entry point (``attempts.perform``) for 1,000-op batches and
1,000-row columnar requests of 16-byte keys and 100-byte values, direct and staged under a task
attempt, and the epoch commit that replays the staged writes. Process CPU time, best of
``--repeat`` repetitions, µs per operation (RESULTS §14 and §14b).

    .venv/bin/python -m bench.engine                  # both backends
    .venv/bin/python -m bench.engine --backends heap --repeat 5
"""

from __future__ import annotations

import argparse
import tempfile
import time
from collections.abc import Callable
from typing import Any

import pyarrow as pa

from statehouse.backends import attempts
from statehouse.backends.catalog import JobCatalog
from statehouse.backends.columns import ColumnOp
from statehouse.backends.heap import HeapStore
from statehouse.backends.job import Job
from statehouse.backends.ops import BatchOps
from statehouse.backends.rocksdb import RocksDBStore
from statehouse.backends.staging import AttemptRef, Winner
from statehouse.snapshots.stored.descriptors import StateDescriptor

ROWS = 1_000
KEYS = [f"key-{i:012d}" for i in range(ROWS)]  # 16 bytes
VALUE = "v" * 100
STATES = {
    "v": {"kind": "value"},
    "l": {"kind": "list"},
    "m": {"kind": "map"},
    "s": {"kind": "reducing", "function": "sum"},
}


def _batch(op: str, state: str, **fields: Any) -> BatchOps:
    return BatchOps([{"op": op, "state": state, "key": k, **fields} for k in KEYS])


WORK: dict[str, Callable[[], Any]] = {
    "batch put": lambda: _batch("put", "v", value=VALUE),
    "batch get": lambda: _batch("get", "v"),
    "batch list add": lambda: _batch("add", "l", value=VALUE),
    "batch map put": lambda: _batch("map_put", "m", user_key="u", value=VALUE),
    "batch sum add": lambda: _batch("add", "s", value=1),
    "columnar put": lambda: ColumnOp.parse("v", "put", pa.table({"key": KEYS, "value": [VALUE] * ROWS})),
    "columnar get": lambda: ColumnOp.parse("v", "get", pa.table({"key": KEYS})),
}


def _cpu_per_op(run: Callable[[], object], ops: int, repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        start = time.process_time()
        run()
        best = min(best, time.process_time() - start)
    return best / ops * 1e6


def _job(catalog: JobCatalog) -> Job:
    job, _created = catalog.create("bench", 128)
    for name, spec in STATES.items():
        job.register_state(StateDescriptor.from_dict({"name": name, **spec}))
    attempts.perform(job, _batch("put", "v", value=VALUE))
    return job


def measure(catalog: JobCatalog, repeat: int) -> dict[str, float]:
    job = _job(catalog)
    found = {name: _cpu_per_op(lambda w=work: attempts.perform(job, w()), ROWS, repeat) for name, work in WORK.items()}
    # Staged under an attempt, then the commit's replay (a new epoch each repetition).
    epoch = [job.epoch]

    def staged_then_commit() -> tuple[float, float]:
        epoch[0] += 1
        job.fence(epoch[0])
        start = time.process_time()
        for seq, work in enumerate(("batch put", "batch sum add", "batch map put", "columnar put")):
            attempts.perform(job, WORK[work](), epoch=epoch[0], attempt=AttemptRef(0, "a", seq))
        staged = time.process_time() - start
        job.register_state(StateDescriptor.from_dict({"name": f"x{epoch[0]}", "kind": "value"}))  # force replay
        start = time.process_time()
        attempts.commit(job, epoch[0], [Winner(0, "a", 4 * ROWS)])
        return staged, time.process_time() - start

    runs = [staged_then_commit() for _ in range(repeat)]
    found["staged (4 requests)"] = min(s for s, _c in runs) / (4 * ROWS) * 1e6
    found["commit replay"] = min(c for _s, c in runs) / (4 * ROWS) * 1e6
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backends", default="heap,rocksdb")
    parser.add_argument("--repeat", type=int, default=15)
    args = parser.parse_args()
    for backend in args.backends.split(","):
        with tempfile.TemporaryDirectory() as tmp:
            catalog = JobCatalog(HeapStore() if backend == "heap" else RocksDBStore(tmp))
            found = measure(catalog, args.repeat)
            catalog.close()
        print(backend, "  ".join(f"{name} {value:.2f}" for name, value in found.items()))


if __name__ == "__main__":
    main()
