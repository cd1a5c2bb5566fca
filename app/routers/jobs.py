"""Jobs and their keyed state descriptors."""

from __future__ import annotations

from typing import Annotated

from fastapi import Body, Path, Response
from starlette.concurrency import run_in_threadpool

from statehouse.app import openapi as doc
from statehouse.app.dependencies import NAME_PATTERN, GrantDep, JobDep, ServiceDep
from statehouse.app.models import (
    DescriptorBody,
    DescriptorInfo,
    DescriptorPage,
    FenceBody,
    FenceResponse,
    JobBody,
    JobInfo,
    JobPage,
)
from statehouse.app.offload import dispatch
from statehouse.app.paging import PageDep
from statehouse.app.routing import api_router
from statehouse.protocol import routes

router = api_router(tags=["jobs"])

StateName = Annotated[str, Path(description="state name", pattern=NAME_PATTERN)]


@router.put(routes.JOB, response_model=JobInfo, status_code=200, responses={201: {"model": JobInfo}, **doc.PUT_JOB})
async def put_job(
    service: ServiceDep,
    response: Response,
    job: Annotated[str, Path(description="job name")],
    body: Annotated[JobBody, Body(default_factory=JobBody)],
) -> JobInfo:
    """Create a job, or confirm one exists; a different `max_parallelism` for an existing job is refused (409)."""
    service.check_available(job)
    # Off the event loop, as every change of what a replica holds: opening (or deleting) a RocksDB
    # instance or a column family takes milliseconds, and waits for the job's running snapshot.
    created_job, created = await run_in_threadpool(service.catalog.create, job, body.max_parallelism)
    if created:
        response.status_code = 201
    return JobInfo.of(created_job)


@router.get(routes.JOBS, response_model=JobPage, responses=doc.LIST_JOBS)
async def list_jobs(service: ServiceDep, grant: GrantDep, paging: PageDep) -> JobPage:
    """The jobs on this replica that the bearer token is scoped to (all of them when auth is off)."""
    after = paging.after
    names = (n for n in service.catalog.names() if (after is None or n.encode() > after) and grant.allows(n))
    page, next_cursor = paging.take(names, str.encode)
    # Jobs refused for their layout (layout_mismatch) are listed too: they are on this replica. Off the
    # event loop: a page may open many jobs (each a RocksDB instance), and other requests go on meanwhile.
    items = await run_in_threadpool(lambda: [JobInfo.of(service.catalog.get(n, serving=False)) for n in page])
    return JobPage(items=items, next_cursor=next_cursor)


@router.get(routes.JOB, response_model=JobInfo, responses=doc.JOB_ONLY)
async def get_job(job: JobDep) -> JobInfo:
    return JobInfo.of(job)


@router.delete(routes.JOB, status_code=204, responses=doc.JOB_ONLY)
async def delete_job(service: ServiceDep, job: Annotated[str, Path(description="job name")]) -> Response:
    """Delete a job and all its local state (checkpoints in storage are kept); also a job refused for its
    layout (`layout_mismatch`)."""
    service.check_available(job)
    await run_in_threadpool(service.catalog.delete, job)
    return Response(status_code=204)


@router.post(routes.FENCE, response_model=FenceResponse, responses=doc.FENCE)
async def fence(job: JobDep, body: FenceBody) -> FenceResponse:
    """Raise the job's writer epoch (never lowers it); with `next`, to at least one past the current one. Batches
    that carry an older epoch are then refused, so a stale attempt of a Spark micro-batch cannot overwrite a newer
    one. With `begins_batch` (a coordinator beginning a micro-batch), a live rescale does not prepare on this replica
    until the epoch is committed or aborted. Answers the epoch now in force, the last committed one and the micro-batch
    it applied, and the version of a live rescale pending here."""

    def fenced() -> FenceResponse:
        with job.exclusive():  # the epoch read and raised at once, the rest read as of then
            epoch = job.fence(
                max(body.epoch, job.epoch + 1) if body.next else body.epoch, opens_batch=body.begins_batch
            )
            return FenceResponse(
                epoch=epoch,
                committed_epoch=job.committed_epoch,
                committed_batch=job.committed_batch,
                rescale_version=job.keyspace.frozen_version or None,
                topology_version=job.keyspace.layout_version,
            )

    return await dispatch(job, fenced)


@router.put(
    routes.STATE,
    response_model=DescriptorInfo,
    responses={201: {"model": DescriptorInfo}, **doc.PUT_STATE},
)
async def put_state(job: JobDep, state: StateName, body: DescriptorBody, response: Response) -> DescriptorInfo:
    """Register a keyed state. Registering again with a compatible descriptor is a no-op (or updates the TTL);
    an incompatible one (other kind, key type, function, TTL on/off) is refused with 409."""
    if await run_in_threadpool(job.register_state, body.to_descriptor(state)):
        response.status_code = 201
    return DescriptorInfo(**job.descriptor(state).to_dict())


@router.get(routes.STATES, response_model=DescriptorPage, responses=doc.LIST_STATES)
async def list_states(job: JobDep, paging: PageDep) -> DescriptorPage:
    after = paging.after
    names = (n for n in sorted(job.descriptors) if after is None or n.encode() > after)
    page, next_cursor = paging.take(names, str.encode)
    return DescriptorPage(items=[DescriptorInfo(**job.descriptor(n).to_dict()) for n in page], next_cursor=next_cursor)


@router.get(routes.STATE, response_model=DescriptorInfo, responses=doc.STATE)
async def get_state(job: JobDep, state: str) -> DescriptorInfo:
    return DescriptorInfo(**job.descriptor(state).to_dict())


@router.delete(routes.STATE, status_code=204, responses=doc.DROP_STATE)
async def delete_state(job: JobDep, state: str) -> Response:
    """Drop a state and all its data."""
    await run_in_threadpool(job.drop_state, state)
    return Response(status_code=204)
