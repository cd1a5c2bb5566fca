"""Shared concerns as FastAPI dependencies: the service, the job lookup, bearer-token auth and scopes."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Annotated

from fastapi import Depends, Path, Request
from starlette.types import Scope

from statehouse.app.metrics import Metrics
from statehouse.app.problems import ApiError
from statehouse.app.settings import Settings
from statehouse.app.tokens import OPEN, Grant, digest, grant_of
from statehouse.backends.catalog import JobCatalog
from statehouse.backends.checkpointing.manager import CheckpointManager
from statehouse.backends.checkpointing.rescale import RescaleParticipant
from statehouse.backends.job import Job
from statehouse.snapshots.storage.locations import Resolved
from statehouse.snapshots.stored.names import NAME_PATTERN

JobName = Annotated[str, Path(description="job name", pattern=NAME_PATTERN)]  # where the job may not exist


@dataclass
class Service:
    """Everything one replica process holds; lives on ``app.state.service``."""

    settings: Settings
    catalog: JobCatalog
    checkpoints: CheckpointManager
    metrics: Metrics
    rescale: RescaleParticipant | None = None  # this replica's side of a live rescale (None only in tests)
    draining: bool = False
    restoring_jobs: set[str] = field(default_factory=set)
    # (SHA-256 of a token, its grant) for every configured token: compared in constant time
    token_digests: list[tuple[bytes, Grant]] = field(init=False)

    def __post_init__(self) -> None:
        self.token_digests = [(digest(t.encode("ascii")), g) for t, g in self.settings.grants.items()]

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

    def check_batch_size(self, count: int, what: str) -> None:
        """A batch's operations or a columnar request's rows: at most STATEHOUSE_MAX_BATCH_OPS."""
        limit = self.settings.max_batch_ops
        if count > limit:
            raise ApiError(
                "batch_too_large",
                f"{count} {what} exceed the limit of {limit} (STATEHOUSE_MAX_BATCH_OPS); split the batch",
            )


def service_of(request: Request) -> Service:
    return service_in(request.scope)


def service_in(scope: Scope) -> Service:
    """The service of the app a request (its ASGI ``scope``) reached: 503 while it starts."""
    service = getattr(scope["app"].state, "service", None)
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


UNAUTHORIZED = "missing or invalid bearer token: send 'Authorization: Bearer <token>'"


def _presented_token(scope: Scope) -> bytes | None:
    """The bearer token of the request as raw bytes (headers are bytes; any byte may arrive)."""
    for name, value in scope.get("headers", ()):
        if name == b"authorization":
            scheme, _, token = value.partition(b" ")
            return token.strip() if scheme.lower() == b"bearer" else None
    return None


def authenticate(scope: Scope, job: str | None) -> Grant:
    """The grant of the request's bearer token (``OPEN`` when auth is off), else 401
    ``unauthorized``; 403 ``forbidden`` when ``job`` is given and the token is not scoped to it.
    Called by ``app/intake.py`` before the body is received, for every path under ``/v1``."""
    service = service_in(scope)
    if not service.token_digests:  # auth off (not settings.grants: a pydantic private attribute, slower)
        return OPEN
    token = _presented_token(scope)
    found = grant_of(token, service.token_digests) if token else None
    if found is None:
        raise ApiError("unauthorized", UNAUTHORIZED)
    if job is not None and not found.allows(job):
        raise forbidden_job(job)
    return found


def forbidden_job(job: str) -> ApiError:
    return ApiError(
        "forbidden",
        f"this bearer token is not scoped to job {job!r}: use a token whose scopes name the job (or '*')",
    )


GRANT = "statehouse.grant"  # the scope key under which app/intake.py leaves the request's grant


async def require_token(request: Request) -> Grant:
    """Every /v1 route depends on this (``app/main.py``): the grant that ``app/intake.py`` found
    for the request before its body was received. When ``STATEHOUSE_API_TOKENS`` or
    ``STATEHOUSE_API_TOKENS_FILE`` configure tokens, the call needs ``Authorization: Bearer <token>``
    (401 ``unauthorized``), and a route under ``/v1/jobs/{job}`` a token scoped to that job (403
    ``forbidden``, before anything is looked up, so a refusal tells nothing about the job). Routes
    that need the grant itself (the job listing, restore) declare ``GrantDep``."""
    return request.scope[GRANT]


GrantDep = Annotated[Grant, Depends(require_token)]


def authorize_restore_location(service: Service, grant: Grant, location: str) -> Resolved:
    """May this token restore from ``location``? Inside the checkpoint storage: when it is scoped
    to the job whose directory holds the snapshot (a job-scoped token cannot read another job's
    state by restoring it). Under ``STATEHOUSE_RESTORE_LOCATIONS``: ``@admin`` tokens only (anyone
    when auth is off). Anywhere else: nobody (400 ``invalid_location``)."""
    resolved = service.checkpoints.locations.resolve(location)
    if resolved.job is None:
        if not grant.admin:
            raise ApiError(
                "forbidden",
                f"restoring from outside the checkpoint storage ({service.checkpoints.storage.location}) needs an "
                "@admin token: restore a checkpoint or savepoint of the job instead, or ask an operator",
            )
    elif not grant.allows(resolved.job):  # "" (the storage root) only for tokens of every job
        owner = f"job {resolved.job!r}" if resolved.job else "the checkpoint storage root"
        raise ApiError(
            "forbidden",
            f"this bearer token may not read {owner}'s snapshots: restore from a location under a job it is scoped to",
        )
    return resolved
