"""The OpenAPI document (``/openapi.json``) as a contract that generated clients can rely on.

Routers declare what they can answer with the ``responses=`` dicts defined here, by problem code
(``errors("job_not_found", ...)``): each code's status comes from ``problems.STATUS_BY_CODE``, and
every error status is one shared ``Problem`` schema as ``application/problem+json``. ``document``
then adds what follows from the route itself, so that no router has to repeat it:

* operation ids from ``OPERATION_IDS`` (route function name → stable camelCase id);
* bearer ``security`` plus 401 ``unauthorized`` and 503 ``not_ready`` on every route behind
  ``require_token`` (all of ``/v1``), 507 ``insufficient_storage`` on those of them that are not
  ``GET`` (a write to a full data volume), and 403 ``forbidden`` on those under ``/v1/jobs/{job}``
  (a token not scoped to the job);
* 422 ``validation_error`` on every route with parameters or a body, 400 ``malformed_body``,
  413 ``body_too_large`` and 415 ``unsupported_media_type`` on every route with a body
  (FastAPI's ``HTTPValidationError`` is left out: the server never sends it);
* the name pattern on every path parameter that names a job, state or operator state
  (``NAMED_PARAMETERS``): the engine refuses, or finds nothing under, any other name.

Each error response also lists its codes in ``x-problem-codes``.
"""

from __future__ import annotations

import copy
import re
from http import HTTPStatus
from typing import Any

from fastapi import FastAPI, routing
from fastapi.openapi.utils import get_openapi

from statehouse.app.dependencies import require_token
from statehouse.app.models import BatchRequest, Problem
from statehouse.app.problems import PROBLEM_MEDIA_TYPE, STATUS_BY_CODE
from statehouse.app.wire import ARROW_STREAM, JSON, MSGPACK
from statehouse.snapshots.stored.names import NAME_PATTERN

REF = "#/components/schemas/{model}"
PROBLEM_SCHEMA = {"$ref": REF.format(model="Problem")}
SECURITY_SCHEME = "bearerAuth"
CODES = "x-problem-codes"
# Path parameters that are names (``snapshots/stored/names.py``), declared with its pattern wherever a
# route does not declare it itself.
NAMED_PARAMETERS = frozenset({"job", "state", "operator", "name"})
CHALLENGE = {"description": "`Bearer`: the scheme to authenticate with", "required": True, "schema": {"type": "string"}}

# Route function name → operationId: the method names of generated clients, so they never change
# once published. A route missing here gets its function name in camelCase.
OPERATION_IDS: dict[str, str] = {
    # operations
    "healthz": "getHealth",
    "readyz": "getReadiness",
    "metrics": "getMetrics",
    "get_topology": "getTopology",
    # a live rescale's steps
    "prepare_rescale": "prepareRescale",
    "catch_up_rescale": "catchUpRescale",
    "load_rescale": "loadRescale",
    "decide_rescale": "decideRescale",
    "get_rescale_decision": "getRescaleDecision",
    "commit_rescale": "commitRescale",
    "abort_rescale": "abortRescale",
    # jobs
    "put_job": "putJob",
    "get_job": "getJob",
    "list_jobs": "listJobs",
    "delete_job": "deleteJob",
    "fence": "fenceJob",
    # keyed state descriptors
    "put_state": "putState",
    "get_state": "getState",
    "list_states": "listStates",
    "delete_state": "deleteState",
    # keyed state
    "get_key": "getKeyedValue",
    "put_key": "putKeyedValue",
    "add_to_key": "addToKeyedValue",
    "add_get_key": "addToKeyedValueAndGet",
    "clear_key": "clearKeyedValue",
    "get_entry": "getMapEntry",
    "put_entry": "putMapEntry",
    "add_to_entry": "addToMapEntry",
    "remove_entry": "removeMapEntry",
    "list_entries": "listMapEntries",
    "list_keys": "listKeys",
    "scan_state": "scanState",
    "state_sizes": "getStateSizes",
    "batch": "applyBatch",
    "columns": "applyColumns",
    "states_columns": "applyStatesColumns",
    # task attempts' epochs
    "describe_epoch": "getEpoch",
    "prepare_epoch": "prepareEpoch",
    "commit_epoch": "commitEpoch",
    "abort_epoch": "abortEpoch",
    # timers
    "put_timer": "registerTimer",
    "delete_timer": "deleteTimer",
    "advance_timers": "advanceTimers",
    "timer_columns": "applyTimerColumns",
    "list_timers": "listTimers",
    "count_timers": "countTimers",
    # operator state
    "describe_operator": "describeOperator",
    "get_list": "getOperatorList",
    "put_list": "putOperatorList",
    "add_to_list": "addToOperatorList",
    "clear_list": "clearOperatorList",
    "list_broadcast": "listBroadcastEntries",
    "get_broadcast": "getBroadcastEntry",
    "put_broadcast": "putBroadcastEntry",
    "remove_broadcast": "removeBroadcastEntry",
    # raw state
    "get_raw_stream": "getRawKeyedStream",
    "put_raw_stream": "putRawKeyedStream",
    "append_raw_stream": "appendRawKeyedStream",
    "clear_raw_stream": "clearRawKeyedStream",
    "get_raw_partitions": "getRawOperatorPartitions",
    "put_raw_partitions": "putRawOperatorPartitions",
    "add_raw_partition": "addRawOperatorPartition",
    "clear_raw_partitions": "clearRawOperatorPartitions",
    # checkpoints
    "trigger": "triggerCheckpoint",
    "list_checkpoints": "listCheckpoints",
    "get_checkpoint": "getCheckpoint",
    "complete": "completeCheckpoint",
    "abort": "abortCheckpoint",
    "restore": "restoreJob",
}


