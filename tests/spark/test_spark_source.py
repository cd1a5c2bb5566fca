"""format("statehouse") on real local Spark against two real replicas per backend: a state read as a
DataFrame equals what was written (every kind), a key filter reads only that key, a bootstrap write
with a task that fails after its writes and a speculative copy applies exactly once, and refusals
are one Spark error carrying the problem's detail. (The streaming sink under a driver SIGKILL:
tests/spark/test_spark_source_sink.py.)"""

from __future__ import annotations

import json
import os
from collections import defaultdict

import httpx
import pyarrow as pa
import pytest

from statehouse.client import StatehouseClient
from statehouse.client.coordinator import MicroBatchCoordinator
from statehouse.client.datasource import StatehouseDataSource, register
from statehouse.client.datasource.writer import BatchWriter
from tests.support.server import free_port, start_replica_set
from tests.support.source_data import STATES, as_dict, fill, fill_operator, first_line, read

pytestmark = [pytest.mark.http, pytest.mark.spark]


@pytest.fixture(scope="module", params=["heap", "rocksdb"])
def replicas(request, tmp_path_factory):
    """Two replicas of one deployment on one backend, sharing a checkpoint storage."""
    shared = str(tmp_path_factory.mktemp(f"source-checkpoints-{request.param}"))
    env = {"STATEHOUSE_BACKEND": request.param, "STATEHOUSE_CHECKPOINT_DIR": shared}
    workdirs = [tmp_path_factory.mktemp(f"source-{request.param}-{i}") for i in range(2)]
    servers = []
    try:
        servers = start_replica_set(workdirs, env)
        yield [s.url for s in servers]
    finally:
        for server in servers:
            server.stop()


@pytest.fixture(scope="module")
def source(spark):
    register(spark)
    spark.dataSource.register(FlakySource)
    return spark


@pytest.fixture(scope="module")
def filled(replicas):
    return "filled", fill(replicas, "filled")


def scanned_rows(urls) -> float:
    """Rows every replica's scans answered so far (statehouse_state_operations_total{op="scan"})."""
    total = 0.0
    for url in urls:
        for line in httpx.get(url + "/metrics").text.splitlines():
            if line.startswith("statehouse_state_operations_total") and 'op="scan"' in line:
                total += float(line.rsplit(" ", 1)[1])
    return total


def test_read_equals_what_was_written_for_every_kind(source, replicas, filled):
    job, expected = filled
    for state in STATES:
        df = read(source, replicas, job, state, partitions_per_replica=3)
        assert df.rdd.getNumPartitions() == 6
        rows = df.collect()
        assert as_dict(rows, state) == expected[state], state
        assert len(rows) == len(expected[state])
        with StatehouseClient(replicas) as client:
            j = client.job(job)
            assert all(j.key_group(state, r["key"]) == r["key_group"] for r in rows[:20])
    recent = read(source, replicas, job, "recent").schema
    assert recent["expires_at"].dataType.simpleString() == "array<bigint>"


def test_a_one_key_filter_reads_one_key(source, replicas, filled):
    job, expected = filled
    df = read(source, replicas, job, "score")
    before = scanned_rows(replicas)
    assert [(r["key"], r["value"]) for r in df.filter("key = 'user-7'").collect()] == [("user-7", 7)]
    assert scanned_rows(replicas) - before == 1  # one point read on its owner: one row, not the state
    before = scanned_rows(replicas)
    picked = df.filter(df.key.isin("user-1", "user-200", "nobody")).select("key", "value").collect()
    assert sorted(map(tuple, picked)) == [("user-1", 1), ("user-200", 200)]
    assert scanned_rows(replicas) - before == 2
    narrowed = df.filter("key_group between 3 and 5")
    assert {r["key"] for r in narrowed.collect()} == {
        k for (k, _ns) in expected["score"] if 3 <= _key_group(replicas, job, k) <= 5
    }
    longs = read(source, replicas, job, "by_id").filter("key = -3").collect()
    assert [(r["key"], r["value"]) for r in longs] == [(-3, 47 / 4)]


