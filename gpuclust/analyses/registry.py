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
from gpuclust.analyses.machine_shapes import MachineShapes
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
            kernels=("grouped_sum", "bucket_overlap"),
            tables=("instance_usage", "instance_events", "machine_events"),
        ),
        AnalysisEntry(
            MachineShapes,
            "Machines per capacity shape (cap_cpu, cap_mem), as in Google's notebook",
            (),
            kernels=(),
            tables=("machine_events",),
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
