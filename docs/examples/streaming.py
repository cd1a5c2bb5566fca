"""What the example jobs share: a streaming query over a directory of JSON event files."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any


def executors_run_this_checkout() -> None:
    """Before the session starts: executors run this interpreter (which has the client's
    dependencies) and import the example modules by name (``docs.examples.*``) from this
    checkout, which Spark passes on to them through ``PYTHONPATH``."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    checkout = str(Path(__file__).resolve().parents[2])
    paths = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    if checkout not in paths:
        os.environ["PYTHONPATH"] = os.pathsep.join([checkout, *paths])


def start_json_stream(
    spark: Any,
    schema: str,
    *,
    input_dir: str,
    checkpoint_dir: str,
    for_each_batch: Callable[[Any, int], None],
    max_files_per_trigger: int = 1,
    available_now: bool = True,
) -> Any:
    """Start a query reading ``max_files_per_trigger`` JSON files of ``input_dir`` per micro-batch
    (rows of ``schema``) into ``for_each_batch`` (``foreachBatch``; the jobs pass it wrapped in
    ``exactly_once``), with Spark's checkpoint in ``checkpoint_dir``; ``available_now`` stops it
    once caught up. Returns the ``StreamingQuery``."""
    events = spark.readStream.schema(schema).option("maxFilesPerTrigger", max_files_per_trigger).json(input_dir)
    writer = events.writeStream.option("checkpointLocation", checkpoint_dir).foreachBatch(for_each_batch)
    if available_now:
        writer = writer.trigger(availableNow=True)
    return writer.start()
