"""Fixtures shared by the Spark tests' files."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.server import ServerProcess, start_replica_set


@pytest.fixture(scope="module")
def replicas(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[str]]:
    """Two RocksDB replicas sharing one checkpoint storage, keeping every checkpoint (so the test
    sees each batch's), for every case: each case has a job of its own (checkpoints, epochs,
    attempts and retention are per job), and two server starts per case cost ~10% of the file."""
    shared = str(tmp_path_factory.mktemp("checkpoints"))
    env = {"STATEHOUSE_CHECKPOINT_DIR": shared, "STATEHOUSE_NUM_RETAINED": "20"}
    workdirs = [tmp_path_factory.mktemp(f"replica-{i}") for i in range(2)]
    servers: list[ServerProcess] = []
    try:
        servers = start_replica_set(workdirs, env)
        yield [s.url for s in servers]
    finally:
        for server in servers:
            server.stop()
