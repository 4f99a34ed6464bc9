"""The analysis registry: names -> analysis classes with their options, and the capability table.

``docs/analyses.md`` embeds :func:`capability_table` between the markers
``<!-- capability-table:start -->`` and ``<!-- capability-table:end -->``; a test checks that the
docs match the generated table.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from gpuclust.analyses.base import Analysis
from gpuclust.analyses.cell_usage import MODES, CellUsage
from gpuclust.analyses.cpi import BY, REGRESSIONS, SPEARMAN, Cpi
from gpuclust.analyses.machine_shapes import MachineShapes
from gpuclust.analyses.overcommit import Overcommit
from gpuclust.analyses.usage_distribution import BY as UD_BY
from gpuclust.analyses.usage_distribution import ROWS as UD_ROWS
from gpuclust.analyses.usage_distribution import STRATEGIES as UD_STRATEGIES
from gpuclust.analyses.usage_distribution import UsageDistribution
from gpuclust.schema import TIER_MAPS

__all__ = ["REGISTRY", "AnalysisEntry", "Option", "capability_table", "create", "names"]


@dataclass(frozen=True)
class Option:
    """One option of an analysis (a dataclass field of its class)."""

    name: str
    default: Any
    choices: tuple[Any, ...] | None
    help: str


@dataclass(frozen=True)
class AnalysisEntry:
    """A registered analysis: its class, options and where it runs."""

    cls: type[Analysis]
    summary: str
    options: tuple[Option, ...] = ()
    #: Custom-kernel ops (``backend.ops``) its partial uses on the GPU.
    kernels: tuple[str, ...] = ()
    backends: tuple[str, ...] = ("cpu", "gpu")
    dask: bool = True
    tables: tuple[str, ...] = field(default_factory=tuple)

    @property
    def name(self) -> str:
        return self.cls.name


REGISTRY: dict[str, AnalysisEntry] = {
    e.name: e
    for e in (
        AnalysisEntry(
            CellUsage,
            "Hourly CPU and memory usage by priority tier, normalised by cell capacity",
            (
                Option("mode", "notebook", MODES,
                       "notebook = Google's notebook exactly; exact = time-weighted overlap with each hour"),
                Option("tier_map", None, tuple(TIER_MAPS),
                       "priority tier map; default: the dataset manifest's, else the trace version's default"),
            ),
            kernels=("grouped_sum", "bucket_overlap", "hash_index"),
            tables=("instance_usage", "instance_events", "machine_events"),
        ),
        AnalysisEntry(
            Cpi,
            "CPI/MAI per group (CPU-second weighted) and the Borg §5.2 CPI interference regression",
            (
                Option("by", "platform", BY, "grouping of the groups table (cell = the whole dataset)"),
                Option("regression", "platform-fixed-effects", REGRESSIONS,
                       "primary fit (all fits are reported): multiplicative platform fixed effects, "
                       "one fit per platform, or pooled over platforms"),
                Option("spearman", "grid", SPEARMAN,
                       "grid = mergeable estimate with an error bound; exact = carries the rows; none"),
                Option("spearman_bins", 32, None, "Spearman grid bins per axis"),
                Option("cpi_min", 0.0, None, "CPI filter: exclusive lower bound"),
                Option("cpi_max", 100.0, None, "CPI filter: inclusive upper bound"),
                Option("mai_min", 0.0, None, "MAI filter: inclusive lower bound"),
                Option("mai_max", 1.0, None, "MAI filter: inclusive upper bound"),
                Option("min_cpu_seconds", 0.01, None, "minimum CPU-seconds (avg_cpu x duration) of a window"),
                Option("tier_map", None, tuple(TIER_MAPS), "tier map for by=tier; default: the dataset's"),
            ),
            kernels=("grouped_comoments", "grouped_sum", "hash_index"),
            tables=("instance_usage", "machine_events", "instance_events"),
        ),
        AnalysisEntry(
            MachineShapes,
            "Machines per capacity shape (cap_cpu, cap_mem), as in Google's notebook",
            (),
            kernels=(),
            tables=("machine_events",),
        ),
        AnalysisEntry(
            Overcommit,
            "Per machine x time bucket: capacity vs. requested (by tier) vs. usage, ratios, cell series, summary",
            (
                Option("bucket_s", 300, None, "bucket width in seconds"),
                Option("tier_map", None, tuple(TIER_MAPS),
                       "priority tier map; default: the dataset manifest's, else the trace version's default"),
                Option("window_start_us", 600_000_000, None, "trace window start (trace microseconds)"),
                Option("window_end_us", None, None,
                       "trace window end; default: the largest finite time in instance_events / instance_usage"),
            ),
            kernels=("bucket_overlap", "grouped_sum", "hash_index"),
            tables=("instance_usage", "instance_events", "machine_events"),
        ),
        AnalysisEntry(
            UsageDistribution,
            "Exact CPU usage distributions (mixtures of per-window percentile CDFs) per group: mean and quantiles",
            (
                Option("by", "tier", UD_BY,
                       "one or more grouping keys, comma-separated (e.g. tier,time); time uses bucket_s"),
                Option("bucket_s", 3600, None, "time bucket width in seconds (by=time)"),
                Option("levels", "20 standard levels", None, "quantile levels in [0, 1] (comma-separated); default: the 20 standard percentile levels"),
                Option("rows", "auto", UD_ROWS,
                       "auto = all rows for instance/collection groups, top-level rows otherwise"),
                Option("strategy", "auto", UD_STRATEGIES,
                       "exact = partials carry the windows; bounded = fixed-size summary with an error bound; "
                       "auto = exact up to exact_max_windows usage rows"),
                Option("k", 512, None, "bounded summary size (CDF error <= (1 + merge depth) / k)"),
                Option("exact_max_windows", 5_000_000, None, "row budget of strategy=auto for exact"),
                Option("tier_map", None, tuple(TIER_MAPS), "tier map for by=tier; default: the dataset's"),
            ),
            kernels=("repair_percentiles", "window_means", "mixture_quantiles", "hash_index"),
            tables=("instance_usage", "instance_events"),
        ),
    )
}


def names() -> list[str]:
    """Registered analysis names, sorted."""
    return sorted(REGISTRY)


def create(name: str, **options: Any) -> Analysis:
    """Instantiate a registered analysis; options it does not declare are ignored if ``None``.

    Examples
    --------
    >>> create("cell-usage", mode="exact").mode
    'exact'
    """
    try:
        entry = REGISTRY[name]
    except KeyError:
        raise ValueError(f"unknown analysis {name!r}; choose from {names()}") from None
    known = {o.name for o in entry.options}
    kw = {}
    for k, v in options.items():
        if k in known:
            if v is not None:
                kw[k] = v
        elif v is not None:
            raise ValueError(f"analysis {name!r} has no option {k!r} (options: {sorted(known)})")
    return entry.cls(**kw)


def capability_table() -> str:
    """Markdown table: analysis x cpu / gpu / dask, with options, reads and GPU kernels."""
    rows = [
        "| analysis | cpu | gpu | dask | options | reads | GPU kernels |",
        "|---|---|---|---|---|---|---|",
    ]
    for n in names():
        e = REGISTRY[n]
        opts = "; ".join(
            f"`{o.name}`: " + (" / ".join(str(c) for c in o.choices) if o.choices else "any")
            + f" (default {o.default if o.default is not None else 'from dataset'})"
            for o in e.options
        ) or "-"
        rows.append(
            f"| `{n}` | {'yes' if 'cpu' in e.backends else 'no'} | {'yes' if 'gpu' in e.backends else 'no'} "
            f"| {'yes' if e.dask else 'no'} | {opts} | {', '.join(e.tables)} "
            f"| {', '.join(e.kernels) or 'CuPy only'} |"
        )
    return "\n".join(rows) + "\n"
