"""CuPy twins of ``array_cpu`` (same names, signatures and results).  CuPy is imported lazily."""

from __future__ import annotations

from typing import Any

import numpy as np

from gpuclust._xp import bincount

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


def _cp() -> Any:
    import cupy

    return cupy


def stable_argsort(a: Any) -> Any:
    """Indices that sort ``a`` (1-D), equal elements in their original order (CuPy sorts are stable)."""
    return _cp().argsort(a)


def _atomic_max(out: Any, idx: Any, values: Any) -> None:
    """``cupy.maximum.at`` (CuPy 14 deprecates ``cupyx.scatter_max`` for it; older CuPy has only
    the latter)."""
    cp = _cp()
    at = getattr(cp.maximum, "at", None)
    if at is not None:
        at(out, idx, values)
    else:  # CuPy < 14
        import cupyx

        cupyx.scatter_max(out, idx, values)


def _float_key(x: Any) -> Any:
    """float64 bits as int64 keys in the floats' order (negative floats' magnitude bits flipped);
    its own inverse on the bits."""
    cp = _cp()
    b = x.view(cp.int64)
    return cp.where(b < 0, b ^ cp.int64(0x7FFFFFFFFFFFFFFF), b)


def scatter_max(out: Any, idx: Any, values: Any) -> None:
    """``out[idx[j]] = max(out[idx[j]], values[j])`` in place (atomic maxima).  CuPy's atomics
    take int32, uint32, uint64 and floats: int64 goes through uint64 with the sign bit flipped
    (an order-preserving map)."""
    cp = _cp()
    if out.dtype == cp.float64:  # an order-preserving map of the float's bits to int64 (no NaN)
        key = _float_key(out)
        scatter_max(key, idx, _float_key(values.astype(cp.float64, copy=False)))
        out[...] = _float_key(key).view(cp.float64)
        return
    if out.dtype != cp.int64:
        _atomic_max(out, idx, values.astype(out.dtype, copy=False))
        return
    sign = cp.uint64(1 << 63)
    u = out.view(cp.uint64) ^ sign
    _atomic_max(u, idx, values.astype(cp.int64, copy=False).view(cp.uint64) ^ sign)
    out[...] = (u ^ sign).view(cp.int64)


def cummax_rows(a: Any) -> Any:
    """Running maximum along each row: Hillis-Steele doubling (log2(m) passes of array ops)."""
    cp = _cp()
    out = a.copy()
    step = 1
    while step < out.shape[1]:
        nxt = out.copy()
        nxt[:, step:] = cp.maximum(out[:, step:], out[:, :-step])
        out = nxt
        step *= 2
    return out


def cummin_rows(a: Any) -> Any:
    """Running minimum along each row."""
    return -cummax_rows(-a)


def run_max(values: Any, starts: Any) -> Any:
    """The maximum of each run of ``values`` beginning at ``starts``: each row's run by a prefix
    count of the run starts, then atomic maxima (:func:`scatter_max`) into the runs (values
    without NaN)."""
    cp = _cp()
    n = int(values.shape[0])
    if n == 0:
        return values[:0].copy()
    first = cp.zeros(n, dtype=cp.int64)
    first[starts] = 1
    out = cp.full(
        int(starts.shape[0]), -np.inf if values.dtype.kind == "f" else np.iinfo(values.dtype).min, dtype=values.dtype
    )
    scatter_max(out, cp.cumsum(first) - 1, values)
    return out


def repeat_index(counts: Any) -> Any:
    """Each index ``i`` of ``counts`` repeated ``counts[i]`` times (CuPy's ``repeat`` takes no
    array of counts: a search of each output position among the running ends)."""
    cp = _cp()
    ends = cp.cumsum(counts.astype(cp.int64))
    total = int(ends[-1]) if int(counts.shape[0]) else 0
    return cp.searchsorted(ends, cp.arange(total, dtype=cp.int64), side="right")


def run_weighted_sums(first: Any, inv: Any, n_runs: int, w: Any, q: Any) -> Any:
    """``(n_runs, d)`` sums of ``w[:, None] * q`` per run of rows (``inv``: each row's run)."""
    cp = _cp()
    return cp.stack([bincount(cp, inv, w * q[:, j], n_runs, bounded=True) for j in range(q.shape[1])], axis=1)


def gather_repair_percentiles(cols: list[Any], idx: Any) -> tuple[Any, Any, Any]:
    """``repair_percentiles`` of the rows ``idx`` of the percentile columns: one float64 matrix,
    filled column by column (no stacked intermediate copies), repaired by the kernel."""
    from gpuclust.backends.mixture_gpu import repair_percentiles

    cp = _cp()
    q = cp.empty((int(idx.shape[0]), len(cols)), dtype=cp.float64)
    for j, c in enumerate(cols):
        q[:, j] = c[idx]
    return repair_percentiles(q)
