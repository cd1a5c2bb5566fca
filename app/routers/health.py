"""Probes and metrics (never behind auth)."""

from __future__ import annotations

from fastapi import Request, Response
from fastapi.responses import PlainTextResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from statehouse.app import openapi as doc
from statehouse.app.dependencies import service_of
from statehouse.app.models import Health, Readiness
from statehouse.app.problems import problem_response
from statehouse.app.routing import api_router
from statehouse.protocol import routes

router = api_router(tags=["operations"])


@router.get(routes.HEALTHZ, response_model=Health)
async def healthz() -> dict[str, str]:
    """Liveness: the process answers."""
    return {"status": "ok"}


@router.get(routes.READYZ, response_model=Readiness, responses=doc.READY)
async def readyz(request: Request) -> dict[str, object] | Response:
    """Readiness: state is open, the replica is not draining, its data volume takes writes
    (above `STATEHOUSE_DISK_RESERVE_BYTES`, no job waiting for space), and it owns key groups (not a
    replica joining a live rescale, nor one a rescale removed); else 503 `not_ready`."""
    service = getattr(request.app.state, "service", None)
    if service is None or service.draining:
        return problem_response(503, "not_ready", "starting up or shutting down", routes.READYZ)
    space_problem = service.catalog.store.space_problem()
    if space_problem is not None:
        return problem_response(503, "not_ready", space_problem, routes.READYZ)
    topology = service.catalog.layout.topology if service.catalog.layout is not None else None
    if topology is not None and (
        topology.retired or topology.unassigned or (topology.move is not None and topology.move.joining)
    ):
        if topology.retired:
            why = f"a live rescale removed this replica (replica {topology.index} of {topology.count}): it owns nothing"
        elif topology.unassigned:
            why = "unassigned: the live rescale that was to add this replica was aborted; it holds nothing (stop it)"
        else:
            why = "joining a live rescale: it serves once the move commits"
        return problem_response(503, "not_ready", why, routes.READYZ)
    index, count = (
        (topology.index, topology.count)
        if topology
        else (service.settings.replica_index, service.settings.replica_count)
    )
    return {"status": "ready", "backend": service.settings.backend, "replica_index": index, "replica_count": count}


@router.get(routes.METRICS, response_class=PlainTextResponse, responses=doc.READY)
async def metrics(request: Request) -> Response:
    """Prometheus text exposition."""
    return Response(generate_latest(service_of(request).metrics.registry), media_type=CONTENT_TYPE_LATEST)
