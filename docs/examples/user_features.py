"""Per-user features from a stream of purchase events, with state in Statehouse.

Events are JSON lines ``{"user_id", "item", "amount", "event_time"}`` dropped into a
directory. For every micro-batch, each user's events update four states, exactly once:

* ``total_spent`` — reducing ``sum`` of amounts
* ``avg_amount`` — aggregating ``avg`` of amounts
* ``recent_items`` — list of items with a TTL (default 7 days)
* ``item_counts`` — map item → count (a map with ``sum``: ``map_add`` per item)

and the batch writes the touched users' features to ``<output>/batch_id=N/`` (JSON,
overwritten on a replay, so the sink is idempotent). Run against a running service:

    python -m docs.examples.user_features --input events/ --output features/ \\
        --checkpoint spark-checkpoint/ --statehouse http://127.0.0.1:8000
"""

from __future__ import annotations

import argparse
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from docs.examples.streaming import executors_run_this_checkout, start_json_stream
from statehouse.client import ClientConfig, StatehouseClient
from statehouse.client.job import JobClient
from statehouse.client.spark import BatchContext, exactly_once, with_state

JOB = "user_features"
EVENT_SCHEMA = "user_id STRING, item STRING, amount DOUBLE, event_time STRING"
WEEK_MS = 7 * 24 * 3600 * 1000


def states(recent_ttl_ms: int = WEEK_MS) -> dict[str, dict[str, Any]]:
    return {
        "total_spent": {"kind": "reducing", "function": "sum"},
        "avg_amount": {"kind": "aggregating", "function": "avg"},
        "recent_items": {"kind": "list", "ttl": {"ttl_ms": recent_ttl_ms}},
        "item_counts": {"kind": "map", "function": "sum"},
    }


def setup(config: ClientConfig, job: str = JOB, max_parallelism: int = 128, recent_ttl_ms: int = WEEK_MS) -> None:
    """Create the job and register its states on every replica (idempotent)."""
    with StatehouseClient(config) as client:
        job_client = client.create_job(job, max_parallelism)
        for name, descriptor in states(recent_ttl_ms).items():
            job_client.register(name, **descriptor)


def update_users(rows: Iterable[Any], job: JobClient, ctx: BatchContext) -> Iterator[dict[str, Any]]:
    """One partition of ``(user_id, [(item, amount), ...])``: apply the updates, return the features."""
    users = [(row["user_id"], [(e["item"], e["amount"]) for e in row["events"]]) for row in rows]
    if not users:
        return
    if not ctx.replay:  # a replay's updates are in the state already: only read
        with ctx.writes(job) as writes:  # staged under this task attempt, one request per replica
            for user, events in users:
                amounts = [amount for _item, amount in events]
                items = [item for item, _amount in events]
                writes.add_all("total_spent", user, amounts)
                writes.add_all("avg_amount", user, amounts)
                writes.add_all("recent_items", user, items)
                for item, n in Counter(items).items():
                    writes.map_add("item_counts", user, item, n)
    with ctx.reads(job) as reads:  # sees this attempt's own writes
        features = {
            user: [reads.get(state, user) for state in ("total_spent", "avg_amount", "recent_items", "item_counts")]
            for user, _events in users
        }
    for user, (total, avg, recent, item_counts) in features.items():
        yield {
            "user_id": user,
            "batch_id": ctx.batch_id,
            "total_spent": total.value,
            "avg_amount": avg.value,
            "recent_items": recent.value or [],
            "item_counts": item_counts.value or {},
        }


def process_batch(
    output_dir: str, on_partition: Callable[[BatchContext], None] | None = None
) -> Callable[[Any, BatchContext], None]:
    """The body of ``foreachBatch``: group by user in Spark, update state on executors, write features."""
    from pyspark.sql import functions as F

    def process(df: Any, ctx: BatchContext) -> None:
        grouped = df.groupBy("user_id").agg(F.collect_list(F.struct("item", "amount")).alias("events"))

        def update(rows: Iterable[Any], job: JobClient, ctx: BatchContext) -> Iterator[dict[str, Any]]:
            yield from update_users(rows, job, ctx)
            if on_partition is not None:
                on_partition(ctx)

        features = grouped.rdd.mapPartitions(with_state(ctx, update))
        spark = df.sparkSession
        schema = (
            "user_id STRING, batch_id LONG, total_spent DOUBLE, avg_amount DOUBLE, "
            "recent_items ARRAY<STRING>, item_counts MAP<STRING, LONG>"
        )
        out = spark.createDataFrame(features, schema)
        out.write.mode("overwrite").json(f"{output_dir}/batch_id={ctx.batch_id}")

    return process


ProcessBatch = Callable[[str, Callable[[BatchContext], None] | None], Callable[[Any, BatchContext], None]]


def start(
    spark: Any,
    *,
    input_dir: str,
    output_dir: str,
    checkpoint_dir: str,
    config: ClientConfig,
    job: str = JOB,
    max_files_per_trigger: int = 1,
    available_now: bool = True,
    on_partition: Callable[[BatchContext], None] | None = None,
    process: ProcessBatch = process_batch,
) -> Any:
    """Start the streaming query; returns the ``StreamingQuery``. ``process`` makes the body of
    ``foreachBatch`` (the columnar job passes its own)."""
    return start_json_stream(
        spark,
        EVENT_SCHEMA,
        input_dir=input_dir,
        checkpoint_dir=checkpoint_dir,
        for_each_batch=exactly_once(config, job, process(output_dir, on_partition)),
        max_files_per_trigger=max_files_per_trigger,
        available_now=available_now,
    )


def main(
    argv: list[str] | None = None,
    *,
    description: str = __doc__,
    app_name: str = "statehouse-user-features",
    process: ProcessBatch = process_batch,
    prepare: Callable[[ClientConfig, str, int], None] = setup,
    default_job: str = JOB,
) -> None:
    """The command line; the columnar job passes its own body, state setup and job name."""
    parser = argparse.ArgumentParser(description=description.split("\n\n")[0])
    parser.add_argument("--input", required=True, help="directory of JSON event files")
    parser.add_argument("--output", required=True, help="directory for per-batch feature files")
    parser.add_argument("--checkpoint", required=True, help="Spark checkpoint location")
    parser.add_argument("--statehouse", default="http://127.0.0.1:8000", help="replica URLs, comma-separated")
    parser.add_argument("--token", default=None, help="bearer token, if the service requires one")
    parser.add_argument("--job", default=default_job)
    parser.add_argument("--max-parallelism", type=int, default=128)
    parser.add_argument("--continuous", action="store_true", help="keep running instead of stopping when caught up")
    args = parser.parse_args(argv)

    from pyspark.sql import SparkSession

    executors_run_this_checkout()
    config = ClientConfig.of(args.statehouse, token=args.token)
    prepare(config, args.job, args.max_parallelism)
    spark = SparkSession.builder.appName(app_name).getOrCreate()
    query = start(
        spark,
        input_dir=args.input,
        output_dir=args.output,
        checkpoint_dir=args.checkpoint,
        config=config,
        job=args.job,
        available_now=not args.continuous,
        process=process,
    )
    query.awaitTermination()


if __name__ == "__main__":
    main()
