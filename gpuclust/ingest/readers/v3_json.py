"""Reader for the 2019 (v3) BigQuery JSON exports: newline-delimited JSON, optionally gzipped.

Encoding of the exports (and what this reader does about it):

* INT64 values are quoted strings (``"machine_id":"23624491139"``).  They are read as strings and
  parsed by Arrow's exact integer parser (never through float64), so 2^63-1 and IDs above 2^53
  survive exactly.  Enum fields are quoted numbers too; enum *names* (``"SCHEDULE"``) are
  accepted as well.
* NULL fields are omitted keys; whole floats lack a decimal point (``"cpus":1``).
* Repeated fields (``constraint``, ``start_after_collection_ids``) may be omitted when empty.

The fast path cuts the decompressed text into ~64 MiB chunks at line ends and parses each with
``pyarrow.json.read_json`` against an explicit schema (Arrow's threads on), while a background
thread decompresses the next chunk.  A chunk Arrow cannot parse (malformed JSON, an object where
a number belongs, ...) is re-parsed line by line with :mod:`json` to find and reject exactly the
bad lines; its good lines are kept.  Rows that parse but do not fit the canonical schema are
rejected one by one by :func:`gpuclust.ingest.normalize.conform`.

This module also holds the v3 source-field -> canonical-column mapping shared with the Parquet
reader (:mod:`gpuclust.ingest.readers.v3_parquet`), so both formats flatten identically.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pj

from gpuclust.ingest import arrays
from gpuclust.ingest.base import Chunk, ReadOptions, Reject, SourceError, SourceFile, clip_raw
from gpuclust.ingest.normalize import conform
from gpuclust.ingest.readers import _fast_usage
from gpuclust.ingest.readers.text_pieces import Piece, ordered_map, pieces, release, threaded
from gpuclust.ingest.sampling import int_values
from gpuclust.schema import (
    CPU_PERCENTILES_SOURCE_ORDER,
    SCHEMAS,
    CollectionType,
    EventType,
    MachineEventType,
    MissingDataReason,
    MissingType,
    Relation,
    Scheduler,
    VerticalScaling,
)

# --------------------------------------------------------------------------------------------
# The v3 source fields
# --------------------------------------------------------------------------------------------
INT, FLOAT, STR, BOOL, RES, FLOATS, INTS, CONSTRAINTS = (
    "int",
    "float",
    "str",
    "bool",
    "res",
    "floats",
    "ints",
    "constraints",
)

_RES_TYPE = pa.struct([("cpus", pa.float64()), ("memory", pa.float64())])
_CONSTRAINT_TYPE = pa.struct([("name", pa.string()), ("value", pa.string()), ("relation", pa.string())])
#: Arrow type each kind of source field is parsed into (before ``conform``).
RAW_TYPES: dict[str, pa.DataType] = {
    INT: pa.string(),
    FLOAT: pa.float64(),
    STR: pa.string(),
    BOOL: pa.bool_(),
    RES: _RES_TYPE,
    FLOATS: pa.list_(pa.float64()),
    INTS: pa.list_(pa.string()),
    CONSTRAINTS: pa.list_(_CONSTRAINT_TYPE),
}

_EVENT_COMMON = {
    "time": INT,
    "type": INT,
    "collection_id": INT,
    "scheduling_class": INT,
    "missing_type": INT,
    "collection_type": INT,
    "priority": INT,
    "alloc_collection_id": INT,
}

#: Source fields of each v3 table, in the export's order.
SOURCE_FIELDS: dict[str, dict[str, str]] = {
    "instance_usage": {
        "start_time": INT,
        "end_time": INT,
        "collection_id": INT,
        "instance_index": INT,
        "machine_id": INT,
        "alloc_collection_id": INT,
        "alloc_instance_index": INT,
        "collection_type": INT,
        "average_usage": RES,
        "maximum_usage": RES,
        "random_sample_usage": RES,
        "assigned_memory": FLOAT,
        "page_cache_memory": FLOAT,
        "cycles_per_instruction": FLOAT,
        "memory_accesses_per_instruction": FLOAT,
        "sample_rate": FLOAT,
        "cpu_usage_distribution": FLOATS,
        "tail_cpu_usage_distribution": FLOATS,
    },
    "instance_events": {
        **_EVENT_COMMON,
        "instance_index": INT,
        "machine_id": INT,
        "alloc_instance_index": INT,
        "resource_request": RES,
        "constraint": CONSTRAINTS,
    },
    "collection_events": {
        **_EVENT_COMMON,
        "user": STR,
        "collection_name": STR,
        "collection_logical_name": STR,
        "parent_collection_id": INT,
        "start_after_collection_ids": INTS,
        "max_per_machine": INT,
        "max_per_switch": INT,
        "vertical_scaling": INT,
        "scheduler": INT,
    },
    "machine_events": {
        "time": INT,
        "machine_id": INT,
        "type": INT,
        "switch_id": STR,
        "capacity": RES,
        "platform_id": STR,
        "missing_data_reason": INT,
    },
    "machine_attributes": {"time": INT, "machine_id": INT, "name": STR, "value": STR, "deleted": BOOL},
}

#: canonical column -> (source field, sub-field or None), for the plainly renamed columns.
COLUMN_MAP: dict[str, dict[str, tuple[str, str | None]]] = {
    "instance_usage": {
        **{
            c: (c, None)
            for c in (
                "start_time",
                "end_time",
                "collection_id",
                "instance_index",
                "machine_id",
                "alloc_collection_id",
                "alloc_instance_index",
                "collection_type",
                "sample_rate",
            )
        },
        "avg_cpu": ("average_usage", "cpus"),
        "avg_mem": ("average_usage", "memory"),
        "max_cpu": ("maximum_usage", "cpus"),
        "max_mem": ("maximum_usage", "memory"),
        "sample_cpu": ("random_sample_usage", "cpus"),
        "assigned_mem": ("assigned_memory", None),
        "page_cache_mem": ("page_cache_memory", None),
        "cpi": ("cycles_per_instruction", None),
        "mai": ("memory_accesses_per_instruction", None),
    },
    "instance_events": {
        **{c: (c, None) for c in (*_EVENT_COMMON, "instance_index", "machine_id", "alloc_instance_index")},
        "req_cpu": ("resource_request", "cpus"),
        "req_mem": ("resource_request", "memory"),
    },
    "collection_events": {
        c: (c, None)
        for c in (
            *_EVENT_COMMON,
            "user",
            "collection_name",
            "collection_logical_name",
            "parent_collection_id",
            "max_per_machine",
            "max_per_switch",
            "vertical_scaling",
            "scheduler",
        )
    },
    "machine_events": {
        **{c: (c, None) for c in ("time", "machine_id", "type", "switch_id", "platform_id", "missing_data_reason")},
        "cap_cpu": ("capacity", "cpus"),
        "cap_mem": ("capacity", "memory"),
    },
    "machine_attributes": {c: (c, None) for c in ("time", "machine_id", "name", "value", "deleted")},
}

_EVENT_ENUMS: dict[str, type[Any]] = {
    "type": EventType,
    "missing_type": MissingType,
    "collection_type": CollectionType,
}
#: Enum fields whose names are accepted in place of their codes, per source table.
ENUMS: dict[str, dict[str, type[Any]]] = {
    "instance_usage": {"collection_type": CollectionType},
    "instance_events": dict(_EVENT_ENUMS),
    "collection_events": {**_EVENT_ENUMS, "vertical_scaling": VerticalScaling, "scheduler": Scheduler},
    "machine_events": {"type": MachineEventType, "missing_data_reason": MissingDataReason},
    "machine_attributes": {},
}

_CPU_DIST_LEVELS = CPU_PERCENTILES_SOURCE_ORDER[:11]
_TAIL_DIST_LEVELS = CPU_PERCENTILES_SOURCE_ORDER[11:]


def raw_schema(source_table: str) -> pa.Schema:
    """The Arrow schema v3 records of ``source_table`` are parsed into before ``conform``."""
    return pa.schema([pa.field(k, RAW_TYPES[kind]) for k, kind in SOURCE_FIELDS[source_table].items()])


# --------------------------------------------------------------------------------------------
# Raw columns -> canonical tables (shared with the Parquet reader)
# --------------------------------------------------------------------------------------------
def _combine(arr: pa.Array | pa.ChunkedArray) -> pa.Array:
    return arr.combine_chunks() if isinstance(arr, pa.ChunkedArray) else arr


def _prep_int(arr: pa.Array, enum: type[Any] | None) -> pa.Array:
    """Integers held as text -> int64 where that is clean; otherwise leave the text to ``conform``."""
    if not (pa.types.is_string(arr.type) or pa.types.is_large_string(arr.type)):
        return arr
    if enum is not None and arr.null_count < len(arr):
        names = pa.array([m.name for m in enum], arr.type)
        idx = pc.index_in(arr, value_set=names)
        if idx.null_count < len(idx):
            codes = pa.array([str(int(m)) for m in enum], arr.type)
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
        return pa.ListArray.from_arrays(pa.array(np.zeros(n + 1, np.int32)), pa.array([], pa.int64()))
    arr = _combine(arr)
    offs, values, valid = _list_offsets_values(arr)
    counts = np.where(valid, np.diff(offs), 0)
    sel = _ranges(offs[:-1], counts)
    values = values.take(pa.array(sel))
    new_offs = np.concatenate([[0], np.cumsum(counts)]).astype(np.int32)
    row_of = np.repeat(np.arange(n), counts)
    ints = _prep_int(values, None)
    if not pa.types.is_integer(ints.type):
        s = pc.utf8_trim_whitespace(ints.cast(pa.string()))
        ok = np.asarray(
            pc.fill_null(pc.match_substring_regex(s, r"^[+-]?[0-9]+$"), False).to_numpy(zero_copy_only=False),
            dtype=bool,
        )
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
        for e in np.flatnonzero(~np.asarray(ints.is_valid().to_numpy(zero_copy_only=False), dtype=bool)):
            r = int(row_of[e])
            if not bad[r]:
                why[r] = f"{field}: null element"
            bad[r] = True
    # NULL (absent) repeated field = empty list.
    return pa.ListArray.from_arrays(pa.array(new_offs), ints.cast(pa.int64()))


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
    fields = SOURCE_FIELDS[source_table]
    enums = ENUMS[source_table]

    def col(name: str) -> pa.Array | None:
        if name not in raw.column_names:
            return None
        return _combine(raw.column(name))

    pre_bad = np.zeros(n, dtype=bool)
    pre_why: list[str | None] = [None] * n
    cols: dict[str, pa.Array] = {}
    prepped: dict[str, pa.Array] = {}
    for canon, (src, sub) in COLUMN_MAP[source_table].items():
        arr = col(src)
        if arr is None:
            continue
        if sub is not None:
            arr = _sub(arr, sub)
        elif fields[src] == INT:
            if src not in prepped:
                prepped[src] = _prep_int(arr, enums.get(src))
            arr = prepped[src]
        cols[canon] = arr
    tables: dict[str, pa.Table] = {}
    if source_table == "instance_usage":
        _percentiles(
            col("cpu_usage_distribution"), "cpu_usage_distribution", _CPU_DIST_LEVELS, n, cols, pre_bad, pre_why
        )
        _percentiles(
            col("tail_cpu_usage_distribution"),
            "tail_cpu_usage_distribution",
            _TAIL_DIST_LEVELS,
            n,
            cols,
            pre_bad,
            pre_why,
        )
    elif source_table == "collection_events":
        cols["start_after_collection_ids"] = _int_list(
            col("start_after_collection_ids"), "start_after_collection_ids", n, pre_bad, pre_why
        )
    elif source_table == "instance_events":
        cons = col("constraint")
        ctable = None
        if cons is not None and not pa.types.is_null(cons.type):
            offs, values, valid = _list_offsets_values(cons)
            counts = np.where(valid, np.diff(offs), 0)
            parent = np.repeat(np.arange(n, dtype=np.int64), counts)
            if len(parent):
                sel = _ranges(offs[:-1], counts)
                items = values.take(pa.array(sel))
                pidx = pa.array(parent)
                ccols: dict[str, pa.Array] = {}
                for c in ("time", "collection_id", "instance_index"):
                    if c in cols:
                        ccols[c] = cols[c].take(pidx)
                for c in ("name", "value", "relation"):
                    if pa.types.is_struct(items.type) and items.type.get_field_index(c) >= 0:
                        a = pc.struct_field(items, c)
                        ccols[c] = _prep_int(a, Relation) if c == "relation" else a
                cgood, cbad, cwhy = conform(
                    "instance_constraints", _to_target("instance_constraints", ccols), len(parent)
                )
                if cbad.any():
                    first_in_row = offs[:-1]
                    for j in np.flatnonzero(cbad):
                        r = int(parent[j])
                        if not pre_bad[r]:
                            pre_why[r] = f"constraint[{int(sel[j] - first_in_row[r])}]: {cwhy[j]}"
                        pre_bad[r] = True
                ctable = cgood
                cparent = parent[~cbad]
        good, bad, why = _finish("instance_events", cols, n, pre_bad, pre_why)
        tables["instance_events"] = good
        if ctable is not None:
            tables["instance_constraints"] = ctable.filter(pa.array(~bad[cparent])) if bad.any() else ctable
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


# --------------------------------------------------------------------------------------------
# Per-line coercion (the slow path for chunks Arrow cannot parse)
# --------------------------------------------------------------------------------------------
class _BadValue(ValueError):
    pass


def _jtype(v: Any) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "boolean"
    if isinstance(v, (int, float)):
        return f"number {v!r}"
    if isinstance(v, str):
        s = v if len(v) <= 40 else v[:37] + "..."
        return f"string {s!r}"
    if isinstance(v, list):
        return "array"
    return "object"


class _NegativeZero(int):
    """JSON ``-0``: the integer 0 whose float is -0.0, as Arrow's reader and the compiled one
    read it into a float field (Python's ``json`` reads it as the int 0, losing the sign)."""

    def __float__(self) -> float:
        return -0.0


def _json_int(text: str) -> int:
    """``json.loads``'s ``parse_int``: as ``int``, but ``-0`` keeps its sign for float fields."""
    return _NegativeZero(0) if text == "-0" else int(text)


def _co_int(v: Any) -> str | None:
    if v is None or isinstance(v, str):
        return v
    if isinstance(v, bool):
        raise _BadValue(f"expected an integer, got {_jtype(v)}")
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float) and math.isfinite(v) and v.is_integer() and abs(v) < 2.0**53:
        return str(int(v))
    raise _BadValue(f"expected an integer (a quoted string or a number), got {_jtype(v)}")


