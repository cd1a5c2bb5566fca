"""An Arrow IPC request body, read without letting a small body become a big allocation.

Ways an Arrow stream can carry far more than its bytes, each refused before it is decoded:

* **Body compression** (zstd, lz4): a compressed buffer states its own uncompressed length and
  pyarrow allocates that much to inflate it — a 16 KB zstd body inflates to 500 MB of zeros, and
  pyarrow has no option to refuse or bound it. The server reads each message's header first and
  refuses compressed batches. pyarrow hands a message's header out only as its FlatBuffers bytes,
  so the few fields needed (format/Message.fbs: ``Message.header_type`` and ``header``,
  ``RecordBatch.compression``, ``DictionaryBatch.data``) are read by the FlatBuffers layout: a
  table starts with a signed offset back to its vtable, whose uint16 entries give each field's
  position in the table (0 when absent).
* **Repetition**: dictionary entries and string/binary views may be referenced by any number of
  rows, so decoding them (and validating a view's UTF-8) costs rows x length; nulls, field-less
  structs and fixed-size lists or binaries of size 0 take no bytes at all, so a list of them can
  claim billions. What every such column takes decoded (a Python object per element, the bytes
  of its strings) is counted from its lengths (view headers, dictionary indices, list offsets)
  and must fit STATEHOUSE_MAX_BODY_BYTES, what a plain body may carry anyway.
* **Types the engine has no use for** (run-end encoded, list-view and union columns, dictionaries
  of nested values, structs with two fields of one name) are refused by type, not bounded.
* **Many batches**: at most STATEHOUSE_MAX_BATCH_OPS record (and dictionary) batches, since each
  costs Python work on the event loop before a row is seen; nothing may follow the stream's end.
* **Dictionary deltas**: a delta appends to its dictionary, which pyarrow then builds anew, so n
  small deltas build n dictionaries of growing size (quadratic). What every dictionary batch
  leaves built is counted before anything is decoded and must fit STATEHOUSE_MAX_BODY_BYTES.

Plain columns (utf8, binary, numbers, lists and structs of them) hold no more than their buffers:
their check is one look at their type.
"""

from __future__ import annotations

import functools
import struct
from typing import NamedTuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from statehouse.app.problems import ApiError

_DICTIONARY_BATCH = 2  # MessageHeader union tags
_RECORD_BATCH = 3
_MESSAGE_HEADER_TYPE, _MESSAGE_HEADER = 1, 2  # Message's field slots
_DICTIONARY_ID, _DICTIONARY_DATA, _DICTIONARY_IS_DELTA = 0, 1, 2  # DictionaryBatch's fields
_RECORD_BATCH_COMPRESSION = 3  # RecordBatch.compression


def _field(data: bytes, table: int, slot: int) -> int:
    """Where a table's field lies in ``data``, or 0 when the table leaves it out."""
    vtable = table - struct.unpack_from("<i", data, table)[0]
    vtable_size = struct.unpack_from("<H", data, vtable)[0]
    entry = 4 + 2 * slot
    if entry + 2 > vtable_size:
        return 0
    offset = struct.unpack_from("<H", data, vtable + entry)[0]
    return table + offset if offset else 0


def _table(data: bytes, field: int) -> int:
    """The table a field points at (an unsigned offset from the field itself)."""
    return field + struct.unpack_from("<I", data, field)[0]


def _header(metadata: bytes) -> tuple[int, int]:
    """A message's header type (``_DICTIONARY_BATCH``, ``_RECORD_BATCH``, ...) and where its
    table lies (0, 0 when the message has none)."""
    message = struct.unpack_from("<I", metadata, 0)[0]
    kind = _field(metadata, message, _MESSAGE_HEADER_TYPE)
    body = _field(metadata, message, _MESSAGE_HEADER)
    if not kind or not body:
        return 0, 0
    return metadata[kind], _table(metadata, body)


def _compresses(metadata: bytes, kind: int, batch: int) -> bool:
    if kind == _DICTIONARY_BATCH:
        data = _field(metadata, batch, _DICTIONARY_DATA)
        return bool(data) and bool(_field(metadata, _table(metadata, data), _RECORD_BATCH_COMPRESSION))
    return bool(_field(metadata, batch, _RECORD_BATCH_COMPRESSION))


def _dictionary(metadata: bytes, batch: int) -> tuple[int, bool]:
    """A dictionary batch's dictionary id and whether it is a delta (appended to the dictionary)."""
    at = _field(metadata, batch, _DICTIONARY_ID)
    delta = _field(metadata, batch, _DICTIONARY_IS_DELTA)
    return (struct.unpack_from("<q", metadata, at)[0] if at else 0), bool(delta and metadata[delta])


def _compressed() -> ApiError:
    return ApiError(
        "unsupported_media_type",
        "compressed Arrow IPC buffers (zstd, lz4) are not accepted; send the stream uncompressed",
    )


def _too_many_batches(max_batches: int, name: str) -> ApiError:
    return ApiError(
        "batch_too_large",
        f"the stream holds more than {max_batches} {name} messages (STATEHOUSE_MAX_BATCH_OPS); "
        "send fewer, larger record batches",
    )


