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


def register(spark: Any) -> None:
    """Register ``format("statehouse")`` with the session, and let it push key filters down (Spark's
    ``spark.sql.python.filterPushdown.enabled``, off by default): ``spark.dataSource.register`` plus
    that setting."""
    spark.conf.set(PUSHDOWN_CONF, "true")
    spark.dataSource.register(StatehouseDataSource)


__all__ = ["PUSHDOWN_CONF", "SourceError", "StatehouseDataSource", "register"]
