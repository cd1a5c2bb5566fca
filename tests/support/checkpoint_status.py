"""A checkpoint's status over HTTP, waited for."""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any

import httpx


def wait_status(
    http: httpx.Client,
    job: str,
    checkpoint_id: int,
    statuses: Iterable[str] = ("uploaded", "completed"),
    timeout: float = 20,
) -> dict[str, Any]:
    """The checkpoint's description (``GET <job>/checkpoints/<id>``, ``job`` being the job's path)
    once its status is one of ``statuses`` or ``failed``; an AssertionError after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    info: dict[str, Any] = {}
    while time.monotonic() < deadline:
        info = http.get(f"{job}/checkpoints/{checkpoint_id}").json()
        if info["status"] in statuses or info["status"] == "failed":
            return info
        time.sleep(0.05)
    raise AssertionError(f"checkpoint {checkpoint_id} stuck: {info}")
