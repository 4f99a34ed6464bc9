"""Plots of the ``overcommit`` analysis: cell-level allocation and usage ratios over time by tier,
and the distribution of the per-machine-bucket allocation ratio.

Called from :func:`gpuclust.report.plots.plot_result` (matplotlib, Agg backend, written atomically).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pandas as pd

from gpuclust.parted import frames
from gpuclust.stream_quantiles import stream_quantiles

__all__ = ["plot_overcommit"]


def plot_overcommit(result: dict[str, pd.DataFrame], path: Path, *, title: str = "overcommit") -> bool:
    """Three panels: cell CPU allocation ratio by tier (stacked) with the total usage ratio, cell
    CPU usage ratio by tier (stacked), and a histogram of the machine-bucket CPU and memory
    allocation ratios (machine-buckets with a known, positive capacity).  ``False`` when the
    cell series is empty."""
    from gpuclust.report.axes import TIME_LABEL, mark_partial_buckets, nothing_to_plot, set_title, trace_hours
    from gpuclust.report.plots import new_figure, save_figure_atomic

    cell, machine = result["cell"], result["machine"]
    if cell.empty:
        return False
    tiers = result["info"]["tiers"].iloc[0].split(",")
    fig = new_figure()
    fig.set_size_inches(10, 9)
    axes = fig.subplots(3, 1)
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
    ax = axes[2]
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
              "bucket, and its distribution over machines")
    ax.legend(loc="upper right", fontsize="small")
    save_figure_atomic(fig, path)
    return True
