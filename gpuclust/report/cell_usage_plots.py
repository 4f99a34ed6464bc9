"""The ``cell-usage`` plot: CPU and memory usage by tier over time, as a share of the cell's capacity.

Each bucket is drawn over its whole width (steps, not a line between bucket starts); partial edge
buckets are shaded; an unknown (all-NULL) value is a gap, never 0.  Dispatched from
:func:`gpuclust.report.plots.plot_result`.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from gpuclust.report.axes import TIME_LABEL, mark_partial_buckets, set_title, trace_hours
from gpuclust.report.plots import new_figure, save_figure_atomic

__all__ = ["plot_cell_usage"]


def _info(result: dict[str, pd.DataFrame], key: str, default: object = None) -> object:
    info = result.get("info")
    if info is None or info.empty or key not in info.columns:
        return default
    v = info[key].iloc[0]
    return default if v is None or (isinstance(v, float) and v != v) else v


def plot_cell_usage(result: dict[str, pd.DataFrame], path: Path, *, title: str = "cell-usage") -> bool:
    """Two panels (CPU, memory): usage / capacity stacked by tier per bucket, with the capacity
    (1.0) marked when usage comes near it.  ``False`` when there is no usage."""
    u = result["usage"]
    if u.empty:
        return False
    tiers = list(dict.fromkeys(str(_info(result, "tiers", "")).split(",")))
    width_us = float(_info(result, "bucket_s", 3600)) * 1e6  # type: ignore[arg-type]
    fig = new_figure()
    fig.set_size_inches(10, 5.5)
    axes = fig.subplots(2, 1, sharex=True)
    for ax, col, what in zip(axes, ("cpu", "mem"), ("CPU", "memory"), strict=True):
        # absent (tier, bucket) = no usage = 0; a NaN value = unknown (all values NULL): a gap, never 0
        wide = u.set_index(["bucket_start_us", "tier"])[col].unstack("tier").sort_index()
        unknown = u.assign(_u=u[col].isna()).set_index(["bucket_start_us", "tier"])["_u"].unstack("tier")
        wide = wide.fillna(0.0).mask(unknown.reindex_like(wide).fillna(False).astype(bool))
        order = [t for t in tiers if t in wide.columns] + [t for t in wide.columns if t not in tiers]
        wide = wide.reindex(columns=order)
        starts = wide.index.to_numpy(dtype=np.float64)
        x = trace_hours(np.append(starts, starts[-1] + width_us))
        ys = [np.append(wide[t].to_numpy(), wide[t].to_numpy()[-1]) for t in wide.columns]
        ax.stackplot(x, *ys, labels=[str(t) for t in wide.columns], step="post", alpha=0.85)
        top = float(np.nanmax(np.nansum(np.vstack(ys), axis=0))) if ys else 0.0
        if top > 0.8:
            ax.axhline(1.0, color="r", lw=0.9, label="capacity")
        ax.set_ylim(0, max(top * 1.12, 1.05 if top > 0.8 else 0.0, 1e-9))
        ax.set_xlim(x[0], x[-1])
        n_unknown = int(u[col].isna().sum())
        if n_unknown:
            ax.text(0.01, 0.03, f"{n_unknown} (bucket, tier) value(s) unknown: gaps", transform=ax.transAxes,
                    fontsize="small")
        mark_partial_buckets(ax, starts, width_us, label=ax is axes[0])
        cap = _info(result, f"{col}_capacity")
        ax.set_ylabel(f"{what} usage / capacity" + (f"\n(capacity {float(cap):.4g})" if cap is not None else ""))  # type: ignore[arg-type]
    axes[0].legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize="small", title="tier")
    axes[1].set_xlabel(TIME_LABEL)
    set_title(fig, title, f"cell usage by priority tier per {width_us / 3.6e9:g} h bucket, as a share of capacity")
    save_figure_atomic(fig, path)
    return True