def _describe(status: int, codes: list[str]) -> str:
    return f"{HTTPStatus(status).phrase}: problem {', '.join(f'`{c}`' for c in codes)}"


def errors(*codes: str) -> dict[int | str, dict[str, Any]]:
    """``responses=`` for a route that can answer these problem codes: one problem+json response
    per status. An unknown code is a KeyError at import: every code has its status in one table."""
    by_status: dict[int, list[str]] = {}
    for code in codes:
        listed = by_status.setdefault(STATUS_BY_CODE[code], [])
        if code not in listed:
            listed.append(code)
    return {
        status: {
            "description": _describe(status, listed),
            "content": {PROBLEM_MEDIA_TYPE: {"schema": PROBLEM_SCHEMA}},
            CODES: listed,
        }
        for status, listed in sorted(by_status.items())
    }


def binary(what: str) -> dict[str, Any]:
    """A msgpack body: bytes, as generators expect (``format: binary``)."""
    return {"schema": {"type": "string", "format": "binary", "contentMediaType": MSGPACK}, "description": what}


def msgpack_reply(status: int = 200) -> dict[int | str, dict[str, Any]]:
    """The JSON reply of a route is also available as msgpack (``Accept: application/msgpack``)."""
    return {status: {"content": {MSGPACK: binary("the same document as the JSON reply, encoded as msgpack")}}}


# -- what the routers can answer, by concern ------------------------------------------------------

JOB = ("invalid_name", "job_not_found", "layout_mismatch")  # the job is looked up by name
PAGED = ("invalid_argument",)  # a cursor that is not a next_cursor handed out
VALUES = ("invalid_argument", "invalid_value", "value_too_large")  # a value or list of values is written
# A key group this replica does not own: 421, or 503 while a live rescale is pending here (it may
# own it once the move commits: backends/keyspace.py check_owned).
NOT_OWNED = ("key_not_owned", "rescale_in_progress")
KEYED = (*JOB, "state_not_found", "invalid_key", "key_too_large", *NOT_OWNED)  # one key of a keyed state
OPERATOR = (*JOB,)  # operator and state names are validated like job names
CHECKPOINT_STORAGE = ("storage_unavailable", "snapshot_corrupt")
STORED = ("value_too_deep",)  # stored values are answered: one from before the depth limit may not fit the format
# A write into a key group a live rescale moves (or to a frozen job's operator state); a TTL-renewing read too.
MOVING = ("rescale_in_progress",)

PUT_JOB = errors("invalid_name", "invalid_argument", "job_conflict", "too_many_jobs")
LIST_JOBS = errors(*PAGED)
JOB_ONLY = errors(*JOB)
FENCE = errors(*JOB, "invalid_argument")
PUT_STATE = errors(*JOB, *MOVING, "invalid_argument", "incompatible_state", "too_many_states")
LIST_STATES = errors(*JOB, *PAGED)
STATE = errors(*JOB, "state_not_found")
DROP_STATE = errors(*JOB, *MOVING, "state_not_found")  # refused while a live rescale froze the job

