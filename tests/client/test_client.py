"""The Python client against two real replicas: routing, typed handles, batches, errors."""

import httpx
import pytest

from statehouse.client import (
    ClientConfig,
    Conflict,
    InvalidRequest,
    NotFound,
    StaleEpoch,
    StatehouseClient,
    Unavailable,
)
from statehouse.protocol.keygroups import KeyGroupRange, assign_to_key_group

pytestmark = [pytest.mark.http]


@pytest.fixture
def sh(two_replicas):
    with StatehouseClient([s.url for s in two_replicas]) as client:
        yield client


@pytest.fixture
def job(sh, job_name):
    return sh.create_job(job_name, max_parallelism=128)


def test_every_key_goes_to_its_owner(sh, job, two_replicas):
    counts = job.register("counts", "reducing", function="sum")
    keys = [f"user-{i}" for i in range(200)]
    with job.batch() as batch:
        for k in keys:
            batch.add("counts", k, 1)
    assert [counts.get(k) for k in keys] == [1] * 200
    owned = [KeyGroupRange.for_operator(128, 2, i) for i in range(2)]
    for index, server in enumerate(two_replicas):
        listed = httpx.get(f"{server.url}/v1/jobs/{job.name}/states/counts/keys", params={"limit": 1000}).json()
        assert all(item["key_group"] in owned[index] for item in listed["items"])
        assert {item["key"] for item in listed["items"]} == {
            k for k in keys if assign_to_key_group(k, "string", 128) in owned[index]
        }


def test_typed_handles(job):
    value = job.register("last", "value")
    items = job.register("items", "list")
    counts = job.register("item_counts", "map")
    spent = job.register("spent", "reducing", function="sum")
    mean = job.register("mean", "aggregating", function="avg")
    value.update("alice", {"item": "book"})
    assert job.value_state("last").value("alice") == {"item": "book"}
    items.add("alice", "book")
    items.add_all("alice", ["pen", "ink"])
    assert items.get("alice") == ["book", "pen", "ink"]
    assert items.get("nobody") == []
    counts.put_all("alice", {"book": 1, "pen": 2})
    counts.put("alice", "ink", 3)
    counts.remove("alice", "pen")
    assert counts.entries("alice") == {"book": 1, "ink": 3}
    assert counts.contains("alice", "ink") and not counts.contains("alice", "pen")
    assert counts.get("alice", "book") == 1
    spent.add_all("alice", [1.5, 2.5])
    mean.add_all("alice", [1, 2, 6])
    assert spent.get("alice") == 4.0 and mean.get("alice") == 3.0
    value.clear("alice")
    assert value.value("alice") is None
    with pytest.raises(InvalidRequest):
        job.list_state("last")


def test_map_handle_adds_to_entries(job):
    counts = job.register("item_counts", "map", function="sum")
    counts.add("alice", "book", 1)
    counts.add("alice", "book", 2)
    counts.add("alice", "pen", 5, ns="w")
    assert counts.entries("alice") == {"book": 3} and counts.get("alice", "pen", ns="w") == 5
    users = [f"user-{i}" for i in range(50)]  # spread over both replicas
    with job.batch() as batch:
        for i, user in enumerate(users):
            batch.map_add("item_counts", user, "book", i)
            batch.map_add("item_counts", user, "book", 1)
    assert [counts.get(user, "book") for user in users] == [i + 1 for i in range(50)]
    plain = job.register("plain", "map")
    with pytest.raises(Conflict, match="function"):  # a map registered without one cannot add
        plain.add("alice", "book", 1)


def test_int_keys_and_namespaces(job):
    windows = job.register("per_window", "reducing", function="count", key_type="long")
    for window in ("w1", "w1", "w2"):
        windows.add(1 << 40, "event", ns=window)
    assert windows.get(1 << 40, ns="w1") == 2 and windows.get(1 << 40, ns="w2") == 1
    with pytest.raises(InvalidRequest):
        windows.add("not-a-long", 1)


def test_errors_are_mapped(sh, job):
    job.register("v", "value")
    with pytest.raises(Conflict):
        job.register("v", "list")
    with pytest.raises(NotFound):
        job.value_state("missing")
    job.fence(5)
    with pytest.raises(StaleEpoch), job.batch(epoch=4) as batch:
        batch.put("v", "k", 1)
    with job.batch(epoch=5) as batch:
        batch.put("v", "k", 1)
    assert job.epoch() == 5


def test_misordered_replica_urls_are_put_in_replica_order(two_replicas, job_name):
    with StatehouseClient([two_replicas[1].url, two_replicas[0].url]) as swapped:
        job = swapped.create_job(job_name)  # learned from the replicas' GET /v1/topology first
        assert swapped.replicas.urls == [two_replicas[0].url, two_replicas[1].url]
        assert [info["replica_index"] for info in job.infos()] == [0, 1]


def test_job_finds_an_existing_job_and_never_creates_one(sh, two_replicas, job_name):
    with pytest.raises(NotFound, match="create_job"):
        sh.job(job_name)
    assert all(httpx.get(f"{s.url}/v1/jobs/{job_name}").status_code == 404 for s in two_replicas)
    created = sh.create_job(job_name, max_parallelism=256)
    assert sh.job(job_name).max_parallelism == created.max_parallelism == 256
    assert sh.create_job(job_name).max_parallelism == 256  # confirming needs no parallelism
    with pytest.raises(Conflict):
        sh.create_job(job_name, max_parallelism=128)


def test_job_missing_on_one_replica_names_it(sh, two_replicas, job_name):
    httpx.put(f"{two_replicas[0].url}/v1/jobs/{job_name}", json={"max_parallelism": 128}).raise_for_status()
    with pytest.raises(NotFound, match=two_replicas[1].url):
        sh.job(job_name)


def test_unreachable_replica_is_unavailable_after_retries():
    config = ClientConfig.of("http://127.0.0.1:9", retries=2, backoff=0.01, timeout=1)
    with StatehouseClient(config) as client, pytest.raises(Unavailable):
        client.job("j")


def test_operator_state_routes_by_subtask(job, two_replicas):
    for subtask in range(4):
        job.update_operator_list("source", subtask, "offsets", [subtask * 10])
    assert [job.operator_list("source", s, "offsets") for s in range(4)] == [[0], [10], [20], [30]]
    path = f"/v1/jobs/{job.name}/operators/source/subtasks/1/lists/offsets"
    assert httpx.get(two_replicas[1].url + path).status_code == 200
    assert httpx.get(two_replicas[0].url + path).status_code == 404


@pytest.mark.parametrize(
    "url", ["statehouse-0:8000", "ftp://h:1", "http://h:1/statehouse", "http://h:1?x=1", "http://h:port", "http://"]
)
def test_a_replica_url_is_scheme_host_and_port(url):
    with pytest.raises(ValueError, match="replica URL"):
        ClientConfig.of(["http://ok:8000", url])


def test_a_trailing_slash_is_fine():
    assert ClientConfig.of("http://a:8000/, https://b").urls == ("http://a:8000/", "https://b")
