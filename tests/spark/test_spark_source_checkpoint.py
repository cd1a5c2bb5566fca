"""format("statehouse").option("checkpoint", N) on real local Spark, against two real replicas per
backend whose checkpoints go to real S3 (SeaweedFS): a checkpoint's and a savepoint's keyed state
(every kind; RocksDB's checkpoints incremental, its savepoints full, the heap's checkpoints a changelog) and
operator state read straight from storage (no replica involved) equal the live read at that moment
and a plain-Python oracle, stay what they were after the live state moves on, a one-key filter
reads one key group of one part, a million keys read back exactly, and refusals (an unknown
checkpoint or state, storage down) are one error whose first line says what to fix."""

from __future__ import annotations

import json

import pytest

from statehouse.client import StatehouseClient
from statehouse.client.coordinator import CheckpointCoordinator
from statehouse.client.datasource import StatehouseDataSource, register
from tests.support.server import start_replica_set
from tests.support.source_data import STATES, as_dict, fill, fill_operator, first_line, read

pytestmark = [pytest.mark.http, pytest.mark.spark]


# The heap deployment's checkpoints are a changelog whose base is the full format that the RocksDB
# deployment's savepoints also are (tests/engine/test_heap_changelog.py reads deltas through the
# same reader): make test runs the RocksDB deployment (both formats), make test-long both.
@pytest.fixture(scope="module", params=[pytest.param("heap", marks=pytest.mark.long), "rocksdb"])
def deployment(request, tmp_path_factory, s3_server):
    """Two replicas on one backend; their checkpoints go to a fresh S3 prefix (RocksDB's are
    incremental). Yields (urls, checkpoint storage, backend)."""
    import uuid

    if s3_server._process is None:
        s3_server.start()
    location = f"s3://{s3_server.bucket}/{uuid.uuid4().hex}"
    env = {
        "STATEHOUSE_BACKEND": request.param,
        "STATEHOUSE_CHECKPOINT_DIR": location,
        "STATEHOUSE_S3_ENDPOINT_URL": s3_server.endpoint,
    }
    workdirs = [tmp_path_factory.mktemp(f"chk-source-{request.param}-{i}") for i in range(2)]
    servers = []
    try:
        servers = start_replica_set(workdirs, env)
        yield [s.url for s in servers], location, request.param
    finally:
        for server in servers:
            server.stop()


@pytest.fixture(scope="module")
def source(spark):
    register(spark)
    return spark


def from_checkpoint(spark, job, checkpoint, storage, endpoint, **options):
    """A checkpoint read: no replica URL among its options."""
    reader = spark.read.format("statehouse").option("job", job).option("checkpoint", str(checkpoint))
    reader = reader.option("checkpoint_storage", storage).option("s3_endpoint_url", endpoint)
    for name, value in options.items():
        reader = reader.option(name, value)
    return reader.load()


def rows(df) -> list[tuple]:
    return sorted_rows(df.collect())


def sorted_rows(collected) -> list[tuple]:
    return sorted((tuple(r) for r in collected), key=repr)


def checkpoint_options(job, checkpoint, storage, endpoint, **options) -> dict[str, str]:
    given = {"job": job, "checkpoint": str(checkpoint), "checkpoint_storage": storage, "s3_endpoint_url": endpoint}
    return {**given, **options}


def formats(job, checkpoint, storage, endpoint) -> set[str]:
    """The keyed formats of a snapshot's parts ("full", "incremental" or "changelog")."""
    from statehouse.client.datasource.checkpoint import CheckpointOptions, snapshot_parts

    parsed = CheckpointOptions.parse(checkpoint_options(job, checkpoint, storage, endpoint, state="x"))
    return {part.metadata.format for part in snapshot_parts(parsed)}


