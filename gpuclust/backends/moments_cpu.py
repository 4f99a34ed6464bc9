"""Grouped weighted co-moments: the NumPy op (test oracle for ``moments_gpu``) and the merge algebra.

A :class:`Moments` partial holds, per group ``g``:

``n[g]``      int64, number of rows used (see *Row validity* below);
``W[g]``      float64, sum of weights;
``mean[g]``   float64 ``(d,)``, weighted mean ``sum(w x) / W``;
``C[g]``      float64 ``(d, d)``, weighted co-moment ``sum(w (x - mean)(x - mean)^T)``.

Moments are never stored as raw sums of squares.  One partition is computed with the *corrected
two-pass* algorithm (Bjorck; Chan, Golub & LeVeque 1983): pass 1 gives ``m0 = sum(w x) / W``;
pass 2 accumulates ``s = sum(w (x - m0))`` and ``P = sum(w (x - m0)(x - m0)^T)``, and the result
is ``mean = m0 + s / W``, ``C = P - s s^T / W``.  The correction term removes the first-order
effect of rounding in ``m0``, so a CPI column of ``1e3 +- 1e-3`` keeps its full relative
precision.  Partials merge with Chan et al.'s pairwise formula for weighted data
(:func:`merge_moments`); many groups collapse into coarser groups with the same formula written
for k parts at once (:func:`regroup_moments`).

Row validity (identical on both backends): a row is used iff ``0 <= group < n_groups``, the
weight is finite and ``> 0``, and every ``x`` entry is finite.  Other rows contribute nothing,
not even to ``n``.  Empty groups have ``n = 0, W = 0, mean = 0, C = 0``; that is also the merge
identity (:meth:`Moments.empty`).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from gpuclust._xp import bincount
from gpuclust.partials import Moments

__all__ = [
    "Moments",
    "check_grouped_comoments",
    "empty_moments",
    "finish_comoments",
    "grouped_comoments",
    "merge_moments",
    "merge_moments_xp",
    "regroup_moments",
]

_X_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))
_W_DTYPES = (np.dtype(np.float64),)
_G_DTYPES = (np.dtype(np.int32), np.dtype(np.int64))


def empty_moments(n_groups: int, d: int) -> Moments:
    """NumPy merge identity (same as ``Moments.empty(n_groups, d)``)."""
    return Moments.empty(n_groups, d, np)


def check_grouped_comoments(x: Any, w: Any, group: Any, n_groups: int) -> tuple[int, int]:
    """Validate :func:`grouped_comoments` arguments (shared by both backends); returns ``(n, d)``."""
    if getattr(x, "ndim", None) != 2:
        raise ValueError(f"x must be a 2-D array (rows, variables), got {getattr(x, 'shape', type(x).__name__)}")
    if x.dtype not in _X_DTYPES:
        raise TypeError(f"x must have dtype float32 or float64, got {x.dtype}")
    n, d = (int(s) for s in x.shape)
    if d < 1:
        raise ValueError("x must have at least one column")
    for name, a, dts in (("w", w, _W_DTYPES), ("group", group, _G_DTYPES)):
        if getattr(a, "ndim", None) != 1:
            raise ValueError(f"{name} must be a 1-D array, got {getattr(a, 'shape', type(a).__name__)}")
        if a.dtype not in dts:
            raise TypeError(f"{name} must have dtype {' or '.join(map(str, dts))}, got {a.dtype}")
        if a.shape[0] != n:
            raise ValueError(f"{name} has length {a.shape[0]}, expected {n}")
    for name, a in (("x", x), ("w", w), ("group", group)):
        if not a.flags.c_contiguous:
            raise ValueError(f"{name} must be C-contiguous")
    if not 0 <= int(n_groups) <= 2**31 - 1:
        raise ValueError(f"n_groups must be in [0, 2^31), got {n_groups}")
    return n, d


def tri_indices(d: int) -> tuple[np.ndarray, np.ndarray]:
    """Packed upper-triangle order ``(i, j), i <= j`` used by both backends' pass-2 accumulators."""
    return np.triu_indices(d)