def _key_group(urls, job, key):
    with StatehouseClient(urls) as client:
        return client.job(job).key_group("score", key)


def test_refusals_are_one_spark_error_with_the_problem(source, replicas, filled):
    """The problem is on the error's first line (register() hides the Python traceback Spark
    would show first), and what a query finds when Spark plans it is the driver's error."""
    from pyspark.errors import AnalysisException, PySparkException

    job, _ = filled
    with pytest.raises(AnalysisException, match="job 'filled' has no state 'nope'") as raised:
        read(source, replicas, job, "nope").collect()
    assert "has no state 'nope'" in first_line(raised) and "Traceback" not in str(raised.value)
    down = [replicas[0], f"http://127.0.0.1:{free_port()}"]
    with pytest.raises(AnalysisException, match="unreachable") as raised:
        read(source, down, job, "score").collect()
    assert "unreachable" in first_line(raised)
    frame = source.createDataFrame([("u", "not a number")], "key STRING, value STRING")
    with pytest.raises(
        PySparkException, match="column 'value' is string, which a value state of value_type int64"
    ) as raised:
        write(frame, replicas, job, "score", "put")
    assert "column 'value' is string" in first_line(raised)
    assert read(source, replicas, job, "score").filter("key = 'u'").count() == 0  # nothing applied


def test_a_state_dropped_after_load_is_the_plans_error(source, replicas):
    """Between load() and the action, replica 1 loses the state: Spark plans the read on the
    driver, which asks every replica it reads, so the refusal is the driver's one line (not a
    task's, after Spark's retries)."""
    from pyspark.errors import AnalysisException

    job = "dropped"
    with StatehouseClient(replicas) as client:
        client.create_job(job, 32).register("score", "value", value_type="int64")
    df = read(source, replicas, job, "score")
    httpx.delete(f"{replicas[1]}/v1/jobs/{job}/states/score").raise_for_status()
    with pytest.raises(AnalysisException, match="has no state 'score'") as raised:
        df.collect()
    assert replicas[1] in first_line(raised)


def write(frame, urls, job, state, op, fmt="statehouse", **options):
    writer = frame.write.format(fmt).mode("append").option("urls", ",".join(urls))
    writer = writer.option("job", job).option("state", state).option("op", op)
    for name, value in options.items():
        writer = writer.option(name, value)
    writer.save()


class FlakyWriter(BatchWriter):
    """A bootstrap whose partition 0 first stages its rows, then has a speculative copy stage them
    again (never reported, as Spark's commit coordinator denies all copies but one), and then dies:
    Spark retries it, and only the retry's message reaches commit."""

    def __init__(self, options, schema, marker: str) -> None:
        super().__init__(options, schema)
        self.marker = marker

    def write(self, iterator):
        from pyspark import TaskContext

        batches = list(iterator)
        message = super().write(iter(batches))
        if TaskContext.get().partitionId() == 0 and _first_time(self.marker):
            super().write(iter(batches))  # the speculative copy: staged under its own attempt
            raise RuntimeError("injected task failure after its writes")
        return message


def _first_time(path: str) -> bool:
    try:
        with open(path, "x"):
            return True
    except FileExistsError:
        return False


class FlakySource(StatehouseDataSource):
    @classmethod
    def name(cls) -> str:
        return "statehouse_flaky"

    def writer(self, schema, overwrite):
        from statehouse.client.datasource.options import SourceOptions

        return FlakyWriter(SourceOptions.parse(self.options, writing=True), schema, self.options["marker"])


