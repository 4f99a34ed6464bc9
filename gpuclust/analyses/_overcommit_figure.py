"""``overcommit``'s figure tables, summed by the finalize as it builds the machine table (the
written table is never read again): ``heatmap``, the CPU allocation ratio per band of machines
(sorted by their mean ratio) and column of buckets, and ``ratio_hist``, the histogram of the
machine-bucket allocation ratios in bins of :data:`HIST_STEP`.

:class:`FigureSums` holds, per shard (machine codes ``[lo, hi)``), the sums and counts of the
finite ``alloc_ratio_cpu`` per (machine, column) and the fine histogram counts per resource, on
the backend of the chunks (a device keeps them there until its shard is done); the shards' sums
become the two small tables in :func:`figure_tables`.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa

from gpuclust._xp import bincount
from gpuclust.analyses.base import to_host
from gpuclust.arrow_numpy import schema_table, table

__all__ = ["HEAT_COLS", "HEAT_ROWS", "HIST_BINS", "HIST_STEP", "FigureSums", "figure_tables", "heat_columns"]

#: The heatmap's most bands of machines and columns of buckets.
HEAT_ROWS, HEAT_COLS = 160, 240
#: ``ratio_hist``'s bins: ``[k, k + 1) x HIST_STEP`` for k < :data:`HIST_BINS`, and one for every
#: ratio from ``HIST_BINS x HIST_STEP`` (100) up.
HIST_STEP, HIST_BINS = 0.01, 10_000
_HIST_SCALE = 100  # 1 / HIST_STEP, so that bin edges are k / 100, correctly rounded

_HEAT_SCHEMA = pa.schema(
    [
        ("band", pa.int64()),
        ("machines", pa.int64()),
        ("bucket", pa.int64()),
        ("bucket_start_us", pa.int64()),
        ("buckets", pa.int64()),
        ("alloc_ratio_cpu", pa.float64()),
        ("machine_buckets", pa.int64()),
    ]
)
_HIST_SCHEMA = pa.schema(
    [("resource", pa.string()), ("ratio_lo", pa.float64()), ("ratio_hi", pa.float64()), ("machine_buckets", pa.int64())]
)


def heat_columns(n_buckets: int) -> tuple[int, int]:
    """``(buckets a column, columns)`` of the heatmap of ``n_buckets`` buckets: at most
    :data:`HEAT_COLS` columns of equal width (the last one may be narrower).

    >>> heat_columns(288), heat_columns(8928), heat_columns(5)
    ((2, 144), (38, 235), (1, 5))
    """
    per = max(1, -(-int(n_buckets) // HEAT_COLS))
    return per, max(1, -(-int(n_buckets) // per))


def hist_bins(xp: Any, v: Any) -> Any:
    """The fine bin of each ratio ``v`` (finite): ``k`` with ``k / 100 <= v < (k + 1) / 100`` for
    ``0 <= v < 100``, :data:`HIST_BINS` from 100 up, ``HIST_BINS + 1`` (dropped) below 0.

    >>> hist_bins(np, np.array([0.0, 0.29, 0.3, 1.0, 99.999, 100.0, 5e300, -0.1])).tolist()
    [0, 29, 30, 100, 9999, 10000, 10000, 10001]
    """
    v = xp.clip(v, -1.0, 2.0 * HIST_BINS / _HIST_SCALE)
    k = xp.floor(v * _HIST_SCALE)
    k = k - (v < k / _HIST_SCALE) + (v >= (k + 1) / _HIST_SCALE)  # v * 100 may round across an edge
    return xp.where(v < 0, HIST_BINS + 1, xp.minimum(k, HIST_BINS)).astype(xp.int64)


class FigureSums:
    """The figure sums of one shard of the machine table (machine codes ``[lo, hi)``, ``B``
    buckets), on backend ``be`` until :meth:`to_host`; :meth:`add` takes a chunk's rows."""

    def __init__(self, be: Any, B: int, lo: int, hi: int) -> None:
        xp = self.xp = be.xp
        self.lo, self.n = int(lo), max(0, int(hi) - int(lo))
        self.per, self.cols = heat_columns(B)
        #: per (machine, column): the sum and the count of the finite ratios (two rows: one copy out)
        self.heat = xp.zeros((2, self.n * self.cols), xp.float64)
        #: per resource (cpu, mem): the fine bins' counts
        self.hist = xp.zeros((2, HIST_BINS + 1), xp.int64)

    def add(self, cols: dict[str, Any], machine: Any, bucket: Any) -> None:
        """A chunk's rows: ``cols`` (the machine table's columns), ``machine`` (each row's machine
        code) and ``bucket`` (its bucket index in the grid), arrays of the backend."""
        xp, size = self.xp, self.n * self.cols
        v = cols["alloc_ratio_cpu"]
        ok = xp.isfinite(v)
        cell = xp.where(ok, (machine - self.lo) * self.cols + bucket // self.per, size)  # size: dropped
        self.heat[0] += bincount(xp, cell, xp.where(ok, v, 0.0), size + 1, bounded=True)[:size]
        self.heat[1] += bincount(xp, cell, None, size + 1, bounded=True)[:size]
        for i, r in enumerate(("cpu", "mem")):
            v, cap = cols[f"alloc_ratio_{r}"], cols[f"cap_{r}"]
            ok = xp.isfinite(v) & xp.isfinite(cap) & (cap > 0)
            k = xp.where(ok, hist_bins(xp, xp.where(ok, v, 0.0)), HIST_BINS + 1)
            self.hist[i] += bincount(xp, k, None, HIST_BINS + 2, bounded=True)[: HIST_BINS + 1]

    def to_host(self) -> None:
        self.heat, self.hist = to_host(self.heat), to_host(self.hist)
        self.xp = np


def figure_tables(shards: list[FigureSums], bucket: np.ndarray, width: int) -> dict[str, pa.Table]:
    """``heatmap`` and ``ratio_hist`` of the shards' sums (host arrays; ``bucket``: the grid's
    bucket numbers, ``width``: a bucket's µs)."""
    shards = sorted(shards, key=lambda s: s.lo)
    hist = sum((s.hist for s in shards), np.zeros((2, HIST_BINS + 1), np.int64))
    return {"heatmap": _heatmap(shards, bucket, width), "ratio_hist": _ratio_hist(hist)}


def _heatmap(shards: list[FigureSums], bucket: np.ndarray, width: int) -> pa.Table:
    """The bands x columns image: machines with a finite ratio sorted by their mean (ties: by id,
    i.e. code), cut into at most :data:`HEAT_ROWS` bands of equal count; a cell is the mean of
    its finite values (NaN where none)."""
    per, C = heat_columns(int(bucket.shape[0]))
    if not shards or not sum(s.n for s in shards):
        return schema_table([], _HEAT_SCHEMA)
    S = np.concatenate([s.heat[0].reshape(s.n, C) for s in shards])
    N = np.concatenate([s.heat[1].reshape(s.n, C) for s in shards]).astype(np.int64)
    total_n = N.sum(axis=1)
    has = np.flatnonzero(total_n > 0)
    if not has.size:
        return schema_table([], _HEAT_SCHEMA)
    S, N = S[has], N[has]
    mean = S.sum(axis=1) / total_n[has]
    n = int(has.size)
    rows = min(HEAT_ROWS, n)
    band = np.empty(n, np.int64)
    band[np.lexsort((has, mean))] = np.arange(n) * rows // n
    total, count = np.zeros((rows, C)), np.zeros((rows, C), np.int64)
    np.add.at(total, band, S)
    np.add.at(count, band, N)
    with np.errstate(invalid="ignore", divide="ignore"):
        image = total / count
    first = bucket[0] + np.arange(C, dtype=np.int64) * per
    return table(
        {
            "band": np.repeat(np.arange(rows, dtype=np.int64), C),
            "machines": np.repeat(np.bincount(band, minlength=rows).astype(np.int64), C),
            "bucket": np.tile(first, rows),
            "bucket_start_us": np.tile(first * int(width), rows),
            "buckets": np.tile(np.minimum(per, bucket[0] + bucket.shape[0] - first), rows).astype(np.int64),
            "alloc_ratio_cpu": image.ravel(),
            "machine_buckets": count.ravel(),
        }
    )


def _ratio_hist(hist: np.ndarray) -> pa.Table:
    """The fine bins that hold a machine-bucket, per resource (``hist``: cpu's row, mem's)."""
    parts = []
    for r, h in zip(("cpu", "mem"), hist, strict=True):
        k = np.flatnonzero(h)
        lo = k / _HIST_SCALE
        hi = np.where(k < HIST_BINS, (k + 1) / _HIST_SCALE, np.inf)
        parts.append((r, lo, hi, h[k]))
    return table(
        {
            "resource": [r for r, lo, _, _ in parts for _ in range(lo.size)],
            "ratio_lo": np.concatenate([p[1] for p in parts]),
            "ratio_hi": np.concatenate([p[2] for p in parts]),
            "machine_buckets": np.concatenate([p[3] for p in parts]).astype(np.int64),
        }
    )
