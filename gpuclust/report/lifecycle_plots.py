"""The ``lifecycle`` plot: submissions and completions over time, the queue and the running
instances, and the distributions of scheduling delay and execution time by tier."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from gpuclust.report.axes import TIME_LABEL, mark_partial_buckets, set_title, trace_hours
from gpuclust.report.plots import new_figure, save_figure_atomic

__all__ = ["plot_lifecycle"]


def _cdf(ax: Any, hist: pd.DataFrame, delays: pd.DataFrame | None, measure: str, outcome: str, tiers: list[str],
         what: str) -> None:
    """Cumulative share of episodes by duration, one step line per tier (bins' upper edges), over
    the episodes with a known duration; the legend gives their number and that of all episodes
    (the ``episodes`` of the key-number table)."""
    sel = hist[(hist["measure"] == measure) & (hist["outcome"] == outcome)]
    total: dict[str, int] = {}
    if delays is not None and len(delays):
        d = delays[(delays["measure"] == measure) & (delays["outcome"] == outcome)]
        total = {str(t): int(n) for t, n in zip(d["tier"], d["episodes"], strict=True)}
    drawn = 0
    for tier in tiers:
        h = sel[sel["tier"] == tier].sort_values("bin")
        if h.empty:
            continue
        x = np.maximum(h["hi_s"].to_numpy(), 1e-6)  # zero delays at 1 µs on the log axis
        x = np.where(np.isinf(x), h["lo_s"].to_numpy(), x)
        y = np.cumsum(h["episodes"].to_numpy()) / h["episodes"].sum()
        known = int(h["episodes"].sum())
        ax.step(x, y, where="post", label=f"{tier}: {known:,} of {total.get(tier, known):,}")
        drawn += 1
    ax.set_xscale("log")
    ax.set_xlabel(f"{what}, seconds (log)")
    ax.set_ylabel("share of episodes with a duration")
    ax.set_ylim(0, 1.02)
    if drawn:
        ax.legend(fontsize="x-small", loc="lower right", title="tier: episodes with a known\nduration, of all",
                  title_fontsize="x-small")
    else:
        ax.text(0.5, 0.5, "no completed episodes with a known duration", transform=ax.transAxes, ha="center")


def plot_lifecycle(result: dict[str, pd.DataFrame], path: Path, *, title: str = "lifecycle") -> bool:
    """Four panels: per bucket, new submissions, resubmissions and finishes; pending and running
    instances at each bucket's end; the CDFs of scheduling delay (SUBMIT to SCHEDULE) and of
    execution time of finished runs, by tier.  ``False`` when there are no events."""
    s = result["series"]
    if s.empty:
        return False
    info = result["info"].iloc[0]
    tiers = str(info["tiers"]).split(",")
    tot = s.groupby("bucket_start_us", sort=True)[["new_submissions", "resubmissions", "finishes", "pending",
                                                   "running"]].sum()
    width_us = float(info.get("bucket_s", 3600)) * 1e6
    starts = tot.index.to_numpy(dtype=np.float64)
    hours = trace_hours(np.append(starts, starts[-1] + width_us))
    end = info.get("data_end_us")
    end_us = float(end) if end is not None and end == end else None
    fig = new_figure()
    fig.set_size_inches(11, 7)
    (a, b), (c, d) = fig.subplots(2, 2)
    for col in ("new_submissions", "resubmissions", "finishes"):
        a.stairs(tot[col].to_numpy(), hours, label=col.replace("_", " "), lw=1.5)
    a.set_ylabel(f"events per {width_us / 3.6e9:g} h bucket")
    a.legend(fontsize="small", loc="upper right")
    a.set_title("events over time (all tiers)", fontsize="medium")
    for col in ("pending", "running"):
        b.stairs(tot[col].to_numpy(), hours, label=f"{col} at bucket end", lw=1.5)
    b.set_ylabel("instances")
    b.legend(fontsize="small", loc="upper right")
    b.set_title("queue length and running instances", fontsize="medium")
    for ax in (a, b):
        mark_partial_buckets(ax, starts, width_us, None, end_us)
        ax.set_xlabel(TIME_LABEL)
        ax.set_xlim(hours[0], hours[-1])
        ax.set_ylim(0, None)
    delays = result.get("delays")
    _cdf(c, result["delay_hist"], delays, "scheduling", "scheduled", tiers, "SUBMIT to SCHEDULE")
    c.set_title("scheduling delay by tier (episodes)", fontsize="medium")
    _cdf(d, result["delay_hist"], delays, "execution", "finish", tiers, "SCHEDULE to FINISH")
    d.set_title("execution time of finished runs by tier", fontsize="medium")
    set_title(fig, title, "life cycles: events, queue and running instances over time; scheduling delay and "
              "execution time by tier")
    save_figure_atomic(fig, path)
    return True
