"""Plots of the ``overcommit`` analysis: cell-level allocation and usage ratios over time by tier,
and the distribution of the per-machine-bucket allocation ratio.

Called from :func:`gpuclust.report.plots.plot_result`; drawn by :mod:`gpuclust.report.draw` (no
matplotlib, no pandas), written atomically.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from gpuclust.parted import array_batches
from gpuclust.stream_quantiles import stream_quantiles

__all__ = ["machine_heatmap", "plot_overcommit"]


def machine_heatmap(
    machine: object, column: str = "alloc_ratio_cpu", *, max_rows: int = 160, max_cols: int = 240
) -> tuple[np.ndarray, np.ndarray, int] | None:
    """``column`` per machine x time bucket as a small image: machines sorted by their mean value
    (bottom: lowest) and grouped into at most ``max_rows`` bands, buckets into at most ``max_cols``
    columns, each cell the mean of its finite values (NaN where none).  Two passes over a parted
    table, a part at a time; returns ``(image, bucket starts of the columns' left edges plus the
    right edge, machines)`` or ``None`` when there is no finite value."""
    sums: dict[int, list[float]] = {}
    lo = hi = None
    step = None
    for b in array_batches(machine, ["machine_id", "bucket_start_us", column]):
        v = np.asarray(b[column], dtype=np.float64)
        ok = np.isfinite(v)
        m = np.asarray(b["machine_id"])[ok].astype(np.int64)
        order = np.argsort(m, kind="stable")
        m, vs = m[order], v[ok][order]
        if m.size:
            starts = np.flatnonzero(np.r_[True, m[1:] != m[:-1]])
            for mid, sm, n in zip(
                m[starts].tolist(),
                np.add.reduceat(vs, starts).tolist(),
                np.diff(np.r_[starts, m.size]).tolist(),
                strict=True,
            ):
                acc = sums.setdefault(int(mid), [0.0, 0.0])
                acc[0] += sm
                acc[1] += n
        t = np.sort(np.asarray(b["bucket_start_us"], dtype=np.float64))
        if t.size:
            lo = float(t[0]) if lo is None else min(lo, float(t[0]))
            hi = float(t[-1]) if hi is None else max(hi, float(t[-1]))
            d = np.diff(t)
            d = d[d > 0]
            if d.size:
                step = float(d.min()) if step is None else min(step, float(d.min()))
    if not sums or lo is None or hi is None:
        return None
    ids = np.array(sorted(sums, key=lambda m: (sums[m][0] / sums[m][1], m)), dtype=np.int64)
    rows = min(max_rows, ids.size)
    order = np.argsort(ids)
    sorted_ids, band_of = ids[order], (np.arange(ids.size) * rows // ids.size)[order]
    step = step or 1.0
    n_buckets = int(round((hi - lo) / step)) + 1
    per_col = -(-n_buckets // max_cols)
    cols = -(-n_buckets // per_col)
    total, count = np.zeros((rows, cols)), np.zeros((rows, cols))
    for b in array_batches(machine, ["machine_id", "bucket_start_us", column]):
        v = np.asarray(b[column], dtype=np.float64)
        ok = np.isfinite(v)
        r = band_of[np.searchsorted(sorted_ids, np.asarray(b["machine_id"])[ok].astype(np.int64))]
        c = np.round((np.asarray(b["bucket_start_us"], dtype=np.float64)[ok] - lo) / step).astype(np.int64) // per_col
        np.add.at(total, (r, c), v[ok])
        np.add.at(count, (r, c), 1.0)
    with np.errstate(invalid="ignore", divide="ignore"):
        image = total / count
    edges = lo + np.arange(cols + 1) * per_col * step
    return image, edges, int(ids.size)


def plot_overcommit(result: dict[str, Any], path: Path, *, title: str = "overcommit") -> bool:
    """Four panels: cell CPU allocation ratio by tier (stacked) with the total usage ratio, cell
    CPU usage ratio by tier (stacked), a heatmap of the allocation ratio per machine and bucket
    (:func:`machine_heatmap`), and a histogram of the machine-bucket CPU and memory
    allocation ratios (machine-buckets with a known, positive capacity).  ``False`` when the
    cell series is empty."""
    from gpuclust.report.axes import TIME_LABEL, nothing_to_plot, trace_hours
    from gpuclust.report.draw import Figure, first, numbers

    cell, machine, info = result["cell"], result["machine"], result["info"]
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
    _draw_heatmap(axes[2], machine, hours)
    _draw_ratio_histogram(axes[3], machine)
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


def _draw_ratio_histogram(ax: Any, machine: Any) -> None:
    """Histograms of the machine-bucket CPU and memory allocation ratios (known, positive capacity),
    up to their 99.9th percentile (at least 2), with the capacity line."""
    for r, color in (("cpu", "C0"), ("mem", "C1")):

        def ratios(r: str = r) -> Iterator[np.ndarray]:
            for b in array_batches(machine, [f"alloc_ratio_{r}", f"cap_{r}"]):  # a parted table: a part at a time
                v = np.asarray(b[f"alloc_ratio_{r}"], dtype=np.float64)
                cap = np.asarray(b[f"cap_{r}"], dtype=np.float64)
                yield v[np.isfinite(v) & np.isfinite(cap) & (cap > 0)]

        n = sum(int(v.size) for v in ratios())
        if n:
            hi = max(2.0, float(stream_quantiles(ratios, [0.999])[0]))
            counts = sum(np.histogram(v, bins=100, range=(0.0, hi))[0] for v in ratios())
            edges = np.linspace(0.0, hi, 101)
            ax.stairs(counts, edges, color=color, lw=1.0, label=f"{r} ({n} machine-buckets)")
    ax.axvline(1.0, color="r", lw=0.8)
    ax.ylim = (0.0, None)
    ax.xlabel = "requested / capacity per machine-bucket"
    ax.ylabel = "machine-buckets"
    ax.title = "allocation ratio per machine and bucket"


def _draw_heatmap(ax: Any, machine: Any, hours: np.ndarray) -> None:
    """CPU requested / capacity per machine (sorted by its mean) and time: where and when the
    cell is overcommitted."""
    from gpuclust.report.axes import nothing_to_plot, trace_hours

    hm = machine_heatmap(machine)
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
