"""Request and response models at the edge (they document the API in /docs)."""

from __future__ import annotations

import dataclasses
import difflib
from types import GenericAlias
from typing import Annotated, Any, Literal, get_type_hints

import orjson
from pydantic import BaseModel, ConfigDict, Field, JsonValue, create_model, field_validator, model_validator
from pydantic.json_schema import SkipJsonSchema
from pydantic_core import PydanticCustomError

from statehouse.backends.attempts import EpochReport
from statehouse.backends.bounds import MAX_CHECKPOINT_ID, MAX_EPOCH, MAX_PARTITION, MAX_SEQ
from statehouse.backends.checkpointing.info import CheckpointInfo, RestoreInfo
from statehouse.backends.job import Job
from statehouse.backends.redistribution import MAX_SUBTASKS
from statehouse.backends.timers import TimeDomain
from statehouse.protocol.attempts import ATTEMPT_PATTERN, UNIT_PATTERN
from statehouse.protocol.keygroups import INT64_MAX, INT64_MIN, KeyType
from statehouse.protocol.ops import RawOpName, StateKind, StateOpName, TimerOpName
from statehouse.snapshots.stored.codec import parse_decimal
from statehouse.snapshots.stored.descriptors import StateDescriptor
from statehouse.snapshots.stored.names import NAME_PATTERN
from statehouse.snapshots.stored.ttl import TtlConfig, UpdateType, Visibility
from statehouse.snapshots.stored.value_types import ValueType

Name = Field(pattern=NAME_PATTERN)

# An array of two ints, not a tuple: a tuple's JSON schema (prefixItems) defeats client generators.
KeyGroupRange = Annotated[
    list[int], Field(min_length=2, max_length=2, description="inclusive key-group range [start, end]")
]


def canonical_index(value: Any) -> Any:
    """A path or query integer in its one canonical form (see ``codec.parse_decimal``)."""
    if isinstance(value, str):
        number = parse_decimal(value)
        if number is None:
            raise ValueError(
                f"{value!r} is not an integer in canonical form (ASCII digits, no leading zeros or spaces)"
            )
        return number
    return value


class Strict(BaseModel):
    """A request body: unknown fields refused, and one JSON form per value (``true``, ``"7"`` and
    ``8.0`` are not the integer 8)."""

    model_config = ConfigDict(extra="forbid", strict=True)

    @model_validator(mode="before")
    @classmethod
    def _known_fields(cls, data: Any) -> Any:
        # pydantic says only "Extra inputs are not permitted": name what the body takes, and the
        # field that was probably meant ({"max_parallism": 8}, {"ttl": {"ms": 60000}}).
        if isinstance(data, dict):
            fields = list(cls.model_fields)
            for name in data:
                if name not in cls.model_fields:
                    close = difflib.get_close_matches(str(name), fields, n=1, cutoff=0.6)
                    raise PydanticCustomError(
                        "unknown_field",
                        "unknown field {name}"
                        + (f" (did you mean {close[0]!r}?)" if close else "")
                        + "; this body takes: "
                        + ", ".join(fields),
                        {"name": repr(name)},
                    )
        return data


class JobBody(Strict):
    max_parallelism: int | None = Field(
        default=None,
        ge=1,
        le=32768,
        description="number of key groups; Flink's default for the replica count when absent",
    )


class JobInfo(BaseModel):
    """A job as this replica holds it: its key groups and their range here, its states, and where its
    writer epochs and micro-batches stand."""

    job: str
    max_parallelism: int
    key_group_range: KeyGroupRange = Field(description="inclusive key-group range [start, end] this replica owns")
    replica_index: int
    replica_count: int
    states: list[str]
    epoch: int = Field(description="current writer epoch (see /fence)")
    committed_epoch: int = Field(description="the last epoch whose task attempts' staged writes were committed")
    committed_batch: int | None = Field(
        default=None,
        description="the Spark micro-batch that epoch applied: which micro-batches the state holds (null: none)",
    )
    topology_version: int = Field(default=0, description="the topology version this replica serves the job under")

    @classmethod
    def of(cls, job: Job) -> JobInfo:
        r = job.key_group_range
        return cls(
            job=job.name,
            max_parallelism=job.max_parallelism,
            key_group_range=[r.start, r.end],
            replica_index=job.replica_index,
            replica_count=job.replica_count,
            states=sorted(job.descriptors),
            epoch=job.epoch,
            committed_epoch=job.committed_epoch,
            committed_batch=job.committed_batch,
            topology_version=job.keyspace.layout_version,
        )