KEYED_READ = {**errors(*KEYED, *STORED, *MOVING, "key_not_found", "map_too_large"), **msgpack_reply()}
KEYED_WRITE = errors(*KEYED, *VALUES, *MOVING, "wrong_state_kind", "list_too_large")
KEYED_ADD_GET = {**errors(*KEYED, *VALUES, *MOVING, "wrong_state_kind"), **msgpack_reply()}
KEYED_CLEAR = errors(*KEYED, *MOVING)
MAP_READ = {**errors(*KEYED, *STORED, *MOVING, "wrong_state_kind", "key_not_found"), **msgpack_reply()}
MAP_REMOVE = errors(*KEYED, *MOVING, "wrong_state_kind")
MAP_LIST = {**errors(*KEYED, *PAGED, *STORED, "wrong_state_kind"), **msgpack_reply()}
LIST_KEYS = errors(*JOB, *PAGED, "state_not_found", *NOT_OWNED)

BATCH_BODY = {
    # Not "required": openapi-python-client 0.29 emits code that cannot be imported for a required body
    # with several media types (openapi-generators/openapi-python-client#1451). A batch without a body
    # is answered 400 malformed_body, which is declared.
    "required": False,
    "content": {
        JSON: {"schema": {"$ref": REF.format(model="BatchRequest")}},
        MSGPACK: binary("a BatchRequest encoded as msgpack (values may be bytes)"),
    },
}
# What a batch of keyed operations can answer, staged for a task attempt or not (batch, columns).
# What a write fenced by an epoch, or staged for a task attempt, can answer (batch, columns, timers).
STAGED = ("stale_epoch", "attempt_lost", "attempt_conflict", "epoch_sealed", "staging_too_large")
# What reading a batch or columnar body can answer.
MANY = ("batch_too_large", "malformed_body", "unsupported_media_type")
MANY_KEYED = (*KEYED, *VALUES, *STORED, *MOVING, "wrong_state_kind", "map_too_large", "list_too_large", *STAGED, *MANY)
BATCH = {**errors(*MANY_KEYED, "raw_stream_too_large"), **msgpack_reply()}  # raw ops too
ARROW_SCHEMA = {"type": "string", "format": "binary", "contentMediaType": ARROW_STREAM}


def arrow_body(columns: str) -> dict[str, Any]:
    """A required Arrow IPC request body holding ``columns``."""
    description = f"an Arrow IPC stream of one or more record batches with {columns}"
    return {"required": True, "content": {ARROW_STREAM: {"schema": ARROW_SCHEMA, "description": description}}}


COLUMNS_BODY = arrow_body("the operation's columns: key, and as the operation needs user_key and value; ns optional")
STATES_COLUMNS_BODY = arrow_body(
    "the rows' columns once (key, and user_key as the operation needs it; ns optional) and, for an operation "
    "that takes values, one value column per state named value:<state>"
)
COLUMNS = {
    200: {
        "description": "a read (`get`, `map_get`): the request's rows, in order, with a `value` column (null where "
        "absent) as an Arrow IPC stream; `add_get`: the same, `value` being each row's result after its add; "
        "another write: how many rows were applied (or staged)",
        "content": {
            ARROW_STREAM: {"schema": ARROW_SCHEMA},
            JSON: {"schema": {"$ref": REF.format(model="ColumnsResponse")}},
        },
    },
    **errors(*MANY_KEYED, "untyped_values"),
}
EPOCH_COMMIT = errors(
    *KEYED,
    *VALUES,
    "wrong_state_kind",
    "list_too_large",
    "stale_epoch",
    "attempt_lost",
    "attempt_conflict",  # two winners fired one timer
    "invalid_argument",
)

