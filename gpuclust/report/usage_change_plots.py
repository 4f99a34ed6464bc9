"""The ``usage-change`` plot: the CDF of the relative change between consecutive samples (300 s
periods of the cluster or of a machine, or windows of an instance), CPU and memory, by tier (the
instance level; the others have only "all"), with the ±20% band seed 003 reads off it."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from gpuclust.report.axes import percent, set_title
from gpuclust.report.plots import new_figure, save_figure_atomic

__all__ = ["plot_usage_change"]

#: What a pair is, per level (the info table's ``level``; results from before the option: instance).
_PAIRS = {"cluster": "consecutive 300 s periods of the cluster's usage",
          "machine": "consecutive 300 s periods of a machine's usage",
          "instance": "consecutive windows of an instance"}


def plot_usage_change(result: dict[str, pd.DataFrame], path: Path, *, title: str = "usage-change") -> bool:
    """Two panels (CPU, memory): share of pairs whose relative change is at most x, one step line
    per tier (and all tiers), x on a symmetric-log axis.  ``False`` when no change is defined."""
    h, s = result["hist"], result["summary"]
    if h.empty:
        return False
    info = result.get("info")
    level = str(info["level"].iloc[0]) if info is not None and "level" in info and len(info) else "instance"
    what = _PAIRS.get(level, _PAIRS["instance"])
    fig = new_figure()
    axes = fig.subplots(1, 2, sharey=True)
    for ax, res in zip(axes, ("cpu", "mem"), strict=True):
        for tier in dict.fromkeys(h["tier"]):
            g = h[(h["tier"] == tier) & (h["resource"] == res)].sort_values("bin")
            if g.empty:
                continue
            x = np.where(np.isinf(g["hi_change"].to_numpy()), g["lo_change"].to_numpy(), g["hi_change"].to_numpy())
            y = np.cumsum(g["pairs"].to_numpy()) / g["pairs"].sum()
            row = s[(s["tier"] == tier) & (s["resource"] == res)]
            share = float(row["within_20pct"].iloc[0]) if len(row) else float("nan")
            ax.step(x, y, where="post", label=f"{tier}: {percent(share)} within ±20%", lw=2.2 if tier == "all" else 1.0)
        ax.axvspan(-0.2, 0.2, color="grey", alpha=0.15)
        ax.set_xscale("symlog", linthresh=0.01)
        ax.set_xlim(-1.05, None)
        ax.set_xlabel(f"relative change of {res} usage, next sample vs this one")
        ax.legend(fontsize="x-small", loc="upper left")
    axes[0].set_ylabel("share of pairs")
    set_title(fig, title, f"level={level}: share of pairs of {what} whose relative usage change is at most x"
              + (", by tier" if level == "instance" else "") + " (shaded: ±20%)")
    save_figure_atomic(fig, path)
    return True
