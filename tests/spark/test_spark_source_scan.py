"""The scan endpoint over HTTP, on both backends: a keyed state as Arrow pages (what the Spark data
source reads), every kind, paged by rows and bytes, point reads by key, bad input as 4xx."""

import json

import pyarrow as pa
import pytest

pytestmark = [pytest.mark.http]

ARROW = "application/vnd.apache.arrow.stream"
NEXT = b"statehouse.next_cursor"

STATES = {
    "total": {"kind": "reducing", "function": "sum", "value_type": "float64"},
    "mean": {"kind": "aggregating", "function": "avg", "value_type": "int64"},
    "seen": {"kind": "value"},  # untyped: JSON text
    "items": {"kind": "list", "value_type": "string", "ttl": {"ttl_ms": 3_600_000}},
    "tags": {"kind": "map", "value_type": "int64"},
    "by_id": {"kind": "value", "key_type": "long", "value_type": "int64"},
}


@pytest.fixture
def job(http, job_name):
    http.put(f"/jobs/{job_name}", json={"max_parallelism": 16}).raise_for_status()
    for name, body in STATES.items():
        http.put(f"/jobs/{job_name}/states/{name}", json=body).raise_for_status()
    ops = []
    for i in range(40):
        key = f"k{i}"
        ops += [
            {"op": "add", "state": "total", "key": key, "value": i / 2},
            {"op": "add", "state": "mean", "key": key, "value": i},
            {"op": "add", "state": "mean", "key": key, "value": i + 2},
            {"op": "put", "state": "seen", "key": key, "value": {"n": i, "b": [True, None]}},
            {"op": "put", "state": "seen", "key": key, "ns": "other", "value": "x" * i},
            {"op": "add", "state": "items", "key": key, "values": [f"a{i}", f"b{i}"]},
            {"op": "map_put", "state": "tags", "key": key, "user_key": "", "value": i},
            {"op": "map_put", "state": "tags", "key": key, "user_key": f"u{i}", "value": -i},
            {"op": "put", "state": "by_id", "key": i - 20, "value": i * 1000},
        ]
    ops.append({"op": "map_put", "state": "tags", "key": "", "user_key": "e", "value": 7})  # a key of no bytes
    ops.append({"op": "put", "state": "by_id", "key": 256, "value": 1})  # stored key ending in a zero byte
    http.post(f"/jobs/{job_name}/batch", json={"ops": ops}).raise_for_status()
    return job_name


def scan(http, job, state, **params):
    """Every page, following the cursor: (the rows as one table, how many pages)."""
    tables, pages, cursor = [], 0, None
    while True:
        r = http.get(f"/jobs/{job}/states/{state}/scan", params={**params, **({"cursor": cursor} if cursor else {})})
        assert r.status_code == 200, r.text
        assert r.headers["content-type"] == ARROW
        table = pa.ipc.open_stream(r.content).read_all()
        tables.append(table.replace_schema_metadata(None))
        pages += 1
        cursor = (table.schema.metadata or {}).get(NEXT)
        if cursor is None:
            return pa.concat_tables(tables), pages
        cursor = cursor.decode()


def test_every_kind_reads_back_typed(http, job):
    total, _ = scan(http, job, "total")
    assert total.schema.names == ["key", "ns", "value", "key_group"]
    assert total.schema.field("value").type == pa.float64()
    assert total.schema.field("key_group").type == pa.int32()
    assert dict(zip(total["key"].to_pylist(), total["value"].to_pylist(), strict=True)) == {
        f"k{i}": i / 2 for i in range(40)
    }
    groups = total["key_group"].to_pylist()
    assert groups == sorted(groups)  # key-group order

    mean, _ = scan(http, job, "mean")
    assert mean.schema.field("value").type == pa.float64()  # avg of int64: float64
    assert dict(zip(mean["key"].to_pylist(), mean["value"].to_pylist(), strict=True)) == {
        f"k{i}": i + 1.0 for i in range(40)
    }

    seen, _ = scan(http, job, "seen")
    assert seen.schema.field("value").type == pa.string()  # untyped: JSON text
    rows = {
        (k, ns): json.loads(v) for k, ns, v in zip(*(seen[c].to_pylist() for c in ("key", "ns", "value")), strict=True)
    }
    assert rows == {
        **{(f"k{i}", ""): {"n": i, "b": [True, None]} for i in range(40)},
        **{(f"k{i}", "other"): "x" * i for i in range(40)},
    }

    items, _ = scan(http, job, "items")
    assert items.schema.names == ["key", "ns", "value", "key_group", "expires_at"]
    assert items.schema.field("value").type == pa.list_(pa.string())
    assert items.schema.field("expires_at").type == pa.list_(pa.int64())
    assert {r["key"]: r["value"] for r in items.to_pylist()} == {f"k{i}": [f"a{i}", f"b{i}"] for i in range(40)}
    assert all(len(r["expires_at"]) == 2 and r["expires_at"][0] > 1_700_000_000_000 for r in items.to_pylist())

    tags, _ = scan(http, job, "tags")
    assert tags.schema.names == ["key", "ns", "user_key", "value", "key_group"]
    assert {(r["key"], r["user_key"]): r["value"] for r in tags.to_pylist()} == {
        **{(f"k{i}", ""): i for i in range(40)},
        **{(f"k{i}", f"u{i}"): -i for i in range(40)},
        ("", "e"): 7,
    }

    by_id, _ = scan(http, job, "by_id")
    assert by_id.schema.field("key").type == pa.int64()
    assert dict(zip(by_id["key"].to_pylist(), by_id["value"].to_pylist(), strict=True)) == {
        **{i - 20: i * 1000 for i in range(40)},
        256: 1,
    }


