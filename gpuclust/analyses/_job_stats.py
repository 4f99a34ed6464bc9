"""job-usage's finalize statistics, on the arrays' own module: the order of the jobs table, the
heavy-tail statistics of a tier's per-collection totals and the correlation of CPU with memory.

Each function takes NumPy arrays (the cpu path, and a merged partial) or a device's (the partial a
gpu run leaves on the device, ``JobUsage.device_partial``): the sorts, sums and fits run where the
arrays are, and only scalars come to the host.  On NumPy they are the same operations as they
always were, so the cpu path's results are unchanged to the bit.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from gpuclust.analyses.base import to_host
from gpuclust.backends import backend_of
from gpuclust.stream_quantiles import ranked_quantiles

__all__ = ["STAT_COLUMNS", "by_usage", "job_stats", "pearson", "top_share"]

#: Columns of the ``stats`` table after ``tier`` and ``resource``.
STAT_COLUMNS = (
    "jobs",
    "zero_jobs",
    "total_hours",
    "mean",
    "variance",
    "median",
    "p90",
    "p99",
    "p999",
    "max",
    "top1pct_share",
    "top01pct_share",
    "scv",
    "tail_jobs",
    "pareto_alpha",
    "pareto_r2",
)

#: The quantiles of the stats table (``median``, ``p90``, ``p99``, ``p999``).
_QUANTILES = (0.5, 0.9, 0.99, 0.999)


def _quantiles(asc: Any, qs: tuple[float, ...]) -> np.ndarray:
    """``np.quantile(asc, qs)`` (the linear method) of values sorted ascending, on their module:
    only the order statistics it needs are read back."""
    xp = backend_of(asc).xp
    return ranked_quantiles(lambda ranks: to_host(asc[xp.asarray(ranks)]), int(asc.shape[0]), qs)


def top_share(x: Any, share: float, desc: Any) -> float:
    """Share of ``x.sum()`` held by its largest ``max(1, ceil(share * n))`` values (``desc``:
    ``x`` sorted in descending order)."""
    k = max(1, int(np.ceil(share * x.shape[0])))
    return float(desc[:k].sum() / x.sum())


def job_stats(x: Any, tail: float) -> dict[str, float]:
    """The :data:`STAT_COLUMNS` (from ``jobs`` on) of positive per-collection totals ``x``."""
    xp = backend_of(x).xp
    n = int(x.shape[0])
    out: dict[str, float] = dict.fromkeys(STAT_COLUMNS[1:], np.nan)
    out["jobs"] = n
    if n == 0:
        out["total_hours"] = 0.0
        return out
    mean = float(x.mean())
    var = float(x.var())
    asc = xp.sort(x)  # one sort for the quantiles, the top shares and the tail
    desc = asc[::-1]
    q = _quantiles(asc, _QUANTILES)
    out.update(
        total_hours=float(x.sum()),
        mean=mean,
        variance=var,
        median=float(q[0]),
        p90=float(q[1]),
        p99=float(q[2]),
        p999=float(q[3]),
        max=float(x.max()),
        top1pct_share=top_share(x, 0.01, desc),
        top01pct_share=top_share(x, 0.001, desc),
        scv=var / mean**2 if mean > 0 else np.nan,
    )
    m = max(2, int(np.ceil(tail * n)))
    if n >= 2:
        m = min(m, n)
        lx = xp.log10(desc[:m])
        ly = xp.log10(xp.arange(1, m + 1) / n)
        out["tail_jobs"] = m
        if float(lx[0]) > float(lx[m - 1]):  # (descending: not all equal)
            slope, icept = (float(v) for v in xp.polyfit(lx, ly, 1))
            resid = ly - (slope * lx + icept)
            ss = float(((ly - ly.mean()) ** 2).sum())
            out["pareto_alpha"] = -slope
            out["pareto_r2"] = 1.0 - float((resid**2).sum()) / ss if ss > 0 else np.nan
    return out


def by_usage(cpu: Any, key: Any) -> Any:
    """The order of the collections by ``cpu`` descending, then ``key`` ascending (pandas'
    ``sort_values(["ncu_hours", "collection_id"], ascending=[False, True])``): an unstable
    sort of ``cpu``, then the runs of equal values put in key order.

    >>> by_usage(np.array([1.0, 3.0, 1.0, 0.0, 1.0]), np.array([5, 1, 2, 9, 3])).tolist()
    [1, 2, 4, 0, 3]
    """
    xp = backend_of(cpu).xp
    order = xp.argsort(-cpu)
    v = cpu[order]
    tie = xp.zeros(v.shape[0], dtype=bool)
    eq = (v[1:] == v[:-1]) | (xp.isnan(v[1:]) & xp.isnan(v[:-1]))  # (NaN last, in key order too)
    tie[1:] |= eq
    tie[:-1] |= eq
    at = xp.flatnonzero(tie)
    if at.shape[0]:
        first = xp.ones(1, dtype=bool)
        run = xp.cumsum(xp.concatenate([first, ~eq]))[at]  # the run of equal values of each tied row
        sub = order[at]
        order[at] = sub[xp.lexsort(xp.stack([key[sub], run]))]
    return order


def pearson(a: Any, b: Any) -> float:
    """Pearson's r of ``a`` and ``b`` (NaN for fewer than two, or a constant one)."""
    xp = backend_of(a).xp
    if a.shape[0] < 2 or float(xp.ptp(a)) == 0 or float(xp.ptp(b)) == 0:
        return np.nan
    return float(xp.corrcoef(a, b)[0, 1])