TIMER = errors(*JOB, *MOVING, "invalid_key", "key_too_large", "key_not_owned", "invalid_argument")
ADVANCE = {
    **errors(*JOB, *MOVING, "invalid_argument", *STAGED),
    **msgpack_reply(),
}
TIMER_COLUMNS_BODY = arrow_body("the columns key, timestamp (int64 ms) and optionally ns")
TIMER_COLUMNS = errors(
    *JOB, *MOVING, "invalid_argument", "invalid_key", "key_too_large", "key_not_owned", *STAGED, *MANY
)
LIST_TIMERS = {**errors(*JOB, *PAGED, *NOT_OWNED), **msgpack_reply()}
COUNT_TIMERS = errors(*JOB, *NOT_OWNED)

OPERATOR_READ = errors(*OPERATOR)
OPERATOR_LIST_READ = {**errors(*OPERATOR, *STORED, "invalid_argument", "key_not_found"), **msgpack_reply()}
OPERATOR_LIST_WRITE = errors(*OPERATOR, *VALUES, *MOVING, "operator_state_conflict")
OPERATOR_CLEAR = errors(*OPERATOR, *MOVING, "invalid_argument")
BROADCAST_LIST = {**errors(*OPERATOR, *PAGED, *STORED), **msgpack_reply()}
BROADCAST_READ = {**errors(*OPERATOR, *STORED, "key_not_found"), **msgpack_reply()}
BROADCAST_WRITE = errors(*OPERATOR, *VALUES, *MOVING, "key_too_large")
BROADCAST_REMOVE = errors(*OPERATOR, *MOVING)

OCTET_SCHEMA = {"type": "string", "format": "binary"}
RAW_KEYED = (*JOB, "invalid_argument", *NOT_OWNED)  # one key group, this replica's
RAW_KEYED_READ = errors(*RAW_KEYED, "key_not_found", "answer_too_large")
RAW_KEYED_WRITE = errors(*RAW_KEYED, *MOVING, "raw_stream_too_large", "stale_epoch")
RAW_KEYED_APPEND = {**RAW_KEYED_WRITE, **msgpack_reply()}
RAW_KEYED_CLEAR = errors(*RAW_KEYED, *MOVING, "stale_epoch")
RAW_OPERATOR_READ = {**errors(*OPERATOR, "key_not_found", "answer_too_large"), **msgpack_reply()}
RAW_OPERATOR_WRITE = errors(*OPERATOR, *MOVING, "raw_stream_too_large", "stale_epoch")
BASE64_LIST = {"type": "array", "items": {"type": "string", "contentEncoding": "base64"}}
RAW_PARTITIONS_BODY = {
    "requestBody": {
        "required": False,  # several media types: see BATCH_BODY (no body: 400 malformed_body)
        "content": {
            JSON: {
                "schema": {
                    "type": "object",
                    "required": ["partitions"],
                    "properties": {
                        "partitions": {"type": "array", "items": {"type": "string", "contentEncoding": "base64"}}
                    },
                    "additionalProperties": False,
                }
            },
            MSGPACK: binary('{"partitions": [bin, ...]} encoded as msgpack'),
        },
    }
}
RAW_OPERATOR_REPLACE = errors(
    *OPERATOR, *MOVING, "raw_stream_too_large", "invalid_argument", "invalid_value", "stale_epoch"
)
RAW_OPERATOR_CLEAR = errors(*OPERATOR, *MOVING, "stale_epoch")

# With `complete` the trigger completes too (a deployment of one replica): the complete's codes as well.
TRIGGER = errors(
    *JOB, "invalid_argument", "checkpoint_conflict", "checkpoint_not_ready", "checkpoint_failed", *CHECKPOINT_STORAGE
)
LIST_CHECKPOINTS = errors(*PAGED, *CHECKPOINT_STORAGE)
GET_CHECKPOINT = errors("checkpoint_not_found", *CHECKPOINT_STORAGE)
COMPLETE = errors(*JOB, "checkpoint_not_found", "checkpoint_not_ready", "checkpoint_failed", *CHECKPOINT_STORAGE)
ABORT = errors(*JOB, "checkpoint_not_found", "checkpoint_conflict", *CHECKPOINT_STORAGE)
RESTORE = errors(
    "invalid_argument",
    "checkpoint_not_found",
    "restore_incomplete",
    "restore_incompatible",
    "invalid_location",
    "too_many_jobs",
    "too_many_states",
    *CHECKPOINT_STORAGE,
)

READY = errors("not_ready")


# -- the document ---------------------------------------------------------------------------------


