"""Every keyed-state and operator-state endpoint over real HTTP."""

from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

pytestmark = [pytest.mark.http]


@pytest.fixture
def job(http, job_name):
    assert http.put(f"/jobs/{job_name}", json={"max_parallelism": 128}).status_code == 201
    return f"/jobs/{job_name}"


def register(http, job, state, **descriptor):
    r = http.put(f"{job}/states/{state}", json=descriptor)
    assert r.status_code == 201, r.text
    return r.json()


def test_jobs_lifecycle(http, job_name):
    r = http.put(f"/jobs/{job_name}", json={"max_parallelism": 256})
    assert r.status_code == 201
    assert r.json() == {
        "job": job_name,
        "max_parallelism": 256,
        "key_group_range": [0, 255],
        "replica_index": 0,
        "replica_count": 1,
        "states": [],
        "epoch": 0,
        "committed_epoch": 0,
        "committed_batch": None,  # no micro-batch committed yet
        "topology_version": 1,
    }
    assert http.put(f"/jobs/{job_name}", json={"max_parallelism": 256}).status_code == 200
    assert http.put(f"/jobs/{job_name}").status_code == 200  # confirm without a body
    assert http.get(f"/jobs/{job_name}").json()["max_parallelism"] == 256
    assert job_name in [j["job"] for j in _all_pages(http, "/jobs", limit=2)]
    assert http.delete(f"/jobs/{job_name}").status_code == 204
    assert http.get(f"/jobs/{job_name}").status_code == 404
    default = http.put(f"/jobs/{job_name}-default")
    assert default.status_code == 201 and default.json()["max_parallelism"] == 128


def _all_pages(http, path, **params):
    items, cursor = [], None
    for _ in range(1000):
        r = http.get(path, params={**params, **({"cursor": cursor} if cursor else {})})
        assert r.status_code == 200, r.text
        items += r.json()["items"]
        cursor = r.json()["next_cursor"]
        if cursor is None:
            return items
    raise AssertionError("paging did not end")


def test_state_descriptors(http, job):
    d = register(http, job, "avg", kind="aggregating", function="avg", ttl={"ttl_ms": 60000})
    assert d["ttl"]["update_type"] == "on_create_and_write"
    register(http, job, "counts", kind="map", key_type="long")
    assert http.put(f"{job}/states/counts", json={"kind": "map", "key_type": "long"}).status_code == 200
    assert http.get(f"{job}/states/avg").json()["function"] == "avg"
    assert [s["name"] for s in _all_pages(http, f"{job}/states", limit=1)] == ["avg", "counts"]
    assert http.get(job).json()["states"] == ["avg", "counts"]
    assert http.delete(f"{job}/states/avg").status_code == 204
    assert http.get(f"{job}/states/avg").status_code == 404


def test_value_state(http, job):
    register(http, job, "v", kind="value")
    key = f"{job}/states/v/keys/alice"
    assert http.get(key).status_code == 404
    assert http.put(key, json={"value": {"n": 1, "tags": ["a"]}}).status_code == 204
    assert http.get(key).json() == {"value": {"n": 1, "tags": ["a"]}}
    assert http.delete(key).status_code == 204
    assert http.get(key).status_code == 404


def test_value_default_and_int_keys(http, job):
    register(http, job, "v", kind="value", key_type="int", default=0)
    assert http.get(f"{job}/states/v/keys/42").json() == {"value": 0}
    http.put(f"{job}/states/v/keys/-7", json={"value": 3})
    assert http.get(f"{job}/states/v/keys/-7").json() == {"value": 3}
    assert http.get(f"{job}/states/v/keys/x").status_code == 422


def test_list_state(http, job):
    register(http, job, "l", kind="list")
    key = f"{job}/states/l/keys/k"
    assert http.post(key + "/add", json={"value": 1}).status_code == 204
    assert http.post(key + "/add", json={"values": [2, 3]}).status_code == 204
    assert http.get(key).json() == {"value": [1, 2, 3]}
    assert http.put(key, json={"value": ["x"]}).status_code == 204
    assert http.get(key).json() == {"value": ["x"]}


