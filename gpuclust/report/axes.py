"""Shared pieces of the plots: the time axis, partial edge buckets, labels, "nothing to plot".

Every time series is drawn against *trace hours*: hours of trace time, whose origin is the one of
the tables' times, of the analyses' time buckets and of ``--from`` / ``--to`` (trace time 0, 600 s
before the trace start; docs/user/dataset.md, "Time"), so an hour bucket's edges fall on whole hours
and ``--from 2h`` is 2 on the axis.  The trace starts at 600 s (0.17 h: 1 May 2019 00:00 PDT for
v3, 1 May 2011 19:00 EDT for v2).  A bucket only partly covered by the data (the first hour
bucket starts 600 s before the trace, the last one usually extends past the data's end) is
shaded and labelled, so that its lower total is not read as a drop in load.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from gpuclust.schema import TRACE_OFFSET_US

__all__ = ["TIME_LABEL", "edge_buckets", "nothing_to_plot", "percent", "trace_hours", "wrap_label"]

#: The x label of every time series.
TIME_LABEL = "trace hours (trace time; the trace starts at 0.17 h)"


def trace_hours(us: Any) -> np.ndarray:
    """Trace microseconds -> hours of trace time (the origin of the times, the buckets and
    ``--from`` / ``--to``; the trace starts at 600 s)."""
    return np.asarray(us, dtype=np.float64) / 3.6e9


def edge_buckets(
    starts_us: Sequence[int] | np.ndarray, width_us: float, lo_us: float | None = None, hi_us: float | None = None
) -> list[tuple[float, float, str]]:
    """The first and last buckets that the data ``[lo_us, hi_us)`` covers only in part, as
    ``(start_us, end_us, why)``.  ``lo_us`` defaults to the trace start; with ``hi_us`` unknown
    the last bucket is reported as possibly partial."""
    s = np.sort(np.asarray(starts_us, dtype=np.float64))  # (np.unique would import numpy.ma: ~20 ms)
    s = s[np.concatenate(([True], s[1:] != s[:-1]))] if s.size else s
    if s.size == 0 or not width_us > 0:
        return []
    lo = TRACE_OFFSET_US if lo_us is None else float(lo_us)
    out = []
    if s[0] < lo < s[0] + width_us:
        out.append((float(s[0]), float(s[0] + width_us), "starts before the data"))
    last = float(s[-1])
    if hi_us is None:
        if s.size > 1:
            out.append((last, last + width_us, "the data may end inside it"))
    elif last < float(hi_us) < last + width_us:
        out.append((last, last + width_us, "ends after the data"))
    return out


def wrap_label(text: str, width: int) -> str:
    """``text`` broken into lines of at most ``width`` characters (at spaces)."""
    import textwrap

    return "\n".join(textwrap.wrap(text, width)) or text


def percent(share: Any) -> str:
    """A share as a percentage for a legend, never rounded to 0% or 100% unless it is exactly that:
    ``0.002`` -> ``0.2%``, ``0.00004`` -> ``<0.01%``, ``0.127`` -> ``13%``, ``0.9996`` -> ``>99.9%``;
    NaN -> ``unknown``."""
    x = float(share) * 100
    if x != x:
        return "unknown"
    if x <= 0 or x >= 100:
        return f"{x:.0f}%"
    if x < 0.01:
        return "<0.01%"
    if x < 1:
        return f"{x:.2g}%"
    if x > 99.9:
        return ">99.9%"
    if x > 99:
        return f"{x:.1f}%"
    return f"{x:.0f}%"


def nothing_to_plot(ax: Any, reason: str) -> None:
    """Write ``reason`` in the middle of an empty :mod:`gpuclust.report.draw` panel (and hide its
    ticks)."""
    ax.text(0.5, 0.5, wrap_label(reason, 60), ha="center", va="center", color="0.3")
    ax.set_xticks([], [])
    ax.set_yticks([], [])
