"""Plot of the ``cpi`` analysis: binned CPI against machine utilisation and against the task count.

CPI is shown *relative to its platform's CPU-second-weighted mean* (platforms have different base
CPI, so raw CPI pooled over platforms mixes platform composition into the curves), with the
platform-fixed-effects fit (same scale) drawn at the other regressor's mean.  Dispatched from
:func:`gpuclust.report.plots.plot_result`.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

__all__ = ["plot_cpi"]


def _relative_bins(binned: pd.DataFrame, regression: pd.DataFrame, variable: str) -> pd.DataFrame:
    per = regression[regression["fit"] == "per-platform"]
    ref = dict(zip(per["platform_id"], per["cpi_mean"], strict=False))
    b = binned[binned["variable"] == variable].copy()
    b["ref"] = b["platform_id"].map(ref)
    b = b[np.isfinite(b["ref"].astype(float)) & (b["cpu_seconds"] > 0)]
    b["w_rel"] = b["cpu_seconds"] * b["cpi_mean"] / b["ref"].astype(float)
    g = b.groupby("bin_lo", sort=True).agg(cpu_seconds=("cpu_seconds", "sum"), w_rel=("w_rel", "sum"),
                                           n=("n", "sum"), bin_hi=("bin_hi", "max"))
    g["rel_cpi"] = g["w_rel"] / g["cpu_seconds"]
    return g.reset_index()


def plot_cpi(result: dict[str, pd.DataFrame], path: Path, *, title: str = "cpi", min_windows: int = 50) -> bool:
    """Two panels: relative CPI vs utilisation bins and vs task-count bins, with the fitted lines.

    Bins with fewer than ``min_windows`` windows are not drawn.  Returns ``False`` when there is
    no regression data.
    """
    from gpuclust.report.axes import set_title
    from gpuclust.report.plots import new_figure, save_figure_atomic

    binned, reg = result.get("binned"), result.get("regression")
    if binned is None or reg is None or binned.empty or reg.empty:
        return False
    fe = reg[reg["fit"] == "platform-fixed-effects"]
    fig = new_figure()
    axes = fig.subplots(1, 2, sharey=True)
    for ax, var, xlabel in ((axes[0], "util", "machine CPU utilisation in the 5-min cell (fraction of capacity)"),
                            (axes[1], "k", "tasks on the machine in the 5-min cell (top-level usage rows)")):
        g = _relative_bins(binned, reg, var)
        g = g[g["n"] >= min_windows]
        if g.empty:
            continue
        hi = np.where(np.isfinite(g["bin_hi"]), g["bin_hi"], g["bin_lo"] + (0.05 if var == "util" else 1.0))
        x = (g["bin_lo"].to_numpy() + hi) / 2.0 if var == "util" else g["bin_lo"].to_numpy()
        size = 10 + 60 * np.sqrt(g["cpu_seconds"].to_numpy() / g["cpu_seconds"].max())
        ax.scatter(x, g["rel_cpi"], s=size, alpha=0.7, label="binned (CPU-second weighted)")
        if len(fe) and np.isfinite(fe["intercept"].iloc[0]):
            r = fe.iloc[0]
            xs = np.linspace(float(x.min()), float(x.max()), 50)
            if var == "util":
                ys = r["intercept"] + r["b_util"] * xs + r["b_ntasks"] * r["ntasks_mean"]
                lab = f"fit: {r['pct_per_10pct_util_vs_intercept']:+.2f}% per +10% util"
            else:
                ys = r["intercept"] + r["b_util"] * r["util_mean"] + r["b_ntasks"] * (xs - 1.0)
                lab = f"fit: {r['pct_per_task_vs_intercept']:+.3f}% per extra task"
            ax.plot(xs, ys, color="C3", label=lab)
        ax.set_xlabel(xlabel)
        ax.legend(loc="upper left", fontsize="small")
    axes[0].set_ylabel("CPI / platform mean CPI")
    set_title(fig, title, "CPI interference: CPI relative to its platform's mean against machine load, with the "
              "platform-fixed-effects fit (binned, CPU-second weighted)")
    save_figure_atomic(fig, path)
    return True
