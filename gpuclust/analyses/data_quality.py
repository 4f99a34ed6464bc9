"""``data-quality``: what a dataset holds and where it is odd, per table, so a user knows what they
analyse (issue 11, item 6; every check is defined in docs/analyses/data-quality.md).

Per table (instance_usage, instance_events, collection_events, machine_events): rows, NULLs per
column, rows per code (``type``, ``missing_type``, ``missing_data_reason``), the sentinels (time
0 and 2^63-1, machine 0 and -1) and the table's own checks:

* instance_usage: windows ending before they start, of zero length, shorter and longer than
  ``short_window_s``; CPU percentile vectors all NULL, partly NULL, and non-monotone (a level
  below a lower level's value); ``cpu_p100`` below / above ``max_cpu`` (and the distribution of
  ``max_cpu / cpu_p100``); implausible CPI/MAI (:class:`gpuclust.stats.CpiFilter`, cpi's rule);
  windows and instances with no event row; windows of an instance that starts at or after its
  final terminal event, or runs past it;
* events tables: distinct instances (collections), events sharing their time with another event
  of the instance, instances with events but no usage window; events *out of order* (in time
  order, an event the life cycle does not allow after the previous one); with ``row_order``,
  events whose time goes backwards in the dataset's row order;
* machine_events: rows and machines with a NULL capacity, events out of order (ADD after ADD,
  ...).

Plan: the events and machine tables are profiled by prerequisite passes
(:mod:`gpuclust.analyses._quality`); the analysis itself streams instance_usage whole instance by
whole instance (:attr:`whole_instances`), with instance_events as a per-partition side input for
the per-instance joins.  Every partial is dense (fixed-size counters), merged by addition.  A
dataset without instance_usage (the real 2011 events) gets the events and machine profiles.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, ClassVar

import numpy as np
import pyarrow as pa

from gpuclust._xp import bincount
from gpuclust.analyses._lookup import InstanceLookup
from gpuclust.analyses._quality import (
    CHECKS_SCHEMA,
    CODES_SCHEMA,
    COLUMNS_SCHEMA,
    CollectionEventsProfile,
    InstanceEventsProfile,
    MachineEventsProfile,
    check_rows,
    column_null_count,
    fixed_width_columns,
    null_rows,
)
from gpuclust.analyses.base import Analysis, fmt
from gpuclust.analyses.grouping import instance_order
from gpuclust.analyses.kinds import Fields, Sum
from gpuclust.analyses.options import option
from gpuclust.arrow_numpy import schema_table, table_from_rows, to_numpy
from gpuclust.partials import bin_quantile_edges, bin_rows, log_bins
from gpuclust.schema import CPU_PERCENTILE_COLUMNS_SORTED, TERMINAL_EVENTS, TIME_AFTER_TRACE
from gpuclust.stats import CpiFilter
from gpuclust.tables import as_arrow

__all__ = ["DENOMINATORS", "DataQuality", "RATIO_EDGES", "TABLE_ORDER", "USAGE_CHECKS"]

#: The usage counters, in order (those ending in ``instances`` count distinct instances).
USAGE_CHECKS = (
    "rows",
    "instances",
    "start_zero",
    "start_after_trace",
    "end_zero",
    "end_after_trace",
    "machine_zero",
    "machine_dedicated",
    "end_before_start",
    "zero_length",
    "short_windows",
    "long_windows",
    "percentiles_null",
    "percentiles_partly_null",
    "percentiles_non_monotone",
    "p100_and_max",
    "p100_below_max",
    "p100_above_max",
    "cpi_mai_present",
    "cpi_mai_low_cpu_time",
    "cpi_out_of_range",
    "mai_out_of_range",
    "no_events_rows",
    "no_events_instances",
    "after_end_rows",
    "after_end_300s_rows",
    "after_end_instances",
    "past_end_rows",
    "matched_instances",
    "bound_instances",
    "matched_dedicated",
    "bound_dedicated",
)
#: Internal counters (not reported as checks): usage instances with events; event instances bound
#: in partition tasks; the same of the instances with an event on a dedicated machine.
_INTERNAL = ("matched_instances", "bound_instances", "matched_dedicated", "bound_dedicated")
_U = {c: k for k, c in enumerate(USAGE_CHECKS)}
#: Lower edges of the ``max_cpu / cpu_p100`` bins 1, 2, ...: 10^(k/20), k = -80..80 (20 per decade);
#: bin 0 holds ratios below 10^-4 (0 included), the last one ratios from 10^4 on.
RATIO_EDGES = 10.0 ** (np.arange(-80, 81) / 20.0)
_B = int(RATIO_EDGES.shape[0]) + 1
#: The tables in the order of the result tables.
TABLE_ORDER = ("instance_usage", "instance_events", "collection_events", "machine_events")
#: Checks that are the denominators of others, not findings (left out of the summary and the plot).
DENOMINATORS = ("rows", "instances", "collections", "machines", "p100_and_max", "cpi_mai_present")
_EVENT_SIDE = ("collection_id", "instance_index", "time", "type", "machine_id")
_AFTER_S = 300


@dataclass(frozen=True)
class DataQualityContext:
    short_us: int
    #: The prerequisite profiles' tables, by table name (Arrow tables or DataFrames).
    prior: dict[str, dict[str, Any]]
    has_usage: bool
    #: Each instance's final terminal time (code of :attr:`lookup` -> time; 2^63-1: none).
    lookup: InstanceLookup = InstanceLookup.empty()
    #: Whether :attr:`lookup` holds one partition's instances (bound in its task), not every instance.
    per_partition: bool = False
    end_us: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    #: Per code of :attr:`lookup`: the instance has an event on a dedicated machine (machine_id
    #: -1), where the trace has no usage windows.
    dedicated: np.ndarray = field(default_factory=lambda: np.zeros(0, bool))


@dataclass(frozen=True)
class DataQuality(Analysis):
    """Rows, NULLs, codes, sentinels and consistency checks of every table of a dataset.

    The trace's usage windows are nominally 300 s.  ``row_order`` counts the events whose time
    goes backwards in the dataset's row order (``time_backwards``): the source's order on a dataset
    as ingested, none on a ``gpuclust optimize``d one (each bucket is sorted by time), so it is off
    by default.

    Examples
    --------
    >>> DataQuality(short_window_s=60).label
    'data-quality[short_window_s=60]'
    """

    short_window_s: int = option(300, "usage windows shorter than this many seconds are counted as short", gt=0)
    row_order: bool = option(
        False, "also count events whose time goes backwards in the dataset's row order (layout-dependent)"
    )

    name = "data-quality"
    table = "instance_usage"
    requires: ClassVar[tuple[str, ...]] = ()
    optional_tables = TABLE_ORDER
    #: tracemalloc peak of partial: 126 B/row (synthetic cell, 0.46M windows; the 38 columns it reads
    #: are counted apart by the engine's budget)
    row_bytes = 160
    auto_partition_rows = 1 << 20
    whole_instances: ClassVar[bool] = True

    @property
    def columns(self) -> tuple[str, ...]:
        return fixed_width_columns("instance_usage")

    def prerequisites(self, source: Any) -> dict[str, Analysis]:
        ro = bool(self.row_order)
        return {
            "instance_events": InstanceEventsProfile(row_order=ro),
            "collection_events": CollectionEventsProfile(row_order=ro),
            "machine_events": MachineEventsProfile(row_order=ro),
        }

    def context(self, source: Any, prior: dict[str, dict[str, Any]] | None = None) -> DataQualityContext:
        if prior is None:
            raise RuntimeError("data-quality: the table profiles must run first (the engine runs prerequisites)")
        n = getattr(source, "num_rows", None)
        has_usage = True if n is None else int(n("instance_usage")) > 0
        return DataQualityContext(int(self.short_window_s) * 1_000_000, dict(prior), has_usage)

    @property
    def side_inputs(self) -> dict[str, tuple[str, ...]]:
        return {"instance_events": _EVENT_SIDE}

    def bind(self, ctx: DataQualityContext, side: dict[str, Any], grain: str | None) -> DataQualityContext:
        """Each instance's final terminal time, from its events: the time of its last event in time
        order (ties: the last row) when that event is terminal and its time is not 2^63-1."""
        if not ctx.has_usage:
            return ctx
        ev = side["instance_events"].read(list(_EVENT_SIDE))
        if ev.num_rows == 0:
            return ctx
        c, i, t, e, m = (to_numpy(ev.column(k), np.int64) for k in _EVENT_SIDE)
        order = np.lexsort((t, i, c))  # stable: ties keep row order
        c, i, t, e, m = c[order], i[order], t[order], e[order], m[order]
        last = np.ones(c.shape[0], dtype=bool)
        last[:-1] = (c[1:] != c[:-1]) | (i[1:] != i[:-1])
        first = np.flatnonzero(np.concatenate(([True], last[:-1])))
        dedicated = np.logical_or.reduceat(m == -1, first) if first.shape[0] else np.zeros(0, bool)
        c, i, t, e = c[last], i[last], t[last], e[last]
        terminal = np.isin(e, np.asarray(TERMINAL_EVENTS, np.int64)) & (t != TIME_AFTER_TRACE)
        end = np.where(terminal, t, TIME_AFTER_TRACE).astype(np.int64)
        lk = InstanceLookup.build(c, i, np.zeros_like(c), np.arange(c.shape[0]), what="data-quality instance lookup")
        # the lookup sorts its keys by hash: its codes are the positions in end
        return replace(ctx, lookup=lk, end_us=end, per_partition=grain is not None, dedicated=dedicated)

    # ---------------------------------------------------------------- partial / kinds
    def partial(self, cols: dict[str, Any], ctx: DataQualityContext, backend: Any) -> dict[str, Any]:
        xp = backend.xp
        out = self.kinds.empty(backend, on_backend=True)
        n = int(cols["start_time"].shape[0])
        # the counts are written where the rows are (a device's: no read per count), the ones the
        # host knows (rows, bound instances) with them
        cnt = xp.zeros(len(USAGE_CHECKS), dtype=xp.int64)
        if ctx.per_partition:  # every partition task counts its own events' instances, usage or not
            cnt[_U["bound_instances"]] = len(ctx.lookup)
            cnt[_U["bound_dedicated"]] = int(ctx.dedicated.sum())
        out["counts"] = cnt
        if n == 0:
            return out
        cnt[_U["rows"]] = n
        finite, dur = _window_checks(xp, cols, ctx.short_us, cnt)
        nulls = _percentile_checks(xp, cols, cnt)
        out["nulls"] = xp.stack(
            [nulls[c] if c in nulls else column_null_count(xp, cols[c]) for c in self.columns]
        ).astype(xp.int64)
        out["ratio"] = _p100_max_checks(xp, cols, cnt)
        _cpi_mai_checks(xp, cols, finite, dur, cnt)
        del finite, dur
        _instance_checks(backend, cols, ctx, cnt)
        return out

    @property
    def kinds(self) -> Fields:
        """Dense counters, summed: NULLs per column, the :data:`USAGE_CHECKS` and the ratio histogram."""
        return Fields(
            {
                "nulls": Sum((len(self.columns),), np.int64),
                "counts": Sum((len(USAGE_CHECKS),), np.int64),
                "ratio": Sum((_B,), np.int64),
            }
        )

    # ---------------------------------------------------------------- finalize
    def finalize(self, partial: dict[str, np.ndarray], ctx: DataQualityContext) -> dict[str, pa.Table]:
        p = {k: np.asarray(v) for k, v in partial.items()}
        u = dict(zip(USAGE_CHECKS, (int(v) for v in p["counts"]), strict=True))
        rows, inst = u["rows"], u["instances"]
        # per table: its rows of the checks, columns and codes tables
        tables: dict[str, dict[str, list[dict[str, Any]]]] = {
            t: {name: as_arrow(v).to_pylist() for name, v in profile.items()} for t, profile in ctx.prior.items()
        }
        if rows:
            nulls: dict[str, int | None] = {c: int(v) for c, v in zip(self.columns, p["nulls"], strict=True)}
            items = [("rows", rows, "rows", rows), ("instances", inst, "instances", inst)]
            items += [
                (
                    c,
                    u[c],
                    "instances" if c.endswith("instances") else "rows",
                    inst
                    if c.endswith("instances")
                    else (u["p100_and_max"] if c.startswith("p100_") and c != "p100_and_max" else rows),
                )
                for c in USAGE_CHECKS[2:]
                if c not in _INTERNAL
            ]
            tables["instance_usage"] = {
                "columns": null_rows("instance_usage", rows, nulls),
                "checks": check_rows("instance_usage", items),
            }
        ev_checks = tables.get("instance_events", {}).get("checks")
        if rows and ev_checks:
            # the instances the usage was joined with: bound in the partition tasks, or on the client;
            # those with an event on a dedicated machine apart (the trace has no usage there)
            n_ev = u["bound_instances"] + (0 if ctx.per_partition else len(ctx.lookup))
            n_ded = u["bound_dedicated"] + (0 if ctx.per_partition else int(ctx.dedicated.sum()))
            ev_checks += check_rows(
                "instance_events",
                [
                    (
                        "instances_without_usage",
                        n_ev - n_ded - (u["matched_instances"] - u["matched_dedicated"]),
                        "instances",
                        n_ev - n_ded,
                    ),
                    ("dedicated_instances_without_usage", n_ded - u["matched_dedicated"], "instances", n_ded),
                ],
            )

        def cat(name: str, schema: pa.Schema) -> pa.Table:
            return schema_table([r for t in TABLE_ORDER for r in tables.get(t, {}).get(name, [])], schema)

        edges = np.concatenate([[0.0], RATIO_EDGES])
        hist = schema_table(
            bin_rows(p["ratio"], edges, np.concatenate([RATIO_EDGES, [np.inf]]), "ratio", "windows"), _HIST_SCHEMA
        )
        q = bin_quantile_edges(p["ratio"], edges, (50, 90, 99))
        counts = {f"{t}_rows": _rows_of(tables.get(t)) for t in TABLE_ORDER}
        info = table_from_rows(
            [
                {
                    "analysis": self.name,
                    "short_window_s": int(self.short_window_s),
                    **counts,
                    "max_over_p100_p50": float(q[50]),
                    "max_over_p100_p90": float(q[90]),
                    "max_over_p100_p99": float(q[99]),
                }
            ]
        )
        return {
            "checks": cat("checks", CHECKS_SCHEMA),
            "columns": cat("columns", COLUMNS_SCHEMA),
            "codes": cat("codes", CODES_SCHEMA),
            "max_over_p100": hist,
            "info": info,
        }

    def summary(self, result: dict[str, Any]) -> str:
        info = as_arrow(result["info"]).to_pylist()[0]
        present = [f"{t} {int(info[f'{t}_rows']):,}" for t in TABLE_ORDER if int(info[f"{t}_rows"])]
        lines = [f"{self.label}: rows: {', '.join(present) or 'none'}"]
        for r in as_arrow(result["checks"]).to_pylist():
            if r["check"] in DENOMINATORS or not r["count"]:
                continue
            lines.append(
                f"  {r['table']:>17} {r['check']}: {r['count']:,} {r['unit']} ({fmt(r['share'], '.2%')} of {r['of']:,})"
            )
        by_table: dict[str, list[dict[str, Any]]] = {}
        for r in as_arrow(result["columns"]).to_pylist():
            by_table.setdefault(r["table"], []).append(r)
        for t, g in by_table.items():
            known = [r for r in g if r["nulls"] is not None]
            part = [r for r in known if 0 < r["nulls"] < r["rows"]]
            partly = ", ".join(f"{r['column']} {int(r['nulls']):,}" for r in part)
            lines.append(
                f"  {t:>17} NULLs: {sum(r['nulls'] == r['rows'] for r in known)} of {len(g)} columns all NULL"
                + (f"; partly: {partly}" if part else "")
            )
        p50 = info["max_over_p100_p50"]  # (NULL: no window with both)
        if p50 is not None:
            lines.append(f"  max_cpu / cpu_p100: median in [{fmt(p50, '.3g')}, x1.12)")
        return "\n".join(lines)


#: The ``max_over_p100`` table's columns.
_HIST_SCHEMA = pa.schema(
    [("bin", pa.int64()), ("lo_ratio", pa.float64()), ("hi_ratio", pa.float64()), ("windows", pa.int64())]
)


def _rows_of(t: dict[str, list[dict[str, Any]]] | None) -> int:
    return next((int(r["count"]) for r in (t or {}).get("checks", []) if r["check"] == "rows"), 0)


def _count(xp: Any, cnt: Any, name: str, mask: Any) -> None:
    """The count of usage check ``name``: the rows ``mask`` holds (written on ``cnt``'s device)."""
    cnt[_U[name]] = xp.count_nonzero(mask)


def _window_checks(xp: Any, cols: dict[str, Any], short_us: int, cnt: Any) -> tuple[Any, Any]:
    """Counts the rows' odd times and machines and their window lengths (both times below
    2^63-1); returns whether each row's times are finite and its length (0 where not)."""
    s, e, m = cols["start_time"], cols["end_time"], cols["machine_id"]
    for name, mask in (
        ("start_zero", s == 0),
        ("start_after_trace", s == TIME_AFTER_TRACE),
        ("end_zero", e == 0),
        ("end_after_trace", e == TIME_AFTER_TRACE),
        ("machine_zero", m == 0),
        ("machine_dedicated", m == -1),
    ):
        _count(xp, cnt, name, mask)
    finite = (s != TIME_AFTER_TRACE) & (e != TIME_AFTER_TRACE)
    dur = xp.where(finite, e - s, 0)
    _count(xp, cnt, "end_before_start", finite & (dur < 0))
    _count(xp, cnt, "zero_length", finite & (dur == 0))
    _count(xp, cnt, "short_windows", finite & (dur >= 0) & (dur < short_us))
    _count(xp, cnt, "long_windows", finite & (dur > short_us))
    return finite, dur


def _percentile_checks(xp: Any, cols: dict[str, Any], cnt: Any) -> dict[str, Any]:
    """Counts the CPU percentile vectors all NULL, partly NULL and not monotone (in level order);
    returns the NULLs of each percentile column (counted here, once; 0-d arrays of ``xp``)."""
    n = int(cols["start_time"].shape[0])
    nulls: dict[str, Any] = {}
    any_null, all_null = xp.zeros(n, dtype=bool), xp.ones(n, dtype=bool)
    bad = xp.zeros(n, dtype=bool)
    run = None
    for c in CPU_PERCENTILE_COLUMNS_SORTED:
        v = cols[c]
        null = xp.isnan(v)
        nulls[c] = xp.count_nonzero(null)
        any_null |= null
        all_null &= null
        if run is not None:
            bad |= v < run  # NaN compares False: NULL levels are skipped
            run = xp.fmax(run, v)
        else:
            run = v
    _count(xp, cnt, "percentiles_null", all_null)
    _count(xp, cnt, "percentiles_partly_null", any_null & ~all_null)
    _count(xp, cnt, "percentiles_non_monotone", bad)
    return nulls


def _p100_max_checks(xp: Any, cols: dict[str, Any], cnt: Any) -> Any:
    """Counts rows with both the CPU p100 and max_cpu, and the p100 below and above it; returns the
    histogram of max_cpu / p100 (:data:`RATIO_EDGES`, int64)."""
    p100, mx = cols["cpu_p100"], cols["max_cpu"]
    both = ~xp.isnan(p100) & ~xp.isnan(mx)
    _count(xp, cnt, "p100_and_max", both)
    _count(xp, cnt, "p100_below_max", both & (p100 < mx))
    _count(xp, cnt, "p100_above_max", both & (p100 > mx))
    r = xp.nonzero(both & (p100 > 0))[0]
    ratio = mx[r].astype(xp.float64) / p100[r].astype(xp.float64)
    return bincount(xp, log_bins(xp, xp.asarray(RATIO_EDGES), ratio), minlength=_B).astype(xp.int64)


def _cpi_mai_checks(xp: Any, cols: dict[str, Any], finite: Any, dur: Any, cnt: Any) -> None:
    """Counts CPI / MAI present and failing cpi's plausibility rule (CPU-seconds from the window's
    length)."""
    secs = xp.where(finite, dur, -1).astype(xp.float64) / 1e6
    _, fc = CpiFilter().mask(xp, cols["cpi"], cols["mai"], cols["avg_cpu"].astype(xp.float64) * secs)
    cnt[_U["cpi_mai_present"]] = fc["total"] - fc["missing"]
    cnt[_U["cpi_mai_low_cpu_time"]] = fc["cpu_seconds"]
    cnt[_U["cpi_out_of_range"]] = fc["cpi_range"]
    cnt[_U["mai_out_of_range"]] = fc["mai_range"]


def _instance_checks(backend: Any, cols: dict[str, Any], ctx: DataQualityContext, cnt: Any) -> None:
    """Counts per instance: rows without events, rows after or past the instance's final terminal
    event, and the distinct instances (with events, without, with rows after the end)."""
    xp = backend.xp
    s, e = cols["start_time"], cols["end_time"]
    n = int(s.shape[0])
    c, i = cols["collection_id"], cols["instance_index"]
    found, code = ctx.lookup.find(backend, c, i, xp.zeros(n, dtype=xp.int64))
    ends = backend.stage(ctx.end_us) if ctx.end_us.shape[0] else xp.zeros(1, dtype=xp.int64)
    end = xp.where(found, ends[xp.where(found, code, 0).astype(xp.int64)], TIME_AFTER_TRACE)
    ended = end != TIME_AFTER_TRACE
    after = ended & (s >= end)
    _count(xp, cnt, "no_events_rows", ~found)
    _count(xp, cnt, "after_end_rows", after)
    _count(xp, cnt, "after_end_300s_rows", after & (s - end >= _AFTER_S * 1_000_000))
    _count(xp, cnt, "past_end_rows", ended & (s < end) & (e > end))
    # distinct instances: those with events by their lookup codes (a flag per code), those
    # without by a sort of their rows alone (every row of an instance is in this partition)
    seen = xp.zeros(len(ctx.lookup) + 1, dtype=bool)
    seen[code[found]] = True
    matched = xp.count_nonzero(seen)
    if bool(ctx.dedicated.any()):
        cnt[_U["matched_dedicated"]] = xp.count_nonzero(seen[:-1] & backend.stage(ctx.dedicated))
    seen[:] = False
    seen[code[after]] = True  # (after: found)
    cnt[_U["after_end_instances"]] = xp.count_nonzero(seen)
    miss = xp.nonzero(~found)[0]
    lone = 0
    if int(miss.shape[0]):
        cm, im = c[miss].astype(xp.int64), i[miss].astype(xp.int64)
        order = instance_order(xp, cm, im, xp.zeros(cm.shape[0], dtype=xp.int64))
        cs, is_ = cm[order], im[order]
        lone = 1 + int(xp.count_nonzero((cs[1:] != cs[:-1]) | (is_[1:] != is_[:-1])))
    cnt[_U["instances"]] = matched + lone
    cnt[_U["no_events_instances"]] = lone
    cnt[_U["matched_instances"]] = matched
