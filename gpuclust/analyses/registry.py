"""The analysis registry: names -> analysis classes, and the capability table.

An analysis' options are its dataclass fields (declared with
:func:`gpuclust.analyses.options.option`); the tables it reads are its ``requires`` and
``optional_tables`` class attributes (``table_uses`` names the options that read a table only
some options read; per instance, :meth:`~gpuclust.analyses.base.Analysis.needed_tables`).  The
registry only adds what the class cannot say about itself: a one-line summary, the kernel
sources its gpu run launches, where it runs.

``docs/analyses/README.md`` embeds :func:`capability_table` between the markers
``<!-- capability-table:start -->`` and ``<!-- capability-table:end -->``; a test checks that the
docs match the generated table.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from gpuclust.analyses.options import Option, options_of

if TYPE_CHECKING:
    from gpuclust.analyses.base import Analysis

__all__ = ["REGISTRY", "AnalysisEntry", "Option", "capability_table", "create", "names", "options_text"]


@dataclass(frozen=True)
class AnalysisEntry:
    """A registered analysis: its class and where it runs (options and tables come from the class)."""

    name: str
    #: ``module:Class``: the module is imported when the class is first needed, so that a run of
    #: one analysis does not import the others (docs/user/scale.md, "Start-up").
    target: str
    summary: str
    #: The ``kernels/*.cu`` files whose kernels its gpu run launches, under any of its options
    #: (none: CuPy's own kernels only).  tests/analyses/test_registry_kernels.py checks them
    #: against the ops a gpu run calls and the files those ops reach.
    kernels: tuple[str, ...] = ()
    backends: tuple[str, ...] = ("cpu", "gpu")
    dask: bool = True

    @property
    def cls(self) -> type[Analysis]:
        """The analysis class (its module imported on first use)."""
        module, _, cls = self.target.partition(":")
        found: type[Analysis] = getattr(importlib.import_module(module), cls)
        return found

    @property
    def options(self) -> tuple[Option, ...]:
        """The class' option fields (see :func:`gpuclust.analyses.options.options_of`)."""
        return options_of(self.cls)

    @property
    def tables(self) -> tuple[str, ...]:
        """Every table it reads: the required ones, then the optional ones."""
        return (*self.cls.requires, *self.cls.optional_tables)


REGISTRY: dict[str, AnalysisEntry] = {
    e.name: e
    for e in (  # the names are the classes' own (a test checks)
        AnalysisEntry(
            "cell-usage",
            "gpuclust.analyses.cell_usage:CellUsage",
            "Hourly CPU and memory usage by priority tier, normalised by cell capacity",
            kernels=("bucket_overlap.cu", "grouped_sum.cu"),
        ),
        AnalysisEntry(
            "cpi",
            "gpuclust.analyses.cpi:Cpi",
            "CPI/MAI per group (CPU-second weighted) and the Borg §5.2 CPI interference regression",
            kernels=("grouped_moments.cu", "grouped_sum.cu"),
        ),
        AnalysisEntry(
            "data-quality",
            "gpuclust.analyses.data_quality:DataQuality",
            "Per table: rows, NULLs per column, codes, sentinels, short windows, "
            "non-monotone percentiles, p100 vs max, implausible CPI/MAI, out-of-order events, usage "
            "after the final terminal event, usage without events and vice versa",
            kernels=("grouped_sum.cu",),
        ),
        AnalysisEntry(
            "job-usage",
            "gpuclust.analyses.job_usage:JobUsage",
            "Per-collection NCU-hours and NMU-hours and their heavy tail by tier: quantiles, top "
            "1% / 0.1% shares, C², Pareto alpha of the CCDF tail, NCU-NMU correlation",
            kernels=("grouped_sum.cu",),
        ),
        AnalysisEntry(
            "collection-lifecycle",
            "gpuclust.analyses.lifecycle:CollectionLifecycle",
            "Collection (job) life cycles from collection_events: the same tables as "
            "lifecycle, one thing per collection",
            kernels=("grouped_sum.cu",),
        ),
        AnalysisEntry(
            "lifecycle",
            "gpuclust.analyses.lifecycle:Lifecycle",
            "Instance life cycles: events and transitions by tier, submissions / queue / running "
            "series, scheduling delays and execution times (censored at the data's end)",
            kernels=("grouped_sum.cu",),
        ),
        AnalysisEntry(
            "machine-shapes",
            "gpuclust.analyses.machine_shapes:MachineShapes",
            "Machines per capacity shape (cap_cpu, cap_mem), as in Google's notebook",
        ),
        AnalysisEntry(
            "machine-utilization",
            "gpuclust.analyses.machine_utilization:MachineUtilization",
            "Per machine x 5 minutes: usage / capacity, CPU and memory (Google's "
            "notebook query, or time-weighted and uncapped), its exact quantiles and mean series",
            kernels=("bucket_overlap.cu", "grouped_sum.cu"),
        ),
        AnalysisEntry(
            "overcommit",
            "gpuclust.analyses.overcommit:Overcommit",
            "Per machine x time bucket: capacity vs. requested (by tier) vs. usage, ratios, cell series, summary",
            kernels=("bucket_overlap.cu", "grouped_sum.cu"),
        ),
        AnalysisEntry(
            "peak-prediction",
            "gpuclust.analyses.peak_prediction:PeakPrediction",
            "Peak-prediction overcommit simulator (Take it to the Limit; Google's "
            "cluster-resource-forecast semantics): per machine x 5 minutes limits, usage, the oracle peak and "
            "borg-default / N-sigma / per-instance and per-machine percentile / max / avg predictions; per "
            "predictor violation rate, severity and savings",
            kernels=("grouped_sum.cu",),
        ),
        AnalysisEntry(
            "usage-change",
            "gpuclust.analyses.usage_change:UsageChange",
            "Relative change of CPU and memory usage between consecutive 300 s periods of the "
            "cluster (default, seed 003 Figure 10) or of each machine, or between consecutive windows of "
            "one instance (by tier): exact shares within ±5/10/20/50%, binned distribution",
            kernels=("grouped_sum.cu",),
        ),
        AnalysisEntry(
            "usage-vs-request",
            "gpuclust.analyses.usage_vs_request:UsageVsRequest",
            "Usage / limit per window (average and maximum, CPU and memory), the limit "
            "joined as of the window's start, by tier; and per task (Borg Figure 11: CDFs over tasks)",
            kernels=("grouped_sum.cu",),
        ),
        AnalysisEntry(
            "usage-distribution",
            "gpuclust.analyses.usage_distribution:UsageDistribution",
            "Exact CPU usage distributions (mixtures of per-window percentile CDFs) per group: mean and quantiles",
            kernels=("grouped_sum.cu", "mixture.cu"),
        ),
    )
}