def finish_comoments(xp: Any, acc1: Any, acc2: Any, m0: Any, d: int) -> Moments:
    """Turn the two passes' accumulators into :class:`Moments` (both backends share this step).

    ``acc1[:, 0]`` rows used, ``acc1[:, 1]`` weight sums; ``acc2[:, :d]`` is ``s = sum w (x - m0)``
    and ``acc2[:, d:]`` the packed upper triangle of ``P = sum w (x - m0)(x - m0)^T``.
    """
    G = acc1.shape[0]
    n = xp.rint(acc1[:, 0]).astype(xp.int64)
    W = acc1[:, 1].copy()
    has = W > 0
    Wsafe = xp.where(has, W, 1.0)
    s = acc2[:, :d]
    iu, ju = (xp.asarray(t) for t in tri_indices(d))
    P = xp.zeros((G, d, d), dtype=xp.float64)
    P[:, iu, ju] = acc2[:, d:]
    P[:, ju, iu] = acc2[:, d:]
    mean = xp.where(has[:, None], m0 + s / Wsafe[:, None], 0.0)
    C = P - s[:, :, None] * s[:, None, :] / Wsafe[:, None, None]
    C = xp.where(has[:, None, None], C, 0.0)
    # Exact symmetry and non-negative diagonal (rounding may leave -tiny on a constant column).
    C = 0.5 * (C + xp.swapaxes(C, 1, 2))
    diag = xp.arange(d)
    C[:, diag, diag] = xp.maximum(C[:, diag, diag], 0.0)
    return Moments(n, W, mean, C)


#: Rows per block of :func:`grouped_comoments` (at least; ``8 * n_groups`` when that is larger).
_BLOCK_ROWS = 1 << 15


def _valid_block(
    x: np.ndarray, w: np.ndarray, group: np.ndarray, G: int, lo: int, hi: int
) -> tuple[np.ndarray, np.ndarray, list[np.ndarray]]:
    """Rows ``[lo, hi)`` that are used (see *Row validity*): group codes (intp), weights and the
    float64 columns of ``x``."""
    xb, wb, gb = x[lo:hi], w[lo:hi], group[lo:hi]
    d = xb.shape[1]
    with np.errstate(invalid="ignore"):
        ok = (wb > 0) & (wb < np.inf)  # finite and positive (False for NaN)
        if not (int(gb.min()) >= 0 and int(gb.max()) < G):
            ok &= (gb >= 0) & (gb < G)
        for k in range(d):
            ok &= np.isfinite(xb[:, k])
    if ok.all():
        return gb.astype(np.intp, copy=False), wb, [xb[:, k].astype(np.float64) for k in range(d)]
    idx = np.flatnonzero(ok)
    return gb[idx].astype(np.intp, copy=False), wb[idx], [xb[idx, k].astype(np.float64) for k in range(d)]


