"""Arrow IPC stream bodies for the columnar endpoint, and the values its answers carry."""

from __future__ import annotations

from typing import Any

import httpx
import pyarrow as pa

ARROW = "application/vnd.apache.arrow.stream"


def stream(table: pa.Table, **options: Any) -> bytes:
    """``table`` as one IPC stream; ``options`` are pyarrow's ``IpcWriteOptions`` (compression...)."""
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema, options=pa.ipc.IpcWriteOptions(**options)) as writer:
        writer.write_table(table)
    return sink.getvalue().to_pybytes()


def arrow(**columns: Any) -> bytes:
    """One IPC stream of a table of these columns (lists or Arrow arrays)."""
    return stream(pa.table(columns))


def post(
    http: httpx.Client, job: str, state: str, op: str, body: bytes, params: dict[str, Any] | None = None
) -> httpx.Response:
    """POST an IPC body to a state's columnar ``op`` (``job`` is the job's path, ``/jobs/<name>``)."""
    return http.post(f"{job}/states/{state}/columns/{op}", content=body, headers={"content-type": ARROW}, params=params)


def read(response: httpx.Response) -> pa.Table:
    """The table of a 200 Arrow answer."""
    assert response.status_code == 200, response.text
    assert response.headers["content-type"] == ARROW
    return pa.ipc.open_stream(response.content).read_all()


def values(response: httpx.Response) -> list[Any]:
    """The ``value`` column of a 200 Arrow answer, as Python values."""
    return read(response).column("value").to_pylist()
