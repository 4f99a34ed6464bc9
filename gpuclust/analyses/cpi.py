"""``cpi``: CPI / MAI statistics per group and the Borg §5.2 CPI interference regression.

Input: ``instance_usage`` windows (all rows, tasks inside allocs and alloc instances included)
whose CPI and MAI pass the configurable plausibility filter (:class:`gpuclust.stats.CpiFilter`);
weights are the window's CPU-seconds ``avg_cpu x (end_time - start_time)`` so every CPU-second
counts equally.  Rejections are counted per reason.

Per group (option ``by``: machine, platform, collection, tier or cell): n, CPU-seconds, weighted
mean and std of CPI and MAI, weighted Pearson r(CPI, MAI) and a weighted Spearman rank correlation
(``spearman``: mergeable grid with an error bound, exact from carried rows, or none).

Cell-level regression ``CPI = b0 + b_util * util + b_ntasks * ntasks`` (CPU-second weighted)
where, for a window on machine m in 300 s cell c = floor(start_time / 300 s), ``k`` = number of
top-level usage rows on m in c (itself included when top-level), ``ntasks = k - 1`` and
``util = sum(avg_cpu x duration) over those rows / (cell length x cap_cpu(m))``.  ``k`` and
``util`` are constant inside a machine-cell, so the regression's co-moments need no per-window
join: each partition sums, per (machine, cell), the top-level rows' count and CPU time and, per
(machine, cell, platform), the kept windows' weight, weighted CPI and weighted squared CPI; those
keyed sums are spilled and reduced by shards of machines (the engine's ``sharded`` path,
:mod:`gpuclust.engine.shards`), each turning its machine-cells into per-platform co-moments and
binned sums.  Fits: pooled, per platform, and platform fixed
effects (multiplicative: CPI relative to its platform's mean, within-platform co-moments pooled);
option ``regression`` picks the primary one, or ``none`` skips the regression (the
SQL-expressible subset).  The only pass before the main one builds the Spearman grid's cut points
(``spearman="grid"``, :class:`gpuclust.analyses._machine_cells.CpiHistograms`).  Details and the reasoning: ``docs/analysis-cpi.md``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import numpy as np

from gpuclust._lazy import pandas as pd
from gpuclust._xp import bincount
from gpuclust.analyses._extent import max_finite
from gpuclust.analyses._lookup import EVENT_COLUMNS, InstanceLookup, id_index, machine_capacities, tier_lookup
from gpuclust.analyses._machine_cells import (
    CELL_US,
    CpiHistograms,
    cpu_seconds,
    filter_rows,
    grid_cuts,
    hist_edges,
)
from gpuclust.analyses.base import Analysis, fmt, host_or_device, is_null_int, resolve_tier_map, to_host
from gpuclust.analyses.grouping import bucket_index
from gpuclust.analyses.options import option, tier_map_option
from gpuclust.arrow_numpy import valid as arrow_valid
from gpuclust.backends import finalize_backend, merged_backend
from gpuclust.backends.moments_cpu import regroup_moments
from gpuclust.parted import finalize_in_memory
from gpuclust.partials import Moments, keyed_reduce, log_bins, merge_keyed
from gpuclust.schema import TierMap, tier_map
from gpuclust.stats import (
    CpiFilter,
    borg_effects,
    cpi_mai_summary,
    spearman_exact,
    spearman_from_grid,
    spearman_grid_partial,
    wls_from_moments,
)
from gpuclust.tables import column

__all__ = ["BY", "COUNTERS", "Cpi", "CpiContext", "REGRESSIONS", "SPEARMAN"]

BY = ("platform", "machine", "collection", "tier", "cell")
REGRESSIONS = ("platform-fixed-effects", "per-platform", "pooled", "none")
SPEARMAN = ("grid", "exact", "none")
#: Counters kept in every partial, in this order.
COUNTERS = ("total", "kept", "missing", "cpu_seconds", "cpi_range", "mai_range",
            "regression_used", "no_capacity", "no_machine_cell", "unknown_util", "unknown_platform")
#: Utilisation bins of the ``binned`` table (width, count; the last bin is open-ended).
UTIL_BIN = 0.05
UTIL_BINS = 40
#: Task counts k above this share the last bin of the ``binned`` table.
K_BINS = 1024
_BIN_BITS = 16
#: Keyed sums of a partition (spilled, reduced by machine-range shards): ``c``: per (machine,
#: cell) over the top-level rows; ``w``: per (machine, cell, platform) over the kept windows.
KEYED = {"c": ("k", "cpu_seconds", "bad"), "w": ("n", "W", "S", "Q")}
#: (machine, cell, platform) keys per shard (dense accumulators of this many entries).
SHARD_KEYS = 1 << 21
#: ``stats``: top-level rows outside the cell range, machine-cells, machine-cells of unknown util.
_STATS = ("bad_cell_rows", "machine_cells", "machine_cells_unknown_util")
_BY_COLUMN = {"platform": "platform_id", "machine": "machine_id", "collection": "collection_id",
              "tier": "tier", "cell": "cell"}


@dataclass(frozen=True)
class CpiContext:
    """Side inputs broadcast to every partition (all host NumPy arrays)."""

    filter: CpiFilter
    tier_map: TierMap | None
    #: platform lookup "as of the window": machines of machine_events, platform names, events
    pm_ids: np.ndarray
    platforms: tuple[str, ...]
    pe_times: np.ndarray
    pe_key: np.ndarray
    pe_machine: np.ndarray
    pe_code: np.ndarray
    pm_first: np.ndarray
    #: machines with a known positive CPU capacity (sorted) and that capacity
    cap_ids: np.ndarray
    cap_val: np.ndarray
    #: cells per machine in the keyed sums' keys (cells ``[0, cell_span)``; 0 without regression)
    cell_span: int
    #: per pm_ids entry: its index in cap_ids (-1: no known capacity)
    pm_cap: np.ndarray
    #: Spearman grid cuts
    cpi_cuts: np.ndarray
    mai_cuts: np.ndarray
    #: the first pass's fine histogram edges and, per fine bin (``partials.log_bins``), its grid bin (the
    #: cuts are fine edges); empty when the cuts are not all fine edges (then searchsorted)
    cpi_edges: np.ndarray
    mai_edges: np.ndarray
    cpi_lut: np.ndarray
    mai_lut: np.ndarray
    #: per-instance tier lookup (by="tier" only), sorted by hash
    #: (collection_id, instance_index, machine_id) -> tier code (``by="tier"`` only)
    lookup: InstanceLookup
    trace_window_us: tuple[int, int] | None
    info: dict[str, Any]

    @property
    def unknown_platform(self) -> int:
        return len(self.platforms)

    @property
    def tier_names(self) -> tuple[str, ...]:
        return (self.tier_map.names if self.tier_map else ()) + ("unknown",)

    @property
    def n_platforms(self) -> int:
        """Platform codes in the keys: the platforms and ``unknown_platform``."""
        return len(self.platforms) + 1


def _cell_span(last_start: int | None, machines: int, n_platforms: int) -> int:
    """Cells per machine in the keyed sums: up to the cell of the latest window start (from
    Parquet statistics), at most 2^32 and small enough that (machine, cell, platform) keys fit
    an int64."""
    cells = last_start // CELL_US + 1 if last_start is not None and last_start >= 0 else 1
    return int(max(1, min(cells, 1 << 32, (1 << 62) // max(machines * n_platforms, 1))))


def _trace_window(source: Any) -> tuple[int, int] | None:
    man = getattr(source, "manifest", None) or {}
    win = man.get("trace_window_us") or (man.get("synthetic") or {}).get("trace_window_us")
    if win and len(win) == 2:
        return int(win[0]), int(win[1])
    return None


def _cell_seconds(xp: Any, cell: Any, window: tuple[int, int] | None) -> Any:
    """Length in seconds of each 300 s cell inside the trace window (300 when it is unknown)."""
    if window is None:
        return xp.full(cell.shape, CELL_US / 1e6)
    lo = xp.maximum(cell * CELL_US, window[0])
    hi = xp.minimum((cell + 1) * CELL_US, window[1])
    return xp.maximum(hi - lo, 0).astype(xp.float64) / 1e6


def _platform_lookup(me: Any) -> dict[str, Any]:
    """Arrays for the as-of-window platform lookup from a machine_events Arrow table."""
    mid = me.column("machine_id").to_numpy().astype(np.int64)
    t = me.column("time").to_numpy().astype(np.int64)
    plat = me.column("platform_id")
    pm_ids = np.unique(mid)
    valid = arrow_valid(plat)
    names = np.asarray(plat.to_pylist(), dtype=object)
    platforms = tuple(sorted({str(p) for p in names[valid]}))
    code_of = {p: i for i, p in enumerate(platforms)}
    mid_v, t_v = mid[valid], t[valid]
    code_v = np.array([code_of[str(p)] for p in names[valid]], dtype=np.int32)
    times = np.unique(t_v)
    T = times.shape[0]
    m2 = np.searchsorted(pm_ids, mid_v)
    order = np.lexsort((np.arange(m2.shape[0]), t_v, m2))  # by machine, time, then file order
    m2, t_v, code_v = m2[order], t_v[order], code_v[order]
    key = m2.astype(np.int64) * (T + 1) + np.searchsorted(times, t_v) + 1
    first = np.full(pm_ids.shape[0], len(platforms), dtype=np.int32)
    if m2.shape[0]:
        is_first = np.ones(m2.shape[0], dtype=bool)
        is_first[1:] = m2[1:] != m2[:-1]
        first[m2[is_first]] = code_v[is_first]
    return {"pm_ids": pm_ids, "platforms": platforms, "pe_times": times, "pe_key": key,
            "pe_machine": m2.astype(np.int64), "pe_code": code_v, "pm_first": first}


def _capacities(me: Any) -> tuple[np.ndarray, np.ndarray]:
    """Sorted machine ids with a positive CPU capacity and that capacity: MAX(cap_cpu) per machine
    over its events (NULLs ignored), as cell-usage (:func:`machine_capacities`)."""
    ids, cpu, _ = machine_capacities(me)
    pos = cpu > 0
    return ids[pos], cpu[pos]


def _dense_groups(xp: Any, code: Any, span: int, keys: Any) -> tuple[Any, Any, int]:
    """Sorted unique group keys and the inverse for integer codes in ``[0, span)`` whose keys
    ``keys[code]`` increase with the code: what ``xp.unique(keys[code], return_inverse=True)``
    returns, by a bincount instead of a sort."""
    cnt = bincount(xp, code, minlength=span)
    present = cnt > 0
    if bool(present.all()):  # every code occurs: the inverse is the code itself
        return keys.astype(xp.int64), xp.ascontiguousarray(code.astype(xp.int64, copy=False)), int(span)
    rank = xp.cumsum(present) - 1
    inv = xp.ascontiguousarray(rank[code].astype(xp.int64))
    uniq = keys[xp.nonzero(present)[0]].astype(xp.int64)
    return uniq, inv, int(uniq.shape[0])


# ------------------------------------------------------------------------------ keyed moments

def _moments_fields(prefix: str, d: int) -> dict[str, np.ndarray]:
    return {prefix + "key": np.zeros(0, np.int64), prefix + "n": np.zeros(0, np.int64),
            prefix + "W": np.zeros(0), prefix + "mean": np.zeros((0, d)), prefix + "C": np.zeros((0, d, d))}


def _moments_of(p: dict[str, Any], prefix: str) -> Moments:
    return Moments(p[prefix + "n"], p[prefix + "W"], p[prefix + "mean"], p[prefix + "C"])


def _merge_keyed_moments(a: dict[str, np.ndarray], b: dict[str, np.ndarray], prefix: str,
                         extra: tuple[str, ...] = ()) -> dict[str, np.ndarray]:
    """Concatenate + regroup two keyed moment partials (and sum keyed ``extra`` arrays)."""
    names = (prefix + "key", prefix + "n", prefix + "W", prefix + "mean", prefix + "C", *extra)
    if a[prefix + "key"].shape[0] == 0:
        return {k: b[k].copy() for k in names}
    if b[prefix + "key"].shape[0] == 0:
        return {k: a[k].copy() for k in names}
    key = np.concatenate([a[prefix + "key"], b[prefix + "key"]])
    uniq, inv = np.unique(key, return_inverse=True)
    inv = inv.reshape(-1)
    m = regroup_moments(_moments_of(a, prefix).concat(_moments_of(b, prefix)), inv, uniq.shape[0])
    out = {prefix + "key": uniq.astype(np.int64), prefix + "n": m.n, prefix + "W": m.W,
           prefix + "mean": m.mean, prefix + "C": m.C}
    for k in extra:
        cat = np.concatenate([a[k], b[k]])
        acc = np.zeros((uniq.shape[0],) + cat.shape[1:], dtype=cat.dtype)
        np.add.at(acc, inv, cat)
        out[k] = acc
    return out


def _keyed_comoments(backend: Any, key: Any, x: Any, w: Any, prefix: str,
                     groups: tuple[Any, Any, int] | None = None) -> tuple[dict[str, Any], Any, int]:
    xp = backend.xp
    if groups is None:
        uniq, inv = xp.unique(key, return_inverse=True)
        inv = xp.ascontiguousarray(inv.reshape(-1).astype(xp.int64))
        G = int(uniq.shape[0])
    else:
        uniq, inv, G = groups
    m = backend.ops.grouped_comoments(xp.ascontiguousarray(x), xp.ascontiguousarray(w), inv, G)
    return ({prefix + "key": uniq.astype(xp.int64), prefix + "n": m.n, prefix + "W": m.W,
             prefix + "mean": m.mean, prefix + "C": m.C}, inv, G)


# ------------------------------------------------------------------------------ the analysis

@dataclass(frozen=True)
class Cpi(Analysis):
    """CPI/MAI per group and the Borg §5.2 CPI interference regression.

    Parameters
    ----------
    by
        Grouping of the ``groups`` table: ``platform`` (default), ``machine``, ``collection``,
        ``tier`` or ``cell`` (one group: the whole dataset).
    regression
        Primary fit: ``platform-fixed-effects`` (default; recovers the synthetic cell's planted
        slopes), ``per-platform`` or ``pooled``.  All fits are reported in ``regression``.
        ``none`` skips the regression: no (machine, cell) sums, empty ``regression`` and
        ``binned`` tables, no ``regression`` stage in ``filter`` (what SQL expresses: per-group
        weighted moments and Pearson r).
    spearman
        ``grid`` (mergeable, with an error bound), ``exact`` (carries the filtered rows: memory
        O(rows)) or ``none``.
    spearman_bins
        Grid bins per axis (cuts at CPI/MAI row-count quantiles from the first pass).
    cpi_min, cpi_max, mai_min, mai_max, min_cpu_seconds
        The plausibility filter (:class:`gpuclust.stats.CpiFilter`; same defaults).
    tier_map
        Tier map for ``by="tier"`` (default: the dataset's, as ``cell-usage``).

    Examples
    --------
    >>> Cpi(by="machine").label
    'cpi[by=machine]'
    """

    by: str = option("platform", "grouping of the groups table (cell = the whole dataset)", choices=BY)
    regression: str = option("platform-fixed-effects",
                             "primary fit (all fits are reported): multiplicative platform fixed effects, "
                             "one fit per platform, or pooled over platforms", choices=REGRESSIONS)
    spearman: str = option("grid", "grid = mergeable estimate with an error bound; exact = carries the rows; none",
                           choices=SPEARMAN)
    spearman_bins: int = option(32, "Spearman grid bins per axis")
    cpi_min: float = option(CpiFilter.cpi_min, "CPI filter: exclusive lower bound")
    cpi_max: float = option(CpiFilter.cpi_max, "CPI filter: inclusive upper bound")
    mai_min: float = option(CpiFilter.mai_min, "MAI filter: inclusive lower bound")
    mai_max: float = option(CpiFilter.mai_max, "MAI filter: inclusive upper bound")
    min_cpu_seconds: float = option(CpiFilter.min_cpu_seconds, "minimum CPU-seconds (avg_cpu x duration) of a window")
    tier_map: str | None = tier_map_option("tier map for by=tier; default: the dataset's")

    name = "cpi"
    table = "instance_usage"
    #: CPI/MAI groups other than platforms need only usage rows; machine_events and
    #: instance_events are read for the options below (:meth:`needed_tables`)
    requires = ("instance_usage",)
    row_bytes = 160
    #: rows per partition for partitions="auto" (gpuclust.engine.memory.preferred_rows)
    auto_partition_rows = 1 << 20
    optional_tables = ("machine_events", "instance_events")
    table_uses = {"machine_events": "required for by=platform; the regression's capacities",
                  "instance_events": "by=tier"}

    def __post_init__(self) -> None:
        for opt, choices in (("by", BY), ("regression", REGRESSIONS), ("spearman", SPEARMAN)):
            if getattr(self, opt) not in choices:
                raise ValueError(f"cpi: unknown {opt} {getattr(self, opt)!r}; choose one of {list(choices)}")
        if not (isinstance(self.spearman_bins, int) and 2 <= self.spearman_bins <= 1024):
            raise ValueError(f"cpi: spearman_bins must be an integer in [2, 1024], got {self.spearman_bins!r}")
        _ = self.filter  # validates the ranges
        if self.tier_map is not None:
            tier_map(self.tier_map)

    def needed_tables(self) -> tuple[dict[str, str], dict[str, str]]:
        """instance_usage always; machine_events for ``by=platform`` (the groups are its
        platforms: required) and for the regression (machine capacities: without them it is
        empty); instance_events for ``by=tier`` only."""
        required, optional = {"instance_usage": ""}, {}
        if self.by == "platform":
            required["machine_events"] = "by=platform: the machines' platforms; by=cell, machine, collection, tier do not"
        elif self.regression != "none":
            optional["machine_events"] = "the regression: machine capacities"
        if self.by == "tier":
            optional["instance_events"] = "by=tier: the instances' priorities"
        return required, optional

    @property
    def filter(self) -> CpiFilter:
        return CpiFilter(self.cpi_min, self.cpi_max, self.mai_min, self.mai_max, self.min_cpu_seconds)

    @property
    def first_pass(self) -> bool:
        """Whether a pass runs before the main one (:class:`CpiHistograms`, for the Spearman
        grid's cut points)."""
        return self.spearman == "grid"

    @property
    def sharded(self) -> bool:
        """The regression's keyed (machine, cell) sums are spilled and reduced by machine-range
        shards (:mod:`gpuclust.engine.shards`)."""
        return self.regression != "none"

    @property
    def columns(self) -> tuple[str, ...]:
        cols = ["start_time", "end_time"]
        if self.by in ("collection", "tier"):
            cols.append("collection_id")
        if self.by == "tier":
            cols.append("instance_index")
        if self.by in ("machine", "platform", "tier") or self.regression != "none":
            cols.append("machine_id")
        if self.regression != "none":
            cols.append("alloc_collection_id")
        return (*cols, "avg_cpu", "cpi", "mai")

    # ---------------------------------------------------------------- context (client side)
    def resolve_tier_map(self, source: Any) -> TierMap:
        return resolve_tier_map(self.tier_map, source)

    @property
    def context_columns(self) -> tuple[str, ...]:
        return CpiHistograms().columns if self.first_pass else ()

    def prerequisites(self, source: Any) -> dict[str, Analysis]:
        return {"histograms": CpiHistograms(self.filter)} if self.first_pass else {}

    def context(self, source: Any, prior: dict[str, dict[str, Any]] | None = None) -> CpiContext:
        me = source.read("machine_events", ["time", "machine_id", "cap_cpu", "cap_mem", "platform_id"])
        plat = _platform_lookup(me)
        cap_ids, cap_val = _capacities(me)
        flt = self.filter
        cpi_cuts = mai_cuts = np.zeros(0)
        edges = {"cpi": hist_edges("cpi", flt.cpi_max), "mai": hist_edges("mai", flt.mai_max)}
        if self.first_pass:
            if not prior or "histograms" not in prior:
                raise RuntimeError("cpi: the histograms pass must run first (the engine runs prerequisites)")
            hist = prior["histograms"]["hist"]
            cpi_cuts = grid_cuts(column(hist, "cpi"), edges["cpi"], self.spearman_bins)
            mai_cuts = grid_cuts(column(hist, "mai"), edges["mai"], self.spearman_bins)
        window = _trace_window(source)
        luts = {}
        for var, cuts in (("cpi", cpi_cuts), ("mai", mai_cuts)):
            # fine bin b holds edges[b - 1] <= v < edges[b]; as every cut is an edge, the grid bin
            # searchsorted(cuts, v, "right") is the same for all of them: the count of cuts <= edges[b - 1]
            ok = self.spearman == "grid" and bool(np.isin(cuts, edges[var]).all())
            luts[var + "_lut"] = (np.concatenate([[0], np.searchsorted(cuts, edges[var], side="right")]).astype(np.int64)
                                  if ok else np.zeros(0, np.int64))
        span = 0
        if self.regression != "none" and cap_ids.shape[0]:
            span = _cell_span(max_finite(source, "instance_usage", "start_time"), int(cap_ids.shape[0]),
                              len(plat["platforms"]) + 1)
        tm = self.resolve_tier_map(source) if self.by == "tier" else None
        cpos = np.searchsorted(cap_ids, plat["pm_ids"]) if cap_ids.shape[0] else np.zeros(0, np.int64)
        cposc = np.clip(cpos, 0, max(cap_ids.shape[0] - 1, 0))
        pm_cap = (np.where(cap_ids[cposc] == plat["pm_ids"], cpos, -1) if cap_ids.shape[0]
                  else np.full(plat["pm_ids"].shape[0], -1)).astype(np.int64)
        info = {"machines": int(plat["pm_ids"].shape[0]), "machines_with_capacity": int(cap_ids.shape[0])}
        return CpiContext(filter=flt, tier_map=tm, **plat, cap_ids=cap_ids, cap_val=cap_val, cell_span=span,
                          pm_cap=pm_cap,
                          cpi_cuts=cpi_cuts, mai_cuts=mai_cuts, cpi_edges=edges["cpi"], mai_edges=edges["mai"],
                          cpi_lut=luts["cpi_lut"], mai_lut=luts["mai_lut"],
                          lookup=InstanceLookup.empty(), trace_window_us=window, info=info)

    @property
    def side_inputs(self) -> dict[str, tuple[str, ...]]:
        return {"instance_events": EVENT_COLUMNS} if self.by == "tier" else {}

    def bind(self, ctx: CpiContext, side: dict[str, Any], grain: str | None) -> CpiContext:
        if self.by != "tier":
            return ctx
        # MAX(priority) per (collection_id, instance_index, machine_id) over all instance_events
        # rows (allocs included: the cpi analysis keeps tasks inside allocs) -> tier code
        assert ctx.tier_map is not None  # context() resolves one for by="tier"
        n = len(ctx.tier_map.names)
        return dataclasses.replace(ctx, lookup=tier_lookup(side["instance_events"], ctx.tier_map, top_level_only=False,
                                                           unmatched=n, what="cpi tier lookup"))

    # ---------------------------------------------------------------- partial / merge
    def empty(self, backend: Any = None) -> dict[str, Any]:
        b = self.spearman_bins
        out: dict[str, np.ndarray] = {**_moments_fields("g_", 2)}
        out["g_grid"] = np.zeros((0, b, b)) if self.spearman == "grid" else np.zeros((0, 0, 0))
        out.update({"s_key": np.zeros(0, np.int64), "s_x": np.zeros(0), "s_y": np.zeros(0), "s_w": np.zeros(0)})
        for pre, fields in KEYED.items():
            out[pre + "_key"] = np.zeros(0, np.int64)
            out.update({f"{pre}_{f}": np.zeros(0, np.int64) if f in ("k", "bad", "n") else np.zeros(0)
                        for f in fields})
        out["counts"] = np.zeros(len(COUNTERS), np.int64)
        out["stats"] = np.zeros(len(_STATS), np.int64)
        return out | {"backend": getattr(backend, "name", "cpu")}

    @staticmethod
    def _machine_index(backend: Any, ctx: CpiContext, mid: Any) -> tuple[Any, Any] | None:
        """Per row: index into ``ctx.pm_ids`` (0 where absent) and whether the machine is there."""
        if ctx.pm_ids.shape[0] == 0 or int(mid.shape[0]) == 0:
            return None
        return id_index(backend, ctx.pm_ids, mid)

    def _platform(self, backend: Any, ctx: CpiContext, mid: Any, start: Any,
                  mi: tuple[Any, Any] | None = None) -> Any:
        """Platform code per row as of the window's start (machine's first known platform before
        its first platform event; ``unknown_platform`` for machines absent from machine_events)."""
        xp = backend.xp
        n = int(mid.shape[0])
        unknown = xp.full(n, ctx.unknown_platform, dtype=xp.int32)
        if ctx.pm_ids.shape[0] == 0 or n == 0:
            return unknown
        if mi is None:
            mi = self._machine_index(backend, ctx, mid)
            assert mi is not None  # None only for no machines or no rows, returned above
        m2, known = mi
        first = backend.stage(ctx.pm_first)[m2]
        if ctx.pe_key.shape[0] == 0 or bool((ctx.pe_code == ctx.pm_first[ctx.pe_machine]).all()):
            # no platform changes (every event repeats its machine's first platform): the as-of
            # lookup below would return ``first`` for every row
            return xp.where(known, first, unknown)
        T = int(ctx.pe_times.shape[0])
        rk = m2.astype(xp.int64) * (T + 1) + xp.searchsorted(backend.stage(ctx.pe_times), start, side="right")
        pos = xp.searchsorted(backend.stage(ctx.pe_key), rk, side="right") - 1
        posc = xp.clip(pos, 0, ctx.pe_key.shape[0] - 1)
        same = (pos >= 0) & (backend.stage(ctx.pe_machine)[posc] == m2)
        code = xp.where(same, backend.stage(ctx.pe_code)[posc], first)
        return xp.where(known, code, unknown).astype(xp.int32)

    @staticmethod
    def _machine_groups(backend: Any, ctx: CpiContext, gkey: Any, mi: tuple[Any, Any]) -> tuple[Any, Any, int]:
        """``xp.unique(gkey, return_inverse=True)`` for machine-id keys, from the rows' pm_ids
        index (dense codes, a bincount) and a unique of the rows whose machine is not in pm_ids."""
        xp = backend.xp
        m2, known = mi
        P = int(ctx.pm_ids.shape[0])
        pm = backend.stage(ctx.pm_ids)
        if bool(known.all()):
            return _dense_groups(xp, m2.astype(xp.int64, copy=False), P, pm)
        other = ~known
        ou, oinv = xp.unique(gkey[other], return_inverse=True)
        code = m2.astype(xp.int64)
        code[other] = P + oinv.reshape(-1).astype(xp.int64)
        allk = xp.concatenate([pm.astype(xp.int64), ou.astype(xp.int64)])
        order = xp.argsort(allk)
        rank = xp.empty_like(order)
        rank[order] = xp.arange(order.shape[0], dtype=order.dtype)
        return _dense_groups(xp, rank[code].astype(xp.int64), int(allk.shape[0]), allk[order])

    def _tier(self, backend: Any, ctx: CpiContext, c: Any, i: Any, m: Any) -> Any:
        found, code = ctx.lookup.find(backend, c, i, m)
        return backend.xp.where(found, code, len(ctx.tier_names) - 1).astype(backend.xp.int32)

    def partial(self, cols: dict[str, Any], ctx: CpiContext, backend: Any) -> dict[str, Any]:
        xp = backend.xp
        idx, y, z, w, fc = filter_rows(xp, ctx.filter, cols)
        counts = dict.fromkeys(COUNTERS, 0)
        counts.update(fc)
        out: dict[str, Any] = {k: v if k == "backend" else xp.asarray(v) for k, v in self.empty(backend).items()}
        regress = self.regression != "none"
        # the regression's machine-cell sums run over every top-level row, kept or not
        mall = self._cell_sums(cols, ctx, backend, out) if regress else None
        if int(idx.shape[0]) == 0:
            out["counts"] = xp.asarray(np.array([counts[c] for c in COUNTERS], np.int64))
            return out
        mid = cols["machine_id"][idx] if "machine_id" in cols else None
        st = cols["start_time"][idx] if regress else None
        mi: tuple[Any, Any] | None
        if mall is not None:
            mi = (mall[0][idx], mall[1][idx])
        else:
            mi = self._machine_index(backend, ctx, mid) if mid is not None else None
        plat = self._platform(backend, ctx, mid, st if regress else cols["start_time"][idx], mi) if (
            regress or self.by == "platform") else None
        groups = None
        # ---- per-group CPI/MAI moments (keyed)
        if self.by == "machine":
            assert mid is not None  # by="machine" reads machine_id
            gkey = mid.astype(xp.int64)
            if mi is not None:
                groups = self._machine_groups(backend, ctx, gkey, mi)
        elif self.by == "collection":
            gkey = cols["collection_id"][idx].astype(xp.int64)
        elif self.by == "platform":
            assert plat is not None  # computed for by="platform"
            gkey = plat.astype(xp.int64)
            groups = _dense_groups(xp, gkey, ctx.unknown_platform + 1, xp.arange(ctx.unknown_platform + 1))
        elif self.by == "tier":
            gkey = self._tier(backend, ctx, cols["collection_id"][idx], cols["instance_index"][idx], mid).astype(xp.int64)
            nt = len(ctx.tier_names)
            groups = _dense_groups(xp, gkey, nt, xp.arange(nt))
        else:
            gkey = xp.zeros(int(idx.shape[0]), dtype=xp.int64)
            groups = _dense_groups(xp, gkey, 1, xp.arange(1))
        n_kept = int(idx.shape[0])
        xg = xp.empty((n_kept, 2))
        xg[:, 0] = y
        xg[:, 1] = z
        g, inv, G = _keyed_comoments(backend, gkey, xg, w, "g_", groups)
        del xg
        out.update(g)
        if self.spearman == "grid":
            bins = None
            if ctx.cpi_lut.shape[0] and ctx.mai_lut.shape[0]:
                bins = tuple(backend.stage(lut)[log_bins(xp, backend.stage(e), v)]
                             for lut, e, v in ((ctx.cpi_lut, ctx.cpi_edges, y), (ctx.mai_lut, ctx.mai_edges, z)))
            out["g_grid"] = spearman_grid_partial(backend, y, z, inv, G, backend.stage(ctx.cpi_cuts),
                                                  backend.stage(ctx.mai_cuts), w, bins)
            if ctx.cpi_cuts.shape[0] + 1 != self.spearman_bins or ctx.mai_cuts.shape[0] + 1 != self.spearman_bins:
                grid = xp.zeros((G, self.spearman_bins, self.spearman_bins))
                hx, hy = ctx.cpi_cuts.shape[0] + 1, ctx.mai_cuts.shape[0] + 1
                grid[:, :hx, :hy] = out["g_grid"]
                out["g_grid"] = grid
        else:
            out["g_grid"] = xp.zeros((G, 0, 0))
            if self.spearman == "exact":
                out.update({"s_key": gkey, "s_x": y, "s_y": z, "s_w": w})
        if not regress:
            out["counts"] = xp.asarray(np.array([counts[c] for c in COUNTERS], np.int64))
            return out
        # ---- regression: keyed sums of the kept windows per (machine, cell, platform); k and util
        # are constant inside a machine-cell, so the shards need no per-window join
        assert st is not None and plat is not None  # both computed when regress
        cp, has_cap = (mall[2][idx], mall[3][idx]) if mall is not None else (None, xp.zeros(n_kept, dtype=bool))
        span = ctx.cell_span
        inside = has_cap & (st >= 0) & (st < span * CELL_US)
        ri = xp.nonzero(inside)[0]
        counts["no_capacity"] = n_kept - int(has_cap.sum())
        counts["no_machine_cell"] = int(has_cap.sum()) - int(ri.shape[0])  # the shards add the cells without rows
        out["counts"] = xp.asarray(np.array([counts[c] for c in COUNTERS], np.int64))
        if int(ri.shape[0]):
            assert cp is not None  # rows with a capacity come from the machine lookup (mall)
            key = cp[ri].astype(xp.int64) * span
            key += bucket_index(st[ri], CELL_US)
            key *= ctx.n_platforms
            key += plat[ri].astype(xp.int64)
            wr, yr = w[ri], y[ri]
            wy = wr * yr
            out.update({"w_" + k: v for k, v in keyed_reduce(backend, key, {"W": wr, "S": wy, "Q": wy * yr},
                                                               {"n": None}).items()})
        return out

    def _cell_sums(self, cols: dict[str, Any], ctx: CpiContext, backend: Any,
                   out: dict[str, Any]) -> tuple[Any, Any, Any, Any] | None:
        """Per (capacity machine, cell) over the top-level rows of every window (kept or not):
        ``k``, CPU-seconds (0 for unknown ones) and ``bad`` (unknown CPU time), into ``out``'s
        ``c_*`` and ``stats``; returns the rows' machine lookup ``(pm index, known, capacity
        index, has capacity)`` for reuse (``None`` when machine_events has no machines)."""
        xp = backend.xp
        mid, start = cols["machine_id"], cols["start_time"]
        if ctx.pm_ids.shape[0] == 0 or int(mid.shape[0]) == 0:
            return None
        m2, known = id_index(backend, ctx.pm_ids, mid)
        cp = backend.stage(ctx.pm_cap)[m2]
        has_cap = known & (cp >= 0)
        alloc = cols["alloc_collection_id"]
        top = has_cap & ((alloc == 0) | is_null_int(xp, alloc))
        inside = (start >= 0) & (start < ctx.cell_span * CELL_US)
        ui = xp.nonzero(top & inside)[0]
        stats = np.zeros(len(_STATS), np.int64)
        stats[0] = int(top.sum()) - int(ui.shape[0])
        out["stats"] = xp.asarray(stats)
        if int(ui.shape[0]):
            cs = cpu_seconds(xp, start[ui], cols["end_time"][ui], cols["avg_cpu"][ui])
            bad = ~xp.isfinite(cs)
            cs[bad] = 0.0
            key = cp[ui].astype(xp.int64) * ctx.cell_span
            key += bucket_index(start[ui], CELL_US)
            out.update({"c_" + k: v for k, v in keyed_reduce(backend, key, {"cpu_seconds": cs},
                                                               {"k": None, "bad": bad.astype(xp.int64)}).items()})
        return m2, known, cp, has_cap

    def merge(self, a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
        out: dict[str, Any] = _merge_keyed_moments(a, b, "g_", ("g_grid",))
        out.update({k: np.concatenate([a[k], b[k]]) for k in ("s_key", "s_x", "s_y", "s_w")})
        for pre in KEYED:
            if pre + "_key" in a:  # not in a split's rest
                ka, kb = self._keyed(a, pre), self._keyed(b, pre)
                out.update({f"{pre}_{k}": v for k, v in merge_keyed(ka, kb).items()})
        out["counts"] = a["counts"] + b["counts"]
        out["stats"] = a["stats"] + b["stats"]
        out["backend"] = merged_backend(a["backend"], b["backend"])
        return out

    # ---------------------------------------------------------------- shards (regression)
    @staticmethod
    def _keyed(p: dict[str, Any], pre: str) -> dict[str, Any]:
        return {"key": p[pre + "_key"], **{f: p[f"{pre}_{f}"] for f in KEYED[pre]}}

    def split(self, partial: dict[str, Any]) -> tuple[dict[str, Any], dict[str, dict[str, np.ndarray]]]:
        rest = {k: to_host(v) for k, v in partial.items() if not k.startswith(tuple(pre + "_" for pre in KEYED))}
        return rest, {pre: {f: host_or_device(v) for f, v in self._keyed(partial, pre).items()} for pre in KEYED}

    def merge_rest(self, a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
        return self.merge(a, b)

    def shards(self, ctx: CpiContext, rest: dict[str, Any]) -> list[tuple[int, int]]:
        """Ranges of capacity-machine indices of about :data:`SHARD_KEYS` (machine, cell,
        platform) keys each."""
        M = int(ctx.cap_ids.shape[0])
        step = max(1, SHARD_KEYS // max(ctx.cell_span * ctx.n_platforms, 1))
        return [(lo, min(lo + step, M)) for lo in range(0, M, step)] or [(0, 0)]

    def key_range(self, ctx: CpiContext, name: str, lo: int, hi: int) -> tuple[int, int]:
        per = ctx.cell_span * (ctx.n_platforms if name == "w" else 1)
        return lo * per, hi * per

    @staticmethod
    def _util(c: dict[str, Any], ctx: CpiContext, be: Any) -> tuple[Any, Any, Any]:
        """Capacity-machine index, cell and utilisation of merged ``c`` sums (NaN when a row's CPU
        time is unknown or the cell lies outside the trace window), on backend ``be`` given ``c``
        there."""
        xp = be.xp
        key = c["key"].astype(xp.int64, copy=False)
        span = max(ctx.cell_span, 1)
        m, cell = key // span, key % span
        denom = _cell_seconds(xp, cell, ctx.trace_window_us) * be.stage(ctx.cap_val)[m]
        with np.errstate(invalid="ignore", divide="ignore"):
            u = xp.where((c["bad"] == 0) & (denom > 0), c["cpu_seconds"] / xp.where(denom > 0, denom, 1.0), xp.nan)
        return m, cell, u

    def machine_cells(self, c: dict[str, np.ndarray], ctx: CpiContext) -> pd.DataFrame:
        """The machine-cell table of merged ``c`` sums: ``machine_id``, ``cell``, ``k``, ``util``."""
        m, cell, u = self._util(c, ctx, finalize_backend("cpu"))
        return pd.DataFrame({"machine_id": ctx.cap_ids[m], "cell": cell, "k": np.asarray(c["k"], np.int64), "util": u})

    def finalize_shard(self, keyed: dict[str, dict[str, np.ndarray]], rest: dict[str, Any], ctx: CpiContext,
                       lo: int, hi: int) -> tuple[dict[str, Any], dict[str, Any]]:
        """Machines ``[lo, hi)``: their machine-cells' ``k`` and ``util``, joined to the kept
        windows' (machine, cell, platform) sums: per-platform co-moments of (CPI, util, ntasks)
        and the binned sums, with the regression counters (no parted tables).  The join and the
        sums run on the backend the partials were computed on (:func:`finalize_backend`: the
        device under ``backend="gpu"``); the extra comes back to the host."""
        be = finalize_backend(rest["backend"])
        xp = be.xp
        c = {f: be.asarray(v) for f, v in keyed["c"].items()}
        wk = {f: be.asarray(v) for f, v in keyed["w"].items()}
        ck, k = c["key"].astype(xp.int64, copy=False), c["k"].astype(xp.int64, copy=False)
        u = self._util(c, ctx, be)[2]
        NP = ctx.n_platforms
        pl = wk["key"] % NP
        cell_key = wk["key"] // NP
        nc = int(ck.shape[0])
        if nc:
            pos = xp.searchsorted(ck, cell_key)
            posc = xp.clip(pos, 0, nc - 1)
            found = (pos < nc) & (ck[posc] == cell_key)
            uu = xp.where(found, u[posc], xp.nan)
        else:
            posc = xp.zeros(int(cell_key.shape[0]), xp.int64)
            found = xp.zeros(int(cell_key.shape[0]), dtype=bool)
            uu = xp.full(int(cell_key.shape[0]), xp.nan)
        use = found & xp.isfinite(uu)
        n = wk["n"].astype(xp.int64, copy=False)
        counts = dict.fromkeys(COUNTERS, 0)
        counts.update(no_machine_cell=int(n[~found].sum()), unknown_util=int(n[found & ~use].sum()),
                      regression_used=int(n[use].sum()),
                      unknown_platform=int(n[use & (pl == ctx.unknown_platform)].sum()))
        stats = np.array([0, nc, int(xp.isnan(u).sum())], np.int64)
        # a machine-cell's windows share util and k: each (cell, platform) is one point at its
        # weighted mean CPI, with the within-cell CPI spread added to the CPI variance
        pr, nu, W, S, Q = pl[use], n[use], wk["W"][use], wk["S"][use], wk["Q"][use]
        ur, kr = uu[use], k[posc[use]]
        ybar = S / W
        x = xp.empty((int(pr.shape[0]), 3))
        x[:, 0], x[:, 1], x[:, 2] = ybar, ur, kr - 1.0
        uniq, inv, G = _dense_groups(xp, pr, NP, xp.arange(NP))
        m = be.ops.grouped_comoments(x, xp.ascontiguousarray(W), inv, G)
        C = m.C.copy()
        C[:, 0, 0] += bincount(xp, inv, weights=xp.maximum(Q - S * ybar, 0.0), minlength=G)
        host = be.to_host
        r = {"r_key": host(uniq).astype(np.int64), "r_n": host(bincount(xp, inv, weights=nu, minlength=G)).round().astype(np.int64),
             "r_W": host(m.W), "r_mean": host(m.mean), "r_C": host(C)}
        # binned CPI vs util and vs k, per platform
        ub = xp.clip(xp.floor(ur / UTIL_BIN), 0, UTIL_BINS - 1).astype(xp.int64)
        kb = xp.clip(kr, 0, K_BINS - 1).astype(xp.int64)
        bkey = xp.concatenate([((pr * 2) << _BIN_BITS) | ub, ((pr * 2 + 1) << _BIN_BITS) | kb])
        bu, binv = xp.unique(bkey, return_inverse=True)
        binv = binv.reshape(-1)
        sums = {"cpu_seconds": xp.concatenate([W, W]), "wcpi": xp.concatenate([S, S]), "n": xp.concatenate([nu, nu])}
        b = {"key": host(bu).astype(np.int64),
             **{f: host(bincount(xp, binv, weights=v, minlength=int(bu.shape[0]))) for f, v in sums.items()}}
        b["n"] = b["n"].round().astype(np.int64)
        return {}, {"r": r, "b": b, "counts": np.array([counts[c] for c in COUNTERS], np.int64), "stats": stats}

    def finalize_parted(self, rest: dict[str, Any], ctx: CpiContext, tables: dict[str, Any],
                        extras: list[dict[str, Any]]) -> dict[str, pd.DataFrame]:
        p = dict(rest)
        r = _moments_fields("r_", 3)
        b = self._empty_bins()
        for e in extras:  # in shard order: the same result however the shards ran
            r = _merge_keyed_moments(r, e["r"], "r_")
            b = merge_keyed(b, e["b"])
            p["counts"] = p["counts"] + e["counts"]
            p["stats"] = p["stats"] + e["stats"]
        p.update(r)
        p.update({"b_" + f: v for f, v in b.items()})
        return self._finalize(p, ctx)

    @staticmethod
    def _empty_bins() -> dict[str, np.ndarray]:
        return {"key": np.zeros(0, np.int64), "cpu_seconds": np.zeros(0), "wcpi": np.zeros(0), "n": np.zeros(0, np.int64)}

    # ---------------------------------------------------------------- finalize
    def _group_labels(self, key: np.ndarray, ctx: CpiContext) -> pd.Series:
        if self.by in ("machine", "collection"):
            return pd.Series(key.astype(np.int64), dtype=np.int64)
        if self.by == "platform":
            names = np.array([*ctx.platforms, None], dtype=object)
        elif self.by == "tier":
            names = np.array(ctx.tier_names, dtype=object)
        else:
            names = np.array(["cell"], dtype=object)
        return pd.Series(names[key] if key.size else np.array([], dtype=object), dtype=object)

    def _groups(self, p: dict[str, np.ndarray], ctx: CpiContext) -> pd.DataFrame:
        key = np.asarray(p["g_key"], dtype=np.int64)
        m = _moments_of(p, "g_")
        s = cpi_mai_summary(m)
        G = key.shape[0]
        df = pd.DataFrame({_BY_COLUMN[self.by]: self._group_labels(key, ctx)})
        for c in ("n", "cpu_seconds", "cpi_mean", "cpi_std", "mai_mean", "mai_std", "pearson_r"):
            df[c] = s[c]
        if self.spearman == "grid":
            rho, bound = spearman_from_grid(p["g_grid"]) if G else (np.zeros(0), np.zeros(0))
        elif self.spearman == "exact":
            grp = np.searchsorted(key, p["s_key"]) if G else np.zeros(0, np.int64)
            rho, _ = spearman_exact(p["s_x"], p["s_y"], grp, G, w=p["s_w"])
            bound = np.where(np.isnan(rho), np.nan, 0.0)
        else:
            rho = bound = np.full(G, np.nan)
        df["spearman_rho"] = np.asarray(rho, dtype=np.float64)
        df["spearman_bound"] = np.asarray(bound, dtype=np.float64)
        df["spearman_method"] = pd.Series([self.spearman] * G, dtype=object)
        return df

    def _fit_rows(self, fit_name: str, plat: list[Any], m: Moments, extra_groups: int = 0) -> list[dict[str, Any]]:
        fit = wls_from_moments(m, 0, [1, 2])
        if extra_groups:
            # platform intercepts: P - 1 more parameters than the pooled design
            dof = fit.dof - extra_groups
            with np.errstate(invalid="ignore", divide="ignore"):
                f = np.where(dof > 0, fit.dof / np.where(dof > 0, dof, 1.0), np.nan)
                adj = 1.0 - (1.0 - fit.r2) * (fit.n - 1.0 - extra_groups) / np.where(dof > 0, dof, np.nan)
            fit = dataclasses.replace(fit, dof=dof, sigma2=fit.sigma2 * f, cov=fit.cov * f[:, None, None],
                                      se=fit.se * np.sqrt(f)[:, None], adj_r2=adj)
        eff = {ref: borg_effects(fit, util=0, tasks=1, reference=ref) for ref in ("mean", "intercept")}
        rows = []
        for g in range(fit.coef.shape[0]):
            row = {"fit": fit_name, "platform_id": plat[g], "primary": False,
                   "y": "cpi / platform mean cpi" if fit_name == "platform-fixed-effects" else "cpi",
                   "n": int(fit.n[g]), "cpu_seconds": float(fit.W[g]),
                   "intercept": fit.coef[g, 0], "intercept_se": fit.se[g, 0],
                   "b_util": fit.coef[g, 1], "b_util_se": fit.se[g, 1],
                   "b_ntasks": fit.coef[g, 2], "b_ntasks_se": fit.se[g, 2],
                   "r2": fit.r2[g], "adj_r2": fit.adj_r2[g], "dof": float(fit.dof[g]),
                   "cpi_mean": fit.y_mean[g], "util_mean": fit.x_mean[g, 0], "ntasks_mean": fit.x_mean[g, 1]}
            for ref, e in eff.items():
                row[f"pct_per_task_vs_{ref}"] = e["pct_per_task"][g]
                row[f"pct_per_task_vs_{ref}_se"] = e["pct_per_task_se"][g]
                row[f"pct_per_10pct_util_vs_{ref}"] = e["pct_per_util_step"][g]
                row[f"pct_per_10pct_util_vs_{ref}_se"] = e["pct_per_util_step_se"][g]
            rows.append(row)
        return rows

    def _regression(self, p: dict[str, np.ndarray], ctx: CpiContext) -> pd.DataFrame:
        key = np.asarray(p["r_key"], dtype=np.int64)
        names = [*ctx.platforms, None]
        per = _moments_of(p, "r_")
        rows: list[dict[str, Any]] = []
        if key.shape[0]:
            pooled = regroup_moments(per, np.zeros(key.shape[0], np.int64), 1)
            rows += self._fit_rows("pooled", [None], pooled)
            # fixed effects (multiplicative): CPI / its platform's weighted mean, within co-moments pooled
            W = per.W
            ym = per.mean[:, 0]
            s = np.where(ym > 0, 1.0 / np.where(ym > 0, ym, 1.0), np.nan)
            mean = per.mean.copy()
            mean[:, 0] = 1.0
            C = per.C.copy()
            C[:, 0, :] *= s[:, None]
            C[:, :, 0] *= s[:, None]
            ok = np.isfinite(s) & (W > 0)
            if ok.any():
                Wt = W[ok].sum()
                fe = Moments(np.array([per.n[ok].sum()], np.int64), np.array([Wt]),
                             ((W[ok, None] * mean[ok]).sum(axis=0) / Wt)[None, :], C[ok].sum(axis=0)[None])
                rows += self._fit_rows("platform-fixed-effects", [None], fe, extra_groups=int(ok.sum()) - 1)
            rows += self._fit_rows("per-platform", [names[k] for k in key], per)
        df = pd.DataFrame(rows, columns=_REGRESSION_COLUMNS)
        if len(df):
            df["primary"] = df["fit"] == self.regression
        df["primary"] = df["primary"].astype(bool)
        df["n"] = df["n"].astype(np.int64)
        for c in _REGRESSION_COLUMNS:
            if c not in ("fit", "platform_id", "primary", "y", "n"):
                df[c] = df[c].astype(np.float64)
        for c in ("fit", "platform_id", "y"):
            df[c] = df[c].astype(object)
        return df

    def _binned(self, p: dict[str, np.ndarray], ctx: CpiContext) -> pd.DataFrame:
        key = np.asarray(p["b_key"], dtype=np.int64)
        pv = key >> _BIN_BITS
        b = key & ((1 << _BIN_BITS) - 1)
        var = np.where(pv % 2 == 0, "util", "k").astype(object)
        names = np.array([*ctx.platforms, None], dtype=object)
        is_u = pv % 2 == 0
        lo = np.where(is_u, b * UTIL_BIN, b).astype(np.float64)
        hi = np.where(is_u, np.where(b == UTIL_BINS - 1, np.inf, (b + 1) * UTIL_BIN),
                      np.where(b == K_BINS - 1, np.inf, b + 1)).astype(np.float64)
        W = np.asarray(p["b_cpu_seconds"], dtype=np.float64)
        with np.errstate(invalid="ignore", divide="ignore"):
            cm = np.where(W > 0, np.asarray(p["b_wcpi"]) / np.where(W > 0, W, 1.0), np.nan)
        df = pd.DataFrame({"variable": pd.Series(var, dtype=object),
                           "platform_id": pd.Series(names[pv // 2] if key.size else np.array([], dtype=object),
                                                    dtype=object),
                           "bin_lo": lo, "bin_hi": hi, "n": np.asarray(p["b_n"], dtype=np.int64),
                           "cpu_seconds": W, "cpi_mean": cm})
        return df

    #: its keyed machine-cell sums (~5 B a window) go to the regression shards, which run on the
    #: device under a gpu study (:meth:`finalize_shard`): left there, they are not copied both ways
    device_partial = True

    def finalize(self, partial: dict[str, Any], ctx: CpiContext) -> dict[str, pd.DataFrame]:
        if self.sharded:  # the shards' reduction, in memory (the keyed sums where they are: device_partial)
            return finalize_in_memory(self, partial, ctx)
        return self._finalize({**_moments_fields("r_", 3), **{"b_" + f: v for f, v in self._empty_bins().items()},
                               **to_host(partial)}, ctx)

    def _finalize(self, partial: dict[str, np.ndarray], ctx: CpiContext) -> dict[str, pd.DataFrame]:
        p = {k: np.asarray(v) for k, v in partial.items() if k != "backend"}
        counts = dict(zip(COUNTERS, (int(x) for x in p["counts"]), strict=True))
        groups = self._groups(p, ctx)
        regression = self._regression(p, ctx)
        binned = self._binned(p, ctx)
        reasons = [("filter", r) for r in ("missing", "cpu_seconds", "cpi_range", "mai_range")] + [("filter", "kept")]
        if self.regression != "none":
            reasons += [("regression", "no_capacity"), ("regression", "no_machine_cell"),
                        ("regression", "unknown_util"), ("regression", "regression_used")]
        flt = pd.DataFrame({"stage": pd.Series([s for s, _ in reasons], dtype=object),
                            "reason": pd.Series([r for _, r in reasons], dtype=object),
                            "windows": np.array([counts[r] for _, r in reasons], dtype=np.int64)})
        flt["fraction"] = flt["windows"] / counts["total"] if counts["total"] else np.nan
        if counts["total"] == 0:
            flt = flt.iloc[0:0].reset_index(drop=True)
        f = ctx.filter
        info = pd.DataFrame([{
            "analysis": self.name, "by": self.by, "regression": self.regression, "spearman": self.spearman,
            "spearman_bins": self.spearman_bins if self.spearman == "grid" else 0,
            "cpi_bins": int(ctx.cpi_cuts.shape[0] + 1) if self.spearman == "grid" else 0,
            "mai_bins": int(ctx.mai_cuts.shape[0] + 1) if self.spearman == "grid" else 0,
            "cpi_min": f.cpi_min, "cpi_max": f.cpi_max, "mai_min": f.mai_min, "mai_max": f.mai_max,
            "min_cpu_seconds": f.min_cpu_seconds,
            "tier_map": ctx.tier_map.name if ctx.tier_map else None,
            "platforms": ",".join(ctx.platforms),
            "trace_window_start_us": ctx.trace_window_us[0] if ctx.trace_window_us else None,
            "trace_window_end_us": ctx.trace_window_us[1] if ctx.trace_window_us else None,
            **ctx.info, "machine_cells": int(p["stats"][1]), "machine_cells_unknown_util": int(p["stats"][2]),
            "bad_cell_rows": int(p["stats"][0]), **{f"windows_{k}": v for k, v in counts.items()},
        }])
        return {"groups": groups, "regression": regression, "binned": binned, "filter": flt, "info": info}

    def summary(self, result: dict[str, pd.DataFrame]) -> str:
        info = result["info"].iloc[0]
        lines = [f"{self.label}: {info['windows_kept']} of {info['windows_total']} windows pass the CPI/MAI filter "
                 f"(missing {info['windows_missing']}, low CPU time {info['windows_cpu_seconds']}, "
                 f"CPI range {info['windows_cpi_range']}, MAI range {info['windows_mai_range']}); "
                 + ("regression not computed (regression='none'): no regression or binned rows"
                    if self.regression == "none" else
                    f"regression uses {info['windows_regression_used']} (no capacity {info['windows_no_capacity']}, "
                    f"no machine-cell {info['windows_no_machine_cell']}, unknown util {info['windows_unknown_util']})")]
        g = result["groups"]
        if len(g):
            col = g.columns[0]
            shown = min(len(g), _SUMMARY_GROUPS)
            lines.append(f"  {len(g)} group(s) by {self.by}" + (
                f", the {shown} with the most CPU time:" if shown < len(g) else ":"))
            for _, r in g.sort_values("cpu_seconds", ascending=False).head(shown).iterrows():
                lines.append(f"    {str(r[col])[:22]:>22}: n={r['n']} CPI {fmt(r['cpi_mean'], '.3f')} "
                             f"(sd {fmt(r['cpi_std'], '.3f')}) MAI {fmt(r['mai_mean'])} r={fmt(r['pearson_r'], '.3f')} "
                             f"rho={fmt(r['spearman_rho'], '.3f')} [{r['spearman_method']}]")
            if shown < len(g):
                lines.append(f"    ... {len(g) - shown} more (every group is in the groups table)")
        reg = result["regression"]
        for _, r in reg.iterrows():
            tag = r["fit"] + ("" if pd.isna(r["platform_id"]) else f"[{str(r['platform_id'])[:12]}]")
            star = "*" if r["primary"] else " "
            lines.append(f"  {star}{tag:>36}: {fmt(r['pct_per_task_vs_intercept'], '+.3f', unit='%')} CPI per extra"
                         f" task (±{fmt(r['pct_per_task_vs_intercept_se'], '.3f')}), "
                         f"{fmt(r['pct_per_10pct_util_vs_intercept'], '+.2f', unit='%')} "
                         f"per +10% util (±{fmt(r['pct_per_10pct_util_vs_intercept_se'], '.2f')}) vs intercept; "
                         f"vs mean {fmt(r['pct_per_task_vs_mean'], '+.3f', unit='%')} / "
                         f"{fmt(r['pct_per_10pct_util_vs_mean'], '+.2f', unit='%')}; "
                         f"R²={fmt(r['r2'], '.3f')} n={r['n']}")
        if len(reg):
            lines.append(f"  (* = primary fit: regression={self.regression!r})")
        return "\n".join(lines)


#: Groups the summary lists (those with the most CPU time; the rest are counted).
_SUMMARY_GROUPS = 8

_REGRESSION_COLUMNS = [
    "fit", "platform_id", "primary", "y", "n", "cpu_seconds", "intercept", "intercept_se", "b_util", "b_util_se",
    "b_ntasks", "b_ntasks_se", "r2", "adj_r2", "dof", "cpi_mean", "util_mean", "ntasks_mean",
    "pct_per_task_vs_mean", "pct_per_task_vs_mean_se", "pct_per_10pct_util_vs_mean", "pct_per_10pct_util_vs_mean_se",
    "pct_per_task_vs_intercept", "pct_per_task_vs_intercept_se", "pct_per_10pct_util_vs_intercept",
    "pct_per_10pct_util_vs_intercept_se",
]