def grouped_comoments(x: np.ndarray, w: np.ndarray, group: np.ndarray, n_groups: int) -> Moments:
    """Per-group weighted count, weight sum, means and co-moment matrices (corrected two-pass).

    Parameters
    ----------
    x
        float32 or float64 array ``(n, d)``, C-contiguous: one row per observation.
    w
        float64 weights ``(n,)`` (e.g. CPU-seconds).  Rows with a non-finite or non-positive
        weight are ignored.
    group
        int32 or int64 group codes ``(n,)``; codes outside ``[0, n_groups)`` are ignored.
    n_groups
        Number of groups ``G``.

    Returns
    -------
    Moments
        ``n (G,)``, ``W (G,)``, ``mean (G, d)``, ``C (G, d, d)``, all float64 except ``n`` (int64).

    Notes
    -----
    Accumulation is in float64 (float32 ``x`` is widened first).  A row with any non-finite
    ``x`` entry is ignored as a whole (listwise deletion).  Both passes run over blocks of
    :data:`_BLOCK_ROWS` rows (``8 * n_groups`` when larger); per-group sums add the blocks' sums.

    Examples
    --------
    >>> import numpy as np
    >>> x = np.array([[1.0, 2.0], [3.0, 6.0], [5.0, 0.0]])
    >>> m = grouped_comoments(x, np.array([1.0, 1.0, 2.0]), np.array([0, 0, 1]), 2)
    >>> m.mean.tolist()
    [[2.0, 4.0], [5.0, 0.0]]
    >>> m.C[0].tolist()
    [[2.0, 4.0], [4.0, 8.0]]
    """
    n, d = check_grouped_comoments(x, w, group, n_groups)
    G = int(n_groups)
    if G == 0:
        return Moments.empty(0, d)
    # Both passes run over blocks of rows: a block's temporaries (validity mask, widened columns,
    # deviations, products) stay in cache and are small heap allocations, where whole-column
    # temporaries would each be a fresh mapping (page faults).  Per-group sums add the blocks'
    # bincounts; blocks hold at least 8 G rows so the per-block (G,) outputs stay cheap.
    B = max(_BLOCK_ROWS, 8 * G)
    iu, ju = tri_indices(d)
    acc1 = np.zeros((G, 2 + d), dtype=np.float64)
    cnt = np.zeros(G, dtype=np.int64)
    for lo in range(0, n, B):
        g, wv, cols = _valid_block(x, w, group, G, lo, min(lo + B, n))
        cnt += np.bincount(g, minlength=G)
        acc1[:, 1] += np.bincount(g, weights=wv, minlength=G)
        for k in range(d):
            acc1[:, 2 + k] += np.bincount(g, weights=wv * cols[k], minlength=G)
    acc1[:, 0] = cnt
    has = acc1[:, 1] > 0
    m0 = np.where(has[:, None], acc1[:, 2:] / np.where(has, acc1[:, 1], 1.0)[:, None], 0.0)
    m0c = [np.ascontiguousarray(m0[:, k]) for k in range(d)]
    acc2 = np.zeros((G, d + iu.shape[0]), dtype=np.float64)
    for lo in range(0, n, B):
        g, wv, cols = _valid_block(x, w, group, G, lo, min(lo + B, n))
        dev = [cols[k] - m0c[k][g] for k in range(d)]
        for k in range(d):
            wd = wv * dev[k]
            acc2[:, k] += np.bincount(g, weights=wd, minlength=G)
            for t in np.flatnonzero(iu == k).tolist():
                acc2[:, d + t] += np.bincount(g, weights=wd * dev[int(ju[t])], minlength=G)
    return finish_comoments(np, acc1, acc2, m0, d)


def merge_moments_xp(xp: Any, a: Moments, b: Moments) -> Moments:
    """:func:`merge_moments` written against an array module ``xp`` (NumPy or CuPy)."""
    if a.mean.shape != b.mean.shape:
        raise ValueError(f"cannot merge moments of shapes {a.mean.shape} and {b.mean.shape}")
    W = a.W + b.W
    ea, eb = a.W <= 0, b.W <= 0
    Wsafe = xp.where(W > 0, W, 1.0)
    # Symmetric in (a, b): commutative bit for bit; empty sides pass the other through exactly.
    mean = (a.W[:, None] * a.mean + b.W[:, None] * b.mean) / Wsafe[:, None]
    mean = xp.where(ea[:, None], b.mean, xp.where(eb[:, None], a.mean, mean))
    delta = b.mean - a.mean
    f = xp.where(ea | eb, 0.0, a.W * b.W / Wsafe)
    C = a.C + b.C + f[:, None, None] * (delta[:, :, None] * delta[:, None, :])
    C = xp.where(ea[:, None, None], b.C, xp.where(eb[:, None, None], a.C, C))
    return Moments(a.n + b.n, W, mean, C)


