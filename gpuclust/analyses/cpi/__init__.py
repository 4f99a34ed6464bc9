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
(``spearman="grid"``, :class:`gpuclust.analyses._machine_cells.CpiHistograms`).  Details and the reasoning: ``docs/analyses/cpi.md``.

The package: the analysis (here), :mod:`.context` (constants, :class:`CpiContext` and its
builders), :mod:`.partial_steps` (the steps of :meth:`Cpi.partial`), :mod:`.keyed` (keyed co-moment
partials), :mod:`.shards` (the regression's shard reduction), :mod:`.tables` (result tables,
summary) and the statistics only ``cpi`` uses: :mod:`.correlation` (moments, Pearson, exact
Spearman), :mod:`.regression` (WLS, Borg effects), :mod:`.binning` (the mergeable Spearman grid).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import numpy as np

from gpuclust._lazy import pandas as pd
from gpuclust.analyses._extent import max_finite
from gpuclust.analyses._lookup import EVENT_COLUMNS, InstanceLookup, id_index, tier_lookup
from gpuclust.analyses._machine_cells import (
    CELL_US,
    CpiHistograms,
    cpu_seconds,
    filter_rows,
    grid_cuts,
    hist_edges,
)
from gpuclust.analyses.base import Analysis, is_null_int, to_host
from gpuclust.analyses.cpi.context import (
    _STATS,
    BY,
    COUNTERS,
    KEYED,
    REGRESSIONS,
    SHARD_KEYS,
    SPEARMAN,
    CpiContext,
    _capacities,
    _cell_span,
    _platform_lookup,
    _trace_window,
)
from gpuclust.analyses.cpi.keyed import GROUP_FIELDS, _merge_keyed_moments, _moments_fields, empty_groups, merge_groups
from gpuclust.analyses.cpi.partial_steps import (
    _counts_array,
    _group_keys,
    _group_moments,
    _regression_sums,
    _spearman_partial,
)
from gpuclust.analyses.cpi.shards import cell_util, shard_sums
from gpuclust.analyses.cpi.tables import result_tables, summary_text
from gpuclust.analyses.grouping import bucket_index
from gpuclust.analyses.kinds import Concat, Even, Fields, Flat, Keyed, Label, Merged, Sum
from gpuclust.analyses.options import Relation, option, tier_map_option
from gpuclust.backends import finalize_backend
from gpuclust.keys import pack
from gpuclust.parted import finalize_in_memory
from gpuclust.partials import keyed_reduce, merge_keyed
from gpuclust.stats import CpiFilter
from gpuclust.tables import column
from gpuclust.tiers import resolve_tier_map

__all__ = ["BY", "COUNTERS", "Cpi", "CpiContext", "REGRESSIONS", "SPEARMAN"]


def _cells(ctx: CpiContext) -> int:
    """Keys per capacity machine of the (machine, cell) sums ``c``."""
    return ctx.cell_span


def _cell_platforms(ctx: CpiContext) -> int:
    """Keys per capacity machine of the (machine, cell, platform) sums ``w``."""
    return ctx.cell_span * ctx.n_platforms


def _cap_machines(ctx: CpiContext) -> int:
    """Capacity machines: the coordinate the regression's sums are sharded by."""
    return int(ctx.cap_ids.shape[0])


def _cell_keys(ctx: CpiContext) -> int:
    """Keys of the (machine, cell) sums: capacity machines x cells."""
    return int(ctx.cap_ids.shape[0]) * _cells(ctx)


def _cell_platform_keys(ctx: CpiContext) -> int:
    """Keys of the (machine, cell, platform) sums: capacity machines x cells x platforms."""
    return int(ctx.cap_ids.shape[0]) * _cell_platforms(ctx)


