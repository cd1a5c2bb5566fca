"""Fixtures for the client's tests, which also run where only the client wheel is installed.

Nothing here imports the server: ``tests/operations/test_packaging.py`` runs this folder in a venv that
has only ``statehouse-client`` (and pytest and httpx), pointing ``STATEHOUSE_TEST_REPLICAS`` at a
two-replica deployment it started; in the main suite the replicas are started here.
"""

import itertools
import os
from dataclasses import dataclass

import pytest

_job_numbers = itertools.count()


@dataclass
class Replica:
    url: str


@pytest.fixture(scope="session")
def two_replicas(tmp_path_factory):
    """Replicas 0 and 1 of a two-replica deployment sharing one checkpoint storage."""
    urls = os.environ.get("STATEHOUSE_TEST_REPLICAS")
    if urls:
        yield [Replica(url) for url in urls.split(",")]
        return
    from tests.support.server import start_two_replicas

    servers = start_two_replicas(tmp_path_factory)
    yield servers
    for server in servers:
        server.stop()


@pytest.fixture
def job_name():
    # A per-process prefix keeps names unique when two runs share one deployment.
    return f"client-{os.getpid()}-{next(_job_numbers)}"
