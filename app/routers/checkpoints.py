"""Checkpoints, savepoints and restore (Flink's snapshotState / notifyCheckpointComplete /
notifyCheckpointAborted / initializeState), one replica's part of each."""

from __future__ import annotations

import logging
import os
from typing import Annotated, Any
from urllib.parse import urlparse

from fastapi import APIRouter, Path, Query
from starlette.concurrency import run_in_threadpool

from statehouse.app import openapi as doc
from statehouse.app.dependencies import NAME_PATTERN, JobDep, ServiceDep
from statehouse.app.models import CheckpointInfoModel, CheckpointPage, RestoreBody, RestoreInfoModel, TriggerBody
from statehouse.app.paging import decode_cursor, take_page
from statehouse.app.problems import ApiError

router = APIRouter(prefix="/v1", tags=["checkpoints"])
log = logging.getLogger(__name__)

CheckpointId = Annotated[int, Path(ge=1, description="checkpoint id")]


def _local_path(location: str) -> str | None:
    if "://" not in location:
        return location
    parsed = urlparse(location)
    return parsed.path if parsed.scheme == "file" else None


def check_location(checkpoint_dir: str, location: str) -> None:
    """A restore may read the local filesystem only inside the configured checkpoint storage
    (no path traversal); S3 locations are governed by the S3 credentials instead."""
    path = _local_path(location)
    if path is None:
        return
    root = _local_path(checkpoint_dir)
    inside = root is not None and os.path.commonpath(
        [os.path.realpath(root), os.path.realpath(path)]
    ) == os.path.realpath(root)
    if not inside:
        raise ApiError(
            "invalid_location",
            f"local restore locations must lie inside the checkpoint storage ({checkpoint_dir}); got {location!r}",
        )


def _checkpoint_cursor(cursor: str | None) -> int | None:
    """Checkpoint listings page by id: the cursor is the last id listed."""
    after = decode_cursor(cursor)
    if after is None:
        return None
    if not after.isdigit():
        raise ApiError("invalid_argument", "cursor is not valid: pass back a next_cursor unchanged")
    return int(after)


@router.post("/jobs/{job}/checkpoints", response_model=CheckpointInfoModel, status_code=202, responses=doc.TRIGGER)
async def trigger(service: ServiceDep, job: JobDep, body: TriggerBody | None = None) -> Any:
    """Take this replica's part of checkpoint (or savepoint) N: the short synchronous part runs now, the upload
    in the background (status `in_progress`, then `uploaded`). Writes continue meanwhile and are not in it."""
    body = body or TriggerBody()
    try:
        # The slow part of a RocksDB freeze (flushing memtables) runs off the event loop first.
        await run_in_threadpool(job.partition.flush)
    except Exception:  # only an optimization: e.g. the job was replaced by a restore meanwhile
        log.debug("pre-checkpoint flush of job %s failed", job.name, exc_info=True)
    return service.checkpoints.trigger(job.name, body.checkpoint_id, body.kind, body.metadata).to_dict()


@router.get("/jobs/{job}/checkpoints", response_model=CheckpointPage, responses=doc.LIST_CHECKPOINTS)
async def list_checkpoints(
    service: ServiceDep,
    job: Annotated[str, Path(pattern=NAME_PATTERN)],
    limit: Annotated[int, Query(ge=1, le=10_000)] = 100,
    cursor: str | None = None,
) -> Any:
    """This replica's checkpoints and savepoints of the job, oldest first (including completed ones in storage)."""
    after = _checkpoint_cursor(cursor)
    infos = (i for i in service.checkpoints.list(job) if after is None or i.checkpoint_id > after)
    page, next_cursor = take_page(infos, limit, lambda i: str(i.checkpoint_id).encode())
    return {
        "items": [i.to_dict() for i in page],
        "next_cursor": next_cursor,
        "next_checkpoint_id": service.checkpoints.next_checkpoint_id(job),
    }


@router.get("/jobs/{job}/checkpoints/{checkpoint_id}", response_model=CheckpointInfoModel, responses=doc.GET_CHECKPOINT)
async def get_checkpoint(
    service: ServiceDep, job: Annotated[str, Path(pattern=NAME_PATTERN)], checkpoint_id: CheckpointId
) -> Any:
    return service.checkpoints.get(job, checkpoint_id).to_dict()


@router.post(
    "/jobs/{job}/checkpoints/{checkpoint_id}/complete", response_model=CheckpointInfoModel, responses=doc.COMPLETE
)
async def complete(service: ServiceDep, job: JobDep, checkpoint_id: CheckpointId) -> Any:
    """notifyCheckpointComplete: waits for the upload if needed, writes this part's `_metadata` last, subsumes
    older checkpoints and applies retention."""
    info = await run_in_threadpool(service.checkpoints.complete, job.name, checkpoint_id)
    return info.to_dict()


@router.post("/jobs/{job}/checkpoints/{checkpoint_id}/abort", response_model=CheckpointInfoModel, responses=doc.ABORT)
async def abort(service: ServiceDep, job: JobDep, checkpoint_id: CheckpointId) -> Any:
    """notifyCheckpointAborted: discards this attempt's private files."""
    info = await run_in_threadpool(service.checkpoints.abort, job.name, checkpoint_id)
    return info.to_dict()


@router.post("/jobs/{job}/restore", response_model=RestoreInfoModel, responses=doc.RESTORE)
async def restore(
    service: ServiceDep, job: Annotated[str, Path(pattern=NAME_PATTERN)], body: RestoreBody | None = None
) -> Any:
    """Replace the job's state on this replica with its key groups of a completed checkpoint or savepoint
    (`{"checkpoint_id": N}`, `{"location": "..."}`, or the latest completed checkpoint). Parts written by
    any number of replicas are read (rescaling). The job answers 503 while it restores."""
    body = body or RestoreBody()
    if body.location is not None:
        check_location(service.settings.checkpoint_dir, body.location)
    with service.restoring(job):
        info = await run_in_threadpool(
            service.checkpoints.restore, job, body.checkpoint_id, body.location, body.operator_parallelism
        )
    return info.to_dict()