@dataclass(frozen=True)
class Cpi(Analysis):
    """CPI/MAI per group and the Borg §5.2 CPI interference regression.

    The default fit, ``platform-fixed-effects``, recovers the synthetic cell's planted slopes;
    every fit is reported in ``regression``.  ``regression=none`` skips the regression: no
    (machine, cell) sums, empty ``regression`` and ``binned`` tables, no ``regression`` stage in
    ``filter`` (what SQL expresses: per-group weighted moments and Pearson r).  ``spearman=exact``
    carries the filtered rows (memory O(rows)); the grid cuts at CPI/MAI row-count quantiles from
    the first pass.  ``cpi_min`` ... ``min_cpu_seconds`` are the plausibility filter
    (:class:`gpuclust.stats.CpiFilter`, same defaults).

    Examples
    --------
    >>> Cpi(by="machine").label
    'cpi[by=machine]'
    """

    by: str = option("platform", "grouping of the groups table (cell = the whole dataset)", choices=BY)
    regression: str = option(
        "platform-fixed-effects",
        "primary fit (all fits are reported): multiplicative platform fixed effects, "
        "one fit per platform, pooled over platforms, or none (no regression)",
        choices=REGRESSIONS,
    )
    spearman: str = option(
        "grid", "grid = mergeable estimate with an error bound; exact = carries the rows; none", choices=SPEARMAN
    )
    spearman_bins: int = option(32, "Spearman grid bins per axis", ge=2, le=1024)
    cpi_min: float = option(CpiFilter.cpi_min, "CPI filter: exclusive lower bound")
    cpi_max: float = option(CpiFilter.cpi_max, "CPI filter: inclusive upper bound")
    mai_min: float = option(CpiFilter.mai_min, "MAI filter: inclusive lower bound")
    mai_max: float = option(CpiFilter.mai_max, "MAI filter: inclusive upper bound")
    min_cpu_seconds: float = option(
        CpiFilter.min_cpu_seconds, "minimum CPU-seconds (avg_cpu x duration) of a window", ge=0
    )
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
    table_uses = {
        "machine_events": "required for by=platform; the regression's capacities",
        "instance_events": "by=tier",
    }

    option_relations = (
        Relation(("cpi_min", "cpi_max"), lambda lo, hi: lo < hi, "cpi_min < cpi_max"),
        Relation(("mai_min", "mai_max"), lambda lo, hi: lo <= hi, "mai_min <= mai_max"),
    )

    def needed_tables(self) -> tuple[dict[str, str], dict[str, str]]:
        """instance_usage always; machine_events for ``by=platform`` (the groups are its
        platforms: required) and for the regression (machine capacities: without them it is
        empty); instance_events for ``by=tier`` only."""
        required, optional = {"instance_usage": ""}, {}
        if self.by == "platform":
            required["machine_events"] = (
                "by=platform: the machines' platforms; by=cell, machine, collection, tier do not"
            )
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
            luts[var + "_lut"] = (
                np.concatenate([[0], np.searchsorted(cuts, edges[var], side="right")]).astype(np.int64)
                if ok
                else np.zeros(0, np.int64)
            )
        span = 0
        if self.regression != "none" and cap_ids.shape[0]:
            span = _cell_span(
                max_finite(source, "instance_usage", "start_time"), int(cap_ids.shape[0]), len(plat["platforms"]) + 1
            )
        tm = resolve_tier_map(self.tier_map, source) if self.by == "tier" else None
        cpos = np.searchsorted(cap_ids, plat["pm_ids"]) if cap_ids.shape[0] else np.zeros(0, np.int64)
        cposc = np.clip(cpos, 0, max(cap_ids.shape[0] - 1, 0))
        pm_cap = (
            np.where(cap_ids[cposc] == plat["pm_ids"], cpos, -1)
            if cap_ids.shape[0]
            else np.full(plat["pm_ids"].shape[0], -1)
        ).astype(np.int64)
        info = {"machines": int(plat["pm_ids"].shape[0]), "machines_with_capacity": int(cap_ids.shape[0])}
        return CpiContext(
            filter=flt,
            tier_map=tm,
            **plat,
            cap_ids=cap_ids,
            cap_val=cap_val,
            cell_span=span,
            pm_cap=pm_cap,
            cpi_cuts=cpi_cuts,
            mai_cuts=mai_cuts,
            cpi_edges=edges["cpi"],
            mai_edges=edges["mai"],
            cpi_lut=luts["cpi_lut"],
            mai_lut=luts["mai_lut"],
            lookup=InstanceLookup.empty(),
            trace_window_us=window,
            info=info,
        )

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
        return dataclasses.replace(
            ctx,
            lookup=tier_lookup(
                side["instance_events"], ctx.tier_map, top_level_only=False, unmatched=n, what="cpi tier lookup"
            ),
        )

    # ---------------------------------------------------------------- partial / merge
    @staticmethod
    def _machine_index(backend: Any, ctx: CpiContext, mid: Any) -> tuple[Any, Any] | None:
        """Per row: index into ``ctx.pm_ids`` (0 where absent) and whether the machine is there."""
        if ctx.pm_ids.shape[0] == 0 or int(mid.shape[0]) == 0:
            return None
        return id_index(backend, ctx.pm_ids, mid)

    def _platform(self, backend: Any, ctx: CpiContext, mid: Any, start: Any, mi: tuple[Any, Any] | None = None) -> Any:
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

    def partial(self, cols: dict[str, Any], ctx: CpiContext, backend: Any) -> dict[str, Any]:
        xp = backend.xp
        idx, y, z, w, fc = filter_rows(xp, ctx.filter, cols)
        counts = dict.fromkeys(COUNTERS, 0)
        counts.update(fc)
        out = self.kinds.empty(backend, on_backend=True)
        regress = self.regression != "none"
        # the regression's machine-cell sums run over every top-level row, kept or not
        mall = self._cell_sums(cols, ctx, backend, out) if regress else None
        if int(idx.shape[0]) == 0:
            out["counts"] = _counts_array(xp, counts)
            return out
        mid = cols["machine_id"][idx] if "machine_id" in cols else None
        st = cols["start_time"][idx] if regress else None
        mi: tuple[Any, Any] | None
        if mall is not None:
            mi = (mall[0][idx], mall[1][idx])
        else:
            mi = self._machine_index(backend, ctx, mid) if mid is not None else None
        plat = (
            self._platform(backend, ctx, mid, st if regress else cols["start_time"][idx], mi)
            if (regress or self.by == "platform")
            else None
        )
        # ---- per-group CPI/MAI moments (keyed) and the Spearman partial
        gkey, groups = _group_keys(backend, ctx, self.by, cols, idx, mid, mi, plat)
        g, inv, G = _group_moments(backend, gkey, y, z, w, groups)
        out.update(g)
        _spearman_partial(backend, ctx, self.spearman, self.spearman_bins, out, gkey, y, z, w, inv, G)
        if not regress:
            out["counts"] = _counts_array(xp, counts)
            return out
        # ---- regression: keyed sums of the kept windows per (machine, cell, platform); k and util
        # are constant inside a machine-cell, so the shards need no per-window join
        assert st is not None and plat is not None  # both computed when regress
        _regression_sums(backend, ctx, out, counts, mall, idx, st, plat, y, w)
        return out

    def _cell_sums(
        self, cols: dict[str, Any], ctx: CpiContext, backend: Any, out: dict[str, Any]
    ) -> tuple[Any, Any, Any, Any] | None:
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
            key = pack(cp[ui].astype(xp.int64), bucket_index(start[ui], CELL_US), ctx.cell_span, inplace=True)
            out.update(
                {
                    "c_" + k: v
                    for k, v in keyed_reduce(
                        backend, key, {"cpu_seconds": cs}, {"k": None, "bad": bad.astype(xp.int64)}
                    ).items()
                }
            )
        return m2, known, cp, has_cap

    @property
    def kinds(self) -> Fields:
        """The per-group moments and Spearman grid (``g_*``, :func:`merge_groups`: merged where
        they are), the carried rows (``s_*``, concatenated), the regression's keyed (machine, cell)
        and (machine, cell, platform) sums (``c_*``, ``w_*``: sharded by capacity machine when the
        regression runs) and the counters.  A split leaves the per-group fields where they are
        (the grid: groups x bins x bins, 8 KiB a machine under ``by=machine``): a gpu run merges
        them on the device, and its finalize reduces the grid there to two values a group
        (:func:`~gpuclust.analyses.cpi.tables.grid_spearman`)."""
        per = {"c": _cells, "w": _cell_platforms} if self.regression != "none" else {}
        dense = {"c": _cell_keys, "w": _cell_platform_keys} if per else {}
        keyed = {
            pre: Flat(
                Keyed(
                    {f: np.int64 if f in ("k", "bad", "n") else np.float64 for f in fields},
                    per=per.get(pre),
                    dense=dense.get(pre),
                    dense_host=False,  # on the host they are spilled (they grow with the cell)
                ),
                pre + "_",
                ("key", *fields),
            )
            for pre, fields in KEYED.items()
        }
        bins = self.spearman_bins if self.spearman == "grid" else 0
        return Fields(
            {
                "g": Flat(
                    Merged(merge_groups, empty=lambda xp: empty_groups(xp, bins), device=True), "g_", GROUP_FIELDS
                ),
                **{k: Concat(np.int64 if k == "s_key" else np.float64) for k in ("s_key", "s_x", "s_y", "s_w")},
                **keyed,
                "counts": Sum((len(COUNTERS),), np.int64),
                "stats": Sum((len(_STATS),), np.int64),
                "backend": Label(),
            },
            stays=tuple("g_" + f for f in GROUP_FIELDS),
            shard_by=Even(_cap_machines, _cell_platforms, SHARD_KEYS) if per else None,
        )

    # ---------------------------------------------------------------- finalize (regression)
    def machine_cells(self, c: dict[str, np.ndarray], ctx: CpiContext) -> pd.DataFrame:
        """The machine-cell table of merged ``c`` sums: ``machine_id``, ``cell``, ``k``, ``util``."""
        m, cell, u = cell_util(c, ctx, finalize_backend("cpu"))
        return pd.DataFrame({"machine_id": ctx.cap_ids[m], "cell": cell, "k": np.asarray(c["k"], np.int64), "util": u})

    def finalize_shard(
        self, keyed: dict[str, dict[str, np.ndarray]], rest: dict[str, Any], ctx: CpiContext, lo: int, hi: int
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        """Machines ``[lo, hi)``: their machine-cells' ``k`` and ``util``, joined to the kept
        windows' (machine, cell, platform) sums: per-platform co-moments of (CPI, util, ntasks)
        and the binned sums, with the regression counters (no parted tables).  The join and the
        sums run on the backend the partials were computed on (:func:`finalize_backend`: the
        device under ``backend="gpu"``); the extra comes back to the host."""
        return shard_sums(keyed, rest, ctx, lo, hi)

    def finalize_parted(
        self, rest: dict[str, Any], ctx: CpiContext, tables: dict[str, Any], extras: list[dict[str, Any]]
    ) -> dict[str, pd.DataFrame]:
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
        return result_tables(self, p, ctx)

    @staticmethod
    def _empty_bins() -> dict[str, np.ndarray]:
        return {
            "key": np.zeros(0, np.int64),
            "cpu_seconds": np.zeros(0),
            "wcpi": np.zeros(0),
            "n": np.zeros(0, np.int64),
        }

    #: its keyed machine-cell sums (~5 B a window) go to the regression shards, which run on the
    #: device under a gpu study (:meth:`finalize_shard`): left there, they are not copied both ways
    device_partial = True

    def finalize(self, partial: dict[str, Any], ctx: CpiContext) -> dict[str, pd.DataFrame]:
        if self.sharded:  # the shards' reduction, in memory (the keyed sums where they are: device_partial)
            return finalize_in_memory(self, partial, ctx)
        rest = {k: v if k == "g_grid" else to_host(v) for k, v in partial.items()}  # the grid as in split
        return result_tables(
            self, {**_moments_fields("r_", 3), **{"b_" + f: v for f, v in self._empty_bins().items()}, **rest}, ctx
        )

    def summary(self, result: dict[str, pd.DataFrame]) -> str:
        return summary_text(self, result)