# The engine's defaults, read off a config (its ttl is required and not read here).
_TTL_DEFAULTS = TtlConfig(ttl_ms=1)


class TtlBody(Strict):
    """Flink's StateTtlConfig: the engine's ``TtlConfig`` (its types and defaults), validated."""

    ttl_ms: int = Field(gt=0, description="time to live in milliseconds (processing time)")
    update_type: UpdateType = _TTL_DEFAULTS.update_type
    visibility: Visibility = _TTL_DEFAULTS.visibility
    cleanup_full_snapshot: bool = Field(
        default=_TTL_DEFAULTS.cleanup_full_snapshot, description="drop expired entries when writing a full snapshot"
    )
    cleanup_incremental_size: int = Field(
        default=_TTL_DEFAULTS.cleanup_incremental_size, ge=0, description="entries checked per state access; 0 = off"
    )


class DescriptorBody(Strict):
    """A keyed state's descriptor, Flink's StateDescriptor: its kind, key type, default, function,
    TTL and value type (what `PUT /v1/jobs/{job}/states/{state}` registers)."""

    kind: StateKind
    key_type: KeyType = "string"
    default: JsonValue = Field(default=None, description="value state only: returned for an absent key")
    function: str | None = Field(
        default=None,
        description="reducing: sum, min, max, count, first, last; aggregating: avg, count, sum, min, max, summary; "
        "map (optional, what map_add folds entries with): sum, min, max, count, first, last",
    )
    ttl: TtlBody | None = None
    value_type: ValueType | None = Field(
        default=None,
        description="optional: the type of the state's values (list elements, map entries, values added); other "
        "values are refused, and columnar reads return this Arrow type",
    )

    @field_validator("ttl", mode="before")
    @classmethod
    def _ttl_is_an_object(cls, value: Any) -> Any:
        # "ttl": 60000 is the common slip; pydantic would only say "should be a valid dictionary".
        if isinstance(value, int | float | str) and not isinstance(value, bool):
            example = value if isinstance(value, int) else 60000
            raise PydanticCustomError(
                "ttl_not_object", f'ttl is an object, not a number: send "ttl": {{"ttl_ms": {example}}}'
            )
        return value

    def to_descriptor(self, name: str) -> StateDescriptor:
        return StateDescriptor(
            name=name,
            kind=self.kind,
            key_type=self.key_type,
            default=self.default,
            function=self.function,
            ttl=TtlConfig(**self.ttl.model_dump()) if self.ttl else None,
            value_type=self.value_type,
        )


class DescriptorInfo(BaseModel):
    name: str
    kind: str
    key_type: str
    default: JsonValue = None
    function: str | None = None
    ttl: TtlBody | None = None
    value_type: ValueType | None = None


class ValueBody(Strict):
    value: JsonValue = Field(description="the new value (list state: a list; map state: an object)")


class AddBody(Strict):
    value: JsonValue = Field(default=None, description="one value to add")
    values: list[JsonValue] | None = Field(default=None, description="several values to add (list addAll)")

    @model_validator(mode="before")
    @classmethod
    def _one_of(cls, data: Any) -> Any:
        if isinstance(data, dict) and ("value" in data) == ("values" in data):
            raise ValueError("give exactly one of 'value' or 'values'")
        return data

    def as_op(self) -> dict[str, Any]:
        return {"values": self.values} if self.values is not None else {"value": self.value}


class ValueResponse(BaseModel):
    value: JsonValue


class OperatorListResponse(BaseModel):
    value: list[JsonValue]
    mode: Literal["split", "union"] | None


class OperatorListInfo(BaseModel):
    name: str
    mode: Literal["split", "union"]
    subtasks: list[int]  # the subtasks whose list holds elements on this replica