def test_map_state(http, job):
    register(http, job, "m", kind="map")
    key = f"{job}/states/m/keys/k"
    for i in range(5):
        assert http.put(f"{key}/entries/item{i}", json={"value": i}).status_code == 204
    assert http.get(f"{key}/entries/item3").json() == {"value": 3}
    assert http.get(f"{key}/entries/none").status_code == 404
    assert http.delete(f"{key}/entries/item3").status_code == 204
    entries = _all_pages(http, f"{key}/entries", limit=2)
    assert entries == [{"key": f"item{i}", "value": i} for i in (0, 1, 2, 4)]
    assert http.get(key).json() == {"value": {"item0": 0, "item1": 1, "item2": 2, "item4": 4}}
    assert http.put(key, json={"value": {"only": True}}).status_code == 204
    assert http.get(key).json() == {"value": {"only": True}}


def test_reducing_and_aggregating(http, job):
    register(http, job, "total", kind="reducing", function="sum")
    register(http, job, "mean", kind="aggregating", function="avg")
    for v in (1, 2, 6):
        http.post(f"{job}/states/total/keys/u/add", json={"value": v})
    http.post(f"{job}/states/mean/keys/u/add", json={"values": [1, 2, 6]})
    assert http.get(f"{job}/states/total/keys/u").json() == {"value": 9}
    assert http.get(f"{job}/states/mean/keys/u").json() == {"value": 3.0}
    assert http.put(f"{job}/states/total/keys/u", json={"value": 1}).status_code == 409


def test_add_get_answers_the_result_after_the_add(http, job):
    register(http, job, "total", kind="reducing", function="sum")
    register(http, job, "tags", kind="list")
    assert http.post(f"{job}/states/total/keys/u/add_get", json={"value": 2}).json() == {"value": 2}
    assert http.post(f"{job}/states/total/keys/u/add_get", json={"values": [3, 4]}).json() == {"value": 9}
    assert http.get(f"{job}/states/total/keys/u").json() == {"value": 9}
    refused = http.post(f"{job}/states/tags/keys/u/add_get", json={"value": "x"})
    assert refused.status_code == 409 and refused.json()["code"] == "wrong_state_kind"
    empty = http.post(f"{job}/states/total/keys/u/add_get", json={"values": []})
    assert empty.status_code == 422 and "at least one value" in empty.json()["detail"]
    assert http.get(f"{job}/states/total/keys/u").json() == {"value": 9}


def test_map_entry_add(http, job):
    register(http, job, "item_counts", kind="map", function="sum")
    key = f"{job}/states/item_counts/keys/alice"
    assert http.post(f"{key}/entries/book/add", json={"value": 1}).status_code == 204
    assert http.post(f"{key}/entries/book/add", json={"values": [2, 3]}).status_code == 204
    assert http.post(f"{key}/entries/pen/add", params={"ns": "w"}, json={"value": 1.5}).status_code == 204
    assert http.get(f"{key}/entries/book").json() == {"value": 6}
    assert http.get(key).json() == {"value": {"book": 6}}
    assert http.get(key, params={"ns": "w"}).json() == {"value": {"pen": 1.5}}
    bad = http.post(f"{key}/entries/book/add", json={"value": "x"})
    assert bad.status_code == 422 and bad.json()["code"] == "invalid_value"
    assert http.post(f"{key}/entries/book/add", json={}).status_code == 422  # neither value nor values
    assert http.get(f"{key}/entries/book").json() == {"value": 6}


