"""Mergeable per-group summaries of CPU usage distributions (the core of ``usage-distribution``).

A group's distribution is the mixture of its windows' piecewise-linear CDFs weighted by sample
count (see :mod:`gpuclust.backends.mixture_cpu`).  An engine computes one *partial* per partition,
merges partials in a tree and finalizes once.  Two strategies:

``exact`` (:func:`exact_partial`)
    The partial keeps every usable window's repaired percentile vector and weight, keyed by
    group; ``merge`` concatenates, ``finalize`` inverts each group's mixture once.  Exact (to
    float rounding) for any partitioning; memory grows with the number of windows.  **Use it when
    a group's windows are co-located** (the engine shuffled by the group key, so each group's
    rows meet in one partial) **or when the rows fit in memory** (a local run, or few groups).

``bounded`` (:func:`bounded_partial`)
    Per group a fixed-size summary: the mixture CDF tabulated at its quantiles at the ``K + 1``
    levels ``j / K`` (a "pseudo-window" with ``K + 1`` percentiles), plus its weight and a
    guaranteed error bound.  ``merge`` mixes the two pseudo-windows exactly and re-tabulates.
    Memory is ``O(groups * K)`` whatever the number of windows.  **Use it for tree reductions over
    many partitions when groups are spread across partitions and the rows do not fit.**

Error bound of ``bounded`` (proof in ``docs/analyses/mixture.md``), in probability (Kolmogorov distance of
normalised CDFs): a leaf tabulation is within ``1/K`` of its partition's exact mixture; a merge of
summaries with bounds ``e_a, e_b`` and weights ``W_a, W_b`` is within
``(W_a e_a + W_b e_b) / (W_a + W_b) + tau`` of the exact mixture of all their windows, where
``tau < 1/K`` is the re-tabulation error, measured exactly by :func:`tabulation_error` (the bound
uses ``min(tau + 1e-12, 1/K)``; no re-tabulation -- hence no added error -- when one side has no
weight).  Each group carries this bound (``err``), so ``err <= (1 + d) / K`` where ``d`` is the
number of merges on the deepest leaf-to-root path of that group (in practice 2-3x below that).
Means, weights and counts are exact in both strategies.

All functions use only array-module operations (``numpy`` or ``cupy``, taken from the arrays)
and the backend ops, so partials may live on either backend; the engine moves partials to the
host before merging.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

import numpy as np

from gpuclust._xp import bincount
from gpuclust.backends import backend_of

__all__ = [
    "DEFAULT_K",
    "bounded_partial",
    "empty",
    "exact_partial",
    "finalize",
    "level_column",
    "merge",
    "summary_levels",
    "tabulation_error",
    "to_frame",
    "window_weights",
]

#: Default number of knot intervals of a bounded summary (error <= (1 + merge depth) / K).
DEFAULT_K = 512
_STATS = ("n_windows", "n_repaired", "n_null", "weight", "wmean")
_INT_STATS = ("n_windows", "n_repaired", "n_null")


# --------------------------------------------------------------------------------------------
# plumbing
# --------------------------------------------------------------------------------------------
def _xp_of(a: Any) -> ModuleType:
    return backend_of(a).xp


def _ops_of(a: Any) -> Any:
    """The ops (mixture kernels and their twins) of the backend that owns ``a``."""
    return backend_of(a).ops


def summary_levels(k: int) -> np.ndarray:
    """The ``K + 1`` knot levels ``j / K`` of a bounded summary (exactly 0 and 1 at the ends)."""
    if int(k) != k or k < 1:
        raise ValueError(f"k must be a positive integer, got {k}")
    return np.arange(int(k) + 1, dtype=np.float64) / float(k)


def window_weights(duration_s: Any, sample_rate: Any) -> Any:
    """Sample count of each window: ``duration_s * sample_rate``, or ``duration_s`` when the sample
    rate is missing (NaN) or not positive.  Non-finite or negative durations give weight 0."""
    xp = _xp_of(duration_s)
    d = duration_s.astype(xp.float64)
    r = sample_rate.astype(xp.float64)
    w = xp.where(xp.isfinite(r) & (r > 0), d * r, d)
    return xp.where(xp.isfinite(w) & (w > 0), w, 0.0)


def _unique_inverse(xp: ModuleType, keys: Any) -> tuple[Any, Any]:
    """``unique(keys, return_inverse=True)``, without a sort when ``keys`` is already sorted."""
    keys = keys.astype(xp.int64)
    n = int(keys.shape[0])
    if n and bool((keys[1:] >= keys[:-1]).all()):
        first = xp.ones(n, dtype=bool)
        first[1:] = keys[1:] != keys[:-1]
        return keys[first], xp.cumsum(first.astype(xp.int64)) - 1
    uniq, inv = xp.unique(keys, return_inverse=True)
    return uniq, inv.reshape(-1).astype(xp.int64)


def _group_stats(
    xp: ModuleType, ops: ModuleType, q: Any, w: Any, keys: Any, repaired_input: bool = False
) -> tuple[dict[str, Any], Any, Any, Any]:
    """Repair, per-key counts/weights/mean sums; returns (stats, inverse codes, repaired q, usable mask).
    With ``repaired_input`` the rows of ``q`` are already repaired, finite float64 (no NULL, none
    left to repair), as :func:`repair_percentiles` would return them."""
    if q.shape[0] != w.shape[0] or q.shape[0] != keys.shape[0]:
        raise ValueError("q, w and keys must have the same number of rows")
    if repaired_input:
        qr = xp.ascontiguousarray(q, dtype=xp.float64)
        repaired = null = xp.zeros(q.shape[0], dtype=bool)
    else:
        qr, repaired, null = ops.repair_percentiles(xp.ascontiguousarray(q))
    uniq, inv = _unique_inverse(xp, keys)
    G = int(uniq.shape[0])
    w = w.astype(xp.float64)
    usable = ~null & xp.isfinite(w) & (w > 0)
    wu = xp.where(usable, w, 0.0)
    means = ops.window_means(qr)

    def per_key(v: Any) -> Any:  # (inv: each row's key code, in [0, G))
        return bincount(xp, inv, weights=v, minlength=G, bounded=True)

    stats = {
        "key": uniq.astype(xp.int64),
        "n_windows": per_key((~null).astype(xp.float64)).round().astype(xp.int64),
        "n_repaired": per_key(repaired.astype(xp.float64)).round().astype(xp.int64),
        "n_null": per_key(null.astype(xp.float64)).round().astype(xp.int64),
        "weight": per_key(wu),
        "wmean": per_key(xp.where(usable, wu * xp.where(usable, means, 0.0), 0.0)),
    }
    return stats, inv, qr, usable


def _merge_stats(xp: ModuleType, a: dict[str, Any], b: dict[str, Any]) -> tuple[dict[str, Any], Any, Any]:
    """Union of keys and summed stats; returns (stats, index of a's groups, index of b's groups)."""
    keys = xp.unique(xp.concatenate([a["key"], b["key"]]))
    ia = xp.searchsorted(keys, a["key"])
    ib = xp.searchsorted(keys, b["key"])
    G = int(keys.shape[0])
    out: dict[str, Any] = {"key": keys}
    for s in _STATS:
        dt = xp.int64 if s in _INT_STATS else xp.float64
        acc = xp.zeros(G, dtype=dt)
        acc[ia] += a[s]
        acc[ib] += b[s]
        out[s] = acc
    return out, ia, ib


# --------------------------------------------------------------------------------------------
# public API
# --------------------------------------------------------------------------------------------
def empty(kind: str = "exact", k: int = DEFAULT_K, xp: ModuleType = np) -> dict[str, Any]:
    """The merge identity of a ``kind`` (``"exact"`` or ``"bounded"``) partial."""
    base = {
        "key": xp.zeros(0, dtype=xp.int64),
        **{s: xp.zeros(0, dtype=xp.int64 if s in _INT_STATS else xp.float64) for s in _STATS},
    }
    if kind == "exact":
        return {
            "kind": "exact",
            **base,
            "row_key": xp.zeros(0, dtype=xp.int64),
            "q": xp.zeros((0, 20), dtype=xp.float64),
            "w": xp.zeros(0, dtype=xp.float64),
        }
    if kind == "bounded":
        return {
            "kind": "bounded",
            "k": int(k),
            **base,
            "knots": xp.zeros((0, int(k) + 1), dtype=xp.float64),
            "err": xp.zeros(0, dtype=xp.float64),
        }
    raise ValueError(f"unknown partial kind {kind!r}")


def exact_partial(q: Any, w: Any, keys: Any, *, repaired: bool = False) -> dict[str, Any]:
    """Exact partial of one partition.

    Parameters
    ----------
    q
        ``(n, 20)`` float32/float64 CPU percentiles in sorted-level order (NaN = NULL; rows are
        repaired by a running max and counted).
    w
        ``(n,)`` weights (sample counts, see :func:`window_weights`).
    keys
        ``(n,)`` integer group keys.
    repaired
        ``q`` is already the output of :func:`repair_percentiles` with the NULL rows dropped
        (skips the repair; ``n_repaired`` and ``n_null`` are then 0).

    Returns
    -------
    dict
        ``kind="exact"``; per group (sorted unique ``key``): ``n_windows`` (non-NULL windows),
        ``n_repaired``, ``n_null``, ``weight``, ``wmean`` (sum of ``w * mean_i``); per usable row
        (non-NULL, positive weight): ``row_key``, ``q`` (repaired, float64) and ``w``.

    Examples
    --------
    >>> import numpy as np
    >>> from gpuclust.schema import CPU_PERCENTILE_LEVELS_SORTED as LV
    >>> q = np.array([LV, np.asarray(LV) + 1.0])
    >>> p = exact_partial(q, np.array([1.0, 1.0]), np.array([7, 7]))
    >>> r = finalize(p, np.array([0.25, 0.5]))
    >>> r["key"].tolist(), r["mean"].round(12).tolist(), r["quantiles"].round(12).tolist()
    ([7], [1.0], [[0.5, 1.0]])
    """
    xp = _xp_of(q)
    ops = _ops_of(q)
    stats, inv, qr, usable = _group_stats(xp, ops, q, w, keys, repaired)
    w = w.astype(xp.float64)
    if bool(usable.all()):  # no copy of the (n, 20) matrix when every row is usable
        return {"kind": "exact", **stats, "row_key": stats["key"][inv], "q": qr, "w": w}
    rows = xp.flatnonzero(usable)
    return {
        "kind": "exact",
        **stats,
        "row_key": stats["key"][inv[rows]],
        "q": xp.ascontiguousarray(qr[rows]),
        "w": w[rows],
    }


def bounded_partial(q: Any, w: Any, keys: Any, k: int = DEFAULT_K, *, repaired: bool = False) -> dict[str, Any]:
    """Bounded partial of one partition: per group the exact mixture tabulated at ``K + 1`` knots.

    Same inputs (and ``repaired`` option) as :func:`exact_partial`.  Per group: the stats of :func:`exact_partial`,
    ``knots`` (``(G, K + 1)``: the mixture's quantiles at ``j / K``; NaN without weight) and
    ``err`` (the guaranteed Kolmogorov-distance bound, ``1/K`` here; 0 without weight).

    Examples
    --------
    >>> import numpy as np
    >>> from gpuclust.schema import CPU_PERCENTILE_LEVELS_SORTED as LV
    >>> p = bounded_partial(np.array([LV]), np.array([3.0]), np.array([1]), k=4)
    >>> p["knots"].round(12).tolist(), p["err"].tolist()
    ([[0.0, 0.25, 0.5, 0.75, 1.0]], [0.25])
    """
    xp = _xp_of(q)
    ops = _ops_of(q)
    stats, inv, qr, usable = _group_stats(xp, ops, q, w, keys, repaired)
    lv = summary_levels(k)
    G = int(stats["key"].shape[0])
    if bool(usable.all()):  # no copies when every row is usable
        qu, wu, iu = qr, w.astype(xp.float64), inv
    else:
        rows = xp.flatnonzero(usable)
        qu, wu, iu = qr[rows], w.astype(xp.float64)[rows], inv[rows]
    knots = ops.mixture_quantiles(
        xp.ascontiguousarray(qu), xp.ascontiguousarray(wu), xp.ascontiguousarray(iu), G, xp.asarray(lv)
    )
    err = xp.where(stats["weight"] > 0, 1.0 / float(k), 0.0)
    return {"kind": "bounded", "k": int(k), **stats, "knots": knots, "err": err}


#: Added to a measured re-tabulation error to cover the rounding of its evaluation.
TAB_SLACK = 1e-12
#: Knots a host merge re-tabulates at once (:func:`merge`): groups of ``k + 1`` knots per chunk.
MERGE_CELLS = 1 << 19


def _cdf_at_sorted_points(xp: ModuleType, y: Any, lv: Any, pts: Any, cnt_right: Any, cnt_left: Any) -> tuple[Any, Any]:
    """Right values and left limits at ``pts`` of the piecewise-linear CDFs through ``(y[r], lv)``,
    given per point the number of knots ``<= x`` (``cnt_right``) and ``< x`` (``cnt_left``)."""
    n1 = y.shape[1]
    yf = xp.ascontiguousarray(y).reshape(-1)  # flat gathers: faster than take_along_axis's index grids
    base = (xp.arange(y.shape[0], dtype=xp.int64) * n1)[:, None]
    dlv = lv[1:] - lv[:-1]  # (gathered once: the same bits as lv[kc + 1] - lv[kc])
    out = []
    for cnt in (cnt_right, cnt_left):
        k = cnt - 1  # last knot <= x (right) / < x (left): x lies inside a non-flat segment after it
        kc = xp.clip(k, 0, n1 - 2)
        at = base + kc
        ya, yb = yf[at], yf[at + 1]
        inner = lv[kc] + dlv[kc] * (pts - ya) / xp.where(yb > ya, yb - ya, 1.0)
        out.append(xp.where(k < 0, 0.0, xp.where(k >= n1 - 1, 1.0, inner)))
    return out[0], out[1]


def tabulation_error(ka: Any, kb: Any, alpha: Any, knots: Any, lv: np.ndarray) -> Any:
    """Exact ``sup_x |H_hat(x) - H(x)|`` per row, where ``H = alpha G_a + (1 - alpha) G_b`` is the
    mixture of the piecewise-linear CDFs through ``(ka, lv)`` and ``(kb, lv)`` and ``H_hat`` the one
    through ``(knots, lv)``.  Between consecutive breakpoints of the three both sides are linear,
    so the sup is attained at a breakpoint (value or left limit): one row-wise sort of all
    breakpoints, then per knot set the counts of knots ``<= x`` and ``< x`` from cumulative sums
    over the sorted labels (ties resolved over runs of equal values)."""
    xp = _xp_of(ka)
    n, n1 = ka.shape
    lvx = xp.asarray(lv)
    allv = xp.concatenate([ka, kb, knots], axis=1)
    # three sorted runs a row: a stable sort (a merge of runs on the host) takes 0.4-0.8x the time
    # of the default; the counts below do not depend on the order of equal values
    order = xp.argsort(allv, axis=1, kind="stable")
    pts = xp.take_along_axis(allv, order, axis=1)
    label = order // n1  # 0: ka, 1: kb, 2: new knots
    m = pts.shape[1]
    # run boundaries of equal values
    last = xp.ones((n, m), dtype=bool)
    last[:, :-1] = pts[:, 1:] != pts[:, :-1]
    first = xp.ones((n, m), dtype=bool)
    first[:, 1:] = pts[:, 1:] != pts[:, :-1]
    big = m + 1
    vals = []
    for s, y in enumerate((ka, kb, knots)):
        c = xp.cumsum((label == s).astype(xp.int64), axis=1)
        # <= x: the count at the end of x's run (propagated backwards from run ends)
        rev = xp.where(last, c, big)[:, ::-1]
        c_right = _ops_of(rev).cummin_rows(rev)[:, ::-1]
        # < x: the count just before x's run starts (propagated forwards from run starts)
        before = c - (label == s).astype(xp.int64)
        c_left = _ops_of(before).cummax_rows(xp.where(first, before, -1))
        vals.append(_cdf_at_sorted_points(xp, y, lvx, pts, c_right, c_left))
    (ga_r, ga_l), (gb_r, gb_l), (h_r, h_l) = vals
    al = alpha[:, None]
    d_r = xp.abs(h_r - (al * ga_r + (1.0 - al) * gb_r))
    d_l = xp.abs(h_l - (al * ga_l + (1.0 - al) * gb_l))
    return xp.maximum(d_r.max(axis=1), d_l.max(axis=1))


def merge(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    """Merge two partials of the same kind (associative and commutative up to float rounding;
    for ``bounded`` the knots of a group merged with weight on both sides are re-tabulated)."""
    if a["kind"] != b["kind"]:
        raise ValueError(f"cannot merge a {a['kind']!r} partial with a {b['kind']!r} partial")
    xp = _xp_of(a["weight"])
    stats, ia, ib = _merge_stats(xp, a, b)
    if a["kind"] == "exact":
        return {
            "kind": "exact",
            **stats,
            "row_key": xp.concatenate([a["row_key"], b["row_key"]]),
            "q": xp.concatenate([a["q"], b["q"]]),
            "w": xp.concatenate([a["w"], b["w"]]),
        }
    k = int(a["k"])
    if int(b["k"]) != k:
        raise ValueError(f"cannot merge bounded partials with K={k} and K={b['k']}")
    G = int(stats["key"].shape[0])
    lv = xp.asarray(summary_levels(k))
    wa = xp.zeros(G)
    wb = xp.zeros(G)
    wa[ia] = a["weight"]
    wb[ib] = b["weight"]
    ka = xp.full((G, k + 1), xp.nan)
    kb = xp.full((G, k + 1), xp.nan)
    ka[ia] = a["knots"]
    kb[ib] = b["knots"]
    ea = xp.zeros(G)
    eb = xp.zeros(G)
    ea[ia] = a["err"]
    eb[ib] = b["err"]
    both = (wa > 0) & (wb > 0)
    sel = xp.flatnonzero(both)
    knots = xp.where((wa > 0)[:, None], ka, kb)
    err = xp.where(wa > 0, ea, eb)
    ops = _ops_of(ka)
    ns = int(sel.shape[0])
    # the re-tabulation a chunk of groups at a time on the host: its temporaries (about 15 arrays of
    # 3 (k + 1) numbers a group) stay the chunk's size, not the groups' (bit-identical: groups are
    # independent); on a device all at once
    step = max(1, MERGE_CELLS // (k + 1)) if ops.lookup_block_rows is not None else max(ns, 1)
    for i in range(0, ns, step):
        s = sel[i : i + step] if ns > step else sel
        n_s = int(s.shape[0])
        qq = xp.ascontiguousarray(xp.concatenate([ka[s], kb[s]]))
        ww = xp.ascontiguousarray(xp.concatenate([wa[s], wb[s]]))
        gg = xp.ascontiguousarray(xp.concatenate([xp.arange(n_s), xp.arange(n_s)]).astype(xp.int64))
        mixed = ops.mixture_quantiles(qq, ww, gg, n_s, lv, q_levels=lv)
        knots[s] = mixed
        W = wa[s] + wb[s]
        tab = tabulation_error(ka[s], kb[s], wa[s] / W, mixed, summary_levels(k))
        err[s] = (wa[s] * ea[s] + wb[s] * eb[s]) / W + xp.minimum(tab + TAB_SLACK, 1.0 / float(k))
    return {"kind": "bounded", "k": k, **stats, "knots": knots, "err": xp.minimum(err, 1.0)}


def finalize(p: dict[str, Any], levels: Any = None) -> dict[str, Any]:
    """Per-group results: ``key``, ``n_windows``, ``n_repaired``, ``n_null``, ``weight``, ``mean``
    (``sum w mean_i / sum w``), ``levels``, ``quantiles`` (``(G, L)``) and ``err_bound`` (0 for
    ``exact``; the Kolmogorov-distance bound for ``bounded``).  ``levels`` defaults to the 20
    standard percentile levels.  Groups with no weight have NaN mean and quantiles."""
    from gpuclust.schema import CPU_PERCENTILE_LEVELS_SORTED

    xp = _xp_of(p["weight"])
    ops = _ops_of(p["weight"])
    if levels is None:
        levels = np.asarray(CPU_PERCENTILE_LEVELS_SORTED, dtype=np.float64)
    lv = xp.asarray(levels, dtype=xp.float64)
    lv = xp.ascontiguousarray(lv.reshape(-1))
    G = int(p["key"].shape[0])
    weight = p["weight"]
    with np.errstate(invalid="ignore", divide="ignore"):
        mean = xp.where(weight > 0, p["wmean"] / xp.where(weight > 0, weight, 1.0), xp.nan)
    if p["kind"] == "exact":
        codes = xp.ascontiguousarray(xp.searchsorted(p["key"], p["row_key"]).astype(xp.int64))
        quant = ops.mixture_quantiles(xp.ascontiguousarray(p["q"]), xp.ascontiguousarray(p["w"]), codes, G, lv)
        err = xp.zeros(G)
    else:
        klv = xp.asarray(summary_levels(int(p["k"])))
        has = weight > 0
        quant = ops.mixture_quantiles(
            xp.ascontiguousarray(xp.where(has[:, None], p["knots"], 0.0)),
            xp.ascontiguousarray(xp.where(has, weight, 0.0)),
            xp.arange(G, dtype=xp.int64),
            G,
            lv,
            q_levels=klv,
        )
        err = p["err"]
    return {
        "key": p["key"],
        "n_windows": p["n_windows"],
        "n_repaired": p["n_repaired"],
        "n_null": p["n_null"],
        "weight": weight,
        "mean": mean,
        "levels": lv,
        "quantiles": quant,
        "err_bound": err,
    }


def level_column(level: float) -> str:
    """Column name of a quantile level in :func:`to_frame`: ``cpu_p50``, ``cpu_p99``, ``cpu_p99.9``."""
    return "cpu_p" + f"{float(level) * 100:.10g}"


def to_frame(result: dict[str, Any]) -> Any:
    """A :func:`finalize` result as a host :class:`pandas.DataFrame`, one row per group: ``key``,
    ``n_windows``, ``n_repaired``, ``n_null``, ``weight``, ``mean``, ``err_bound`` and one column per
    level (:func:`level_column`; the 20 standard levels give the schema's ``cpu_p*`` names)."""
    import pandas as pd

    from gpuclust.analyses.base import to_host

    r = to_host(result)
    cols: dict[str, Any] = {
        f: r[f] for f in ("key", "n_windows", "n_repaired", "n_null", "weight", "mean", "err_bound")
    }
    for j, lv in enumerate(np.asarray(r["levels"]).tolist()):
        cols[level_column(lv)] = r["quantiles"][:, j]
    return pd.DataFrame(cols)