def test_keyed_state_from_a_checkpoint_and_a_savepoint(source, deployment, s3_server):
    """Every kind reads from a checkpoint as the live read does at that moment (same schema, rows,
    key groups and expiries) and as the oracle; after the live state moves on, the checkpoint
    stays what it was and a savepoint holds the new state."""
    urls, storage, backend = deployment
    job, endpoint = "keyed", s3_server.endpoint
    expected = fill(urls, job)
    live = {state: read(source, urls, job, state) for state in STATES}
    at_checkpoint = {state: rows(df) for state, df in live.items()}
    with StatehouseClient(urls) as client:
        j = client.job(job)
        checkpoint = CheckpointCoordinator(j).checkpoint().checkpoint_id
        assert formats(job, checkpoint, storage, endpoint) == {"incremental" if backend == "rocksdb" else "changelog"}
        for state in STATES:
            found = from_checkpoint(source, job, checkpoint, storage, endpoint, state=state, partitions_per_replica=3)
            assert found.schema == live[state].schema, state
            assert found.rdd.getNumPartitions() == 6  # one per part and key-group sub-range
            collected = found.collect()
            assert sorted_rows(collected) == at_checkpoint[state], state
            assert as_dict(collected, state) == expected[state], state

        j.columns().put("score", ["user-0", "user-new"], [-1, 5])
        savepoint = CheckpointCoordinator(j).savepoint().checkpoint_id
    assert formats(job, savepoint, storage, endpoint) == {"full"}
    assert rows(from_checkpoint(source, job, checkpoint, storage, endpoint, state="score")) == at_checkpoint["score"]
    saved = as_dict(from_checkpoint(source, job, savepoint, storage, endpoint, state="score").collect(), "score")
    assert saved == {**expected["score"], ("user-0", ""): -1, ("user-new", ""): 5}
    for state in ("recent", "counts", "stats"):
        found = from_checkpoint(source, job, savepoint, storage, endpoint, state=state)
        assert as_dict(found.collect(), state) == expected[state], state


def test_a_checkpoint_read_that_does_not_say_how_many_partitions_makes_enough_for_the_parallelism(
    source, deployment, s3_server
):
    """Without ``partitions_per_replica``, each part's key groups are split for the session's default
    parallelism (what register() records), every key group read once."""
    urls, storage, _backend = deployment
    job = "default-partitions"
    fill(urls, job)
    with StatehouseClient(urls) as client:
        checkpoint = CheckpointCoordinator(client.job(job)).checkpoint().checkpoint_id
    options = checkpoint_options(job, checkpoint, storage, s3_server.endpoint, state="score")
    for parallelism, planned in [(None, 2), (6, 6), (5, 6)]:
        data_source = type("Source", (StatehouseDataSource,), {"parallelism": parallelism})(options)
        partitions = data_source.reader(data_source.schema()).partitions()
        assert len(partitions) == planned, parallelism
        assert sorted(g for p in partitions for g in range(p.start, p.end + 1)) == list(range(32))


def test_a_one_key_filter_reads_one_key_group_of_one_part(source, deployment, s3_server):
    """A key filter plans one partition per key's key group, which reads that key group's range of
    the part holding it (a full part: the header and one section) and answers the key's rows."""
    from pyspark.sql.datasource import EqualTo, In

    from statehouse.client.datasource.checkpoint import part_records
    from statehouse.protocol.keygroups import KeyGroupRange, assign_to_key_group

    urls, storage, _backend = deployment
    job, endpoint = "one-key", s3_server.endpoint
    expected = fill(urls, job)
    with StatehouseClient(urls) as client:
        checkpoint = CheckpointCoordinator(client.job(job)).checkpoint().checkpoint_id
    options = checkpoint_options(job, checkpoint, storage, endpoint, state="score")
    data_source = StatehouseDataSource(options)
    reader = data_source.reader(data_source.schema())
    assert list(reader.pushFilters([EqualTo(("key",), "user-7")])) == []
    (partition,) = reader.partitions()
    group = assign_to_key_group("user-7", "string", 32)
    assert (partition.start, partition.end, partition.keys) == (group, group, ["user-7"])
    found = [row for batch in reader.read(partition) for row in batch.to_pylist()]
    assert [(r["key"], r["value"], r["key_group"]) for r in found] == [("user-7", 7, group)]
    # What that partition read from storage: the key group's records, not the part's.
    part = reader.parts[partition.part]
    chunks = part_records(reader.options.open(), part, "score", KeyGroupRange(group, group))
    in_group = [primary for _groups, primaries, _s, _v in chunks for primary in primaries]
    assert len(in_group) == sum(1 for k, _ns in expected["score"] if assign_to_key_group(k, "string", 32) == group)
    assert len(in_group) < len(expected["score"]) // 8

    reader = data_source.reader(data_source.schema())
    list(reader.pushFilters([In(("key",), ("user-1", "user-200", "nobody"))]))
    assert sum(len(p.keys) for p in reader.partitions()) == 3
    df = from_checkpoint(source, job, checkpoint, storage, endpoint, state="score")
    assert [(r["key"], r["value"]) for r in df.filter("key = 'user-7'").collect()] == [("user-7", 7)]
    picked = df.filter(df.key.isin("user-1", "user-200", "nobody")).select("key", "value").collect()
    assert sorted(map(tuple, picked)) == [("user-1", 1), ("user-200", 200)]
    narrowed = {r["key"] for r in df.filter("key_group between 3 and 5").collect()}
    assert narrowed == {k for k, _ns in expected["score"] if 3 <= assign_to_key_group(k, "string", 32) <= 5}
    longs = from_checkpoint(source, job, checkpoint, storage, endpoint, state="by_id").filter("key = -3").collect()
    assert [(r["key"], r["value"]) for r in longs] == [(-3, 47 / 4)]