def test_bootstrap_with_a_failed_task_and_a_speculative_copy_is_exact(source, replicas, tmp_path):
    job = "bootstrap"
    with StatehouseClient(replicas) as client:
        j = client.create_job(job, 32)
        j.register("spent", "reducing", function="sum", value_type="float64")
        j.register("tags", "map", value_type="int64")
        j.register("seen", "value", value_type="string")
        j.columns().put("seen", ["gone", "kept"], ["x", "y"])
    rows = [(f"user-{i % 97}", float(i)) for i in range(2_000)]
    frame = source.createDataFrame(rows, "key STRING, value DOUBLE").repartition(4)
    marker = str(tmp_path / "failed")
    write(frame, replicas, job, "spent", "add", fmt="statehouse_flaky", marker=marker)
    assert os.path.exists(marker)  # partition 0 failed once, after staging twice
    oracle: dict[str, float] = defaultdict(float)
    for key, value in rows:
        oracle[key] += value
    got = read(source, replicas, job, "spent").collect()
    assert {r["key"]: r["value"] for r in got} == pytest.approx(dict(oracle))

    # The write ended with a checkpoint of its epoch, as a micro-batch does.
    with StatehouseClient(replicas) as client:
        j = client.job(job)
        latest = MicroBatchCoordinator(j).completed()[-1]
        assert latest.metadata["epoch"] == max(j.committed_epochs()) == min(j.committed_epochs())

    entries = source.createDataFrame(
        [("a", "x", 1), ("a", "y", 2), ("b", "x", 3)], "key STRING, user_key STRING, value LONG"
    )
    write(entries, replicas, job, "tags", "map_put")
    write(source.createDataFrame([("gone",)], "key STRING"), replicas, job, "seen", "clear")
    tags = read(source, replicas, job, "tags").collect()
    assert {(r["key"], r["user_key"]): r["value"] for r in tags} == {("a", "x"): 1, ("a", "y"): 2, ("b", "x"): 3}
    assert [(r["key"], r["value"]) for r in read(source, replicas, job, "seen").collect()] == [("kept", "y")]


def test_a_failing_write_applies_nothing(source, replicas, tmp_path):
    job = "failing"
    with StatehouseClient(replicas) as client:
        client.create_job(job, 32).register("spent", "reducing", function="sum", value_type="float64")
    # Every attempt of one partition fails (after the others staged theirs): the job fails, nothing applies.
    frame = source.createDataFrame([(f"k{i}", float(i)) for i in range(200)], "key STRING, value DOUBLE")
    frame = frame.repartition(4).selectExpr("key", "if(key = 'k7', raise_error('no'), value) AS value")
    with pytest.raises(Exception, match="no"):
        write(frame, replicas, job, "spent", "add")
    assert read(source, replicas, job, "spent").count() == 0


def test_arrow_pages_match_the_declared_schema(replicas, filled):
    """What a partition yields is what the DataFrame's schema says (no Spark needed to see it)."""
    from statehouse.client.datasource.options import SourceOptions
    from statehouse.client.datasource.source import StatehouseReader, describe

    job, expected = filled
    options = SourceOptions.parse({"urls": ",".join(replicas), "job": job, "state": "counts"})
    layout = describe(options)
    reader = StatehouseReader(options, layout)
    batches = [b for p in reader.partitions() for b in reader.read(p)]
    assert all(b.schema == layout.schema for b in batches)
    table = pa.Table.from_batches(batches, schema=layout.schema)
    assert table.num_rows == len(expected["counts"])


def test_the_documented_example_runs_as_written(source, replicas, capsys):
    """docs/spark.md's Spark block (marked for this test), against these replicas; its shown output."""
    from tests.support.docs_blocks import check_output, parse
    from tests.support.server import REPO

    (block,) = [b for b in parse(REPO / "docs/spark.md") if b.marker == "spark" and "test_spark_source.py" in b.reason]
    code = block.code.replace("http://sh-0:8000,http://sh-1:8000", ",".join(replicas))
    exec(compile(code, block.id, "exec"), {"__name__": "__main__"})
    check_output(block, capsys.readouterr().out)


