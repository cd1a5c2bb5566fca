"""format("statehouse").option("checkpoint", N) on real local Spark, against two real replicas per
backend whose checkpoints go to real S3 (SeaweedFS): a checkpoint's and a savepoint's operator
state read straight from storage (no replica involved) equals the live read at that moment and a
plain-Python oracle, stays what it was after the live state moves on, and refusals (an unknown
checkpoint, keyed state, storage down) are one error whose first line says what to fix."""

from __future__ import annotations

import json

import pytest

from harness.server import start_server
from statehouse.client import StatehouseClient
from statehouse.client.coordinator import CheckpointCoordinator
from statehouse.client.datasource import register
from tests.test_spark_source import fill_operator, first_line, read

pytestmark = [pytest.mark.http, pytest.mark.spark]


@pytest.fixture(scope="module", params=["heap", "rocksdb"])
def deployment(request, tmp_path_factory, s3_server):
    """Two replicas on one backend; their checkpoints go to a fresh S3 prefix (RocksDB's are
    incremental). Yields (urls, checkpoint storage, backend)."""
    import uuid

    if s3_server._process is None:
        s3_server.start()
    location = f"s3://{s3_server.bucket}/{uuid.uuid4().hex}"
    servers = []
    try:
        for i in range(2):
            env = {
                "STATEHOUSE_BACKEND": request.param,
                "STATEHOUSE_REPLICA_INDEX": str(i),
                "STATEHOUSE_REPLICA_COUNT": "2",
                "STATEHOUSE_CHECKPOINT_DIR": location,
                "STATEHOUSE_S3_ENDPOINT_URL": s3_server.endpoint,
            }
            servers.append(start_server(tmp_path_factory.mktemp(f"chk-source-{request.param}-{i}"), env))
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
    return sorted((tuple(r) for r in df.collect()), key=repr)


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
    assert "keyed state cannot be read yet" in first_line(raised)
    with pytest.raises(AnalysisException) as raised:
        from_checkpoint(source, job, "soon", storage, endpoint, operator="source").collect()
    assert "a checkpoint or savepoint id, or 'latest'" in first_line(raised)
    s3_server.stop()
    try:
        with pytest.raises(AnalysisException) as raised:
            from_checkpoint(source, job, "latest", storage, endpoint, operator="source").collect()
        assert "storage" in first_line(raised).lower(), first_line(raised)
    finally:
        s3_server.start()


def test_the_documented_checkpoint_read_runs_as_written(source, deployment, s3_server, capsys):
    """docs/spark.md's checkpoint block (marked for this test), against these replicas and S3."""
    from harness.server import REPO
    from tests.test_docs_blocks import check_output, parse

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
    servers = []
    try:
        for i in range(3):
            env = {
                "STATEHOUSE_BACKEND": backend,
                "STATEHOUSE_REPLICA_INDEX": str(i),
                "STATEHOUSE_REPLICA_COUNT": "3",
                "STATEHOUSE_CHECKPOINT_DIR": storage,
                "STATEHOUSE_S3_ENDPOINT_URL": s3_server.endpoint,
            }
            servers.append(start_server(tmp_path / f"three-{i}", env))
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
