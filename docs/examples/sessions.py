"""User sessions closed by event-time timers, with state and timers in Statehouse.

Events are JSON lines ``{"user_id", "ts"}`` (``ts`` in milliseconds) dropped into a directory.
A session is a run of a user's events with gaps of at most ``gap_ms``. For every micro-batch,
exactly once:

1. the batch's events extend or start each user's session (value state ``session``:
   ``{"start", "end", "events"}``) and move its event-time timer to ``end + gap_ms``; an event
   beyond the gap closes the old session at once;
2. the watermark becomes the batch's latest event time minus ``lateness_ms``, and each task
   fires the timers of its own key groups (the rows are partitioned by key group,
   ``client.spark.by_key_group``): every timer due closes its session (Spark's
   ``handleExpiredTimer``);

and the batch writes the sessions it closed to ``<output>/batch_id=N/`` (JSON, overwritten on a
re-run of the batch). Run against a running service:

    python -m docs.examples.sessions --input events/ --output sessions/ \\
        --checkpoint spark-checkpoint/ --statehouse http://127.0.0.1:8000
"""

from __future__ import annotations

import argparse
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from docs.examples.streaming import executors_run_this_checkout, start_json_stream
from statehouse.client import ClientConfig, StatehouseClient
from statehouse.client.job import JobClient
from statehouse.client.spark import BatchContext, by_key_group, exactly_once, with_state

JOB = "sessions"
EVENT_SCHEMA = "user_id STRING, ts LONG"
SESSION_SCHEMA = "user_id STRING, start LONG, end LONG, events LONG, closed_by STRING, batch_id LONG"
GAP_MS = 30 * 60 * 1000
MIN_TS = -(2**63)


def setup(config: ClientConfig, job: str = JOB, max_parallelism: int = 128) -> None:
    """Create the job and register its state on every replica (idempotent)."""
    with StatehouseClient(config) as client:
        client.create_job(job, max_parallelism).register("session", "value")


def _closed(user: str, session: dict[str, Any], closed_by: str, batch_id: int) -> dict[str, Any]:
    return {"user_id": user, **session, "closed_by": closed_by, "batch_id": batch_id}


def update_sessions(
    rows: Iterable[tuple[str, int]],
    job: JobClient,
    ctx: BatchContext,
    *,
    gap_ms: int,
    watermark: int,
    partitions: int,
) -> Iterator[dict[str, Any]]:
    """One partition of ``(user_id, ts)`` pairs (its key groups' users): update the sessions,
    fire this partition's due timers; yields the sessions closed."""
    events: dict[str, list[int]] = defaultdict(list)
    for user, ts in rows:
        events[user].append(ts)
    with ctx.reads(job) as reads:
        found = {user: reads.get("session", user) for user in events}
    closed = []
    with ctx.writes(job) as writes:
        for user, times in events.items():
            session = found[user].value
            before = session
            for ts in sorted(times):
                if session is not None and ts <= session["end"] + gap_ms:
                    session = {
                        "start": min(session["start"], ts),
                        "end": max(session["end"], ts),
                        "events": session["events"] + 1,
                    }
                    continue
                if session is not None:  # beyond the gap: the old session is over
                    closed.append(_closed(user, session, "gap", ctx.batch_id))
                session = {"start": ts, "end": ts, "events": 1}
            if before is not None:
                writes.delete_timer(user, before["end"] + gap_ms)
            writes.register_timer(user, session["end"] + gap_ms)
            writes.put("session", user, session)
    fired = {str(t.key): t.timestamp for t in ctx.fire_timers(job, watermark, partitions=partitions)}
    if fired:
        with ctx.reads(job) as reads:
            due = {user: reads.get("session", user) for user in fired}
        with ctx.writes(job) as writes:
            for user, pending in due.items():
                session = pending.value
                if session is not None and session["end"] + gap_ms == fired[user]:  # the session's own timer
                    closed.append(_closed(user, session, "watermark", ctx.batch_id))
                    writes.clear("session", user)
    yield from closed


