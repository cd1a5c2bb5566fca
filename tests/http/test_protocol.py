"""The op table (``protocol/ops.py``) is the one definition of the operations: the engine's
dispatch, its field checks, the HTTP models' enums and the client's retry and staging rules all
follow it, so a name or a field added to the table and nowhere else fails here."""

import pytest

from statehouse.app.main import app
from statehouse.app.models import BatchOp
from statehouse.backends import ops, runs
from statehouse.backends.errors import WrongStateKind
from statehouse.client import batch as client_batch
from statehouse.client import columns as client_columns
from statehouse.protocol import bounds
from statehouse.protocol.errors import InvalidArgument
from statehouse.protocol.ops import (
    COLUMN_OPS,
    IDEMPOTENT_OPS,
    OP_NAMES,
    OPS,
    READ_COLUMN_OPS,
    READ_OPS,
    STATE_OPS,
    TIMER_COLUMN_OPS,
)
from statehouse.snapshots.stored.descriptors import StateDescriptor

KINDS = {"value": {}, "list": {}, "map": {"function": "sum"}, "reducing": {"function": "sum"}}
KINDS["aggregating"] = {"function": "avg"}


def _value(name: str, kind: str):
    """A value ``name`` takes on a state of ``kind``."""
    return {"value": 1, "list": [1], "map": {"u": 1}}.get(kind, 1) if name == "put" else 1


def test_the_engine_dispatches_exactly_the_state_operations_of_the_table():
    assert tuple(runs._RUNS) == STATE_OPS


def test_the_client_uses_the_tables_sets():
    assert client_batch.IDEMPOTENT_OPS is IDEMPOTENT_OPS and client_batch.READ_OPS is READ_OPS
    assert client_columns.COLUMN_OPS is COLUMN_OPS and client_columns.READ_COLUMN_OPS is READ_COLUMN_OPS


def test_the_batch_model_documents_every_operation_and_field():
    schema = BatchOp.model_json_schema()
    assert tuple(schema["properties"]["op"]["enum"]) == OP_NAMES
    documented = set(BatchOp.model_fields)
    for op in OPS.values():
        assert set(op.fields) <= documented, op.name
        if op.takes_values:
            assert "values" in documented


def test_the_openapi_enums_are_the_tables():
    spec = app.openapi()

    def op_enum(path: str) -> tuple[str, ...]:
        (param,) = [p for p in spec["paths"][path]["post"]["parameters"] if p["name"] == "op"]
        schema = param["schema"]
        return tuple(schema.get("enum") or spec["components"]["schemas"][schema["$ref"].split("/")[-1]]["enum"])

    assert op_enum("/v1/jobs/{job}/states/{state}/columns/{op}") == tuple(COLUMN_OPS)
    assert op_enum("/v1/jobs/{job}/timers/{domain}/columns/{op}") == tuple(TIMER_COLUMN_OPS)


def test_the_bounds_are_javas():
    assert bounds.MAX_PARTITION == 2**31 - 1 and bounds.INT64_MAX == 2**63 - 1 == bounds.MAX_SEQ


@pytest.mark.parametrize("name", STATE_OPS)
def test_each_required_field_is_checked_by_the_engine(job, name):
    """A batch operation without one of the fields the table names is refused, naming it."""
    spec = OPS[name]
    (kind,) = sorted(spec.kinds)[:1]
    job.register_state(StateDescriptor("s", kind, **KINDS[kind]))
    full = {"op": name, "state": "s", "key": "k", "user_key": "u", "value": _value(name, kind)}
    for field in spec.fields:
        op = {f: v for f, v in full.items() if f != field}
        with job.transaction() as tx, pytest.raises(InvalidArgument, match=f"missing '{field}'"):
            ops.apply(tx, op)
    with job.transaction() as tx:
        ops.apply(tx, {f: full[f] for f in ("op", "state", "key", *spec.fields)})


@pytest.mark.parametrize("name", STATE_OPS)
def test_the_kinds_that_take_an_operation_are_the_tables(job, name):
    spec = OPS[name]
    for kind, extra in KINDS.items():
        job.register_state(StateDescriptor(kind, kind, **extra))
        op = {"op": name, "state": kind, "key": "k", "user_key": "u", "value": _value(name, kind)}
        with job.transaction() as tx:
            if kind in spec.kinds:
                ops.apply(tx, op)
            else:
                with pytest.raises(WrongStateKind):
                    ops.apply(tx, op)
