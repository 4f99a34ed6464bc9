"""Plots of the ``overcommit`` analysis: cell-level allocation and usage ratios over time by tier,
and the distribution of the per-machine-bucket allocation ratio.

Called from :func:`gpuclust.report.plots.plot_result`; drawn by :mod:`gpuclust.report.draw` (no
matplotlib, no pandas), written atomically.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["machine_heatmap", "plot_overcommit", "ratio_bars"]


def machine_heatmap(heatmap: Any, width_us: float) -> tuple[np.ndarray, np.ndarray, int] | None:
    """The ``heatmap`` table (bands of machines sorted by their mean ratio x columns of buckets)
    as an image: ``(image, the columns' left edges plus the right edge in trace µs, machines)``,
    or ``None`` when it has no finite value."""
    from gpuclust.report.draw import numbers

    if len(heatmap) == 0:
        return None
    band = numbers(heatmap, "band").astype(np.int64)
    rows = int(band.max()) + 1
    values = numbers(heatmap, "alloc_ratio_cpu").reshape(rows, -1)
    if not np.isfinite(values).any():
        return None
    starts = numbers(heatmap, "bucket_start_us")[: values.shape[1]]
    last = starts[-1] + numbers(heatmap, "buckets")[values.shape[1] - 1] * width_us
    machines = int(numbers(heatmap, "machines")[:: values.shape[1]].sum())
    return values, np.append(starts, last), machines


def plot_overcommit(result: dict[str, Any], path: Path, *, title: str = "overcommit") -> bool:
    """Four panels: cell CPU allocation ratio by tier (stacked) with the total usage ratio, cell
    CPU usage ratio by tier (stacked), a heatmap of the allocation ratio per machine and bucket
    (:func:`machine_heatmap`), and a histogram of the machine-bucket CPU and memory
    allocation ratios (machine-buckets with a known, positive capacity).  ``False`` when the
    cell series is empty."""
    from gpuclust.report.axes import TIME_LABEL, nothing_to_plot, trace_hours
    from gpuclust.report.draw import Figure, first, numbers

    cell, info = result["cell"], result["info"]
    if len(cell) == 0:
        return False
    fig = Figure(10, 12)
    axes = fig.subplots(4, 1, height_ratios=(1, 1, 1.1, 1))
    # x: bucket start in hours of trace time (origin 0, 600 s before the trace start; docs/user/dataset.md)
    width_us = float(first(info, "bucket_s", 300)) * 1e6
    starts = numbers(cell, "bucket_start_us")
    hours = trace_hours(np.append(starts, starts[-1] + width_us))
    has_usage = int(first(info, "usage_rows", 0)) > 0
    for ax, kind, label in ((axes[0], "alloc", "requested / capacity"), (axes[1], "usage", "usage / capacity")):
        if kind == "usage" and not has_usage:
            nothing_to_plot(ax, "no usage to plot: the dataset has no instance_usage rows")
            ax.ylabel = f"CPU {label}"
            continue
        _draw_cell_ratios(ax, kind, label, cell, info, hours, width_us)
    axes[0].title = "cell-level ratios by tier (capacity-weighted)"
    axes[1].xlabel = TIME_LABEL
    axes[2].xlabel = TIME_LABEL
    _draw_heatmap(axes[2], result["heatmap"], hours, width_us)
    _draw_ratio_histogram(axes[3], result["ratio_hist"])
    fig.set_title(
        title,
        f"overcommitment: requested and used CPU against capacity per {width_us / 6e7:g}-min "
        "bucket, for the cell, per machine, and over machines",
    )
    axes[3].legend(loc="upper right", size="small")
    fig.save(path)
    return True


def _draw_cell_ratios(ax: Any, kind: str, label: str, cell: Any, info: Any, hours: np.ndarray, width_us: float) -> None:
    """The cell's CPU ``kind`` ratio per bucket stacked by tier, the memory ratio over it, partial
    buckets hatched and the capacity line."""
    from gpuclust.report.axes import edge_buckets, trace_hours
    from gpuclust.report.draw import first, names_of, numbers

    tiers = str(first(info, "tiers", "")).split(",")
    columns = set(names_of(cell))
    cols = [
        t
        for t in tiers
        if f"{kind}_ratio_cpu_{t}" in columns and np.nan_to_num(numbers(cell, f"{kind}_ratio_cpu_{t}")).any()
    ]
    # unknown (NaN) buckets, e.g. no machine with a known capacity, stay gaps: never drawn as 0
    known = np.isfinite(numbers(cell, f"{kind}_ratio_cpu"))
    if cols:
        ax.stack_steps(
            hours,
            [np.where(known, np.nan_to_num(numbers(cell, f"{kind}_ratio_cpu_{t}")), np.nan) for t in cols],
            cols,
            alpha=0.8,
        )
    if not known.all():
        ax.text(0.01, 0.02, f"{int((~known).sum())} bucket(s) unknown (gaps)", size="small")
    ax.stairs(numbers(cell, f"{kind}_ratio_mem"), hours, color="k", lw=1, dash=True, label="memory (all tiers)")
    lo_us, hi_us = first(info, "window_start_us"), first(info, "window_end_us")
    lo_us = float(lo_us) if lo_us is not None else None
    hi_us = float(hi_us) if hi_us is not None else None
    starts = numbers(cell, "bucket_start_us")
    for i, (a, b, _why) in enumerate(edge_buckets(starts, width_us, lo_us, hi_us)):  # partial buckets, hatched
        ax.axvspan(
            float(trace_hours(a)),
            float(trace_hours(b)),
            hatch=True,
            label="partial bucket (data covers part of it)" if kind == "alloc" and i == 0 else None,
        )
    ax.xlim = (float(hours[0]), float(hours[-1]))
    ax.axhline(1.0, color="r", lw=0.8, label="capacity")
    ax.ylim = (0.0, None)
    ax.ylabel = f"CPU {label}"
    ax.legend(loc="upper left", outside=True, size="small")


def _draw_ratio_histogram(ax: Any, hist: Any) -> None:
    """Histograms of the machine-bucket CPU and memory allocation ratios (known, positive
    capacity) from the ``ratio_hist`` table: its 0.01-wide bins added up into at most 100 bars up
    to the bin of their 99.9th percentile (at least 2), with the capacity line."""
    from gpuclust.report.draw import numbers, strings

    if len(hist):
        resource = strings(hist, "resource")
        lo, count = numbers(hist, "ratio_lo"), numbers(hist, "machine_buckets")
        for r, color in (("cpu", "C0"), ("mem", "C1")):
            at = resource == r
            if not at.any():
                continue
            edges, bars = ratio_bars(lo[at], count[at])
            ax.stairs(bars, edges, color=color, lw=1.0, label=f"{r} ({int(count[at].sum())} machine-buckets)")
    ax.axvline(1.0, color="r", lw=0.8)
    ax.ylim = (0.0, None)
    ax.xlabel = "requested / capacity per machine-bucket"
    ax.ylabel = "machine-buckets"
    ax.title = "allocation ratio per machine and bucket"


def ratio_bars(lo: np.ndarray, count: np.ndarray, bars: int = 100, q: float = 0.999) -> tuple[np.ndarray, np.ndarray]:
    """Of fine bins (lower edges ``lo``, multiples of 0.01; ``count`` each): ``(edges, counts)`` of
    at most ``bars`` bars of equal width, a whole number of fine bins each, up to the upper edge
    of the fine bin that holds the ``q`` quantile (2 at least); what lies beyond is not drawn.

    >>> edges, c = ratio_bars(np.array([0.5, 1.0, 2.3]), np.array([10, 5, 1]))
    >>> len(edges) - 1, float(edges[1]), float(edges[-1]), int(c.sum())
    (77, 0.03, 2.31, 16)
    """
    k = np.rint(lo * 100).astype(np.int64)
    top = int(k[np.searchsorted(np.cumsum(count), q * count.sum())]) + 1  # fine bins up to the quantile's
    top = max(top, 200)
    per = -(-top // bars)
    n = -(-top // per)
    inside = k < n * per
    out = np.bincount(k[inside] // per, weights=count[inside], minlength=n).astype(np.int64)
    return np.arange(n + 1) * per / 100, out


def _draw_heatmap(ax: Any, heatmap: Any, hours: np.ndarray, width_us: float) -> None:
    """CPU requested / capacity per machine (sorted by its mean) and time: where and when the
    cell is overcommitted."""
    from gpuclust.report.axes import nothing_to_plot, trace_hours

    hm = machine_heatmap(heatmap, width_us)
    if hm is None:
        nothing_to_plot(ax, "no machine-bucket with a known capacity: no allocation ratio to map")
        return
    image, edges, machines = hm
    finite = image[np.isfinite(image)]
    top = max(1.0, float(np.quantile(finite, 0.99))) if finite.size else 1.0
    x = trace_hours(edges)
    ax.image(image, (float(x[0]), float(x[-1]), 0.0, float(machines)), vmin=0.0, vmax=top, nan="0.85")
    ax.xlim = (float(hours[0]), float(hours[-1]))
    ax.ylim = (0.0, float(machines))
    ax.ylabel = f"machines ({machines:,}),\nsorted by mean ratio"
    ax.title = "CPU requested / capacity per machine and bucket (grey: capacity unknown or machine down)"
    ax.colorbar(0.0, top, "requested / capacity")
