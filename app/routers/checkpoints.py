"""Checkpoints, savepoints and restore (Flink's snapshotState / notifyCheckpointComplete /
notifyCheckpointAborted / initializeState), one replica's part of each."""

from __future__ import annotations

import asyncio
from typing import Annotated, Any, Literal

from fastapi import Body, Path, Query, Response
from pydantic import BeforeValidator
from starlette.concurrency import run_in_threadpool

from statehouse.app import openapi as doc
from statehouse.app.dependencies import GrantDep, JobDep, JobName, Service, ServiceDep, authorize_restore_location
from statehouse.app.models import (
    MAX_WAIT_MS,
    CheckpointInfoModel,
    CheckpointPage,
    RestoreBody,
    RestoreInfoModel,
    TriggerBody,
    canonical_index,
)
from statehouse.app.paging import PageDep
from statehouse.app.routing import api_router
from statehouse.backends.bounds import MAX_CHECKPOINT_ID
from statehouse.backends.checkpointing.info import CheckpointInfo
from statehouse.protocol import routes
from statehouse.protocol.errors import InvalidArgument

router = api_router(tags=["checkpoints"])

# The validator after the parameter: before it, FastAPI writes ge/le into the OpenAPI schema as
# they are instead of JSON Schema's minimum/maximum.
CheckpointId = Annotated[
    int, Path(ge=1, le=MAX_CHECKPOINT_ID, description="checkpoint id"), BeforeValidator(canonical_index)
]


@router.post(
    routes.CHECKPOINTS,
    response_model=CheckpointInfoModel,
    status_code=202,
    responses={200: {"model": CheckpointInfoModel}, **doc.TRIGGER},
)
async def trigger(
    service: ServiceDep,
    job: JobDep,
    response: Response,
    body: Annotated[TriggerBody, Body(default_factory=TriggerBody)],
) -> Any:
    """Take this replica's part of checkpoint (or savepoint) N: the short synchronous part runs now, the upload
    in the background (status `in_progress`, then `uploaded`). Writes continue meanwhile and are not in it. With
    `wait_ms`, answers once the upload has ended (200) or the wait is over (202); with `complete` (one replica
    only), completes the part once uploaded and answers 200 `completed`, or 202 `in_progress` if the upload
    outlasts the wait (complete it with `POST .../complete` once uploaded)."""
    if body.complete and service.catalog.replica_count != 1:
        raise InvalidArgument(
            f"complete: true completes this replica's part at once, but it is one of {service.catalog.replica_count} "
            "replicas: no part may complete before every part is uploaded; trigger on every replica, then complete"
        )
    # Off the event loop: a RocksDB freeze first flushes memtables (writes go on meanwhile).
    info = await run_in_threadpool(service.checkpoints.trigger, job.name, body.checkpoint_id, body.kind, body.metadata)
    if body.complete or body.wait_ms:
        # The upload waited for on the event loop (no thread held), then completed: complete waits
        # on (in a thread) for an upload longer than the wait, up to its own limit.
        info = await _waited(service, job.name, info.checkpoint_id, body.wait_ms or MAX_WAIT_MS)
    if body.complete and info.status != "in_progress":
        # An upload still running when the wait is over answers 202 like a plain trigger: completing
        # would wait on for it past what a caller's request waits (the coordinator then completes).
        info = await run_in_threadpool(service.checkpoints.complete, job.name, info.checkpoint_id)
    if info.status != "in_progress":
        response.status_code = 200
    return info


