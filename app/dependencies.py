"""Shared concerns as FastAPI dependencies: the service, the job lookup, bearer-token auth."""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Annotated

from fastapi import Depends, Path, Request

from statehouse.app.metrics import Metrics
from statehouse.app.problems import ApiError
from statehouse.app.settings import Settings
from statehouse.backends.catalog import JobCatalog
from statehouse.backends.job import Job
from statehouse.backends.names import NAME_PATTERN
from statehouse.snapshots.manager import CheckpointManager

JobName = Annotated[str, Path(description="job name", pattern=NAME_PATTERN)]  # where the job may not exist


@dataclass
class Service:
    """Everything one replica process holds; lives on ``app.state.service``."""

    settings: Settings
    catalog: JobCatalog
    checkpoints: CheckpointManager
    metrics: Metrics
    draining: bool = False
    restoring_jobs: set[str] = field(default_factory=set)

    @contextmanager
    def restoring(self, job: str) -> Iterator[None]:
        """While a job restores, its other requests are answered 503 (retry)."""
        if job in self.restoring_jobs:
            raise ApiError("not_ready", f"job {job!r} is being restored already")
        self.restoring_jobs.add(job)
        try:
            yield
        finally:
            self.restoring_jobs.discard(job)

    def check_available(self, job: str) -> None:
        if job in self.restoring_jobs:
            raise ApiError("not_ready", f"job {job!r} is being restored; retry shortly")


def service_of(request: Request) -> Service:
    service = getattr(request.app.state, "service", None)
    if service is None:
        raise ApiError("not_ready", "the service is starting; retry shortly")
    return service


# Dependencies are ``async def``: FastAPI runs plain ``def`` dependencies in a thread pool,
# a thread hand-off per dependency per request.
async def get_service(request: Request) -> Service:
    return service_of(request)


ServiceDep = Annotated[Service, Depends(get_service)]


async def get_job(service: ServiceDep, job: Annotated[str, Path(description="job name")]) -> Job:
    service.check_available(job)
    return service.catalog.get(job)


JobDep = Annotated[Job, Depends(get_job)]


async def require_token(request: Request) -> None:
    """When ``STATEHOUSE_API_TOKENS`` is set, every /v1 call needs ``Authorization: Bearer <token>``."""
    tokens = service_of(request).settings.tokens
    if not tokens:
        return
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not any(secrets.compare_digest(token.strip(), t) for t in tokens):
        raise ApiError("unauthorized", "missing or invalid bearer token: send 'Authorization: Bearer <token>'")