class OperatorInfo(BaseModel):
    """What one replica stores of an operator's state (broadcast state is the same on every replica)."""

    lists: list[OperatorListInfo]
    broadcast: list[str]


class KeyItem(BaseModel):
    key: str | int
    key_group: int
    ns: str


class EntryItem(BaseModel):
    key: str
    value: JsonValue


class Page(BaseModel):
    items: list[Any]
    next_cursor: str | None = Field(default=None, description="pass as ?cursor= for the next page; null on the last")


class KeyPage(Page):
    items: list[KeyItem]


class EntryPage(Page):
    items: list[EntryItem]


class JobPage(Page):
    items: list[JobInfo]


class DescriptorPage(Page):
    items: list[DescriptorInfo]


class BatchOp(BaseModel):
    """One operation of a batch, for the API's document: batches are decoded without models (what
    pydantic would cost per operation is most of a small batch's CPU) and the engine checks them
    (``backends/ops.py``) by the op table (``protocol/ops.py``), from which these enums come;
    tests/http/test_protocol.py holds both to the table."""

    op: Literal[StateOpName, TimerOpName, RawOpName]  # one enum (nested Literals flatten)
    state: str | None = Field(default=None, description="the state (every operation but the timer and raw ones)")
    key: str | int | None = Field(default=None, description="the key (state and timer operations)")
    ns: str = ""
    user_key: str | None = None
    value: JsonValue = None
    values: list[JsonValue] | None = None
    domain: TimeDomain | None = Field(default=None, description="timer operations: event (default) or processing")
    key_type: KeyType | None = Field(default=None, description="timer operations: the key's type (default string)")
    timestamp: int | None = Field(default=None, description="timer operations: the timer's time, milliseconds")
    key_group: int | None = Field(
        default=None, ge=0, le=MAX_SUBTASKS - 1, description="raw keyed operations: the key group whose stream it is"
    )
    operator: str | None = Field(default=None, description="raw operator operations: the operator")
    subtask: int | None = Field(
        default=None, ge=0, le=MAX_SUBTASKS - 1, description="raw operator operations: the operator's subtask"
    )


class BatchRequest(BaseModel):
    """Operations applied in order and atomically; `epoch` fences them, and `partition`, `attempt`
    and `seq` stage them for a Spark task attempt until its epoch is committed."""

    ops: list[BatchOp]
    epoch: int | None = Field(
        default=None,
        ge=0,
        le=MAX_EPOCH,
        description="writer epoch; refused with 409 unless it is the job's current one",
    )
    partition: int | None = Field(
        default=None, ge=0, le=MAX_PARTITION, description="task attempts: the Spark partition id"
    )
    attempt: str | None = Field(
        default=None,
        pattern=ATTEMPT_PATTERN,
        description="task attempts: the attempt's id; with it the writes are staged until the epoch is committed, "
        "and the batch's reads see the attempt's own staged writes",
    )
    seq: int | None = Field(
        default=None,
        ge=0,
        le=MAX_SEQ,
        description="task attempts: 0, 1, 2... per attempt and replica; a re-sent request repeats its seq",
    )


class AttemptModel(Strict):
    partition: int = Field(ge=0, le=MAX_PARTITION, description="the Spark partition id")
    attempt: str = Field(pattern=ATTEMPT_PATTERN, description="the winning attempt's id")
    ops: int = Field(
        ge=0, le=MAX_SEQ, description="the write operations the attempt staged on this replica, as its task counted"
    )
    unit: str = Field(
        default="",
        pattern=UNIT_PATTERN,
        description="the state update the attempt ran for, when one task runs several (each has its own attempt "
        "of the partition); a (unit, partition) is named at most once",
    )


class EpochBody(Strict):
    attempts: list[AttemptModel] = Field(description="the winning attempts of the micro-batch that wrote here")
    batch_id: int | None = Field(
        default=None,
        ge=0,
        le=MAX_EPOCH,
        description="commit: the Spark micro-batch the epoch applies, recorded with its writes (the job's "
        "`committed_batch`, carried by every checkpoint, restore and live rescale)",
    )


MAX_WAIT_MS = 10_000  # the longest a request waits for a checkpoint's upload to end (a long poll)


