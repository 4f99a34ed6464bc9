"""The first pass of the ``cpi`` analysis: per (machine, 300 s cell) task count ``k`` and CPU-seconds.

Not registered: :class:`gpuclust.analyses.cpi.Cpi` runs it from its ``context`` with
:func:`gpuclust.engine.run` and broadcasts the result (a sorted packed-key table) to its partials.

For a usage window on machine ``m`` with ``cell = floor(start_time / 300 s)``:

* ``k(m, cell)`` = number of **top-level** usage rows (``alloc_collection_id`` 0 or NULL: tasks
  not in allocs, plus alloc instances) on ``m`` whose window starts in ``cell``;
* ``cpu_seconds(m, cell)`` = the sum over those rows of ``avg_cpu x (end_time - start_time) / 1e6``;
* ``bad(m, cell)`` = how many of those rows have an unknown CPU time (NULL ``avg_cpu``, an end
  before the start, or the 2^63-1 "after the trace" end): the cell's utilisation is then unknown.

Only machines with a known CPU capacity (``ctx.machines``) are kept (the others' utilisation is
undefined anyway).  The key packs ``machine index << 32 | cell``; rows whose cell is outside
``[0, 2^32)`` are dropped (counted in ``info``).

The same pass also builds fine *fixed* histograms (row counts, exact integers) of CPI and MAI over
the windows that pass the plausibility filter; :func:`grid_cuts` turns them into the cut points of
the mergeable Spearman grid, so every partition of the main pass bins with the same cuts.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from gpuclust.analyses._lookup import id_index
from gpuclust.analyses.base import Analysis, is_null_int
from gpuclust.partials import keyed_reduce, merge_keyed
from gpuclust.schema import TIME_AFTER_TRACE
from gpuclust.stats import CpiFilter

__all__ = ["CELL_US", "FINE_BINS", "MachineCells", "MachineCellsContext", "cpu_seconds", "filter_rows", "fine_bins", "fine_hist",
           "grid_cuts", "hist_edges"]

#: Length of a usage-grid cell (the trace's 5-minute windows), microseconds.
CELL_US = 300_000_000
#: Bits of the cell index in a packed (machine index, cell) key.
CELL_BITS = 32
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


def filter_rows(xp: Any, flt: CpiFilter, cols: dict[str, Any], cs: Any = None) -> tuple[Any, Any, Any, Any, dict[str, int]]:
    """The windows that pass ``flt``: ``(row indices, cpi, mai, cpu_seconds, counts)``.

    ``cpi``, ``mai`` and ``cpu_seconds`` are float64 arrays of the kept rows; ``counts`` is what
    ``flt.mask`` gives over all rows.  Same result as ``flt.mask`` on float64 copies of the whole
    columns, but the CPU time and the float64 copies are only made for the rows whose CPI and MAI
    are present (finite; a float32 -> float64 cast is exact).  ``cs``: the CPU-seconds of every
    row when already computed (otherwise from ``start_time``, ``end_time``, ``avg_cpu``).
    """
    cpi, mai = cols["cpi"], cols["mai"]
    n = int(cpi.shape[0])
    pidx = xp.nonzero(xp.isfinite(cpi) & xp.isfinite(mai))[0]
    if cs is None:
        w = cpu_seconds(xp, cols["start_time"][pidx], cols["end_time"][pidx], cols["avg_cpu"][pidx])
    else:
        w = cs[pidx]
    y = cpi[pidx].astype(xp.float64)
    z = mai[pidx].astype(xp.float64)
    keep, counts = flt.mask(xp, y, z, w)
    counts["total"] = n
    counts["missing"] = n - int(pidx.shape[0])
    if counts["kept"] < int(pidx.shape[0]):
        sel = xp.nonzero(keep)[0]
        pidx, y, z, w = pidx[sel], y[sel], z[sel], w[sel]
    return pidx, y, z, w, counts


def fine_bins(xp: Any, edges: Any, v: Any) -> Any:
    """``searchsorted(edges, v, side="right")`` (int64) for log-spaced ``edges`` (:func:`hist_edges`).

    A binary search over 2,047 edges mispredicts a branch per level; here the bin is guessed from
    ``log(v)`` (one pass) and then checked against the edges themselves: rows with
    ``edges[b - 1] <= v < edges[b]`` are exact by definition; the few others (rounding at a bin
    boundary) are moved by one bin, and any still wrong fall back to ``searchsorted``.  So the
    result is exactly the binary search's, for any ``v`` (NaN: the last bin, as the binary search
    sorts it; ``v <= 0``: bin 0).  Edges that do not start above 0 use ``searchsorted`` itself.
    """
    E = int(edges.shape[0])
    v = xp.asarray(v, dtype=xp.float64)
    if E < 2 or not float(edges[0]) > 0:
        return xp.searchsorted(edges, v, side="right").astype(xp.int64)
    lo = float(np.log(float(edges[0])))
    step = (float(np.log(float(edges[E - 1]))) - lo) / (E - 1)
    with np.errstate(divide="ignore", invalid="ignore"):
        q = xp.log(v)
        q -= lo
        q /= step
        q = xp.where(v > 0, q, -1.0)
    q = xp.floor(q, out=q)
    q += 1.0
    b = xp.clip(q, 0, E, out=q).astype(xp.int64)
    b[xp.isnan(v)] = E
    # row ok iff ext[b] <= v < ext[b + 1] (the NaN sentinel: v >= NaN is never true, so b = E
    # is right for +inf; NaN rows have b = E and are never flagged)
    ext = xp.concatenate([xp.asarray([-np.inf]), xp.asarray(edges, dtype=xp.float64), xp.asarray([np.nan])])
    bad = xp.nonzero((v < ext[b]) | (v >= ext[b + 1]))[0]
    if int(bad.shape[0]):
        vb, bb = v[bad], b[bad]
        bb = xp.clip(bb - (vb < ext[bb]).astype(xp.int64) + (vb >= ext[bb + 1]).astype(xp.int64), 0, E)
        still = (vb < ext[bb]) | (vb >= ext[bb + 1])
        if bool(still.any()):
            bb[still] = xp.searchsorted(edges, vb[still], side="right")
        b[bad] = bb
    return b


def fine_hist(xp: Any, edges: Any, v: Any) -> Any:
    """Row counts of ``v`` in the fine bins ``searchsorted(edges, v, side="right")`` (int64,
    :data:`FINE_BINS`; ``edges`` from :func:`hist_edges`)."""
    return xp.bincount(fine_bins(xp, edges, v), minlength=FINE_BINS).astype(xp.int64)


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
class MachineCellsContext:
    #: sorted machine ids with a known, positive CPU capacity
    machines: np.ndarray
    filter: CpiFilter
    cpi_edges: np.ndarray
    mai_edges: np.ndarray


@dataclass(frozen=True)
class MachineCells(Analysis):
    """Per (machine, cell): top-level row count, CPU-seconds, unknown-CPU rows; CPI/MAI histograms.

    ``context`` must be given to :func:`gpuclust.engine.run` indirectly: the instance carries the
    machine list and filter (set by the ``cpi`` analysis), so ``context(source)`` just packs them.
    """

    machines: tuple[int, ...] = ()
    filter: CpiFilter = CpiFilter()

    name = "_machine-cells"
    table = "instance_usage"
    row_bytes = 160

    @property
    def columns(self) -> tuple[str, ...]:
        return ("start_time", "end_time", "machine_id", "alloc_collection_id", "avg_cpu", "cpi", "mai")

    def context(self, source: Any) -> MachineCellsContext:
        return MachineCellsContext(np.asarray(self.machines, dtype=np.int64), self.filter,
                                   hist_edges("cpi", self.filter.cpi_max), hist_edges("mai", self.filter.mai_max))

    def empty(self, backend: Any = None) -> dict[str, np.ndarray]:
        return {"key": np.zeros(0, np.int64), "cpu_seconds": np.zeros(0), "k": np.zeros(0, np.int64),
                "bad": np.zeros(0, np.int64), "cpi_hist": np.zeros(FINE_BINS, np.int64),
                "mai_hist": np.zeros(FINE_BINS, np.int64), "stats": np.zeros(2, np.int64)}

    def partial(self, cols: dict[str, Any], ctx: MachineCellsContext, backend: Any) -> dict[str, Any]:
        xp = backend.xp
        start, end, mid = cols["start_time"], cols["end_time"], cols["machine_id"]
        alloc = cols["alloc_collection_id"]
        n = int(start.shape[0])
        cells = ctx.machines.shape[0] > 0 and n > 0
        cs = cpu_seconds(xp, start, end, cols["avg_cpu"]) if cells else None
        # fine histograms of the windows that pass the filter (all rows, allocs included)
        _, cpi, mai, _, _ = filter_rows(xp, ctx.filter, cols, cs)
        hists = {var + "_hist": fine_hist(xp, backend.stage(edges), v)
                 for var, v, edges in (("cpi", cpi, ctx.cpi_edges), ("mai", mai, ctx.mai_edges))}
        top = (alloc == 0) | is_null_int(xp, alloc)
        if not cells:
            out = {k: xp.asarray(v) for k, v in self.empty().items()}
            out.update(hists)
            out["stats"] = xp.asarray(np.array([0, int(top.sum()) if n else 0], np.int64))
            return out
        pos, known = id_index(backend, ctx.machines, mid)
        # 0 <= floor(start / CELL_US) < 2^32, without dividing every row
        cell_ok = (start >= 0) & (start < (1 << CELL_BITS) * CELL_US)
        use = top & known & cell_ok
        ui = xp.nonzero(use)[0]
        pu = pos[ui].astype(xp.int64, copy=False)
        cu = start[ui] // CELL_US
        csu = cs[ui]
        bad = ~xp.isfinite(csu)
        sums = {"cpu_seconds": xp.where(bad, 0.0, csu)}
        if int(pu.shape[0]):
            # Dense (machine index, cell) code: same order as the packed key, but a compact range,
            # so keyed_reduce takes its O(n) bincount path instead of sorting the packed keys
            # (identical sums: same rows per group, same row order).
            c0 = int(cu.min())
            cspan = int(cu.max()) - c0 + 1
            p0 = int(pu.min())
            span = (int(pu.max()) - p0 + 1) * cspan
            code = pu - p0
            code *= cspan
            code += cu
            code -= c0
            nu = int(code.shape[0])
            if span <= max(4 * nu, 1 << 16):
                # keyed_reduce's dense path, without its re-offset copies of the codes
                cnt = xp.bincount(code, minlength=span)
                present = xp.nonzero(cnt)[0]
                csum = backend.ops.grouped_sum(code, xp.ascontiguousarray(sums["cpu_seconds"]), n_groups=span)
                part = {"key": present.astype(xp.int64),
                        "cpu_seconds": csum[present],
                        "k": cnt[present].astype(xp.int64),
                        "bad": xp.bincount(code[bad], minlength=span)[present].astype(xp.int64)}
            else:
                part = keyed_reduce(backend, code, sums, {"k": None, "bad": bad.astype(xp.int64)})
            kc = part["key"]
            part["key"] = (((kc // cspan) + p0) << CELL_BITS) | ((kc % cspan) + c0)
        else:
            part = keyed_reduce(backend, (pu << CELL_BITS) | cu, sums, {"k": None, "bad": bad.astype(xp.int64)})
        part.update(hists)
        # stats: top-level rows with a bad cell index, top-level rows seen
        part["stats"] = xp.asarray(np.array([int((top & known & ~cell_ok).sum()), int(top.sum())], np.int64))
        return part

    def merge(self, a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        keyed = ("key", "cpu_seconds", "k", "bad")
        out = merge_keyed({k: a[k] for k in keyed}, {k: b[k] for k in keyed})
        for k in ("cpi_hist", "mai_hist", "stats"):
            out[k] = a[k] + b[k]
        return out

    def finalize(self, partial: dict[str, np.ndarray], ctx: MachineCellsContext) -> dict[str, pd.DataFrame]:
        cells = pd.DataFrame({k: np.asarray(partial[k]) for k in ("key", "k", "cpu_seconds", "bad")})
        hist = pd.DataFrame({"cpi": np.asarray(partial["cpi_hist"]), "mai": np.asarray(partial["mai_hist"])})
        info = pd.DataFrame([{"bad_cell_rows": int(partial["stats"][0]), "top_level_rows": int(partial["stats"][1])}])
        return {"cells": cells, "hist": hist, "info": info}
