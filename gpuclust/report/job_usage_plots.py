"""The ``job-usage`` plot: the CCDF of per-collection NCU-hours and NMU-hours on log-log axes, with
the fitted Pareto tail and the top-1% shares."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from gpuclust.report.axes import percent, set_title
from gpuclust.report.plots import new_figure, save_figure_atomic

__all__ = ["plot_job_usage"]


def _thin(n: int, most: int = 1500) -> np.ndarray:
    """Indices of at most about ``most`` points of a CCDF of ``n`` sorted values, evenly spaced on
    a log scale of the rank (every point of the tail, fewer of the body): the drawn curve is the
    same, the figure stays small."""
    if n <= most:
        return np.arange(n)
    return np.unique(np.concatenate([np.geomspace(1, n, most).astype(np.int64) - 1, [n - 1]]))


def plot_job_usage(result: dict[str, pd.DataFrame], path: Path, *, title: str = "job-usage") -> bool:
    """Two panels (NCU-hours, NMU-hours): P(X >= x) over collections with positive usage, all tiers
    and each tier, and the Pareto line fitted to the tail of all.  ``False`` without collections."""
    jobs, stats = result["jobs"], result["stats"].set_index(["tier", "resource"])
    if jobs.empty:
        return False
    fig = new_figure()
    axes = fig.subplots(1, 2)
    for ax, (res, col, unit) in zip(axes, (("cpu", "ncu_hours", "NCU-hours"), ("mem", "nmu_hours", "NMU-hours")),
                                    strict=True):
        drawn = False
        for tier in ["all", *dict.fromkeys(jobs["tier"])]:
            x = jobs[col].to_numpy() if tier == "all" else jobs.loc[jobs["tier"] == tier, col].to_numpy()
            x = np.sort(x[x > 0])[::-1]
            if x.size == 0:
                continue
            ccdf = np.arange(1, x.size + 1) / x.size
            st = stats.loc[(tier, res)]
            keep = _thin(x.size)
            ax.step(x[keep], ccdf[keep], where="post", lw=2.2 if tier == "all" else 1.0,
                    label=f"{tier} ({x.size:,}; top 1%: {percent(st['top1pct_share'])})")
            drawn = True
            if tier == "all" and np.isfinite(st["pareto_alpha"]):
                m = int(st["tail_jobs"])
                xs = x[:m][_thin(m)]
                icept = np.mean(np.log10(ccdf[:m]) + st["pareto_alpha"] * np.log10(x[:m]))
                ax.plot(xs, 10 ** (icept - st["pareto_alpha"] * np.log10(xs)), "k--", lw=1,
                        label=f"Pareto tail alpha {st['pareto_alpha']:.2f} (R² {st['pareto_r2']:.2f})")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel(f"{unit} per collection (log)")
        ax.set_ylabel("share of collections with at least x (log)")
        if drawn:
            ax.legend(fontsize="x-small", loc="lower left")
    set_title(fig, title, "share of collections using at least x NCU-hours / NMU-hours (CCDF, log-log), "
              "with the Pareto tail fit")
    save_figure_atomic(fig, path)
    return True
