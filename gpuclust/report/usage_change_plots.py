"""The ``usage-change`` plot: the CDF of the relative change between consecutive samples (300 s
periods of the cluster or of a machine, or windows of an instance), CPU and memory, by tier (the
instance level; the others have only "all"), with the ±20% band seed 003 reads off it.  Drawn by
:mod:`gpuclust.report.draw` (no matplotlib, no pandas)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from gpuclust.report.axes import percent

__all__ = ["plot_usage_change"]

#: What a pair is, per level (the info table's ``level``; results from before the option: instance).
_PAIRS = {
    "cluster": "consecutive 300 s periods of the cluster's usage",
    "machine": "consecutive 300 s periods of a machine's usage",
    "instance": "consecutive windows of an instance",
}


def plot_usage_change(result: dict[str, Any], path: Path, *, title: str = "usage-change") -> bool:
    """Two panels (CPU, memory): share of pairs whose relative change is at most x, one step line
    per tier (and all tiers), x on a symmetric-log axis.  ``False`` when no change is defined."""
    from gpuclust.report.draw import Figure, first, numbers, strings

    h, s = result["hist"], result["summary"]
    if len(h) == 0:
        return False
    level = str(first(result.get("info"), "level", "instance"))
    what = _PAIRS.get(level, _PAIRS["instance"])
    tier, resource = strings(h, "tier"), strings(h, "resource")
    bins, pairs = numbers(h, "bin"), numbers(h, "pairs")
    lo, hi = numbers(h, "lo_change"), numbers(h, "hi_change")
    s_tier, s_res, s_within = strings(s, "tier"), strings(s, "resource"), numbers(s, "within_20pct")
    fig = Figure(10, 4.5)
    axes = fig.subplots(1, 2, sharey=True)
    for ax, res in zip(axes, ("cpu", "mem"), strict=True):
        for t in dict.fromkeys(tier.tolist()):
            sel = np.flatnonzero((tier == t) & (resource == res))
            if sel.size == 0:
                continue
            sel = sel[np.argsort(bins[sel], kind="stable")]
            x = np.where(np.isinf(hi[sel]), lo[sel], hi[sel])
            y = np.cumsum(pairs[sel]) / pairs[sel].sum()
            row = np.flatnonzero((s_tier == t) & (s_res == res))
            share = float(s_within[row[0]]) if row.size else float("nan")
            ax.step(x, y, label=f"{t}: {percent(share)} within ±20%", lw=2.2 if t == "all" else 1.0)
        ax.axvspan(-0.2, 0.2, color="grey", alpha=0.15)
        ax.xscale, ax.linthresh = "symlog", 0.01
        ax.xlim = (-1.05, None)
        ax.ylim = (-0.05, 1.05)  # shared: the same on both panels
        ax.xlabel = f"relative change of {res} usage, next sample vs this one"
        ax.legend(size="x-small", loc="upper left")
    axes[0].ylabel = "share of pairs"
    fig.set_title(
        title,
        f"level={level}: share of pairs of {what} whose relative usage change is at most x"
        + (", by tier" if level == "instance" else "")
        + " (shaded: ±20%)",
    )
    fig.save(path)
    return True
