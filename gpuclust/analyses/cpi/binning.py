"""Binned Spearman statistics of the ``cpi`` analysis: the mergeable fixed-grid approximation.

Grid cut points (:func:`quantile_cuts`), the per-partition grid partial on the backend
(:func:`spearman_grid_partial`) and Spearman with a proven error bound from the merged grid
(:func:`spearman_from_grid`, where the grid is: the host or the device).  The exact Spearman is
:func:`gpuclust.analyses.cpi.correlation.spearman_exact`; derivations in ``docs/analyses/cpi-math.md``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["quantile_cuts", "spearman_from_grid", "spearman_grid_partial"]


def quantile_cuts(v: np.ndarray, bins: int, w: np.ndarray | None = None) -> np.ndarray:
    """Interior cut points at the (weighted) ``1/bins, ..., (bins-1)/bins`` quantiles of ``v``.

    Use a sample or a previous pass of the same data; duplicates are dropped (fewer bins).
    """
    v = np.asarray(v, dtype=np.float64)
    ok = np.isfinite(v) if w is None else np.isfinite(v) & np.isfinite(w) & (np.asarray(w) > 0)
    if not ok.any():
        return np.zeros(0)
    q = np.arange(1, bins) / bins
    cuts = np.quantile(
        v[ok], q, weights=None if w is None else np.asarray(w, dtype=np.float64)[ok], method="inverted_cdf"
    )
    return np.unique(cuts)


def spearman_grid_partial(
    backend: Any,
    x: Any,
    y: Any,
    group: Any,
    n_groups: int,
    x_cuts: Any,
    y_cuts: Any,
    w: Any = None,
    bins: tuple[Any, Any] | None = None,
) -> Any:
    """Mergeable Spearman partial: per-group weighted counts on a fixed grid, ``(G, Bx, By)``.

    ``x`` falls in bin ``searchsorted(x_cuts, x, side="right")`` (``Bx = len(x_cuts) + 1`` bins;
    values beyond the extreme cuts join the end bins), likewise ``y``.  Partials of the same cuts
    merge by addition (exact identity, associative and commutative up to float rounding of
    sums).  Uses ``backend.xp`` and ``backend.ops.grouped_sum``; memory is ``G * Bx * By`` doubles,
    so use it for coarse groups (cells, tiers, platforms), not machines.  Row validity as in
    :func:`~gpuclust.analyses.cpi.correlation.spearman_exact`; ``w=None`` counts rows (the
    unweighted Spearman).  ``bins``: the rows' ``(x bin, y bin)`` when the caller has them already
    (they must equal the searchsorted bins above; the ``cpi`` analysis maps its fine histogram bins
    through a lookup table).
    """
    xp = backend.xp
    xc = xp.asarray(x_cuts, dtype=xp.float64)
    yc = xp.asarray(y_cuts, dtype=xp.float64)
    bx, by = int(xc.shape[0]) + 1, int(yc.shape[0]) + 1
    xv = xp.asarray(x, dtype=xp.float64)
    yv = xp.asarray(y, dtype=xp.float64)
    g = xp.asarray(group).astype(xp.int64)
    wv = xp.ones(xv.shape[0], dtype=xp.float64) if w is None else xp.asarray(w, dtype=xp.float64)
    ok = xp.isfinite(xv) & xp.isfinite(yv) & (g >= 0) & (g < n_groups) & xp.isfinite(wv) & (wv > 0)
    xb, yb = (
        bins if bins is not None else (xp.searchsorted(xc, xv, side="right"), xp.searchsorted(yc, yv, side="right"))
    )
    # code = (g * bx + xb) * by + yb, in place in ``g`` (astype made a copy)
    code = g
    code *= bx
    code += xb
    code *= by
    code += yb
    span = int(n_groups) * bx * by
    if not bool(ok.all()):  # invalid rows add nothing (grouped_sum skips codes < 0)
        code = xp.where(ok, code, -1)
        wv = xp.where(ok, wv, 0.0)
    h = backend.ops.grouped_sum(xp.ascontiguousarray(code), xp.ascontiguousarray(wv), n_groups=span)
    return h.reshape(int(n_groups), bx, by)


def spearman_from_grid(h: Any, xp: Any = np) -> tuple[Any, Any]:
    """Spearman from a grid partial: ``(rho, bound)`` per group, with ``|rho - exact| <= bound``.

    ``rho`` is the exact (weighted) Spearman of the *binned* data: every row of a bin takes the
    bin's mid-rank, ties averaged, then weighted Pearson.  When each bin holds a single distinct
    value it equals :func:`~gpuclust.analyses.cpi.correlation.spearman_exact`.  The bound
    (derivation in docs/analyses/cpi-math.md) is
    ``(1 + eps1) / sqrt((1 - Sx)(1 - Sy)) - 1`` with ``Sx = sum px_b^3`` over the marginal bin
    masses and ``eps1 = 12 (T1 + T2 + T3)`` computed from the grid; it is at most about
    ``1.5 (max px + max py)``: in practice ~0.04 with 64 and ~0.01 with 256 equal-mass bins per
    axis on bivariate-normal samples (actual errors are far smaller).  NaN where a marginal has a
    single occupied bin.  ``xp``: the array module of ``h`` (NumPy, or CuPy for a grid on the
    device: the statistics are computed there, two values per group leave it); at least one bin
    per axis.
    """
    h = xp.asarray(h, dtype=xp.float64)
    W = h.sum(axis=(1, 2))
    with np.errstate(invalid="ignore", divide="ignore"):
        f = h / xp.where(W > 0, W, 1.0)[:, None, None]
        px, py = f.sum(axis=2), f.sum(axis=1)
        du = xp.cumsum(px, axis=1) - px / 2.0 - 0.5
        dv = xp.cumsum(py, axis=1) - py / 2.0 - 0.5
        cov = xp.einsum("gb,gbc,gc->g", du, f, dv)
        vu = (px * du * du).sum(axis=1)
        vv = (py * dv * dv).sum(axis=1)
        # the largest bin mass (0 for no mass: masses are >= 0, as ``max(initial=0.0)``; CuPy has no ``initial``)
        pxm, pym = xp.maximum(px.max(axis=1), 0.0), xp.maximum(py.max(axis=1), 0.0)
        ok = (W > 0) & (pxm < 1.0) & (pym < 1.0) & (vu > 0) & (vv > 0)
        rho = xp.where(ok, cov / xp.sqrt(xp.where(ok, vu * vv, 1.0)), xp.nan)
        # |12 cov(U,V) - 12 cov(U~,V~)| <= eps1 (docs/analyses/cpi-math.md): each term uses that the exact
        # mid-rank lies within half a bin mass of its bin's mid-rank and averages to it per bin.
        mv = xp.einsum("gbc,gc->gb", f, dv) / xp.where(px > 0, px, 1.0)  # mean of V~ per x-bin
        mu = xp.einsum("gbc,gb->gc", f, du) / xp.where(py > 0, py, 1.0)  # mean of U~ per y-bin
        t1 = xp.einsum("gb,gbc->g", px / 2.0, f * xp.abs(dv[:, None, :] - mv[:, :, None]))
        t2 = xp.einsum("gc,gbc->g", py / 2.0, f * xp.abs(du[:, :, None] - mu[:, None, :]))
        t3 = xp.einsum("gb,gbc,gc->g", px, f, py) / 4.0
        eps1 = 12.0 * (t1 + t2 + t3)
        s = xp.sqrt(xp.maximum((1.0 - (px**3).sum(axis=1)) * (1.0 - (py**3).sum(axis=1)), 0.0))
        bound = xp.where(ok, (1.0 + eps1) / xp.where(s > 0, s, 1.0) - 1.0, xp.nan)
    return xp.clip(rho, -1.0, 1.0), xp.minimum(bound, 2.0)
