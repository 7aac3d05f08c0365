"""Arrow arrays and tables dsim makes from NumPy, without importing pandas.

Why: pyarrow's ``pa.array`` (on a NumPy array, a list, anything) and
``Schema.empty_table()`` import pandas the first time they run, to ask
whether their input is a pandas object. That costs a fresh process
0.25-0.5 s, and in ``dsim parse`` it was the only reason pandas was imported
at all: each parse worker paid it before its first table. Building the arrays
from their NumPy buffers gives the same arrays (zero-copy, as ``pa.array`` is
for a contiguous NumPy array) without that import.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa


def empty_table(schema: pa.Schema) -> pa.Table:
    """A table of ``schema`` with no rows (what ``schema.empty_table()`` gives)."""
    return pa.Table.from_batches([], schema=schema)


def array_of(
    values: np.ndarray,
    type: pa.DataType | None = None,
    *,
    mask: np.ndarray | None = None,
    nan_is_null: bool = False,
) -> pa.Array:
    """``pa.array(values, type, mask=mask, from_pandas=nan_is_null)`` for a 1-D NumPy array of
    numbers or datetime64: its own buffer (no copy where it is contiguous), nulls where
    ``mask`` is true (and where the value is NaN with ``nan_is_null``), then a safe cast to
    ``type`` where that differs (an integer out of its range raises, as ``pa.array`` does).
    As in ``pa.array``, NaN is a null only where no ``mask`` is given.
    Objects (strings and the like) go to ``pa.array`` itself."""
    values = np.asarray(values)
    if values.ndim != 1 or values.dtype.kind not in "biufM":
        return pa.array(values, type, mask=mask, from_pandas=nan_is_null)
    if values.dtype.kind == "b":  # Arrow's booleans are bits
        native, data = pa.bool_(), np.packbits(values, bitorder="little")
    elif values.dtype.kind == "M":
        native = pa.timestamp(np.datetime_data(values.dtype)[0])
        data = values.view(np.int64)
    else:
        native = pa.from_numpy_dtype(values.dtype)
        data = values
    absent = None if mask is None else np.asarray(mask, dtype=bool)
    if nan_is_null and absent is None and values.dtype.kind == "f":
        absent = np.isnan(values)  # (as pa.array: a mask given, NaN is a value)
    validity, nulls = None, 0
    if absent is not None:
        nulls = int(np.count_nonzero(absent))
        if nulls:
            validity = pa.py_buffer(np.packbits(~absent, bitorder="little"))
    array = pa.Array.from_buffers(
        native, len(values), [validity, pa.py_buffer(np.ascontiguousarray(data))], null_count=nulls
    )
    return array if type is None or array.type == type else array.cast(type)


def numpy_of(values: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """``values.to_numpy(zero_copy_only=False)`` without importing pandas (pyarrow's goes
    through its pandas conversion, which imports pandas on its first call): numbers and
    timestamps read from the array's own buffer (read-only, no copy where it is one
    chunk; chunks joined into a new array otherwise), numbers with nulls as float64 with
    NaN there, booleans without nulls unpacked from their bits. Anything else (strings,
    booleans or timestamps with nulls) is pyarrow's own conversion."""
    if isinstance(values, pa.ChunkedArray):
        dtype = _dtype_of(values.type)
        if values.num_chunks == 1:
            return numpy_of(values.chunk(0))
        if dtype is None or values.null_count:
            return values.to_numpy()
        if values.num_chunks == 0:
            return np.empty(0, dtype)
        return np.concatenate([numpy_of(chunk) for chunk in values.chunks])
    if pa.types.is_boolean(values.type) and not values.null_count:
        return flags_of(values)
    dtype = _dtype_of(values.type)
    if dtype is None or (values.null_count and dtype.kind == "M"):
        return values.to_numpy(zero_copy_only=False)
    if len(values) == 0:
        return np.empty(0, dtype)
    data = values.buffers()[1]
    out = np.frombuffer(data, dtype, count=len(values), offset=values.offset * dtype.itemsize)
    if values.null_count:  # as to_numpy: floats, NaN where null
        out = out.astype(np.float64)
        out[~_valid(values)] = np.nan
    return out


def flags_of(mask: pa.Array | pa.ChunkedArray, null: bool = False) -> np.ndarray:
    """A boolean Arrow array as a NumPy one, ``null`` where it is null (what
    ``pc.fill_null(mask, null).to_numpy(zero_copy_only=False)`` gives, without pandas)."""
    if isinstance(mask, pa.ChunkedArray):
        parts = [flags_of(chunk, null) for chunk in mask.chunks]
        return np.concatenate(parts) if parts else np.zeros(0, bool)
    n = len(mask)
    if n == 0:
        return np.zeros(0, bool)
    data = np.frombuffer(mask.buffers()[1], np.uint8)
    out = np.unpackbits(data, count=mask.offset + n, bitorder="little")[mask.offset :].view(bool)
    if mask.null_count:
        out = np.where(_valid(mask), out, null)
    return out


def _valid(values: pa.Array) -> np.ndarray:
    """Where ``values`` is not null (its validity bitmap as booleans)."""
    bitmap = values.buffers()[0]
    n = len(values)
    if bitmap is None:
        return np.ones(n, bool)
    bits = np.unpackbits(
        np.frombuffer(bitmap, np.uint8), count=values.offset + n, bitorder="little"
    )
    return bits[values.offset :].view(bool)


def _dtype_of(type: pa.DataType) -> np.dtype | None:
    """The NumPy dtype whose buffer layout ``type``'s values have; None where none has."""
    if pa.types.is_timestamp(type):
        return np.dtype(f"datetime64[{type.unit}]")
    if pa.types.is_integer(type) or (pa.types.is_floating(type) and type.bit_width > 16):
        return _NUMERIC[type.id]
    return None


_NUMERIC = {
    pa.int8().id: np.dtype(np.int8),
    pa.int16().id: np.dtype(np.int16),
    pa.int32().id: np.dtype(np.int32),
    pa.int64().id: np.dtype(np.int64),
    pa.uint8().id: np.dtype(np.uint8),
    pa.uint16().id: np.dtype(np.uint16),
    pa.uint32().id: np.dtype(np.uint32),
    pa.uint64().id: np.dtype(np.uint64),
    pa.float32().id: np.dtype(np.float32),
    pa.float64().id: np.dtype(np.float64),
}


def strings_of(values, type: pa.DataType | None = None) -> pa.Array:
    """``pa.array([str(v) for v in values], type)`` for ``pa.string()`` (the default) or
    ``pa.large_string()``: UTF-8 bytes and offsets, without importing pandas (rejected
    lines' reasons and files are few, but one import costs more than all of them)."""
    kind = pa.string() if type is None else type
    encoded = [str(v).encode("utf-8") for v in values]
    offsets = np.zeros(len(encoded) + 1, np.int64)
    np.cumsum([len(b) for b in encoded], out=offsets[1:])
    if kind == pa.string():
        if offsets[-1] > np.iinfo(np.int32).max:
            raise OverflowError("over 2 GiB of text: make a large_string array")
        offsets = offsets.astype(np.int32)
    elif kind != pa.large_string():
        raise TypeError(f"strings_of makes string or large_string arrays, not {kind}")
    array = pa.Array.from_buffers(
        kind, len(encoded), [None, pa.py_buffer(offsets), pa.py_buffer(b"".join(encoded))]
    )
    array.validate()
    return array