def test_map_entry_add_needs_a_function(http, job):
    register(http, job, "m", kind="map")
    register(http, job, "r", kind="reducing", function="sum")
    plain = http.post(f"{job}/states/m/keys/k/entries/a/add", json={"value": 1})
    assert plain.status_code == 409 and plain.json()["code"] == "wrong_state_kind"
    assert "'function'" in plain.json()["detail"]
    wrong = http.post(f"{job}/states/r/keys/k/entries/a/add", json={"value": 1})
    assert wrong.status_code == 409 and wrong.json()["code"] == "wrong_state_kind"
    avg = http.put(f"{job}/states/x", json={"kind": "map", "function": "avg"})
    assert avg.status_code == 422 and avg.json()["code"] == "invalid_argument"
    # The map gains a function (200: compatible), keeps its entries, and may then be added to.
    http.put(f"{job}/states/m/keys/k/entries/a", json={"value": 10})
    assert http.put(f"{job}/states/m", json={"kind": "map", "function": "count"}).status_code == 200
    assert http.post(f"{job}/states/m/keys/k/entries/a/add", json={"value": "any"}).status_code == 204
    assert http.get(f"{job}/states/m/keys/k/entries/a").json() == {"value": 11}
    changed = http.put(f"{job}/states/m", json={"kind": "map", "function": "sum"})
    assert changed.status_code == 409 and changed.json()["code"] == "incompatible_state"


def test_concurrent_map_entry_adds_lose_nothing(server, http, job):
    """Two clients adding to one entry at once: each add is atomic on the server."""
    register(http, job, "item_counts", kind="map", function="sum")
    entry = f"{job}/states/item_counts/keys/alice/entries/book"
    adds = 500  # per client, interleaved with the other's

    def add_many() -> None:
        with httpx.Client(base_url=server.url + "/v1", timeout=30) as client:  # a connection of its own
            for _ in range(adds):
                r = client.post(f"{entry}/add", json={"value": 1})
                assert r.status_code == 204, r.text

    with ThreadPoolExecutor(2) as pool:
        for future in [pool.submit(add_many) for _ in range(2)]:
            future.result()  # re-raises a thread's failure
    assert http.get(entry).json() == {"value": 2 * adds}


def test_namespaces(http, job):
    register(http, job, "v", kind="value")
    http.put(f"{job}/states/v/keys/k", json={"value": "void"})
    http.put(f"{job}/states/v/keys/k", params={"ns": "w1"}, json={"value": "window"})
    assert http.get(f"{job}/states/v/keys/k").json()["value"] == "void"
    assert http.get(f"{job}/states/v/keys/k", params={"ns": "w1"}).json()["value"] == "window"
    assert [k["key"] for k in _all_pages(http, f"{job}/states/v/keys", ns="w1")] == ["k"]


def test_key_listing_pages_and_key_group_filter(http, job):
    register(http, job, "v", kind="value")
    keys = {f"user-{i}" for i in range(25)}
    r = http.post(f"{job}/batch", json={"ops": [{"op": "put", "state": "v", "key": k, "value": 1} for k in keys]})
    assert r.status_code == 200
    listed = _all_pages(http, f"{job}/states/v/keys", limit=7)
    assert {i["key"] for i in listed} == keys and len(listed) == 25
    assert [i["key_group"] for i in listed] == sorted(i["key_group"] for i in listed)
    kg = listed[0]["key_group"]
    only = _all_pages(http, f"{job}/states/v/keys", key_group=kg)
    assert {i["key"] for i in only} == {i["key"] for i in listed if i["key_group"] == kg}


def test_operator_list_state(http, job):
    path = f"{job}/operators/source/subtasks/0/lists/offsets"
    assert http.get(path).status_code == 404
    assert http.put(path, json={"value": [1, 2]}).status_code == 204
    assert http.post(path, json={"value": 3}).status_code == 204
    assert http.get(path).json() == {"value": [1, 2, 3], "mode": "split"}
    union = f"{job}/operators/source/subtasks/1/lists/all"
    assert http.post(union, params={"mode": "union"}, json={"values": ["a"]}).status_code == 204
    assert http.get(union).json() == {"value": ["a"], "mode": "union"}
    assert http.post(union, params={"mode": "split"}, json={"value": "b"}).status_code == 409
    assert http.delete(path).status_code == 204
    assert http.get(path).status_code == 404


