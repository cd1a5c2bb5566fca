"""format("statehouse") refuses what it would otherwise ignore, on real local Spark against two real
replicas: an option it does not take (a misspelling, a live read's option on a checkpoint read, a
path) is one error naming the options it takes, and mode("overwrite"), which a write cannot honour
(it applies its rows on top of the state), is refused before anything is fenced or written."""

from __future__ import annotations

import pytest

from statehouse.client import StatehouseClient
from statehouse.client.datasource import register
from tests.support.server import start_server

pytestmark = [pytest.mark.http, pytest.mark.spark]

JOB = "options"


@pytest.fixture(scope="module")
def replicas(tmp_path_factory):
    """Two replicas of one deployment (one checkpoint storage), and a state holding alice 20."""
    shared = str(tmp_path_factory.mktemp("options-checkpoints"))
    servers = []
    try:
        for i in range(2):
            env = {
                "STATEHOUSE_BACKEND": "rocksdb",
                "STATEHOUSE_REPLICA_INDEX": str(i),
                "STATEHOUSE_REPLICA_COUNT": "2",
                "STATEHOUSE_CHECKPOINT_DIR": shared,
            }
            servers.append(start_server(tmp_path_factory.mktemp(f"options-{i}"), env))
        urls = [s.url for s in servers]
        with StatehouseClient(urls) as client:
            spent = client.create_job(JOB, 32).register("spent", "reducing", function="sum", value_type="float64")
            spent.add("alice", 12.5)
            spent.add("alice", 7.5)
        yield urls
    finally:
        for server in servers:
            server.stop()


@pytest.fixture(scope="module")
def source(spark):
    register(spark)
    return spark


def first_line(raised: pytest.ExceptionInfo) -> str:
    return str(raised.value).splitlines()[0]


def reader(spark, urls: list[str]):
    return spark.read.format("statehouse").option("urls", ",".join(urls)).option("job", JOB).option("state", "spent")


def frame(spark):
    return spark.createDataFrame([("alice", 20.0), ("bob", 1.0)], "key STRING, value DOUBLE")


def writer(spark, urls: list[str], mode: str = "append"):
    options = {"urls": ",".join(urls), "job": JOB, "state": "spent", "op": "add"}
    return frame(spark).write.format("statehouse").mode(mode).options(**options)


def state(urls: list[str]) -> tuple[dict[str, float | None], int]:
    """What the state holds for alice and bob, and the job's writer epoch."""
    with StatehouseClient(urls) as client:
        job = client.job(JOB)
        got = job.columns().get("spent", ["alice", "bob"]).tolist()
        values = {key: None if value != value else value for key, value in zip(["alice", "bob"], got, strict=True)}
        return values, job.epoch()  # (NaN, a key absent, is not equal to itself: None instead)


def test_an_unknown_read_option_is_refused_naming_the_known_ones(source, replicas):
    from pyspark.errors import AnalysisException

    with pytest.raises(AnalysisException) as raised:
        reader(source, replicas).option("partitions", "3").load().collect()
    assert first_line(raised).endswith(
        "'partitions': not an option of a read of the live replicas, which takes urls, job, state, timers, what, "
        "operator, partitions_per_replica, token, timeout"
    ), first_line(raised)
    with pytest.raises(AnalysisException) as raised:
        reader(source, replicas).load("/some/where").collect()
    assert "format('statehouse') takes no path" in first_line(raised)
    # the documented option reads as before
    rows = reader(source, replicas).option("partitions_per_replica", "3").load().collect()
    assert {(r.key, r.value) for r in rows} == {("alice", 20.0)}


def test_a_checkpoint_read_refuses_the_live_reads_options(source, replicas, tmp_path):
    from pyspark.errors import AnalysisException

    stored = source.read.format("statehouse").option("job", JOB).option("state", "spent")
    stored = stored.option("checkpoint", "latest").option("checkpoint_storage", str(tmp_path))
    with pytest.raises(AnalysisException) as raised:
        stored.option("urls", ",".join(replicas)).load().collect()
    assert first_line(raised).endswith(
        "'urls': not an option of a checkpoint read (it reads storage, not the replicas), which takes checkpoint, "
        "checkpoint_storage, s3_endpoint_url, job, state, operator, partitions_per_replica"
    ), first_line(raised)