def test_operator_state_from_a_checkpoint_and_a_savepoint(source, deployment, s3_server):
    urls, storage, _backend = deployment
    job = "operators"
    expected = fill_operator(urls, job)
    with StatehouseClient(urls) as client:
        j = client.job(job)
        checkpoint = CheckpointCoordinator(j).checkpoint()
        live = rows(read(source, urls, job, None, operator="source"))
        assert live == sorted(expected, key=repr)
        by_id = from_checkpoint(source, job, checkpoint.checkpoint_id, storage, s3_server.endpoint, operator="source")
        assert by_id.columns == ["state", "mode", "subtask", "position", "key", "value"]
        assert rows(by_id) == live
        latest = from_checkpoint(source, job, "latest", storage, s3_server.endpoint, operator="source", state="seen")
        assert rows(latest) == [e for e in live if e[0] == "seen"]

        # The live state moves on; the checkpoint stays what it was, and a savepoint has the new state.
        j.update_operator_list("source", 6, "offsets", [{"partition": 6, "offset": 60}])
        after = sorted(
            [*expected, ("offsets", "split", 6, 0, None, json.dumps({"partition": 6, "offset": 60}))], key=repr
        )
        assert rows(read(source, urls, job, None, operator="source")) == after
        savepoint = CheckpointCoordinator(j).savepoint()
    assert rows(by_id) == live
    saved = from_checkpoint(source, job, savepoint.checkpoint_id, storage, s3_server.endpoint, operator="source")
    assert rows(saved) == after


def test_checkpoint_refusals_say_what_to_fix(source, deployment, s3_server):
    from pyspark.errors import AnalysisException

    urls, storage, _backend = deployment
    job = "refused"
    with StatehouseClient(urls) as client:
        client.create_job(job, 32).update_operator_list("source", 0, "offsets", [1])
        CheckpointCoordinator(client.job(job)).checkpoint()
    endpoint = s3_server.endpoint
    with pytest.raises(AnalysisException) as raised:
        from_checkpoint(source, job, 999, storage, endpoint, operator="source").collect()
    assert "has no completed checkpoint or savepoint 999" in first_line(raised)
    with pytest.raises(AnalysisException) as raised:
        from_checkpoint(source, job, "latest", storage, endpoint, state="score").collect()
    assert "has no state 'score'" in first_line(raised)
    with pytest.raises(AnalysisException) as raised:
        from_checkpoint(source, job, "soon", storage, endpoint, operator="source").collect()
    assert "a checkpoint or savepoint id, or 'latest'" in first_line(raised)
    s3_server.kill()
    try:
        with pytest.raises(AnalysisException) as raised:
            from_checkpoint(source, job, "latest", storage, endpoint, operator="source").collect()
        assert "storage" in first_line(raised).lower(), first_line(raised)
        with pytest.raises(AnalysisException) as raised:
            from_checkpoint(source, job, "latest", storage, endpoint, state="score").collect()
        assert "storage" in first_line(raised).lower(), first_line(raised)
    finally:
        s3_server.start()


