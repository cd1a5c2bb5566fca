"""What the Spark data source's tests write and read: every kind of state filled through the
columnar client with the oracle of what each holds, operator state, and the reader's options."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from statehouse.client import StatehouseClient

KEYS = 300


def read(spark, urls, job, state, **options):
    reader = spark.read.format(options.pop("format", "statehouse")).option("urls", ",".join(urls))
    reader = reader.option("job", job)
    if state is not None:
        reader = reader.option("state", state)
    for name, value in options.items():
        reader = reader.option(name, value)
    return reader.load()


STATES: dict[str, dict[str, Any]] = {
    "score": {"kind": "value", "value_type": "int64"},
    "note": {"kind": "value"},  # untyped: JSON text
    "recent": {"kind": "list", "value_type": "string", "ttl": {"ttl_ms": 3_600_000}},
    "counts": {"kind": "map", "value_type": "int64"},
    "spent": {"kind": "reducing", "function": "sum", "value_type": "float64"},
    "stats": {"kind": "aggregating", "function": "summary", "value_type": "float64"},
    "by_id": {"kind": "value", "key_type": "long", "value_type": "float64"},
}


def fill(urls, job) -> dict[str, Any]:
    """Write every state through the columnar client; the oracle of what each holds."""
    keys = [f"user-{i}" for i in range(KEYS)]
    with StatehouseClient(urls) as client:
        j = client.create_job(job, 32)
        for name, body in STATES.items():
            j.register(name, **body)
        columns = j.columns()
        columns.put("score", keys, list(range(KEYS)))
        columns.put("note", keys, [{"i": i, "tags": ["a"] * (i % 3)} for i in range(KEYS)])
        columns.put("note", keys[:10], ["other"] * 10, ns="campaign")
        columns.add("recent", keys, [[f"item-{i}", f"item-{i + 1}"] for i in range(KEYS)])
        columns.map_put("counts", keys * 2, ["a"] * KEYS + ["b"] * KEYS, list(range(2 * KEYS)))
        columns.add("spent", keys + keys, [float(i) for i in range(2 * KEYS)])
        columns.add("stats", keys + keys, [float(i) for i in range(2 * KEYS)])
        columns.put("by_id", list(range(-50, 50)), [i / 4 for i in range(100)])
    return {
        "score": {(k, ""): i for i, k in enumerate(keys)},
        "note": {
            **{(k, ""): {"i": i, "tags": ["a"] * (i % 3)} for i, k in enumerate(keys)},
            **{(k, "campaign"): "other" for k in keys[:10]},
        },
        "recent": {(k, ""): [f"item-{i}", f"item-{i + 1}"] for i, k in enumerate(keys)},
        "counts": {
            **{(k, "", "a"): i for i, k in enumerate(keys)},
            **{(k, "", "b"): KEYS + i for i, k in enumerate(keys)},
        },
        "spent": {(k, ""): float(i + KEYS + i) for i, k in enumerate(keys)},
        "stats": {
            (k, ""): {
                "count": 2,
                "sum": float(2 * i + KEYS),
                "min": float(i),
                "max": float(i + KEYS),
                "avg": i + KEYS / 2,
            }
            for i, k in enumerate(keys)
        },
        "by_id": {(k, ""): (k + 50) / 4 for k in range(-50, 50)},
    }


def as_dict(rows, state: str) -> dict:
    if state == "counts":
        return {(r["key"], r["ns"], r["user_key"]): r["value"] for r in rows}
    if state == "note":
        return {(r["key"], r["ns"]): json.loads(r["value"]) for r in rows}
    if state == "stats":
        return {(r["key"], r["ns"]): r["value"].asDict() for r in rows}
    return {(r["key"], r["ns"]): r["value"] for r in rows}


def first_line(raised: pytest.ExceptionInfo) -> str:
    return str(raised.value).splitlines()[0]


def fill_operator(urls, job) -> set[tuple]:
    """An operator's split lists on five subtasks, a union list and a broadcast state (written to
    every replica, as broadcast state is the same on each), plus another operator's; the rows the
    operator reads as: (state, mode, subtask, position, key, value)."""
    expected: set[tuple] = set()
    with StatehouseClient(urls) as client:
        j = client.create_job(job, 32)
        for subtask in range(5):
            offsets = [{"partition": subtask, "offset": 10 * subtask + i} for i in range(subtask + 1)]
            j.update_operator_list("source", subtask, "offsets", offsets)
            expected |= {("offsets", "split", subtask, i, None, json.dumps(v)) for i, v in enumerate(offsets)}
        j.update_operator_list("source", 1, "seen", ["a", "b"], mode="union")
        expected |= {("seen", "union", 1, i, None, json.dumps(v)) for i, v in enumerate(["a", "b"])}
        j.update_operator_list("sink", 0, "offsets", [1])
    for url in urls:
        for key, value in {"threshold": 10, "mode": "strict"}.items():
            httpx.put(f"{url}/v1/jobs/{job}/operators/source/broadcast/rules/entries/{key}", json={"value": value})
    expected |= {
        ("rules", "broadcast", None, None, "threshold", "10"),
        ("rules", "broadcast", None, None, "mode", '"strict"'),
    }
    return expected
