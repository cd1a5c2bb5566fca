"""Schemathesis extension (``SCHEMATHESIS_HOOKS=tests.support.schemathesis_hooks``): a serializer for the
columnar endpoint's Arrow bodies, which schemathesis cannot make on its own.

From the bytes schemathesis generates for the binary body it makes either those bytes as they are
(garbage the server must refuse with a declared 4xx) or a real Arrow stream whose columns and
values come from the bytes: ``key`` always, ``value``, ``user_key`` and ``ns`` by the bits of the
second byte, so that every operation sometimes gets the columns it needs and sometimes not.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import schemathesis


def _stream(table: pa.Table) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue().to_pybytes()


@schemathesis.serializer("application/vnd.apache.arrow.stream")
def arrow(ctx: Any, value: Any) -> bytes:
    data = value if isinstance(value, bytes) else str(value).encode()
    if len(data) < 2 or data[0] % 3 == 0:
        return data
    bits, text = data[1], data[2:].decode("utf-8", "replace")
    keys = [text, text[:4], text]
    columns: dict[str, pa.Array] = {"key": pa.array(keys)}
    if bits & 1:
        columns["value"] = pa.array([float(len(text)), -1.5, 2.0]) if bits & 8 else pa.array([text, "", "x"])
    if bits & 2:
        columns["user_key"] = pa.array([text[::-1], "u", text])
    if bits & 4:
        columns["ns"] = pa.array(["", text[:2], None])
    return _stream(pa.table(columns))
