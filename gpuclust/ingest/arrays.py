"""NumPy <-> Arrow for ingest's hot path, without pandas.

``pyarrow.array(ndarray)``, ``Array.to_numpy()``, ``fill_null`` with a Python scalar and friends
consult pyarrow's pandas compatibility layer, and the first time they do, it imports pandas:
~0.17 s of the GIL at the start of every ingest process, while the pipeline is filling (ingest
never uses pandas otherwise).  These helpers read and build primitive arrays from their buffers
(zero-copy for numeric values) and never touch that layer; ``tests/ingest/test_arrays.py``
checks them against pyarrow's own conversions and that no ingest imports pandas (InstanceUsage,
the event tables as v2 CSV, v3 JSON and v3 Parquet).
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa


def _np_dtype(typ: pa.DataType) -> np.dtype:
    if pa.types.is_integer(typ) or pa.types.is_floating(typ):
        return np.dtype(typ.to_pandas_dtype())
    raise TypeError(f"not a numeric Arrow type: {typ}")


def valid(arr: pa.Array) -> np.ndarray:
    """Which values of ``arr`` are not null (bool, one per value)."""
    n = len(arr)
    if arr.null_count == 0:
        return np.ones(n, dtype=bool)
    if arr.null_count == n:
        return np.zeros(n, dtype=bool)
    bitmap = arr.buffers()[0]
    if bitmap is None:  # a null-type array
        return np.zeros(n, dtype=bool)
    bits = np.unpackbits(np.frombuffer(bitmap, dtype=np.uint8), bitorder="little")
    return bits[arr.offset : arr.offset + n].astype(bool)


def values(arr: pa.Array, fill: object = None) -> np.ndarray:
    """The values of a boolean, integer or floating ``arr`` as NumPy (a zero-copy, read-only view
    for numbers); null slots hold ``fill`` when it is given, else whatever the buffer holds."""
    n = len(arr)
    if pa.types.is_boolean(arr.type):
        data = arr.buffers()[1]
        bits = np.unpackbits(np.frombuffer(data, dtype=np.uint8), bitorder="little") if data is not None else None
        out = bits[arr.offset : arr.offset + n].astype(bool) if bits is not None else np.zeros(n, dtype=bool)
    else:
        dt = _np_dtype(arr.type)
        data = arr.buffers()[1]
        if data is None or n == 0:
            out = np.zeros(n, dtype=dt)
        else:
            out = np.frombuffer(data, dtype=dt, count=arr.offset + n)[arr.offset :]
    if fill is not None and arr.null_count:
        out = np.where(valid(arr), out, fill).astype(out.dtype, copy=False)  # type: ignore[call-overload]
    return out


def from_numpy(data: np.ndarray, typ: pa.DataType | None = None, mask: np.ndarray | None = None) -> pa.Array:
    """``pa.array(data, typ, mask=mask)`` for a 1-d boolean, integer or floating NumPy array.

    ``typ`` defaults to the values' own type; other numeric types are converted with NumPy's
    ``astype`` (callers pass values that fit).  ``mask`` marks nulls (True), as in ``pa.array``.

    Examples
    --------
    >>> from_numpy(np.array([1, 2, 3]), pa.int32(), mask=np.array([False, True, False])).to_pylist()
    [1, None, 3]
    >>> from_numpy(np.array([True, False])).to_pylist()
    [True, False]
    """
    data = np.asarray(data)
    if data.ndim != 1:
        raise ValueError(f"from_numpy takes a 1-d array, got shape {data.shape}")
    n = len(data)
    typ = typ if typ is not None else pa.from_numpy_dtype(data.dtype)
    bitmap, nulls = None, 0
    if mask is not None:
        nulls = int(np.count_nonzero(mask))
        if nulls:
            bitmap = pa.py_buffer(np.packbits(~np.asarray(mask, dtype=bool), bitorder="little"))
    if pa.types.is_boolean(typ):
        buf = pa.py_buffer(np.packbits(data.astype(bool, copy=False), bitorder="little"))
    else:
        buf = pa.py_buffer(np.ascontiguousarray(data.astype(_np_dtype(typ), copy=False)))
    return pa.Array.from_buffers(typ, n, [bitmap, buf], null_count=nulls)
