"""Helpers for the checkpoint and restore benchmarks: fill a job, change a fraction of it,
take checkpoints through the HTTP API and wait for them."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import httpx
import msgpack

from bench.common import keys

MSGPACK = "application/msgpack"
_HEADERS = {"content-type": MSGPACK, "accept": MSGPACK}


def create_job(http: httpx.Client, job: str, max_parallelism: int = 128) -> None:
    http.put(f"/v1/jobs/{job}", json={"max_parallelism": max_parallelism}).raise_for_status()
    http.put(f"/v1/jobs/{job}/states/v", json={"kind": "value"}).raise_for_status()


def put_random(http: httpx.Client, job: str, key_list: list[str], batch: int = 5000) -> None:
    """Write 100 random (incompressible) bytes under each key, ``batch`` keys per request."""
    for start in range(0, len(key_list), batch):
        ops = [{"op": "put", "state": "v", "key": k, "value": os.urandom(100)} for k in key_list[start : start + batch]]
        body = msgpack.packb({"ops": ops}, use_bin_type=True)
        response = http.post(f"/v1/jobs/{job}/batch", content=body, headers=_HEADERS)
        response.raise_for_status()


def fill(http: httpx.Client, job: str, count: int) -> list[str]:
    key_list = keys(count)
    put_random(http, job, key_list)
    return key_list


def trigger(http: httpx.Client, job: str, checkpoint_id: int, kind: str = "checkpoint") -> None:
    body = {"checkpoint_id": checkpoint_id, "kind": kind}
    http.post(f"/v1/jobs/{job}/checkpoints", json=body).raise_for_status()


def wait_uploaded(http: httpx.Client, job: str, checkpoint_id: int, timeout: float = 1800) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        info = http.get(f"/v1/jobs/{job}/checkpoints/{checkpoint_id}").json()
        if info["status"] in ("failed", "aborted"):
            raise RuntimeError(f"checkpoint {checkpoint_id} {info['status']}: {info.get('error')}")
        if info["status"] != "in_progress":
            return info
        time.sleep(0.02)
    raise RuntimeError(f"checkpoint {checkpoint_id} not uploaded in {timeout}s")


def checkpoint(http: httpx.Client, job: str, checkpoint_id: int, kind: str = "checkpoint") -> tuple[dict, float]:
    """Trigger, wait for the upload, complete; returns the completed info and the seconds to upload."""
    started = time.perf_counter()
    trigger(http, job, checkpoint_id, kind)
    wait_uploaded(http, job, checkpoint_id)
    elapsed = time.perf_counter() - started
    info = http.post(f"/v1/jobs/{job}/checkpoints/{checkpoint_id}/complete", timeout=600).json()
    return info, elapsed


def dir_bytes(path: Path) -> int:
    """What the files under ``path`` take (0 when there is none)."""
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def mb(n: float) -> str:
    return f"{n / 1e6:,.1f} MB"