def test_the_documented_checkpoint_read_runs_as_written(source, deployment, s3_server, capsys):
    """docs/spark.md's checkpoint block (marked for this test), against these replicas and S3."""
    from tests.support.docs_blocks import check_output, parse
    from tests.support.server import REPO

    urls, storage, _backend = deployment
    (block,) = [
        b for b in parse(REPO / "docs/spark.md") if b.marker == "spark" and "test_spark_source_checkpoint" in b.reason
    ]
    code = block.code.replace("http://sh-0:8000,http://sh-1:8000", ",".join(urls))
    code = code.replace("s3://checkpoints/prod", storage).replace("http://seaweedfs:8333", s3_server.endpoint)
    exec(compile(code, block.id, "exec"), {"__name__": "__main__"})
    check_output(block, capsys.readouterr().out)


def test_a_checkpoint_of_a_rescaled_deployment(source, deployment, s3_server, tmp_path):
    """2 -> 3, no replica of the old layout involved in the reads: three new replicas restore the
    job from the two replicas' checkpoint and take one of their own; the 2-part checkpoint reads as
    what was written, the 3-part one (and 'latest') as the live read of the three."""
    urls, storage, backend = deployment
    job = "rescaled"
    expected = sorted(fill_operator(urls, job), key=repr)
    with StatehouseClient(urls) as client:
        before = CheckpointCoordinator(client.job(job)).checkpoint().checkpoint_id
    env = {
        "STATEHOUSE_BACKEND": backend,
        "STATEHOUSE_CHECKPOINT_DIR": storage,
        "STATEHOUSE_S3_ENDPOINT_URL": s3_server.endpoint,
    }
    servers = []
    try:
        servers = start_replica_set([tmp_path / f"three-{i}" for i in range(3)], env)
        three = [s.url for s in servers]
        with StatehouseClient(three) as client:
            client.replicas.on_all("POST", f"/v1/jobs/{job}/restore", {"checkpoint_id": before}, idempotent=False)
            after = CheckpointCoordinator(client.job(job)).checkpoint().checkpoint_id
        # A restore hands a union list to every subtask of the operator (five wrote: Flink's rule).
        union = [e for e in expected if e[1] == "union"]
        restored = sorted(
            [e for e in expected if e[1] != "union"]
            + [(n, m, s, *rest) for s in range(5) for n, m, _s, *rest in union],
            key=repr,
        )
        assert rows(read(source, three, job, None, operator="source")) == restored
    finally:
        for server in servers:
            server.stop()
    for checkpoint, oracle in ((before, expected), (after, restored), ("latest", restored)):
        found = from_checkpoint(source, job, checkpoint, storage, s3_server.endpoint, operator="source")
        assert rows(found) == oracle, checkpoint


@pytest.mark.parametrize("count", [100_000, pytest.param(1_000_000, marks=pytest.mark.long)])
def test_many_keys_read_back_exactly_live_and_from_a_checkpoint(source, deployment, s3_server, count):
    """At scale: ``count`` keys bulk-loaded through the columnar client read
    back exactly (the multiset of rows: each read's rows, as Arrow, sorted and compared with what
    was written) from the live replicas and from a checkpoint on S3; a one-key filter on the
    checkpoint finds its key."""
    import pyarrow as pa

    urls, storage, _backend = deployment
    job, endpoint = f"many-{count}", s3_server.endpoint
    keys = pa.array([f"k{i}" for i in range(count)])
    with StatehouseClient(urls) as client:
        j = client.create_job(job, 128)
        j.register("big", "value", value_type="int64")
        j.columns().put("big", keys, pa.array(range(count), pa.int64()))
        checkpoint = CheckpointCoordinator(j).checkpoint().checkpoint_id
    written = pa.table({"key": keys, "value": pa.array(range(count), pa.int64())}).sort_by("key")
    live = read(source, urls, job, "big", partitions_per_replica=2)
    stored = from_checkpoint(source, job, checkpoint, storage, endpoint, state="big", partitions_per_replica=2)
    for df in (live, stored):
        found = df.select("key", "value").toArrow().sort_by("key")  # keys are unique: one order
        assert found.num_rows == count
        assert found.column("key").cast(pa.string()).equals(written.column("key"))
        assert found.column("value").equals(written.column("value"))
    assert [tuple(r) for r in stored.filter("key = 'k12345'").select("key", "value").collect()] == [("k12345", 12345)]
