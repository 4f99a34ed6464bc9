"""The ``peak-prediction`` plot: per predictor the trade-off of "Take it to the Limit" (violation
rate against the capacity saved relative to the limits), and the severity of its violations.  Drawn
by :mod:`gpuclust.report.draw` (no matplotlib, no pandas)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["plot_peak_prediction"]


def plot_peak_prediction(result: dict[str, Any], path: Path, *, title: str = "peak-prediction") -> bool:
    """Left: one point per predictor, violation rate (x) against savings (y), the oracle as the
    ideal (no violation, its savings); right: mean and p99 severity of the violations, as a share
    of the machine's limit.  ``False`` when no machine-step has an oracle (all censored or none)."""
    from gpuclust.report.draw import Figure, first, numbers, strings

    s = result["summary"]
    savings = numbers(s, "savings")
    keep = (numbers(s, "machine_steps") > 0) & np.isfinite(savings)
    if not keep.any():
        return False
    predictor = strings(s, "predictor")[keep]
    rate, savings = numbers(s, "violation_rate")[keep], savings[keep]
    sev_mean, sev_p99 = numbers(s, "severity_mean")[keep], numbers(s, "severity_p99")[keep]
    fig = Figure(10, 4.5)
    left, right = fig.subplots(1, 2)
    # predictors at the same point (max-of equals n-sigma when n-sigma is the larger) share one label
    points: dict[tuple[float, float], list[str]] = {}
    for p, v, sv in zip(predictor.tolist(), rate.tolist(), savings.tolist(), strict=True):
        points.setdefault((round(100 * v, 6), round(100 * sv, 6)), []).append(p.replace("_", "-"))
    for (x, y), preds in points.items():
        star = "oracle" in preds
        left.scatter([x], [y], marker="*" if star else "o", size=80 if star else 30)
        left.text_at(x, y, " = ".join(preds), size="x-small", dx=4.0, dy=-3.0)
    left.xlabel = "violation rate: machine-steps with predicted peak < oracle (%)"
    left.ylabel = "savings: 1 - sum predicted / sum limit (%)"
    left.grid(0.3)
    others = predictor != "oracle"
    pos = np.arange(int(others.sum()))  # one bar row per predictor
    right.barh(pos + 0.2, 100 * np.nan_to_num(sev_mean[others]), height=0.4, label="mean")
    right.barh(pos - 0.2, 100 * np.nan_to_num(sev_p99[others]), height=0.4, label="p99")
    right.set_yticks(pos.tolist(), [p.replace("_", "-") for p in predictor[others].tolist()], size="small")
    right.xlabel = "severity: (oracle - predicted) / limit over violations (%)"
    right.xlim = (0.0, None)
    right.legend(size="small", loc="lower right")
    info = result.get("info")
    what = "per predictor: violations against the oracle peak vs capacity saved, and violation severity"
    if info is not None and len(info):
        what += f" (metric {first(info, 'metric')}, horizon {int(first(info, 'horizon_s', 0))} s)"
    fig.set_title(title, what)
    fig.save(path)
    return True
