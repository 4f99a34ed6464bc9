"""Plots of analysis results (matplotlib, Agg backend, written atomically).

Only :func:`plot_result` is needed by callers: it dispatches on the analysis name and returns
``False`` when there is nothing useful to draw.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

__all__ = ["new_figure", "plot_cell_usage", "plot_machine_shapes", "plot_result", "save_figure_atomic"]


def new_figure():  # type: ignore[no-untyped-def]
    import matplotlib

    matplotlib.use("Agg", force=False)
    from matplotlib.figure import Figure

    return Figure(figsize=(10, 4.5), dpi=100, layout="constrained")


def save_figure_atomic(fig, path: Path) -> None:  # type: ignore[no-untyped-def]
    from gpuclust.report._files import write_atomic

    if Path(path).suffix == ".svg":  # the HTML report's figures (text as text, axes geometry for hover)
        from gpuclust.report.svg import save_svg

        return save_svg(fig, path)
    write_atomic(Path(path), lambda tmp: fig.savefig(tmp, format="png"))


def plot_cell_usage(result: dict[str, pd.DataFrame], path: Path, *, title: str = "cell-usage") -> bool:
    """Usage by tier over time against capacity (see :mod:`gpuclust.report.cell_usage_plots`)."""
    from gpuclust.report.cell_usage_plots import plot_cell_usage as plot

    return plot(result, path, title=title)


def plot_machine_shapes(result: dict[str, pd.DataFrame], path: Path, *, top: int = 20,
                        title: str = "machine-shapes") -> bool:
    """Machines per capacity shape (see :mod:`gpuclust.report.machine_shapes_plots`)."""
    from gpuclust.report.machine_shapes_plots import plot_machine_shapes as plot

    return plot(result, path, top=top, title=title)


def plot_result(name: str, result: dict[str, pd.DataFrame], path: Path, *, title: str | None = None) -> bool:
    """Plot a finalized result of analysis ``name`` to ``path``; ``False`` if it has no plot."""
    if name == "cell-usage":
        return plot_cell_usage(result, path, title=title or name)
    if name == "machine-shapes":
        return plot_machine_shapes(result, path, title=title or name)
    if name == "overcommit":
        from gpuclust.report.overcommit_plots import plot_overcommit

        return plot_overcommit(result, path, title=title or name)
    if name == "cpi":
        from gpuclust.report.cpi_plots import plot_cpi

        return plot_cpi(result, path, title=title or name)
    if name == "data-quality":
        from gpuclust.report.data_quality_plots import plot_data_quality

        return plot_data_quality(result, path, title=title or name)
    if name == "job-usage":
        from gpuclust.report.job_usage_plots import plot_job_usage

        return plot_job_usage(result, path, title=title or name)
    if name in ("lifecycle", "collection-lifecycle"):
        from gpuclust.report.lifecycle_plots import plot_lifecycle

        return plot_lifecycle(result, path, title=title or name)
    if name == "machine-utilization":
        from gpuclust.report.machine_utilization_plots import plot_machine_utilization

        return plot_machine_utilization(result, path, title=title or name)
    if name == "peak-prediction":
        from gpuclust.report.peak_prediction_plots import plot_peak_prediction

        return plot_peak_prediction(result, path, title=title or name)
    if name == "usage-change":
        from gpuclust.report.usage_change_plots import plot_usage_change

        return plot_usage_change(result, path, title=title or name)
    if name == "usage-vs-request":
        from gpuclust.report.usage_vs_request_plots import plot_usage_vs_request

        return plot_usage_vs_request(result, path, title=title or name)
    if name == "usage-distribution":
        from gpuclust.report.distribution_plots import plot_usage_distribution

        return plot_usage_distribution(result, path, title=title or name)
    return False