def _co_float(v: Any) -> float | None:
    if v is None:
        return None
    if isinstance(v, bool):
        raise _BadValue(f"expected a number, got {_jtype(v)}")
    if isinstance(v, (int, float)):
        return float(v)
    if isinstance(v, str):
        try:
            return float(v)
        except ValueError:
            pass
    raise _BadValue(f"expected a number, got {_jtype(v)}")


def _co_str(v: Any) -> str | None:
    if v is None or isinstance(v, str):
        return v
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        return str(v)
    raise _BadValue(f"expected a string, got {_jtype(v)}")


def _co_bool(v: Any) -> bool | None:
    if v is None or isinstance(v, bool):
        return v
    if isinstance(v, str) and v.strip().lower() in ("true", "false", "1", "0"):
        return v.strip().lower() in ("true", "1")
    if isinstance(v, int) and v in (0, 1):
        return bool(v)
    raise _BadValue(f"expected a boolean, got {_jtype(v)}")


def _co_res(v: Any, name: str) -> dict[str, float | None] | None:
    if v is None:
        return None
    if not isinstance(v, dict):
        raise _BadValue(f"expected an object with cpus/memory, got {_jtype(v)}")
    out = {}
    for k in ("cpus", "memory"):
        try:
            out[k] = _co_float(v.get(k))
        except _BadValue as e:
            raise _BadValue(f"{name}.{k}: {e}") from None
    return out


