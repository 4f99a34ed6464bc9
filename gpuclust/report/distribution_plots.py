"""Plot of a ``usage-distribution`` result: per-group mixture CDFs against the shortcut.

For the heaviest groups (the tiers or the cell with the default options) the exact mixture CDF
(quantile levels against the ``quantiles`` table's values, solid) is drawn next to the CDF implied
by the sample-weighted average of the groups' percentile vectors (the ``naive`` table, dashed),
the usual shortcut; the left panel shows the body (up to the largest p99), the right one the tail (levels 0.9-1,
log scale), where they differ most.  Drawn by :mod:`gpuclust.report.draw` (no matplotlib; the
heaviest groups are picked by the analysis' own :func:`heaviest_groups`, as its summary does).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["plot_usage_distribution"]


def _levels(columns: list[str]) -> tuple[list[str], np.ndarray]:
    qcols = [c for c in columns if c.startswith("q") and c[1:].replace(".", "", 1).isdigit()]
    return qcols, np.array([float(c[1:]) / 100 for c in qcols])


def _key_text(v: object, column: str = "") -> str:
    """A group key for a legend: NULL is ``unknown``, a time bucket its start in trace hours."""
    if v is None or (isinstance(v, float) and v != v):
        return "unknown"
    if column == "bucket_start_us":
        from gpuclust.report.axes import trace_hours

        return f"from {float(trace_hours(v)):.3g} h"
    return str(v)


def plot_usage_distribution(
    result: dict[str, Any], path: Path, *, title: str = "usage-distribution", top: int = 6
) -> bool:
    """Mixture CDFs of the ``top`` heaviest groups (solid) and the weighted-average-of-percentiles
    shortcut (dashed); ``False`` when there is no group with weight."""
    from gpuclust.analyses.usage_distribution import heaviest_groups
    from gpuclust.report.draw import Figure

    qd, naive = heaviest_groups(result, top)  # parted tables are streamed
    if qd.empty or not (qd["weight"] > 0).any():
        return False
    keycols = [c for c in qd.columns[: list(qd.columns).index("n_windows")] if c != "bucket"]
    order = [i for i in range(len(qd)) if qd["weight"].iloc[i] > 0]
    qcols, lv = _levels(list(qd.columns))
    ncols, nlv = _levels(list(naive.columns))
    fig = Figure(10, 4.5)
    axes = fig.subplots(1, 2)
    for n, i in enumerate(order):
        label = " ".join(_key_text(qd[c].iloc[i], c) for c in keycols) or "all"
        color = f"C{n % 10}"
        x = qd[qcols].iloc[i].to_numpy(np.float64)
        xn = naive[ncols].iloc[i].to_numpy(np.float64)
        for ax in axes:
            ax.plot(x, lv, color=color, label=f"{label} (mixture)" if ax is axes[0] else None)
            ax.plot(
                xn,
                nlv,
                color=color,
                dash=True,
                alpha=0.7,
                label=f"{label} (avg of percentiles)" if ax is axes[0] else None,
            )
    tail_x = np.concatenate(
        [
            qd[qcols].iloc[order].to_numpy(np.float64)[:, lv >= 0.9].ravel(),
            naive[ncols].iloc[order].to_numpy(np.float64)[:, nlv >= 0.9].ravel(),
        ]
    )
    tail_x = tail_x[np.isfinite(tail_x)]
    body = [c for c, x in zip(qcols, lv, strict=True) if x <= 0.99]
    x99 = np.nanmax(qd[body].iloc[order].to_numpy(np.float64)) if body else np.nan
    if np.isfinite(x99) and x99 > 0:
        axes[0].xlim = (0.0, 1.15 * float(x99))  # the body; the tail is on the right
    pos = tail_x[tail_x > 0]
    if pos.size:
        axes[1].xscale = "log"
        axes[1].xlim = (float(pos.min()) / 1.5, float(pos.max()) * 1.5)
    axes[0].xlabel = "CPU (normalised cores)"
    axes[0].ylabel = "fraction of samples <= x"
    axes[0].legend(loc="lower right", size="x-small")
    axes[1].ylim = (0.9, 1.0005)
    axes[1].xlabel = "CPU (log scale)"
    axes[0].title = "body (up to the largest p99)"
    axes[1].title = "tail (levels 0.9-1)"
    fig.set_title(
        title,
        "CPU usage distribution per group: exact mixture (solid) against the average of the "
        "windows' percentiles (dashed, the usual shortcut)",
    )
    fig.save(path)
    return True
