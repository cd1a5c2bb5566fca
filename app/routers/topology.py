"""The replica's topology: its replica set, version, and the key-group range each job's data holds;
and the steps of a live rescale (docs/rescale.md), whose rules are ``backends/checkpointing/rescale.py``'s."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import Query
from pydantic import AfterValidator, BaseModel, Field
from starlette.concurrency import run_in_threadpool

from statehouse.app import openapi as doc
from statehouse.app.dependencies import GrantDep, Service, ServiceDep
from statehouse.app.models import KeyGroupRange
from statehouse.app.problems import ApiError
from statehouse.app.routing import admin_route, api_router
from statehouse.app.tokens import Grant
from statehouse.backends.checkpointing.decision import Decision
from statehouse.backends.checkpointing.rescale import RescaleParticipant
from statehouse.protocol import routes
from statehouse.protocol.urls import check_url

router = api_router(tags=["operations"])


class JobLayout(BaseModel):
    job: str
    max_parallelism: int
    key_group_range: KeyGroupRange = Field(description="inclusive key-group range [start, end] the job's data holds")
    serving: bool = Field(
        description="the range is the one this replica owns under its topology; false after an adopted rescale "
        "until the job is restored (its requests answer 409 layout_mismatch)"
    )


class MoveInfo(BaseModel):
    """A live rescale pending on this replica, as far as it got (``backends/topology.py``'s ``Move``)."""

    version: int = Field(description="the topology version the live rescale moves the set to")
    replica_count: int = Field(description="the replica count it moves the set to")
    from_count: int = Field(description="the replica count before the move (0 on a joining replica: it held nothing)")
    replica_urls: list[str] = Field(description="every replica's URL after the move, in index order, as prepared")
    phase: Literal["copying", "prepared", "loaded"] = Field(
        description="copying: a pre-copy, nothing frozen, changes in the moving-out key groups noted; prepared: "
        "moving-out key groups frozen (writes 503 rescale_in_progress); loaded: moving-in key groups loaded from the "
        "checkpoints, served once the move commits"
    )
    tracking: str | None = Field(
        default=None,
        description="the token of this replica's change tracking for a pre-copy (null: it notes nothing); the "
        "pre-copy's load names it",
    )
    joining: bool = Field(description="a new replica the move adds: it serves nothing until the commit")
    frozen_key_groups: dict[str, list[KeyGroupRange]] = Field(
        description="per job, the key groups this replica gives away (frozen until the move commits or aborts)"
    )
    checkpoints: dict[str, int] = Field(description="per job, the checkpoint the load read (after the load)")
    initiator: str = Field(description="who started the move: `operator`, or a query's coordinator (`query:<job>`)")


class TopologyInfo(BaseModel):
    """This replica's place in its replica set: the set's identity and topology version, this
    replica's index and the count, the key groups each job's data holds here, the replicas' URLs,
    and the live rescale pending here, if any."""

    set_id: str = Field(description="the replica set's identity (STATEHOUSE_REPLICA_SET_ID, or from checkpoint dir)")
    version: int = Field(
        description="1 at the data directory's first start; +1 at each adopted change of count or index, or the "
        "version a live rescale committed"
    )
    replica_index: int
    replica_count: int
    persisted: bool = Field(description="kept in the data directory (RocksDB backend); heap keeps it in memory")
    jobs: list[JobLayout] = Field(description="the jobs the bearer token may reach, by name")
    replica_urls: list[str] = Field(
        description="every replica's URL in index order (set by the last live rescale, else STATEHOUSE_REPLICA_URLS), "
        "so that a client given one seed URL learns the rest; empty when unset"
    )
    move: MoveInfo | None = Field(
        default=None, description="the live rescale pending on this replica (docs/api.md, Live rescale); null when none"
    )
    retired: bool = Field(
        default=False,
        description="a live rescale removed this replica: it owns no key group (every keyed request: 421)",
    )
    unassigned: bool = Field(
        default=False,
        description="a live rescale that was to add this replica was aborted: it holds nothing and is in no serving "
        "layout (not ready, skipped by clients) until a later move it joins commits; stop it, or keep it for that",
    )


# 422: any route refuses a query string that is not UTF-8 (app/routing.py).
@router.get(routes.TOPOLOGY, response_model=TopologyInfo, responses=doc.errors("invalid_argument"))
async def get_topology(service: ServiceDep, grant: GrantDep) -> TopologyInfo:
    """This replica's place in its replica set and the key-group range each job's data holds (docs/operations.md,
    "Topology"), and the live rescale pending here, if any."""
    return await run_in_threadpool(topology_info, service, grant)


def topology_info(service: Service, grant: Grant) -> TopologyInfo:
    """``GET /v1/topology``'s answer: this replica's place in its replica set, the key-group range
    of each job the grant may see, and the live rescale pending here, if any."""
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
    move = None
    if topology.move is not None:
        frozen = participant(service).frozen_key_groups()
        move = MoveInfo(
            version=topology.move.version,
            replica_count=topology.move.replica_count,
            from_count=topology.move.from_count,
            replica_urls=list(topology.move.replica_urls),
            phase=topology.move.phase,
            joining=topology.move.joining,
            frozen_key_groups={job: ranges for job, ranges in frozen.items() if grant.allows(job)},
            checkpoints={job: cid for job, cid in topology.move.checkpoints.items() if grant.allows(job)},
            initiator=topology.move.initiator,
            tracking=participant(service).tracking_token(topology.move.version),
        )
    return TopologyInfo(
        set_id=topology.set_id,
        version=topology.version,
        replica_index=topology.index,
        replica_count=topology.count,
        persisted=layout.persist,
        jobs=jobs,
        replica_urls=list(topology.replica_urls or service.settings.replica_url_list),
        move=move,
        retired=topology.retired,
        unassigned=topology.unassigned,
    )


# -- a live rescale: the coordinator's steps on this replica -------------------------------------------


def participant(service: Service) -> RescaleParticipant:
    assert service.rescale is not None  # the app always makes one
    return service.rescale


ADMIN_STEP = "a live rescale moves every job's state: its steps need an @admin token (STATEHOUSE_API_TOKENS)"


Version = Annotated[int, Field(ge=1, le=2**31 - 1, description="the topology version the move goes to (v+1)")]
Checkpoints = Annotated[
    dict[str, Annotated[int, Field(ge=1)]],
    Field(description="per job, the id of the global checkpoint taken after the prepare"),
]


def _replica_url(url: str) -> str:
    check_url(url)
    return url


class PrepareBody(BaseModel):
    """Step 1 of a live rescale on one replica: the move (version, count, URLs, who starts it), and
    whether it starts with a pre-copy (nothing frozen) or with the freeze."""

    version: Version
    replica_count: int = Field(ge=1, le=32768, description="M: the replica count after the move")
    replica_urls: list[Annotated[str, Field(max_length=2048), AfterValidator(_replica_url)]] = Field(
        default_factory=list,
        max_length=32768,
        description="every replica's URL after the move, in index order (`http(s)://host[:port]`)",
    )
    initiator: str = Field(
        default="operator",
        pattern=r"^[A-Za-z0-9_.:@/-]{1,128}$",
        description="who starts the move: `operator` (the CLI, a chart hook), or a query's coordinator "
        "(`query:<job>`); a coordinator recovering from a crash aborts only the moves it started",
    )
    precopy: bool = Field(
        default=False,
        description="record the move as `copying`, nothing frozen, and note what changes in the key groups this "
        "replica gives away (`move.tracking` names it); the same move prepared again without it freezes them and "
        "writes that delta for the new owners",
    )


class VersionBody(BaseModel):
    version: Version


class LoadBody(BaseModel):
    """Step 3 on one replica of the new layout: the move's checkpoint of every job, and for a
    pre-copy the old replicas' tokens its copy is taken under, or a catch-up over that copy."""

    version: Version
    checkpoints: Checkpoints
    precopy: dict[Annotated[int, Field(ge=0, le=32767)], Annotated[str, Field(pattern=r"^[0-9a-f]{1,64}$")]] | None = (
        Field(
            default=None,
            max_length=32768,
            description="a pre-copy's load (the move still `copying`): per old replica index, the `move.tracking` "
            "token its prepare answered before these checkpoints were triggered; the load at the cut then takes "
            "only what changed since from the old replicas whose delta was written under it",
        )
    )
    catch_up: bool = Field(
        default=False,
        description="a pre-copy's catch-up (the move still `copying`; `checkpoints` names the copy's, nothing is read "
        "from them): apply over the copy the catch-up rounds the old replicas wrote since the last",
    )


class RoundInfo(BaseModel):
    round: int = Field(description="the catch-up round written (0: the changes since the copy's tracking began)")
    keys: int = Field(description="the keys whose content it carries")


class CatchUpInfo(BaseModel):
    jobs: dict[str, RoundInfo] = Field(
        description="per job whose changes are tracked here; empty on a replica that gives nothing away"
    )


class DecideBody(BaseModel):
    """The durable decision of a live rescale: commit or abort the move to `version`, with what
    whoever resumes the move needs (the new count and URLs, the checkpoints it loaded)."""

    version: Version
    outcome: Literal["commit", "abort"]
    replica_count: int | None = Field(default=None, ge=1, le=32768)
    replica_urls: list[str] = Field(default_factory=list, max_length=32768)
    checkpoints: Checkpoints = Field(default_factory=dict)
    metadata: dict[str, Any] = Field(
        default_factory=dict,
        description="free-form JSON kept in the decision for whoever resumes the move (which micro-batch each job's "
        "state holds needs none: the move's checkpoint records it and the load carries it)",
    )
    from_count: int | None = Field(
        default=None,
        ge=1,
        le=32768,
        description="N: the replica count the move starts from (default: this replica's record of the move), kept "
        "so that a move whose old replicas all committed can still be resumed for a joining one",
    )


class JobLoad(BaseModel):
    key_groups: list[KeyGroupRange] = Field(description="the key groups loaded (what moves in to this replica)")
    entries: int = Field(description="records written into the live job")
    bytes_read: int = Field(description="bytes read from checkpoint storage (ranged reads of only those key groups)")
    delta_key_groups: list[KeyGroupRange] = Field(
        default_factory=list, description="of them, those brought up to the cut by a pre-copy's delta, not loaded whole"
    )
    delta_keys: int = Field(default=0, description="keys the deltas changed")
    bytes_seeded: int = Field(
        default=0,
        description="a pre-copy load: bytes uploaded now (a joining RocksDB replica's table files, a heap replica's "
        "base of the key groups it takes), which its first checkpoint on the new layout reuses instead of uploading "
        "them then",
    )


class LoadInfo(BaseModel):
    jobs: dict[str, JobLoad] = Field(description="per job; empty on a replica the move removes, or after the commit")


class DecisionInfo(BaseModel):
    set_id: str
    version: int
    outcome: Literal["commit", "abort"]
    replica_count: int | None
    replica_urls: list[str]
    checkpoints: dict[str, int]
    metadata: dict[str, Any]
    decided: float = Field(description="when, in Unix seconds")
    from_count: int | None = Field(
        default=None, description="the replica count the move started from (null: not recorded)"
    )


def decision_info(decision: Decision) -> DecisionInfo:
    data: dict[str, Any] = decision.to_json()
    data.pop("format")
    return DecisionInfo(**data)


STEP = ("forbidden", "rescale_conflict", "storage_unavailable")
LOAD = (*doc.CHECKPOINT_STORAGE, "invalid_name", "rescale_incomplete", "checkpoint_not_found", "restore_incomplete")


@router.post(
    routes.path(routes.TOPOLOGY_STEP, step="prepare"),
    response_model=TopologyInfo,
    responses=doc.errors(*STEP, "invalid_argument", "rescale_pending", "batch_in_flight", "rescale_decided"),
)
@admin_route(ADMIN_STEP)
async def prepare_rescale(service: ServiceDep, grant: GrantDep, body: PrepareBody) -> TopologyInfo:
    """Step 1 of a live rescale: record the move and freeze the key groups this replica gives away (writes there
    answer 503 `rescale_in_progress`; reads go on); a new, empty replica records that it joins. 409
    `batch_in_flight` (nothing frozen) while an uncommitted micro-batch staged writes there: retry."""
    await run_in_threadpool(
        participant(service).prepare, body.version, body.replica_count, body.replica_urls, body.initiator, body.precopy
    )
    return await run_in_threadpool(topology_info, service, grant)


@router.post(
    routes.path(routes.TOPOLOGY_STEP, step="catch-up"),
    response_model=CatchUpInfo,
    responses=doc.errors(*STEP),
)
@admin_route(ADMIN_STEP)
async def catch_up_rescale(service: ServiceDep, grant: GrantDep, body: VersionBody) -> CatchUpInfo:
    """A pre-copy's catch-up round (the move still `copying`, nothing frozen): write, per job, the current content of
    every key changed in the key groups this replica gives away since the last round, and begin the next, so
    that the cut carries only what changes after it; then `load` with `catch_up` on the new layout applies it.
    409 `rescale_conflict` past the copy."""
    written = await run_in_threadpool(participant(service).catch_up, body.version)
    return CatchUpInfo(jobs={job: RoundInfo(**info) for job, info in written.items()})


@router.post(
    routes.path(routes.TOPOLOGY_STEP, step="load"),
    response_model=LoadInfo,
    responses=doc.errors(*STEP, *LOAD),
)
@admin_route(ADMIN_STEP)
async def load_rescale(service: ServiceDep, grant: GrantDep, body: LoadBody) -> LoadInfo:
    """Step 3: load the key groups moving in to this replica from each job's checkpoint into the live job (not
    served until the commit); synchronous. Every job the replica has must be named (409 `rescale_incomplete`)."""
    loaded = await run_in_threadpool(
        participant(service).load, body.version, body.checkpoints, body.precopy, body.catch_up
    )
    service.metrics.rescale_bytes_loaded.inc(sum(job["bytes_read"] for job in loaded.values()))
    return LoadInfo(jobs={job: JobLoad(**info) for job, info in loaded.items()})


@router.post(
    routes.path(routes.TOPOLOGY_STEP, step="decide"),
    response_model=DecisionInfo,
    responses=doc.errors(*STEP, *doc.CHECKPOINT_STORAGE, "invalid_name", "rescale_decided", "rescale_incomplete"),
)
@admin_route(ADMIN_STEP)
async def decide_rescale(service: ServiceDep, grant: GrantDep, body: DecideBody) -> DecisionInfo:
    """Step 4, on any one replica: write the durable decision of the move (once; the same outcome again answers it,
    the other is 409 `rescale_decided`). Commit only after every replica that stays or joins answered its load:
    a commit names the move's completed checkpoint of every job this replica has (409 `rescale_incomplete`)."""
    decision = await run_in_threadpool(
        participant(service).decide,
        body.version,
        body.outcome,
        body.replica_count,
        body.replica_urls,
        body.checkpoints,
        body.metadata,
        body.from_count,
    )
    return decision_info(decision)


@router.get(routes.TOPOLOGY_DECISION, response_model=DecisionInfo, responses=doc.errors(*STEP, "not_found"))
@admin_route(ADMIN_STEP)
async def get_rescale_decision(
    service: ServiceDep, grant: GrantDep, version: Annotated[int, Query(ge=1, le=2**31 - 1)]
) -> DecisionInfo:
    """The durable decision of the live rescale to `version` (404 `not_found`: undecided)."""
    decision = await run_in_threadpool(participant(service).decision, version)
    if decision is None:
        raise ApiError("not_found", f"the live rescale to topology version {version} is undecided", version=version)
    return decision_info(decision)


@router.post(
    routes.path(routes.TOPOLOGY_STEP, step="commit"),
    response_model=TopologyInfo,
    responses=doc.errors(*STEP, "rescale_not_decided", "rescale_not_loaded"),
)
@admin_route(ADMIN_STEP)
async def commit_rescale(service: ServiceDep, grant: GrantDep, body: VersionBody) -> TopologyInfo:
    """Step 5, on every replica: serve the new layout (the decision must be commit; a replica that has not loaded
    answers 409 `rescale_not_loaded`: load it again). Key groups that moved away answer 421 from then on."""
    await run_in_threadpool(participant(service).commit, body.version)
    return await run_in_threadpool(topology_info, service, grant)


@router.post(
    routes.path(routes.TOPOLOGY_STEP, step="abort"),
    response_model=TopologyInfo,
    responses=doc.errors(*STEP, "rescale_decided"),
)
@admin_route(ADMIN_STEP)
async def abort_rescale(service: ServiceDep, grant: GrantDep, body: VersionBody) -> TopologyInfo:
    """Undo the move here (decides abort if undecided; 409 `rescale_decided` once commit was decided): loaded key
    groups cleared, writes taken again, the old layout served."""
    await run_in_threadpool(participant(service).abort, body.version)
    return await run_in_threadpool(topology_info, service, grant)
