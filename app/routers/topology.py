"""The replica's topology: its replica set, version, and the key-group range each job's data holds."""

from __future__ import annotations

from pydantic import BaseModel, Field

from statehouse.app import openapi as doc
from statehouse.app.dependencies import GrantDep, ServiceDep
from statehouse.app.models import KeyGroupRange
from statehouse.app.routing import api_router

router = api_router(prefix="/v1", tags=["operations"])


class JobLayout(BaseModel):
    job: str
    max_parallelism: int
    key_group_range: KeyGroupRange = Field(description="inclusive key-group range [start, end] the job's data holds")
    serving: bool = Field(
        description="the range is the one this replica owns under its topology; false after an adopted rescale "
        "until the job is restored (its requests answer 409 layout_mismatch)"
    )


class TopologyInfo(BaseModel):
    set_id: str = Field(description="the replica set's identity (STATEHOUSE_REPLICA_SET_ID, or from checkpoint dir)")
    version: int = Field(
        description="1 at the data directory's first start; +1 at each adopted change of count or index"
    )
    replica_index: int
    replica_count: int
    persisted: bool = Field(description="kept in the data directory (RocksDB backend); heap keeps it in memory")
    jobs: list[JobLayout] = Field(description="the jobs the bearer token may reach, by name")
    replica_urls: list[str] = Field(
        description="every replica's URL in index order (STATEHOUSE_REPLICA_URLS), so that a client given one "
        "seed URL learns the rest; empty when unset"
    )


# 422: any route refuses a query string that is not UTF-8 (app/routing.py).
@router.get("/topology", response_model=TopologyInfo, responses=doc.errors("invalid_argument"))
async def get_topology(service: ServiceDep, grant: GrantDep) -> TopologyInfo:
    """This replica's place in its replica set and the key-group range each job's data holds (docs/operations.md,
    "Topology")."""
    layout = service.catalog.layout
    assert layout is not None  # the app always opens one
    topology = layout.topology
    jobs = [
        JobLayout(
            job=name,
            max_parallelism=record.max_parallelism,
            key_group_range=[record.start, record.end],
            serving=topology.mismatched(name) is None,
        )
        for name, record in sorted(topology.jobs.items())
        if grant.allows(name)
    ]
    return TopologyInfo(
        set_id=topology.set_id,
        version=topology.version,
        replica_index=topology.index,
        replica_count=topology.count,
        persisted=layout.persist,
        jobs=jobs,
        replica_urls=list(service.settings.replica_url_list),
    )
