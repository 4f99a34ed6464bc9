"""Plots of analysis results, drawn by :mod:`gpuclust.report.draw` and written atomically.

Only :func:`plot_result` is needed by callers: it dispatches on the analysis name and returns
``False`` when there is nothing useful to draw.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

__all__ = ["NATIVE", "PLOTS", "plot_result"]


#: analysis -> (module under ``gpuclust.report``, its plot function ``(result, path, *, title)``):
#: the one list of which analysis draws which figure (modules imported only when drawn).
PLOTS: dict[str, tuple[str, str]] = {
    "cell-usage": ("cell_usage_plots", "plot_cell_usage"),
    "collection-lifecycle": ("lifecycle_plots", "plot_lifecycle"),
    "cpi": ("cpi_plots", "plot_cpi"),
    "data-quality": ("data_quality_plots", "plot_data_quality"),
    "job-usage": ("job_usage_plots", "plot_job_usage"),
    "lifecycle": ("lifecycle_plots", "plot_lifecycle"),
    "machine-shapes": ("machine_shapes_plots", "plot_machine_shapes"),
    "machine-utilization": ("machine_utilization_plots", "plot_machine_utilization"),
    "overcommit": ("overcommit_plots", "plot_overcommit"),
    "peak-prediction": ("peak_prediction_plots", "plot_peak_prediction"),
    "usage-change": ("usage_change_plots", "plot_usage_change"),
    "usage-distribution": ("distribution_plots", "plot_usage_distribution"),
    "usage-vs-request": ("usage_vs_request_plots", "plot_usage_vs_request"),
}


#: The analyses whose plot is drawn by :mod:`gpuclust.report.draw` (no matplotlib, no pandas): every
#: one.  A plot takes its result tables as Arrow tables or DataFrames, as the run returns them.
NATIVE = frozenset(PLOTS)


def plot_result(name: str, result: dict[str, Any], path: Path, *, title: str | None = None) -> bool:
    """Plot a finalized result of analysis ``name`` to ``path``; ``False`` if it has no plot."""
    import importlib

    entry = PLOTS.get(name)
    if entry is None:
        return False
    module, function = entry
    plot = getattr(importlib.import_module(f"gpuclust.report.{module}"), function)
    return bool(plot(result, path, title=title or name))
