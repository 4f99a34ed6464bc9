"""Casting raw columns to the canonical schema with row-level rejection.

Every reader ends in :func:`conform`: it hands over whatever arrays it parsed (strings for quoted
INT64s, doubles, ints) and gets back a table with exactly the canonical schema plus, for each
row it had to drop, the reason.  Integers are parsed from text by Arrow's exact integer parser,
never through float64.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from gpuclust.arrow_numpy import strings
from gpuclust.ingest import arrays
from gpuclust.ingest.domain import check_domain
from gpuclust.schema import CODE_RANGES, MACHINE_EVENT_TYPE_RANGE, NULL_MEANS, SCHEMAS

_INT_RE = r"^[+-]?[0-9]+$"


def _fmt(v: object) -> str:
    s = repr(v)
    return s if len(s) <= 80 else s[:77] + "..."


def _text_to_int64(arr: pa.Array, mark: np.ndarray) -> pa.Array:
    """Parse whitespace-trimmed text as int64 exactly; non-integers and out-of-range digits become null, marked."""
    stripped = pc.utf8_trim_whitespace(arr)
    ok = pc.match_substring_regex(stripped, _INT_RE)
    notok = pc.and_(pc.is_valid(stripped), pc.invert(ok))
    mark |= arrays.values(notok, fill=False)
    arr = pc.if_else(notok, pa.nulls(1, stripped.type)[0], stripped)
    try:
        return pc.cast(arr, pa.int64())
    except pa.ArrowInvalid:
        # Out-of-range digits: find them one by one (rare).
        vals = arr.to_pylist()
        out: list[int | None] = []
        for i, v in enumerate(vals):
            if v is None:
                out.append(None)
                continue
            iv = int(v)
            if -(2**63) <= iv < 2**63:
                out.append(iv)
            else:
                mark[i] = True
                out.append(None)
        return pa.array(out, pa.int64())


def _float_to_int64(arr: pa.Array, mark: np.ndarray) -> pa.Array:
    """Whole floats below 2**53 as int64; fractional or too large values become null, marked."""
    f = arrays.values(arr, fill=np.nan).astype(np.float64)
    valid = ~np.isnan(f) & arrays.valid(arr)
    whole = valid & (np.floor(f) == f) & (np.abs(f) < 2.0**53)
    mark |= valid & ~whole
    return arrays.from_numpy(np.where(whole, f, 0).astype(np.int64), pa.int64(), mask=~whole)


def _unsigned_to_int64(arr: pa.Array, mark: np.ndarray) -> pa.Array:
    """Unsigned integers as int64 (some exports write the times and ids unsigned): values above
    2**63 - 1 become null, marked (the row is rejected, not the input)."""
    v, valid = arrays.values(arr), arrays.valid(arr)
    over = valid & (v > 2**63 - 1)
    if not over.any():
        return pc.cast(arr, pa.int64())
    mark |= over
    return arrays.from_numpy(v.astype(np.int64), pa.int64(), mask=over | ~valid)


def _narrow_int(as64: pa.Array, target: pa.DataType, mark: np.ndarray) -> pa.Array:
    """int64 values as the narrower integer ``target``; values outside its range become null, marked."""
    info = np.iinfo(target.to_pandas_dtype())
    valid = arrays.valid(as64)
    vv = arrays.values(as64, fill=0).astype(np.int64)
    inr = (vv >= info.min) & (vv <= info.max)
    mark |= valid & ~inr
    keep = valid & inr
    return arrays.from_numpy(np.where(keep, vv, 0).astype(target.to_pandas_dtype()), target, mask=~keep)


def _to_int(arr: pa.Array, target: pa.DataType, col: str, mark: np.ndarray) -> pa.Array:
    """Text, floats, integers or booleans as the integer ``target``, marking the rows that do not convert."""
    src = arr.type
    if pa.types.is_string(src) or pa.types.is_large_string(src):
        as64 = _text_to_int64(arr, mark)
    elif pa.types.is_floating(src):
        as64 = _float_to_int64(arr, mark)
    elif pa.types.is_uint64(src):
        as64 = _unsigned_to_int64(arr, mark)
    elif pa.types.is_integer(src) or pa.types.is_boolean(src):
        as64 = pc.cast(arr, pa.int64())
    else:
        raise TypeError(f"column {col}: cannot convert {src} to {target}")
    return as64 if target == pa.int64() else _narrow_int(as64, target, mark)


def _to_float(arr: pa.Array, target: pa.DataType, mark: np.ndarray) -> pa.Array:
    """Text (whitespace-trimmed) or numbers as the floating ``target``, marking text that is not a number."""
    src = arr.type
    if not (pa.types.is_string(src) or pa.types.is_large_string(src)):
        return pc.cast(arr, target, safe=False)
    try:
        return pc.cast(pc.utf8_trim_whitespace(arr), target)
    except pa.ArrowInvalid:
        vals = arr.to_pylist()
        fo: list[float | None] = []
        for i, v in enumerate(vals):
            if v is None:
                fo.append(None)
                continue
            try:
                fo.append(float(v))
            except ValueError:
                mark[i] = True
                fo.append(None)
        return pa.array(fo, pa.float64()).cast(target, safe=False)


def _to_bool(arr: pa.Array, mark: np.ndarray) -> pa.Array:
    """Text 1/true/0/false (any case, trimmed) or other values as booleans, marking other text."""
    if not pa.types.is_string(arr.type):
        return pc.cast(arr, pa.bool_())
    low = pc.utf8_lower(pc.utf8_trim_whitespace(arr))
    t = pc.is_in(low, strings(["1", "true"]))
    fl = pc.is_in(low, strings(["0", "false"]))
    valid = pc.is_valid(low)
    badb = pc.and_(valid, pc.invert(pc.or_(t, fl)))
    mark |= arrays.values(badb, fill=False)
    return pc.if_else(pc.or_(t, fl), t, pa.nulls(1, pa.bool_())[0])


def _cast_isolating(arr: pa.Array, target: pa.DataType, col: str, bad: np.ndarray, why: list[str | None]) -> pa.Array:
    """Cast ``arr`` to ``target``; rows that cannot be cast become null and are marked bad."""
    n = len(arr)
    if arr.type == target:
        return arr
    if pa.types.is_null(arr.type):
        return pa.nulls(n, target)
    mark = np.zeros(n, dtype=bool)
    if pa.types.is_integer(target):
        out_arr = _to_int(arr, target, col, mark)
    elif pa.types.is_floating(target):
        out_arr = _to_float(arr, target, mark)
    elif pa.types.is_boolean(target):
        out_arr = _to_bool(arr, mark)
    elif pa.types.is_string(target) or pa.types.is_list(target):
        out_arr = pc.cast(arr, target)
    else:  # pragma: no cover - schema has no other types
        raise TypeError(f"column {col}: unsupported target type {target}")
    if mark.any():
        idx = np.flatnonzero(mark & ~bad)
        pyvals = arr.take(arrays.from_numpy(idx)).to_pylist() if len(idx) else []
        for row, v in zip(idx, pyvals, strict=True):
            why[row] = f"column {col}: cannot convert {_fmt(v)} to {target}"
        bad |= mark
    return out_arr


def conform(
    table: str, columns: Mapping[str, pa.Array | pa.ChunkedArray], n: int
) -> tuple[pa.Table, np.ndarray, list[str | None]]:
    """Cast ``columns`` to the canonical schema of ``table`` with row-level rejection.

    Parameters
    ----------
    table
        Canonical table name (a key of ``SCHEMAS``).
    columns
        Parsed source columns named by canonical column name; missing columns are all-NULL.
        Extra names are an error (a reader bug).
    n
        Number of rows.

    Returns
    -------
    good : pyarrow.Table
        The rows that conform, with exactly the canonical schema.
    bad : numpy.ndarray of bool, shape (n,)
        Which input rows were rejected.
    reasons : list of str or None
        The first reason per rejected row (None for good rows).
    """
    schema = SCHEMAS[table]
    extra = set(columns) - set(schema.names)
    if extra:
        raise KeyError(f"{table}: reader produced unknown columns {sorted(extra)}")
    bad = np.zeros(n, dtype=bool)
    why: list[str | None] = [None] * n
    out: list[pa.Array] = []
    defaults = NULL_MEANS[table]
    for fld in schema:
        arr = columns.get(fld.name)
        if arr is None:
            arr = pa.nulls(n, fld.type)
        if isinstance(arr, pa.ChunkedArray):
            arr = arr.combine_chunks()
        if len(arr) != n:
            raise ValueError(f"{table}.{fld.name}: {len(arr)} values for {n} rows (reader bug)")
        arr = _cast_isolating(arr, fld.type, fld.name, bad, why)
        if fld.name in defaults and arr.null_count:
            arr = arrays.from_numpy(arrays.values(arr, fill=int(defaults[fld.name])), fld.type)
        lohi = (
            MACHINE_EVENT_TYPE_RANGE
            if (table == "machine_events" and fld.name == "type")
            else CODE_RANGES.get(fld.name)
        )
        if lohi is not None:
            valid = arrays.valid(arr)
            vv = arrays.values(arr, fill=lohi[0])
            oor = valid & ((vv < lohi[0]) | (vv > lohi[1]))
            for i in np.flatnonzero(oor & ~bad):
                why[i] = f"column {fld.name}: code {int(vv[i])} outside {lohi[0]}..{lohi[1]}"
            bad |= oor
        check_domain(fld.name, arr, bad, why)
        if not fld.nullable:
            nulls = ~arrays.valid(arr)
            for i in np.flatnonzero(nulls & ~bad):
                why[i] = f"column {fld.name}: required value is missing"
            bad |= nulls
        out.append(arr)
    tbl = pa.Table.from_arrays(out, schema=schema.with_metadata(None)) if not bad.any() else None
    if tbl is None:
        keep = arrays.from_numpy(~bad)
        cols = [a.filter(keep) for a in out]
        # Non-nullable fields may hold nulls only in rejected rows; they are gone now.
        tbl = pa.Table.from_arrays(cols, schema=schema)
    return tbl, bad, why
