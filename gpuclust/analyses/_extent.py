"""Arrow columns as NumPy (:func:`to_i64`, :func:`to_f64`), and the largest known value of a time
column, from Parquet statistics where possible."""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow.parquet as pq

from gpuclust.arrow_numpy import to_numpy
from gpuclust.schema import TIME_AFTER_TRACE

__all__ = ["has_values", "max_below", "max_finite", "to_f64", "to_i64"]


def to_i64(arr: Any) -> np.ndarray:
    """An Arrow integer column as an int64 NumPy array, NULL -> int64 minimum."""
    return np.ascontiguousarray(to_numpy(arr, np.int64))


def to_f64(arr: Any) -> np.ndarray:
    """An Arrow numeric column as a float64 NumPy array, NULL -> NaN."""
    return to_numpy(arr, np.float64)


def max_below(a: np.ndarray) -> int | None:
    """The largest value other than NULL (int64 minimum) and 2^63-1 ("after the trace")."""
    a = a[(a < TIME_AFTER_TRACE) & (a != np.iinfo(np.int64).min)]
    return int(a.max()) if a.size else None


def max_finite(source: Any, table: str, column: str) -> int | None:
    """Largest value of ``table.column`` below 2^63-1 (NULLs ignored; ``None``: no such value),
    from each row group's Parquet statistics where they exist (the row group is read otherwise,
    or when its maximum is the "after the trace" sentinel); an in-memory source reads the column."""
    best: int | None = None
    files = source.files(table) if hasattr(source, "files") else None
    if files:
        for f in files:
            pf = pq.ParquetFile(f)
            md = pf.metadata
            j = md.schema.to_arrow_schema().get_field_index(column)
            for g in range(md.num_row_groups):
                if md.row_group(g).num_rows == 0:
                    continue
                st = md.row_group(g).column(j).statistics
                v: int | None
                if st is not None and st.has_min_max and int(st.max) < TIME_AFTER_TRACE:
                    v = int(st.max)
                else:
                    v = max_below(to_i64(pf.read_row_group(g, columns=[column]).column(0)))
                if v is not None:
                    best = v if best is None else max(best, v)
        return best
    return max_below(to_i64(source.read(table, [column]).column(0)))


def has_values(source: Any, table: str, column: str) -> bool:
    """Whether ``table.column`` holds a value other than NULL or NaN: from each row group's
    Parquet statistics (null count) where they exist, reading a row group only when they do not
    settle it, and stopping at the first value; an in-memory source reads the column."""
    files = source.files(table) if hasattr(source, "files") else None
    if files is None:
        return bool(np.isfinite(to_f64(source.read(table, [column]).column(0))).any())
    for f in files:
        pf = pq.ParquetFile(f)
        md = pf.metadata
        j = md.schema.to_arrow_schema().get_field_index(column)
        for g in range(md.num_row_groups):
            rows = md.row_group(g).num_rows
            st = md.row_group(g).column(j).statistics
            if rows == 0 or (st is not None and st.has_null_count and st.null_count == rows):
                continue
            if bool(np.isfinite(to_f64(pf.read_row_group(g, columns=[column]).column(0))).any()):
                return True
    return False
