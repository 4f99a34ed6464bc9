"""The ``usage-vs-request`` plot (Borg Figure 11's view): the CDF of usage / limit per tier, for
the average and maximum CPU and memory usage of each window."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from gpuclust.report.axes import set_title
from gpuclust.report.plots import new_figure, save_figure_atomic

__all__ = ["plot_usage_vs_request"]


def plot_usage_vs_request(result: dict[str, pd.DataFrame], path: Path, *, title: str = "usage-vs-request") -> bool:
    """Four panels (cpu_avg, cpu_max, mem_avg, mem_max): share of windows with usage / limit at
    most x, one step line per tier (and all), the limit marked at 1.  ``False`` when no window has
    a limit."""
    h, s = result["hist"], result["summary"]
    if h.empty:
        return False
    fig = new_figure()
    fig.set_size_inches(11, 7)
    axes = fig.subplots(2, 2, sharey=True).reshape(-1)
    for ax, measure in zip(axes, ("cpu_avg", "cpu_max", "mem_avg", "mem_max"), strict=True):
        for tier in dict.fromkeys(h["tier"]):
            g = h[(h["tier"] == tier) & (h["measure"] == measure)].sort_values("bin")
            if g.empty:
                continue
            x = np.where(np.isinf(g["hi_ratio"].to_numpy()), g["lo_ratio"].to_numpy(), g["hi_ratio"].to_numpy())
            y = np.cumsum(g["windows"].to_numpy()) / g["windows"].sum()
            row = s[(s["tier"] == tier) & (s["measure"] == measure)]
            above = float(row["above_limit_share"].iloc[0]) if len(row) else float("nan")
            ax.step(x, y, where="post", lw=2.2 if tier == "all" else 1.0, label=f"{tier}: {above:.0%} above")
        ax.axvline(1.0, color="k", lw=0.8, ls="--")
        ax.set_xscale("log")
        used = h[(h["measure"] == measure) & (h["windows"] > 0)]
        lo = used["lo_ratio"][used["lo_ratio"] > 0]
        hi = np.where(np.isinf(used["hi_ratio"]), used["lo_ratio"], used["hi_ratio"])
        if len(lo) and len(hi):  # the data's range: the zero-usage bin is the curves' value at the left edge
            ax.set_xlim(min(float(lo.min()), 1.0) / 1.5, max(float(np.max(hi)), 1.0) * 1.5)
        ax.set_xlabel(f"{measure.replace('_', ' ')} usage / limit (log)")
        ax.legend(fontsize="x-small", loc="upper left")
    axes[0].set_ylabel("share of windows")
    axes[2].set_ylabel("share of windows")
    set_title(fig, title, "share of windows with usage / limit at most x, by tier (dashed: the limit; windows "
              "with zero usage start each curve above 0)")
    save_figure_atomic(fig, path)
    return True
