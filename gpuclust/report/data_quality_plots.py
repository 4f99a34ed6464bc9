"""The ``data-quality`` plot: the share of rows (or instances, machines) each check flags, per table,
and, where the usage has both, the distribution of ``max_cpu / cpu_p100``.  Drawn by
:mod:`gpuclust.report.draw` (no matplotlib, no pandas)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from gpuclust.analyses.data_quality import DENOMINATORS

__all__ = ["plot_data_quality"]


def plot_data_quality(result: dict[str, Any], path: Path, *, title: str = "data-quality") -> bool:
    """Horizontal bars: each check with a non-zero count, its share of its denominator (log axis),
    coloured by table and labelled with the count; a second panel with the ``max_cpu / cpu_p100``
    histogram when the usage has both.  ``False`` when no check flags anything."""
    from gpuclust.report.draw import Figure, numbers, strings

    ch = result["checks"]
    check, count = strings(ch, "check"), numbers(ch, "count")
    real = np.asarray([c not in DENOMINATORS for c in check.tolist()], dtype=bool)
    sel = real & (count > 0)
    if not sel.any():
        return False
    table, check, count = strings(ch, "table")[sel], check[sel], count[sel]
    share, unit = numbers(ch, "share")[sel], strings(ch, "unit")[sel]
    hist = result.get("max_over_p100")
    has_hist = hist is not None and len(hist) > 0
    fig = Figure(10, max(4.8, 1.6 + 0.28 * int(sel.sum())))
    axes = fig.subplots(1, 2, width_ratios=(3, 2)) if has_hist else fig.subplots()
    ax = axes[0]
    tables = list(dict.fromkeys(table.tolist()))
    y = np.arange(table.size)[::-1]
    ax.barh(y, share, color=[f"C{tables.index(t)}" for t in table.tolist()])
    ax.set_yticks(
        y.tolist(), [f"{t}: {c}" for t, c in zip(table.tolist(), check.tolist(), strict=True)], size="x-small"
    )
    for yy, sh, n, u in zip(y.tolist(), share.tolist(), count.tolist(), unit.tolist(), strict=True):
        ax.text_at(sh, yy, f"{int(n):,} {u}", size="xx-small", va="center", dx=2.0)
    ax.xscale = "log"
    ax.xlim = (max(1e-7, float(np.nanmin(share)) / 3), 10.0)
    ax.xlabel = "share of the table's rows (or of its instances / machines)"
    ax.title = "what each check flags, by table"
    quiet = int((real & (numbers(ch, "count") == 0)).sum())
    ax.text(0.99, 0.01, f"{quiet} checks flagged nothing", ha="right", size="x-small")
    if has_hist:
        ax2 = axes[1]
        lo, hi = numbers(hist, "lo_ratio"), numbers(hist, "hi_ratio")
        lo = np.where(lo <= 0, 1e-4, lo)
        hi = np.where(np.isinf(hi), lo * 10**0.05, hi)
        ax2.rects(lo, hi, 0.0, numbers(hist, "windows"), color="C0")
        ax2.axvline(1.0, color="grey", lw=0.8)
        ax2.xscale = "log"
        ax2.xlim = (min(0.1, float(lo.min()) / 2), max(10.0, float(hi.max()) * 2))
        ax2.ylim = (0.0, None)
        ax2.xlabel = "max_cpu / cpu_p100 (line: 1)"
        ax2.ylabel = "usage windows"
        ax2.title = "max_cpu / cpu_p100 per usage window"
    fig.set_title(
        title,
        "what each data-quality check flags: share and count, by table"
        + ("; and how the usage windows' max_cpu compares with their cpu_p100" if has_hist else ""),
    )
    fig.save(path)
    return True
