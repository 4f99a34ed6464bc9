"""Plots of the ``overcommit`` analysis: cell-level allocation and usage ratios over time by tier,
and the distribution of the per-machine-bucket allocation ratio.

Called from :func:`gpuclust.report.plots.plot_result` (matplotlib, Agg backend, written atomically).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from gpuclust.parted import frames
from gpuclust.stream_quantiles import stream_quantiles

__all__ = ["machine_heatmap", "plot_overcommit"]


def machine_heatmap(machine: object, column: str = "alloc_ratio_cpu", *, max_rows: int = 160,
                    max_cols: int = 240) -> tuple[np.ndarray, np.ndarray, int] | None:
    """``column`` per machine x time bucket as a small image: machines sorted by their mean value
    (bottom: lowest) and grouped into at most ``max_rows`` bands, buckets into at most ``max_cols``
    columns, each cell the mean of its finite values (NaN where none).  Two passes over a parted
    table, a part at a time; returns ``(image, bucket starts of the columns' left edges plus the
    right edge, machines)`` or ``None`` when there is no finite value."""
    sums: dict[int, list[float]] = {}
    lo = hi = None
    for b in frames(machine, ["machine_id", "bucket_start_us", column]):
        v = b[column].to_numpy(dtype=np.float64)
        ok = np.isfinite(v)
        g = pd.DataFrame({"m": b["machine_id"].to_numpy()[ok], "v": v[ok]}).groupby("m")["v"].agg(["sum", "count"])
        for m, (sm, n) in zip(g.index, g.to_numpy(), strict=True):
            acc = sums.setdefault(int(m), [0.0, 0.0])
            acc[0] += sm
            acc[1] += n
        t = b["bucket_start_us"].to_numpy(dtype=np.float64)
        if t.size:
            lo = float(t.min()) if lo is None else min(lo, float(t.min()))
            hi = float(t.max()) if hi is None else max(hi, float(t.max()))
    if not sums or lo is None or hi is None:
        return None
    ids = np.array(sorted(sums, key=lambda m: (sums[m][0] / sums[m][1], m)), dtype=np.int64)
    rows = min(max_rows, ids.size)
    order = np.argsort(ids)
    sorted_ids, band_of = ids[order], (np.arange(ids.size) * rows // ids.size)[order]
    step = None
    for b in frames(machine, ["bucket_start_us"]):
        d = np.diff(np.unique(b["bucket_start_us"].to_numpy(dtype=np.float64)))
        if d.size:
            step = float(d.min()) if step is None else min(step, float(d.min()))
    step = step or 1.0
    n_buckets = int(round((hi - lo) / step)) + 1
    per_col = -(-n_buckets // max_cols)
    cols = -(-n_buckets // per_col)
    total, count = np.zeros((rows, cols)), np.zeros((rows, cols))
    for b in frames(machine, ["machine_id", "bucket_start_us", column]):
        v = b[column].to_numpy(dtype=np.float64)
        ok = np.isfinite(v)
        r = band_of[np.searchsorted(sorted_ids, b["machine_id"].to_numpy()[ok].astype(np.int64))]
        c = np.round((b["bucket_start_us"].to_numpy(dtype=np.float64)[ok] - lo) / step).astype(np.int64) // per_col
        np.add.at(total, (r, c), v[ok])
        np.add.at(count, (r, c), 1.0)
    with np.errstate(invalid="ignore", divide="ignore"):
        image = total / count
    edges = lo + np.arange(cols + 1) * per_col * step
    return image, edges, int(ids.size)


def plot_overcommit(result: dict[str, pd.DataFrame], path: Path, *, title: str = "overcommit") -> bool:
    """Four panels: cell CPU allocation ratio by tier (stacked) with the total usage ratio, cell
    CPU usage ratio by tier (stacked), a heatmap of the allocation ratio per machine and bucket
    (:func:`machine_heatmap`), and a histogram of the machine-bucket CPU and memory
    allocation ratios (machine-buckets with a known, positive capacity).  ``False`` when the
    cell series is empty."""
    from gpuclust.report.axes import TIME_LABEL, mark_partial_buckets, nothing_to_plot, set_title, trace_hours
    from gpuclust.report.plots import new_figure, save_figure_atomic

    cell, machine = result["cell"], result["machine"]
    if cell.empty:
        return False
    tiers = result["info"]["tiers"].iloc[0].split(",")
    fig = new_figure()
    fig.set_size_inches(10, 12)
    axes = fig.subplots(4, 1, height_ratios=(1, 1, 1.1, 1))
    # x: bucket start in hours of trace time (origin 0, 600 s before the trace start; docs/dataset.md)
    info = result["info"].iloc[0]
    width_us = float(info.get("bucket_s", 300)) * 1e6
    starts = cell["bucket_start_us"].to_numpy(dtype=np.float64)
    hours = trace_hours(np.append(starts, starts[-1] + width_us))
    lo, hi = info.get("window_start_us"), info.get("window_end_us")
    lo_us = float(lo) if lo is not None and lo == lo else None
    hi_us = float(hi) if hi is not None and hi == hi else None

    def steps(v: np.ndarray) -> np.ndarray:  # a value per bucket, drawn over the whole bucket
        return np.append(v, v[-1:])
    has_usage = int(result["info"]["usage_rows"].iloc[0]) > 0
    for ax, kind, label in ((axes[0], "alloc", "requested / capacity"), (axes[1], "usage", "usage / capacity")):
        if kind == "usage" and not has_usage:
            nothing_to_plot(ax, "no usage to plot: the dataset has no instance_usage rows")
            ax.set_ylabel(f"CPU {label}")
            continue
        cols = [t for t in tiers if f"{kind}_ratio_cpu_{t}" in cell and np.nan_to_num(cell[f"{kind}_ratio_cpu_{t}"]).any()]
        # unknown (NaN) buckets, e.g. no machine with a known capacity, stay gaps: never drawn as 0
        known = np.isfinite(cell[f"{kind}_ratio_cpu"].to_numpy(dtype=np.float64))
        if cols:
            ax.stackplot(hours, *[steps(np.where(known, np.nan_to_num(cell[f"{kind}_ratio_cpu_{t}"].to_numpy()),
                                                 np.nan)) for t in cols], labels=cols, alpha=0.8, step="post")
        if not known.all():
            ax.text(0.01, 0.02, f"{int((~known).sum())} bucket(s) unknown (gaps)", transform=ax.transAxes,
                    fontsize="small")
        ax.stairs(cell[f"{kind}_ratio_mem"].to_numpy(), hours, color="k", lw=1, ls="--", label="memory (all tiers)")
        mark_partial_buckets(ax, starts, width_us, lo_us, hi_us, label=kind == "alloc")
        ax.set_xlim(hours[0], hours[-1])
        ax.axhline(1.0, color="r", lw=0.8, label="capacity")
        ax.set_ylim(0, None)
        ax.set_ylabel(f"CPU {label}")
        ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize="small")
    axes[0].set_title("cell-level ratios by tier (capacity-weighted)", fontsize="medium")
    axes[1].set_xlabel(TIME_LABEL)
    axes[2].set_xlabel(TIME_LABEL)
    _draw_heatmap(fig, axes[2], machine, hours)
    ax = axes[3]
    for r, color in (("cpu", "tab:blue"), ("mem", "tab:orange")):
        def ratios(r: str = r) -> Iterator[np.ndarray]:
            for b in frames(machine, [f"alloc_ratio_{r}", f"cap_{r}"]):  # a parted table: a part at a time
                v = b[f"alloc_ratio_{r}"].to_numpy(dtype=np.float64)
                cap = b[f"cap_{r}"].to_numpy(dtype=np.float64)
                yield v[np.isfinite(v) & np.isfinite(cap) & (cap > 0)]

        n = sum(int(v.size) for v in ratios())
        if n:
            hi = max(2.0, float(stream_quantiles(ratios, [0.999])[0]))
            counts = sum(np.histogram(v, bins=100, range=(0.0, hi))[0] for v in ratios())
            edges = np.linspace(0.0, hi, 101)
            ax.stairs(counts, edges, color=color, label=f"{r} ({n} machine-buckets)")
    ax.axvline(1.0, color="r", lw=0.8)
    ax.set_xlabel("requested / capacity per machine-bucket")
    ax.set_ylabel("machine-buckets")
    ax.set_title("allocation ratio per machine and bucket", fontsize="medium")
    set_title(fig, title, f"overcommitment: requested and used CPU against capacity per {width_us / 6e7:g}-min "
              "bucket, for the cell, per machine, and over machines")
    ax.legend(loc="upper right", fontsize="small")
    save_figure_atomic(fig, path)
    return True


def _draw_heatmap(fig: Any, ax: Any, machine: Any, hours: np.ndarray) -> None:
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
    im = ax.imshow(image, aspect="auto", origin="lower", interpolation="nearest", cmap="viridis", vmin=0.0, vmax=top,
                   extent=(float(x[0]), float(x[-1]), 0.0, float(machines)))
    ax.set_xlim(hours[0], hours[-1])
    ax.set_ylabel(f"machines ({machines:,}),\nsorted by mean ratio")
    ax.set_title("CPU requested / capacity per machine and bucket (grey: capacity unknown or machine down)",
                 fontsize="medium")
    ax.set_facecolor("0.85")
    fig.colorbar(im, cax=ax.inset_axes((1.01, 0.0, 0.02, 1.0)), label="requested / capacity")