class TriggerBody(Strict):
    """A trigger of this replica's part of a checkpoint or savepoint: its id, what to keep with it,
    and how long to wait for its upload (and whether to complete it then) in the same request."""

    checkpoint_id: int | None = Field(
        default=None, ge=1, le=MAX_CHECKPOINT_ID, description="the id to use (the coordinator's); default last + 1"
    )
    kind: Literal["checkpoint", "savepoint"] = "checkpoint"
    metadata: dict[str, JsonValue] = Field(
        default_factory=dict, description="kept with the checkpoint, e.g. the coordinator's batch id"
    )
    wait_ms: int = Field(
        default=0,
        ge=0,
        le=MAX_WAIT_MS,
        description="answer when the upload has ended (200, `uploaded` or `failed`) or after this many milliseconds "
        "(202, `in_progress`), whichever is first: the trigger and the coordinator's first wait in one round trip",
    )
    complete: bool = Field(
        default=False,
        description="once uploaded, also complete this part (notifyCheckpointComplete) and answer 200 `completed`: "
        "trigger, wait and complete in one round trip; an upload that outlasts the wait (`wait_ms`, or 10 s) answers "
        "202 `in_progress`, and `POST .../complete` completes it once uploaded. Only where this replica's part is "
        "the whole checkpoint (a "
        "deployment of one replica; otherwise 422 `invalid_argument`): with several, no part may complete before "
        "every part is uploaded",
    )

    @model_validator(mode="after")
    def _small_metadata(self) -> TriggerBody:
        try:
            encoded = orjson.dumps(self.metadata)
        except orjson.JSONEncodeError as exc:  # e.g. an integer beyond 64 bits, a lone surrogate
            raise ValueError(f"metadata cannot be stored as JSON: {exc}") from None
        if len(encoded) > 65536:
            raise ValueError("metadata must be at most 64 KiB of JSON")
        return self


def _report_model(source: type, descriptions: dict[str, str]) -> type[BaseModel]:
    """The response schema of an engine report: exactly its fields (one definition), all
    required except those that default to ``None``, with the edge's descriptions."""
    hints = get_type_hints(source)
    fields: dict[str, Any] = {}
    for f in dataclasses.fields(source):
        annotation = KeyGroupRange if f.name == "key_group_range" else hints[f.name]
        default = None if f.default is None else ...
        fields[f.name] = (annotation, Field(default=default, description=descriptions.get(f.name)))
    return create_model(f"{source.__name__}Model", **fields)


def _page_model(name: str, items: type[BaseModel], **fields: Any) -> type[Page]:
    """A page of a :func:`_report_model`'s model, with ``fields`` besides. Built as that model is:
    a class statement (and a type checker) takes only a declared class as a field's type, so the
    list type is spelled as the value it is at run time."""
    fields["items"] = (GenericAlias(list, items), ...)
    return create_model(name, __base__=Page, **fields)


CheckpointInfoModel = _report_model(
    CheckpointInfo,
    {
        "bytes_uploaded": "bytes this replica uploaded for it",
        "bytes_reused": "bytes referenced from earlier checkpoints (incremental)",
        "metadata": "given at trigger, e.g. the coordinator's batch id",
        "committed_epoch": "the last epoch committed into the frozen state (0 until uploaded)",
        "committed_batch": "the Spark micro-batch that epoch applied (null: none named)",
    },
)


CheckpointPage = _page_model(
    "CheckpointPage",
    CheckpointInfoModel,
    next_checkpoint_id=(int, Field(description="the smallest id a new checkpoint may take on this replica")),
)


class RestoreBody(Strict):
    """What to restore the job from: one of its checkpoints or savepoints by id, or a snapshot's
    location; and, for operator list state, a new subtask count per operator."""

    checkpoint_id: int | None = Field(
        default=None, ge=1, le=MAX_CHECKPOINT_ID, description="a checkpoint or savepoint id of this job"
    )
    location: str | None = Field(
        default=None, description="a snapshot location (a checkpoint's or savepoint's `location`)"
    )
    operator_parallelism: dict[Annotated[str, Name], Annotated[int, Field(ge=1, le=MAX_SUBTASKS)]] | None = Field(
        default=None, description="new subtask count per operator, for redistributing operator list state"
    )

    @model_validator(mode="after")
    def _one_source(self) -> RestoreBody:
        if self.checkpoint_id is not None and self.location is not None:
            raise ValueError("give checkpoint_id or location, not both")
        return self


