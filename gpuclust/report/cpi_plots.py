"""Plot of the ``cpi`` analysis: binned CPI against machine utilisation and against the task count.

CPI is shown *relative to its platform's CPU-second-weighted mean* (platforms have different base
CPI, so raw CPI pooled over platforms mixes platform composition into the curves), with the
platform-fixed-effects fit (same scale) drawn at the other regressor's mean.  Drawn by
:mod:`gpuclust.report.draw` (no matplotlib, no pandas); dispatched from
:func:`gpuclust.report.plots.plot_result`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["plot_cpi"]


def _relative_bins(binned: Any, regression: Any, variable: str) -> dict[str, np.ndarray]:
    """Per ``bin_lo`` (ascending) of ``variable`` over platforms: CPU seconds, windows, the largest
    ``bin_hi`` and the CPU-second weighted CPI relative to each window's platform mean."""
    from gpuclust.report.draw import numbers, strings

    fit = strings(regression, "fit")
    per = fit == "per-platform"
    ref = dict(
        zip(
            strings(regression, "platform_id")[per].tolist(), numbers(regression, "cpi_mean")[per].tolist(), strict=True
        )
    )
    keep = strings(binned, "variable") == variable
    r = np.asarray([ref.get(p, np.nan) for p in strings(binned, "platform_id")[keep].tolist()], dtype=np.float64)
    cs = numbers(binned, "cpu_seconds")[keep]
    ok = np.isfinite(r) & (cs > 0)
    lo = numbers(binned, "bin_lo")[keep][ok]
    order = np.argsort(lo, kind="stable")
    lo = lo[order]
    starts = np.flatnonzero(np.r_[True, lo[1:] != lo[:-1]]) if lo.size else np.zeros(0, np.int64)

    def col(name: str) -> np.ndarray:
        return numbers(binned, name)[keep][ok][order]

    def total(v: np.ndarray) -> np.ndarray:
        return np.add.reduceat(v, starts) if starts.size else v[:0]

    cpu = total(col("cpu_seconds"))
    w_rel = total(col("cpu_seconds") * col("cpi_mean") / r[ok][order])
    hi = np.fmax.reduceat(col("bin_hi"), starts) if starts.size else lo[:0]
    return {"bin_lo": lo[starts], "bin_hi": hi, "cpu_seconds": cpu, "n": total(col("n")), "rel_cpi": w_rel / cpu}


def plot_cpi(result: dict[str, Any], path: Path, *, title: str = "cpi", min_windows: int = 50) -> bool:
    """Two panels: relative CPI vs utilisation bins and vs task-count bins, with the fitted lines.

    Bins with fewer than ``min_windows`` windows are not drawn.  Returns ``False`` when there is
    no regression data.
    """
    from gpuclust.report.draw import Figure, numbers, strings

    binned, reg = result.get("binned"), result.get("regression")
    if binned is None or reg is None or len(binned) == 0 or len(reg) == 0:
        return False
    fe = np.flatnonzero(strings(reg, "fit") == "platform-fixed-effects")

    def fe_value(name: str) -> float:
        return float(numbers(reg, name)[fe[0]])

    fig = Figure(10, 4.5)
    axes = fig.subplots(1, 2, sharey=True)
    ys: list[np.ndarray] = []
    for ax, var, xlabel in (
        (axes[0], "util", "machine CPU utilisation in the 5-min cell (fraction of capacity)"),
        (axes[1], "k", "tasks on the machine in the 5-min cell (top-level usage rows)"),
    ):
        g = _relative_bins(binned, reg, var)
        keep = g["n"] >= min_windows
        g = {k: v[keep] for k, v in g.items()}
        if not keep.any():
            continue
        hi = np.where(np.isfinite(g["bin_hi"]), g["bin_hi"], g["bin_lo"] + (0.05 if var == "util" else 1.0))
        x = (g["bin_lo"] + hi) / 2.0 if var == "util" else g["bin_lo"]
        size = 10 + 60 * np.sqrt(g["cpu_seconds"] / g["cpu_seconds"].max())
        ax.scatter(x, g["rel_cpi"], size=size, alpha=0.7, label="binned (CPU-second weighted)")
        ys.append(g["rel_cpi"])
        if fe.size and np.isfinite(fe_value("intercept")):
            xs = np.linspace(float(x.min()), float(x.max()), 50)
            b0, bu, bk = fe_value("intercept"), fe_value("b_util"), fe_value("b_ntasks")
            if var == "util":
                line = b0 + bu * xs + bk * fe_value("ntasks_mean")
                lab = f"fit: {fe_value('pct_per_10pct_util_vs_intercept'):+.2f}% per +10% util"
            else:
                line = b0 + bu * fe_value("util_mean") + bk * (xs - 1.0)
                lab = f"fit: {fe_value('pct_per_task_vs_intercept'):+.3f}% per extra task"
            ax.plot(xs, line, color="C3", label=lab)
            ys.append(line)
        ax.xlabel = xlabel
        ax.legend(loc="upper left", size="small")
    y = np.concatenate(ys) if ys else np.zeros(0)
    y = y[np.isfinite(y)]
    if y.size:  # one y axis for both panels (as matplotlib's sharey), 5% margins
        pad = 0.05 * (float(y.max()) - float(y.min())) or 0.05
        for ax in axes:
            ax.ylim = (float(y.min()) - pad, float(y.max()) + pad)
    axes[0].ylabel = "CPI / platform mean CPI"
    fig.set_title(
        title,
        "CPI interference: CPI relative to its platform's mean against machine load, with the "
        "platform-fixed-effects fit (binned, CPU-second weighted)",
    )
    fig.save(path)
    return True
