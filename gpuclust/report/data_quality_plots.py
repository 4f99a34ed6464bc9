"""The ``data-quality`` plot: the share of rows (or instances, machines) each check flags, per table,
and, where the usage has both, the distribution of ``max_cpu / cpu_p100``."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from gpuclust.analyses.data_quality import DENOMINATORS
from gpuclust.report.axes import set_title
from gpuclust.report.plots import new_figure, save_figure_atomic

__all__ = ["plot_data_quality"]


def plot_data_quality(result: dict[str, pd.DataFrame], path: Path, *, title: str = "data-quality") -> bool:
    """Horizontal bars: each check with a non-zero count, its share of its denominator (log axis),
    coloured by table and labelled with the count; a second panel with the ``max_cpu / cpu_p100``
    histogram when the usage has both.  ``False`` when no check flags anything."""
    ch = result["checks"]
    found = ch[~ch["check"].isin(DENOMINATORS) & (ch["count"] > 0)].reset_index(drop=True)
    if found.empty:
        return False
    hist = result.get("max_over_p100", pd.DataFrame())
    fig = new_figure()
    fig.set_figheight(max(4.8, 1.6 + 0.28 * len(found)))
    axes = fig.subplots(1, 2, width_ratios=(3, 2)) if len(hist) else [fig.subplots()]
    ax = axes[0]
    tables = list(dict.fromkeys(found["table"]))
    colours = {t: f"C{k}" for k, t in enumerate(tables)}
    y = np.arange(len(found))[::-1]
    ax.barh(y, found["share"].to_numpy(), color=[colours[t] for t in found["table"]])
    ax.set_yticks(y, [f"{t}: {c}" for t, c in zip(found["table"], found["check"], strict=True)], fontsize="x-small")
    for yy, r in zip(y, found.itertuples(index=False), strict=True):
        ax.text(r.share, yy, f" {r.count:,} {r.unit}", va="center", fontsize="xx-small")
    ax.set_xscale("log")
    ax.set_xlim(max(1e-7, float(found["share"].min()) / 3), 10.0)
    ax.set_xlabel("share of the table's rows (or of its instances / machines)")
    ax.set_title("what each check flags, by table", fontsize="medium")
    quiet = int(((ch["count"] == 0) & ~ch["check"].isin(DENOMINATORS)).sum())
    ax.text(0.99, 0.01, f"{quiet} checks flagged nothing", transform=ax.transAxes, ha="right", fontsize="x-small")
    if len(hist):
        ax2 = axes[1]
        lo, hi = hist["lo_ratio"].to_numpy(), hist["hi_ratio"].to_numpy()
        lo = np.where(lo <= 0, 1e-4, lo)
        hi = np.where(np.isinf(hi), lo * 10 ** 0.05, hi)
        ax2.bar(lo, hist["windows"].to_numpy(), width=hi - lo, align="edge")
        ax2.axvline(1.0, color="grey", lw=0.8)
        ax2.set_xscale("log")
        ax2.set_xlim(min(0.1, float(lo.min()) / 2), max(10.0, float(hi.max()) * 2))
        ax2.set_xlabel("max_cpu / cpu_p100 (line: 1)")
        ax2.set_ylabel("usage windows")
        ax2.set_title("max_cpu / cpu_p100 per usage window", fontsize="medium")
    set_title(fig, title, "what each data-quality check flags: share and count, by table" +
              ("; and how the usage windows' max_cpu compares with their cpu_p100" if len(hist) else ""))
    save_figure_atomic(fig, path)
    return True