RestoreInfoModel = _report_model(
    RestoreInfo,
    {
        "parts": "the replica parts read, e.g. replica-0-of-2",
        "aborted_checkpoints": "this replica's pending checkpoints of the job, aborted because they froze the "
        "replaced state",
    },
)


EpochReportModel = _report_model(
    EpochReport,
    {
        "status": "open (staging), sealed (prepared), committed, or none (nothing staged here)",
        "current_epoch": "the job's current writer epoch",
        "committed_epoch": "the last epoch committed on this replica",
        "attempts": "the attempts staged under the epoch: partition, attempt, ops, bytes",
        "ops": "write operations verified (prepare) or committed (commit)",
        "committed_batch": "the Spark micro-batch the committed epoch applied (null: none named)",
        "topology_version": "the topology version this replica serves the job under (a coordinator checks that "
        "the micro-batch's layout still stands)",
    },
)


class FenceBody(Strict):
    """A raise of the job's writer epoch, which fences out the writers of older epochs (docs/api.md,
    Writer epochs)."""

    epoch: int = Field(
        ge=0,
        le=MAX_EPOCH,
        description="raise the job's writer epoch to at least this; at the ceiling (2^63-1) no epoch can follow, "
        "and `next` is refused (docs/api.md, Writer epochs)",
    )
    next: bool = Field(
        default=False,
        description="raise it to at least one past the current epoch too: an epoch no writer had here (a "
        "coordinator's fence without first reading the job)",
    )
    begins_batch: bool = Field(
        default=False,
        description="a coordinator begins a micro-batch under the epoch: a live rescale does not prepare on this "
        "replica until the epoch is committed or aborted (or the batch shows no sign of life for "
        "STATEHOUSE_BATCH_LEASE_S)",
    )


class FenceResponse(BaseModel):
    epoch: int
    committed_epoch: int = Field(
        description="the last epoch whose task attempts' staged writes were committed (as in `GET /v1/jobs/{job}`)"
    )
    committed_batch: int | None = Field(
        default=None, description="the Spark micro-batch that epoch applied (as in `GET /v1/jobs/{job}`)"
    )
    rescale_version: int | None = Field(
        default=None,
        description="the topology version of a live rescale pending on this replica (null: none): a coordinator "
        "begins no micro-batch until it has ended",
    )
    topology_version: int = Field(default=0, description="the topology version this replica serves the job under")


# Declared, not "an object of JSON values": generated clients then have a `value` field.
class BatchResult(BaseModel):
    """One operation's result: `{"value": ...}` for a read, `{}` for a write."""

    value: JsonValue = Field(default=None, description="what a read found (null when absent); absent for writes")


class BatchResponse(BaseModel):
    results: list[BatchResult] = Field(description='per op, in order: {"value": ...} for reads, {} for writes')


class ColumnsResponse(BaseModel):
    """What a columnar write did."""

    op: str
    rows: int = Field(description="rows applied, or staged for the task attempt")
    staged: bool = Field(description="true when the rows were staged for a task attempt (committed with its epoch)")


# -- timers --------------------------------------------------------------------------------------

Timestamp = Annotated[int, Field(ge=INT64_MIN, le=INT64_MAX, description="milliseconds (a 64-bit integer)")]


class TimerItem(BaseModel):
    """One timer: fired (an advance), or stored (a listing)."""

    timestamp: int
    key: str | int
    key_type: KeyType = Field(description="the timer's key type: it fires with the key typed as registered")
    ns: str
    key_group: int


class TimerPage(Page):
    items: list[TimerItem]


