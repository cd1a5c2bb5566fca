"""A Python data source that reads and writes nothing: a read makes its rows as Arrow columns in
the Python worker (C loops only) and hands them to Spark; a write takes the Arrow batches Spark
hands its Python worker and counts their rows. What Spark's Python data source path costs by
itself, the ceiling of any reader or writer written in Python, ``format("statehouse")`` included
(bench/spark_source.py runs it beside the state and Parquet)."""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.datasource import (
    DataSource,
    DataSourceArrowWriter,
    DataSourceReader,
    DataSourceWriter,
    InputPartition,
    WriterCommitMessage,
)
from pyspark.sql.types import StructType

SCHEMA = "key string, ns string, value double, key_group int"  # the columns a value state reads as
BATCH_ROWS = 10_000


class Rows(InputPartition):
    """Rows ``start``..``end`` (exclusive)."""

    def __init__(self, start: int, end: int) -> None:
        super().__init__((start, end))
        self.start, self.end = start, end


class ArrowRowsSource(DataSource):
    """``format("arrow-rows")`` with options ``rows`` and ``partitions``: keys ``k`` + 15 digits,
    value the row number as a double, as bench/spark_source.py writes its state."""

    @classmethod
    def name(cls) -> str:
        return "arrow-rows"

    def schema(self) -> str:
        return SCHEMA

    def reader(self, schema: StructType) -> DataSourceReader:
        return ArrowRowsReader(int(self.options["rows"]), int(self.options.get("partitions", "4")))

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        return CountingWriter(int(self.options["rows"]))


class ArrowRowsReader(DataSourceReader):
    def __init__(self, rows: int, partitions: int) -> None:
        self.rows, self.count = rows, partitions

    def partitions(self) -> Sequence[InputPartition]:
        bounds = [self.rows * i // self.count for i in range(self.count + 1)]
        return [Rows(low, high) for low, high in itertools.pairwise(bounds)]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, Rows)
        for low in range(partition.start, partition.end, BATCH_ROWS):
            ids = pa.array(range(low, min(low + BATCH_ROWS, partition.end)), pa.int64())
            digits = pc.utf8_lpad(pc.cast(ids, pa.string()), 15, "0")
            yield pa.RecordBatch.from_arrays(
                [
                    pc.binary_join_element_wise("k", digits, ""),
                    pa.array([""] * len(ids), pa.string()),
                    pc.cast(ids, pa.float64()),
                    pc.cast(pc.bit_wise_and(ids, 127), pa.int32()),
                ],
                names=["key", "ns", "value", "key_group"],
            )


class Counted(WriterCommitMessage):
    def __init__(self, rows: int) -> None:
        self.rows = rows


class CountingWriter(DataSourceArrowWriter):
    """Takes every batch and keeps nothing; the driver checks that every row arrived."""

    def __init__(self, expected: int) -> None:
        self.expected = expected

    def write(self, iterator: Iterator[pa.RecordBatch]) -> Counted:
        return Counted(sum(batch.num_rows for batch in iterator))

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        written = sum(m.rows for m in messages if isinstance(m, Counted))
        if written != self.expected:
            raise RuntimeError(f"arrow-rows: {written} rows arrived, {self.expected} were written")