@router.get(routes.CHECKPOINTS, response_model=CheckpointPage, responses=doc.LIST_CHECKPOINTS)
async def list_checkpoints(
    service: ServiceDep,
    job: JobName,
    paging: PageDep,
    layouts: Annotated[
        Literal["this", "all"],
        Query(
            description="`all`: also the snapshots every replica of an earlier layout completed (before a live "
            "rescale), still in storage and restorable here; each described by its replica 0's part, whose "
            "`replica_count` says which layout wrote it"
        ),
    ] = "this",
) -> Any:
    """This replica's checkpoints and savepoints of the job, oldest first (including completed ones in storage),
    paged by id."""
    infos = await run_in_threadpool(service.checkpoints.list, job, paging.after_int(), every_layout=layouts == "all")
    page, next_cursor = paging.take(infos, lambda i: str(i.checkpoint_id).encode())
    return {
        "items": page,
        "next_cursor": next_cursor,
        "next_checkpoint_id": service.checkpoints.next_checkpoint_id(job),
    }


WaitMs = Annotated[
    int,
    Query(
        ge=0,
        le=MAX_WAIT_MS,
        description="while the upload is `in_progress`, answer when it ends or after this many milliseconds, "
        "whichever is first (a long poll: the coordinator learns of the end at once, without polling)",
    ),
    BeforeValidator(canonical_index),
]


@router.get(routes.CHECKPOINT, response_model=CheckpointInfoModel, responses=doc.GET_CHECKPOINT)
async def get_checkpoint(service: ServiceDep, job: JobName, checkpoint_id: CheckpointId, wait_ms: WaitMs = 0) -> Any:
    """This replica's part of checkpoint N; with `wait_ms`, once its upload has ended (or the wait is over)."""
    return await _waited(service, job, checkpoint_id, wait_ms)


async def _waited(service: Service, job: str, checkpoint_id: int, wait_ms: int) -> CheckpointInfo:
    """The checkpoint's info once its upload has ended, or after ``wait_ms``."""
    info = service.checkpoints.get(job, checkpoint_id)
    ended = service.checkpoints.ended(job, checkpoint_id) if info.status == "in_progress" and wait_ms else None
    if ended is not None:
        # Woken by the upload's end on the event loop, not waited for in a worker thread: waiting
        # requests then hold no thread, however many there are.
        await asyncio.wait([asyncio.wrap_future(ended)], timeout=wait_ms / 1000)
        info = service.checkpoints.get(job, checkpoint_id)
    return info


@router.post(routes.CHECKPOINT_COMPLETE, response_model=CheckpointInfoModel, responses=doc.COMPLETE)
async def complete(service: ServiceDep, job: JobDep, checkpoint_id: CheckpointId) -> Any:
    """notifyCheckpointComplete: waits for the upload if needed, writes this part's `_metadata` last, subsumes
    older checkpoints and applies retention."""
    info = await run_in_threadpool(service.checkpoints.complete, job.name, checkpoint_id)
    return info


@router.post(routes.CHECKPOINT_ABORT, response_model=CheckpointInfoModel, responses=doc.ABORT)
async def abort(service: ServiceDep, job: JobDep, checkpoint_id: CheckpointId) -> Any:
    """notifyCheckpointAborted: discards this attempt's private files."""
    info = await run_in_threadpool(service.checkpoints.abort, job.name, checkpoint_id)
    return info


@router.post(routes.RESTORE, response_model=RestoreInfoModel, responses=doc.RESTORE)
async def restore(
    service: ServiceDep, grant: GrantDep, job: JobName, body: Annotated[RestoreBody, Body(default_factory=RestoreBody)]
) -> Any:
    """Replace the job's state on this replica with its key groups of a completed checkpoint or savepoint
    (`{"checkpoint_id": N}`, `{"location": "..."}`, or the latest completed checkpoint). Parts written by
    any number of replicas are read (rescaling). The job answers 503 while it restores. A `location` lies in
    the checkpoint storage, under a job the token is scoped to, or (`@admin` tokens) under
    `STATEHOUSE_RESTORE_LOCATIONS`."""
    # Checked here, with the caller's grant; the normalized location is what the restore opens.
    location = None if body.location is None else authorize_restore_location(service, grant, body.location).url
    with service.restoring(job):
        info = await run_in_threadpool(
            service.checkpoints.restore, job, body.checkpoint_id, location, body.operator_parallelism
        )
    return info