def _check_messages(raw: bytes, max_bytes: int, max_batches: int) -> None:
    """Refuse compressed batches, more record (or dictionary) batches than a request may have
    rows (each costs Python work before a row is seen: 120,000 empty ones held the event loop for
    2.5 s), and dictionaries that decode to more than ``max_bytes``: a delta appends to its
    dictionary, and pyarrow builds each dictionary anew (the old one and the delta, copied), so
    2,000 deltas of 20 entries in a 3.4 MB body built 3 GB in 16 s. Each dictionary batch counts
    the size of the dictionary it leaves. Raises ``pa.ArrowInvalid`` or ``struct.error`` for
    messages that don't parse."""
    counts = {"record batch": 0, "dictionary": 0}
    dictionaries: dict[int, int] = {}  # id -> bytes of the dictionary so far
    built = 0
    for message in pa.ipc.MessageReader.open_stream(pa.BufferReader(raw)):
        name = message.type
        if name not in counts:
            continue
        metadata = message.metadata.to_pybytes()
        kind, batch = _header(metadata)
        if batch and _compresses(metadata, kind, batch):
            raise _compressed()
        counts[name] += 1
        if counts[name] > max_batches:
            raise _too_many_batches(max_batches, name)
        if batch and kind == _DICTIONARY_BATCH:
            key, delta = _dictionary(metadata, batch)
            size = message.body.size if message.body is not None else 0
            dictionaries[key] = (dictionaries.get(key, 0) if delta else 0) + size
            built += dictionaries[key]
            if built > max_bytes:
                raise ApiError(
                    "body_too_large",
                    f"the stream's dictionaries decode to more than {max_bytes} bytes (each delta rebuilds its "
                    "dictionary; STATEHOUSE_MAX_BODY_BYTES): send each batch's dictionary whole, or fewer deltas",
                )


class _Check(NamedTuple):
    """How columns of one Arrow type are checked."""

    counted: bool  # somewhere in it, data may repeat or take no bytes: its decoded size is counted
    refusal: str | None = None  # why the type is not taken at all


_REFUSED = (pa.types.is_run_end_encoded, pa.types.is_list_view, pa.types.is_large_list_view, pa.types.is_union)
_REPEATING = (pa.types.is_dictionary, pa.types.is_string_view, pa.types.is_binary_view, pa.types.is_null)
_BINARY = (pa.types.is_string, pa.types.is_large_string, pa.types.is_binary, pa.types.is_large_binary)


def _nested(kind: pa.DataType) -> list[pa.DataType]:
    if isinstance(kind, pa.ExtensionType):
        return [kind.storage_type]
    if pa.types.is_dictionary(kind):
        return [kind.value_type]
    return [kind.field(i).type for i in range(kind.num_fields)]


def _refusal(kind: pa.DataType) -> str | None:
    if any(test(kind) for test in _REFUSED):
        return "run-end encoded, list-view and union columns are not taken; send the values plainly"
    if pa.types.is_dictionary(kind) and not (_is_binary(kind.value_type) or _fixed_width(kind.value_type)):
        return "dictionaries of nested values are not taken; send the values plainly"
    if pa.types.is_struct(kind):
        names = [kind.field(i).name for i in range(kind.num_fields)]
        if len(set(names)) != len(names):
            return f"a struct's fields must have distinct names; got {', '.join(names)}"
    return None


@functools.lru_cache(maxsize=512)
def _check_of(kind: pa.DataType) -> _Check:
    refusal = _refusal(kind)
    if refusal is not None:
        return _Check(False, refusal)
    inner = [_check_of(k) for k in _nested(kind)]
    refused = next((c for c in inner if c.refusal is not None), None)
    if refused is not None:
        return refused
    return _Check(_repeats(kind) or any(c.counted for c in inner))


def _repeats(kind: pa.DataType) -> bool:
    """Whether elements of this type may take more decoded than on the wire: dictionary entries
    and views are shared, and nulls, field-less structs and fixed-size lists or binaries of size 0
    take no bytes at all (but a Python object each once decoded)."""
    return (
        any(test(kind) for test in _REPEATING)
        or (pa.types.is_struct(kind) and kind.num_fields == 0)
        or (pa.types.is_fixed_size_list(kind) and kind.list_size == 0)
        or (pa.types.is_fixed_size_binary(kind) and kind.byte_width == 0)
    )


def _is_binary(kind: pa.DataType) -> bool:
    return any(test(kind) for test in _BINARY)


def _fixed_width(kind: pa.DataType) -> bool:
    try:
        kind.bit_width  # noqa: B018  # raises for types without a fixed width
    except ValueError:
        return False
    return True


def _total(lengths: pa.Array | np.ndarray) -> int:
    if isinstance(lengths, np.ndarray):
        return int(lengths.clip(min=0).sum(dtype=np.int64))
    return int(pc.sum(lengths).as_py() or 0)


