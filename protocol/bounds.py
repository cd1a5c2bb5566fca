"""The ranges of the integers the API takes besides keys and values: writer epochs, checkpoint
ids, Spark partitions and request numbers. Each is stored, compared and rendered as a 64-bit
integer (Flink's checkpoint ids and Spark's ids are Java longs and ints), so one past its range
would be taken once and then fail everywhere it is read back; the engine, the HTTP models and
the client take their bounds from here."""

from __future__ import annotations

from statehouse.protocol.keygroups import INT32_MAX, INT64_MAX, INT64_MIN

__all__ = ["INT64_MAX", "INT64_MIN", "MAX_CHECKPOINT_ID", "MAX_EPOCH", "MAX_PARTITION", "MAX_SEQ"]

MAX_EPOCH = INT64_MAX
MAX_CHECKPOINT_ID = INT64_MAX
MAX_PARTITION = INT32_MAX  # Spark partition ids are Java ints
MAX_SEQ = INT64_MAX  # a task attempt's request number, and the write operations it staged
