"""Machine-cell definitions of the ``cpi`` analysis and its first pass (the Spearman grid's histograms).

For a usage window on machine ``m`` with ``cell = floor(start_time / 300 s)``:

* ``k(m, cell)`` = number of **top-level** usage rows (``alloc_collection_id`` 0 or NULL: tasks
  not in allocs, plus alloc instances) on ``m`` whose window starts in ``cell``;
* ``cpu_seconds(m, cell)`` = the sum over those rows of ``avg_cpu x (end_time - start_time) / 1e6``
  (:func:`cpu_seconds`);
* ``bad(m, cell)`` = how many of those rows have an unknown CPU time (NULL ``avg_cpu``, an end
  before the start, or the 2^63-1 "after the trace" end): the cell's utilisation is then unknown.

``cpi`` computes these per partition as keyed sums and reduces them by machine-range shards
(docs/analyses/cpi.md).  :class:`CpiHistograms` is the pass the Spearman grid needs first: fine
*fixed* histograms (row counts, exact integers) of CPI and MAI over the windows that pass the
plausibility filter; :func:`grid_cuts` turns them into the grid's cut points, so every partition
of the main pass bins with the same cuts.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from gpuclust._lazy import pandas as pd
from gpuclust._xp import bincount
from gpuclust.analyses.base import Analysis
from gpuclust.analyses.kinds import Fields, Sum
from gpuclust.partials import log_bins
from gpuclust.schema import TIME_AFTER_TRACE
from gpuclust.stats import CpiFilter

__all__ = [
    "CELL_US",
    "FINE_BINS",
    "CpiHistograms",
    "HistogramsContext",
    "cpu_seconds",
    "filter_rows",
    "fine_hist",
    "grid_cuts",
    "hist_edges",
]

#: Length of a usage-grid cell (the trace's 5-minute windows), microseconds.
CELL_US = 300_000_000
#: Fine histogram bins per variable (log-spaced; row counts).
FINE_BINS = 2048
#: Lower ends of the fine log grids (values below fall in the first bin).
_LOG_LO = {"cpi": 1e-3, "mai": 1e-7}


def hist_edges(var: str, hi: float) -> np.ndarray:
    """Interior edges of the fine log-spaced histogram of ``var`` ("cpi" or "mai") up to ``hi``."""
    lo = _LOG_LO[var]
    hi = max(float(hi), lo * 10.0)
    return np.geomspace(lo, hi, FINE_BINS - 1)


def cpu_seconds(xp: Any, start: Any, end: Any, avg_cpu: Any) -> Any:
    """``avg_cpu x (end - start) / 1e6`` in float64; NaN when the CPU time is unknown (NULL usage,
    ``end < start`` or the "after the trace" end)."""
    bad = end < start
    bad |= end == TIME_AFTER_TRACE
    dur = (end - start).astype(xp.float64)
    dur[bad] = xp.nan
    # in place: (avg_cpu as float64) x ((end - start) / 1e6), the same roundings as the plain expression
    dur /= 1e6
    dur *= avg_cpu
    return dur


def filter_rows(xp: Any, flt: CpiFilter, cols: dict[str, Any]) -> tuple[Any, Any, Any, Any, dict[str, int]]:
    """The windows that pass ``flt``: ``(row indices, cpi, mai, cpu_seconds, counts)``.

    ``cpi``, ``mai`` and ``cpu_seconds`` are float64 arrays of the kept rows; ``counts`` is what
    ``flt.mask`` gives over all rows.  Same result as ``flt.mask`` on float64 copies of the whole
    columns, but the CPU time and the float64 copies are only made for the rows whose CPI and MAI
    are present (finite; a float32 -> float64 cast is exact).
    """
    cpi, mai = cols["cpi"], cols["mai"]
    n = int(cpi.shape[0])
    pidx = xp.nonzero(xp.isfinite(cpi) & xp.isfinite(mai))[0]
    w = cpu_seconds(xp, cols["start_time"][pidx], cols["end_time"][pidx], cols["avg_cpu"][pidx])
    y = cpi[pidx].astype(xp.float64)
    z = mai[pidx].astype(xp.float64)
    keep, counts = flt.mask(xp, y, z, w)
    counts["total"] = n
    counts["missing"] = n - int(pidx.shape[0])
    if counts["kept"] < int(pidx.shape[0]):
        sel = xp.nonzero(keep)[0]
        pidx, y, z, w = pidx[sel], y[sel], z[sel], w[sel]
    return pidx, y, z, w, counts


def fine_hist(xp: Any, edges: Any, v: Any) -> Any:
    """Row counts of ``v`` in the fine bins ``searchsorted(edges, v, side="right")`` (int64,
    :data:`FINE_BINS`; ``edges`` from :func:`hist_edges`)."""
    return bincount(xp, log_bins(xp, edges, v), minlength=FINE_BINS).astype(xp.int64)


def grid_cuts(counts: np.ndarray, edges: np.ndarray, bins: int) -> np.ndarray:
    """Cut points at the row-count quantiles ``1/bins ... (bins-1)/bins`` of a fine histogram.

    Exact integer arithmetic, so the cuts do not depend on how the pass was partitioned.  Cuts are
    fine-bin edges (duplicates dropped: fewer bins when the data are concentrated).
    """
    counts = np.asarray(counts, dtype=np.int64)
    total = int(counts.sum())
    if total == 0 or bins < 2:
        return np.zeros(0)
    cum = np.cumsum(counts)
    # the smallest fine bin whose cumulative count reaches q * total (integer: ceil(j * total / bins))
    targets = -(-np.arange(1, bins, dtype=np.int64) * total // bins)
    idx = np.searchsorted(cum, targets, side="left")
    idx = idx[idx < edges.shape[0]]
    return np.unique(edges[idx])


@dataclass(frozen=True)
class HistogramsContext:
    filter: CpiFilter
    cpi_edges: np.ndarray
    mai_edges: np.ndarray


@dataclass(frozen=True)
class CpiHistograms(Analysis):
    """The first pass of ``cpi`` with ``spearman="grid"``: fine CPI / MAI histograms (row counts,
    exact integers) of the windows that pass the filter, for the grid's cut points."""

    filter: CpiFilter = CpiFilter()

    name = "_cpi-histograms"
    table = "instance_usage"
    row_bytes = 96
    #: rows per partition for partitions="auto": a few cheap passes per row, as cpi's own pass
    auto_partition_rows = 1 << 20

    @property
    def columns(self) -> tuple[str, ...]:
        return ("start_time", "end_time", "avg_cpu", "cpi", "mai")

    def context(self, source: Any) -> HistogramsContext:
        return HistogramsContext(
            self.filter, hist_edges("cpi", self.filter.cpi_max), hist_edges("mai", self.filter.mai_max)
        )

    def partial(self, cols: dict[str, Any], ctx: HistogramsContext, backend: Any) -> dict[str, Any]:
        xp = backend.xp
        _, cpi, mai, _, _ = filter_rows(xp, ctx.filter, cols)
        return {
            var: fine_hist(xp, backend.stage(edges), v)
            for var, v, edges in (("cpi", cpi, ctx.cpi_edges), ("mai", mai, ctx.mai_edges))
        }

    @property
    def kinds(self) -> Fields:
        """Two histograms of row counts, summed."""
        return Fields({"cpi": Sum((FINE_BINS,), np.int64), "mai": Sum((FINE_BINS,), np.int64)})

    def finalize(self, partial: dict[str, np.ndarray], ctx: HistogramsContext) -> dict[str, pd.DataFrame]:
        return {"hist": pd.DataFrame({"cpi": np.asarray(partial["cpi"]), "mai": np.asarray(partial["mai"])})}
