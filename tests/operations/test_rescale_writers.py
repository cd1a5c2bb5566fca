"""Writers outside Spark during a live rescale: plain clients append unique ids from threads
through the one-key endpoint (raw HTTP, following 421 and 503 as the contract says), the batch endpoint
and the columnar endpoint (the Python client; tests/support/writers.py), while the set is rescaled 2 -> 3
(LiveRescale) and
back 3 -> 2 (``statehouse rescale --to 2``). No writer sees an error (refusals are retried on the new layout);
afterwards every acknowledged write is present exactly once, nothing is present twice or unsent, and
every key is stored only on its owner under the final layout. On both backends: the heap's move is
the same protocol over state that lives in memory.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from statehouse.client import StatehouseClient
from statehouse.client.rescale import LiveRescale
from tests.support.cli import cli
from tests.support.replica_set import ReplicaSet, misplaced
from tests.support.writers import Writers

pytestmark = [pytest.mark.http, pytest.mark.slow]  # 25-45 s per backend: three replica processes, two moves

JOB = "writers"
STATE = "appended"
MAX_PARALLELISM = 128
KEYS = [f"user-{i}" for i in range(120)]


@pytest.fixture(params=["rocksdb", "heap"])
def replicas(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[ReplicaSet]:
    storage = {"STATEHOUSE_CHECKPOINT_DIR": str(tmp_path / "checkpoints")}
    replica_set = ReplicaSet(tmp_path / "replicas", storage, backend=request.param)
    try:
        yield replica_set
    finally:
        replica_set.stop()


def test_every_acknowledged_write_is_present_exactly_once(replicas: ReplicaSet) -> None:
    seeds = replicas.start(2)
    new = replicas.add(2, 3, version=2)
    with StatehouseClient(seeds) as client:
        client.create_job(JOB, MAX_PARALLELISM).register(STATE, "list")

    with Writers(seeds, [*seeds, new.url], JOB, STATE, KEYS) as writers:
        writers.progress()
        with StatehouseClient(seeds) as client:
            LiveRescale(client, to=3, new_urls=[*seeds, new.url]).run()
        writers.progress()
        cli("rescale", "--to", "2", urls=seeds)  # the operator's way: statehouse rescale, live by default
        writers.progress()

    with StatehouseClient(seeds) as client:
        assert len(client.job(JOB).replicas) == 2
    writers.check(seeds)
    assert misplaced([*seeds, new.url], JOB, [STATE], MAX_PARALLELISM, count=2) == {STATE: []}
