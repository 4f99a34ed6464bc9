"""The ``cell-usage`` plot: CPU and memory usage by tier over time, as a share of the cell's capacity.

Each bucket is drawn over its whole width (steps, not a line between bucket starts); partial edge
buckets are shaded; an unknown (all-NULL) value is a gap, never 0.  Drawn by
:mod:`gpuclust.report.draw` (no matplotlib, no pandas: the figure costs milliseconds, not the
second those imports take); dispatched from :func:`gpuclust.report.plots.plot_result`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from gpuclust.report.axes import TIME_LABEL, edge_buckets, trace_hours

__all__ = ["plot_cell_usage"]


def _info(result: dict[str, Any], key: str, default: object = None) -> object:
    from gpuclust.report.draw import first

    return first(result.get("info"), key, default)


def _wide(u: Any, col: str, tiers: list[str]) -> tuple[np.ndarray, list[str], np.ndarray]:
    """Bucket starts, tier order and a (tier, bucket) array of ``col``: an absent (bucket, tier) is
    0 (no usage), a NULL value NaN (unknown)."""
    from gpuclust.report.draw import numbers, strings

    starts_all = numbers(u, "bucket_start_us")
    tier_all = strings(u, "tier")
    values = numbers(u, col)
    starts = np.sort(starts_all)  # (np.unique would import numpy.ma: ~20 ms)
    starts = starts[np.concatenate(([True], starts[1:] != starts[:-1]))]
    bi = np.searchsorted(starts, starts_all)
    seen = list(dict.fromkeys(tier_all.tolist()))
    order = [t for t in tiers if t in seen] + [t for t in seen if t not in tiers]
    ti = np.asarray([order.index(t) for t in tier_all], dtype=np.int64)
    wide = np.zeros((len(order), starts.size))
    wide[ti, bi] = values
    return starts, order, wide


def plot_cell_usage(result: dict[str, Any], path: Path, *, title: str = "cell-usage") -> bool:
    """Two panels (CPU, memory): usage / capacity stacked by tier per bucket, with the capacity
    (1.0) marked when usage comes near it.  ``False`` when there is no usage."""
    from gpuclust.report.draw import Figure, numbers

    u = result["usage"]
    if len(u) == 0:
        return False
    tiers = list(dict.fromkeys(str(_info(result, "tiers", "")).split(",")))
    width_us = float(_info(result, "bucket_s", 3600)) * 1e6  # type: ignore[arg-type]
    fig = Figure(10, 5.5)
    axes = fig.subplots(2, 1, sharex=True)
    for ax, col, what in zip(axes, ("cpu", "mem"), ("CPU", "memory"), strict=True):
        starts, order, wide = _wide(u, col, tiers)
        edges = trace_hours(np.append(starts, starts[-1] + width_us))
        ax.stack_steps(edges, list(wide), order)
        with np.errstate(invalid="ignore"):
            total = np.nansum(wide, axis=0)
        top = float(np.nanmax(total)) if total.size else 0.0
        if top > 0.8:
            ax.axhline(1.0, color="r", lw=0.9, label="capacity")
        ax.ylim = (0.0, max(top * 1.12, 1.05 if top > 0.8 else 0.0, 1e-9))
        ax.xlim = (float(edges[0]), float(edges[-1]))
        n_unknown = int(np.isnan(numbers(u, col)).sum())
        if n_unknown:
            ax.text(0.01, 0.03, f"{n_unknown} (bucket, tier) value(s) unknown: gaps", size="small")
        for i, (a, b, _why) in enumerate(edge_buckets(starts, width_us)):
            ax.axvspan(
                float(trace_hours(a)),
                float(trace_hours(b)),
                hatch=True,
                label="partial bucket (data covers part of it)" if ax is axes[0] and i == 0 else None,
            )
        cap = _info(result, f"{col}_capacity")
        ax.ylabel = f"{what} usage / capacity" + (f"\n(capacity {float(cap):.4g})" if cap is not None else "")  # type: ignore[arg-type]
    axes[0].legend(loc="upper left", outside=True, size="small", title="tier")
    axes[1].xlabel = TIME_LABEL
    fig.set_title(title, f"cell usage by priority tier per {width_us / 3.6e9:g} h bucket, as a share of capacity")
    fig.save(path)
    return True