@pytest.mark.parametrize("state", ["tags", "seen", "items"])
def test_pages_resume_where_they_ended(http, job, state):
    whole, pages = scan(http, job, state)
    assert pages == 1
    by_rows, pages = scan(http, job, state, limit=3)
    assert pages == -(-whole.num_rows // 3) and by_rows.equals(whole)
    by_bytes, pages = scan(http, job, state, max_bytes=1)  # one stored record per page
    assert pages == whole.num_rows and by_bytes.equals(whole)


def test_a_key_group_range_reads_those_groups_only(http, job):
    whole, _ = scan(http, job, "tags")
    part, _ = scan(http, job, "tags", key_group_start=3, key_group_end=9, limit=5)
    assert part.to_pylist() == [r for r in whole.to_pylist() if 3 <= r["key_group"] <= 9]
    assert 0 < part.num_rows < whole.num_rows


def test_point_reads_by_key(http, job):
    seen, _ = scan(http, job, "seen", key=["k7", "nobody", "k30"])
    assert sorted(zip(seen["key"].to_pylist(), seen["ns"].to_pylist(), strict=True)) == [
        ("k30", ""),
        ("k30", "other"),
        ("k7", ""),
        ("k7", "other"),
    ]
    paged, pages = scan(http, job, "seen", key=["k7", "nobody", "k30"], limit=1)
    assert pages >= 4 and sorted(paged.to_pylist(), key=str) == sorted(seen.to_pylist(), key=str)
    tags, _ = scan(http, job, "tags", key=["k5"])
    assert {r["user_key"]: r["value"] for r in tags.to_pylist()} == {"": 5, "u5": -5}
    by_id, _ = scan(http, job, "by_id", key=["-3"])
    assert by_id.to_pylist()[0]["value"] == 17_000
    assert scan(http, job, "by_id", key=["256"])[0]["value"].to_pylist() == [1]
    assert scan(http, job, "tags", key=[""])[0]["value"].to_pylist() == [7]


def test_scans_are_counted_per_row(http, job, server):
    import httpx

    def counted() -> float:
        text = httpx.get(server.url + "/metrics").text
        line = [x for x in text.splitlines() if x.startswith("statehouse_state_operations_total") and 'op="scan"' in x]
        return sum(float(x.rsplit(" ", 1)[1]) for x in line if 'kind="map"' in x)

    before = counted()
    scan(http, job, "tags", key=["k5"])
    assert counted() - before == 2  # the key's two entries, nothing else read


@pytest.mark.parametrize(
    ("params", "status", "code"),
    [
        ({"cursor": "%%%"}, 422, "invalid_argument"),
        ({"cursor": "AAE"}, 422, "invalid_argument"),  # decodes, but is no position
        ({"key_group_start": 9, "key_group_end": 3}, 422, "invalid_argument"),
        ({"key_group_end": 16}, 422, "invalid_argument"),
        ({"limit": 0}, 422, "validation_error"),
    ],
)
def test_bad_parameters_are_4xx(http, job, params, status, code):
    r = http.get(f"/jobs/{job}/states/tags/scan", params=params)
    assert r.status_code == status, r.text
    assert r.json()["code"] == code


def test_unknown_state_and_bad_key(http, job):
    r = http.get(f"/jobs/{job}/states/nope/scan")
    assert r.status_code == 404 and r.json()["code"] == "state_not_found"
    r = http.get(f"/jobs/{job}/states/by_id/scan", params={"key": "x"})
    assert r.status_code == 422 and r.json()["code"] == "invalid_key"


def test_sizes_per_key_group(http, job):
    tags = http.get(f"/jobs/{job}/states/tags/sizes").json()
    whole, _ = scan(http, job, "tags")
    assert tags["state"] == "tags"
    groups = tags["key_groups"]
    assert [g["key_group"] for g in groups] == sorted(set(whole["key_group"].to_pylist()))
    assert sum(g["entries"] for g in groups) == whole.num_rows  # a map's entries count one each
    assert all(g["bytes"] > 0 for g in groups)
    part = http.get(f"/jobs/{job}/states/tags/sizes", params={"key_group_start": 3, "key_group_end": 9}).json()
    assert part["key_groups"] == [g for g in groups if 3 <= g["key_group"] <= 9]
    r = http.get(f"/jobs/{job}/states/nope/sizes")
    assert r.status_code == 404 and r.json()["code"] == "state_not_found"
    r = http.get(f"/jobs/{job}/states/tags/sizes", params={"key_group_end": 99})
    assert r.status_code == 422 and r.json()["code"] == "invalid_argument"
