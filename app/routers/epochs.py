"""The epoch commit of task attempts: a micro-batch's staged writes become state here, once."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import Path
from pydantic import BeforeValidator

from statehouse.app import openapi as doc
from statehouse.app.dependencies import JobDep
from statehouse.app.models import EpochBody, EpochReportModel, canonical_index
from statehouse.app.routing import api_router
from statehouse.backends import attempts
from statehouse.backends.bounds import MAX_EPOCH
from statehouse.backends.staging import Winner
from statehouse.protocol import routes

router = api_router(tags=["epochs"])

Epoch = Annotated[
    int, Path(ge=0, le=MAX_EPOCH, description="the micro-batch's writer epoch"), BeforeValidator(canonical_index)
]


def _winners(body: EpochBody) -> list[Winner]:
    return Winner.parse([a.model_dump() for a in body.attempts])


@router.get(routes.EPOCH, response_model=EpochReportModel, responses=doc.JOB_ONLY)
async def describe_epoch(job: JobDep, epoch: Epoch) -> Any:
    """What this replica holds of an epoch: the task attempts staged under it (and their write counts), or
    whether it was committed."""
    return attempts.describe(job, epoch)


# prepare and commit are plain functions: FastAPI runs them off the event loop (a commit replays
# a whole micro-batch's writes).
@router.post(routes.EPOCH_PREPARE, response_model=EpochReportModel, responses=doc.EPOCH_COMMIT)
def prepare_epoch(job: JobDep, epoch: Epoch, body: EpochBody) -> Any:
    """Check that this replica holds exactly the staged writes of the winning attempts (one per partition,
    with the write counts their tasks reported) and seal the epoch: it takes no more writes. 409
    `attempt_lost` names what is missing (the replica restarted or was restored): abort and re-run the batch."""
    return attempts.prepare(job, epoch, _winners(body))


@router.post(routes.EPOCH_COMMIT, response_model=EpochReportModel, responses=doc.EPOCH_COMMIT)
def commit_epoch(job: JobDep, epoch: Epoch, body: EpochBody) -> Any:
    """Apply the winning attempts' staged writes atomically, in (partition, attempt) order, record the epoch as
    committed (with `batch_id`, the micro-batch it applies: the job's `committed_batch`) and drop everything else
    staged under it. Idempotent: a commit of the committed epoch does nothing again."""
    return attempts.commit(job, epoch, _winners(body), body.batch_id)


@router.post(routes.EPOCH_ABORT, response_model=EpochReportModel, responses=doc.JOB_ONLY)
async def abort_epoch(job: JobDep, epoch: Epoch) -> Any:
    """Drop what the epoch staged on this replica (the micro-batch failed and re-runs under a new epoch)."""
    return attempts.abort(job, epoch)
