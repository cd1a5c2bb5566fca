"""Every benchmark in bench/ runs end to end on tiny sizes, so the scripts never rot.

No assertion on speed: only that each script runs, talks to the real servers it starts and
reports a result for every configuration it was asked for. make test runs the quick ones (the
shared harness: servers, Redis, result tables); make test-long all of them.
"""

from __future__ import annotations

import shutil

import pytest

from bench import (
    attempts,
    batch_chain,
    batch_ops,
    checkpoint_churn,
    checkpoint_cost,
    checkpoint_transfers,
    checkpoint_writes,
    columnar,
    heap_changelog,
    heap_lookup,
    http_server,
    latency,
    map_paging,
    point_reads,
    precopy_delta,
    rescale_live,
    restore,
    spark_columnar,
    spark_source,
    timers,
)

# spark: only the tests that take the session (tests/conftest.py marks them from the fixture), so
# that the others need not wait for the Spark tests' xdist worker.
pytestmark = [pytest.mark.s3, pytest.mark.slow]

needs_redis = pytest.mark.skipif(shutil.which("redis-server") is None, reason="redis-server is not on PATH")

TINY_BATCH = ["--runs", "1", "--count", "200", "--keys", "200", "--batch-sizes", "100", "--clients", "1,2"]


@pytest.mark.long
def test_batch_ops_statehouse_and_rocksdict():
    out = batch_ops.main([*TINY_BATCH, "--backends", "rocksdb,heap", "--baselines", "rocksdict"])
    systems = {(r["system"], r["format"], r["op"], r["clients"]) for r in out["results"]}
    for backend in ("rocksdb", "heap"):
        for op in batch_ops.OPS:
            assert (f"statehouse {backend}", "msgpack", op, 1) in systems
            assert (f"statehouse {backend}", "json", op, 1) in systems
        assert (f"statehouse {backend}", "msgpack", "put", 2) in systems
    assert ("rocksdict in-process", "raw", "put", 1) in systems
    assert all(r["ops_per_s"]["median"] > 0 for r in out["results"])


@needs_redis
def test_batch_ops_redis_baseline():
    out = batch_ops.main([*TINY_BATCH, "--clients", "1", "--backends", "", "--baselines", "redis"])
    systems = {r["system"] for r in out["results"]}
    assert systems == {"redis-py pipeline", "redis-py MGET", "redis-py MSET"}


def test_latency():
    args = ["--runs", "1", "--rates", "200", "--seconds", "0.5", "--count", "200", "--client-count", "20"]
    out = latency.main([*args, "--keys", "50", "--backends", "heap", "--no-redis"])
    modes = {(r["op"], r["mode"]) for r in out["results"]}
    assert ("get", "open loop 200/s") in modes and ("put", "python client, 1 thread") in modes
    for r in out["results"]:
        assert r["runs"][0]["p99_ms"] > 0


@needs_redis
def test_latency_redis_baseline():
    out = latency.main(["--runs", "1", "--client-count", "20", "--keys", "20", "--backends", ""])
    assert {r["system"] for r in out["results"]} == {"redis-py"}


# The three longest smokes (a minute or more each on 2 cores) drive what tests of their own cover
# (incremental checkpoints: test_snapshot_incremental; restore: test_snapshot_*; the live rescale:
# test_spark_live_rescale, test_rescale_live_*): make test-long runs them, CI does not.
@pytest.mark.long
def test_checkpoint_writes_local_dir():
    args = ["--runs", "1", "--keys", "2000", "--rate", "200", "--baseline-seconds", "0.5", "--max-seconds", "20"]
    out = checkpoint_writes.main([*args, "--storage", "local"])
    assert {r["mode"] for r in out["results"]} == {"full", "incremental"}
    for r in out["results"]:
        assert r["runs"][0]["bytes_uploaded"] > 0


@pytest.mark.long
def test_checkpoint_cost_and_restore_on_s3(s3_server, s3_location):
    endpoint = ["--s3-endpoint", s3_server.endpoint]  # the session's SeaweedFS (s3_location: it is running)
    cost = checkpoint_cost.main(["--runs", "1", "--sizes", "2000", *endpoint])
    run = cost["results"][0]["runs"][0]
    assert 0 < run["incremental_bytes"] < run["full_bytes"]
    out = restore.main(["--runs", "1", "--keys", "2000", *endpoint])
    targets = {(r["snapshot"], r["target"]) for r in out["results"]}
    assert len(targets) == 4
    assert all(r["runs"][0]["entries_restored"] > 0 for r in out["results"])


