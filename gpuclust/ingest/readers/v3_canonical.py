"""Parsed v3 records -> canonical tables (shared by the JSON and the Parquet reader).

:func:`to_canonical` flattens the raw columns (one per v3 source field, as
:func:`gpuclust.ingest.readers.v3_fields.raw_schema` types them, or as a Parquet export holds
them) into the canonical tables; rows that do not fit are rejected one by one by
:func:`gpuclust.ingest.normalize.conform`.  :func:`preselect` applies an ingest selection to the
parsed records before they are flattened.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from gpuclust.arrow_numpy import strings
from gpuclust.ingest import arrays
from gpuclust.ingest.normalize import conform
from gpuclust.ingest.readers.v3_fields import (
    _CPU_DIST_LEVELS,
    _TAIL_DIST_LEVELS,
    COLUMN_MAP,
    ENUMS,
    INT,
    SOURCE_FIELDS,
)
from gpuclust.ingest.sampling import int_values
from gpuclust.schema import SCHEMAS, Relation


def _combine(arr: pa.Array | pa.ChunkedArray) -> pa.Array:
    return arr.combine_chunks() if isinstance(arr, pa.ChunkedArray) else arr


def _prep_int(arr: pa.Array, enum: type[Any] | None) -> pa.Array:
    """Integers held as text -> int64 where that is clean; otherwise leave the text to ``conform``."""
    if not (pa.types.is_string(arr.type) or pa.types.is_large_string(arr.type)):
        return arr
    if enum is not None and arr.null_count < len(arr):
        names = strings([m.name for m in enum]).cast(arr.type)
        idx = pc.index_in(arr, value_set=names)
        if idx.null_count < len(idx):
            codes = strings([str(int(m)) for m in enum]).cast(arr.type)
            arr = pc.coalesce(pc.take(codes, idx), arr)
    try:
        out = pc.cast(arr, pa.int64())
    except pa.ArrowInvalid:
        return arr
    # Arrow's integer parser also reads hexadecimal ("0x1F"); ``conform`` (decimal only) decides those.
    if _may_hold_x(arr):
        return arr
    return out


def _may_hold_x(arr: pa.Array) -> bool:
    """Whether any string in ``arr`` may contain an 'x' or 'X' (scans the raw character buffer)."""
    data = arr.buffers()[2]
    if data is None or data.size == 0:
        return False
    v = np.frombuffer(data, dtype=np.uint8)
    return bool(((v | 0x20) == ord("x")).any())


def _sub(arr: pa.Array, sub: str | None) -> pa.Array:
    if sub is None:
        return arr
    if pa.types.is_null(arr.type):
        return arr
    if not pa.types.is_struct(arr.type):
        raise TypeError(f"expected a struct, got {arr.type}")
    if arr.type.get_field_index(sub) < 0:
        return pa.nulls(len(arr))
    return pc.struct_field(arr, sub)  # respects the struct's own nulls


def _list_offsets_values(arr: pa.Array) -> tuple[np.ndarray, pa.Array, np.ndarray]:
    """(offsets[n+1] into values, values, valid[n]) of a list array, honouring slicing."""
    offs = arrays.values(arr.offsets).astype(np.int64)
    return offs, arr.values, arrays.valid(arr)


def _percentiles(
    arr: pa.Array | None,
    field: str,
    levels: tuple[int, ...],
    n: int,
    out: dict[str, pa.Array],
    bad: np.ndarray,
    why: list[str | None],
) -> None:
    names = [f"cpu_p{p}" for p in levels]
    if arr is None or pa.types.is_null(arr.type):
        return
    arr = _combine(arr)
    if not (pa.types.is_list(arr.type) or pa.types.is_large_list(arr.type)):
        raise TypeError(f"{field}: expected a list, got {arr.type}")
    offs, values, valid = _list_offsets_values(arr)
    lengths = np.where(valid, offs[1:] - offs[:-1], 0)
    k = len(levels)
    wrong = (lengths != 0) & (lengths != k)
    for i in np.flatnonzero(wrong & ~bad):
        why[i] = f"{field}: expected {k} values (or none), got {int(lengths[i])}"
    bad |= wrong
    full = lengths == k
    if not full.any():
        return
    if not pa.types.is_floating(values.type):  # float32 (the compiled reader) is gathered as is
        values = values.cast(pa.float64())
    vnp = arrays.values(values)
    vvalid = arrays.valid(values) if values.null_count else None
    start = np.where(full, offs[:-1], 0)
    idx = start[None, :] + np.arange(k, dtype=start.dtype)[:, None]  # (k, n): one row per level
    # float64 -> float32 here rounds exactly as conform's cast would.
    vals = np.where(full[None, :], vnp[idx], 0.0).astype(np.float32)
    for j, name in enumerate(names):
        mask = ~full if vvalid is None else ~(full & vvalid[idx[j]])
        out[name] = arrays.from_numpy(vals[j], pa.float32(), mask)


def _ranges(starts: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """Concatenated ``arange(starts[i], starts[i] + counts[i])``, vectorised."""
    total = int(counts.sum())
    if total == 0:
        return np.zeros(0, dtype=np.int64)
    first = np.repeat(np.cumsum(counts) - counts, counts)
    return np.repeat(starts, counts) + (np.arange(total, dtype=np.int64) - first)


def _int_list(arr: pa.Array | None, field: str, n: int, bad: np.ndarray, why: list[str | None]) -> pa.Array:
    """A list of (quoted) int64 -> list<int64>; absent = empty list; a bad element rejects the row."""
    if arr is None or pa.types.is_null(arr.type):
        return pa.ListArray.from_arrays(
            arrays.from_numpy(np.zeros(n + 1, np.int32)), arrays.from_numpy(np.zeros(0, np.int64))
        )
    arr = _combine(arr)
    offs, values, valid = _list_offsets_values(arr)
    counts = np.where(valid, np.diff(offs), 0)
    sel = _ranges(offs[:-1], counts)
    values = values.take(arrays.from_numpy(sel))
    new_offs = np.concatenate([[0], np.cumsum(counts)]).astype(np.int32)
    row_of = np.repeat(np.arange(n), counts)
    ints = _prep_int(values, None)
    if not pa.types.is_integer(ints.type):
        s = pc.utf8_trim_whitespace(ints.cast(pa.string()))
        ok = arrays.values(pc.match_substring_regex(s, r"^[+-]?[0-9]+$"), fill=False)
        py = s.to_pylist()
        vals: list[int | None] = []
        elem_bad = np.zeros(len(py), dtype=bool)
        for j, v in enumerate(py):
            iv = int(v) if (v is not None and ok[j]) else None
            if iv is None or not (-(2**63) <= iv < 2**63):
                elem_bad[j] = True
                vals.append(None)
            else:
                vals.append(iv)
        ints = pa.array(vals, pa.int64())
        for e in np.flatnonzero(elem_bad):
            r = int(row_of[e])
            if not bad[r]:
                why[r] = f"{field}: cannot convert {py[e]!r} to int64"
            bad[r] = True
    elif ints.null_count:
        for e in np.flatnonzero(~arrays.valid(ints)):
            r = int(row_of[e])
            if not bad[r]:
                why[r] = f"{field}: null element"
            bad[r] = True
    # NULL (absent) repeated field = empty list.
    return pa.ListArray.from_arrays(arrays.from_numpy(new_offs), ints.cast(pa.int64()))


def _to_target(table: str, cols: dict[str, pa.Array]) -> dict[str, pa.Array]:
    """Cast clean numeric columns to their canonical type up front (exactly as ``conform`` would:
    checked casts for integers, IEEE rounding for float32); anything that does not cast cleanly
    is left for ``conform`` to isolate row by row."""
    schema = SCHEMAS[table]
    out: dict[str, pa.Array] = {}
    for name, arr in cols.items():
        target = schema.field(name).type
        if arr.type != target:
            if pa.types.is_integer(target) and pa.types.is_integer(arr.type):
                try:
                    arr = pc.cast(arr, target)  # safe: overflow raises
                except pa.ArrowInvalid:
                    pass
            elif pa.types.is_floating(target) and pa.types.is_floating(arr.type):
                arr = pc.cast(arr, target, safe=False)
        out[name] = arr
    return out


def _finish(
    table: str, cols: dict[str, pa.Array], n: int, pre_bad: np.ndarray, pre_why: list[str | None]
) -> tuple[pa.Table, np.ndarray, list[str | None]]:
    good, bad, why = conform(table, _to_target(table, cols), n)
    extra = pre_bad & ~bad
    if extra.any():
        good = good.filter(arrays.from_numpy(~pre_bad[~bad]))
        for i in np.flatnonzero(extra):
            why[i] = pre_why[i]
        bad = bad | pre_bad
    return good, bad, why


def _raw_column(raw: pa.Table, name: str) -> pa.Array | None:
    """The source column ``name`` as one array (None when the records have no such field)."""
    if name not in raw.column_names:
        return None
    return _combine(raw.column(name))


def _mapped_columns(source_table: str, raw: pa.Table) -> dict[str, pa.Array]:
    """The canonical columns taken straight from source fields (sub-fields picked, integer fields prepared once)."""
    fields = SOURCE_FIELDS[source_table]
    enums = ENUMS[source_table]
    cols: dict[str, pa.Array] = {}
    prepped: dict[str, pa.Array] = {}
    for canon, (src, sub) in COLUMN_MAP[source_table].items():
        arr = _raw_column(raw, src)
        if arr is None:
            continue
        if sub is not None:
            arr = _sub(arr, sub)
        elif fields[src] == INT:
            if src not in prepped:
                prepped[src] = _prep_int(arr, enums.get(src))
            arr = prepped[src]
        cols[canon] = arr
    return cols


def _constraints(
    cons: pa.Array | None, cols: dict[str, pa.Array], n: int, pre_bad: np.ndarray, pre_why: list[str | None]
) -> tuple[pa.Table, np.ndarray] | None:
    """The conforming ``instance_constraints`` rows of the events' constraint lists, and each one's event row;
    an event with a bad constraint is marked bad (None when there are no constraints)."""
    if cons is None or pa.types.is_null(cons.type):
        return None
    offs, values, valid = _list_offsets_values(cons)
    counts = np.where(valid, np.diff(offs), 0)
    parent = np.repeat(np.arange(n, dtype=np.int64), counts)
    if not len(parent):
        return None
    sel = _ranges(offs[:-1], counts)
    items = values.take(arrays.from_numpy(sel))
    pidx = arrays.from_numpy(parent)
    ccols: dict[str, pa.Array] = {}
    for c in ("time", "collection_id", "instance_index"):
        if c in cols:
            ccols[c] = cols[c].take(pidx)
    for c in ("name", "value", "relation"):
        if pa.types.is_struct(items.type) and items.type.get_field_index(c) >= 0:
            a = pc.struct_field(items, c)
            ccols[c] = _prep_int(a, Relation) if c == "relation" else a
    cgood, cbad, cwhy = conform("instance_constraints", _to_target("instance_constraints", ccols), len(parent))
    if cbad.any():
        first_in_row = offs[:-1]
        for j in np.flatnonzero(cbad):
            r = int(parent[j])
            if not pre_bad[r]:
                pre_why[r] = f"constraint[{int(sel[j] - first_in_row[r])}]: {cwhy[j]}"
            pre_bad[r] = True
    return cgood, parent[~cbad]


def to_canonical(source_table: str, raw: pa.Table) -> tuple[dict[str, pa.Table], np.ndarray, list[str | None]]:
    """Flatten parsed v3 records (JSON or Parquet) into canonical tables.

    Parameters
    ----------
    source_table
        The v3 table the records come from.
    raw
        One row per source record, columns named by v3 source field (missing columns = NULL).

    Returns
    -------
    tables : dict of str to pyarrow.Table
        Canonical tables (``instance_events`` also yields ``instance_constraints``).
    bad : numpy.ndarray of bool
        Which source records were rejected (a record is rejected whole, with all its constraints).
    reasons : list of str or None
        The reason per rejected record.
    """
    n = raw.num_rows
    pre_bad = np.zeros(n, dtype=bool)
    pre_why: list[str | None] = [None] * n
    cols = _mapped_columns(source_table, raw)
    tables: dict[str, pa.Table] = {}
    if source_table == "instance_usage":
        for name, levels in (
            ("cpu_usage_distribution", _CPU_DIST_LEVELS),
            ("tail_cpu_usage_distribution", _TAIL_DIST_LEVELS),
        ):
            _percentiles(_raw_column(raw, name), name, levels, n, cols, pre_bad, pre_why)
    elif source_table == "collection_events":
        cols["start_after_collection_ids"] = _int_list(
            _raw_column(raw, "start_after_collection_ids"), "start_after_collection_ids", n, pre_bad, pre_why
        )
    elif source_table == "instance_events":
        constraints = _constraints(_raw_column(raw, "constraint"), cols, n, pre_bad, pre_why)
        good, bad, why = _finish("instance_events", cols, n, pre_bad, pre_why)
        tables["instance_events"] = good
        if constraints is not None:
            ctable, cparent = constraints
            tables["instance_constraints"] = ctable.filter(arrays.from_numpy(~bad[cparent])) if bad.any() else ctable
        return tables, bad, why
    good, bad, why = _finish(source_table, cols, n, pre_bad, pre_why)
    tables[source_table] = good
    return tables, bad, why


#: The canonical tables one v3 source table's records become (when not just itself).
OUTPUTS = {"instance_events": ("instance_events", "instance_constraints")}


def preselect(source_table: str, raw: pa.Table, select: Any) -> np.ndarray | None:
    """Which parsed records to keep under an ingest selection (``ReadOptions.select``), judged
    before they are flattened and validated, or ``None`` to keep them all.

    Only where that is the same decision the writer makes on the canonical rows: every table the
    records become carries the selection's columns (with ``--sample machines=``, instance events
    are not dropped here: their constraints carry no machine), and a key or time reads as a clean
    integer (else the records go on and are judged, or rejected, as canonical rows)."""
    if select is None:
        return None
    outputs = OUTPUTS.get(source_table, (source_table,))
    if not all(select.can_filter(SCHEMAS[t].names) for t in outputs):
        return None
    cmap = COLUMN_MAP[source_table]

    def get(name: str) -> tuple[np.ndarray, np.ndarray] | None:
        src, subfield = cmap.get(name, (None, None))
        if src is None or subfield is not None or src not in raw.column_names:
            return None
        arr = _prep_int(_combine(raw.column(src)), None)
        if not pa.types.is_integer(arr.type):
            raise _Unclean
        return int_values(arr)

    try:
        return select.mask(outputs[0], get)
    except (_Unclean, pa.ArrowInvalid):
        return None


class _Unclean(Exception):
    pass


def to_canonical_batches(source_table: str, raw: pa.Table) -> tuple[dict[str, pa.Table], np.ndarray, list[str | None]]:
    """:func:`to_canonical` batch by batch (no copying of multi-chunk columns), results concatenated."""
    batches = raw.to_batches()
    if len(batches) <= 1:
        return to_canonical(source_table, raw)
    parts = [to_canonical(source_table, pa.Table.from_batches([b], schema=raw.schema)) for b in batches]
    names = sorted({t for p in parts for t in p[0]})
    tables = {t: pa.concat_tables([p[0][t] for p in parts if t in p[0]]) for t in names}
    bad = np.concatenate([p[1] for p in parts])
    why = [w for p in parts for w in p[2]]
    return tables, bad, why
