"""What the HTML report says about each analysis: the order of the sections, a caption saying what
the figure shows, and the key numbers as a small table.

An analysis without an entry in :data:`SECTIONS` (a newly registered one) still gets a section: its
registry summary as the caption and its smallest result table as the key numbers.  Add an entry
here to say more.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from gpuclust._lazy import pandas as pd

__all__ = [
    "NO_FIGURE",
    "ORDER",
    "SECTIONS",
    "Section",
    "caption",
    "empty_reason",
    "format_value",
    "has_figure",
    "key_numbers",
    "ordered",
]

Tables = Mapping[str, Any]

#: Section order of the page: data quality first, then the cell as a whole, then the details.
ORDER = (
    "data-quality",
    "cell-usage",
    "machine-utilization",
    "usage-distribution",
    "cpi",
    "overcommit",
    "lifecycle",
    "collection-lifecycle",
    "job-usage",
    "usage-vs-request",
    "peak-prediction",
    "usage-change",
    "machine-shapes",
)
MAX_ROWS = 12


@dataclass(frozen=True)
class Section:
    """A caption (what the figure shows, how to read it) and the key-number table of an analysis."""

    caption: str
    key: Callable[[Tables], pd.DataFrame] | None = None


def _frame(t: Any) -> pd.DataFrame:
    return t if isinstance(t, pd.DataFrame) else t.read()


def _cell_usage(r: Tables) -> pd.DataFrame:
    u = _frame(r["usage"])
    g = u.groupby("tier", sort=False).agg(
        cpu_mean=("cpu", "mean"),
        cpu_peak=("cpu", "max"),
        mem_mean=("mem", "mean"),
        mem_peak=("mem", "max"),
        windows=("windows", "sum"),
    )
    tiers = [t for t in str(_frame(r["info"])["tiers"].iloc[0]).split(",") if t in g.index]
    return g.reindex(tiers).reset_index()


def _usage_distribution(r: Tables) -> pd.DataFrame:
    q, n = _frame(r["quantiles"]), _frame(r["naive"])
    keys = [c for c in q.columns[: list(q.columns).index("n_windows")] if c != "bucket_start_us"]
    q = q.sort_values("weight", ascending=False).head(MAX_ROWS)
    out = q[keys + ["n_windows", "mean"]].copy()
    for lv in ("q50", "q90", "q99"):
        if lv in q.columns:
            out[f"{lv} mixture"] = q[lv].to_numpy()
            if lv in n.columns and len(n) == len(_frame(r["quantiles"])):
                out[f"{lv} shortcut"] = n.loc[q.index, lv].to_numpy()
    return out


def _cpi(r: Tables) -> pd.DataFrame:
    reg = _frame(r["regression"])
    reg = reg[reg["fit"] != "per-platform"]
    cols = ["fit", "n", "r2", "cpi_mean", "pct_per_task_vs_intercept", "pct_per_10pct_util_vs_intercept"]
    return reg[[c for c in cols if c in reg.columns]].rename(
        columns={
            "pct_per_task_vs_intercept": "% CPI per extra task",
            "pct_per_10pct_util_vs_intercept": "% CPI per +10% util",
        }
    )


def _overcommit(r: Tables) -> pd.DataFrame:
    s = _frame(r["summary"])
    s = s[s["tier"] == "all"]
    return s.pivot_table(index="metric", columns="resource", values="value", sort=False).reset_index()


def _lifecycle(r: Tables) -> pd.DataFrame:
    """The delays of the figure's two CDFs: ``episodes`` all of them, ``with_duration`` those the
    CDFs (and quantiles) count; where no episode has a duration, why the quantiles are unknown."""
    from gpuclust.analyses.lifecycle import unknown_duration_reason

    d = _frame(r["delays"])
    d = d[
        ((d["measure"] == "scheduling") & (d["outcome"] == "scheduled"))
        | ((d["measure"] == "execution") & (d["outcome"] == "finish"))
    ]
    out = d[["tier", "measure", "episodes", "with_duration", "p50_s", "p90_s", "p99_s", "max_s"]].copy()
    if (out["with_duration"] == 0).any():
        out["why unknown"] = [
            unknown_duration_reason(m) if k == 0 else ""
            for m, k in zip(out["measure"], out["with_duration"], strict=True)
        ]
    return out


def _job_usage(r: Tables) -> pd.DataFrame:
    s = _frame(r["stats"])
    return s[["tier", "resource", "jobs", "total_hours", "top1pct_share", "scv", "pareto_alpha", "pareto_r2"]]


def _usage_vs_request(r: Tables) -> pd.DataFrame:
    s = _frame(r["summary"])
    return s[["tier", "measure", "windows", "above_limit_share", "at_most_half_share", "p50_ratio", "p99_ratio"]]


def _usage_change(r: Tables) -> pd.DataFrame:
    s = _frame(r["summary"])
    return s[["tier", "resource", "pairs", "within_5pct", "within_20pct", "within_50pct", "p50_change"]]


def _data_quality(r: Tables) -> pd.DataFrame:
    from gpuclust.analyses.data_quality import DENOMINATORS  # the checks that are denominators

    c = _frame(r["checks"])
    flagged = c[(c["count"] > 0) & ~c["check"].isin(DENOMINATORS)]
    return flagged.sort_values("share", ascending=False)[["table", "check", "count", "unit", "share"]]


def _machine_shapes(r: Tables) -> pd.DataFrame:
    from gpuclust.report.machine_shapes_plots import shape_label

    s = _frame(r["shapes"]).head(MAX_ROWS)
    return pd.DataFrame(
        {
            "shape (cpu / mem)": [shape_label(c, m) for c, m in zip(s["cap_cpu"], s["cap_mem"], strict=True)],
            "machines": s["machines"].to_numpy(),
        }
    )


#: Sections with more to say than the registry summary; keyed by analysis name.
SECTIONS: dict[str, Section] = {
    "data-quality": Section(
        "What to know about the data before trusting the numbers below: per table, the share of rows (or "
        "instances, machines) each check flags — NULLs, sentinel times, short windows, implausible CPI/MAI, "
        "events out of order, usage without events — and how max_cpu compares with the p100 percentile. Table: "
        "the checks that flag something, largest share first.",
        _data_quality,
    ),
    "cell-usage": Section(
        "CPU and memory used in the cell per time bucket, stacked by priority tier, as a share of the cell's "
        "capacity (1 = every machine's capacity). Table: mean and peak share per tier over the buckets.",
        _cell_usage,
    ),
    "machine-utilization": Section(
        "How busy the machines are: the CDF, over every machine and 5-minute bucket, of usage / the machine's "
        "capacity (CPU and memory), and the mean over machines in time. Table: per resource, the machine-buckets, "
        "their mean and quantiles, and the share over capacity."
    ),
    "usage-distribution": Section(
        "The exact CPU usage distribution of each group (the mixture of every window's percentile CDF, solid) "
        "beside the usual shortcut, the average of the windows' percentile vectors (dashed); they differ most in "
        "the tail (right panel). Table: mixture quantiles against the shortcut's.",
        _usage_distribution,
    ),
    "cpi": Section(
        "Cycles per instruction against machine load (Borg §5.2): CPI relative to its platform's mean, binned by "
        "machine CPU utilisation and by the number of tasks on the machine, with the platform-fixed-effects "
        "regression line. Table: the fits (% CPI per extra task and per +10% utilisation).",
        _cpi,
    ),
    "overcommit": Section(
        "Requested (allocated) and used CPU against capacity over time, stacked by tier, with memory dashed; "
        "a heatmap of requested / capacity per machine (sorted by its mean) and time shows where and when the "
        "cell is overcommitted; the bottom panel shows how that ratio is spread over machine-buckets. "
        "Table: cell-wide metrics (tier all).",
        _overcommit,
    ),
    "lifecycle": Section(
        "Instance life cycles replayed from the events: submissions, resubmissions and finishes per bucket, queue "
        "length and running instances, and the distributions of scheduling delay and execution time by tier "
        "(over the episodes with a known duration: the legend says how many of all). Table: delay quantiles "
        "(seconds) over those episodes.",
        _lifecycle,
    ),
    "collection-lifecycle": Section(
        "The same life-cycle replay for collections (jobs) from collection_events. Table: delay quantiles (seconds).",
        _lifecycle,
    ),
    "job-usage": Section(
        "How heavy-tailed resource use per job is: the share of collections using at least x NCU-hours / "
        "NMU-hours on log-log axes, per tier, with the fitted Pareto tail (alpha). Table: totals, the top 1% "
        "share, squared coefficient of variation and alpha.",
        _job_usage,
    ),
    "usage-vs-request": Section(
        "Usage against the limit (request) in force at each window's start, per tier: average and maximum CPU and "
        "memory usage over the limit (Borg Figure 11). Table: shares above the limit and at most half of it.",
        _usage_vs_request,
    ),
    "usage-change": Section(
        "How much usage changes from one sample to the next (level=cluster, the default: the cell's usage between "
        "consecutive 300 s periods; machine: per machine; instance: consecutive windows of an instance, by tier): "
        "the share of pairs whose relative change is at most x (±20% shaded). Table: shares within ±5/20/50%.",
        _usage_change,
    ),
    "machine-shapes": Section(
        "Machines per capacity shape (normalised CPU / memory), as grouped in Google's notebook; a NULL capacity "
        "is labelled unknown. Table: the largest shapes.",
        _machine_shapes,
    ),
}


def ordered(keys: Iterable[str], name_of: Mapping[str, str] | None = None) -> list[str]:
    """Result keys in page order (:data:`ORDER`, then the others alphabetically)."""
    name_of = name_of or {}

    def rank(k: str) -> tuple[int, str]:
        n = name_of.get(k, k)
        return (ORDER.index(n) if n in ORDER else len(ORDER), k)

    return sorted(keys, key=rank)


def caption(name: str) -> str:
    """What the section of analysis ``name`` shows (its registry summary when it has no entry)."""
    if name in SECTIONS:
        return SECTIONS[name].caption
    from gpuclust.analyses.registry import REGISTRY

    e = REGISTRY.get(name)
    return f"{e.summary}." if e is not None else name


def _generic(tables: Tables) -> pd.DataFrame:
    """The first of ``summary`` / ``stats`` / the smallest other table (not ``info``)."""
    frames = {k: v for k, v in tables.items() if isinstance(v, pd.DataFrame) and k != "info" and not v.empty}
    for name in ("summary", "stats"):
        if name in frames:
            return frames[name]
    return min(frames.values(), key=len) if frames else pd.DataFrame()


def key_numbers(name: str, tables: Tables) -> pd.DataFrame:
    """The numbers that matter in analysis ``name``'s result (the page shows the first
    :data:`MAX_ROWS` rows, and every column)."""
    s = SECTIONS.get(name)
    try:
        df = s.key(tables) if s is not None and s.key is not None else _generic(tables)
    except (KeyError, ValueError, IndexError, ImportError, AttributeError):  # another version / shape: generic
        df = _generic(tables)
    return df


def _info_row(tables: Tables) -> dict[str, Any]:
    """The one row of a result's ``info`` table (``{}`` when there is none)."""
    from gpuclust.tables import as_arrow

    t = tables.get("info")
    rows = as_arrow(t).to_pylist() if t is not None and len(t) else []
    return rows[0] if rows else {}


