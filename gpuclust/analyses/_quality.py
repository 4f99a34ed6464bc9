"""The table profiles of ``data-quality``: one small pass per events / machine table.

Each profile streams one canonical table (``instance_events``, ``collection_events`` or
``machine_events``) and counts, per partition, in dense partials (merged by addition):

* NULLs per fixed-width column (a NULL arrives as NaN or the dtype's minimum, see
  :func:`gpuclust.analyses.base.null_int`); the NULLs of string and list columns, which partials
  cannot read, come from the Parquet statistics (or the in-memory table) in :meth:`context`;
* rows per code of the code columns (``type``, ``missing_type``, ``missing_data_reason``);
* sentinels: ``time`` 0 ("before the trace") and 2^63-1 ("after it"), ``machine_id`` 0 (not
  placed) and -1 (dedicated machine);
* per *thing* (an instance, a collection, a machine: :attr:`TableProfile.key_columns`), whose rows
  are all in one partition (:attr:`whole_instances`): the things; events *out of order*: in time
  order (ties: row order), an event the life cycle does not allow after the thing's previous
  event (:data:`ALLOWED`); rows sharing their time with another row of the thing (``time_ties``);
  and, only with ``row_order`` (the result then depends on the layout), rows whose time is earlier
  than the previous row of the same thing in the dataset's row order (``time_backwards``);
* machine_events: rows and machines with a NULL capacity.

``data-quality`` declares the three profiles as its prerequisites (the engine runs them with the
user's backend, partitions and scheduler) and assembles their tables with its own usage profile.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from gpuclust._xp import bincount
from gpuclust.analyses.base import Analysis, is_null_int
from gpuclust.analyses.grouping import distinct_sorted, instance_order
from gpuclust.analyses.kinds import Fields, Sum
from gpuclust.analyses.lifecycle import EXPECTED, STATE_AFTER
from gpuclust.arrow_numpy import schema_table
from gpuclust.schema import (
    SCHEMAS,
    TIME_AFTER_TRACE,
    EventType,
    MachineEventType,
    MissingDataReason,
    MissingType,
)
from gpuclust.tables import nullable_int

__all__ = [
    "CHECKS",
    "CHECKS_SCHEMA",
    "CODES_SCHEMA",
    "CODE_SLOTS",
    "COLUMNS_SCHEMA",
    "CollectionEventsProfile",
    "InstanceEventsProfile",
    "MachineEventsProfile",
    "TableProfile",
    "check_rows",
    "code_rows",
    "column_null_count",
    "fixed_width_columns",
    "null_rows",
    "string_nulls",
]

#: Code slots of the ``codes`` partial: codes 0..10, then NULL, then any other value.
CODE_SLOTS = 13
_NULL_SLOT, _OTHER_SLOT = 11, 12
#: Every counter a profile may keep (a table reports those of :attr:`TableProfile.checks`).
CHECKS = (
    "rows",
    "things",
    "time_zero",
    "time_after_trace",
    "machine_zero",
    "machine_dedicated",
    "time_ties",
    "out_of_order",
    "out_of_order_things",
    "time_backwards",
    "time_backwards_things",
    "null_capacity_rows",
    "null_capacity_machines",
    "never_capacity_machines",
)
_C = {c: k for k, c in enumerate(CHECKS)}
#: ``ALLOWED[table][previous type, type]``: whether an event may follow the thing's previous event.
#: Instance and collection events: the v3 document's state diagram (``lifecycle``'s
#: :data:`~gpuclust.analyses.lifecycle.EXPECTED` after the state the previous event leaves).  Machine
#: events: after ADD or UPDATE (the machine is there) REMOVE or UPDATE; after REMOVE only ADD; an
#: UNKNOWN (0) event, before or after, is never flagged.
ALLOWED: dict[str, np.ndarray] = {
    "events": np.array([[b in EXPECTED[int(STATE_AFTER[a])] for b in range(11)] for a in range(11)], dtype=bool),
    "machines": np.array(
        [[True] * 4, [True, False, True, True], [True, True, False, False], [True, False, True, True]], dtype=bool
    ),
}


def fixed_width_columns(table: str) -> tuple[str, ...]:
    """The integer and float columns of a canonical table (those a partial can read)."""
    return tuple(f.name for f in SCHEMAS[table] if pa.types.is_integer(f.type) or pa.types.is_floating(f.type))


def string_nulls(source: Any, table: str) -> dict[str, int | None]:
    """NULLs of the other (string, list, bool) columns of ``table``: from each Parquet row group's
    statistics (``None`` where a file lacks them, and under a time selection), or from the
    in-memory table; nothing is read into memory for a dataset."""
    names = [f.name for f in SCHEMAS[table] if f.name not in fixed_width_columns(table)]
    if not names:
        return {}
    if getattr(source, "selection", None) is not None:  # a time selection: the statistics are the whole table's
        return dict.fromkeys(names)
    files = source.files(table) if hasattr(source, "files") else None
    if files is None:
        t = source.read(table, names)
        return {c: int(t.column(c).null_count) for c in names}
    out: dict[str, int | None] = dict.fromkeys(names, 0)
    for f in files:
        md = pq.ParquetFile(f).metadata
        schema = md.schema.to_arrow_schema()
        for g in range(md.num_row_groups):
            rg = md.row_group(g)
            if rg.num_rows == 0:
                continue
            for c in names:
                j = schema.get_field_index(c)
                st = rg.column(_leaf(md, c, j)).statistics if j >= 0 else None
                if out[c] is None or st is None or not st.has_null_count:
                    out[c] = None
                else:
                    out[c] = int(out[c] or 0) + int(st.null_count)
    return out


def _leaf(md: Any, name: str, field: int) -> int:
    """The Parquet leaf column of top-level field ``name`` (a list column's ``element``)."""
    for j in range(md.num_columns):
        path = md.schema.column(j).path
        if path == name or path.startswith(name + "."):
            return j
    return field


def null_rows(table: str, rows: int, nulls: dict[str, int | None]) -> list[dict[str, Any]]:
    """Rows of the ``columns`` result table: one per column of ``table``, in schema order."""
    return [{"table": table, "column": f.name, "rows": rows, "nulls": nulls.get(f.name)} for f in SCHEMAS[table]]


def code_rows(table: str, column: str, names: type[enum.IntEnum], counts: np.ndarray) -> list[dict[str, Any]]:
    """Rows of the ``codes`` result table for one code column (codes with rows only)."""
    out = []
    for slot in np.nonzero(counts)[0]:
        code = int(slot)
        if code == _NULL_SLOT:
            name, value = "NULL", -1
        elif code == _OTHER_SLOT:
            name, value = "other", -2
        else:
            name, value = (names(code).name if code in names._value2member_map_ else "unknown"), code
        out.append({"table": table, "column": column, "code": value, "name": name, "rows": int(counts[code])})
    return out


def check_rows(table: str, items: list[tuple[str, int, str, int]]) -> list[dict[str, Any]]:
    """Rows of the ``checks`` result table from ``(check, count, unit, of)``."""
    return [
        {"table": table, "check": c, "count": int(n), "unit": u, "of": int(of), "share": (n / of) if of else np.nan}
        for c, n, u, of in items
    ]


def code_counts(xp: Any, v: Any) -> Any:
    """Rows per code slot (:data:`CODE_SLOTS`) of one integer code column."""
    null = is_null_int(xp, v)
    w = v.astype(xp.int64)
    slot = xp.where(null, _NULL_SLOT, xp.where((w >= 0) & (w < _NULL_SLOT), w, _OTHER_SLOT))
    return bincount(xp, slot, minlength=CODE_SLOTS).astype(xp.int64)


def column_null_count(xp: Any, a: Any) -> Any:
    """NULLs of one column as a partial reads it, a 0-d array of ``xp`` (on a device: not read)."""
    return xp.count_nonzero(xp.isnan(a) if a.dtype.kind == "f" else is_null_int(xp, a))


@dataclass(frozen=True)
class TableProfile(Analysis):
    """Counts of one events or machine table (see the module docstring); a prerequisite of
    ``data-quality``, not registered on its own."""

    #: Columns naming one thing whose rows are checked for order, and what the thing is called.
    key_columns: ClassVar[tuple[str, ...]] = ("collection_id", "instance_index")
    thing: ClassVar[str] = "instances"
    #: ``(column, enum of its code names)`` of the code columns counted.
    code_columns: ClassVar[tuple[tuple[str, type[enum.IntEnum]], ...]] = ()
    #: The counters of :data:`CHECKS` this table reports, in order (and ``time_backwards``,
    #: ``time_backwards_things`` with :attr:`row_order`).
    checks: ClassVar[tuple[str, ...]] = ()
    #: The :data:`ALLOWED` matrix of its event types.
    allowed: ClassVar[str] = "events"
    whole_instances: ClassVar[bool] = True
    #: Also count the rows whose time goes backwards in the dataset's row order (layout-dependent:
    #: ``gpuclust optimize`` sorts each bucket by time).
    row_order: bool = False
    #: tracemalloc peak of partial: 82 B/row (real 2011 task events), 66 (2011 machine events)
    row_bytes = 120
    #: rows per partition for partitions="auto" (whole buckets): as lifecycle's replay, small
    #: partitions keep a profile's memory flat as the events grow (docs/user/scale.md)
    auto_partition_rows = 1 << 17

    @property
    def columns(self) -> tuple[str, ...]:
        return fixed_width_columns(self.table)

    def context(self, source: Any) -> dict[str, int | None]:
        return string_nulls(source, self.table)

    def partial(self, cols: dict[str, Any], ctx: Any, backend: Any) -> dict[str, Any]:
        xp = backend.xp
        out = self.kinds.empty(backend, on_backend=True)
        n = int(cols["time"].shape[0])
        if n == 0:
            return out
        cnt = xp.zeros(len(CHECKS), dtype=xp.int64)  # counted where the rows are (no read per count)
        cnt[_C["rows"]] = n
        out["nulls"] = xp.stack([column_null_count(xp, cols[c]) for c in self.columns]).astype(xp.int64)
        if self.code_columns:
            out["codes"] = xp.stack([code_counts(xp, cols[c]) for c, _ in self.code_columns])
        t = cols["time"]
        cnt[_C["time_zero"]] = xp.count_nonzero(t == 0)
        cnt[_C["time_after_trace"]] = xp.count_nonzero(t == TIME_AFTER_TRACE)
        if "machine_id" in cols:
            m = cols["machine_id"]
            cnt[_C["machine_zero"]] = xp.count_nonzero(m == 0)
            cnt[_C["machine_dedicated"]] = xp.count_nonzero(m == -1)
        keys = [cols[k].astype(xp.int64) for k in self.key_columns]
        # ---- row order within each thing (a stable sort by the key: ties keep the row order)
        zero = xp.zeros(n, dtype=xp.int64)
        order = instance_order(xp, keys[0], keys[1] if len(keys) > 1 else zero, zero)
        ks = [k[order] for k in keys]
        ts = t[order]
        same = xp.ones(n - 1, dtype=bool)
        for k in ks:
            same &= k[1:] == k[:-1]
        cnt[_C["things"]] = n - xp.count_nonzero(same)
        first = xp.ones(n, dtype=bool)
        first[1:] = ~same
        seg = xp.cumsum(first) - 1
        if self.row_order:
            back = xp.nonzero(same & (ts[1:] < ts[:-1]))[0] + 1
            cnt[_C["time_backwards"]] = int(back.shape[0])
            cnt[_C["time_backwards_things"]] = distinct_sorted(xp, seg[back])  # (seg and back ascend)
        # ---- time order within each thing (ties keep the row order; seg is sorted already)
        by_time = instance_order(xp, seg, zero, ts)
        tt = ts[by_time]
        cnt[_C["time_ties"]] = xp.count_nonzero(same & (tt[1:] == tt[:-1]))
        # ---- out of order: an event the life cycle does not allow after the previous one
        e = cols["type"].astype(xp.int64)[order][by_time]
        allowed = xp.asarray(ALLOWED[self.allowed])
        k = int(allowed.shape[0])
        valid = (e >= 0) & (e < k)
        ec = xp.where(valid, e, 0)
        bad = same & valid[1:] & valid[:-1] & ~allowed[ec[:-1], ec[1:]]
        at = xp.nonzero(bad)[0] + 1
        cnt[_C["out_of_order"]] = int(at.shape[0])
        cnt[_C["out_of_order_things"]] = distinct_sorted(xp, seg[at])
        if "cap_cpu" in cols:
            nocap = (xp.isnan(cols["cap_cpu"]) | xp.isnan(cols["cap_mem"]))[order]
            cnt[_C["null_capacity_rows"]] = xp.count_nonzero(nocap)
            per = bincount(xp, seg, weights=nocap.astype(xp.float64))
            size = bincount(xp, seg)
            cnt[_C["null_capacity_machines"]] = xp.count_nonzero(per > 0)
            cnt[_C["never_capacity_machines"]] = xp.count_nonzero(per == size)
        out["counts"] = cnt
        return out

    @property
    def kinds(self) -> Fields:
        """Dense counters, summed: NULLs per column, the :data:`CHECKS` and rows per code slot."""
        return Fields(
            {
                "nulls": Sum((len(self.columns),), np.int64),
                "counts": Sum((len(CHECKS),), np.int64),
                "codes": Sum((len(self.code_columns), CODE_SLOTS), np.int64),
            }
        )

    def finalize(self, partial: dict[str, np.ndarray], ctx: Any) -> dict[str, pa.Table]:
        p = {k: np.asarray(v) for k, v in partial.items()}
        cnt = dict(zip(CHECKS, (int(v) for v in p["counts"]), strict=True))
        rows = cnt["rows"]
        nulls: dict[str, int | None] = {c: int(v) for c, v in zip(self.columns, p["nulls"], strict=True)}
        nulls.update(ctx or {})
        cols, checks, codes = [], [], []
        if rows:
            cols = null_rows(self.table, rows, nulls)
            items = [("rows", rows, "rows", rows), (self.thing, cnt["things"], self.thing, cnt["things"])]
            for c in (*self.checks, *(("time_backwards", "time_backwards_things") if self.row_order else ())):
                unit = self.thing if c.endswith(("things", "machines")) else "rows"
                of = cnt["things"] if unit == self.thing else rows
                items.append((c.replace("things", self.thing), cnt[c], unit, of))
            checks = check_rows(self.table, items)
            for j, (c, names) in enumerate(self.code_columns):
                codes += code_rows(self.table, c, names, p["codes"][j])
        return {
            "columns": schema_table(cols, COLUMNS_SCHEMA),
            "checks": schema_table(checks, CHECKS_SCHEMA),
            "codes": schema_table(codes, CODES_SCHEMA),
        }


#: The columns of the ``columns``, ``checks`` and ``codes`` result tables (Arrow tables, so that a
#: run without plots does not import pandas; ``nulls`` is NULL where unknown, ``Int64`` in pandas).
COLUMNS_SCHEMA = pa.schema(
    [("table", pa.string()), ("column", pa.string()), ("rows", pa.int64()), nullable_int("nulls")]
)
CHECKS_SCHEMA = pa.schema(
    [
        ("table", pa.string()),
        ("check", pa.string()),
        ("count", pa.int64()),
        ("unit", pa.string()),
        ("of", pa.int64()),
        ("share", pa.float64()),
    ]
)
CODES_SCHEMA = pa.schema(
    [("table", pa.string()), ("column", pa.string()), ("code", pa.int64()), ("name", pa.string()), ("rows", pa.int64())]
)


_EVENT_CHECKS = ("time_zero", "time_after_trace", "time_ties", "out_of_order", "out_of_order_things")


@dataclass(frozen=True)
class InstanceEventsProfile(TableProfile):
    """The instance_events profile."""

    name = "_data-quality-instance-events"
    table = "instance_events"
    code_columns = (("type", EventType), ("missing_type", MissingType))
    checks = (
        "time_zero",
        "time_after_trace",
        "machine_zero",
        "machine_dedicated",
        "time_ties",
        "out_of_order",
        "out_of_order_things",
    )


@dataclass(frozen=True)
class CollectionEventsProfile(TableProfile):
    """The collection_events profile (one thing per collection)."""

    name = "_data-quality-collection-events"
    table = "collection_events"
    key_columns = ("collection_id",)
    thing = "collections"
    code_columns = (("type", EventType), ("missing_type", MissingType))
    checks = _EVENT_CHECKS


@dataclass(frozen=True)
class MachineEventsProfile(TableProfile):
    """The machine_events profile (one thing per machine)."""

    name = "_data-quality-machine-events"
    table = "machine_events"
    key_columns = ("machine_id",)
    thing = "machines"
    code_columns = (("type", MachineEventType), ("missing_data_reason", MissingDataReason))
    allowed = "machines"
    checks = (
        "time_zero",
        "time_after_trace",
        "machine_zero",
        "machine_dedicated",
        "time_ties",
        "out_of_order",
        "out_of_order_things",
        "null_capacity_rows",
        "null_capacity_machines",
        "never_capacity_machines",
    )
