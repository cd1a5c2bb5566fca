"""The ASGI application: ``uvicorn statehouse.app.main:app``."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import os
import sys
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import Any

import pyarrow as pa
from fastapi import Depends, FastAPI
from starlette.types import ASGIApp, Receive, Scope, Send

from statehouse.app import access_log, openapi, problems
from statehouse.app.data_plane import DataPlane, FastPath, FastRoutes
from statehouse.app.dependencies import Service, require_token
from statehouse.app.intake import Admission, Intake
from statehouse.app.metrics import Metrics, MetricsMiddleware
from statehouse.app.routers import (
    batch,
    checkpoints,
    columns,
    docs,
    epochs,
    health,
    jobs,
    keyed,
    operators,
    raw,
    scan,
    timers,
    topology,
)
from statehouse.app.routing import data_plane_paths
from statehouse.app.settings import Settings, exit_at_start, load_settings
from statehouse.backends.base.store import Store
from statehouse.backends.catalog import JobCatalog
from statehouse.backends.checkpointing.manager import CheckpointManager
from statehouse.backends.checkpointing.rescale import RescaleParticipant
from statehouse.backends.checkpointing.restore import STAGING_PREFIX, remove_leftovers
from statehouse.backends.errors import StateError
from statehouse.backends.heap import HeapStore
from statehouse.backends.heap.materialize import SCRATCH_PREFIX
from statehouse.backends.limits import Limits
from statehouse.backends.rocksdb import RocksDBStore, TableFiles
from statehouse.backends.topology import DataDirLock, ReplicaLayout, TopologyError
from statehouse.snapshots.storage import open_storage

log = logging.getLogger("statehouse")
# How often the data volume's free space is read (a statvfs) for /readyz and out-of-space recovery.
DISK_CHECK_INTERVAL_S = 1.0

DESCRIPTION = """Apache Flink's state-backend model over HTTP: keyed state (value, list, map, reducing,
aggregating) with namespaces and TTL, operator state, key groups and replicas. Errors are RFC 9457
problem+json with a stable `code`."""


def open_store(settings: Settings) -> Store:
    """The replica's store of the configured backend, with its settings."""
    if settings.backend == "rocksdb":
        return RocksDBStore(
            settings.data_dir,
            incremental_checkpoints=settings.incremental_checkpoints,
            compact_moving=settings.rescale_compact_moving,
            max_open=settings.max_open_jobs,
            disk_reserve_bytes=settings.disk_reserve_bytes,
            block_cache_bytes=settings.rocksdb_block_cache_bytes,
            row_cache_bytes=settings.rocksdb_row_cache_bytes,
            files=TableFiles(
                settings.rocksdb_target_file_bytes, settings.rocksdb_level_base_bytes, settings.rocksdb_compression
            ),
        )
    return HeapStore(
        incremental_checkpoints=settings.incremental_checkpoints,
        delta_weight=settings.heap_changelog_delta_weight,
        background_bases=settings.heap_background_bases,
    )


def open_layout(settings: Settings) -> ReplicaLayout:
    """The data directory's topology, checked against the settings (docs/operations.md, "Topology").

    The heap backend keeps it in memory only: none of its jobs outlives the process, so there is
    nothing a restart with another replica count could re-slice.
    """
    # Unset, the set is named after the checkpoint storage its replicas share (they must, to
    # rescale), so replicas started alike agree on it without being told.
    storage = settings.checkpoint_dir if "://" in settings.checkpoint_dir else os.path.abspath(settings.checkpoint_dir)
    return ReplicaLayout.open(
        settings.data_dir,
        count=settings.replica_count,
        index=settings.replica_index,
        set_id=settings.replica_set_id,
        adopt=settings.adopt_topology,
        persist=settings.backend == "rocksdb",
        default_set_id=str(uuid.uuid5(uuid.NAMESPACE_URL, storage)),
        version=settings.topology_version,
    )


def open_catalog(settings: Settings, layout: ReplicaLayout | None = None) -> JobCatalog:
    """The replica's job catalog over the configured backend's store, with the limits the settings
    set, for the replica set's place ``layout`` records (the settings' own when there is none)."""
    # The recorded layout, not the settings: after a live rescale they may still name the one before.
    count, index = (
        (layout.topology.count, layout.topology.index) if layout else (settings.replica_count, settings.replica_index)
    )
    return JobCatalog(
        open_store(settings),
        replica_index=index,
        replica_count=count,
        layout=layout,
        limits=Limits(
            max_key_bytes=settings.max_key_bytes,
            max_value_bytes=settings.max_value_bytes,
            max_staged_bytes=settings.max_staged_bytes,
            max_staged_attempts=settings.max_staged_attempts,
            max_jobs=settings.max_jobs,
            max_states_per_job=settings.max_states_per_job,
            max_map_read_entries=settings.max_map_read_entries,
            max_list_bytes=settings.max_list_bytes,
            max_raw_stream_bytes=settings.max_raw_stream_bytes,
            max_answer_bytes=settings.max_answer_bytes,
        ),
    )