def _cpi_no_figure(info: Mapping[str, Any]) -> str | None:
    if info.get("regression") == "none":
        return (
            "Nothing to plot: the option regression=none asks for no regression, and the figure draws the binned "
            "CPI with its fit (leave out -O regression=none for it); the per-group numbers are in the groups "
            "table."
        )
    return None


def _peak_prediction_no_figure(info: Mapping[str, Any]) -> str | None:
    from gpuclust.analyses.peak_prediction import horizon_note

    note = horizon_note(info)
    return None if note is None else f"Nothing to plot: {note}."


#: Analysis name -> why it has no figure, read from its ``info`` row, where an option (or the data's
#: span against one) says so better than "no rows" (``None``: not that case).
NO_FIGURE: dict[str, Callable[[Mapping[str, Any]], str | None]] = {
    "cpi": _cpi_no_figure,
    "peak-prediction": _peak_prediction_no_figure,
}


def _trace_time(us: int) -> str:
    """Trace microseconds as ``--from`` takes them, and in hours: ``600s (0.17 h)``."""
    t = f"{us // 1_000_000}s" if us % 1_000_000 == 0 else f"{us}us"
    return f"{t} ({us / 3.6e9:,.2f} h)"


def _selection_no_figure(selection: Mapping[str, Any], table: str | None) -> str:
    """Nothing to plot under a time selection: where the selection lies against the data's span
    (``_run.json``'s ``selection``, :meth:`gpuclust.engine.selection.SelectedSource.describe`)."""
    given = " ".join(
        f"--{k} {selection.get(k) or str(selection[k + '_us']) + 'us'}"
        for k in ("from", "to")
        if selection.get(f"{k}_us") is not None
    )
    span = (selection.get("data_span_us") or {}).get(table or "")
    if not span:
        return f"Nothing to plot: the time selection {given} keeps no row this analysis can use."
    lo, hi, start, end = span["min"], span["max"], selection.get("from_us"), selection.get("to_us")
    where = (
        "starts after the data's end"
        if start is not None and start > hi
        else "ends before the data's start"
        if end is not None and end <= lo
        else "keeps no row this analysis can use"
    )
    return (
        f"Nothing to plot: the time selection {given} {where}: the dataset's {table} {span['column']} runs from "
        f"{_trace_time(lo)} to {_trace_time(hi)} of trace time; choose --from / --to within that."
    )


