"""The Borg §5.2 CPI regression of the ``cpi`` analysis: finalize math on the host (NumPy).

The weighted least-squares regression with standard errors and R^2 from merged co-moments
(:func:`wls_from_moments`), and the Borg-paper effects (:func:`borg_effects`).  Definitions,
derivations and the choice of standard errors are in ``docs/analyses/cpi-math.md``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from gpuclust.analyses.cpi.correlation import variable_is_constant
from gpuclust.partials import Moments

__all__ = ["WlsFit", "borg_effects", "wls_from_moments"]


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


def wls_from_moments(
    m: Moments, y_index: int, x_indices: Any, *, weights: str = "analytic", rcond: float = 1e-12
) -> WlsFit:
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
    so these SEs are lower bounds on the true uncertainty (see docs/analyses/cpi-math.md).

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
    if len(xi) < 1:
        raise ValueError("need at least one regressor")
    C = np.asarray(m.C, dtype=np.float64)
    mean = np.asarray(m.mean, dtype=np.float64)
    W = np.asarray(m.W, dtype=np.float64)
    n = np.asarray(m.n, dtype=np.int64)
    const = variable_is_constant(m)
    ok, Cinv = _inverse_regressor_comoments(C[:, xi][:, :, xi], W, n, np.any(const[:, xi], axis=1), rcond)
    return _fit_groups(
        C[:, xi, y_index],
        C[:, y_index, y_index],
        mean[:, xi],
        mean[:, y_index],
        W,
        n,
        ok,
        Cinv,
        const[:, y_index],
        weights,
    )


def _inverse_regressor_comoments(
    Cxx: np.ndarray, W: np.ndarray, n: np.ndarray, x_const: np.ndarray, rcond: float
) -> tuple[np.ndarray, np.ndarray]:
    """Groups that can be fitted, and ``Cxx^-1`` (via the regressors' correlation matrix; identity where not)."""
    G, k = Cxx.shape[0], Cxx.shape[1]
    sx = np.sqrt(np.maximum(np.diagonal(Cxx, axis1=1, axis2=2), 0.0))
    ok = (W > 0) & (n > k) & ~x_const
    sxs = np.where(ok[:, None], sx, 1.0)
    R = Cxx / (sxs[:, :, None] * sxs[:, None, :])
    eye = np.broadcast_to(np.eye(k), (G, k, k))
    R = np.where(ok[:, None, None], R, eye)
    ok &= np.linalg.eigvalsh(R)[:, 0] > rcond
    R = np.where(ok[:, None, None], R, eye)
    Rinv = np.linalg.inv(R)
    return ok, Rinv / (sxs[:, :, None] * sxs[:, None, :])


def _fit_groups(
    cxy: np.ndarray,
    cyy: np.ndarray,
    xm: np.ndarray,
    ym: np.ndarray,
    W: np.ndarray,
    n: np.ndarray,
    ok: np.ndarray,
    Cinv: np.ndarray,
    y_const: np.ndarray,
    weights: str,
) -> WlsFit:
    """The fit from the centred co-moments ``cxy``, ``cyy``, the means and ``Cxx^-1``: coefficients, SEs, R^2."""
    beta = np.einsum("gij,gj->gi", Cinv, cxy)
    b0 = ym - np.einsum("gi,gi->g", beta, xm)
    rss = np.maximum(cyy - np.einsum("gi,gi->g", cxy, beta), 0.0)
    p = xm.shape[1] + 1
    dof = (n - p).astype(np.float64) if weights == "analytic" else W - p
    n_eff = n.astype(np.float64) if weights == "analytic" else W
    sigma2, r2, adj = _residual_stats(rss, cyy, dof, n_eff, ok, ok & ~y_const)
    cov, se = _coef_covariance(Cinv, xm, W, sigma2)
    coef = np.column_stack([b0, beta])
    coef = np.where(ok[:, None], coef, np.nan)
    return WlsFit(
        coef=coef,
        se=se,
        cov=cov,
        r2=r2,
        adj_r2=adj,
        n=n.copy(),
        W=W.copy(),
        dof=dof,
        sigma2=sigma2,
        y_mean=np.where(W > 0, ym, np.nan),
        x_mean=np.where(W[:, None] > 0, xm, np.nan),
        weights=weights,
    )


def _residual_stats(
    rss: np.ndarray, cyy: np.ndarray, dof: np.ndarray, n_eff: np.ndarray, ok: np.ndarray, tss_ok: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Residual variance ``RSS / dof``, R^2 and adjusted R^2 (NaN where undefined)."""
    with np.errstate(invalid="ignore", divide="ignore"):
        sigma2 = np.where(ok & (dof > 0), rss / np.where(dof > 0, dof, 1.0), np.nan)
        r2 = np.where(tss_ok, 1.0 - rss / np.where(cyy > 0, cyy, 1.0), np.nan)
        adj = np.where(tss_ok & (dof > 0), 1.0 - (1.0 - r2) * (n_eff - 1.0) / np.where(dof > 0, dof, 1.0), np.nan)
    return sigma2, r2, adj


def _coef_covariance(
    Cinv: np.ndarray, xm: np.ndarray, W: np.ndarray, sigma2: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Classical WLS covariance ``sigma2 (X^T W X)^-1`` of intercept and slopes, and its standard errors."""
    G, p = Cinv.shape[0], Cinv.shape[1] + 1
    with np.errstate(invalid="ignore", divide="ignore"):
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
    return cov, se


def borg_effects(
    fit: WlsFit, util: int, tasks: int, *, reference: str = "mean", util_step: float = 0.10
) -> dict[str, np.ndarray]:
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