def _co_list(v: Any, each: Any) -> list[Any] | None:
    if v is None:
        return None
    if not isinstance(v, list):
        raise _BadValue(f"expected an array, got {_jtype(v)}")
    return [each(x) for x in v]


def _co_constraint(v: Any) -> dict[str, Any]:
    if not isinstance(v, dict):
        raise _BadValue(f"expected a constraint object, got {_jtype(v)}")
    return {"name": _co_str(v.get("name")), "value": _co_str(v.get("value")), "relation": _co_int(v.get("relation"))}


def coerce_record(rec: dict[str, Any], fields: dict[str, str]) -> dict[str, Any]:
    """One decoded JSON record -> the raw schema's Python values; :class:`ValueError` names the field."""
    out: dict[str, Any] = {}
    for name, kind in fields.items():
        v = rec.get(name)
        try:
            if kind == INT:
                out[name] = _co_int(v)
            elif kind == FLOAT:
                out[name] = _co_float(v)
            elif kind == STR:
                out[name] = _co_str(v)
            elif kind == BOOL:
                out[name] = _co_bool(v)
            elif kind == RES:
                out[name] = _co_res(v, name)
                continue
            elif kind == FLOATS:
                out[name] = _co_list(v, _co_float)
            elif kind == INTS:
                out[name] = _co_list(v, _co_int)
            elif kind == CONSTRAINTS:
                out[name] = _co_list(v, _co_constraint)
        except _BadValue as e:
            msg = str(e)
            raise _BadValue(msg if msg.startswith(f"{name}.") else f"field {name}: {msg}") from None
    return out


