"""``usage-change``: how much an instance's CPU and memory usage changes from one usage window to
the next (seed 003's first measure: "for more than 90% of sampling moments, the consumption
fluctuates in a range smaller than 20%").

A *pair* is two windows of one instance (``collection_id``, ``instance_index``) that follow each
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
``usage-distribution`` looks it up) and over all tiers (``tier = "all"``).

Pairs need every window of an instance in one partition (:attr:`whole_instances`): on an
instance-bucketed dataset (``gpuclust optimize``) the partitions are whole buckets; a flat
dataset runs as one partition when it fits the memory budget.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, ClassVar

import numpy as np
import pyarrow as pa

from gpuclust._xp import bincount
from gpuclust.analyses._lookup import EVENT_COLUMNS, TierLookupContext, tier_lookup
from gpuclust.analyses.base import Analysis, fmt, resolve_tier_map
from gpuclust.analyses.grouping import instance_order
from gpuclust.analyses.options import option, tier_map_option
from gpuclust.arrow_numpy import bin_table, rows_table, table_from_rows
from gpuclust.partials import bin_quantile_edges, log_bins
from gpuclust.schema import TIME_AFTER_TRACE, tier_map
from gpuclust.tables import as_arrow

__all__ = ["RATIO_EDGES", "RESOURCES", "THRESHOLDS", "UsageChange"]

#: The resources compared, as (name, usage column).
RESOURCES = (("cpu", "avg_cpu"), ("mem", "avg_mem"))
#: |relative change| thresholds whose shares are counted exactly.
THRESHOLDS = (0.05, 0.10, 0.20, 0.50)
#: Lower edges of the ratio bins 1, 2, ... (``b / a``): 10^(k/100) for k = -600..600; bin 0 holds
#: ratios below 10^-6 (0 included: usage dropped to zero), the last bin ratios from 10^6 on.
RATIO_EDGES = 10.0 ** (np.arange(-600, 601) / 100.0)
_B = int(RATIO_EDGES.shape[0]) + 1
_T = 17  # tier slots: the most tiers a tier map may have, plus "unknown"
_R = len(RESOURCES)
_H = len(THRESHOLDS)
#: Per (tier, resource) counters, in order.
_COUNTS = ("pairs", "unknown", "zero_to_zero", "zero_to_positive", "defined")
_STATS = ("rows", "instances", "pairs", "gaps", "unplaced_ends")


@dataclass(frozen=True)
class UsageChange(Analysis):
    """Relative change of CPU and memory usage between consecutive windows of one instance.

    Parameters
    ----------
    max_gap_s
        Longest gap, seconds, between a window's end and the next window's start for the two to
        form a pair (0: contiguous or overlapping windows only).
    tier_map
        Name of a tier map in :data:`gpuclust.schema.TIER_MAPS`; ``None``: the dataset manifest's,
        else the trace version's default.

    Examples
    --------
    >>> UsageChange(max_gap_s=60).label
    'usage-change[max_gap_s=60]'
    """

    max_gap_s: int = option(0, "longest gap (s) between a window's end and the next one's start for a pair")
    tier_map: str | None = tier_map_option()

    name = "usage-change"
    table = "instance_usage"
    requires = ("instance_usage", "instance_events")
    #: tracemalloc peak of partial: 152 B/row (bench 1.6e7 set, 4M-row partition)
    row_bytes = 200
    #: rows per partition for partitions="auto" (one 1 Mi-row bucket: gpuclust.engine.memory.preferred_rows)
    auto_partition_rows = 1 << 20
    whole_instances: ClassVar[bool] = True

    def __post_init__(self) -> None:
        if int(self.max_gap_s) < 0:
            raise ValueError(f"usage-change: max_gap_s must be >= 0, got {self.max_gap_s}")
        if self.tier_map is not None:
            tier_map(self.tier_map)

    @property
    def columns(self) -> tuple[str, ...]:
        return ("start_time", "end_time", "collection_id", "instance_index", "machine_id", "avg_cpu", "avg_mem")

    def context(self, source: Any) -> TierLookupContext:
        tm = resolve_tier_map(self.tier_map, source)
        if len(tm.names) + 1 > _T:
            raise ValueError(f"usage-change: tier map {tm.name!r} has more than {_T - 1} tiers")
        return TierLookupContext(tm)

    @property
    def side_inputs(self) -> dict[str, tuple[str, ...]]:
        return {"instance_events": EVENT_COLUMNS}

    def bind(self, ctx: TierLookupContext, side: dict[str, Any], grain: str | None) -> TierLookupContext:
        lk = tier_lookup(side["instance_events"], ctx.tier_map, top_level_only=False,
                         unmatched=len(ctx.tier_map.names), what="usage-change tier lookup")
        return replace(ctx, lookup=lk)

    # ---------------------------------------------------------------- partial / merge
    def empty(self, backend: Any = None) -> dict[str, np.ndarray]:
        return {"counts": np.zeros((_T, _R, len(_COUNTS)), np.int64), "within": np.zeros((_T, _R, _H), np.int64),
                "hist": np.zeros((_T, _R, _B), np.int64), "rsum": np.zeros((_T, _R)),
                "stats": np.zeros(len(_STATS), np.int64)}

    def partial(self, cols: dict[str, Any], ctx: TierLookupContext, backend: Any) -> dict[str, Any]:
        xp = backend.xp
        out = {k: xp.asarray(v) for k, v in self.empty().items()}
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

    def merge(self, a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return {k: a[k] + b[k] for k in a}

    # ---------------------------------------------------------------- finalize
    def finalize(self, partial: dict[str, np.ndarray], ctx: TierLookupContext) -> dict[str, pa.Table]:
        """Arrow tables, built without pandas (see :mod:`gpuclust.tables`)."""
        names = ctx.tier_names
        T = len(names)
        p = {k: np.asarray(v) for k, v in partial.items()}
        lo = np.maximum(np.concatenate([[0.0], RATIO_EDGES]) - 1.0, -1.0)  # relative change at each bin's lower edge
        hi = np.concatenate([RATIO_EDGES, [np.inf]]) - 1.0
        rows: list[dict[str, Any]] = []
        hists: dict[str, list[Any]] = {"hist": [], "tier": [], "resource": []}
        groups = [(names[t], p["counts"][t], p["within"][t], p["hist"][t], p["rsum"][t]) for t in range(T)]
        groups.append(("all", p["counts"][:T].sum(0), p["within"][:T].sum(0), p["hist"][:T].sum(0), p["rsum"][:T].sum(0)))
        for tier, cnt, win, hist, rs in groups:
            for j, (res, _) in enumerate(RESOURCES):
                if not cnt[j, 0]:
                    continue
                row: dict[str, Any] = {"tier": tier, "resource": res, **{f: int(cnt[j, q]) for q, f in enumerate(_COUNTS)}}
                n = int(cnt[j, 4])
                for q, h in enumerate(THRESHOLDS):
                    row[f"within_{round(h * 100)}pct"] = int(win[j, q]) / n if n else np.nan
                row["mean_change"] = float(rs[j]) / n if n else np.nan
                row.update({f"p{q}_change": float(v) for q, v in bin_quantile_edges(hist[j], lo, (1, 10, 50, 90, 99)).items()})
                rows.append(row)
                for hk, hv in (("hist", hist[j]), ("tier", tier), ("resource", res)):
                    hists[hk].append(hv)
        stats = dict(zip(_STATS, (int(v) for v in p["stats"]), strict=True))
        info = table_from_rows([{"analysis": self.name, "tier_map": ctx.tier_map.name, "tiers": ",".join(names),
                                 "max_gap_s": int(self.max_gap_s), **stats}])
        return {"summary": rows_table(rows, _SUMMARY_SCHEMA), "info": info,
                "hist": bin_table(hists["hist"], lo, hi, "change", "pairs", _HIST_SCHEMA, tier=hists["tier"],
                                  resource=hists["resource"])}

    def summary(self, result: dict[str, Any]) -> str:
        info = as_arrow(result["info"]).to_pylist()[0]
        lines = [f"{self.label}: {info['pairs']:,} pairs of consecutive windows of {info['instances']:,} instances "
                 f"({info['rows']:,} windows; {info['gaps']:,} gaps over {int(info['max_gap_s'])} s), "
                 f"tier map {info['tier_map']!r}"]
        for r in as_arrow(result["summary"]).to_pylist():
            lines.append(f"  {r['tier']:>8} {r['resource']}: {r['defined']:,} defined changes, within ±20%: "
                         f"{fmt(r['within_20pct'], '.1%')}, within ±5%: {fmt(r['within_5pct'], '.1%')}, "
                         f"median {fmt(r['p50_change'], '+.3f')}")
        return "\n".join(lines)


#: The result tables' columns and types (an empty table keeps them).
_SUMMARY_SCHEMA = pa.schema([("tier", pa.string()), ("resource", pa.string()), *((c, pa.int64()) for c in _COUNTS),
                             *((f"within_{round(h * 100)}pct", pa.float64()) for h in THRESHOLDS),
                             ("mean_change", pa.float64()), *((f"p{q}_change", pa.float64()) for q in (1, 10, 50, 90, 99))])
_HIST_SCHEMA = pa.schema([("tier", pa.string()), ("resource", pa.string()), ("bin", pa.int64()),
                          ("lo_change", pa.float64()), ("hi_change", pa.float64()), ("pairs", pa.int64())])
