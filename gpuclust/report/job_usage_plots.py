"""The ``job-usage`` plot: the CCDF of per-collection NCU-hours and NMU-hours on log-log axes, with
the fitted Pareto tail and the top-1% shares.  Drawn by :mod:`gpuclust.report.draw` (no matplotlib,
no pandas)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from gpuclust.report.axes import percent

__all__ = ["plot_job_usage"]


def _thin(n: int, most: int = 1500) -> np.ndarray:
    """Indices of at most about ``most`` points of a CCDF of ``n`` sorted values, evenly spaced on
    a log scale of the rank (every point of the tail, fewer of the body): the drawn curve is the
    same, the figure stays small."""
    if n <= most:
        return np.arange(n)
    i = np.append(np.geomspace(1, n, most).astype(np.int64) - 1, n - 1)  # non-decreasing
    return i[np.concatenate(([True], i[1:] != i[:-1]))]  # (np.unique would import numpy.ma)


def plot_job_usage(result: dict[str, Any], path: Path, *, title: str = "job-usage") -> bool:
    """Two panels (NCU-hours, NMU-hours): P(X >= x) over collections with positive usage, all tiers
    and each tier, and the Pareto line fitted to the tail of all.  ``False`` without collections."""
    from gpuclust.report.draw import Figure, numbers, strings

    jobs, stats = result["jobs"], result["stats"]
    if len(jobs) == 0:
        return False
    cols = ("top1pct_share", "pareto_alpha", "tail_jobs", "pareto_r2")
    st_all = {c: numbers(stats, c) for c in cols}
    st_of = {
        (t, r): {c: float(st_all[c][i]) for c in cols}
        for i, (t, r) in enumerate(zip(strings(stats, "tier"), strings(stats, "resource"), strict=True))
    }
    tier_of = strings(jobs, "tier")
    fig = Figure(10, 4.5)
    axes = fig.subplots(1, 2)
    for ax, (res, col, unit) in zip(
        axes, (("cpu", "ncu_hours", "NCU-hours"), ("mem", "nmu_hours", "NMU-hours")), strict=True
    ):
        values = numbers(jobs, col)
        drawn = False
        for tier in ["all", *dict.fromkeys(tier_of.tolist())]:
            x = values if tier == "all" else values[tier_of == tier]
            x = np.sort(x[x > 0])[::-1]
            if x.size == 0:
                continue
            ccdf = np.arange(1, x.size + 1) / x.size
            st = st_of.get((tier, res), dict.fromkeys(cols, float("nan")))
            keep = _thin(x.size)
            ax.step(
                x[keep],
                ccdf[keep],
                lw=2.2 if tier == "all" else 1.0,
                label=f"{tier} ({x.size:,}; top 1%: {percent(st['top1pct_share'])})",
            )
            drawn = True
            if tier == "all" and np.isfinite(st["pareto_alpha"]):
                m = int(st["tail_jobs"])
                xs = x[:m][_thin(m)]
                icept = np.mean(np.log10(ccdf[:m]) + st["pareto_alpha"] * np.log10(x[:m]))
                ax.plot(
                    xs,
                    10 ** (icept - st["pareto_alpha"] * np.log10(xs)),
                    color="k",
                    dash=True,
                    lw=1,
                    label=f"Pareto tail alpha {st['pareto_alpha']:.2f} (R² {st['pareto_r2']:.2f})",
                )
        ax.xscale = ax.yscale = "log"
        ax.xlabel = f"{unit} per collection (log)"
        ax.ylabel = "share of collections with at least x (log)"
        if drawn:
            ax.legend(size="x-small", loc="lower left")
    fig.set_title(
        title, "share of collections using at least x NCU-hours / NMU-hours (CCDF, log-log), with the Pareto tail fit"
    )
    fig.save(path)
    return True