def merge_moments(a: Moments, b: Moments) -> Moments:
    """Merge two partials over the same groups (Chan et al.'s pairwise formula, weighted).

    ``W = Wa + Wb``, ``mean = (Wa ma + Wb mb) / W``,
    ``C = Ca + Cb + (Wa Wb / W) (mb - ma)(mb - ma)^T``.  Empty groups (``W = 0``) are the
    identity: ``merge(empty, b)`` returns ``b`` exactly.  Commutative bit for bit; associative up
    to float rounding.

    Examples
    --------
    >>> import numpy as np
    >>> x = np.array([[1.0], [2.0], [4.0]]); w = np.array([1.0, 2.0, 1.0]); g = np.zeros(3, dtype=np.int64)
    >>> a = grouped_comoments(x[:1], w[:1], g[:1], 1); b = grouped_comoments(x[1:], w[1:], g[1:], 1)
    >>> m = merge_moments(a, b)
    >>> m.mean.tolist(), m.C.tolist()
    ([[2.25]], [[[4.75]]])
    """
    return merge_moments_xp(np, a, b)


def regroup_moments(m: Moments, mapping: Any, n_out: int, xp: Any = np) -> Moments:
    """Merge groups into coarser groups: output group ``mapping[g]`` receives group ``g``.

    The k-way form of Chan's formula, with the corrected-two-pass term: for an output group,
    ``W = sum W_g``, ``mean = sum W_g m_g / W``,
    ``C = sum C_g + sum W_g (m_g - mean)(m_g - mean)^T - s s^T / W`` with
    ``s = sum W_g (m_g - mean)``.  Groups mapped outside ``[0, n_out)`` are dropped.  Use it to
    merge keyed partials (concatenate, then regroup by key) or to roll machines up to cells.
    ``xp``: the arrays' module (NumPy by default; CuPy for device arrays).

    Examples
    --------
    >>> import numpy as np
    >>> x = np.array([[1.0], [2.0], [4.0]]); w = np.ones(3)
    >>> m = grouped_comoments(x, w, np.array([0, 1, 2]), 3)
    >>> r = regroup_moments(m, np.array([0, 0, 0]), 1)
    >>> r.n.tolist(), r.mean.tolist(), round(float(r.C[0, 0, 0]), 12)
    ([3], [[2.3333333333333335]], 4.666666666667)
    """
    mapping = xp.asarray(mapping)
    if mapping.shape != (m.n_groups,):
        raise ValueError(f"mapping must have shape ({m.n_groups},), got {mapping.shape}")
    d = m.d
    keep = (mapping >= 0) & (mapping < n_out) & (m.W > 0)
    g = mapping[keep].astype(xp.int64)
    Wg, mg, Cg, ng = m.W[keep], m.mean[keep], m.C[keep], m.n[keep]
    out = Moments.empty(n_out, d, xp)
    if g.shape[0] == 0:
        return out
    W = bincount(xp, g, weights=Wg, minlength=n_out)
    n = bincount(xp, g, weights=ng.astype(xp.float64), minlength=n_out)
    has = W > 0
    Wsafe = xp.where(has, W, 1.0)
    mean = xp.stack([bincount(xp, g, weights=Wg * mg[:, k], minlength=n_out) for k in range(d)], axis=1)
    mean = xp.where(has[:, None], mean / Wsafe[:, None], 0.0)
    dev = mg - mean[g]
    s = xp.stack([bincount(xp, g, weights=Wg * dev[:, k], minlength=n_out) for k in range(d)], axis=1)
    C = xp.zeros((n_out, d, d))
    for i in range(d):
        for j in range(i, d):
            v = bincount(xp, g, weights=Cg[:, i, j] + Wg * dev[:, i] * dev[:, j], minlength=n_out)
            C[:, i, j] = v
            C[:, j, i] = v
    C = C - s[:, :, None] * s[:, None, :] / Wsafe[:, None, None]
    mean = xp.where(has[:, None], mean + s / Wsafe[:, None], 0.0)
    C = xp.where(has[:, None, None], C, 0.0)
    return Moments(xp.rint(n).astype(xp.int64), xp.where(has, W, 0.0), mean, C)
