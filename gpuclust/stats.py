"""Finalize math for the ``cpi`` analysis: small per-group matrices on the host (NumPy).

Everything here starts from mergeable partials:

* :class:`~gpuclust.backends.moments_cpu.Moments` (weighted co-moments, from the backend op
  ``grouped_comoments``): weighted means and standard deviations (:func:`weighted_std`), Pearson
  correlation (:func:`pearson_from_moments`), and the weighted least-squares regression with
  standard errors and R^2 (:func:`wls_from_moments`), plus the Borg-paper effects
  (:func:`borg_effects`);
* Spearman rank correlation: exact, from all rows of each group (:func:`spearman_exact`), or the
  mergeable fixed-grid approximation with a proven error bound (:func:`spearman_grid_partial`,
  :func:`spearman_from_grid`);
* the plausibility filter for CPI/MAI windows (:class:`CpiFilter`).

Definitions, derivations and the choice of standard errors are in ``docs/cpi-math.md``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from gpuclust.backends.moments_cpu import grouped_comoments
from gpuclust.partials import Moments

__all__ = [
    "CpiFilter",
    "WlsFit",
    "CONSTANT_RTOL",
    "borg_effects",
    "cpi_mai_summary",
    "pearson_from_moments",
    "quantile_cuts",
    "spearman_exact",
    "spearman_from_grid",
    "spearman_grid_partial",
    "variable_is_constant",
    "weighted_std",
    "wls_from_moments",
]


# --------------------------------------------------------------------------- moments finalize

#: A variable whose weighted spread is below this fraction of its |mean| is treated as constant:
#: rounding in the two passes and in merges leaves co-moments of ~(eps * |mean|)^2 * W on a
#: constant column, which must not turn into a correlation.
CONSTANT_RTOL = 1e-12


def variable_is_constant(m: Moments) -> np.ndarray:
    """``(G, d)`` bool: variable constant in the group (``C_kk <= W (CONSTANT_RTOL |mean_k|)^2``), or group empty."""
    W = np.asarray(m.W)
    diag = np.diagonal(np.asarray(m.C), axis1=1, axis2=2)
    thr = W[:, None] * (CONSTANT_RTOL * np.abs(np.asarray(m.mean))) ** 2
    return (diag <= thr) | (W[:, None] <= 0)


def weighted_std(m: Moments) -> np.ndarray:
    """Weighted standard deviations ``sqrt(C_kk / W)``, shape ``(G, d)``; NaN where ``W = 0``.

    This is the *population* form with weights normalised to sum to one: it does not change when
    every weight is multiplied by a constant (CPU-seconds vs CPU-hours), and it is the sigma the
    Borg paper quotes for CPU-second-weighted CPI.

    Examples
    --------
    >>> import numpy as np
    >>> from gpuclust.backends.moments_cpu import grouped_comoments
    >>> m = grouped_comoments(np.array([[1.0], [3.0]]), np.array([1.0, 3.0]), np.zeros(2, dtype=np.int64), 1)
    >>> weighted_std(m).round(6).tolist()
    [[0.866025]]
    """
    W = np.asarray(m.W)
    diag = np.diagonal(np.asarray(m.C), axis1=1, axis2=2)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(W[:, None] > 0, np.sqrt(np.maximum(diag, 0.0) / W[:, None]), np.nan)


def pearson_from_moments(m: Moments, i: int = 0, j: int = 1) -> np.ndarray:
    """Weighted Pearson correlation of variables ``i`` and ``j`` per group: ``C_ij / sqrt(C_ii C_jj)``.

    NaN where a group is empty or either variable is constant in it (see
    :func:`variable_is_constant`), which includes single-row groups.  Clipped to ``[-1, 1]``.

    Examples
    --------
    >>> import numpy as np
    >>> from gpuclust.backends.moments_cpu import grouped_comoments
    >>> x = np.array([[1.0, 2.0], [2.0, 4.1], [3.0, 5.9]])
    >>> m = grouped_comoments(x, np.ones(3), np.zeros(3, dtype=np.int64), 1)
    >>> pearson_from_moments(m).round(4).tolist()
    [0.999]
    """
    C = np.asarray(m.C)
    cii, cjj, cij = C[:, i, i], C[:, j, j], C[:, i, j]
    const = variable_is_constant(m)
    ok = ~const[:, i] & ~const[:, j]
    with np.errstate(invalid="ignore", divide="ignore"):
        r = np.where(ok, cij / np.sqrt(np.where(ok, cii * cjj, 1.0)), np.nan)
    return np.clip(r, -1.0, 1.0)


def cpi_mai_summary(m: Moments, cpi: int = 0, mai: int = 1) -> dict[str, np.ndarray]:
    """The per-group CPI/MAI columns of the ``cpi`` analysis from merged moments.

    Returns ``n``, ``cpu_seconds`` (``W``), ``cpi_mean``, ``cpi_std``, ``mai_mean``, ``mai_std``
    (CPU-second weighted; std as in :func:`weighted_std`) and ``pearson_r`` (weighted r(CPI, MAI)).
    Means are NaN for empty groups.

    Examples
    --------
    >>> import numpy as np
    >>> from gpuclust.backends.moments_cpu import grouped_comoments
    >>> x = np.array([[1.0, 0.01], [2.0, 0.03], [1.5, 0.02]])
    >>> s = cpi_mai_summary(grouped_comoments(x, np.array([1.0, 1.0, 2.0]), np.zeros(3, dtype=np.int64), 1))
    >>> s["cpi_mean"].tolist(), s["pearson_r"].round(6).tolist()
    ([1.5], [1.0])
    """
    W = np.asarray(m.W)
    mean = np.where(W[:, None] > 0, np.asarray(m.mean), np.nan)
    sd = weighted_std(m)
    return {
        "n": np.asarray(m.n).copy(),
        "cpu_seconds": W.copy(),
        "cpi_mean": mean[:, cpi],
        "cpi_std": sd[:, cpi],
        "mai_mean": mean[:, mai],
        "mai_std": sd[:, mai],
        "pearson_r": pearson_from_moments(m, cpi, mai),
    }


@dataclass(frozen=True)
class WlsFit:
    """Per-group weighted least-squares fit ``y ~ 1 + x_1 + ... + x_k`` (arrays over groups).

    Attributes
    ----------
    coef : ``(G, k + 1)``
        Intercept first, then one slope per regressor.
    se : ``(G, k + 1)``
        Standard errors (see :func:`wls_from_moments` for which).
    cov : ``(G, k + 1, k + 1)``
        Estimated covariance of ``coef``.
    r2, adj_r2 : ``(G,)``
        Weighted R^2 ``1 - RSS / TSS`` and adjusted R^2 (``n - 1`` / ``n - k - 1`` degrees of freedom,
        or ``W``-based with frequency weights).
    n : ``(G,)`` int64
        Observations (rows) used.
    W : ``(G,)``
        Weight sums (CPU-seconds).
    dof : ``(G,)``
        Residual degrees of freedom used for ``sigma2``.
    sigma2 : ``(G,)``
        Residual variance estimate ``RSS / dof``.
    y_mean : ``(G,)``
        Weighted mean of ``y``.
    x_mean : ``(G, k)``
        Weighted means of the regressors.
    weights : str
        ``"analytic"`` or ``"frequency"``.
    """

    coef: np.ndarray
    se: np.ndarray
    cov: np.ndarray
    r2: np.ndarray
    adj_r2: np.ndarray
    n: np.ndarray
    W: np.ndarray
    dof: np.ndarray
    sigma2: np.ndarray
    y_mean: np.ndarray
    x_mean: np.ndarray
    weights: str


def wls_from_moments(m: Moments, y_index: int, x_indices: Any, *, weights: str = "analytic",
                     rcond: float = 1e-12) -> WlsFit:
    """Weighted least squares ``y ~ 1 + x`` per group from (merged) co-moments, exactly.

    Slopes ``beta = Cxx^-1 Cxy`` (centred co-moments), intercept ``mean_y - beta . mean_x``,
    ``RSS = Cyy - Cxy . beta``, ``R^2 = 1 - RSS / Cyy``.

    Standard errors are the classical (homoscedastic) WLS ones, ``cov = sigma2 (X^T W X)^-1``:
    slopes ``sigma2 Cxx^-1``; intercept ``sigma2 (1/W + mean_x^T Cxx^-1 mean_x)``.

    * ``weights="analytic"`` (default): ``sigma2 = RSS / (n - k - 1)`` with ``n`` the number of
      windows.  The weights are relative precisions; the result does not change when all weights
      are scaled.  This is what ``statsmodels.WLS(...).bse`` and the textbook
      ``lstsq(sqrt(w) X, sqrt(w) y)`` + ``s^2 (A^T A)^-1`` give.
    * ``weights="frequency"``: each weight unit (CPU-second) is an independent observation,
      ``sigma2 = RSS / (W - k - 1)``.  Depends on the weight unit; shown for completeness.

    Both assume independent, homoscedastic errors; windows of one task are correlated in time,
    so these SEs are lower bounds on the true uncertainty (see docs/cpi-math.md).

    Groups with ``n <= k`` rows, a constant regressor (:func:`variable_is_constant`), or collinear regressors (smallest
    eigenvalue of the regressors' correlation matrix below ``rcond``) get NaN coefficients;
    ``n == k + 1`` (zero residual degrees of freedom) gives coefficients but NaN SEs.  ``R^2`` is
    NaN where ``y`` is constant.

    Parameters
    ----------
    m
        Moments (host) with ``y`` and the regressors among its variables.
    y_index
        Column of ``y`` in ``m``.
    x_indices
        Columns of the regressors (order kept in ``coef[:, 1:]``).
    weights
        ``"analytic"`` or ``"frequency"``.
    rcond
        Collinearity threshold.

    Examples
    --------
    >>> import numpy as np
    >>> from gpuclust.backends.moments_cpu import grouped_comoments
    >>> rng = np.random.default_rng(0)
    >>> u = rng.uniform(0, 1, 500); t = rng.integers(1, 40, 500).astype(float)
    >>> cpi = 1.2 + 0.3 * u + 0.005 * t + rng.normal(0, 0.01, 500)
    >>> x = np.column_stack([cpi, u, t]); w = rng.uniform(1, 300, 500)
    >>> fit = wls_from_moments(grouped_comoments(x, w, np.zeros(500, dtype=np.int64), 1), 0, [1, 2])
    >>> fit.coef.round(2).tolist()
    [[1.2, 0.3, 0.01]]
    """
    if weights not in ("analytic", "frequency"):
        raise ValueError(f"weights must be 'analytic' or 'frequency', got {weights!r}")
    xi = [int(i) for i in x_indices]
    k = len(xi)
    if k < 1:
        raise ValueError("need at least one regressor")
    C = np.asarray(m.C, dtype=np.float64)
    mean = np.asarray(m.mean, dtype=np.float64)
    W = np.asarray(m.W, dtype=np.float64)
    n = np.asarray(m.n, dtype=np.int64)
    G = W.shape[0]
    Cxx = C[:, xi][:, :, xi]
    cxy = C[:, xi, y_index]
    cyy = C[:, y_index, y_index]
    sx = np.sqrt(np.maximum(np.diagonal(Cxx, axis1=1, axis2=2), 0.0))
    const = variable_is_constant(m)
    ok = (W > 0) & (n > k) & ~np.any(const[:, xi], axis=1)
    sxs = np.where(ok[:, None], sx, 1.0)
    R = Cxx / (sxs[:, :, None] * sxs[:, None, :])
    eye = np.broadcast_to(np.eye(k), (G, k, k))
    R = np.where(ok[:, None, None], R, eye)
    ok &= np.linalg.eigvalsh(R)[:, 0] > rcond
    R = np.where(ok[:, None, None], R, eye)
    Rinv = np.linalg.inv(R)
    Cinv = Rinv / (sxs[:, :, None] * sxs[:, None, :])  # Cxx^-1
    beta = np.einsum("gij,gj->gi", Cinv, cxy)
    xm = mean[:, xi]
    ym = mean[:, y_index]
    b0 = ym - np.einsum("gi,gi->g", beta, xm)
    rss = np.maximum(cyy - np.einsum("gi,gi->g", cxy, beta), 0.0)
    p = k + 1
    dof = (n - p).astype(np.float64) if weights == "analytic" else W - p
    with np.errstate(invalid="ignore", divide="ignore"):
        sigma2 = np.where(ok & (dof > 0), rss / np.where(dof > 0, dof, 1.0), np.nan)
        Wsafe = np.where(W > 0, W, 1.0)
        cov = np.empty((G, p, p))
        cinv_m = np.einsum("gij,gj->gi", Cinv, xm)
        cov[:, 0, 0] = 1.0 / Wsafe + np.einsum("gi,gi->g", xm, cinv_m)
        cov[:, 0, 1:] = -cinv_m
        cov[:, 1:, 0] = -cinv_m
        cov[:, 1:, 1:] = Cinv
        cov = cov * sigma2[:, None, None]
        se = np.sqrt(np.maximum(np.diagonal(cov, axis1=1, axis2=2), 0.0))
        se = np.where(np.isfinite(sigma2)[:, None], se, np.nan)
        tss_ok = ok & ~const[:, y_index]
        r2 = np.where(tss_ok, 1.0 - rss / np.where(cyy > 0, cyy, 1.0), np.nan)
        n_eff = n.astype(np.float64) if weights == "analytic" else W
        adj = np.where(tss_ok & (dof > 0), 1.0 - (1.0 - r2) * (n_eff - 1.0) / np.where(dof > 0, dof, 1.0), np.nan)
    coef = np.column_stack([b0, beta])
    coef = np.where(ok[:, None], coef, np.nan)
    return WlsFit(coef=coef, se=se, cov=cov, r2=r2, adj_r2=adj, n=n.copy(), W=W.copy(), dof=dof,
                  sigma2=sigma2, y_mean=np.where(W > 0, ym, np.nan), x_mean=np.where(W[:, None] > 0, xm, np.nan),
                  weights=weights)


def borg_effects(fit: WlsFit, util: int, tasks: int, *, reference: str = "mean",
                 util_step: float = 0.10) -> dict[str, np.ndarray]:
    """Borg-paper (§5.2) effects of a CPI regression, in percent of a reference CPI.

    With ``CPI = b0 + b_util * util + b_tasks * ntasks`` (``util`` = machine CPU usage as a
    fraction of machine capacity, ``ntasks`` = tasks co-located on the machine in the window):

    * ``pct_per_task = 100 * b_tasks / ref``: % change in CPI per extra co-located task;
    * ``pct_per_util_step = 100 * b_util * util_step / ref``: % change in CPI when machine
      utilisation rises by ``util_step`` (default 0.10: ten percentage points of capacity).

    ``reference="mean"`` (default): ``ref`` is the CPU-second-weighted mean CPI (the fitted value
    at the regressors' means, where a linear model is best determined); ``"intercept"``: ``ref = b0``,
    the CPI extrapolated to an idle machine with no other tasks.  Standard errors by the delta
    method from ``fit.cov`` (the reference's own uncertainty included).

    Parameters
    ----------
    fit
        Result of :func:`wls_from_moments`.
    util, tasks
        Positions of the utilisation and task-count regressors in ``x_indices`` (0-based).
    reference
        ``"mean"`` or ``"intercept"``.
    util_step
        Utilisation step for the second effect (fraction of capacity).

    Returns
    -------
    dict
        ``reference_cpi``, ``pct_per_task``, ``pct_per_task_se``, ``pct_per_util_step``,
        ``pct_per_util_step_se`` (arrays over groups).

    Examples
    --------
    >>> import numpy as np
    >>> from gpuclust.backends.moments_cpu import grouped_comoments
    >>> rng = np.random.default_rng(1)
    >>> u = rng.uniform(0, 1, 2000); t = rng.integers(1, 40, 2000).astype(float)
    >>> cpi = 1.5 * (1 + 0.003 * (t - 20) + 0.15 * (u - 0.5)) + rng.normal(0, 0.05, 2000)
    >>> m = grouped_comoments(np.column_stack([cpi, u, t]), np.ones(2000), np.zeros(2000, dtype=np.int64), 1)
    >>> e = borg_effects(wls_from_moments(m, 0, [1, 2]), util=0, tasks=1)
    >>> round(float(e["pct_per_task"][0]), 1), round(float(e["pct_per_util_step"][0]), 1)
    (0.3, 1.5)
    """
    if reference not in ("mean", "intercept"):
        raise ValueError(f"reference must be 'mean' or 'intercept', got {reference!r}")
    G, p = fit.coef.shape
    a = np.zeros((G, p))
    a[:, 0] = 1.0
    if reference == "mean":
        a[:, 1:] = fit.x_mean
    ref = np.einsum("gi,gi->g", a, fit.coef)
    out: dict[str, np.ndarray] = {"reference_cpi": ref}
    for name, j, scale in (("pct_per_task", tasks, 1.0), ("pct_per_util_step", util, util_step)):
        b = fit.coef[:, 1 + j]
        with np.errstate(invalid="ignore", divide="ignore"):
            val = 100.0 * scale * b / ref
            grad = -(b / ref**2)[:, None] * a
            grad[:, 1 + j] += 1.0 / ref
            var = np.einsum("gi,gij,gj->g", grad, fit.cov, grad)
            se = 100.0 * abs(scale) * np.sqrt(np.maximum(var, 0.0))
        out[name] = val
        out[name + "_se"] = np.where(np.isfinite(var), se, np.nan)
    return out


# --------------------------------------------------------------------------- Spearman

def _valid_rows(x: np.ndarray, y: np.ndarray, w: np.ndarray | None, group: np.ndarray, G: int) -> np.ndarray:
    with np.errstate(invalid="ignore"):
        ok = np.isfinite(x) & np.isfinite(y) & (group >= 0) & (group < G)
        if w is not None:
            ok &= np.isfinite(w) & (w > 0)
    return ok


def _midranks(v: np.ndarray, group: np.ndarray, w: np.ndarray | None, G: int) -> np.ndarray:
    """Within-group mid-ranks on the unit scale: mass strictly below + half the mass of the ties.

    Unweighted (``w is None``): ``(#below + #ties / 2) / n_g``, computed from integer counts
    (exact).  Weighted: the same with weights normalised to sum to one per group, so the prefix
    sums never exceed the number of groups (rounding ~ eps * G, whatever the weight scale).
    """
    order = np.lexsort((v, group))
    gs, vs = group[order], v[order]
    m = gs.shape[0]
    if m == 0:
        return np.zeros(0)
    new_run = np.empty(m, dtype=bool)
    new_run[0] = True
    new_run[1:] = (gs[1:] != gs[:-1]) | (vs[1:] != vs[:-1])
    run_id = np.cumsum(new_run) - 1
    run_g = gs[new_run]
    if w is None:
        mass = np.bincount(run_id).astype(np.int64)
        total = np.bincount(gs, minlength=G).astype(np.float64)
    else:
        W = np.bincount(group, weights=w, minlength=G)
        p = w[order] / W[gs]
        mass = np.bincount(run_id, weights=p)
        total = np.ones(G)
    cum = np.cumsum(mass) - mass
    first = np.empty(run_g.shape[0], dtype=bool)
    first[0] = True
    first[1:] = run_g[1:] != run_g[:-1]
    start = cum[first][np.cumsum(first) - 1]
    mid = (cum - start) + mass / 2.0
    mid = mid / total[run_g]
    out = np.empty(m)
    out[order] = mid[run_id]
    return out


def spearman_exact(x: np.ndarray, y: np.ndarray, group: np.ndarray | None = None, n_groups: int | None = None,
                   w: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Exact Spearman rank correlation per group, from all rows of each group (host).

    Ranks are within-group mid-ranks (ties get the average rank).  Unweighted (``w=None``): the
    Pearson correlation of the mid-ranks, identical to ``scipy.stats.spearmanr``.  Weighted
    (``w`` = CPU-seconds): each row is a mass ``w``; a row's rank is the weight strictly below it
    plus half the weight of its ties (the mid-point of its step of the weighted CDF), and the
    correlation is the ``w``-weighted Pearson of those ranks.  With equal weights both agree.

    Rows with a non-finite ``x``/``y``/``w``, ``w <= 0`` or a group outside ``[0, n_groups)`` are
    dropped.  NaN for groups with fewer than two distinct values in ``x`` or ``y``.

    Returns
    -------
    (rho, n)
        float64 ``(G,)`` and int64 ``(G,)`` rows used.

    Examples
    --------
    >>> import numpy as np
    >>> rho, n = spearman_exact(np.array([1.0, 2, 3, 4]), np.array([1.0, 3, 2, 4]))
    >>> rho.tolist(), n.tolist()
    ([0.8], [4])
    """
    x = np.asarray(x, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    if group is None:
        group = np.zeros(x.shape[0], dtype=np.int64)
        n_groups = 1 if n_groups is None else n_groups
    group = np.asarray(group, dtype=np.int64)
    if n_groups is None:
        n_groups = int(group.max()) + 1 if group.shape[0] else 0
    G = int(n_groups)
    wv = None if w is None else np.asarray(w, dtype=np.float64)
    ok = _valid_rows(x, y, wv, group, G)
    x, y, group = x[ok], y[ok], group[ok]
    wv = None if wv is None else wv[ok]
    rx = _midranks(x, group, wv, G)
    ry = _midranks(y, group, wv, G)
    m = grouped_comoments(np.ascontiguousarray(np.column_stack([rx, ry])),
                          np.ones(x.shape[0]) if wv is None else wv, group, G)
    return pearson_from_moments(m, 0, 1), m.n


def quantile_cuts(v: np.ndarray, bins: int, w: np.ndarray | None = None) -> np.ndarray:
    """Interior cut points at the (weighted) ``1/bins, ..., (bins-1)/bins`` quantiles of ``v``.

    Use a sample or a previous pass of the same data; duplicates are dropped (fewer bins).
    """
    v = np.asarray(v, dtype=np.float64)
    ok = np.isfinite(v) if w is None else np.isfinite(v) & np.isfinite(w) & (np.asarray(w) > 0)
    if not ok.any():
        return np.zeros(0)
    q = np.arange(1, bins) / bins
    cuts = np.quantile(v[ok], q, weights=None if w is None else np.asarray(w, dtype=np.float64)[ok],
                       method="inverted_cdf")
    return np.unique(cuts)


def spearman_grid_partial(backend: Any, x: Any, y: Any, group: Any, n_groups: int, x_cuts: Any, y_cuts: Any,
                          w: Any = None, bins: tuple[Any, Any] | None = None) -> Any:
    """Mergeable Spearman partial: per-group weighted counts on a fixed grid, ``(G, Bx, By)``.

    ``x`` falls in bin ``searchsorted(x_cuts, x, side="right")`` (``Bx = len(x_cuts) + 1`` bins;
    values beyond the extreme cuts join the end bins), likewise ``y``.  Partials of the same cuts
    merge by addition (exact identity, associative and commutative up to float rounding of
    sums).  Uses ``backend.xp`` and ``backend.ops.grouped_sum``; memory is ``G * Bx * By`` doubles,
    so use it for coarse groups (cells, tiers, platforms), not machines.  Row validity as in
    :func:`spearman_exact`; ``w=None`` counts rows (the unweighted Spearman).  ``bins``: the
    rows' ``(x bin, y bin)`` when the caller has them already (they must equal the searchsorted
    bins above; the ``cpi`` analysis maps its fine histogram bins through a lookup table).
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
    xb, yb = bins if bins is not None else (xp.searchsorted(xc, xv, side="right"), xp.searchsorted(yc, yv, side="right"))
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


def spearman_from_grid(h: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Spearman from a grid partial: ``(rho, bound)`` per group, with ``|rho - exact| <= bound``.

    ``rho`` is the exact (weighted) Spearman of the *binned* data: every row of a bin takes the
    bin's mid-rank, ties averaged, then weighted Pearson.  When each bin holds a single distinct
    value it equals :func:`spearman_exact`.  The bound (derivation in docs/cpi-math.md) is
    ``(1 + eps1) / sqrt((1 - Sx)(1 - Sy)) - 1`` with ``Sx = sum px_b^3`` over the marginal bin
    masses and ``eps1 = 12 (T1 + T2 + T3)`` computed from the grid; it is at most about
    ``1.5 (max px + max py)``: in practice ~0.04 with 64 and ~0.01 with 256 equal-mass bins per
    axis on bivariate-normal samples (actual errors are far smaller).  NaN where a marginal has a
    single occupied bin.
    """
    h = np.asarray(h, dtype=np.float64)
    W = h.sum(axis=(1, 2))
    with np.errstate(invalid="ignore", divide="ignore"):
        f = h / np.where(W > 0, W, 1.0)[:, None, None]
        px, py = f.sum(axis=2), f.sum(axis=1)
        du = np.cumsum(px, axis=1) - px / 2.0 - 0.5
        dv = np.cumsum(py, axis=1) - py / 2.0 - 0.5
        cov = np.einsum("gb,gbc,gc->g", du, f, dv)
        vu = (px * du * du).sum(axis=1)
        vv = (py * dv * dv).sum(axis=1)
        ok = (W > 0) & (px.max(axis=1, initial=0.0) < 1.0) & (py.max(axis=1, initial=0.0) < 1.0) & (vu > 0) & (vv > 0)
        rho = np.where(ok, cov / np.sqrt(np.where(ok, vu * vv, 1.0)), np.nan)
        # |12 cov(U,V) - 12 cov(U~,V~)| <= eps1 (docs/cpi-math.md): each term uses that the exact
        # mid-rank lies within half a bin mass of its bin's mid-rank and averages to it per bin.
        mv = np.einsum("gbc,gc->gb", f, dv) / np.where(px > 0, px, 1.0)  # mean of V~ per x-bin
        mu = np.einsum("gbc,gb->gc", f, du) / np.where(py > 0, py, 1.0)  # mean of U~ per y-bin
        t1 = np.einsum("gb,gbc->g", px / 2.0, f * np.abs(dv[:, None, :] - mv[:, :, None]))
        t2 = np.einsum("gc,gbc->g", py / 2.0, f * np.abs(du[:, :, None] - mu[:, None, :]))
        t3 = np.einsum("gb,gbc,gc->g", px, f, py) / 4.0
        eps1 = 12.0 * (t1 + t2 + t3)
        s = np.sqrt(np.maximum((1.0 - (px**3).sum(axis=1)) * (1.0 - (py**3).sum(axis=1)), 0.0))
        bound = np.where(ok, (1.0 + eps1) / np.where(s > 0, s, 1.0) - 1.0, np.nan)
    return np.clip(rho, -1.0, 1.0), np.minimum(bound, 2.0)


# --------------------------------------------------------------------------- plausibility filter

#: Rejection reasons, in the order they are tested (a window is counted under the first it fails).
REJECT_REASONS: tuple[str, ...] = ("missing", "cpu_seconds", "cpi_range", "mai_range")


@dataclass(frozen=True)
class CpiFilter:
    """Plausibility filter for usage windows with CPI and MAI (defaults justified in docs/cpi-math.md).

    A window is kept iff CPI and MAI are both present (not NaN) and finite,
    ``cpi_min < CPI <= cpi_max``, ``mai_min <= MAI <= mai_max`` and
    ``cpu_seconds >= min_cpu_seconds`` (with ``cpu_seconds > 0`` always required: it is the weight).

    Attributes
    ----------
    cpi_min : float
        Exclusive lower CPI bound (default 0: a CPI must be positive).
    cpi_max : float
        Inclusive upper CPI bound (default 100).
    mai_min, mai_max : float
        Inclusive MAI bounds (default [0, 1]).
    min_cpu_seconds : float
        Minimum CPU time in the window, in the trace's normalised CPU-seconds (NCU-s:
        ``average_usage.cpus * window seconds``); default 0.01.

    Examples
    --------
    >>> import numpy as np
    >>> keep, counts = CpiFilter().mask(np, np.array([1.5, np.nan, 300.0, 1.2]), np.array([0.01, 0.01, 0.02, 2.0]),
    ...                                 np.array([3.0, 3.0, 3.0, 3.0]))
    >>> keep.tolist(), counts
    ([True, False, False, False], {'total': 4, 'kept': 1, 'missing': 1, 'cpu_seconds': 0, 'cpi_range': 1, 'mai_range': 1})
    """

    cpi_min: float = 0.0
    cpi_max: float = 100.0
    mai_min: float = 0.0
    mai_max: float = 1.0
    min_cpu_seconds: float = 0.01

    def __post_init__(self) -> None:
        if not (self.cpi_min < self.cpi_max and self.mai_min <= self.mai_max):
            raise ValueError(f"empty CPI or MAI range in {self}")
        if not self.min_cpu_seconds >= 0:
            raise ValueError(f"min_cpu_seconds must be >= 0, got {self.min_cpu_seconds}")

    def mask(self, xp: Any, cpi: Any, mai: Any, cpu_seconds: Any) -> tuple[Any, dict[str, int]]:
        """Keep mask (``xp`` bool array) and window counts per first rejection reason.

        Counts: ``total``, ``kept`` and one entry per :data:`REJECT_REASONS` (exclusive, in that
        order: ``missing`` = CPI or MAI NaN/inf, ``cpu_seconds`` = CPU time NaN, ``<= 0`` or below
        the minimum, then the CPI and MAI ranges); they add up to ``total``.
        """
        cpi = xp.asarray(cpi)
        mai = xp.asarray(mai)
        cs = xp.asarray(cpu_seconds)
        # Successive passes: each stage keeps the rows that passed the previous ones, so a stage's
        # rejections are the drop in the count (the first reason a row fails).
        with np.errstate(invalid="ignore"):
            ok = xp.isfinite(cpi)
            ok &= xp.isfinite(mai)
            n_present = int(xp.count_nonzero(ok))
            ok &= cs > 0  # with the next two: finite, > 0 and >= the minimum (False for NaN)
            ok &= cs < np.inf
            ok &= cs >= self.min_cpu_seconds
            n_cs = int(xp.count_nonzero(ok))
            ok &= cpi > self.cpi_min
            ok &= cpi <= self.cpi_max
            n_cpi = int(xp.count_nonzero(ok))
            ok &= mai >= self.mai_min
            ok &= mai <= self.mai_max
            kept = int(xp.count_nonzero(ok))
        total = int(cpi.shape[0])
        counts = {"total": total, "kept": kept}
        for name, c in zip(REJECT_REASONS, (total - n_present, n_present - n_cs, n_cs - n_cpi, n_cpi - kept), strict=True):
            counts[name] = c
        return ok, counts