def restore_work_dir(settings: Settings) -> str:
    """Restores stage downloaded snapshots beside the state (the data volume), not in /tmp, and a
    heap's forked base writers write there; what a process killed mid-way left is removed
    (nothing runs yet).

    "$" cannot occur in a job name, so no job's directory can collide with it.
    """
    path = os.path.join(settings.data_dir, "$restore")
    os.makedirs(path, exist_ok=True)
    removed = remove_leftovers(path, (STAGING_PREFIX, SCRATCH_PREFIX))
    if removed:
        log.warning(
            "removed %d staging copies (restores', base writers') a killed process left in %s", len(removed), path
        )
    return path


@contextmanager
def exit_on_start_error(setting: str) -> Iterator[None]:
    """A storage or data-directory problem at start ends the process as a bad setting does:
    one line naming the setting, exit status 2 (docs/operations.md).

    Raised out of the lifespan it would be uvicorn's 60-line traceback and exit 3, and uvicorn
    catches SystemExit there too; hence os._exit. Nothing is open yet that needs closing.
    """
    try:
        yield
    except (StateError, TopologyError, OSError) as exc:
        if isinstance(exc, StateError | TopologyError):
            detail = exc.detail
        else:
            detail = f"{exc.strerror or exc}" + (f": {exc.filename}" if exc.filename else "")
        exit_at_start([f"{setting}: {detail}"], exit=os._exit)


async def watch_space(store: Store) -> None:
    """Read the data volume's free space every DISK_CHECK_INTERVAL_S: /readyz reports what it
    found, and jobs that ran out of space are reopened for writing once there is room again."""
    while True:
        await asyncio.sleep(DISK_CHECK_INTERVAL_S)
        try:
            await asyncio.to_thread(store.check_space)
        except Exception:  # e.g. a job's reopen failed for another reason: tried again next time
            log.exception("checking the data volume's free space failed")


class StatehouseAPI(FastAPI):
    """FastAPI, entered for HTTP requests at the app's own outermost layer (``MetricsMiddleware``:
    metrics and 500s), below the layers FastAPI and Starlette put around it, which do nothing here
    and cost every request (~25-60 µs of a one-row columnar request's, in process): an
    OpenTelemetry check that reads three environment variables (we configure no telemetry),
    Starlette's 500 handler (``MetricsMiddleware`` answers faults itself, see ``server_errors``),
    an exception-telemetry and a body-limit layer (no ``max_body_size``: ``app/intake.py`` bounds
    bodies). Lifespan events go through the whole stack, as FastAPI builds it. It also serves
    ``openapi.document`` as its OpenAPI document, and offers its data-plane routes to the server's
    protocol beside ASGI (:attr:`data_plane`)."""

    _entry: ASGIApp | None = None
    # The data-plane routes' entry for the server's own protocol (``app/serve.py``), beside ASGI.
    data_plane: DataPlane | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        entry = self._entry
        if entry is None or scope["type"] != "http":
            await super().__call__(scope, receive, send)
            return
        scope["app"] = self  # as Starlette sets it: request.app, the service
        await entry(scope, receive, send)

    def build_middleware_stack(self) -> ASGIApp:
        stack = super().build_middleware_stack()
        layer: Any = stack
        while layer is not None and not isinstance(layer, MetricsMiddleware):
            layer = getattr(layer, "app", None)
        self._entry = layer if not self.root_path else None  # a root path: FastAPI sets it per request
        return stack

    def openapi(self) -> dict[str, Any]:
        """The app's OpenAPI document, ``openapi.document``'s (built once, on first use)."""
        if self.openapi_schema is None:
            self.openapi_schema = openapi.document(self)
        return self.openapi_schema


