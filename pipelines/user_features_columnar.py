"""The user-features job of :mod:`statehouse.pipelines.user_features`, through the columnar client.

The same input, the same four states with the same kinds and functions, the same sink: for
every micro-batch, exactly once, each user's events update

* ``total_spent`` — reducing ``sum`` of amounts (``value_type: float64``)
* ``avg_amount`` — aggregating ``avg`` of amounts (``value_type: float64``)
* ``recent_items`` — list of items with a TTL (default 7 days; ``value_type: string``)
* ``item_counts`` — map item → count (``sum``; ``value_type: int64``)

and the batch writes the touched users' features to ``<output>/batch_id=N/`` (JSON,
overwritten on a replay), one row per user, as the row-wise job does. The value types only
make the columnar reads typed (float64 columns, ``list<string>``, ``map<string, int64>``);
what is stored and how it folds is the row-wise job's.

Instead of grouping the events by user in Spark (``collect_list``) and sending one operation
per event from ``rdd.mapPartitions``, the micro-batch is repartitioned by user and handed to
``mapInPandas`` (:func:`~statehouse.client.spark.with_state_pandas`): per Arrow batch, one
columnar request per state and replica updates it — every event's amount and item as a column
(the server folds duplicate users in row order, as the row-wise job's ``add_all`` does), the
item counts grouped by ``(user, item)`` with pandas first (the row-wise job's ``Counter``).
When the task's partition is done, one columnar ``get`` per state reads the features of every
user it saw (its attempt's own writes included), so a user whose events span two Arrow batches
still gets one row. Run it against a running service:

    python -m statehouse.pipelines.user_features_columnar --input events/ --output features/ \\
        --checkpoint spark-checkpoint/ --statehouse http://127.0.0.1:8000

pandas and pyarrow are needed on the executors (the client's ``columnar`` extra); this module
imports them inside the tasks only.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any

from statehouse.client import ClientConfig, StatehouseClient
from statehouse.client.spark import BatchContext, with_state_pandas
from statehouse.pipelines import user_features

JOB = "user_features_columnar"
EVENT_SCHEMA = user_features.EVENT_SCHEMA
WEEK_MS = user_features.WEEK_MS
FEATURES = ("total_spent", "avg_amount", "recent_items", "item_counts")
FEATURES_SCHEMA = (
    "user_id STRING, batch_id LONG, total_spent DOUBLE, avg_amount DOUBLE, "
    "recent_items ARRAY<STRING>, item_counts MAP<STRING, LONG>"
)
# What makes each state's columnar reads typed; kinds and functions are the row-wise job's.
VALUE_TYPES = {"total_spent": "float64", "avg_amount": "float64", "recent_items": "string", "item_counts": "int64"}


def states(recent_ttl_ms: int = WEEK_MS) -> dict[str, dict[str, Any]]:
    return {
        name: {**descriptor, "value_type": VALUE_TYPES[name]}
        for name, descriptor in user_features.states(recent_ttl_ms).items()
    }


def setup(config: ClientConfig, job: str = JOB, max_parallelism: int = 128, recent_ttl_ms: int = WEEK_MS) -> None:
    """Create the job and register its states on every replica (idempotent)."""
    with StatehouseClient(config) as client:
        job_client = client.create_job(job, max_parallelism)
        for name, descriptor in states(recent_ttl_ms).items():
            job_client.register(name, **descriptor)


class PartitionEnd:
    """The last item a task's function gets, after its partition's last Arrow batch: the
    distinct users of the partition, in the order first seen."""

    def __init__(self, users: Any) -> None:
        self.users = users


def update_batch(batch: Any, columns: Any) -> None:
    """One Arrow batch of events (a pandas DataFrame): one columnar write per state."""
    users, amounts = batch["user_id"], batch["amount"]
    columns.add("total_spent", users, amounts)
    columns.add("avg_amount", users, amounts)
    columns.add("recent_items", users, batch["item"])  # one element per event, as add_all does
    counts = batch.groupby(["user_id", "item"], sort=False, dropna=False).size()
    columns.map_add(
        "item_counts",
        counts.index.get_level_values("user_id"),
        counts.index.get_level_values("item"),
        counts.to_numpy(),
    )


def read_features(users: Any, columns: Any, batch_id: int) -> Any:
    """The features of ``users`` (a pandas Series), one columnar read per state."""
    import pandas as pd  # type: ignore[import-untyped]  # inside the task: the columnar extra

    read = {state: columns.get(state, users).to_numpy() for state in FEATURES}
    return pd.DataFrame(
        {
            "user_id": users.to_numpy(),
            "batch_id": batch_id,
            "total_spent": read["total_spent"],
            "avg_amount": read["avg_amount"],
            "recent_items": [items if items is not None else [] for items in read["recent_items"]],
            "item_counts": [counts if counts is not None else {} for counts in read["item_counts"]],
        }
    )


def update_users(
    on_partition: Callable[[BatchContext], None] | None = None,
) -> Callable[[Any, Any, BatchContext], Any]:
    """The function for :func:`with_state_pandas`: writes per Arrow batch, reads at the end."""

    def step(batch: Any, columns: Any, ctx: BatchContext) -> Any:
        if isinstance(batch, PartitionEnd):
            if not len(batch.users):
                return None
            features = read_features(batch.users, columns, ctx.batch_id)
            if on_partition is not None:
                on_partition(ctx)
            return features
        if not ctx.replay and len(batch):  # a replay's updates are in the state already: only read
            update_batch(batch, columns)
        return None

    return step


def features_of(
    ctx: BatchContext, on_partition: Callable[[BatchContext], None] | None = None
) -> Callable[[Iterable[Any]], Iterator[Any]]:
    """For ``df.mapInPandas(features_of(ctx), FEATURES_SCHEMA)``, made on the driver once per
    micro-batch (one state update, however often Spark runs a task of it). ``on_partition``
    runs in the task after its writes and reads (tests inject failures there)."""
    return with_partition_end(with_state_pandas(ctx, update_users(on_partition)))


def with_partition_end(
    state_update: Callable[[Iterable[Any]], Iterator[Any]],
) -> Callable[[Iterable[Any]], Iterator[Any]]:
    """Wrap what :func:`with_state_pandas` returns so that its function gets one more item after
    the partition's last Arrow batch: :class:`PartitionEnd` with the partition's distinct
    ``user_id`` values (the helper itself gives no signal for the last batch)."""

    def run(batches: Iterable[Any]) -> Iterator[Any]:
        import pandas as pd

        seen: list[Any] = []  # each batch's distinct users

        def then_end() -> Iterator[Any]:
            for batch in batches:
                seen.append(batch["user_id"].drop_duplicates())
                yield batch
            users = pd.concat(seen, ignore_index=True).drop_duplicates() if seen else pd.Series([], dtype=object)
            yield PartitionEnd(users.reset_index(drop=True))

        yield from state_update(then_end())

    return run


def process_batch(
    output_dir: str, on_partition: Callable[[BatchContext], None] | None = None
) -> Callable[[Any, BatchContext], None]:
    """The body of ``foreachBatch``: a user's events in one partition, state updated and read
    on executors through the columnar client, the features written."""

    def process(df: Any, ctx: BatchContext) -> None:
        features = df.repartition("user_id").mapInPandas(features_of(ctx, on_partition), FEATURES_SCHEMA)
        features.write.mode("overwrite").json(f"{output_dir}/batch_id={ctx.batch_id}")

    return process


def start(spark: Any, **options: Any) -> Any:
    """Start the streaming query (the options of :func:`user_features.start`); returns the
    ``StreamingQuery``."""
    return user_features.start(spark, **{"job": JOB, **options, "process": process_batch})


def main(argv: list[str] | None = None) -> None:
    """Run it against a running service: the command line of :func:`user_features.main`."""
    user_features.main(
        argv,
        description=__doc__,
        app_name="statehouse-user-features-columnar",
        process=process_batch,
        prepare=setup,
        default_job=JOB,
    )


if __name__ == "__main__":
    main()
