"""Slow, obviously-correct reference for the mixture of per-window CPU distributions.

Written straight from the definition, independently of ``gpuclust.backends.mixture_cpu``:

* a window's CDF ``F_i`` is the piecewise-linear curve through ``(q_k, l_k)``, right-continuous,
  where a flat step ``q_k == q_{k+1}`` is a point mass ``l_{k+1} - l_k`` at ``q_k``;
* a group's CDF is ``F(x) = sum_i w_i F_i(x)`` evaluated directly, one window at a time;
* ``quantile(p) = inf{x : F(x) >= p W}`` is found by bisection on ``x`` down to adjacent floats
  (or 1e-13 relative), then the answer is checked against the definition (right-continuity: ``F``
  at the answer reaches the target, the left limit does not exceed it); ``p = 0`` is the minimum
  and ``p = 1`` the maximum of the support;
* a window's mean is ``q_0 + integral (1 - F_i(x)) dx``, integrated exactly piece by piece.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from gpuclust.schema import CPU_PERCENTILE_LEVELS_SORTED

LEVELS = np.asarray(CPU_PERCENTILE_LEVELS_SORTED, dtype=np.float64)


def window_cdf(q: Sequence[float], x: float, levels: Sequence[float] = LEVELS, *, left: bool = False) -> float:
    """``F_i(x)`` (or the left limit ``F_i(x-)`` when ``left``) of one monotone percentile vector."""
    q = [float(v) for v in q]
    lv = [float(v) for v in levels]
    n = len(q)
    # last breakpoint at or before x (strictly before x for the left limit)
    k = -1
    for j in range(n):
        if q[j] < x or (not left and q[j] == x):
            k = j
    if k < 0:
        return 0.0
    if k == n - 1:
        return 1.0
    # q[k] <= x < q[k+1] (right) or q[k] < x <= q[k+1] (left): inside a non-flat segment
    a, b = q[k], q[k + 1]
    return lv[k] + (lv[k + 1] - lv[k]) * (x - a) / (b - a)


def mixture_cdf(
    qs: np.ndarray, ws: np.ndarray, x: float, levels: Sequence[float] = LEVELS, *, left: bool = False
) -> float:
    """``F(x) = sum_i w_i F_i(x)`` over rows with positive weight (``math.fsum`` for the sum)."""
    return math.fsum(float(w) * window_cdf(q, x, levels, left=left) for q, w in zip(qs, ws, strict=False) if w > 0)


def mixture_quantile(qs: np.ndarray, ws: np.ndarray, p: float, levels: Sequence[float] = LEVELS) -> float:
    """``inf{x : F(x) >= p W}`` by bisection (NaN when no positive weight)."""
    keep = np.asarray(ws) > 0
    qs, ws = np.asarray(qs, dtype=np.float64)[keep], np.asarray(ws, dtype=np.float64)[keep]
    if qs.shape[0] == 0:
        return math.nan
    lo_s, hi_s = float(qs[:, 0].min()), float(qs[:, -1].max())
    if p <= 0:
        return lo_s
    if p >= 1:
        return hi_s
    W = math.fsum(ws)
    t = p * W
    if mixture_cdf(qs, ws, lo_s, levels) >= t:
        return lo_s
    lo, hi = lo_s, hi_s  # invariant: F(lo) < t <= F(hi)
    for _ in range(2000):
        if np.nextafter(lo, hi) >= hi or hi - lo <= 1e-13 * max(abs(lo), abs(hi)):
            break
        mid = lo + (hi - lo) / 2
        if mid <= lo or mid >= hi:
            break
        if mixture_cdf(qs, ws, mid, levels) >= t:
            hi = mid
        else:
            lo = mid
    # right-continuity check of the answer: F(hi) reaches t, just left of it F stays below
    assert mixture_cdf(qs, ws, hi, levels) >= t
    assert mixture_cdf(qs, ws, lo, levels) < t
    return hi


def window_mean(q: Sequence[float], levels: Sequence[float] = LEVELS) -> float:
    """``q_0 + integral_{q_0}^{q_last} (1 - F(x)) dx`` with ``F`` linear between breakpoints."""
    pts = sorted(set(float(v) for v in q))
    total = pts[0]
    for a, b in zip(pts[:-1], pts[1:], strict=False):
        fa = window_cdf(q, a, levels)  # right value at a
        fb = window_cdf(q, b, levels, left=True)  # left limit at b
        total += (b - a) * ((1.0 - fa) + (1.0 - fb)) / 2.0
    return total


def group_breakpoints(qs: np.ndarray, ws: np.ndarray) -> np.ndarray:
    """All distinct breakpoints of the windows with positive weight."""
    keep = np.asarray(ws) > 0
    return np.unique(np.asarray(qs)[keep].ravel())


def reference_quantiles(
    q: np.ndarray,
    w: np.ndarray,
    group: np.ndarray,
    n_groups: int,
    levels: np.ndarray,
    q_levels: Sequence[float] = LEVELS,
) -> np.ndarray:
    """``(n_groups, L)`` quantiles, one group at a time."""
    out = np.full((n_groups, len(levels)), np.nan)
    for g in range(n_groups):
        sel = group == g
        for j, p in enumerate(levels):
            out[g, j] = mixture_quantile(q[sel], w[sel], float(p), q_levels)
    return out


def quantile_ok(
    fast: float,
    ref: float,
    qs: np.ndarray,
    ws: np.ndarray,
    p: float,
    *,
    rtol: float = 1e-9,
    ptol: float = 1e-12,
    levels: Sequence[float] = LEVELS,
) -> bool:
    """``fast`` agrees with ``ref`` to ``rtol`` relative; or, where the quantile is ill-conditioned
    (F nearly flat at ``p W``, or a plateau of F at exactly ``p W`` so the answer jumps with the
    last bit of rounding), ``fast`` is the exact quantile of some level within ``ptol`` of ``p``:
    ``Q(p - ptol) <= fast <= Q(p + ptol)`` (each side widened by ``rtol``), by bisection."""
    if math.isnan(ref) or math.isnan(fast):
        return math.isnan(ref) and math.isnan(fast)
    if abs(fast - ref) <= rtol * max(abs(fast), abs(ref)):
        return True
    lo = mixture_quantile(qs, ws, max(p - ptol, 0.0), levels)
    hi = mixture_quantile(qs, ws, min(p + ptol, 1.0), levels)
    return lo - rtol * abs(lo) <= fast <= hi + rtol * abs(hi)


def window_cdf_np(q: np.ndarray, xs: np.ndarray, levels: Sequence[float] = LEVELS, *, left: bool = False) -> np.ndarray:
    """Vectorised over ``xs``: the same definition as :func:`window_cdf` for one window."""
    q = np.asarray(q, dtype=np.float64)
    lv = np.asarray(levels, dtype=np.float64)
    n = q.shape[0]
    k = np.searchsorted(q, xs, side="left" if left else "right") - 1
    out = np.where(k >= n - 1, 1.0, 0.0)
    mid = (k >= 0) & (k < n - 1)
    kk = np.clip(k, 0, n - 2)
    a, b = q[kk], q[kk + 1]
    with np.errstate(invalid="ignore", divide="ignore"):
        inner = lv[kk] + (lv[kk + 1] - lv[kk]) * (xs - a) / (b - a)
    return np.where(mid, inner, out)


def windows_cdf_np(
    qs: np.ndarray, xs: np.ndarray, levels: Sequence[float] = LEVELS, *, left: bool = False
) -> np.ndarray | None:
    """``(windows, len(xs))``: row ``i`` is :func:`window_cdf_np` of ``qs[i]`` at ``xs``, element for
    element the same arithmetic, all windows at once; ``None`` where that equivalence is not
    guaranteed (a row not sorted, a NaN anywhere), for the caller to go one window at a time.

    For a sorted row, ``searchsorted(q, x, side)`` is the number of breakpoints ``<= x`` (right) or
    ``< x`` (left), which is what is counted here."""
    qs = np.asarray(qs, dtype=np.float64)
    xs = np.asarray(xs, dtype=np.float64)
    if qs.ndim != 2 or np.isnan(qs).any() or np.isnan(xs).any() or (np.diff(qs, axis=1) < 0).any():
        return None
    return _sorted_rows_cdf(qs, xs, levels, left)


def _sorted_rows_cdf(qs: np.ndarray, xs: np.ndarray, levels: Sequence[float], left: bool) -> np.ndarray:
    """:func:`windows_cdf_np` of float64 rows already found sorted and NaN-free, at NaN-free ``xs``."""
    lv = np.asarray(levels, dtype=np.float64)
    n = qs.shape[1]
    below = qs[:, :, None] < xs[None, None, :] if left else qs[:, :, None] <= xs[None, None, :]
    k = below.sum(axis=1) - 1
    out = np.where(k >= n - 1, 1.0, 0.0)
    mid = (k >= 0) & (k < n - 1)
    kk = np.clip(k, 0, n - 2)
    rows = np.arange(qs.shape[0])[:, None]
    a, b = qs[rows, kk], qs[rows, kk + 1]
    with np.errstate(invalid="ignore", divide="ignore"):
        inner = lv[kk] + (lv[kk + 1] - lv[kk]) * (xs[None, :] - a) / (b - a)
    return np.where(mid, inner, out)


def _weighted_sum(
    qs: np.ndarray, ws: np.ndarray, xs: np.ndarray, levels: Sequence[float], left: bool, *, sorted_rows: bool = False
) -> np.ndarray:
    """``sum_i w_i F_i(xs)`` over the rows given (all with positive weight), added window after window
    in row order (a running sum: the same roundings as adding one window at a time).  ``sorted_rows``:
    the caller found ``qs`` (float64) sorted and NaN-free, and ``xs`` has no NaN."""
    xs = np.asarray(xs, dtype=np.float64)
    acc = np.zeros_like(xs)
    if sorted_rows and len(qs):
        f: np.ndarray | None = _sorted_rows_cdf(qs, xs, levels, left)
    else:
        f = windows_cdf_np(qs, xs, levels, left=left) if len(qs) else None
    if f is None:
        for q, w in zip(qs, ws, strict=False):
            acc += float(w) * window_cdf_np(q, xs, levels, left=left)
        return acc
    return acc + np.cumsum(np.asarray(ws, dtype=np.float64)[:, None] * f, axis=0)[-1]


def mixture_cdf_np(
    qs: np.ndarray, ws: np.ndarray, xs: np.ndarray, levels: Sequence[float] = LEVELS, *, left: bool = False
) -> np.ndarray:
    """``F(xs) / W`` (normalised), window after window, for rows with positive weight."""
    qs, ws = np.asarray(qs), np.asarray(ws)
    keep = ws > 0
    W = 0.0
    for w in ws[keep]:
        W += float(w)
    return _weighted_sum(qs[keep], ws[keep], xs, levels, left) / W


def group_quantiles(
    qs: np.ndarray, ws: np.ndarray, ps: Sequence[float], levels: Sequence[float] = LEVELS
) -> np.ndarray:
    """:func:`mixture_quantile` for many levels of one group at once (bisection run in lock-step)."""
    qs, ws = np.asarray(qs, dtype=np.float64), np.asarray(ws, dtype=np.float64)
    keep = ws > 0
    qs, ws = qs[keep], ws[keep]
    ps = np.asarray(ps, dtype=np.float64)
    if qs.shape[0] == 0:
        return np.full(ps.shape, np.nan)
    W = math.fsum(ws)
    lo_s, hi_s = float(qs[:, 0].min()), float(qs[:, -1].max())

    elementwise = windows_cdf_np(qs, np.empty(0), levels) is not None  # sorted rows, no NaN

    def F(xs: np.ndarray) -> np.ndarray:  # un-normalised sum_i w_i F_i(x)
        return _weighted_sum(qs, ws, xs, levels, False, sorted_rows=elementwise)

    t = ps * W
    lo = np.full(ps.shape, lo_s)
    hi = np.full(ps.shape, hi_s)
    at_lo = F(np.full(ps.shape, lo_s)) >= t  # these levels' answer is lo_s whatever the bisection
    # With every row sorted and no NaN, F is elementwise in x (windows_cdf_np), so F of the levels
    # still bisected alone gives the same values, and the levels whose answer does not depend on
    # the bisection (lo_s where F(lo_s) reaches p W or p <= 0, hi_s where p >= 1) need none: over
    # windows at 0 their hi would be halved through the subnormals, ~1,075 steps.  Otherwise
    # (window_cdf_np's searchsorted on an unsorted row depends on the other x) every level is
    # bisected and F taken at all of them.
    fixed = ((ps <= 0) | (ps >= 1) | at_lo) & elementwise
    for _ in range(2000):
        mid = lo + (hi - lo) / 2
        done = fixed | (mid <= lo) | (mid >= hi) | (hi - lo <= 1e-13 * np.maximum(np.abs(lo), np.abs(hi)))
        if done.all():
            break
        todo = ~done
        ok = np.zeros(ps.shape, dtype=bool)
        if elementwise:
            ok[todo] = F(mid[todo]) >= t[todo]
        else:
            ok = F(mid) >= t
        hi = np.where(todo & ok, mid, hi)
        lo = np.where(todo & ~ok, mid, lo)
    res = np.where(at_lo, lo_s, hi)
    return np.where(ps <= 0, lo_s, np.where(ps >= 1, hi_s, res))