def _view_lengths(array: pa.Array) -> np.ndarray:
    """The lengths in a string/binary view array's 16-byte views (a view's first int32)."""
    views = np.frombuffer(array.buffers()[1], np.int32, count=4 * (array.offset + len(array)))
    lengths = views[4 * array.offset :: 4]
    return lengths[array.is_valid().to_numpy(zero_copy_only=False)] if array.null_count else lengths


OBJECT_BYTES = 64  # bytes: what one decoded element costs at least as a Python object (None: a pointer)
_POINTER = 8


def _decoded_bytes(array: pa.Array) -> int:
    """What ``array`` takes with every value decoded into Python objects (roughly, from below):
    an object per element plus the bytes of strings and binaries, repeated as often as they are
    referenced. Raises ``pa.ArrowIndexError`` for a dictionary index out of range."""
    kind = array.type
    if isinstance(kind, pa.ExtensionType):
        return _decoded_bytes(array.storage)
    objects = OBJECT_BYTES * len(array)
    if pa.types.is_dictionary(kind):
        entries = array.dictionary
        if _is_binary(entries.type):
            return objects + _total(pc.take(pc.binary_length(entries), array.indices))
        return objects
    if pa.types.is_string_view(kind) or pa.types.is_binary_view(kind):
        return objects + _total(_view_lengths(array))
    if _is_binary(kind):
        return objects + _total(pc.binary_length(array))
    if pa.types.is_fixed_size_list(kind):
        return objects + _decoded_bytes(array.flatten())
    if pa.types.is_list(kind) or pa.types.is_large_list(kind) or pa.types.is_map(kind):
        offsets = array.offsets
        first, last = (offsets[0].as_py(), offsets[-1].as_py()) if len(offsets) else (0, 0)
        return objects + _decoded_bytes(array.values.slice(first, last - first))
    if pa.types.is_struct(kind):
        return objects + sum(_decoded_bytes(child) for child in array.flatten())
    if pa.types.is_null(kind):
        return _POINTER * len(array)
    return objects


def check_size(table: pa.Table, max_bytes: int) -> None:
    """Refuse columns that decode to more than ``max_bytes`` (see the module's docstring), or
    whose type the server does not take."""
    for index, field in enumerate(table.schema):
        check = _check_of(field.type)
        if check.refusal is not None:
            raise ApiError("invalid_argument", f"column {field.name!r} is {field.type}: {check.refusal}")
        if not check.counted:
            continue
        size = sum(_decoded_bytes(chunk) for chunk in table.column(index).chunks)
        if size > max_bytes:
            raise ApiError(
                "body_too_large",
                f"column {field.name!r} decodes to {size} bytes (its dictionary, views or null elements repeat "
                f"data), more than a request may carry ({max_bytes} bytes, STATEHOUSE_MAX_BODY_BYTES); "
                "send smaller batches",
            )


def _read_plain(raw: bytes, max_batches: int) -> tuple[pa.Table | None, pa.BufferReader]:
    """The stream read in one pass over its messages, each checked as :func:`_check_messages`
    checks it, when it is a schema and record batches only (what every client sends); ``None``
    for anything else (dictionaries, a stream that does not start with its schema), which the
    two-pass reading handles and words the errors of. Reading the framing once saves ~15 µs of
    a one-row request."""
    source = pa.BufferReader(raw)
    messages = pa.ipc.MessageReader.open_stream(source)
    first = messages.read_next_message() if raw else None
    if first is None or first.type != "schema":
        return None, source
    schema = pa.ipc.read_schema(first)
    if any(pa.types.is_dictionary(field.type) for field in schema):  # its dictionaries: two passes
        return None, source
    batches: list[pa.RecordBatch] = []
    for message in messages:
        if message.type != "record batch":
            return None, source
        metadata = message.metadata.to_pybytes()
        kind, batch = _header(metadata)
        if batch and _compresses(metadata, kind, batch):
            raise _compressed()
        if len(batches) == max_batches:
            raise _too_many_batches(max_batches, "record batch")
        batches.append(pa.ipc.read_record_batch(message, schema))
    return pa.Table.from_batches(batches, schema), source


def read_stream(raw: bytes, max_bytes: int, max_batches: int) -> pa.Table:
    """An Arrow IPC stream as one table, checked as the module's docstring says, then fully
    validated (UTF-8 included); 400/413/415/422 when it is not fit to use."""
    try:
        table, source = _read_plain(raw, max_batches)
        if table is None:
            _check_messages(raw, max_bytes, max_batches)
            source = pa.BufferReader(raw)
            table = pa.ipc.open_stream(source).read_all()
        if source.tell() != len(raw):  # a second stream, or anything else after the end marker
            raise ValueError(f"{len(raw) - source.tell()} bytes follow the stream's end-of-stream marker")
        table.validate()  # offsets and buffer sizes in bounds: what counting the sizes relies on
        check_size(table, max_bytes)
        table.validate(full=True)
    except (pa.ArrowException, ValueError, OSError, struct.error) as exc:
        raise ApiError("malformed_body", f"request body is not a valid Arrow IPC stream: {exc}") from None
    return table