# --------------------------------------------------------------------------------------------
# Parsing one chunk
# --------------------------------------------------------------------------------------------
class _Mismatch(Exception):
    pass


class _Lines:
    """Lazy access to line texts inside one piece."""

    def __init__(self, piece: Piece):
        self.data = piece.view
        self._nl: np.ndarray | None = None

    def text(self, k: int) -> str:
        """Text of the k-th (0-based) line of the piece."""
        if self._nl is None:
            self._nl = np.flatnonzero(np.frombuffer(self.data, np.uint8) == 10)
        nl = self._nl
        start = int(nl[k - 1]) + 1 if k > 0 else 0
        end = int(nl[k]) if k < len(nl) else len(self.data)
        return bytes(self.data[start:end]).decode("utf-8", "replace").rstrip("\r")


_BLANK_INSIDE = re.compile(rb"\n[ \t\r]*\n")
_BLANK_EDGE = re.compile(rb"[ \t\r]*\n?")


def _has_blank_line(piece: Piece) -> bool:
    """Whether the piece has an empty or whitespace-only line (Arrow skips those)."""
    buf, start, end = piece.buf, piece.start, piece.end
    if end <= start:
        return False
    m = _BLANK_EDGE.match(buf, start, end)  # first line
    if m is not None and (m.end() == end or buf[m.end() - 1] == 10):
        return True
    last = buf.rfind(b"\n", start, end - 1) + 1 if buf[end - 1] == 10 else buf.rfind(b"\n", start, end) + 1
    last = max(last, start)
    if not buf[last:end].strip():  # last line
        return True
    if piece.nl_pos is not None:
        # A blank line inside starts right after a newline with a newline, blank or CR; most
        # pieces have none of those, which spares the regular-expression scan.
        after = piece.nl_pos[piece.nl_pos < end - start - 1] + 1
        nxt = np.frombuffer(buf, np.uint8, end - start, start)[after]
        if not ((nxt == 10) | (nxt == 32) | (nxt == 9) | (nxt == 13)).any():
            return False
    return _BLANK_INSIDE.search(buf, start, end) is not None


