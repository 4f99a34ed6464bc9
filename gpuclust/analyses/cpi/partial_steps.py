"""The steps of :meth:`gpuclust.analyses.cpi.Cpi.partial` on one partition's kept windows (NumPy or
CuPy arrays on the backend): the group keys of option ``by``, the per-group co-moments of CPI and
MAI, the Spearman partial and the regression's keyed sums per (machine, cell, platform)."""

from __future__ import annotations

from typing import Any

import numpy as np

from gpuclust.analyses._machine_cells import CELL_US
from gpuclust.analyses.cpi.binning import spearman_grid_partial
from gpuclust.analyses.cpi.context import COUNTERS, CpiContext
from gpuclust.analyses.cpi.keyed import _dense_groups, _keyed_comoments
from gpuclust.analyses.grouping import bucket_index
from gpuclust.keys import pack
from gpuclust.partials import keyed_reduce, log_bins

_Groups = tuple[Any, Any, int]


def _counts_array(xp: Any, counts: dict[str, int]) -> Any:
    """The counters, in :data:`COUNTERS` order, as an int64 array on the backend."""
    return xp.asarray(np.array([counts[c] for c in COUNTERS], np.int64))


def _group_keys(
    backend: Any,
    ctx: CpiContext,
    by: str,
    cols: dict[str, Any],
    idx: Any,
    mid: Any,
    mi: tuple[Any, Any] | None,
    plat: Any,
) -> tuple[Any, _Groups | None]:
    """Per kept row its group key for ``by``, and the groups (sorted keys, inverse, count) where
    they are known without a sort (``None``: the keyed co-moments sort)."""
    xp = backend.xp
    groups = None
    if by == "machine":
        assert mid is not None  # by="machine" reads machine_id
        gkey = mid.astype(xp.int64)
        if mi is not None:
            groups = _machine_groups(backend, ctx, gkey, mi)
    elif by == "collection":
        gkey = cols["collection_id"][idx].astype(xp.int64)
    elif by == "platform":
        assert plat is not None  # computed for by="platform"
        gkey = plat.astype(xp.int64)
        groups = _dense_groups(xp, gkey, ctx.unknown_platform + 1, xp.arange(ctx.unknown_platform + 1))
    elif by == "tier":
        gkey = _row_tiers(backend, ctx, cols["collection_id"][idx], cols["instance_index"][idx], mid).astype(xp.int64)
        nt = len(ctx.tier_names)
        groups = _dense_groups(xp, gkey, nt, xp.arange(nt))
    else:
        gkey = xp.zeros(int(idx.shape[0]), dtype=xp.int64)
        groups = _dense_groups(xp, gkey, 1, xp.arange(1))
    return gkey, groups


def _machine_groups(backend: Any, ctx: CpiContext, gkey: Any, mi: tuple[Any, Any]) -> _Groups:
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


def _row_tiers(backend: Any, ctx: CpiContext, c: Any, i: Any, m: Any) -> Any:
    """Tier code per row from its instance's priority (the last tier, unknown, when not found)."""
    found, code = ctx.lookup.find(backend, c, i, m)
    return backend.xp.where(found, code, len(ctx.tier_names) - 1).astype(backend.xp.int32)


def _group_moments(backend: Any, gkey: Any, y: Any, z: Any, w: Any, groups: _Groups | None) -> tuple[Any, Any, int]:
    """Weighted co-moments of (CPI ``y``, MAI ``z``) per group as ``g_*`` fields, the rows' group
    index and the number of groups."""
    xp = backend.xp
    xg = xp.empty((int(gkey.shape[0]), 2))
    xg[:, 0] = y
    xg[:, 1] = z
    return _keyed_comoments(backend, gkey, xg, w, "g_", groups)


def _spearman_partial(
    backend: Any,
    ctx: CpiContext,
    spearman: str,
    n_bins: int,
    out: dict[str, Any],
    gkey: Any,
    y: Any,
    z: Any,
    w: Any,
    inv: Any,
    G: int,
) -> None:
    """The Spearman partial into ``out``: per group the weight on the grid of CPI x MAI cuts
    (``g_grid``, padded to ``n_bins`` per axis when there are fewer cuts) for ``grid``; an empty
    grid, and for ``exact`` the rows themselves (``s_*``), otherwise."""
    xp = backend.xp
    if spearman != "grid":
        out["g_grid"] = xp.zeros((G, 0, 0))
        if spearman == "exact":
            out.update({"s_key": gkey, "s_x": y, "s_y": z, "s_w": w})
        return
    bins = None
    if ctx.cpi_lut.shape[0] and ctx.mai_lut.shape[0]:
        bins = tuple(
            backend.stage(lut)[log_bins(xp, backend.stage(e), v)]
            for lut, e, v in ((ctx.cpi_lut, ctx.cpi_edges, y), (ctx.mai_lut, ctx.mai_edges, z))
        )
    out["g_grid"] = spearman_grid_partial(
        backend, y, z, inv, G, backend.stage(ctx.cpi_cuts), backend.stage(ctx.mai_cuts), w, bins
    )
    if ctx.cpi_cuts.shape[0] + 1 != n_bins or ctx.mai_cuts.shape[0] + 1 != n_bins:
        grid = xp.zeros((G, n_bins, n_bins))
        hx, hy = ctx.cpi_cuts.shape[0] + 1, ctx.mai_cuts.shape[0] + 1
        grid[:, :hx, :hy] = out["g_grid"]
        out["g_grid"] = grid


def _regression_sums(
    backend: Any,
    ctx: CpiContext,
    out: dict[str, Any],
    counts: dict[str, int],
    mall: tuple[Any, Any, Any, Any] | None,
    idx: Any,
    st: Any,
    plat: Any,
    y: Any,
    w: Any,
) -> None:
    """The counters into ``out`` (with the kept windows on no capacity or outside the machine-cells),
    then the regression's keyed sums of the kept windows per (machine, cell, platform) as ``w_*``:
    weight, weighted CPI and weighted squared CPI."""
    xp = backend.xp
    n_kept = int(idx.shape[0])
    cp, has_cap = (mall[2][idx], mall[3][idx]) if mall is not None else (None, xp.zeros(n_kept, dtype=bool))
    span = ctx.cell_span
    inside = has_cap & (st >= 0) & (st < span * CELL_US)
    ri = xp.nonzero(inside)[0]
    counts["no_capacity"] = n_kept - int(has_cap.sum())
    counts["no_machine_cell"] = int(has_cap.sum()) - int(ri.shape[0])  # the shards add the cells without rows
    out["counts"] = _counts_array(xp, counts)
    if int(ri.shape[0]):
        assert cp is not None  # rows with a capacity come from the machine lookup (mall)
        key = pack(cp[ri].astype(xp.int64), bucket_index(st[ri], CELL_US), span, inplace=True)
        pack(key, plat[ri].astype(xp.int64), ctx.n_platforms, inplace=True)
        wr, yr = w[ri], y[ri]
        wy = wr * yr
        out.update(
            {"w_" + k: v for k, v in keyed_reduce(backend, key, {"W": wr, "S": wy, "Q": wy * yr}, {"n": None}).items()}
        )
