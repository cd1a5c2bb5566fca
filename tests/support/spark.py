"""A local Spark session for tests and test drivers (see ../shared/TESTING.md, Spark)."""

from __future__ import annotations

import contextlib
import fcntl
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from docs.examples.streaming import executors_run_this_checkout

# C1 only and the serial GC: the JVM starts about twice as fast.
JAVA_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
# A class-data-sharing archive of the classes a Spark session loads (JDK 13+ dynamic CDS), made
# once per venv and Spark version: a session with it started and ran its first job in 16 s
# instead of 34-37 s on a loaded 2-core machine, and a test run starts 20+ Spark JVMs. A JVM that
# cannot use it (another JDK, another classpath) ignores it and starts as before.
NO_ARCHIVE_ENV = "STATEHOUSE_SPARK_NO_CDS"


def class_archive() -> Path | None:
    """The session classes' archive in this venv, made now if it is not there (one JVM run under a
    lock, so that parallel drivers make it once); ``None`` if it cannot be made."""
    if os.environ.get(NO_ARCHIVE_ENV):
        return None
    import pyspark

    archive = Path(sys.prefix) / f"spark-classes-{pyspark.__version__}.jsa"
    if archive.exists():
        return archive
    with open(archive.with_suffix(".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if archive.exists():
            return archive
        partial = archive.with_suffix(f".{os.getpid()}.part")
        make = [sys.executable, "-c", f"from tests.support.spark import _warm; _warm({str(partial)!r})"]
        env = {**os.environ, NO_ARCHIVE_ENV: "1"}
        repo = Path(__file__).resolve().parents[2]
        done = subprocess.run(make, cwd=repo, env=env, capture_output=True, check=False)
        if done.returncode != 0 or not partial.exists():
            with contextlib.suppress(FileNotFoundError):
                partial.unlink()
            return None
        partial.replace(archive)
    return archive


def _warm(archive: str) -> None:
    """Start a session and run a small query; the JVM writes the classes it loaded at exit."""
    session = local_spark("statehouse-class-archive", f"-XX:ArchiveClassesAtExit={archive} -Xlog:cds=off")
    session.range(100).selectExpr("sum(id)", "count(*)").collect()
    session.createDataFrame([(1, "a")], "k int, v string").groupBy("v").count().collect()
    session.stop()


def jvm_options() -> str:
    """What a driver JVM here starts with: :data:`JAVA_OPTIONS` and the class archive, if there is one."""
    archive = class_archive()
    return f"{JAVA_OPTIONS} -XX:SharedArchiveFile={archive} -Xlog:cds=off" if archive is not None else JAVA_OPTIONS


def local_spark(app_name: str, java_options: str | None = None) -> Any:
    """``local[2,2]``: two threads, and a failed task is retried once (spark.task.maxFailures=2),
    as on a cluster. Executors run this interpreter (the venv's packages); the driver's JVM runs
    with :data:`JAVA_OPTIONS` and the class archive (:func:`class_archive`)."""
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ["PYSPARK_PYTHON"] = sys.executable
    # Python workers import the checkout's modules by name (docs.examples, tests.support).
    executors_run_this_checkout()
    driver_options = jvm_options() if java_options is None else f"{JAVA_OPTIONS} {java_options}"
    from pyspark.sql import SparkSession

    session = (
        SparkSession.builder.master("local[2,2]")
        .appName(app_name)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "4")
        .config("spark.default.parallelism", "4")
        .config("spark.driver.extraJavaOptions", driver_options)
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    return session


if __name__ == "__main__":  # make test: the archive made before the tests, once per venv
    print(f"Spark's class archive: {class_archive() or 'none (the JVMs start without one)'}")