def process_batch(
    output_dir: str,
    *,
    gap_ms: int = GAP_MS,
    lateness_ms: int = 0,
    max_parallelism: int = 128,
    partitions: int = 4,
    on_partition: Callable[[BatchContext], None] | None = None,
) -> Callable[[Any, BatchContext], None]:
    """The body of ``foreachBatch``: the batch's watermark on the driver, sessions on executors."""
    from pyspark.sql import functions as F

    def process(df: Any, ctx: BatchContext) -> None:
        if ctx.replay:
            # Statehouse commits a batch only after this function returned, so the run that
            # committed it wrote its output whole; the replay (Spark lost its own commit of the
            # batch) can neither close those sessions again (their timers fired) nor may it
            # overwrite them with nothing.
            return
        latest = df.agg(F.max("ts")).first()[0]
        watermark = MIN_TS if latest is None else latest - lateness_ms
        pairs = by_key_group(df.rdd.map(lambda r: (r["user_id"], r["ts"])), max_parallelism, partitions)

        def update(rows: Iterable[Any], job: JobClient, ctx: BatchContext) -> Iterator[dict[str, Any]]:
            yield from update_sessions(rows, job, ctx, gap_ms=gap_ms, watermark=watermark, partitions=partitions)
            if on_partition is not None:
                on_partition(ctx)

        closed = pairs.mapPartitions(with_state(ctx, update))
        spark = df.sparkSession
        spark.createDataFrame(closed, SESSION_SCHEMA).write.mode("overwrite").json(
            f"{output_dir}/batch_id={ctx.batch_id}"
        )

    return process


def start(
    spark: Any,
    *,
    input_dir: str,
    output_dir: str,
    checkpoint_dir: str,
    config: ClientConfig,
    job: str = JOB,
    available_now: bool = True,
    **options: Any,
) -> Any:
    """Start the streaming query (one input file per micro-batch); returns the ``StreamingQuery``.
    ``options`` go to :func:`process_batch` (``gap_ms``, ``lateness_ms``, ``partitions``, ...)."""
    return start_json_stream(
        spark,
        EVENT_SCHEMA,
        input_dir=input_dir,
        checkpoint_dir=checkpoint_dir,
        for_each_batch=exactly_once(config, job, process_batch(output_dir, **options)),
        available_now=available_now,
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--input", required=True, help="directory of JSON event files")
    parser.add_argument("--output", required=True, help="directory for per-batch closed sessions")
    parser.add_argument("--checkpoint", required=True, help="Spark checkpoint location")
    parser.add_argument("--statehouse", default="http://127.0.0.1:8000", help="replica URLs, comma-separated")
    parser.add_argument("--token", default=None, help="bearer token, if the service requires one")
    parser.add_argument("--job", default=JOB)
    parser.add_argument("--gap-ms", type=int, default=GAP_MS)
    parser.add_argument("--lateness-ms", type=int, default=0)
    parser.add_argument("--max-parallelism", type=int, default=128)
    parser.add_argument("--continuous", action="store_true", help="keep running instead of stopping when caught up")
    args = parser.parse_args(argv)

    from pyspark.sql import SparkSession

    executors_run_this_checkout()
    config = ClientConfig.of(args.statehouse, token=args.token)
    setup(config, args.job, args.max_parallelism)
    spark = SparkSession.builder.appName("statehouse-sessions").getOrCreate()
    query = start(
        spark,
        input_dir=args.input,
        output_dir=args.output,
        checkpoint_dir=args.checkpoint,
        config=config,
        job=args.job,
        available_now=not args.continuous,
        gap_ms=args.gap_ms,
        lateness_ms=args.lateness_ms,
        max_parallelism=args.max_parallelism,
    )
    query.awaitTermination()


if __name__ == "__main__":
    main()
