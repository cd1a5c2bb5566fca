"""What the example jobs share: a streaming query over a directory of JSON event files."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


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
