"""``usage-change``: how much CPU and memory usage changes from one 300 s sampling period to the
next (seed 003, Figure 10: "for more than 90% of sampling moments, the consumption fluctuates in a
range smaller than 20%" -- the *cluster's* consumption), at one of three levels (``level``):

``cluster`` (default, the paper's)
    The cell's usage in each period ``k`` = ``[k 300 s, (k+1) 300 s)`` of trace time: the sum over
    the usage windows of top-level instances (``alloc_collection_id`` NULL or 0: an alloc set's
    usage already holds its tasks') of ``avg x overlap(window, period) / 300 s`` (a window
    spanning several periods counts in each in proportion to its overlap, as ``cell-usage``'s
    exact mode and ``machine-utilization``'s time-weighted mode do; NULL values are left out of
    the sum, a period whose every window is NULL is unknown).  A *pair* is two consecutive
    periods that both overlap some window; a period no window overlaps breaks the sequence
    (``info.gaps``).  The partials are dense per-period sums over the trace's periods (a few
    thousand a month), merged by adding: memory does not grow with the windows.
``machine``
    The same per machine (``machine-utilization``'s time-weighted (machine, period) sums: their
    keyed partials, spilled and reduced by shards of machines, the pairs formed and counted per
    shard); windows on machines absent from machine_events are left out.
``instance``
    The per-instance change between consecutive usage windows (below).

For ``level=instance``, a *pair* is two windows of one instance (``collection_id``, ``instance_index``) that follow each
other in time order (ties keep the dataset's row order) with no gap longer than ``max_gap_s``
between the first's end and the second's start.  For each resource (``avg_cpu``, ``avg_mem``) the
pair's relative change is ``r = (b - a) / a`` of the average usages ``a`` (earlier) and ``b``:

* ``a`` or ``b`` NULL: the pair is counted as ``unknown``;
* ``a = 0``: no relative change exists; counted as ``zero_to_zero`` or ``zero_to_positive``;
* otherwise ``r`` is defined (``r >= -1``): the shares with ``|r| <= 5%, 10%, 20%, 50%`` are
  exact counts, and the ratio ``b / a`` is counted in fixed log bins (100 per decade from 10^-6 to
  10^6, :data:`RATIO_EDGES`) for the distribution: its quantiles are resolved to a bin (the exact
  quantile of ``r`` lies in ``[q, the bin's upper edge - 1)``, under 2.4% of the ratio above).

By tier (the tier of the earlier window's instance, from its events' highest priority, as
``usage-distribution`` looks it up) and over all tiers (``tier = "all"``); the cluster and machine
levels have only ``tier = "all"``.  The counts, shares and ratio bins of a pair are the same at
every level.

At the instance level, pairs need every window of an instance in one partition (:attr:`whole_instances`): on an
instance-bucketed dataset (``gpuclust optimize``) the partitions are whole buckets; a flat
dataset runs as one partition when it fits the memory budget.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, ClassVar

import numpy as np
import pyarrow as pa

from gpuclust._xp import bincount
from gpuclust.analyses._extent import max_finite
from gpuclust.analyses._lookup import EVENT_COLUMNS, TierLookupContext, tier_lookup
from gpuclust.analyses._machine_sums import NULL_BITS
from gpuclust.analyses.base import Analysis, fmt, null_int
from gpuclust.analyses.grouping import bucket_pieces, instance_order
from gpuclust.analyses.kinds import Fields, Sum
from gpuclust.analyses.machine_utilization import BUCKET_US, MachineUtilization, MachineUtilizationContext
from gpuclust.analyses.options import option, tier_map_option
from gpuclust.arrow_numpy import bin_table, rows_table, table_from_rows
from gpuclust.keys import unpack, unpack_bits
from gpuclust.parted import finalize_in_memory
from gpuclust.partials import bin_quantile_edges, log_bins
from gpuclust.schema import TIME_AFTER_TRACE
from gpuclust.tables import as_arrow
from gpuclust.tiers import TIER_SLOTS, check_tier_slots, resolve_tier_map

__all__ = ["LEVELS", "PERIOD_US", "RATIO_EDGES", "RESOURCES", "THRESHOLDS", "UsageChange"]

#: The levels whose usage is compared between consecutive samples.
LEVELS = ("cluster", "machine", "instance")
#: The sampling period of the cluster and machine levels: 300 s, µs (periods from trace time 0).
PERIOD_US = BUCKET_US
#: Most periods the cluster level's dense sums span (guards against corrupt times: 2^24 periods
#: are 159 years).
MAX_PERIODS = 1 << 24

#: The resources compared, as (name, usage column).
RESOURCES = (("cpu", "avg_cpu"), ("mem", "avg_mem"))
#: |relative change| thresholds whose shares are counted exactly.
THRESHOLDS = (0.05, 0.10, 0.20, 0.50)
#: Lower edges of the ratio bins 1, 2, ... (``b / a``): 10^(k/100) for k = -600..600; bin 0 holds
#: ratios below 10^-6 (0 included: usage dropped to zero), the last bin ratios from 10^6 on.
RATIO_EDGES = 10.0 ** (np.arange(-600, 601) / 100.0)
_B = int(RATIO_EDGES.shape[0]) + 1
_T = TIER_SLOTS  # tier slots: the most tiers a tier map may have, plus "unknown"
_R = len(RESOURCES)
_H = len(THRESHOLDS)
#: Per (tier, resource) counters, in order.
_COUNTS = ("pairs", "unknown", "zero_to_zero", "zero_to_positive", "defined")
_STATS = ("rows", "instances", "pairs", "gaps", "unplaced_ends")
#: Counters of the cluster level's usage rows, in this order (as machine-utilization's).
_CSTATS = ("rows", "alloc_rows", "unbounded_rows", "unplaced_rows", "used_rows")
#: Machine level: machine-utilization's time-weighted (machine, period) sums.
_MACHINE_SUMS = MachineUtilization(mode="time-weighted")


@dataclass(frozen=True)
class ClusterContext:
    """The cluster level's context: periods ``[0, span)`` hold every window's end."""

    span: int


@dataclass(frozen=True)
class UsageChange(Analysis):
    """Relative change of CPU and memory usage between consecutive 300 s periods of the cluster or
    of a machine, or between consecutive windows of one instance.

    Examples
    --------
    >>> UsageChange(level="instance", max_gap_s=60).label
    'usage-change[level=instance,max_gap_s=60]'
    """

    level: str = option(
        "cluster",
        "cluster: the cell's usage per 300 s period (the paper's); machine: per machine "
        "and period; instance: consecutive windows of one instance",
        choices=LEVELS,
    )
    max_gap_s: int = option(
        0,
        "level=instance: longest gap (s) between a window's end and the next one's start for a pair "
        "(0: contiguous or overlapping windows only)",
        ge=0,
    )
    tier_map: str | None = tier_map_option(
        "level=instance: priority tier map; default: the dataset manifest's, else the trace version's default"
    )

    name = "usage-change"
    table = "instance_usage"
    #: instance_events (the tiers) for level=instance, machine_events (the machines) for
    #: level=machine (:meth:`needed_tables`)
    requires = ("instance_usage",)
    optional_tables = ("instance_events", "machine_events")
    table_uses: ClassVar[dict[str, str]] = {"instance_events": "level=instance", "machine_events": "level=machine"}
    #: tracemalloc peak of partial: 152 B/row (bench 1.6e7 set, 4M-row partition)
    row_bytes = 200
    #: rows per partition for partitions="auto" (one 1 Mi-row bucket: gpuclust.engine.memory.preferred_rows)
    auto_partition_rows = 1 << 20

    @property
    def whole_instances(self) -> bool:  # type: ignore[override]
        """Pairs of an instance's windows need all of them in one partition (level=instance only)."""
        return self.level == "instance"

    def needed_tables(self) -> tuple[dict[str, str], dict[str, str]]:
        required = {"instance_usage": ""}
        if self.level == "instance":
            required["instance_events"] = "level=instance: the instances' tiers"
        elif self.level == "machine":
            required["machine_events"] = "level=machine: the machines"
        return required, {}

    @property
    def columns(self) -> tuple[str, ...]:
        if self.level == "instance":
            return ("start_time", "end_time", "collection_id", "instance_index", "machine_id", "avg_cpu", "avg_mem")
        if self.level == "machine":
            return _MACHINE_SUMS.columns
        return ("start_time", "end_time", "alloc_collection_id", "avg_cpu", "avg_mem")

    def context(self, source: Any) -> Any:
        if self.level == "machine":
            return _MACHINE_SUMS.context(source)
        if self.level == "cluster":
            last = max(
                max_finite(source, "instance_usage", "start_time") or 0,
                max_finite(source, "instance_usage", "end_time") or 0,
            )
            span = int(last // PERIOD_US + 1)
            if span > MAX_PERIODS:
                raise ValueError(
                    f"usage-change: the usage windows span {span} periods of 300 s (> {MAX_PERIODS}); "
                    "the start/end times look corrupt"
                )
            return ClusterContext(span)
        tm = check_tier_slots("usage-change", resolve_tier_map(self.tier_map, source))
        return TierLookupContext(tm)

    @property
    def side_inputs(self) -> dict[str, tuple[str, ...]]:
        return {"instance_events": EVENT_COLUMNS} if self.level == "instance" else {}

    def bind(self, ctx: Any, side: dict[str, Any], grain: str | None) -> Any:
        if self.level != "instance":
            return ctx
        lk = tier_lookup(
            side["instance_events"],
            ctx.tier_map,
            top_level_only=False,
            unmatched=len(ctx.tier_map.names),
            what="usage-change tier lookup",
        )
        return replace(ctx, lookup=lk)

    # ---------------------------------------------------------------- partial / merge
    def partial(self, cols: dict[str, Any], ctx: Any, backend: Any) -> dict[str, Any]:
        if self.level == "machine":
            return _MACHINE_SUMS.partial(cols, ctx, backend)
        if self.level == "cluster":
            return self._cluster_partial(cols, ctx, backend)
        xp = backend.xp
        out = self.kinds.empty(backend, on_backend=True)
        s, e = cols["start_time"], cols["end_time"]
        n = int(s.shape[0])
        stats = dict.fromkeys(_STATS, 0)
        stats["rows"] = n
        if n == 0:
            out["stats"] = xp.asarray(np.array([stats[k] for k in _STATS], np.int64))
            return out
        c, i, m = cols["collection_id"], cols["instance_index"], cols["machine_id"]
        found, code = ctx.lookup.find(backend, c, i, m)
        tier = xp.where(found, code, len(ctx.tier_map.names)).astype(xp.int64)
        order = instance_order(xp, c, i, s)  # by instance, then start; ties keep row order
        s, e, c, i, tier = s[order], e[order], c[order], i[order], tier[order]
        same = (c[1:] == c[:-1]) & (i[1:] == i[:-1])
        stats["instances"] = n - int(xp.count_nonzero(same))
        # a window ending "after the trace" (2^63-1) cannot be followed in time
        unplaced = e[:-1] == TIME_AFTER_TRACE
        close = (s[1:] - e[:-1]) <= int(self.max_gap_s) * 1_000_000
        pair = same & close & ~unplaced
        stats["unplaced_ends"] = int(xp.count_nonzero(same & unplaced))
        stats["gaps"] = int(xp.count_nonzero(same & ~unplaced & ~close))
        k = xp.nonzero(pair)[0]
        stats["pairs"] = int(k.shape[0])
        tp = tier[k]
        edges = xp.asarray(RATIO_EDGES)
        levels = xp.asarray(np.asarray(THRESHOLDS, dtype=np.float64))
        first_row, next_row = order[k], order[k + 1]  # the pairs' rows: no gather of whole columns
        counts, within, hist, rsum = [], [], [], []
        for _, col in RESOURCES:
            a = cols[col][first_row].astype(xp.float64)
            b = cols[col][next_row].astype(xp.float64)
            known = xp.isfinite(a) & xp.isfinite(b)
            zero = known & (a == 0)
            defined = known & (a != 0)
            # the four exclusive kinds of a pair (unknown, 0 -> 0, 0 -> x, defined) in one count;
            # the first column, every pair, is their sum
            kind = xp.where(known, xp.where(zero, xp.where(b == 0, 2, 3), 4), 1)
            cnt = bincount(xp, tp * len(_COUNTS) + kind, minlength=_T * len(_COUNTS)).reshape(_T, len(_COUNTS))
            cnt[:, 0] = cnt[:, 1:].sum(axis=1)
            counts.append(cnt)
            d = xp.nonzero(defined)[0]
            td = tp[d]
            ratio = b[d] / a[d]
            r = ratio - 1.0
            # |r| <= h for the thresholds from the first one at or above |r| on: count that first
            # level per tier once, and sum the levels up to each threshold
            lv = xp.searchsorted(levels, xp.abs(r), side="left")
            per = bincount(xp, td * (_H + 1) + lv, minlength=_T * (_H + 1)).reshape(_T, _H + 1)
            within.append(xp.cumsum(per[:, :_H], axis=1))
            bins = log_bins(xp, edges, ratio)
            hist.append(bincount(xp, td * _B + bins, minlength=_T * _B).reshape(_T, _B))
            rsum.append(bincount(xp, td, weights=r, minlength=_T))
        out["counts"] = xp.stack(counts, 1).astype(xp.int64)
        out["within"] = xp.stack(within, 1).astype(xp.int64)
        out["hist"] = xp.stack(hist, 1).astype(xp.int64)
        out["rsum"] = xp.stack(rsum, 1)
        out["stats"] = xp.asarray(np.array([stats[k_] for k_ in _STATS], np.int64))
        return out

    def _cluster_partial(self, cols: dict[str, Any], ctx: ClusterContext, backend: Any) -> dict[str, Any]:
        """Dense per-period sums ``[cpu, mem, windows, cpu_nulls, mem_nulls]`` (shape 5 x span;
        ``*_nulls``: the values that are not finite) of the top-level windows' time-weighted usage."""
        xp = backend.xp
        s, e, alloc = cols["start_time"], cols["end_time"], cols["alloc_collection_id"]
        n = int(s.shape[0])
        top = (alloc == 0) | (alloc == xp.asarray(null_int(alloc.dtype), dtype=alloc.dtype))
        bounded = top & (e > s) & (e != TIME_AFTER_TRACE)
        keep = bounded & (s >= 0) & (s < TIME_AFTER_TRACE)
        n_top, n_bounded, n_used = (int(xp.count_nonzero(v)) for v in (top, bounded, keep))
        stats = np.array([n, n - n_top, n_top - n_bounded, n_bounded - n_used, n_used], np.int64)
        span = ctx.span
        if not n_used:
            return {"sums": xp.zeros((5, span)), "stats": xp.asarray(stats)}
        idx = xp.nonzero(keep)[0]
        row, bucket, overlap = bucket_pieces(xp, s[idx], e[idx], PERIOD_US)
        if int(bucket.max()) >= span:
            raise ValueError("usage-change: a window ends after the last period of the dataset's statistics")
        rows = idx[row]
        w = overlap.astype(xp.float64) / PERIOD_US
        total, nulls = [], []
        for col in ("avg_cpu", "avg_mem"):
            v = cols[col][rows].astype(xp.float64)
            # SUM ignores NULL (NaN); an infinite value is summed but not counted as known
            total.append(bincount(xp, bucket, weights=xp.where(xp.isnan(v), 0.0, v) * w, minlength=span))
            nulls.append(bincount(xp, bucket[~xp.isfinite(v)], minlength=span).astype(xp.float64))
        windows = bincount(xp, bucket, minlength=span).astype(xp.float64)
        return {"sums": xp.stack([*total, windows, *nulls]), "stats": xp.asarray(stats)}

    @property
    def kinds(self) -> Fields:
        """Machine level: machine-utilization's (its keyed sums sharded by machine); cluster: the
        per-period sums ``[cpu, mem, windows, cpu_nulls, mem_nulls]`` x period (ragged: the empty
        partial's have no period) and the counters; instance: the dense counts per (tier, resource),
        summed."""
        if self.level == "machine":
            return _MACHINE_SUMS.kinds
        if self.level == "cluster":
            return Fields({"sums": Sum((5, 0), ragged=True), "stats": Sum((len(_CSTATS),), np.int64)})
        return Fields(
            {
                "counts": Sum((_T, _R, len(_COUNTS)), np.int64),
                "within": Sum((_T, _R, _H), np.int64),
                "hist": Sum((_T, _R, _B), np.int64),
                "rsum": Sum((_T, _R)),
                "stats": Sum((len(_STATS),), np.int64),
            }
        )

    # ---------------------------------------------------------------- machine level: shards (machine-utilization's)
    def finalize_shard(
        self,
        keyed: dict[str, dict[str, np.ndarray]],
        rest: dict[str, Any],
        ctx: MachineUtilizationContext,
        lo: int,
        hi: int,
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        """Machines ``[lo, hi)``: the pairs of consecutive periods of each machine, counted (no
        parted tables; the extra is the counts)."""
        u = keyed["u"]
        key = np.asarray(u["key"], np.int64)
        windows = np.asarray(u["windows"], np.int64)
        nulls = np.asarray(u["nulls"], np.int64)
        machine = unpack(key, max(ctx.span, 1))[0]
        mem_nulls, cpu_nulls = unpack_bits(nulls, NULL_BITS)
        values = [
            np.where(windows - cpu_nulls > 0, np.asarray(u["cpu"], np.float64), np.nan),
            np.where(windows - mem_nulls > 0, np.asarray(u["mem"], np.float64), np.nan),
        ]
        pair = (key[1:] == key[:-1] + 1) & (machine[1:] == machine[:-1])
        k = np.flatnonzero(pair)
        machines = int(np.count_nonzero(machine[1:] != machine[:-1])) + 1 if key.shape[0] else 0
        extra = _count_pairs([(v[k], v[k + 1]) for v in values])
        extra["stats"] = np.array([key.shape[0], machines, k.shape[0], key.shape[0] - machines - k.shape[0]], np.int64)
        return {}, extra

    def finalize_parted(
        self, rest: dict[str, Any], ctx: MachineUtilizationContext, tables: dict[str, Any], extras: list[dict[str, Any]]
    ) -> dict[str, pa.Table]:
        tot = _count_pairs([(np.zeros(0), np.zeros(0))] * _R)
        tot["stats"] = np.zeros(4, np.int64)
        for e in extras:  # in shard order
            tot = {k: tot[k] + e[k] for k in tot}
        periods, machines, pairs, gaps = (int(v) for v in tot["stats"])
        stats = {
            **dict(zip(_MSTATS, (int(v) for v in rest["stats"]), strict=True)),
            "machines": machines,
            "periods": periods,
            "pairs": pairs,
            "gaps": gaps,
        }
        return self._tables([("all", tot)], stats)

    # ---------------------------------------------------------------- finalize
    def finalize(self, partial: dict[str, Any], ctx: Any) -> dict[str, pa.Table]:
        """Arrow tables, built without pandas (see :mod:`gpuclust.tables`)."""
        if self.level == "machine":
            return finalize_in_memory(self, partial, ctx)
        if self.level == "cluster":
            return self._finalize_cluster(partial)
        names = ctx.tier_names
        T = len(names)
        p = {k: np.asarray(v) for k, v in partial.items()}
        lo = np.maximum(np.concatenate([[0.0], RATIO_EDGES]) - 1.0, -1.0)  # relative change at each bin's lower edge
        hi = np.concatenate([RATIO_EDGES, [np.inf]]) - 1.0
        rows: list[dict[str, Any]] = []
        hists: dict[str, list[Any]] = {"hist": [], "tier": [], "resource": []}
        groups = [(names[t], p["counts"][t], p["within"][t], p["hist"][t], p["rsum"][t]) for t in range(T)]
        groups.append(
            ("all", p["counts"][:T].sum(0), p["within"][:T].sum(0), p["hist"][:T].sum(0), p["rsum"][:T].sum(0))
        )
        for tier, cnt, win, hist, rs in groups:
            for j, (res, _) in enumerate(RESOURCES):
                if not cnt[j, 0]:
                    continue
                row: dict[str, Any] = {
                    "tier": tier,
                    "resource": res,
                    **{f: int(cnt[j, q]) for q, f in enumerate(_COUNTS)},
                }
                n = int(cnt[j, 4])
                for q, h in enumerate(THRESHOLDS):
                    row[f"within_{round(h * 100)}pct"] = int(win[j, q]) / n if n else np.nan
                row["mean_change"] = float(rs[j]) / n if n else np.nan
                row.update(
                    {f"p{q}_change": float(v) for q, v in bin_quantile_edges(hist[j], lo, (1, 10, 50, 90, 99)).items()}
                )
                rows.append(row)
                for hk, hv in (("hist", hist[j]), ("tier", tier), ("resource", res)):
                    hists[hk].append(hv)
        stats = dict(zip(_STATS, (int(v) for v in p["stats"]), strict=True))
        info = table_from_rows(
            [
                {
                    "analysis": self.name,
                    "level": self.level,
                    "tier_map": ctx.tier_map.name,
                    "tiers": ",".join(names),
                    "max_gap_s": int(self.max_gap_s),
                    **stats,
                }
            ]
        )
        return {
            "summary": rows_table(rows, _SUMMARY_SCHEMA),
            "info": info,
            "hist": bin_table(
                hists["hist"], lo, hi, "change", "pairs", _HIST_SCHEMA, tier=hists["tier"], resource=hists["resource"]
            ),
        }

    def _finalize_cluster(self, partial: dict[str, Any]) -> dict[str, pa.Table]:
        sums = np.asarray(partial["sums"], np.float64)
        windows = sums[2]
        present = np.flatnonzero(windows > 0)
        values = [np.where(windows - sums[3] > 0, sums[0], np.nan), np.where(windows - sums[4] > 0, sums[1], np.nan)]
        k = present[:-1][present[1:] == present[:-1] + 1]
        tot = _count_pairs([(v[k], v[k + 1]) for v in values])
        n = int(present.shape[0])
        stats = {
            **dict(zip(_CSTATS, (int(v) for v in np.asarray(partial["stats"])), strict=True)),
            "periods": n,
            "pairs": int(k.shape[0]),
            "gaps": max(n - 1 - int(k.shape[0]), 0),
        }
        return self._tables([("all", tot)], stats)

    def _tables(self, groups: list[tuple[str, dict[str, np.ndarray]]], stats: dict[str, int]) -> dict[str, pa.Table]:
        """The summary, hist and info tables of the cluster and machine levels (``groups``: (tier,
        the counts of :func:`_count_pairs`))."""
        lo = np.maximum(np.concatenate([[0.0], RATIO_EDGES]) - 1.0, -1.0)
        hi = np.concatenate([RATIO_EDGES, [np.inf]]) - 1.0
        rows: list[dict[str, Any]] = []
        hists: dict[str, list[Any]] = {"hist": [], "tier": [], "resource": []}
        for tier, c in groups:
            for j, (res, _) in enumerate(RESOURCES):
                cnt = c["counts"][j]
                if not cnt[0]:
                    continue
                row: dict[str, Any] = {"tier": tier, "resource": res, **{f: int(cnt[q]) for q, f in enumerate(_COUNTS)}}
                n = int(cnt[4])
                for q, h in enumerate(THRESHOLDS):
                    row[f"within_{round(h * 100)}pct"] = int(c["within"][j, q]) / n if n else np.nan
                row["mean_change"] = float(c["rsum"][j]) / n if n else np.nan
                row.update(
                    {
                        f"p{q}_change": float(v)
                        for q, v in bin_quantile_edges(c["hist"][j], lo, (1, 10, 50, 90, 99)).items()
                    }
                )
                rows.append(row)
                for hk, hv in (("hist", c["hist"][j]), ("tier", tier), ("resource", res)):
                    hists[hk].append(hv)
        info = table_from_rows(
            [{"analysis": self.name, "level": self.level, "period_s": PERIOD_US // 1_000_000, **stats}]
        )
        return {
            "summary": rows_table(rows, _SUMMARY_SCHEMA),
            "info": info,
            "hist": bin_table(
                hists["hist"], lo, hi, "change", "pairs", _HIST_SCHEMA, tier=hists["tier"], resource=hists["resource"]
            ),
        }

    def summary(self, result: dict[str, Any]) -> str:
        info = as_arrow(result["info"]).to_pylist()[0]
        if self.level == "instance":
            head = (
                f"{self.label}: {info['pairs']:,} pairs of consecutive windows of {info['instances']:,} instances "
                f"({info['rows']:,} windows; {info['gaps']:,} gaps over {int(info['max_gap_s'])} s), "
                f"tier map {info['tier_map']!r}"
            )
        else:
            of = f"{info['machines']:,} machines' " if self.level == "machine" else "the cluster's "
            head = (
                f"{self.label}: {info['pairs']:,} pairs of consecutive 300 s periods of {of}usage "
                f"({info['periods']:,} periods with usage, {info['gaps']:,} gaps; {info['used_rows']:,} of "
                f"{info['rows']:,} windows)"
            )
        lines = [head]
        for r in as_arrow(result["summary"]).to_pylist():
            lines.append(
                f"  {r['tier']:>8} {r['resource']}: {r['defined']:,} defined changes, within ±20%: "
                f"{fmt(r['within_20pct'], '.1%')}, within ±5%: {fmt(r['within_5pct'], '.1%')}, "
                f"median {fmt(r['p50_change'], '+.3f')}"
            )
        return "\n".join(lines)


#: Counters of the machine level's usage rows (machine-utilization's).
_MSTATS = ("rows", "alloc_rows", "short_rows", "unbounded_rows", "unplaced_rows", "unknown_machine_rows", "used_rows")


def _count_pairs(ab: list[tuple[np.ndarray, np.ndarray]]) -> dict[str, np.ndarray]:
    """Per resource (``ab[j]``: the earlier and later values of its pairs, NaN unknown): the
    counts of :data:`_COUNTS`, the counts within each threshold, the ratio bins and the sum of the
    relative changes (host arrays, summed to merge), as the instance level counts them."""
    counts = np.zeros((_R, len(_COUNTS)), np.int64)
    within = np.zeros((_R, _H), np.int64)
    hist = np.zeros((_R, _B), np.int64)
    rsum = np.zeros(_R)
    for j, (a, b) in enumerate(ab):
        a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
        known = np.isfinite(a) & np.isfinite(b)
        zero = known & (a == 0)
        defined = known & (a != 0)
        counts[j] = [
            a.shape[0],
            int(np.count_nonzero(~known)),
            int(np.count_nonzero(zero & (b == 0))),
            int(np.count_nonzero(zero & (b != 0))),
            int(np.count_nonzero(defined)),
        ]
        ratio = b[defined] / a[defined]
        r = ratio - 1.0
        within[j] = [int(np.count_nonzero(np.abs(r) <= h)) for h in THRESHOLDS]
        hist[j] = np.bincount(log_bins(np, RATIO_EDGES, ratio), minlength=_B)
        rsum[j] = float(r.sum())
    return {"counts": counts, "within": within, "hist": hist, "rsum": rsum}


#: The result tables' columns and types (an empty table keeps them).
_SUMMARY_SCHEMA = pa.schema(
    [
        ("tier", pa.string()),
        ("resource", pa.string()),
        *((c, pa.int64()) for c in _COUNTS),
        *((f"within_{round(h * 100)}pct", pa.float64()) for h in THRESHOLDS),
        ("mean_change", pa.float64()),
        *((f"p{q}_change", pa.float64()) for q in (1, 10, 50, 90, 99)),
    ]
)
_HIST_SCHEMA = pa.schema(
    [
        ("tier", pa.string()),
        ("resource", pa.string()),
        ("bin", pa.int64()),
        ("lo_change", pa.float64()),
        ("hi_change", pa.float64()),
        ("pairs", pa.int64()),
    ]
)