def test_broadcast_state(http, job):
    base = f"{job}/operators/rules/broadcast/config/entries"
    assert http.put(f"{base}/threshold", json={"value": 10}).status_code == 204
    assert http.put(f"{base}/mode", json={"value": "strict"}).status_code == 204
    assert http.get(f"{base}/threshold").json() == {"value": 10}
    assert _all_pages(http, base, limit=1) == [{"key": "mode", "value": "strict"}, {"key": "threshold", "value": 10}]
    assert http.delete(f"{base}/mode").status_code == 204
    assert http.get(f"{base}/mode").status_code == 404


def test_describe_operator(http, job):
    """What a reader lists before it reads an operator's state: its lists (mode, the subtasks
    holding elements) and broadcast names; another operator's (one whose name it prefixes) not."""
    assert http.get(f"{job}/operators/source").json() == {"lists": [], "broadcast": []}
    http.put(f"{job}/operators/source/subtasks/3/lists/offsets", json={"value": [1]})
    http.put(f"{job}/operators/source/subtasks/0/lists/offsets", json={"value": [2]})
    http.post(f"{job}/operators/source/subtasks/1/lists/all", params={"mode": "union"}, json={"value": "a"})
    http.put(f"{job}/operators/source/subtasks/2/lists/gone", json={"value": []})  # empty: nothing stored
    http.put(f"{job}/operators/source/broadcast/rules/entries/x", json={"value": 1})
    http.put(f"{job}/operators/sourcer/subtasks/0/lists/other", json={"value": [1]})
    http.put(f"{job}/operators/sourcer/broadcast/other/entries/x", json={"value": 1})
    assert http.get(f"{job}/operators/source").json() == {
        "lists": [
            {"name": "all", "mode": "union", "subtasks": [1]},
            {"name": "offsets", "mode": "split", "subtasks": [0, 3]},
        ],
        "broadcast": ["rules"],
    }
    bad = http.get(f"{job}/operators/bad name")
    assert bad.status_code == 422 and bad.json()["code"] == "invalid_name"


def test_ttl_over_http(http, job):
    register(http, job, "seen", kind="value", ttl={"ttl_ms": 1})
    http.put(f"{job}/states/seen/keys/k", json={"value": 1})
    import time

    time.sleep(0.01)
    assert http.get(f"{job}/states/seen/keys/k").status_code == 404


def test_writer_epoch_fences_stale_batches(http, job):
    register(http, job, "v", kind="value")
    put = {"op": "put", "state": "v", "key": "k"}
    assert http.post(f"{job}/batch", json={"ops": [{**put, "value": 0}], "epoch": 0}).status_code == 200
    fenced = http.post(f"{job}/fence", json={"epoch": 3}).json()
    assert (fenced["epoch"], fenced["committed_epoch"], fenced["rescale_version"]) == (3, 0, None)
    assert http.post(f"{job}/fence", json={"epoch": 2}).json()["epoch"] == 3  # never lowered
    stale = http.post(f"{job}/batch", json={"ops": [{**put, "value": 1}], "epoch": 2})
    assert stale.status_code == 409 and stale.json()["code"] == "stale_epoch" and stale.json()["epoch"] == 3
    assert http.post(f"{job}/batch", json={"ops": [{**put, "value": 2}], "epoch": 3}).status_code == 200
    assert http.post(f"{job}/batch", json={"ops": [{**put, "value": 9}]}).status_code == 200  # no epoch: unfenced
    assert http.get(f"{job}/states/v/keys/k").json() == {"value": 9}
    assert http.get(job).json()["epoch"] == 3