def empty_reason(name: str, tables: Tables, *, selection: Mapping[str, Any] | None = None) -> str:
    """Why analysis ``name`` has nothing to plot: an option that asks for no plotted output
    (:data:`NO_FIGURE`), a time ``selection`` (``_run.json``'s) that keeps no row (with the data's
    span), else which of its tables are empty and what it reads."""
    from gpuclust.analyses.registry import REGISTRY

    e = REGISTRY.get(name)
    reads = f" (it reads {', '.join(e.tables)})" if e is not None else ""
    if not has_figure(name):
        return "This analysis draws no figure: its key numbers are in the table below."
    why = NO_FIGURE[name](_info_row(tables)) if name in NO_FIGURE else None
    if why is not None:
        return why
    empty = [k for k, v in tables.items() if k != "info" and len(v) == 0]
    if selection and empty:
        return _selection_no_figure(selection, e.cls.table if e is not None else None)
    if empty:
        return (
            f"Nothing to plot: its result table(s) {', '.join(empty)} are empty — the dataset has no rows "
            f"this analysis can use for them{reads}."
        )
    return f"Nothing to plot: no group in the result has a value to draw{reads}."


def has_figure(name: str) -> bool:
    """Whether analysis ``name`` has a plot (an entry of :data:`gpuclust.report.plots.PLOTS`)."""
    from gpuclust.report.plots import PLOTS

    return name in PLOTS


def format_value(v: Any) -> str:
    """A table cell: integers with thousands separators, floats to 4 significant digits, NULL as
    ``unknown``."""
    if v is None or (isinstance(v, float) and v != v) or v is pd.NA:
        return "unknown"
    if isinstance(v, (bool, np.bool_)):
        return str(bool(v))
    if isinstance(v, (int, np.integer)):
        return f"{int(v):,}"
    if isinstance(v, (float, np.floating)):
        x = float(v)
        if x != x:
            return "unknown"
        if x == int(x) and abs(x) < 1e15:
            return f"{int(x):,}"
        return f"{x:.4g}"
    return str(v)
