"""Borg's claims (Verma et al., EuroSys 2015): Figure 11's usage against the limit per task, from
``usage-vs-request``, and §5.2's CPI interference, from ``cpi`` (docs/user/claims.md)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from gpuclust.claims.model import DatasetFacts, Verdict, pct

__all__ = ["BORG", "BORG_CPI", "cpi_effect", "cpi_mean", "fig11_above", "fig11_median"]

BORG = "Verma et al., Large-scale cluster management at Google with Borg (EuroSys 2015, seed 004)"
#: Borg's Figure 11 is over 15 cells' tasks at one checkpoint (2014), not a trace; a cell of the
#: 2019 trace is the closest data, and a claim about its CDF's shape needs enough tasks
MIN_TASKS = 1000


def fig11_row(r: Mapping[str, Any], measure: str, band: str = "all") -> Any:
    t = r["usage-vs-request"]["task_summary"]
    row = t[(t["band"] == band) & (t["measure"] == measure)]
    return None if row.empty else row.iloc[0]


def fig11_support(f: DatasetFacts, row: Any) -> tuple[bool, str]:
    if not f.rows.get("instance_usage"):
        return False, "the dataset has no usage windows (instance_usage)"
    n = 0 if row is None else int(row["defined"])
    if n < MIN_TASKS:
        return False, f"{n:,} tasks with a limit and usage: too few for a CDF over tasks (at least {MIN_TASKS:,})"
    return True, ""


def fig11(measure: str, text: Any, column: str) -> Any:
    """A Figure 11 claim: ``column`` of the task_summary row of ``measure`` (band all), shown by
    ``text(value, row)``."""

    def compute(r: Mapping[str, Any], f: DatasetFacts) -> Verdict:
        row = fig11_row(r, measure)
        ok, why = fig11_support(f, row)
        if row is None or not int(row["defined"]):
            return Verdict(None, "no task with a limit and usage", "", False, why or "no task")
        v = float(row[column])
        return Verdict(
            v, text(v, row), f"{int(row['defined']):,} tasks (usage-vs-request task_summary, band all)", ok, why
        )

    return compute


def fig11_median(measure: str, what: str) -> Any:
    return fig11(
        measure,
        lambda v, row: (
            f"median {v:.2f} ({what}), over {int(row['defined']):,} tasks; p90 {float(row['p90_ratio']):.2f}"
        ),
        "p50_ratio",
    )


def fig11_above(measure: str) -> Any:
    return fig11(
        measure, lambda v, row: f"{pct(v)} of {int(row['defined']):,} tasks above their limit", "above_limit_share"
    )


#: Borg §5.2 is over ~12,000 prod tasks of shared cells over a week (5-minute samples, each
#: CPU-second counted equally); its CPI claims read ``cpi`` grouped by tier (the prod row) and its
#: interference regression, and rest on at least this many windows
BORG_CPI = (("cpi", {"by": "tier"}),)
MIN_CPI_WINDOWS = 10_000


def cpi_support(f: DatasetFacts, n: int, what: str) -> tuple[bool, str]:
    if not f.rows.get("instance_usage"):
        return False, "the dataset has no usage windows (instance_usage)"
    if n < MIN_CPI_WINDOWS:
        return False, f"{n:,} {what}: too few (at least {MIN_CPI_WINDOWS:,})"
    return True, ""


def cpi_effect(column: str, text: Any) -> Any:
    """A §5.2 regression claim: ``column`` of ``cpi``'s primary fit, shown by ``text(value)``."""

    def compute(r: Mapping[str, Any], f: DatasetFacts) -> Verdict:
        reg = r["cpi"]["regression"]
        fit = reg[reg["primary"].astype(bool)]
        row = fit.iloc[0] if len(fit) else None
        v = float("nan") if row is None else float(row[column])
        if row is None or not np.isfinite(v):
            return Verdict(None, "no fit", "", False, "no windows with CPI on machines of known load and capacity")
        n = int(row["n"])
        ok, why = cpi_support(f, n, "windows in the fit")
        rests = (
            f"{n:,} windows of every tier, each CPU-second counted equally ({row['fit']} fit of `cpi`; "
            "the paper: ~12,000 prod tasks over a week)"
        )
        return Verdict(v, text(v), rests, ok, why)

    return compute


def cpi_mean(r: Mapping[str, Any], f: DatasetFacts) -> Verdict:
    g = r["cpi"]["groups"]
    prod = g[g["tier"] == "prod"] if "tier" in g.columns else g.iloc[:0]
    if prod.empty:
        return Verdict(None, "no prod windows with CPI", "", False, "no window of tier prod passed the CPI filter")
    row = prod.iloc[0]
    ok, why = cpi_support(f, int(row["n"]), "prod windows with CPI")
    return Verdict(
        float(row["cpi_mean"]),
        f"{float(row['cpi_mean']):.2f} (σ {float(row['cpi_std']):.2f})",
        f"{int(row['n']):,} prod windows, {float(row['cpu_seconds']):,.0f} CPU-seconds, each counted equally",
        ok,
        why,
    )