def operation_id(route: Any) -> str:
    return OPERATION_IDS.get(route.name) or re.sub(r"_([a-z0-9])", lambda m: m.group(1).upper(), route.name)


def _add_codes(operation: dict[str, Any], *codes: str) -> None:
    responses = operation.setdefault("responses", {})
    for status, declared in errors(*codes).items():
        response = responses.setdefault(str(status), copy.deepcopy(declared))
        listed = response.setdefault(CODES, [])
        listed.extend(c for c in declared[CODES] if c not in listed)
        response["description"] = _describe(int(status), listed)
        response["content"] = {PROBLEM_MEDIA_TYPE: {"schema": PROBLEM_SCHEMA}}


def _secured(route: Any) -> bool:
    return any(d.call is require_token for d in route.dependant.dependencies)


def _optional_body(operation: dict[str, Any]) -> None:
    """An optional body (``Model | None = None``) is the model with ``required: false``, not
    ``anyOf [model, null]``: generators then omit an absent body instead of sending ``null``."""
    body = operation.get("requestBody", {})
    for media in body.get("content", {}).values():
        variants = media.get("schema", {}).get("anyOf", [])
        if not body.get("required") and len(variants) == 2 and {"type": "null"} in variants:
            media["schema"] = next(v for v in variants if v != {"type": "null"})


def _name_patterns(operation: dict[str, Any]) -> None:
    for parameter in operation.get("parameters", []):
        if parameter["in"] == "path" and parameter["name"] in NAMED_PARAMETERS:
            parameter["schema"].setdefault("pattern", NAME_PATTERN)


def _complete(operation: dict[str, Any], route: Any, method: str) -> None:
    """Add what follows from the route itself: id, security, the errors every such route has, and
    the name pattern of its names."""
    operation["operationId"] = operation_id(route)
    _optional_body(operation)
    _name_patterns(operation)
    if _secured(route):
        operation["security"] = [{SECURITY_SCHEME: []}]
        _add_codes(operation, "unauthorized", "not_ready")
        if "{job}" in (route.path_format or ""):  # the token must be scoped to the job
            _add_codes(operation, "forbidden")
        operation["responses"]["401"]["headers"] = {"WWW-Authenticate": CHALLENGE}
        if method != "GET":  # it may write, and the data volume may be full
            _add_codes(operation, "insufficient_storage")
    if "requestBody" in operation:
        _add_codes(operation, "malformed_body", "body_too_large", "unsupported_media_type")
    if operation.get("parameters") or "requestBody" in operation:
        _add_codes(operation, "validation_error")
    operation["responses"] = dict(sorted(operation["responses"].items()))


def document(app: FastAPI) -> dict[str, Any]:
    """Build the OpenAPI document of ``app``."""
    schema = get_openapi(title=app.title, version=app.version, description=app.description, routes=app.routes)
    components = schema.setdefault("components", {})
    schemas = components.setdefault("schemas", {})
    for model in (BatchRequest, Problem):  # BatchRequest: the batch body is decoded without a model
        definition = model.model_json_schema(ref_template=REF)
        schemas.update(definition.pop("$defs", {}))
        schemas[model.__name__] = definition
    for unused in ("HTTPValidationError", "ValidationError"):  # the server sends Problem instead
        schemas.pop(unused, None)
    components["securitySchemes"] = {
        SECURITY_SCHEME: {
            "type": "http",
            "scheme": "bearer",
            "description": "one of STATEHOUSE_API_TOKENS (or STATEHOUSE_API_TOKENS_FILE); every /v1 call needs "
            "it when tokens are configured, and a route of a job a token scoped to that job",
        }
    }
    seen: dict[str, str] = {}
    # Routes as included (with the include's dependencies, e.g. require_token), as get_openapi sees them.
    for route in routing.iter_route_contexts(app.routes):
        if not isinstance(route.original_route, routing.APIRoute) or not route.include_in_schema:
            continue
        name, path = route.name or "", route.path_format or ""
        if seen.setdefault(name, path) != path:
            raise RuntimeError(f"two routes are named {name!r}: operation ids must stay unique")
        for method in route.methods or ():
            operation = schema["paths"].get(path, {}).get(method.lower())
            if operation is not None:
                _complete(operation, route, method)
    return schema