def _arrow_parse(data: memoryview, schema: pa.Schema, opts: ReadOptions) -> pa.Table:
    block = max(64 << 10, min(4 << 20, len(data) // max(1, 2 * opts.threads) + 1))
    return pj.read_json(
        pa.py_buffer(data),
        read_options=pj.ReadOptions(use_threads=opts.threads > 1, block_size=block),
        parse_options=pj.ParseOptions(
            explicit_schema=schema, unexpected_field_behavior="ignore", newlines_in_values=False
        ),
    )


def _slow_parse(
    piece: Piece, fields: dict[str, str], schema: pa.Schema, file: str
) -> tuple[pa.Table, np.ndarray, list[Reject], int]:
    """Per-line parse: (raw table of good records, their 0-based line indexes, rejects, non-blank lines)."""
    lines = piece.tobytes().split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()
    records: list[dict[str, Any]] = []
    idx: list[int] = []
    rejects: list[Reject] = []
    nonblank = 0
    for k, raw in enumerate(lines):
        if not raw.strip():
            continue
        nonblank += 1
        reason: str | None = None
        try:
            rec = json.loads(raw, parse_int=_json_int)
        except UnicodeDecodeError as e:
            reason = f"invalid UTF-8: {e.reason}"
        except ValueError as e:
            reason = f"invalid JSON: {e}"
        else:
            if not isinstance(rec, dict):
                reason = f"not a JSON object (got {_jtype(rec)})"
            else:
                try:
                    records.append(coerce_record(rec, fields))
                    idx.append(k)
                    continue
                except _BadValue as e:
                    reason = str(e)
        text = raw.decode("utf-8", "replace").rstrip("\r")
        rejects.append(Reject(file=file, line=piece.first_line + k, row=None, reason=reason, raw=clip_raw(text)))
    table = pa.Table.from_pylist(records, schema=schema)
    return table, np.asarray(idx, dtype=np.int64), rejects, nonblank


def _arrow_checked(piece: Piece, schema: pa.Schema, opts: ReadOptions) -> tuple[pa.Table, np.ndarray | None, int]:
    """Arrow-parse a piece: (raw table, 0-based line index per row or None for row i = line i, records).

    Raises ``pa.ArrowInvalid`` (or :class:`_Mismatch` when rows cannot be matched to lines, e.g. a
    line holding two objects) so the caller can isolate the bad lines.
    """
    buf, start, end = piece.buf, piece.start, piece.end
    n_lines = piece.newlines + (1 if end > start and buf[end - 1] != 10 else 0)
    raw = _arrow_parse(piece.view, schema, opts)
    if raw.num_rows == n_lines and not _has_blank_line(piece):
        return raw, None, n_lines
    lines = piece.tobytes().split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()
    nb = np.asarray([k for k, ln in enumerate(lines) if ln.strip()], dtype=np.int64)
    if raw.num_rows != len(nb):
        raise _Mismatch
    return raw, nb, len(nb)


def _split(piece: Piece, size: int) -> list[Piece]:
    """Cut a piece into line-aligned sub-pieces of about ``size`` bytes."""
    out: list[Piece] = []
    buf, pos, end, line = piece.buf, piece.start, piece.end, piece.first_line
    while pos < end:
        cut = end if pos + size >= end else buf.find(b"\n", pos + size, end) + 1
        if cut <= pos:
            cut = end
        nl = int(np.count_nonzero(np.frombuffer(buf, np.uint8, cut - pos, pos) == 10))  # buf may be a mmap
        out.append(Piece(buf, pos, cut, line, nl, piece.bytes_done))
        line += nl
        pos = cut
    return out


def _isolate(
    piece: Piece, fields: dict[str, str], schema: pa.Schema, file: str, opts: ReadOptions
) -> tuple[pa.Table, np.ndarray, list[Reject], int]:
    """A piece Arrow could not parse: re-parse ~1/16 of it at a time with Arrow, and only the
    sub-pieces that still fail line by line with :mod:`json`."""
    subs = _split(piece, max(1024, min(1 << 20, len(piece) // 16)))
    if len(subs) <= 1:
        return _slow_parse(piece, fields, schema, file)
    tables: list[pa.Table] = []
    idx: list[np.ndarray] = []
    rejects: list[Reject] = []
    total = 0
    for sp in subs:
        off = sp.first_line - piece.first_line
        try:
            t, li, n = _arrow_checked(sp, schema, opts)
            li = np.arange(t.num_rows, dtype=np.int64) if li is None else li
        except (pa.ArrowInvalid, _Mismatch):
            t, li, rej, n = _slow_parse(sp, fields, schema, file)
            rejects.extend(rej)
        tables.append(t)
        idx.append(li + off)
        total += n
    return pa.concat_tables(tables), np.concatenate(idx), rejects, total


@dataclass
class _Parsed:
    """A piece after the Arrow (or per-line) parse, before :func:`to_canonical`."""

    piece: Piece
    raw: pa.Table
    line_idx: np.ndarray | None  # 0-based line index (within the piece) of each raw row; None = row i is line i
    rejects: list[Reject]
    rows_read: int


def _parse_raw(src: SourceFile, piece: Piece, opts: ReadOptions) -> _Parsed:
    """The parse half of :func:`parse_piece` (runs ahead in the reader's thread when threads > 1).

    InstanceUsage pieces go to the compiled reader (:mod:`._fast_usage`) first, once it is loaded
    (:func:`._fast_usage.ready`; pieces read while it loads are parsed by Arrow, with the same
    result); a piece it does not accept (anything but clean records) is parsed by Arrow, with
    per-line isolation."""
    if src.source_table == "instance_usage" and _fast_usage.ready(_fast_usage.LOAD_WAIT):
        n_lines = piece.newlines + (1 if len(piece) and piece.buf[piece.end - 1] != 10 else 0)
        fast = _fast_usage.parse(piece.view, n_lines, opts.threads)
        if fast is not None:
            release(piece)  # a mapped piece's pages (the table holds no reference to the text)
            return _Parsed(piece, fast, None, [], fast.num_rows)
    rejects: list[Reject] = []
    schema = raw_schema(src.source_table)
    try:
        raw, line_idx, rows_read = _arrow_checked(piece, schema, opts)
    except (pa.ArrowInvalid, _Mismatch):
        raw, line_idx, rejects, rows_read = _isolate(
            piece, SOURCE_FIELDS[src.source_table], schema, str(src.path), opts
        )
    return _Parsed(piece, raw, line_idx, rejects, rows_read)


def _finish_piece(src: SourceFile, parsed: _Parsed, opts: ReadOptions) -> Chunk:
    """The canonical half of :func:`parse_piece` (records outside ``opts.select`` dropped first)."""
    piece, line_idx, rejects, raw = parsed.piece, parsed.line_idx, parsed.rejects, parsed.raw
    file = str(src.path)
    keep = preselect(src.source_table, raw, opts.select)
    skipped = 0
    if keep is not None and not bool(keep.all()):
        rows = np.flatnonzero(keep)
        skipped = raw.num_rows - len(rows)
        raw = raw.take(pa.array(rows))
        line_idx = rows if line_idx is None else line_idx[rows]
    tables, bad, why = to_canonical_batches(src.source_table, raw)
    if bad.any():
        lines_obj = _Lines(piece)
        for i in np.flatnonzero(bad):
            k = int(line_idx[i]) if line_idx is not None else int(i)
            rejects.append(
                Reject(
                    file=file,
                    line=piece.first_line + k,
                    row=None,
                    reason=why[i] or "rejected",
                    raw=clip_raw(lines_obj.text(k)),
                )
            )
        rejects.sort(key=lambda r: r.line or 0)
    release(piece)
    return Chunk(tables=tables, rejects=rejects, rows_read=parsed.rows_read, bytes_done=piece.bytes_done,
                 rows_skipped=skipped)


def parse_piece(src: SourceFile, piece: Piece, opts: ReadOptions) -> Chunk:
    """Parse one line-aligned piece of v3 JSON into a :class:`Chunk`."""
    return _finish_piece(src, _parse_raw(src, piece, opts), opts)


def read(src: SourceFile, opts: ReadOptions) -> Iterator[Chunk]:
    """Read one v3 JSON file (gzipped or not) as a stream of :class:`Chunk`.

    With ``opts.threads > 1`` one background thread decompresses, cuts and Arrow-parses piece
    N+1 (Arrow's own threads on) while this thread flattens piece N (:func:`to_canonical`,
    mostly single-threaded); the hand-over queue holds one piece, so at most three pieces are
    in memory.  InstanceUsage pieces for the compiled reader are read (or inflated) and cut in
    one thread and parsed in ``opts.threads`` more at once (:func:`.text_pieces.ordered_map`;
    about seven pieces in memory).  Pieces, rejects and errors come out in file order either
    way.

    Raises
    ------
    SourceError
        After yielding every complete line it could read, when the file is unreadable,
        truncated or its gzip stream is corrupt.
    """
    if src.source_table not in SOURCE_FIELDS:
        raise SourceError(src.path, f"v3 JSON has no table {src.source_table!r}")
    fast = src.source_table == "instance_usage" and _fast_usage.wanted()
    if fast:  # load the compiled reader in the background (a piece waits for it: _parse_raw)
        _fast_usage.preload()
    text = pieces(src, opts.chunk_bytes, _fast_usage.count_newlines if fast else None,
                  keep=4 + opts.threads if fast else 4, digest=opts.digest)
    if opts.threads > 1:
        if fast:  # read or inflate in one thread, the compiled parse in ``threads`` more
            parsed_it = ordered_map(lambda p: _parse_raw(src, p, opts), threaded(text, name="gpuclust-inflate"),
                                    opts.threads, "gpuclust-parse")
        else:
            parsed_it = threaded((_parse_raw(src, p, opts) for p in text), name="gpuclust-parse")
        for parsed in parsed_it:
            yield _finish_piece(src, parsed, opts)
        return
    for piece in text:
        yield parse_piece(src, piece, opts)
