"""Content negotiation for the binary-capable endpoints: JSON or msgpack, both ways.

Bodies are decoded straight into Python values (orjson / msgpack), never into one pydantic
model per item: this is the hot path of Spark executors.
"""

from __future__ import annotations

import base64
import json
import re
from typing import Any

import msgpack
import orjson
import pyarrow as pa
from starlette.requests import Request
from starlette.responses import Response

from statehouse.app.arrow_body import read_stream
from statehouse.app.problems import ApiError

MSGPACK = "application/msgpack"
JSON = "application/json"
ARROW_STREAM = "application/vnd.apache.arrow.stream"
_MSGPACK_TYPES = ("application/msgpack", "application/x-msgpack", "application/vnd.msgpack")


def _json_default(value: Any) -> Any:
    # JSON has no bytes: values stored through the msgpack API come back base64-encoded.
    if isinstance(value, bytes | bytearray | memoryview):
        return base64.b64encode(bytes(value)).decode("ascii")
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


def _media(content_type: str | None, default: str = "") -> str:
    """The media type of a Content-Type header, without parameters, lower case."""
    return (content_type or default).split(";", 1)[0].strip().lower()


def is_msgpack(content_type: str | None) -> bool:
    return _media(content_type) in _MSGPACK_TYPES


async def read_body(request: Request) -> Any:
    """Decode the body by its Content-Type (JSON when absent); 400/415 when it cannot be."""
    content_type = request.headers.get("content-type")
    raw = await request.body()
    if is_msgpack(content_type):
        try:
            return msgpack.unpackb(raw, raw=False, strict_map_key=False)
        except Exception as exc:  # msgpack raises several unrelated types for bad input
            raise ApiError("malformed_body", f"request body is not valid msgpack: {exc}") from None
    media = _media(content_type, JSON)
    if media != JSON and not media.endswith("+json"):
        raise ApiError(
            "unsupported_media_type", f"Content-Type {content_type!r} is not supported; use {JSON} or {MSGPACK}"
        )
    return loads_json(raw)


# An integer literal of 19 or more digits may be beyond 64 bits, where orjson quietly gives
# a float; only then is the body parsed a second time, exactly.
_LONG_DIGITS = re.compile(rb"\d{19}")
_INT_MIN, _INT_MAX = -(1 << 63), (1 << 64) - 1


def loads_json(raw: bytes) -> Any:
    """Parse a JSON body strictly: 400 when it is not JSON (NaN and Infinity are not), 422 for a
    number that would not read back as sent (beyond 64 bits, or overflowing a double)."""
    try:
        value = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        if "number is infinity" in str(exc):
            raise ApiError("invalid_value", f"a number in the body overflows a double: {exc}") from None
        raise ApiError("malformed_body", f"request body is not valid JSON: {exc}") from None
    if _LONG_DIGITS.search(raw):
        json.loads(raw, parse_int=_int64)
    return value


def _int64(literal: str) -> int:
    number = int(literal)
    if not _INT_MIN <= number <= _INT_MAX:
        raise ApiError("invalid_value", f"integer {literal} is outside [-2**63, 2**64): send it as a string or a float")
    return number


def wants_msgpack(request: Request) -> bool:
    """Answer in msgpack when Accept asks for it, or when the request was msgpack and Accept is silent."""
    accept = request.headers.get("accept", "")
    if any(t in accept for t in _MSGPACK_TYPES):
        return True
    if JSON in accept:
        return False
    return is_msgpack(request.headers.get("content-type"))


def render(request: Request, content: Any, status_code: int = 200) -> Response:
    if wants_msgpack(request):
        return Response(msgpack.packb(content, use_bin_type=True), status_code=status_code, media_type=MSGPACK)
    return Response(
        orjson.dumps(content, default=_json_default, option=orjson.OPT_NON_STR_KEYS),
        status_code=status_code,
        media_type=JSON,
    )


def read_arrow(content_type: str | None, raw: bytes, max_bytes: int, max_batches: int) -> pa.Table:
    """An Arrow IPC stream body as one table, fully validated and refused when it would decode to
    more than ``max_bytes`` or holds more than ``max_batches`` batches (see ``arrow_body``);
    400/413/415/422 when not fit to use."""
    if _media(content_type) != ARROW_STREAM:
        raise ApiError("unsupported_media_type", f"Content-Type {content_type!r} is not supported; use {ARROW_STREAM}")
    return read_stream(raw, max_bytes, max_batches)


def arrow_response(table: pa.Table) -> Response:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return Response(memoryview(sink.getvalue()), media_type=ARROW_STREAM)
