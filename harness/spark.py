"""A local Spark session for tests and test drivers (see ../shared/TESTING.md, Spark)."""

from __future__ import annotations

import os
import sys
from typing import Any


def local_spark(app_name: str) -> Any:
    """``local[2,2]``: two threads, and a failed task is retried once (spark.task.maxFailures=2),
    as on a cluster. Executors run this interpreter (the venv's packages); the JVM starts about
    twice as fast with C1 only and the serial GC."""
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ["PYSPARK_PYTHON"] = sys.executable
    from pyspark.sql import SparkSession

    session = (
        SparkSession.builder.master("local[2,2]")
        .appName(app_name)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "4")
        .config("spark.default.parallelism", "4")
        .config("spark.driver.extraJavaOptions", "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    return session
