"""The ``machine-shapes`` plot: machines per capacity shape (normalised CPU / memory), as in
Google's notebook; a NULL capacity is labelled ``unknown``.  Drawn by :mod:`gpuclust.report.draw`
(no matplotlib, no pandas); dispatched from :func:`gpuclust.report.plots.plot_result`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

__all__ = ["plot_machine_shapes", "shape_label"]


def shape_label(cpu: float, mem: float) -> str:
    """``cpu / mem`` of a capacity shape, ``unknown`` for a NULL capacity."""

    def one(v: float) -> str:
        return "unknown" if v != v else f"{v:.4g}"

    return f"{one(cpu)} / {one(mem)}"


def plot_machine_shapes(result: dict[str, Any], path: Path, *, top: int = 20, title: str = "machine-shapes") -> bool:
    """Bar chart of machine counts per (cap_cpu, cap_mem) shape (largest ``top`` shapes)."""
    from gpuclust.report.draw import Figure, numbers

    shapes = result["shapes"]
    if len(shapes) == 0:
        return False
    cpu, mem, machines = (numbers(shapes, c)[:top] for c in ("cap_cpu", "cap_mem", "machines"))
    fig = Figure(10, 4.5)
    (ax,) = fig.subplots()
    labels = [shape_label(float(c), float(m)) for c, m in zip(cpu, mem, strict=True)]
    x = list(range(len(labels)))
    ax.bar(x, machines, color="C0", value_labels=[f"{int(v)}" if v == v else "" for v in machines])
    ax.set_xticks(x, labels, rotation=45)
    ax.xlim = (-0.6, len(labels) - 0.4)
    ax.xlabel = "capacity shape: CPU / memory (normalised units; unknown = capacity NULL)"
    ax.ylabel = "machines"
    ax.ylim = (0.0, float(machines.max()) * 1.15)
    more = f" (largest {top} of {len(shapes)})" if len(shapes) > top else ""
    fig.set_title(title, f"machines per capacity shape{more}")
    fig.save(path)
    return True
