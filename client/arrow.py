"""Arrow and pandas conversions of the client's columnar calls (``client/columns.py`` for states,
``client/timer_columns.py`` for timers): any column-like input (pandas Series or Index, numpy
array, pyarrow Array or ChunkedArray, Python list) as the Arrow column the server takes, the
request body as an Arrow IPC stream, and a read's answer as a pandas Series.

Like the modules that use it, it needs the client's ``columnar`` extra (pyarrow, numpy,
pandas) and loads only when they do.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np
import pandas as pd  # type: ignore[import-untyped]
import pyarrow as pa

from statehouse.client.errors import InvalidRequest
from statehouse.protocol.keygroups import KeyType
from statehouse.protocol.keygroups.columnar import integer_keys

KEY_TYPES = {"string": pa.string(), "int": pa.int32(), "long": pa.int64()}
# A request's Arrow body stays below this (the server's STATEHOUSE_MAX_BODY_BYTES defaults to
# 64 MiB): rows with big values go in smaller chunks than ``max_rows``.
MAX_REQUEST_BYTES = 32 << 20
# Python values that stand for one value of every row (anything else is a column).
SCALARS = (str, bytes, int, float, bool)


def key_column(keys: Any, key_type: KeyType, where: str) -> pa.Array:
    """The keys as the key type's Arrow type: utf8 (or large_utf8), int32 or int64, no nulls;
    ``where`` starts each refusal (what has keys of that type)."""
    if isinstance(keys, (*SCALARS, np.generic)) or keys is None:
        raise InvalidRequest(f"keys must be a column (a Series, array or list), got {type(keys).__name__}")
    array = as_array(keys, "key")
    if pa.types.is_null(array.type):  # no values at all: an empty list, or nulls
        if len(array):
            raise InvalidRequest(f"{where}; row 0: key is null")
        return pa.array([], KEY_TYPES[key_type])
    if key_type == "string":
        if not is_string(array.type):
            raise InvalidRequest(f"{where}; got {array.type} keys (convert them, e.g. with .astype(str))")
        no_nulls(array, "key", where)
        return utf8(array)
    try:
        return pa.array(integer_keys(array, key_type))
    except TypeError:
        raise InvalidRequest(f"{where}; got {array.type} keys") from None
    except ValueError as exc:
        raise InvalidRequest(f"{where}; {exc}") from None


# -- inputs ------------------------------------------------------------------------------------


def is_string(kind: pa.DataType) -> bool:
    return pa.types.is_string(kind) or pa.types.is_large_string(kind) or pa.types.is_string_view(kind)


def as_array(values: Any, what: str) -> pa.Array:
    """Any column-like input as one Arrow array (dictionary-encoded ones decoded)."""
    if isinstance(values, pa.ChunkedArray):
        array = values.combine_chunks() if values.num_chunks != 1 else values.chunk(0)
    elif isinstance(values, pa.Array):
        array = values
    elif isinstance(values, pd.Series | pd.Index):
        if values.dtype == object:
            array = from_python(values.tolist(), what, from_pandas=True)
        else:
            array = pa.Array.from_pandas(values)
    elif isinstance(values, np.ndarray):
        if values.ndim != 1:
            raise InvalidRequest(f"{what}s must be one-dimensional, got an array of shape {values.shape}")
        array = from_python(values.tolist(), what) if values.dtype == object else pa.array(values)
    elif isinstance(values, Iterable) and not isinstance(values, (*SCALARS, dict)):
        array = from_python(list(values), what)
    else:
        raise InvalidRequest(f"{what}s must be a column (a Series, array or list), got {type(values).__name__}")
    if isinstance(array, pa.ChunkedArray):  # from_pandas of some extension types
        array = array.combine_chunks()
    if pa.types.is_dictionary(array.type):
        array = array.dictionary_decode()
    return array


def from_python(values: list[Any], what: str, *, from_pandas: bool = False) -> pa.Array:
    """Python values as one Arrow column; dicts become an Arrow map (keys strings) when their
    values share one type, else a struct."""
    first = next((v for v in values if v is not None), None)
    if isinstance(first, dict):
        maps = _maps(values)
        if maps is not None:
            return maps
    try:
        return pa.array(values, from_pandas=from_pandas)
    except (pa.ArrowException, TypeError, ValueError, OverflowError) as exc:
        raise InvalidRequest(
            f"the {what}s have no one Arrow type ({exc}); pass a pyarrow array of the type you want, "
            "or register the state with a value_type and send values of that type"
        ) from None


def _maps(values: list[Any]) -> pa.Array | None:
    try:
        entries = pa.array([v for m in values if m for v in m.values()])
        items = [None if m is None else list(m.items()) for m in values]
        return pa.array(items, type=pa.map_(pa.string(), entries.type))
    except (pa.ArrowException, TypeError, ValueError, OverflowError, AttributeError):
        return None


def no_nulls(array: pa.Array, what: str, where: str = "") -> None:
    if array.null_count:
        row = int(np.flatnonzero(array.is_null().to_numpy(zero_copy_only=False))[0])
        raise InvalidRequest(f"{where}; row {row}: {what} is null" if where else f"row {row}: {what} is null")


def checked_length(array: pa.Array, what: str, rows: int) -> pa.Array:
    if len(array) != rows:
        raise InvalidRequest(f"{rows} keys but {len(array)} {what}s: give one per key")
    return array


def string_column(values: Any, what: str, rows: int, *, nulls: bool = False) -> pa.Array:
    array = as_array(values, what)
    if pa.types.is_null(array.type):
        array = array.cast(pa.string())
    if not is_string(array.type):
        raise InvalidRequest(f"{what}s must be strings; got {array.type}")
    if not nulls:
        no_nulls(array, what)
    checked_length(array, what, rows)
    return utf8(array)


def utf8(array: pa.Array) -> pa.Array:
    """A string column as the server takes it: utf8 or large_utf8 as it is (pandas' default string
    dtype is large_utf8: a cast would cost more than the rest of a small request), else utf8."""
    return array if pa.types.is_string(array.type) or pa.types.is_large_string(array.type) else array.cast(pa.string())


def namespace_column(ns: Any, rows: int) -> pa.Array | None:
    """One namespace for every row (a string; ``""`` sends no column), or one per row (null: ``""``)."""
    if ns is None or (isinstance(ns, str) and not ns):
        return None
    if isinstance(ns, str):
        return pa.repeat(pa.scalar(ns, pa.string()), rows)
    return string_column(ns, "namespace", rows, nulls=True)


def value_column(values: Any, rows: int) -> pa.Array:
    """The ``value`` column: a column of values, or one scalar (or dict) for every row."""
    if isinstance(values, (*SCALARS, np.generic)):  # np.generic: a numpy scalar (np.int64(1))
        try:
            return pa.repeat(pa.scalar(values), rows)
        except (pa.ArrowException, OverflowError) as exc:
            raise InvalidRequest(f"value {values!r} has no Arrow type: {exc}") from None
    if isinstance(values, dict):
        return from_python([values] * rows, "value")
    return checked_length(as_array(values, "value"), "value", rows)


def chunk_rows(rows: pa.Table, max_rows: int) -> int:
    """Rows per request: ``max_rows``, fewer when the rows are big."""
    if not rows.num_rows:
        return max_rows
    # The buffers' whole size bounds the rows' (it counts what slices leave out) and is cheap
    # to read; the exact size (``nbytes``, ~30x dearer) only when that bound is too big.
    if rows.num_rows <= max_rows and rows.get_total_buffer_size() <= MAX_REQUEST_BYTES:
        return max_rows
    per_row = max(1, rows.nbytes // rows.num_rows)
    return max(1, min(max_rows, MAX_REQUEST_BYTES // per_row))


_IPC_OPTIONS = pa.ipc.IpcWriteOptions()  # given, so that each writer skips reading its defaults from os.environ


def ipc_stream(rows: pa.Table) -> memoryview:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, rows.schema, options=_IPC_OPTIONS) as writer:
        writer.write_table(rows)
    return memoryview(sink.getvalue())


def read_result(values: pa.Array, index: pd.Index | None, state: str, as_arrow: bool) -> pd.Series | pa.Array:
    if as_arrow:
        return values
    kind = values.type
    if pa.types.is_integer(kind):  # absent keys are <NA>: pandas' nullable integers keep the type
        series = values.to_pandas(types_mapper={kind: pd.Int64Dtype()}.get)
    elif pa.types.is_boolean(kind):
        series = values.to_pandas(types_mapper={kind: pd.BooleanDtype()}.get)
    elif pa.types.is_nested(kind):  # lists as lists, maps as dicts (not numpy arrays, tuples)
        series = pd.Series(values.to_pylist(maps_as_pydicts="strict"), dtype=object)
    elif pa.types.is_null(kind):
        series = pd.Series([None] * len(values), dtype=object)
    else:
        series = values.to_pandas()
    if index is not None:
        series.index = index
    series.name = state
    return series
