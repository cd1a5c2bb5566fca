"""The user-features job of :mod:`docs.examples.user_features`, through the columnar client.

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
request per replica updates both amount states and answers their new values (``add_get`` over
``total_spent`` and ``avg_amount``: every event's amount as a row, the server folding duplicate
users in row order as the row-wise job's ``add_all`` does), one adds the items, and one the
item counts grouped by ``(user, item)`` with pandas first (the row-wise job's ``Counter``).
When the task's partition is done, each user's amount features are their last answer (its
attempt's own writes included, so a user whose events span two Arrow batches still gets one
row) and one columnar ``get`` over the two other states reads the rest. Run it against a running service:

    python -m docs.examples.user_features_columnar --input events/ --output features/ \\
        --checkpoint spark-checkpoint/ --statehouse http://127.0.0.1:8000

pandas and pyarrow are needed on the executors (the client's ``columnar`` extra); this module
imports them inside the tasks only.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any

from docs.examples import user_features
from statehouse.client import ClientConfig, StatehouseClient
from statehouse.client.spark import BatchContext, with_state_pandas

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


# The states every event's amount folds into: one add_get request updates both and answers
# their new values, so the partition's end reads only the other two.
AMOUNTS = ("total_spent", "avg_amount")
LISTED = ("recent_items", "item_counts")


def update_batch(batch: Any, columns: Any) -> Any:
    """One Arrow batch of events (a pandas DataFrame): one columnar ``add_get`` over both amount
    states, one ``add`` of the items and one ``map_add`` of their counts. Returns the amount
    states' values after each event (a DataFrame with ``user_id``; a user's last row is theirs)."""
    users, amounts = batch["user_id"], batch["amount"]
    answered = columns.add_get_states({state: amounts for state in AMOUNTS}, users)
    answered.insert(0, "user_id", users.to_numpy())
    columns.add("recent_items", users, batch["item"])  # one element per event, as add_all does
    counts = batch.groupby(["user_id", "item"], sort=False, dropna=False).size()
    columns.map_add(
        "item_counts",
        counts.index.get_level_values("user_id"),
        counts.index.get_level_values("item"),
        counts.to_numpy(),
    )
    return answered


def read_features(users: Any, columns: Any, batch_id: int, answered: list[Any] | None = None) -> Any:
    """The features of ``users`` (a pandas Series): the amount states' from what the partition's
    ``add_get`` requests answered (``answered``: each user's values after their last event), or
    read when there are none (a replay); the others by one columnar read over both states."""
    import pandas as pd  # type: ignore[import-untyped]  # inside the task: the columnar extra

    keys = users.to_numpy()
    states = list(LISTED) if answered else list(FEATURES)
    got = columns.get_states(states, users)
    read = {state: got[state].to_numpy() for state in states}
    if answered:
        last = pd.concat(answered).drop_duplicates("user_id", keep="last").set_index("user_id").reindex(keys)
        read.update({state: last[state].to_numpy() for state in AMOUNTS})
    return pd.DataFrame(
        {
            "user_id": keys,
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
    answered: list[Any] = []  # this task's add_get answers (the function is unpickled per task)

    def step(batch: Any, columns: Any, ctx: BatchContext) -> Any:
        if isinstance(batch, PartitionEnd):
            if not len(batch.users):
                return None
            features = read_features(batch.users, columns, ctx.batch_id, answered)
            answered.clear()
            if on_partition is not None:
                on_partition(ctx)
            return features
        if not ctx.replay and len(batch):  # a replay's updates are in the state already: only read
            answered.append(update_batch(batch, columns))
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
