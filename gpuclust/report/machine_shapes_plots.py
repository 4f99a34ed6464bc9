"""The ``machine-shapes`` plot: machines per capacity shape (normalised CPU / memory), as in
Google's notebook; a NULL capacity is labelled ``unknown``.  Dispatched from
:func:`gpuclust.report.plots.plot_result`."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from gpuclust.report.axes import set_title
from gpuclust.report.plots import new_figure, save_figure_atomic

__all__ = ["plot_machine_shapes", "shape_label"]


def shape_label(cpu: float, mem: float) -> str:
    """``cpu / mem`` of a capacity shape, ``unknown`` for a NULL capacity."""
    def one(v: float) -> str:
        return "unknown" if v != v else f"{v:.4g}"

    return f"{one(cpu)} / {one(mem)}"


def plot_machine_shapes(result: dict[str, pd.DataFrame], path: Path, *, top: int = 20,
                        title: str = "machine-shapes") -> bool:
    """Bar chart of machine counts per (cap_cpu, cap_mem) shape (largest ``top`` shapes)."""
    shapes = result["shapes"]
    df = shapes.head(top)
    if df.empty:
        return False
    fig = new_figure()
    ax = fig.subplots()
    labels = [shape_label(c, m) for c, m in zip(df["cap_cpu"], df["cap_mem"], strict=True)]
    bars = ax.bar(range(len(df)), df["machines"].to_numpy())
    ax.bar_label(bars, fontsize="x-small")
    ax.set_xticks(range(len(df)), labels, rotation=45, ha="right", fontsize="small")
    ax.set_xlabel("capacity shape: CPU / memory (normalised units; unknown = capacity NULL)")
    ax.set_ylabel("machines")
    ax.set_ylim(0, float(df["machines"].max()) * 1.15)
    more = f" (largest {top} of {len(shapes)})" if len(shapes) > top else ""
    set_title(fig, title, f"machines per capacity shape{more}")
    save_figure_atomic(fig, path)
    return True
