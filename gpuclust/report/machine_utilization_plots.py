"""The ``machine-utilization`` plot: the CDF of per machine x 5-minute utilisation, CPU and memory
(as the notebook draws it), and the mean over machines per bucket."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from gpuclust.report.plots import new_figure, save_figure_atomic

__all__ = ["plot_machine_utilization"]


def plot_machine_utilization(result: dict[str, pd.DataFrame], path: Path, *,
                             title: str = "machine-utilization") -> bool:
    """Left: the CDF of usage / capacity over machine-buckets (exact quantiles 0..100%) per
    resource; right: its mean over machines per 5-minute bucket in trace hours.  ``False`` when
    no machine-bucket has a known utilisation."""
    q, ser = result["quantiles"], result["series"]
    q = q[np.isfinite(q["util"].to_numpy(np.float64))]
    if q.empty:
        return False
    mode = str(result["info"]["mode"].iloc[0]) if "info" in result and len(result["info"]) else "?"
    fig = new_figure()
    left, right = fig.subplots(1, 2)
    for res in dict.fromkeys(q["resource"]):
        g = q[q["resource"] == res]
        left.plot(g["util"], g["quantile"], label=f"{res}", lw=1.5)
        hours = ser["bucket_start_us"].to_numpy(np.float64) / 3.6e9
        right.plot(hours, ser[f"{res}_mean_util"], label=f"{res}", lw=0.8)
    left.axvline(1.0, color="grey", lw=0.8, ls="--")
    left.set_xlabel("usage / capacity of a machine in a 5-minute bucket" + (" (capped at 1)" if mode == "notebook" else ""))
    left.set_ylabel("share of machine-buckets")
    left.set_ylim(0, 1)
    left.set_xlim(0, None)
    left.legend(fontsize="small", loc="lower right")
    right.set_xlabel("trace hours")
    right.set_ylabel("mean over machines")
    right.set_ylim(0, None)
    right.legend(fontsize="small")
    fig.suptitle(f"{title}: per machine utilisation (mode {mode})", fontsize="medium")
    save_figure_atomic(fig, path)
    return True