def test_timers_read_as_a_table(source, replicas):
    job = "timed"
    expected = {(f"k{i}", "string", "w" if i % 2 else "", 1_000 + i) for i in range(60)} | {("-7", "long", "", 5)}
    with StatehouseClient(replicas) as client:
        timers = client.create_job(job, 32).timers("event")
        for key, key_type, ns, timestamp in expected:
            timers.register(int(key) if key_type == "long" else key, timestamp, ns=ns, key_type=key_type)
        client.job(job).timers("processing").register("other", 1)
    rows = read(source, replicas, job, None, timers="event").collect()
    assert {(r["key"], r["key_type"], r["ns"], r["timestamp"]) for r in rows} == expected
    assert len(rows) == len(expected)
    with pytest.raises(Exception, match="one of event, processing; got 'later'"):
        read(source, replicas, job, None, timers="later").collect()


def test_the_sink_writes_past_an_epoch_a_dead_driver_sealed(source, replicas, tmp_path):
    """A commit that sealed its epoch and died before applying it: the next query's tasks stage
    under the next epoch, and every micro-batch applies once (a plain-Python oracle)."""
    job = "sealed"
    with StatehouseClient(replicas) as client:
        j = client.create_job(job, 32)
        j.register("spent", "reducing", function="sum", value_type="float64")
        MicroBatchCoordinator(j).checkpoint()  # the baseline checkpoint
        epoch = j.fence(j.epoch() + 1)
        j.replicas.on_all("POST", f"/v1/jobs/{job}/epochs/{epoch}/prepare", {"attempts": []})
    events = [[(f"u{(f + i) % 13}", float(i)) for i in range(40)] for f in range(2)]
    (tmp_path / "in").mkdir()
    for n, rows in enumerate(events):
        lines = "".join(json.dumps({"key": k, "value": v}) + "\n" for k, v in rows)
        (tmp_path / "in" / f"{n}.json").write_text(lines)
    stream = (
        source.readStream.schema("key STRING, value DOUBLE").option("maxFilesPerTrigger", 1).json(str(tmp_path / "in"))
    )
    query = (
        stream.writeStream.format("statehouse")
        .option("urls", ",".join(replicas))
        .option("job", job)
        .option("state", "spent")
        .option("op", "add")
        .option("checkpointLocation", str(tmp_path / "chk"))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    assert query.exception() is None
    oracle: dict[str, float] = defaultdict(float)
    for rows in events:
        for key, value in rows:
            oracle[key] += value
    got = read(source, replicas, job, "spent").collect()
    assert {r["key"]: r["value"] for r in got} == pytest.approx(dict(oracle))
    with StatehouseClient(replicas) as client:
        done = [c.parts[0]["committed_batch"] for c in MicroBatchCoordinator(client.job(job)).completed()]
    assert done == [None, 0, 1]  # what each checkpoint's state holds: no batch, then batches 0 and 1


def test_the_states_view(source, replicas, filled):
    job, expected = filled
    rows = read(source, replicas, job, None, what="states").collect()
    by_state: dict[str, list] = defaultdict(list)
    for r in rows:
        by_state[r["state"]].append(r)
    assert set(by_state) == set(STATES)
    for name, body in STATES.items():
        listed = by_state[name]
        assert {(r["kind"], r["key_type"], r["value_type"], r["function"]) for r in listed} == {
            (body["kind"], body.get("key_type", "string"), body.get("value_type"), body.get("function"))
        }
        assert sum(r["entries"] for r in listed) == len(expected[name])  # one stored row per table row
        assert {r["replica"] for r in listed} == {0, 1}
    assert {r["ttl_ms"] for r in by_state["recent"]} == {3_600_000}


def test_operator_state_reads_as_a_table(source, replicas):
    job = "operators"
    expected = fill_operator(replicas, job)
    df = read(source, replicas, job, None, operator="source")
    assert df.columns == ["state", "mode", "subtask", "position", "key", "value"]
    rows = [tuple(r) for r in df.collect()]
    assert sorted(rows, key=repr) == sorted(expected, key=repr)  # broadcast once, not once per replica
    picked = read(source, replicas, job, "seen", operator="source").collect()
    assert {tuple(r) for r in picked} == {e for e in expected if e[0] == "seen"}
    assert read(source, replicas, job, None, operator="nothing").count() == 0
