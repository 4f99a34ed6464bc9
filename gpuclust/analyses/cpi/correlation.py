"""Correlation statistics of the ``cpi`` analysis: finalize math on the host (NumPy).

From :class:`~gpuclust.backends.moments_cpu.Moments` (weighted co-moments, from the backend op
``grouped_comoments``): weighted means and standard deviations (:func:`weighted_std`), Pearson
correlation (:func:`pearson_from_moments`) and the per-group CPI/MAI columns
(:func:`cpi_mai_summary`); the exact Spearman rank correlation from all rows of each group
(:func:`spearman_exact`).  The mergeable grid approximation is in
:mod:`gpuclust.analyses.cpi.binning`, the regression in :mod:`gpuclust.analyses.cpi.regression`.

Definitions, derivations and the choice of standard errors are in ``docs/analyses/cpi-math.md``.
"""

from __future__ import annotations

import numpy as np

from gpuclust.backends.moments_cpu import grouped_comoments
from gpuclust.partials import Moments

__all__ = [
    "CONSTANT_RTOL",
    "cpi_mai_summary",
    "pearson_from_moments",
    "spearman_exact",
    "variable_is_constant",
    "weighted_std",
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


def spearman_exact(
    x: np.ndarray,
    y: np.ndarray,
    group: np.ndarray | None = None,
    n_groups: int | None = None,
    w: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:
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
    m = grouped_comoments(
        np.ascontiguousarray(np.column_stack([rx, ry])), np.ones(x.shape[0]) if wv is None else wv, group, G
    )
    return pearson_from_moments(m, 0, 1), m.n
