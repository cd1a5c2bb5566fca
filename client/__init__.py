"""Statehouse's Python client for Spark drivers and executors (no FastAPI inside).

from statehouse.client import StatehouseClient
with StatehouseClient(["http://sh-0:8000", "http://sh-1:8000"]) as sh:
    job = sh.job("features", max_parallelism=128)
    spent = job.register("spent", "reducing", function="sum")
    spent.add("alice", 12.5)
    with job.batch() as batch:
        total = batch.get("spent", "alice")
    print(total.value)
"""

from statehouse.client.batch import Batch, PendingResult
from statehouse.client.client import StatehouseClient
from statehouse.client.config import ClientConfig
from statehouse.client.errors import (
    Conflict,
    InvalidRequest,
    KeyNotOwned,
    NotFound,
    StaleEpoch,
    StatehouseError,
    Unauthorized,
    Unavailable,
)
from statehouse.client.job import JobClient

__all__ = [
    "Batch",
    "ClientConfig",
    "Conflict",
    "InvalidRequest",
    "JobClient",
    "KeyNotOwned",
    "NotFound",
    "PendingResult",
    "StaleEpoch",
    "StatehouseClient",
    "StatehouseError",
    "Unauthorized",
    "Unavailable",
]
