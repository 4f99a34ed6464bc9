"""The ``lifecycle`` plot: submissions and completions over time, the queue and the running
instances, and the distributions of scheduling delay and execution time by tier.  Drawn by
:mod:`gpuclust.report.draw` (no matplotlib, no pandas)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from gpuclust.report.axes import TIME_LABEL, edge_buckets, trace_hours

__all__ = ["plot_lifecycle"]

_SERIES = ("new_submissions", "resubmissions", "finishes", "pending", "running")


def _cdf(ax: Any, hist: Any, delays: Any, measure: str, outcome: str, tiers: list[str], what: str) -> None:
    """Cumulative share of episodes by duration, one step line per tier (bins' upper edges), over
    the episodes with a known duration; the legend gives their number and that of all episodes
    (the ``episodes`` of the key-number table)."""
    from gpuclust.report.draw import numbers, strings

    sel = (strings(hist, "measure") == measure) & (strings(hist, "outcome") == outcome)
    h_tier, h_bin = strings(hist, "tier"), numbers(hist, "bin")
    lo_s, hi_s, episodes = numbers(hist, "lo_s"), numbers(hist, "hi_s"), numbers(hist, "episodes")
    total: dict[str, int] = {}
    if delays is not None and len(delays):
        d = (strings(delays, "measure") == measure) & (strings(delays, "outcome") == outcome)
        total = {
            str(t): int(n) for t, n in zip(strings(delays, "tier")[d], numbers(delays, "episodes")[d], strict=True)
        }
    drawn = 0
    for tier in tiers:
        i = np.nonzero(sel & (h_tier == tier))[0]
        if i.size == 0:
            continue
        i = i[np.argsort(h_bin[i], kind="stable")]
        x = np.maximum(hi_s[i], 1e-6)  # zero delays at 1 µs on the log axis
        x = np.where(np.isinf(x), lo_s[i], x)
        y = np.cumsum(episodes[i]) / episodes[i].sum()
        known = int(episodes[i].sum())
        ax.step(x, y, lw=1.5, label=f"{tier}: {known:,} of {total.get(tier, known):,}")
        drawn += 1
    ax.xscale = "log"
    ax.xlabel = f"{what}, seconds (log)"
    ax.ylabel = "share of episodes with a duration"
    ax.ylim = (0.0, 1.02)
    if drawn:
        ax.legend(size="x-small", loc="lower right", title="tier: episodes with a known\nduration, of all")
    else:
        ax.text(0.5, 0.5, "no completed episodes with a known duration", ha="center")


def plot_lifecycle(result: dict[str, Any], path: Path, *, title: str = "lifecycle") -> bool:
    """Four panels: per bucket, new submissions, resubmissions and finishes; pending and running
    instances at each bucket's end; the CDFs of scheduling delay (SUBMIT to SCHEDULE) and of
    execution time of finished runs, by tier.  ``False`` when there are no events."""
    from gpuclust.report.draw import Figure, first, numbers

    s = result["series"]
    if len(s) == 0:
        return False
    info = result["info"]
    tiers = str(first(info, "tiers", "")).split(",")
    # the series summed over tiers per bucket, buckets in order
    bucket = numbers(s, "bucket_start_us")
    starts = np.sort(bucket)  # (np.unique would import numpy.ma: ~20 ms)
    starts = starts[np.concatenate(([True], starts[1:] != starts[:-1]))]
    at = np.searchsorted(starts, bucket)
    tot = {c: np.bincount(at, weights=np.nan_to_num(numbers(s, c)), minlength=starts.size) for c in _SERIES}
    width_us = float(first(info, "bucket_s", 3600)) * 1e6
    hours = trace_hours(np.append(starts, starts[-1] + width_us))
    end = first(info, "data_end_us")
    end_us = float(end) if end is not None else None
    fig = Figure(11, 7)
    a, b, c, d = fig.subplots(2, 2)
    for col in ("new_submissions", "resubmissions", "finishes"):
        a.stairs(tot[col], hours, label=col.replace("_", " "), lw=1.5)
    a.ylabel = f"events per {width_us / 3.6e9:g} h bucket"
    a.legend(size="small", loc="upper right")
    a.title = "events over time (all tiers)"
    for col in ("pending", "running"):
        b.stairs(tot[col], hours, label=f"{col} at bucket end", lw=1.5)
    b.ylabel = "instances"
    b.legend(size="small", loc="upper right")
    b.title = "queue length and running instances"
    for ax in (a, b):
        for lo, hi, _why in edge_buckets(starts, width_us, None, end_us):  # partial edge buckets, hatched
            ax.axvspan(float(trace_hours(lo)), float(trace_hours(hi)), hatch=True)
        ax.xlabel = TIME_LABEL
        ax.xlim = (float(hours[0]), float(hours[-1]))
        ax.ylim = (0.0, None)
    delays = result.get("delays")
    _cdf(c, result["delay_hist"], delays, "scheduling", "scheduled", tiers, "SUBMIT to SCHEDULE")
    c.title = "scheduling delay by tier (episodes)"
    _cdf(d, result["delay_hist"], delays, "execution", "finish", tiers, "SCHEDULE to FINISH")
    d.title = "execution time of finished runs by tier"
    fig.set_title(
        title, "life cycles: events, queue and running instances over time; scheduling delay and execution time by tier"
    )
    fig.save(path)
    return True
