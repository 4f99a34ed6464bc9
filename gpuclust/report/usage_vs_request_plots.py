"""The ``usage-vs-request`` plot (Borg Figure 11's view): the CDF of usage / limit per tier, for
the average and maximum CPU and memory usage of each window.  Drawn by
:mod:`gpuclust.report.draw` (no matplotlib, no pandas)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from gpuclust.report.axes import percent

__all__ = ["plot_usage_vs_request"]


def plot_usage_vs_request(result: dict[str, Any], path: Path, *, title: str = "usage-vs-request") -> bool:
    """Four panels (cpu_avg, cpu_max, mem_avg, mem_max): share of windows with usage / limit at
    most x, one step line per tier (and all), the limit marked at 1.  ``False`` when no window has
    a limit."""
    from gpuclust.report.draw import Figure, numbers, strings

    h, s = result["hist"], result["summary"]
    if len(h) == 0:
        return False
    h_tier, h_measure = strings(h, "tier"), strings(h, "measure")
    h_bin, lo_r, hi_r, windows = (numbers(h, c) for c in ("bin", "lo_ratio", "hi_ratio", "windows"))
    s_tier, s_measure, s_above = strings(s, "tier"), strings(s, "measure"), numbers(s, "above_limit_share")
    fig = Figure(11, 7)
    axes = fig.subplots(2, 2, sharey=True)
    for ax, measure in zip(axes, ("cpu_avg", "cpu_max", "mem_avg", "mem_max"), strict=True):
        for tier in dict.fromkeys(h_tier.tolist()):
            sel = np.nonzero((h_tier == tier) & (h_measure == measure))[0]
            if sel.size == 0:
                continue
            sel = sel[np.argsort(h_bin[sel], kind="stable")]
            x = np.where(np.isinf(hi_r[sel]), lo_r[sel], hi_r[sel])
            y = np.cumsum(windows[sel]) / windows[sel].sum()
            row = np.nonzero((s_tier == tier) & (s_measure == measure))[0]
            above = float(s_above[row[0]]) if row.size else float("nan")
            ax.step(x, y, lw=2.2 if tier == "all" else 1.0, label=f"{tier}: {percent(above)} above")
        ax.axvline(1.0, color="k", lw=0.8, dash=True)
        ax.xscale = "log"
        used = (h_measure == measure) & (windows > 0)
        lo = lo_r[used][lo_r[used] > 0]
        hi = np.where(np.isinf(hi_r[used]), lo_r[used], hi_r[used])
        if lo.size and hi.size:  # the data's range: the zero-usage bin is the curves' value at the left edge
            ax.xlim = (min(float(lo.min()), 1.0) / 1.5, max(float(np.max(hi)), 1.0) * 1.5)
        ax.ylim = (-0.05, 1.05)
        ax.xlabel = f"{measure.replace('_', ' ')} usage / limit (log)"
        ax.legend(size="x-small", loc="upper left")
    axes[0].ylabel = "share of windows"
    axes[2].ylabel = "share of windows"
    fig.set_title(
        title,
        "share of windows with usage / limit at most x, by tier (dashed: the limit; windows "
        "with zero usage start each curve above 0)",
    )
    fig.save(path)
    return True