def names() -> list[str]:
    """Registered analysis names, sorted."""
    return sorted(REGISTRY)


def entry(name: str) -> AnalysisEntry:
    """The registry entry of ``name``, with a clear error listing the names."""
    try:
        return REGISTRY[name]
    except KeyError:
        raise ValueError(f"unknown analysis {name!r}; choose from {names()}") from None


def create(name: str, **options: Any) -> Analysis:
    """Instantiate a registered analysis; options it does not declare are ignored if ``None``.

    Examples
    --------
    >>> create("cell-usage", mode="exact").mode
    'exact'
    """
    e = entry(name)
    known = {o.name for o in e.options}
    kw = {}
    for k, v in options.items():
        if k in known:
            if v is not None:
                kw[k] = v
        elif v is not None:
            raise ValueError(f"analysis {name!r} has no option {k!r} (options: {sorted(known)})")
    return e.cls(**kw)


def options_text(indent: str = "  ") -> str:
    """Every analysis with its options, one per line (for ``gpuclust analyze --help``)."""
    lines = []
    for n in names():
        e = REGISTRY[n]
        lines.append(f"{n}: {e.summary}")
        lines += [f"{indent}-O {o.describe()}" for o in e.options] or [f"{indent}(no options)"]
    return "\n".join(lines)


def _reads(cls: type[Analysis]) -> str:
    uses = cls.table_uses
    return ", ".join(
        [*cls.requires, *(f"{t} ({uses[t]})" if t in uses else f"{t} (optional)" for t in cls.optional_tables)]
    )


def capability_table() -> str:
    """Markdown table: analysis x cpu / gpu / dask, with options, reads and GPU kernels."""
    rows = [
        "| analysis | cpu | gpu | dask | options | reads | GPU kernels |",
        "|---|---|---|---|---|---|---|",
    ]
    for n in names():
        e = REGISTRY[n]
        opts = "; ".join(f"`{o.name}`: {o.kind} (default {o.default_str})" for o in e.options) or "-"
        rows.append(
            f"| `{n}` | {'yes' if 'cpu' in e.backends else 'no'} | {'yes' if 'gpu' in e.backends else 'no'} "
            f"| {'yes' if e.dask else 'no'} | {opts} | {_reads(e.cls)} "
            f"| {', '.join(f'`{k}`' for k in e.kernels) or 'CuPy only'} |"
        )
    return "\n".join(rows) + "\n"
