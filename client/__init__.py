"""Statehouse's Python client for Spark drivers and executors (no FastAPI inside).

from statehouse.client import StatehouseClient
with StatehouseClient(["http://sh-0:8000", "http://sh-1:8000"]) as sh:
    job = sh.create_job("features", max_parallelism=128)
    spent = job.register("spent", "reducing", function="sum")
    spent.add("alice", 12.5)
    with job.batch() as batch:
        total = batch.get("spent", "alice")
    print(total.value)

Whole columns at once (pandas, numpy, Arrow; the ``columnar`` extra: pyarrow, numpy, pandas)::

    spent.add_many(df["user_id"], df["amount"])      # one Arrow request per replica
    df["total"] = spent.get_many(df["user_id"])      # a Series with df's index
    cols = job.columns()                             # every columnar operation of the job

Only the columnar modules (``statehouse.client.columns``, ``.timer_columns`` and the conversions
they share, ``.arrow``) import pyarrow, numpy and pandas, when first used
(``statehouse.client.Columns`` loads them), so a row-wise user installs none of them.
"""

from typing import TYPE_CHECKING, Any

from statehouse_guard import conflict as _conflict  # outside the namespace (client/packaging/statehouse_guard.py)

# Another project's statehouse/__init__.py imports this package first: a library import then ends
# with the one line that says what conflicts, not inside that project's __init__.
if (_problem := _conflict()) is not None:
    raise ImportError(_problem.removeprefix("statehouse: "))

from statehouse.client.batch import Batch, PendingResult
from statehouse.client.client import StatehouseClient
from statehouse.client.config import ClientConfig
from statehouse.client.errors import (
    Conflict,
    Forbidden,
    InvalidRequest,
    KeyNotOwned,
    LayoutError,
    NotFound,
    StaleEpoch,
    StatehouseError,
    Unauthorized,
    Unavailable,
)
from statehouse.client.job import JobClient

if TYPE_CHECKING:
    from statehouse.client.columns import Columns as Columns


def __getattr__(name: str) -> Any:
    if name == "Columns":  # loaded on first use: it imports pyarrow, numpy and pandas
        from statehouse.client.columns import Columns

        return Columns
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "Batch",
    "ClientConfig",
    "Conflict",
    "Forbidden",
    "InvalidRequest",
    "JobClient",
    "KeyNotOwned",
    "LayoutError",
    "NotFound",
    "PendingResult",
    "StaleEpoch",
    "StatehouseClient",
    "StatehouseError",
    "Unauthorized",
    "Unavailable",
]