def test_an_unknown_write_option_is_refused_and_nothing_is_written(source, replicas):
    from pyspark.errors import PySparkException

    before = state(replicas)
    with pytest.raises(PySparkException) as raised:
        writer(source, replicas).option("partitions", "3").save()
    assert first_line(raised).endswith(
        "'partitions': not an option of a write, which takes urls, job, state, op, token, timeout"
    ), first_line(raised)
    with pytest.raises(PySparkException) as raised:  # a read's option on a write
        writer(source, replicas).option("partitions_per_replica", "2").save()
    assert "'partitions_per_replica': not an option of a write" in first_line(raised)
    assert state(replicas) == before  # no epoch fenced, nothing applied


def test_overwrite_is_refused_and_the_state_is_untouched(source, replicas):
    from pyspark.errors import PySparkException

    before = state(replicas)
    assert before[0]["alice"] == 20.0
    with pytest.raises(PySparkException) as raised:
        writer(source, replicas, mode="overwrite").save()
    assert "mode('overwrite') would replace the state, which a write does not do" in first_line(raised)
    assert "Use mode('append')" in first_line(raised)
    assert state(replicas) == before  # alice stays 20 (was 40: the rows appended), no epoch fenced
    writer(source, replicas).save()  # append, as the error says
    values, epoch = state(replicas)
    assert values == {"alice": 40.0, "bob": 1.0} and epoch > before[1]


def test_a_streaming_write_refuses_an_unknown_option_and_takes_its_checkpoint_location(source, replicas, tmp_path):
    from pyspark.errors import StreamingQueryException

    before = state(replicas)
    rate = source.readStream.format("rate").option("rowsPerSecond", 5).load()
    rows = rate.selectExpr("concat('s', cast(value % 3 AS STRING)) AS key", "CAST(1.0 AS DOUBLE) AS value")
    options = {"urls": ",".join(replicas), "job": JOB, "state": "spent", "op": "add"}
    query = (
        rows.writeStream.format("statehouse")
        .options(**options)
        .option("checkpointLocation", str(tmp_path / "chk"))  # Spark's own option: taken
        .option("parts", "3")
        .start()
    )
    try:
        with pytest.raises(StreamingQueryException) as raised:
            query.awaitTermination(120)
    finally:
        query.stop()
    assert (
        "'parts': not an option of a streaming write, which takes urls, job, state, op, token, timeout, "
        "checkpointlocation" in str(raised.value)
    ), str(raised.value)[:2000]
    assert state(replicas) == before


def test_a_read_that_does_not_say_how_many_partitions_makes_enough_for_the_sessions_parallelism(source, replicas):
    """register() records the session's default parallelism with the class Spark ships to its workers;
    a read without ``partitions_per_replica`` splits each replica's key groups to use every core."""
    from statehouse.client.datasource import StatehouseDataSource, session_parallelism

    assert session_parallelism(source) == source.sparkContext.defaultParallelism
    assert reader(source, replicas).load().rdd.getNumPartitions() == 2 * -(-source.sparkContext.defaultParallelism // 2)
    options = {"urls": ",".join(replicas), "job": JOB, "state": "spent"}
    for parallelism, given, planned in [(None, None, 2), (7, None, 8), (64, None, 32), (7, "3", 6)]:
        data_source = type("Source", (StatehouseDataSource,), {"parallelism": parallelism})(
            {**options, **({"partitions_per_replica": given} if given else {})}
        )
        partitions = data_source.reader(data_source.schema()).partitions()
        assert len(partitions) == planned, (parallelism, given)  # 32 key groups: at most 16 per replica
        assert sorted(g for p in partitions for g in range(p.start, p.end + 1)) == list(range(32))
