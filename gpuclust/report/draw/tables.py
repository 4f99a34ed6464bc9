"""Columns of result tables, Arrow or pandas, as the figures of :mod:`gpuclust.report.draw` read
them (without importing pandas for an Arrow table)."""

from __future__ import annotations

from typing import Any

import numpy as np


def _is_arrow(t: Any) -> bool:
    return hasattr(t, "column_names")


def names_of(t: Any) -> list[str]:
    return list(t.column_names) if _is_arrow(t) else [str(c) for c in t.columns]


def numbers(t: Any, name: str) -> np.ndarray:
    """A number column as float64 (NULL as NaN)."""
    from gpuclust.tables import column

    return np.asarray(column(t, name), dtype=np.float64)


def strings(t: Any, name: str) -> np.ndarray:
    """A text column as an object array of ``str`` (an Arrow string column's ``to_numpy`` would
    import pandas: a second of the run)."""
    vals = t.column(name).to_pylist() if _is_arrow(t) else t[name].tolist()
    return np.asarray([str(v) for v in vals], dtype=object)


def first(t: Any, name: str, default: Any = None) -> Any:
    """The first row's ``name`` (``default`` when the table, the column or the value is missing)."""
    if t is None or len(t) == 0 or name not in names_of(t):
        return default
    v = t.column(name)[0].as_py() if _is_arrow(t) else t[name].iloc[0]
    if isinstance(v, np.generic):
        v = v.item()
    return default if v is None or (isinstance(v, float) and v != v) else v