def create_app(settings: Settings | None = None) -> FastAPI:
    """The Statehouse ASGI application: its routers and middleware, and a lifespan that opens the
    checkpoint storage, locks the data directory, opens the catalog, the checkpoint manager and the
    live-rescale participant (resuming a pending move) at start, and drains and closes them at shutdown."""
    settings = settings or load_settings()  # a bad STATEHOUSE_* variable: one line each, exit 2
    metrics = Metrics()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        # Checkpoint uploads run in Python threads: hand the GIL back to the event loop
        # every millisecond instead of every five, so requests wait less behind an upload.
        sys.setswitchinterval(0.001)
        with exit_on_start_error(f"STATEHOUSE_CHECKPOINT_DIR={settings.checkpoint_dir!r}"):
            storage = open_storage(
                settings.checkpoint_dir,
                s3_endpoint_url=settings.s3_endpoint_url,
                s3_abandoned_upload_age_s=settings.s3_abandoned_upload_age_s,
                s3_timeouts=settings.s3_timeouts,
                transfer_threads=settings.checkpoint_transfer_threads,
            )
        with exit_on_start_error(f"STATEHOUSE_DATA_DIR={settings.data_dir!r}"):
            # First: nothing in the directory is touched (leftovers removed, files opened) while
            # another process may be using it. Held until the process exits.
            dir_lock = DataDirLock(settings.data_dir)
            layout = open_layout(settings)
            catalog = open_catalog(settings, layout)
            work_dir = restore_work_dir(settings)
        metrics.watch(catalog)
        checkpoints = CheckpointManager(
            catalog,
            storage,
            num_retained=settings.num_retained,
            compression=settings.snapshot_compression,
            s3_endpoint_url=settings.s3_endpoint_url,
            work_dir=work_dir,
            restore_locations=settings.restore_location_list,
            s3_timeouts=settings.s3_timeouts,
        )
        rescale = RescaleParticipant(
            catalog,
            checkpoints,
            work_dir=work_dir,
            on_committed=metrics.rescale_duration.observe,
            batch_lease_s=settings.batch_lease_s,
            reclaim_delay_s=settings.rescale_reclaim_delay_s,
        )
        with exit_on_start_error("the live rescale pending in STATEHOUSE_DATA_DIR"):
            # A move in the record: committed, undone or kept frozen as its durable decision says.
            await asyncio.to_thread(rescale.resume_at_start)
        app.state.service = Service(
            settings=settings, catalog=catalog, checkpoints=checkpoints, metrics=metrics, rescale=rescale
        )
        log.info(
            "statehouse replica %d/%d (topology version %d), backend %s, data in %s",
            layout.topology.index,
            layout.topology.count,
            layout.topology.version,
            settings.backend,
            settings.data_dir,
        )
        # pyarrow loads its pandas shim (pandas, when installed: 0.2-0.3 s) on its first
        # `take`: here, not in the first columnar request.
        pa.array([0]).take([0])
        # What startup built lives as long as the process: keep it out of the cyclic GC's full
        # collections, which otherwise stall every request, /healthz too, for 25-50 ms each.
        gc.collect()
        gc.freeze()
        space = asyncio.create_task(watch_space(catalog.store))
        try:
            yield
        finally:
            # Uvicorn has stopped taking requests and finished in-flight ones; let running
            # checkpoint uploads finish, then close RocksDB cleanly.
            app.state.service.draining = True
            space.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await space
            await asyncio.to_thread(rescale.close)
            checkpoints.close()
            catalog.close()
            dir_lock.release()

    # /docs and /redoc come from routers/docs.py: the same pages with bundled assets, no CDN.
    app = StatehouseAPI(
        title="Statehouse", version="1", description=DESCRIPTION, lifespan=lifespan, docs_url=None, redoc_url=None
    )
    problems.install(app)
    access_log.configure(settings.access_log)

    v1 = [Depends(require_token)]
    # Routes match in order: the executors' hot endpoints first, so they skip the other routes' tests.
    for router in (columns.router, batch.router):
        app.include_router(router, dependencies=v1)
    app.include_router(health.router)
    app.include_router(docs.router)
    app.mount(docs.STATIC_URL, docs.static_files(), name="docs-static")
    for router in (
        jobs.router,
        keyed.router,
        scan.router,
        timers.router,
        operators.router,
        raw.router,
        epochs.router,
        checkpoints.router,
        topology.router,
    ):
        app.include_router(router, dependencies=v1)
    # Outermost last: metrics see every response and answer unexpected faults (500s). The data
    # plane's fast path is innermost: inside the intake (token, content type and size, checked
    # before the body is received), metrics and 500s.
    access_log.data_plane_routes(data_plane_paths(app.routes))
    admission = Admission(app.routes, settings.max_body_bytes)
    fast = FastRoutes([*columns.FAST_ROUTES, *batch.FAST_ROUTES, *timers.FAST_ROUTES])
    app.add_middleware(FastPath, routes=fast)
    app.add_middleware(Intake, admission=admission)
    app.data_plane = DataPlane(app, admission, metrics, fast)
    app.add_middleware(MetricsMiddleware, metrics=metrics)
    return app


app = create_app()
