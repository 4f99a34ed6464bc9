"""Arrow number columns as NumPy arrays and back, without importing pandas.

pyarrow imports pandas the first time it converts anything: ``Array.to_numpy`` goes through its
pandas conversion code (even for a zero-copy view of an int64 column), and ``pa.array``,
``pa.scalar``, ``pa.table`` and every compute function given a Python number first check whether
their input is a pandas object.  That import costs ~0.15 s of one core before any data is read
(docs/user/scale.md, "Start-up").  The functions here do the same through the DLPack protocol and
``from_buffers`` (and NULLs through the validity bitmap: importing ``pyarrow.compute`` costs
another ~0.06 s): the engine reads every partition's columns through :func:`to_numpy`, and
analyses that build their result tables from NumPy arrays use :func:`table` and
:func:`table_from_rows` (see :mod:`gpuclust.tables`).

>>> import pyarrow as pa
>>> to_numpy(pa.chunked_array([[1, None], [3]], pa.int32())).tolist()
[1, -2147483648, 3]
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa

__all__ = [
    "array",
    "bin_table",
    "empty_table",
    "labels",
    "null_value",
    "rows_table",
    "scalar",
    "schema_table",
    "strings",
    "table",
    "table_from_rows",
    "to_numpy",
    "valid",
]


def scalar(value: Any, type: pa.DataType) -> pa.Scalar:
    """``pa.scalar(value, type)`` for a number type, without importing pandas (``pa.scalar`` and
    every compute function given a Python number check whether it is a pandas object first).

    >>> scalar(0, pa.int64()).equals(pa.scalar(0, pa.int64()))
    True
    """
    buf = np.array([value], dtype=np.dtype(type.to_pandas_dtype()))
    return pa.Array.from_buffers(type, 1, [None, pa.py_buffer(buf)])[0]


def null_value(dtype: np.dtype) -> Any:
    """What a NULL of a number column reads as in NumPy: NaN (floats) or the dtype's minimum (integers).

    >>> null_value(np.dtype(np.float32)), null_value(np.dtype(np.int32))
    (nan, -2147483648)
    """
    return np.nan if dtype.kind == "f" else np.iinfo(dtype).min


def _valid_chunk(c: pa.Array) -> np.ndarray:
    if c.null_count == 0:
        return np.ones(len(c), dtype=bool)
    bits = np.frombuffer(c.buffers()[0], np.uint8)
    return np.unpackbits(bits, count=c.offset + len(c), bitorder="little")[c.offset :].view(bool)


def valid(arr: Any) -> np.ndarray:
    """``pc.is_valid(arr)`` as a NumPy bool array (any type; read from the validity bitmaps).

    >>> valid(pa.chunked_array([["a", None], [None, "b"]])).tolist()
    [True, False, False, True]
    """
    chunks = arr.chunks if isinstance(arr, pa.ChunkedArray) else [arr]
    if not chunks:
        return np.zeros(0, dtype=bool)
    return np.concatenate([_valid_chunk(c) for c in chunks])


def _chunk(c: pa.Array, dtype: np.dtype) -> np.ndarray:
    if c.null_count == 0:
        v = np.from_dlpack(c)  # a read-only view of the Arrow buffer
        return v if v.dtype == dtype else v.astype(dtype)
    raw = np.frombuffer(c.buffers()[1], np.dtype(c.type.to_pandas_dtype()), count=c.offset + len(c))[c.offset :]
    out = raw.astype(dtype)  # a copy: the NULL slots (whatever their bytes) are filled
    out[~_valid_chunk(c)] = null_value(dtype)
    return out


def to_numpy(arr: Any, dtype: Any = None) -> np.ndarray:
    """An Arrow array or chunked array as a NumPy array (of ``dtype``: default the column's own):
    NULL -> NaN (floats) / the dtype's minimum (integers).  Integer and float columns without NULLs
    in one chunk, read as their own dtype, are read-only views of the Arrow buffer; other number
    columns are copies; other types (strings, booleans, timestamps) go through Arrow's own
    conversion.

    >>> to_numpy(pa.array([1, None], pa.int32()), np.int64).tolist()
    [1, -9223372036854775808]
    >>> to_numpy(pa.array([1, None], pa.int32()), np.float64).tolist()
    [1.0, nan]
    """
    t = arr.type
    if not (pa.types.is_integer(t) or pa.types.is_floating(t)) or pa.types.is_float16(t):
        out = arr.to_numpy(zero_copy_only=False)
        return out if dtype is None else out.astype(dtype)
    dt = np.dtype(t.to_pandas_dtype() if dtype is None else dtype)
    chunks = arr.chunks if isinstance(arr, pa.ChunkedArray) else [arr]
    if not chunks:
        return np.zeros(0, dt)
    if len(chunks) == 1:
        return _chunk(chunks[0], dt)
    return np.concatenate([_chunk(c, dt) for c in chunks])


def array(values: Any) -> pa.Array:
    """A NumPy array of numbers or booleans (or a sequence of strings) as an Arrow array: a float
    NaN becomes NULL, as ``pa.Table.from_pandas`` makes it (so a table written from it reads in
    SQL as the DataFrame's did: NULL, not NaN); nothing else is NULL.

    >>> array(np.array([1.5, 2.0])).type, array(np.array([True, False])).to_pylist(), array(["a"]).type
    (DataType(double), [True, False], DataType(string))
    >>> array(np.array([1.5, np.nan])).to_pylist()
    [1.5, None]
    """
    if isinstance(values, pa.Array):
        return values
    a = np.asarray(values)
    if a.dtype.kind in "OUS" or a.size == 0 and not isinstance(values, np.ndarray):
        return strings(list(values))
    if a.dtype.kind == "b":
        bits = np.packbits(a, bitorder="little")
        return pa.Array.from_buffers(pa.bool_(), a.size, [None, pa.py_buffer(bits)])
    if a.dtype.kind not in "iuf":
        raise TypeError(f"no Arrow array of dtype {a.dtype} without pandas")
    a = np.ascontiguousarray(a)
    valid = None
    if a.dtype.kind == "f":
        nan = np.isnan(a)
        if nan.any():
            valid = pa.py_buffer(np.packbits(~nan, bitorder="little"))
    return pa.Array.from_buffers(pa.from_numpy_dtype(a.dtype), a.size, [valid, pa.py_buffer(a)])


def strings(values: Any) -> pa.Array:
    """A sequence of ``str`` as an Arrow string array (no NULLs)."""
    data = [str(v).encode() for v in values]
    offsets = np.zeros(len(data) + 1, np.int64)
    np.cumsum([len(b) for b in data], out=offsets[1:])
    if offsets[-1] < 2**31:
        return pa.Array.from_buffers(
            pa.string(), len(data), [None, pa.py_buffer(offsets.astype(np.int32)), pa.py_buffer(b"".join(data))]
        )
    return pa.Array.from_buffers(
        pa.large_string(), len(data), [None, pa.py_buffer(offsets), pa.py_buffer(b"".join(data))]
    )


def labels(names: Any, codes: np.ndarray) -> pa.Array:
    """``strings([names[c] for c in codes])`` without a Python object per row: the string column
    of a table whose rows each carry one of a few labels (a tier name per collection), built from
    the labels' bytes by two ``repeat``s and a gather (~100x faster than :func:`strings` per row).

    >>> labels(["free", "prod"], np.array([1, 0, 1])).equals(strings(["prod", "free", "prod"]))
    True
    """
    codes = np.asarray(codes, np.int64)
    enc = [str(v).encode() for v in names]
    size = np.array([len(b) for b in enc], np.int64)
    first = np.zeros(len(enc), np.int64)
    np.cumsum(size[:-1], out=first[1:])
    length = size[codes]
    offsets = np.zeros(codes.shape[0] + 1, np.int64)
    np.cumsum(length, out=offsets[1:])
    # byte j of the column is byte (j - offsets[row]) of its row's label
    src = np.repeat(first[codes] - offsets[:-1], length) + np.arange(offsets[-1])
    data = np.frombuffer(b"".join(enc), np.uint8)[src]
    if offsets[-1] < 2**31:
        return pa.Array.from_buffers(
            pa.string(), codes.shape[0], [None, pa.py_buffer(offsets.astype(np.int32)), pa.py_buffer(data)]
        )
    return pa.Array.from_buffers(pa.large_string(), codes.shape[0], [None, pa.py_buffer(offsets), pa.py_buffer(data)])


def empty_table(schema: pa.Schema) -> pa.Table:
    """``schema.empty_table()`` for number, boolean and string columns, without importing pandas.

    >>> empty_table(pa.schema([("a", pa.string()), ("n", pa.int64())])).equals(
    ...     pa.schema([("a", pa.string()), ("n", pa.int64())]).empty_table())
    True
    """
    cols = [
        strings([]) if pa.types.is_string(f.type) else pa.Array.from_buffers(f.type, 0, [None, pa.py_buffer(b"")])
        for f in schema
    ]
    return pa.Table.from_arrays(cols, schema=schema)


def table(columns: Any) -> pa.Table:
    """``pa.table(columns)`` for a mapping of column name -> NumPy array / sequence of strings."""
    return pa.Table.from_arrays([array(v) for v in columns.values()], names=list(columns))


def table_from_rows(rows: Any) -> pa.Table:
    """``pa.Table.from_pylist(rows)`` for rows of ``str``, ``bool``, ``int`` and ``float`` values
    (int64, double, string, bool columns; a column of ints and floats is double); rows with other
    values (``None`` included) go through ``from_pylist`` itself.

    >>> t = table_from_rows([{"a": "x", "n": 1, "v": 0.5}])
    >>> t.equals(pa.Table.from_pylist([{"a": "x", "n": 1, "v": 0.5}]))
    True
    """
    rows = list(rows)
    names = list(rows[0]) if rows else []
    cols = []
    for name in names:
        vals = [r[name] for r in rows]
        kinds = {
            bool
            if isinstance(v, (bool, np.bool_))
            else int
            if isinstance(v, (int, np.integer))
            else float
            if isinstance(v, (float, np.floating))
            else str
            if isinstance(v, str)
            else None
            for v in vals
        }
        if (
            None in kinds
            or len(kinds - {int, float})
            and len(kinds) > 1
            or any(r.keys() != rows[0].keys() for r in rows)
        ):
            return pa.Table.from_pylist(rows)
        kind = kinds.pop() if len(kinds) == 1 else float
        if kind is str:
            cols.append(strings(vals))
            continue
        dtype = np.bool_ if kind is bool else np.int64 if kind is int else np.float64
        cols.append(array(np.array(vals, dtype=dtype)))
    return pa.Table.from_arrays(cols, names=names)


def rows_table(rows: Any, schema: pa.Schema) -> pa.Table:
    """:func:`table_from_rows` (column types from the values, as pandas' ``DataFrame(rows)``
    infers them), or the empty table of ``schema`` where there is no row (so an empty result
    keeps its columns).

    >>> rows_table([], pa.schema([("n", pa.int64())])).schema.names, rows_table([{"n": 1}], None).num_rows
    (['n'], 1)
    """
    rows = list(rows)
    return table_from_rows(rows) if rows else empty_table(schema)


def bin_table(
    hists: Any, lower: np.ndarray, upper: np.ndarray, value: str, count: str, schema: pa.Schema, **keys: Any
) -> pa.Table:
    """The non-empty bins of several histograms as one table, histogram after histogram, in
    ``schema``'s column order: the keys (``keys[name][i]`` on histogram ``i``'s rows), ``bin``,
    ``lo_<value>`` / ``hi_<value>`` (``lower[bin]`` / ``upper[bin]``) and ``<count>``: the rows of
    :func:`gpuclust.partials.bin_rows` of each histogram, built from columns instead of a dict a
    row (:func:`rows_table` of those rows gives the same table); ``schema``'s empty table where no
    bin is non-empty.

    >>> t = bin_table([np.array([0, 2]), np.array([1, 0])], np.array([0.0, 1.0]), np.array([1.0, 2.0]), "s", "n",
    ...               pa.schema([("tier", pa.string()), ("bin", pa.int64()), ("lo_s", pa.float64()),
    ...                          ("hi_s", pa.float64()), ("n", pa.int64())]), tier=["a", "b"])
    >>> t.to_pylist()
    [{'tier': 'a', 'bin': 1, 'lo_s': 1.0, 'hi_s': 2.0, 'n': 2}, {'tier': 'b', 'bin': 0, 'lo_s': 0.0, 'hi_s': 1.0, 'n': 1}]
    """
    hists = [np.asarray(h) for h in hists]
    nz = [np.flatnonzero(h) for h in hists]
    sizes = [int(b.shape[0]) for b in nz]
    if not sum(sizes):
        return empty_table(schema)
    which = np.repeat(np.arange(len(hists)), sizes)
    b = np.concatenate(nz).astype(np.int64)
    cols: dict[str, Any] = {k: labels(list(v), which) for k, v in keys.items()}
    cols["bin"] = b
    cols[f"lo_{value}"] = np.asarray(lower, np.float64)[b]
    cols[f"hi_{value}"] = np.asarray(upper, np.float64)[b]
    cols[count] = np.concatenate([h[x] for h, x in zip(hists, nz, strict=True)]).astype(np.int64)
    return table({name: cols[name] for name in schema.names})


def schema_table(rows: Any, schema: pa.Schema) -> pa.Table:
    """Rows (mappings with every field of ``schema``) as a table of exactly ``schema``: string,
    integer, float and boolean fields; ``None`` in an integer or string field is NULL, a float NaN
    or ``None`` is NULL (as :func:`array` makes it).  The fields keep their metadata.

    >>> s = pa.schema([("t", pa.string()), ("n", pa.int64()), ("v", pa.float64())])
    >>> schema_table([{"t": "a", "n": None, "v": 0.5}, {"t": "b", "n": 2, "v": float("nan")}], s).to_pylist()
    [{'t': 'a', 'n': None, 'v': 0.5}, {'t': 'b', 'n': 2, 'v': None}]
    >>> schema_table([], s).schema == s
    True
    """
    rows = list(rows)
    cols = []
    for f in schema:
        vals = [r[f.name] for r in rows]
        null = np.array([v is None for v in vals], dtype=bool)
        if pa.types.is_string(f.type):
            a = strings(["" if v is None else v for v in vals])
        elif pa.types.is_integer(f.type) or pa.types.is_floating(f.type) or pa.types.is_boolean(f.type):
            fill = np.nan if pa.types.is_floating(f.type) else 0
            dtype = np.dtype(f.type.to_pandas_dtype())
            a = array(np.array([fill if v is None else v for v in vals], dtype=dtype))
        else:
            raise TypeError(f"schema_table: no column of type {f.type} ({f.name})")
        if null.any() and not pa.types.is_floating(f.type):
            bufs = a.buffers()
            bits = pa.py_buffer(np.packbits(~null, bitorder="little"))
            a = pa.Array.from_buffers(a.type, len(a), [bits, *bufs[1:]])
        cols.append(a)
    return pa.Table.from_arrays(cols, schema=schema)
