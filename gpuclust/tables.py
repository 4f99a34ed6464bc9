"""Result tables: what an analysis' ``finalize`` returns, and what callers get.

An analysis' ``finalize`` returns, per table name, a pandas DataFrame or a ``pyarrow.Table``
(analyses that build their tables from NumPy arrays return Arrow tables, so that a ``gpuclust
analyze`` run without plots never imports pandas: docs/user/scale.md, "Start-up"), or a
:class:`gpuclust.parted.PartedTable` for the tables that grow with the data.  The engine hands
them on unchanged (``tables="native"``) or as one kind for every analysis:

* ``"pandas"`` (the default of :func:`gpuclust.engine.run` and :func:`gpuclust.report.analyze.analyze`):
  every table a DataFrame, as the Python API has always returned them;
* ``"arrow"``: every table a ``pyarrow.Table`` (for Arrow, polars or DuckDB pipelines);
* ``"native"``: as finalized.

Parted tables are returned as they are in every kind (read them by batches).

>>> import pyarrow as pa
>>> t = pa.table({"x": [1, 2]})
>>> type(convert({"a": {"t": t}}, "pandas")["a"]["t"]).__name__
'DataFrame'
>>> convert({"a": {"t": t}}, "arrow")["a"]["t"] is t
True
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from typing import Any

import numpy as np
import pyarrow as pa

from gpuclust._lazy import pandas as pd
from gpuclust.arrow_numpy import to_numpy

__all__ = [
    "KINDS",
    "as_arrow",
    "as_pandas",
    "check_kind",
    "column",
    "convert",
    "is_frame",
    "nullable_int",
    "parquet_options",
]

#: The values of ``tables=``.
KINDS = ("pandas", "arrow", "native")
#: Field metadata of an integer column that may hold NULLs and is a pandas ``Int64`` column in
#: :func:`as_pandas` (Arrow's own conversion makes such a column float64, or int64 when a table
#: has no NULL in it: the DataFrame's dtype would depend on the data).
_PANDAS_DTYPE = b"gpuclust.pandas_dtype"


def is_frame(t: Any) -> bool:
    """Whether ``t`` is a pandas DataFrame, without importing pandas (a DataFrame can only exist
    once pandas was imported)."""
    return "pandas" in sys.modules and isinstance(t, pd.DataFrame)


def as_arrow(t: Any) -> Any:
    """``t`` as a ``pyarrow.Table`` (a DataFrame converted without its index; anything else as is)."""
    return pa.Table.from_pandas(t, preserve_index=False) if is_frame(t) else t


def nullable_int(name: str) -> pa.Field:
    """An int64 field that may hold NULLs: a pandas ``Int64`` column in :func:`as_pandas`, whatever
    the rows.

    >>> t = pa.Table.from_arrays([pa.array([1, None], pa.int64())], schema=pa.schema([nullable_int("n")]))
    >>> str(as_pandas(t)["n"].dtype), as_pandas(t)["n"].isna().tolist()
    ('Int64', [False, True])
    """
    return pa.field(name, pa.int64(), metadata={_PANDAS_DTYPE: b"Int64"})


def as_pandas(t: Any) -> Any:
    """``t`` as a pandas DataFrame (an Arrow table converted; anything else as is).  String
    columns become ``object`` columns of ``str``, as the analyses' own DataFrames hold them (pandas
    3 would make them its ``str`` dtype); :func:`nullable_int` columns become ``Int64``."""
    if not isinstance(t, pa.Table):
        return t
    df = t.to_pandas()
    for f in t.schema:
        if pa.types.is_string(f.type) or pa.types.is_large_string(f.type):
            df[f.name] = df[f.name].astype(object)
        elif (f.metadata or {}).get(_PANDAS_DTYPE) == b"Int64":
            df[f.name] = t.column(f.name).to_pandas(types_mapper={f.type: pd.Int64Dtype()}.get).array
    return df


def column(t: Any, name: str) -> np.ndarray:
    """Column ``name`` of a DataFrame or an Arrow table as a NumPy array (an Arrow number column as
    :func:`gpuclust.arrow_numpy.to_numpy` makes it: NULL as NaN or the integer minimum)."""
    if isinstance(t, pa.Table):
        return to_numpy(t.column(name))
    return t[name].to_numpy()


def parquet_options(schema: pa.Schema) -> dict[str, Any]:
    """How result tables are written as Parquet (``pq.write_table`` / ``pq.ParquetWriter``
    keywords): dictionary encoding for the string columns only, zstd at level 1.

    Numeric result columns hold mostly distinct values, where the writer's default (try a
    dictionary, give up when it outgrows a page) only costs: a 400,000-row ``jobs`` table of
    job-usage took 0.12 s with it and 0.06 s without, and came out larger.  zstd level 1 is ~30%
    smaller than snappy at about the same speed (a 262k-row machine-table part).

    >>> parquet_options(pa.schema([("tier", pa.string()), ("x", pa.float64())]))["use_dictionary"]
    ['tier']
    """
    strings = [f.name for f in schema if pa.types.is_string(f.type) or pa.types.is_large_string(f.type)]
    return {"use_dictionary": strings, "compression": "zstd", "compression_level": 1}


def check_kind(kind: str) -> None:
    """Refuse a ``tables=`` value that is not one of :data:`KINDS`."""
    if kind not in KINDS:
        raise ValueError(f"tables must be one of {', '.join(KINDS)}, got {kind!r}")


def convert(results: Mapping[str, Mapping[str, Any]], kind: str) -> dict[str, dict[str, Any]]:
    """``{result key: {table: ...}}`` with every table of the ``kind`` (see :data:`KINDS`)."""
    check_kind(kind)
    to = {"pandas": as_pandas, "arrow": as_arrow}.get(kind)
    if to is None:
        return {k: dict(v) for k, v in results.items()}
    return {k: {name: to(t) for name, t in tables.items()} for k, tables in results.items()}
