"""The ``machine-utilization`` plot: the CDF of per machine x 5-minute utilisation, CPU and memory
(as the notebook draws it), and the mean over machines per bucket.  Drawn by
:mod:`gpuclust.report.draw` (no matplotlib, no pandas)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["plot_machine_utilization"]


def plot_machine_utilization(result: dict[str, Any], path: Path, *, title: str = "machine-utilization") -> bool:
    """Left: the CDF of usage / capacity over machine-buckets (exact quantiles 0..100%) per
    resource; right: its mean over machines per 5-minute bucket in trace hours.  ``False`` when
    no machine-bucket has a known utilisation."""
    from gpuclust.report.draw import Figure, first, numbers, strings

    q, ser = result["quantiles"], result["series"]
    util, quantile, resource = numbers(q, "util"), numbers(q, "quantile"), strings(q, "resource")
    ok = np.isfinite(util)
    if not ok.any():
        return False
    mode = str(first(result.get("info"), "mode", "?"))
    fig = Figure(10, 4.5)
    left, right = fig.subplots(1, 2)
    hours = numbers(ser, "bucket_start_us") / 3.6e9
    for res in dict.fromkeys(resource[ok].tolist()):
        sel = ok & (resource == res)
        left.plot(util[sel], quantile[sel], label=f"{res}", lw=1.5)
        right.plot(hours, numbers(ser, f"{res}_mean_util"), label=f"{res}", lw=0.8)
    left.axvline(1.0, color="grey", lw=0.8, dash=True)
    left.xlabel = "usage / capacity of a machine in a 5-minute bucket" + (
        " (capped at 1)" if mode == "notebook" else ""
    )
    left.ylabel = "share of machine-buckets"
    left.ylim = (0.0, 1.0)
    left.xlim = (0.0, None)
    left.legend(size="small", loc="lower right")
    right.xlabel = "trace hours"
    right.ylabel = "mean over machines"
    right.ylim = (0.0, None)
    right.legend(size="small", loc="upper right")
    fig.suptitle = f"{title}: per machine utilisation (mode {mode})"
    fig.save(path)
    return True
