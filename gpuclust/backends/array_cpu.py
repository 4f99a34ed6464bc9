"""Array helpers whose fastest form differs by backend (NumPy twins of ``array_gpu``).

Analyses call them as ``backend.ops.<name>`` (or through :func:`gpuclust.backends.backend_of`),
so they never branch on the array module themselves.  Each returns what its GPU twin returns.
"""

from __future__ import annotations

import numpy as np

__all__ = [
    "cummax_rows",
    "cummin_rows",
    "gather_repair_percentiles",
    "repeat_index",
    "run_max",
    "run_weighted_sums",
    "scatter_max",
    "stable_argsort",
]


def stable_argsort(a: np.ndarray) -> np.ndarray:
    """Indices that sort ``a`` (1-D), equal elements in their original order."""
    return np.argsort(a, kind="stable")


def scatter_max(out: np.ndarray, idx: np.ndarray, values: np.ndarray) -> None:
    """``out[idx[j]] = max(out[idx[j]], values[j])`` for every ``j``, repeated indices included
    (in place; ``numpy.maximum.at``).

    >>> out = np.full(3, -1, np.int32)
    >>> scatter_max(out, np.array([2, 0, 2]), np.array([4, 1, 7], np.int32))
    >>> out.tolist()
    [1, -1, 7]
    """
    np.maximum.at(out, idx, values)


def cummax_rows(a: np.ndarray) -> np.ndarray:
    """Running maximum along each row of a 2-D array."""
    return np.maximum.accumulate(a, axis=1)


def cummin_rows(a: np.ndarray) -> np.ndarray:
    """Running minimum along each row of a 2-D array."""
    return np.minimum.accumulate(a, axis=1)


def run_max(values: np.ndarray, starts: np.ndarray) -> np.ndarray:
    """The maximum of each run of ``values`` (runs begin at the increasing indices ``starts``,
    ``starts[0] == 0``; values without NaN; ``numpy.maximum.reduceat``).

    >>> run_max(np.array([3.0, 1.0, 2.0, 5.0]), np.array([0, 1])).tolist()
    [3.0, 5.0]
    """
    return np.maximum.reduceat(values, starts)


def repeat_index(counts: np.ndarray) -> np.ndarray:
    """Each index ``i`` of ``counts`` repeated ``counts[i]`` times (``counts >= 0``).

    >>> repeat_index(np.array([2, 0, 1])).tolist()
    [0, 0, 2]
    """
    return np.repeat(np.arange(counts.shape[0]), counts)


def run_weighted_sums(first: np.ndarray, inv: np.ndarray, n_runs: int, w: np.ndarray, q: np.ndarray) -> np.ndarray:
    """``(n_runs, d)`` sums of ``w[:, None] * q`` over the contiguous runs of rows that ``first``
    starts (``inv``: each row's run), added sequentially in row order, a block of rows at a time
    (bounded temporaries)."""
    starts = np.flatnonzero(first)
    out = np.zeros((n_runs, q.shape[1]))
    step = 1 << 16
    r0 = 0
    while r0 < first.shape[0]:
        r1 = min(first.shape[0], r0 + step)
        g0, g1 = int(inv[r0]), int(inv[r1 - 1]) + 1
        st = np.maximum(starts[g0:g1], r0) - r0
        out[g0:g1] += np.add.reduceat(w[r0:r1, None] * q[r0:r1], st, axis=0)
        r0 = r1
    return out


def gather_repair_percentiles(cols: list[np.ndarray], idx: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``repair_percentiles`` of the rows ``idx`` of the percentile columns ``cols`` (ascending
    levels): ``(repaired float64 matrix, repaired-row mask, NULL-row mask)``.  Float columns are
    folded per block of rows into the running maximum without the gathered matrix (the same
    values and masks as the op on it)."""
    if not all(c.dtype in (np.float32, np.float64) for c in cols):
        from gpuclust.backends.mixture_cpu import repair_percentiles

        q = np.empty((int(idx.shape[0]), len(cols)), dtype=np.float64)
        for j, c in enumerate(cols):
            q[:, j] = c[idx]
        return repair_percentiles(q)
    n = int(idx.shape[0])
    rep = np.empty((n, len(cols)), dtype=np.float64)
    null = np.empty(n, dtype=bool)
    changed = np.empty(n, dtype=bool)
    step = 1 << 12  # row blocks that stay in cache
    for r0 in range(0, n, step):
        ib = idx[r0 : r0 + step]
        rb = rep[r0 : r0 + step]
        run = cols[0][ib].astype(np.float64)
        fin = np.isfinite(run)
        ch = np.zeros(ib.shape[0], dtype=bool)
        rb[:, 0] = run
        for j in range(1, len(cols)):
            c = cols[j][ib].astype(np.float64, copy=False)
            fin &= np.isfinite(c)
            np.maximum(run, c, out=run)
            ch |= run != c
            rb[:, j] = run
        nb = ~fin
        rb[nb] = np.nan
        null[r0 : r0 + step] = nb
        changed[r0 : r0 + step] = ch
    return rep, changed & ~null, null
