"""Statehouse as a Spark data source (PySpark's Python Data Source API, Spark 4.x): read a job's
state as a DataFrame, bootstrap or patch it from one, and keep it updated from a stream::

    from statehouse.client.datasource import register
    register(spark)
    df = spark.read.format("statehouse").option("urls", URLS).option("job", J).option("state", S).load()

The only module of the client that imports pyspark (the ``spark`` extra) and pyarrow. See
docs/spark.md, "State as a DataFrame".
"""

from typing import Any

from statehouse.client.datasource.options import SourceError
from statehouse.client.datasource.source import StatehouseDataSource

# Spark refuses to plan a read whose Python source filters unless the session allows it.
PUSHDOWN_CONF = "spark.sql.python.filterPushdown.enabled"
# Spark shows a Python source's error as the worker's traceback, the problem on its last line;
# without it, the error is one line naming what to fix (an exception from a task still follows
# Spark's "An exception was thrown from the Python worker:" line).
HIDE_TRACEBACK_CONF = "spark.sql.execution.pyspark.udf.hideTraceback.enabled"


def register(spark: Any, *, tracebacks: bool = False) -> None:
    """Register ``format("statehouse")`` with the session, and let it push key filters down (Spark's
    ``spark.sql.python.filterPushdown.enabled``, off by default): ``spark.dataSource.register`` plus
    that setting. A read that does not set ``partitions_per_replica`` makes enough input
    partitions for the session's default parallelism. Unless ``tracebacks``, also
    ``spark.sql.execution.pyspark.udf.hideTraceback.enabled``, so a refusal reads as one line
    saying what to fix rather than a Python traceback; the setting is the session's, so pass
    ``tracebacks=True`` to keep the tracebacks of your own Python UDFs."""
    spark.conf.set(PUSHDOWN_CONF, "true")
    if not tracebacks:
        spark.conf.set(HIDE_TRACEBACK_CONF, "true")
    # The session's default parallelism goes with the class Spark ships to its Python workers
    # (which have no session): a read that does not say how many partitions to make uses every core.
    source = type(StatehouseDataSource.__name__, (StatehouseDataSource,), {"parallelism": session_parallelism(spark)})
    spark.dataSource.register(source)


def session_parallelism(spark: Any) -> int | None:
    """``spark.sparkContext.defaultParallelism``, or ``spark.default.parallelism`` where the session
    has no context (Spark Connect); ``None`` when neither says."""
    try:
        return int(spark.sparkContext.defaultParallelism)
    except Exception:
        try:
            return int(spark.conf.get("spark.default.parallelism"))
        except Exception:
            return None


__all__ = [
    "HIDE_TRACEBACK_CONF",
    "PUSHDOWN_CONF",
    "SourceError",
    "StatehouseDataSource",
    "register",
    "session_parallelism",
]
