"""Content negotiation for the binary-capable endpoints: JSON or msgpack, both ways.

Bodies are decoded straight into Python values (orjson / msgpack), never into one pydantic
model per item: this is the hot path of Spark executors.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
from typing import Any

import msgpack
import orjson
import pyarrow as pa
from starlette.requests import Request
from starlette.responses import Response

from statehouse.app.arrow_body import OBJECT_BYTES, read_stream
from statehouse.app.problems import ApiError
from statehouse.protocol.routes import ARROW_STREAM, JSON, MSGPACK
from statehouse.snapshots.stored.codec import too_deep

_MSGPACK_TYPES = (MSGPACK, "application/x-msgpack", "application/vnd.msgpack")


def _json_default(value: Any) -> Any:
    # JSON has no bytes: values stored through the msgpack API come back base64-encoded.
    if isinstance(value, bytes | bytearray | memoryview):
        return base64.b64encode(bytes(value)).decode("ascii")
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


def from_base64(text: object, what: str) -> bytes:
    """Bytes sent in a JSON body (JSON has none): a base64 string (RFC 4648, with padding), as
    JSON answers carry them; anything else is a 422 ``invalid_value`` naming ``what``."""
    try:
        if isinstance(text, str):
            return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        pass
    raise ApiError("invalid_value", f"{what} must be a base64 string in a JSON body; got {text!r:.40}")


def media_type(content_type: str | None) -> str | None:
    """The media type a Content-Type header names, in the one spelling the routes declare: JSON for
    ``application/json`` and any ``+json`` type, MSGPACK for msgpack's three names, else the type
    itself (lower case, parameters dropped); ``None`` when there is none."""
    if content_type is None:
        return None
    media = content_type.split(";", 1)[0].strip().lower()
    if media in _MSGPACK_TYPES:
        return MSGPACK
    if media == JSON or (media.startswith("application/") and media.endswith("+json")):
        return JSON
    return media


def is_msgpack(content_type: str | None) -> bool:
    return media_type(content_type) == MSGPACK


def max_values(request: Request) -> int:
    """How many values (keys and elements included) a JSON or msgpack body may decode to: each
    becomes a Python object of at least ``OBJECT_BYTES``, and together they must fit
    STATEHOUSE_MAX_BODY_BYTES, as an Arrow body's decoded columns must (``arrow_body``). Without
    it, a body of ``[{}, {}, ...]`` became 24 times its size in dicts, msgpack's one-byte empty
    maps 72 times (4.9 GB for 64 MiB)."""
    return request.app.state.service.settings.max_body_bytes // OBJECT_BYTES


def too_many_values(limit: int) -> ApiError:
    return ApiError(
        "body_too_large",
        f"the request body holds more than {limit} values (STATEHOUSE_MAX_BODY_BYTES / {OBJECT_BYTES}, what they "
        "take decoded); send smaller batches, or large lists as fewer, larger elements",
    )


async def read_body(request: Request) -> Any:
    """Decode a body by its Content-Type, JSON or msgpack (``app/intake.py`` let no other type
    through), at most :func:`max_values` values; 400 when it cannot be."""
    raw = await request.body()
    if is_msgpack(request.headers.get("content-type")):
        return loads_msgpack(raw, max_values(request))
    return loads_json(raw, max_values(request))


def loads_msgpack(raw: bytes, limit: int) -> Any:
    """Parse a msgpack body of at most ``limit`` values (counted first when it could hold more:
    every msgpack value takes at least a byte)."""
    if len(raw) > limit and msgpack_values(raw, limit) > limit:
        raise too_many_values(limit)
    try:
        return msgpack.unpackb(raw, raw=False, strict_map_key=False)
    except Exception as exc:  # msgpack raises several unrelated types for bad input
        raise ApiError("malformed_body", f"request body is not valid msgpack: {exc}") from None


# Bytes that follow a msgpack header byte 0xc0-0xdf before the next value: (header bytes, and
# for str/bin/ext the width of the length field whose bytes follow too); arrays and maps apart.
_FIXED = {0xC0: 0, 0xC2: 0, 0xC3: 0, 0xCA: 4, 0xCB: 8, 0xCC: 1, 0xCD: 2, 0xCE: 4, 0xCF: 8}
_FIXED |= {0xD0: 1, 0xD1: 2, 0xD2: 4, 0xD3: 8, 0xD4: 2, 0xD5: 3, 0xD6: 5, 0xD7: 9, 0xD8: 17}
_SIZED = {0xC4: 1, 0xC5: 2, 0xC6: 4, 0xD9: 1, 0xDA: 2, 0xDB: 4, 0xC7: 1, 0xC8: 2, 0xC9: 4}
_EXT_TYPE = {0xC7: 1, 0xC8: 1, 0xC9: 1}  # ext's type byte after its length
_ARRAYS = {0xDC: 2, 0xDD: 4}
_MAPS = {0xDE: 2, 0xDF: 4}


def msgpack_values(raw: bytes, limit: int) -> int:
    """How many values a msgpack document holds (map keys included), reading only its headers;
    stops once past ``limit``. Malformed input is left to the decoder: the count stops there."""
    pos, count, pending, end = 0, 0, 1, len(raw)
    while pending and pos < end and count <= limit:
        head = raw[pos]
        pending -= 1
        count += 1
        if head <= 0x7F or head >= 0xE0:  # fixint
            pos += 1
        elif head <= 0x8F:  # fixmap
            pending += 2 * (head & 0x0F)
            pos += 1
        elif head <= 0x9F:  # fixarray
            pending += head & 0x0F
            pos += 1
        elif head <= 0xBF:  # fixstr
            pos += 1 + (head & 0x1F)
        elif head in _FIXED:
            pos += 1 + _FIXED[head]
        elif head in _SIZED:
            width = _SIZED[head]
            pos += 1 + width + _EXT_TYPE.get(head, 0) + int.from_bytes(raw[pos + 1 : pos + 1 + width], "big")
        elif head in _ARRAYS or head in _MAPS:
            width = _ARRAYS.get(head) or _MAPS[head]
            items = int.from_bytes(raw[pos + 1 : pos + 1 + width], "big")
            pending += items if head in _ARRAYS else 2 * items
            pos += 1 + width
        else:  # 0xc1: never used; the decoder refuses it
            break
    return count


# An integer literal of 19 or more digits may be beyond 64 bits, where orjson quietly gives
# a float; only then is the body parsed a second time, exactly.
_LONG_DIGITS = re.compile(rb"\d{19}")
_INT_MIN, _INT_MAX = -(1 << 63), (1 << 64) - 1


def loads_json(raw: bytes, limit: int) -> Any:
    """Parse a JSON body strictly: 400 when it is not JSON (NaN and Infinity are not), 422 for a
    number that would not read back as sent (beyond 64 bits, or overflowing a double), 413 when
    it holds more than ``limit`` values (keys and elements included)."""
    if json_values(raw, limit) > limit:
        raise too_many_values(limit)
    try:
        value = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        if "number is infinity" in str(exc):
            raise ApiError("invalid_value", f"a number in the body overflows a double: {exc}") from None
        raise ApiError("malformed_body", f"request body is not valid JSON: {exc}") from None
    if _LONG_DIGITS.search(raw):
        try:
            json.loads(raw, parse_int=_int64)
        except RecursionError:  # orjson nests to 1024 levels, the json module to ~1000
            raise ApiError("malformed_body", "request body nests too deep to read: send flatter values") from None
    return value


def json_values(raw: bytes, limit: int) -> int:
    """At least how many values a JSON text holds (keys included): one more than its commas, colons
    and opening brackets, which each start a value (or open an empty container), counted at C
    speed before anything is parsed. Those inside strings count too: an exact count would cost a
    tokenizer's time, and ``limit`` leaves room for them in all but extreme bodies."""
    return 1 + raw.count(b",") + raw.count(b":") + raw.count(b"[") + raw.count(b"{")


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
    """``content`` as the response the request asks for (msgpack or JSON, by its ``Accept`` and
    ``Content-Type``), with ``status_code``; a stored value too deep for the format to write is a
    problem that says so."""
    # Values are depth-checked on the way in, but one stored before (an older data directory or
    # snapshot) may nest deeper than a format writes: a problem that says so, not a 500.
    if wants_msgpack(request):
        try:
            body = msgpack.packb(content, use_bin_type=True)
        except ValueError as exc:
            if "recursion limit" not in str(exc):
                raise
            raise too_deep("msgpack can write (about 1000 levels): clear or overwrite the key") from None
        return Response(body, status_code=status_code, media_type=MSGPACK)
    try:
        body = orjson.dumps(content, default=_json_default, option=orjson.OPT_NON_STR_KEYS)
    except orjson.JSONEncodeError as exc:
        if "Recursion limit" not in str(exc):
            raise
        raise too_deep(
            "JSON can write (254 levels): read it in msgpack (Accept: application/msgpack), then store it flatter"
        ) from None
    return Response(body, status_code=status_code, media_type=JSON)


def read_arrow(raw: bytes, max_bytes: int, max_batches: int) -> pa.Table:
    """An Arrow IPC stream body (``app/intake.py`` checked its type) as one table, fully validated
    and refused when it would decode to more than ``max_bytes`` or holds more than ``max_batches``
    batches (see ``arrow_body``); 400/413/415/422 when not fit to use."""
    return read_stream(raw, max_bytes, max_batches)


# The stream format's defaults, made once: without options, every writer reads two environment
# variables (pyarrow's pre-1.0 format switches) to make these.
_WRITE_OPTIONS = pa.ipc.IpcWriteOptions()


def arrow_response(table: pa.Table) -> Response:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema, options=_WRITE_OPTIONS) as writer:
        writer.write_table(table)
    return Response(memoryview(sink.getvalue()), media_type=ARROW_STREAM)