class AdvanceBody(Strict):
    """An advance of a time domain (the event-time watermark or the processing-time clock) that
    fires the timers due, optionally for some key groups only, fenced and staged as a batch is."""

    to: Timestamp = Field(description="the new watermark (event time) or clock (processing time); never lowers it")
    key_groups: KeyGroupRange | None = Field(
        default=None,
        description="fire only these of this replica's key groups (a task attempt fires its own partition's); "
        "the time is raised for the whole replica",
    )
    limit: int | None = Field(
        default=None, ge=1, description="fire at most this many (capped at STATEHOUSE_MAX_BATCH_OPS); the rest stay due"
    )
    epoch: int | None = Field(
        default=None,
        ge=0,
        le=MAX_EPOCH,
        description="writer epoch; refused with 409 unless it is the job's current one",
    )
    partition: int | None = Field(
        default=None, ge=0, le=MAX_PARTITION, description="task attempts: the Spark partition id"
    )
    attempt: str | None = Field(
        default=None,
        pattern=ATTEMPT_PATTERN,
        description="task attempts: the firing is staged (one write operation) until the epoch is committed",
    )
    seq: int | None = Field(
        default=None, ge=0, le=MAX_SEQ, description="task attempts: the request's seq, as on the batch endpoint"
    )


class AdvanceResponse(BaseModel):
    domain: TimeDomain
    time: int = Field(description="the domain's time on this replica after the advance")
    timers: list[TimerItem] = Field(description="the fired timers in (timestamp, key group, key, namespace) order")
    more: bool = Field(description="true when `limit` cut the firing short: advance again for the rest")


class TimerCount(BaseModel):
    key_group: int
    count: int


class TimerCounts(BaseModel):
    domain: TimeDomain
    time: int | None = Field(description="the domain's time on this replica; null before the first advance")
    total: int
    key_groups: list[TimerCount] = Field(description="key groups holding timers, in order (empty ones left out)")


# -- errors and probes -------------------------------------------------------------------------


class ValidationIssue(BaseModel):
    """One reason a request failed validation (``errors`` of a ``validation_error`` problem)."""

    loc: list[str | int] = Field(description="where: e.g. ['body', 'value'] or ['query', 'limit']")
    msg: str
    type: str


def _absent_unless_set(schema: dict[str, Any]) -> None:
    schema.pop("default", None)  # the member is left out, never null


def _extra(description: str) -> Any:
    return Field(default=None, description=description, json_schema_extra=_absent_unless_set)


class Problem(BaseModel):
    """An RFC 9457 problem: every error answer of the API (``application/problem+json``)."""

    model_config = ConfigDict(extra="allow")

    type: str = Field(
        description="where the code is explained: /problems/<code> on this service (relative to its root), or "
        "<STATEHOUSE_PROBLEM_DOCS_URL>#<code> when that is set"
    )
    title: str = Field(description="the HTTP status phrase")
    status: int = Field(description="the HTTP status code")
    code: str = Field(description="stable machine-readable error code (see the Errors section of the API docs)")
    detail: str = Field(description="what went wrong and what to fix")
    instance: str | SkipJsonSchema[None] = _extra("the request path")
    op_index: int | SkipJsonSchema[None] = _extra("batch: the index of the failing operation")
    owner: int | SkipJsonSchema[None] = _extra("key_not_owned: the replica index that owns the key")
    key_group: int | SkipJsonSchema[None] = _extra("key_not_owned: the key's key group")
    epoch: int | SkipJsonSchema[None] = _extra("stale_epoch: the job's current writer epoch")
    errors: list[ValidationIssue] | SkipJsonSchema[None] = _extra("validation_error: each issue")
    attempts: list[dict[str, Any]] | SkipJsonSchema[None] = _extra(
        "attempt_lost: each winning attempt this replica lacks, with its expected and held write counts"
    )
    retry_after_ms: int | SkipJsonSchema[None] = _extra(
        "rescale_in_progress: milliseconds to wait before retrying (finer than Retry-After)"
    )
    request_id: str | SkipJsonSchema[None] = _extra(
        "internal_error: the id the server log has the fault under (also the X-Request-ID response header)"
    )


class Health(BaseModel):
    status: Literal["ok"]


class Readiness(BaseModel):
    status: Literal["ready"]
    backend: Literal["rocksdb", "heap"]
    replica_index: int
    replica_count: int
