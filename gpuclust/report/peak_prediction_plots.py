"""The ``peak-prediction`` plot: per predictor the trade-off of "Take it to the Limit" (violation
rate against the capacity saved relative to the limits), and the severity of its violations."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from gpuclust.report.axes import set_title
from gpuclust.report.plots import new_figure, save_figure_atomic

__all__ = ["plot_peak_prediction"]


def plot_peak_prediction(result: dict[str, pd.DataFrame], path: Path, *, title: str = "peak-prediction") -> bool:
    """Left: one point per predictor, violation rate (x) against savings (y), the oracle as the
    ideal (no violation, its savings); right: mean and p99 severity of the violations, as a share
    of the machine's limit.  ``False`` when no machine-step has an oracle (all censored or none)."""
    s = result["summary"]
    s = s[(s["machine_steps"] > 0) & np.isfinite(s["savings"].to_numpy(np.float64))]
    if s.empty:
        return False
    fig = new_figure()
    left, right = fig.subplots(1, 2)
    # predictors at the same point (max-of equals n-sigma when n-sigma is the larger) share one label
    points: dict[tuple[float, float], list[str]] = {}
    for r in s.itertuples(index=False):
        xy = (round(100 * float(r.violation_rate), 6), round(100 * float(r.savings), 6))
        points.setdefault(xy, []).append(str(r.predictor).replace("_", "-"))
    for (x, y), preds in points.items():
        marker = "*" if "oracle" in preds else "o"
        left.scatter([x], [y], marker=marker, s=80 if marker == "*" else 30)
        left.annotate(" = ".join(preds), (x, y), textcoords="offset points", xytext=(4, 3), fontsize="x-small")
    left.set_xlabel("violation rate: machine-steps with predicted peak < oracle (%)")
    left.set_ylabel("savings: 1 - sum predicted / sum limit (%)")
    left.grid(True, lw=0.3)
    preds = [p for p in s["predictor"] if p != "oracle"]
    g = s.set_index("predictor").loc[preds]
    pos = np.arange(len(preds))  # one bar row per predictor
    right.barh(pos + 0.2, 100 * np.nan_to_num(g["severity_mean"].to_numpy(np.float64)), height=0.4, label="mean")
    right.barh(pos - 0.2, 100 * np.nan_to_num(g["severity_p99"].to_numpy(np.float64)), height=0.4, label="p99")
    right.set_yticks(pos, [p.replace("_", "-") for p in preds], fontsize="small")
    right.set_xlabel("severity: (oracle - predicted) / limit over violations (%)")
    right.legend(fontsize="small", loc="lower right")
    info = result.get("info")
    what = "per predictor: violations against the oracle peak vs capacity saved, and violation severity"
    if info is not None and len(info):
        i = info.iloc[0]
        what += f" (metric {i['metric']}, horizon {int(i['horizon_s'])} s)"
    set_title(fig, title, what)
    save_figure_atomic(fig, path)
    return True
