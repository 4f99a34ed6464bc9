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

    write_atomic(Path(path), lambda tmp: fig.savefig(tmp, format="png"))


def plot_cell_usage(result: dict[str, pd.DataFrame], path: Path, *, title: str = "cell-usage") -> bool:
    """Stacked area of normalised CPU usage by tier over hours (and memory below)."""
    u = result["usage"]
    if u.empty:
        return False
    tiers = list(dict.fromkeys(result["info"]["tiers"].iloc[0].split(",")))
    fig = new_figure()
    axes = fig.subplots(2, 1, sharex=True)
    for ax, col in zip(axes, ("cpu", "mem"), strict=False):
        # absent (tier, hour) = no usage = 0; a NaN value = unknown (all values NULL): a gap, never 0
        wide = u.set_index(["bucket_start_us", "tier"])[col].unstack("tier")
        unknown = u.assign(_u=u[col].isna()).set_index(["bucket_start_us", "tier"])["_u"].unstack("tier")
        wide = wide.fillna(0.0).mask(unknown.fillna(False).astype(bool))
        wide = wide.reindex(columns=[t for t in tiers if t in wide.columns])
        x = wide.index.to_numpy() / 3.6e9
        ax.stackplot(x, *[wide[t].to_numpy() for t in wide.columns], labels=list(wide.columns))
        n_unknown = int(u[col].isna().sum())
        if n_unknown:
            ax.text(0.01, 0.02, f"{n_unknown} (hour, tier) value(s) unknown (gaps)", transform=ax.transAxes,
                    fontsize="small")
        ax.set_ylabel(f"{col} / capacity")
    axes[0].legend(loc="upper right", fontsize="small")
    axes[0].set_title(title)
    axes[1].set_xlabel("bucket start (hours since trace time 0, i.e. 600 s before the trace start)")
    save_figure_atomic(fig, path)
    return True


def plot_machine_shapes(result: dict[str, pd.DataFrame], path: Path, *, top: int = 20) -> bool:
    """Bar chart of machine counts per (cap_cpu, cap_mem) shape (largest ``top`` shapes)."""
    df = result["shapes"].head(top)
    if df.empty:
        return False
    fig = new_figure()
    ax = fig.subplots()
    labels = [f"{c:.4g}/{m:.4g}" for c, m in zip(df["cap_cpu"], df["cap_mem"], strict=False)]
    ax.bar(range(len(df)), df["machines"].to_numpy())
    ax.set_xticks(range(len(df)), labels, rotation=60, ha="right", fontsize="small")
    ax.set_xlabel("capacity shape (cpu/mem, normalised units; nan = NULL)")
    ax.set_ylabel("machines")
    ax.set_title("machine-shapes")
    save_figure_atomic(fig, path)
    return True


def plot_result(name: str, result: dict[str, pd.DataFrame], path: Path, *, title: str | None = None) -> bool:
    """Plot a finalized result of analysis ``name`` to ``path``; ``False`` if it has no plot."""
    if name == "cell-usage":
        return plot_cell_usage(result, path, title=title or name)
    if name == "machine-shapes":
        return plot_machine_shapes(result, path)
    if name == "overcommit":
        from gpuclust.report.overcommit_plots import plot_overcommit

        return plot_overcommit(result, path, title=title or name)
    if name == "cpi":
        from gpuclust.report.cpi_plots import plot_cpi

        return plot_cpi(result, path, title=title or name)
    if name == "job-usage":
        from gpuclust.report.job_usage_plots import plot_job_usage

        return plot_job_usage(result, path, title=title or name)
    if name == "lifecycle":
        from gpuclust.report.lifecycle_plots import plot_lifecycle

        return plot_lifecycle(result, path, title=title or name)
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