@pytest.mark.long
def test_rescale_live_on_s3(spark, s3_server, s3_location):
    args = ["--keys", "2000", "--batches", "5", "--grow-at", "2", "--shrink-at", "4", "--events", "20"]
    args.append("--checkpointed")  # the bulk job checkpointed before the moves
    out = rescale_live.main([*args, "--s3-endpoint", s3_server.endpoint], spark=spark)
    assert [(r["from"], r["to"]) for r in out["rescales"]] == [(2, 3), (3, 2)]
    assert all(r["loads"] and r["parts"] for r in out["rescales"])
    assert sorted(out["batches_s"]) == [0, 1, 2, 3, 4]


def test_attempts_quick():
    out = attempts.main(["--quick"])
    runs = {r["path"]: r["runs"][0] for r in out["results"]}
    assert set(runs) == {"old", "new"}
    assert (runs["old"]["requests"]["commit"], runs["new"]["requests"]["commit"]) == (0, 4)  # prepare + commit x 2
    for run in runs.values():
        assert run["requests"]["tasks"] > 0 and run["phases"]["tasks"]["server_cpu_s"] > 0


def test_batch_chain_quick():
    out = batch_chain.main(["--quick"])  # every user's state is checked against the events
    assert {r["backend"] for r in out["results"]} == {"heap", "rocksdb"}
    for result in out["results"]:
        assert all(result["wall_ms"][link] > 0 for link in batch_chain.LINKS)
        assert result["cpu_ms"]["tasks"] > 0


def test_columnar():
    out = columnar.main(["--quick"])
    paths = {(r["system"], r["path"], r["op"]) for r in out["results"]}
    for backend in ("heap", "rocksdb"):
        assert (f"statehouse {backend}", "columnar client", "get") in paths, paths
        assert (f"statehouse {backend}", "columnar client", "put") in paths, paths
    assert all(r["ops_per_s"]["median"] > 0 for r in out["results"])


@pytest.mark.parametrize("backend", ["rocksdb", "heap"])
def test_precopy_delta(backend):
    out = precopy_delta.main(["--keys", "2000", "--changed", "500", "--runs", "1", "--backend", backend])
    (run,) = out["runs"]  # the script checks that every changed key was read and applied
    assert run["bytes"] > 500 * 100 and all(run[f"{step}_s"] > 0 for step in ("read", "pack", "apply"))


def test_heap_changelog():
    out = heap_changelog.main(["--keys", "2000", "--checkpoints", "2", "--changed", "0.05"])
    by_format = {r["format"]: r for r in out["results"]}
    assert set(by_format) == {"changelog", "full"}
    # a delta of 5% of the keys writes less than the whole state does
    assert by_format["changelog"]["checkpoint_mb"]["max"] < by_format["full"]["checkpoint_mb"]["min"]
    assert all(r["restore_reads"]["min"] > 0 for r in out["results"])


@pytest.mark.long
def test_heap_lookup():
    out = heap_lookup.main(["--keys", "5000", "--requests", "5", "--rounds", "1"])  # checks every way's answers
    assert set(out["results"]) == {"dicts", "sorted hashes", "hash index"}


@pytest.mark.long
def test_checkpoint_transfers(s3_server, s3_location):
    out = checkpoint_transfers.main(
        ["--runs", "1", "--keys", "3000", "--files", "2", "--delays", "0", "--s3-endpoint", s3_server.endpoint]
    )
    assert set(out) == {"0 ms, 1 threads", "0 ms, 4 threads"}
    assert all(run["first_mb"] > 0 and run["restore_s"] > 0 for runs in out.values() for run in runs)


def test_checkpoint_churn():
    out = checkpoint_churn.main(["--keys", "20000", "--batch", "1000", "--batches", "6", "--shapes", "64/256,2/4"])
    assert [r["shape"] for r in out["results"]] == ["64/256", "2/4"]
    for r in out["results"]:
        assert r["fill_bytes"] > 0 and len(r["uploaded"]) == 6 and all(b > 0 for b in r["uploaded"])


@pytest.mark.long
def test_point_reads():
    out = point_reads.main(["--keys", "2000", "--rounds", "1", "--variant", "hash"])
    assert set(out) == {"sorted multi-get", "unsorted multi-get", "keys not there", "after a full compaction"}
    assert all(us > 0 for us in out.values())


def test_map_paging_quick():
    out = map_paging.main(["--quick"])
    assert {r["backend"] for r in out["results"]} == {"rocksdb", "heap"}
    for r in out["results"]:
        (paged,) = r["passes"]
        assert paged["entries"] == r["entries"] and paged["pages"] == r["entries"] // 1000
        assert paged["healthz"]["n"] > 0 and all(w["total_s"] > 0 for w in r["whole_map"])


@pytest.mark.long
def test_timers_quick():
    out = timers.main(["--quick"])  # every timer fires once, in order: the script checks it
    assert {r["backend"] for r in out["results"]} == {"rocksdb", "heap"}
    assert all(r["fired_per_s"] > 0 and r["register_columns_per_s"] > 0 for r in out["results"])
    assert {r["backend"] for r in out["checkpoints"]} == {"rocksdb", "heap"}  # restored timers: the script counts them
    assert all(r["runs"][0]["checkpoint"]["bytes_uploaded"] > 0 for r in out["checkpoints"])


@pytest.mark.long
def test_http_server_limits_cost():
    out = http_server.main(["--runs", "1", "--requests", "200"])
    measured = {(r["server"], r["case"]) for r in out["results"]}
    assert measured == {(server, case) for server in http_server.SERVERS for case in http_server.CASES}
    assert all(r["cpu_us"]["median"] > 0 for r in out["results"])


def _spark_columnar_quick(spark, paths: list[str]) -> dict:
    """The Spark job on the given paths, tiny: every path's state is checked against pandas' sums
    and counts by the script itself (a wrong answer fails the run), across two micro-batches."""
    out = spark_columnar.main(["--quick", "--paths", ",".join(paths)], spark=spark)
    runs = out["runs"][100]
    assert set(runs) == set(paths)
    for path in paths:
        (run,) = runs[path]
        assert run["rows"] == 1000 and run["micro_batches"] == 2, path
        # Sampled per process: an exited worker keeps its CPU instead of going negative.
        assert all(seconds >= 0 for seconds in run["spark_cpu_s"].values()), (path, run["spark_cpu_s"])
    return runs


@pytest.mark.long  # ~30 s of Spark's own state stores; make test-long runs it
def test_spark_columnar_state_apis(spark):
    """Spark 4's transformWithStateInPandas and transformWithState on the RocksDB state store."""
    _spark_columnar_quick(spark, ["tws-pandas", "tws-row"])


@pytest.mark.long
def test_spark_source(spark):
    """The data source's bootstrap and full read beside Parquet; the script checks every read."""
    out = spark_source.main(["--quick"], spark=spark)
    assert {name: len(r["runs"]) for name, r in out["results"].items()} == {
        "write": 1,
        "read": 1,
        "parquet_write": 1,
        "parquet_read": 1,
        "checkpoint_read": 1,
        "savepoint_read": 1,
        "operator_live": 1,
        "operator_checkpoint": 1,
        "python_ceiling": 1,
        "python_write_ceiling": 1,
    }


@needs_redis
@pytest.mark.long
def test_spark_columnar_redis(spark):
    runs = _spark_columnar_quick(spark, ["redis", "redis-pipelined", "redis-aof"])
    assert all(runs[path][0]["server_cpu_s"] > 0 for path in runs)  # redis-server's own CPU


@needs_redis
@pytest.mark.long
def test_spark_columnar_prefilled(spark):
    """``--prefill``: every user stored first (Statehouse and Redis), the query started once the
    servers are idle; the script checks each path's sums and counts over the prefilled state."""
    out = spark_columnar.main(["--quick", "--prefill", "--paths", "columnar,redis-pipelined"], spark=spark)
    for path, (run,) in out["runs"][100].items():
        assert run["rows"] == 1000 and run["prefill_s"] > 0, path
        assert 0 < run["settled_s"] < spark_columnar.SETTLE_MOST, path
