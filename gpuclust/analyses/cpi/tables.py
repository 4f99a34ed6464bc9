"""The ``cpi`` analysis' result tables from its merged partial (host arrays, but for the Spearman
grid, reduced where it is: :func:`grid_spearman`): ``groups`` (CPI/MAI moments,
Pearson and Spearman per group), ``regression`` (the fits and the Borg effects), ``binned``,
``filter`` and ``info``; and its summary text."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

import numpy as np

from gpuclust._lazy import pandas as pd
from gpuclust.analyses.base import fmt, to_host
from gpuclust.analyses.cpi.binning import spearman_from_grid
from gpuclust.analyses.cpi.context import _BIN_BITS, _BY_COLUMN, COUNTERS, K_BINS, UTIL_BIN, UTIL_BINS, CpiContext
from gpuclust.analyses.cpi.correlation import cpi_mai_summary, spearman_exact
from gpuclust.analyses.cpi.keyed import _moments_of
from gpuclust.analyses.cpi.regression import borg_effects, wls_from_moments
from gpuclust.backends import finalize_backend
from gpuclust.backends.moments_cpu import regroup_moments
from gpuclust.keys import unpack_bits
from gpuclust.partials import Moments

if TYPE_CHECKING:
    from gpuclust.analyses.cpi import Cpi

__all__ = [
    "binned_table",
    "fit_rows",
    "grid_spearman",
    "group_labels",
    "groups_table",
    "regression_table",
    "result_tables",
    "summary_text",
]


def group_labels(a: Cpi, key: np.ndarray, ctx: CpiContext) -> pd.Series:
    if a.by in ("machine", "collection"):
        return pd.Series(key.astype(np.int64), dtype=np.int64)
    if a.by == "platform":
        names = np.array([*ctx.platforms, None], dtype=object)
    elif a.by == "tier":
        names = np.array(ctx.tier_names, dtype=object)
    else:
        names = np.array(["cell"], dtype=object)
    return pd.Series(names[key] if key.size else np.array([], dtype=object), dtype=object)


def groups_table(a: Cpi, p: dict[str, np.ndarray], ctx: CpiContext) -> pd.DataFrame:
    key = np.asarray(p["g_key"], dtype=np.int64)
    m = _moments_of(p, "g_")
    s = cpi_mai_summary(m)
    G = key.shape[0]
    df = pd.DataFrame({_BY_COLUMN[a.by]: group_labels(a, key, ctx)})
    for c in ("n", "cpu_seconds", "cpi_mean", "cpi_std", "mai_mean", "mai_std", "pearson_r"):
        df[c] = s[c]
    if a.spearman == "grid":
        rho, bound = p["g_rho"], p["g_bound"]  # from the grid, where it was (grid_spearman)
    elif a.spearman == "exact":
        grp = np.searchsorted(key, p["s_key"]) if G else np.zeros(0, np.int64)
        rho, _ = spearman_exact(p["s_x"], p["s_y"], grp, G, w=p["s_w"])
        bound = np.where(np.isnan(rho), np.nan, 0.0)
    else:
        rho = bound = np.full(G, np.nan)
    df["spearman_rho"] = np.asarray(rho, dtype=np.float64)
    df["spearman_bound"] = np.asarray(bound, dtype=np.float64)
    df["spearman_method"] = pd.Series([a.spearman] * G, dtype=object)
    return df


def fit_rows(fit_name: str, plat: list[Any], m: Moments, extra_groups: int = 0) -> list[dict[str, Any]]:
    fit = wls_from_moments(m, 0, [1, 2])
    if extra_groups:
        # platform intercepts: P - 1 more parameters than the pooled design
        dof = fit.dof - extra_groups
        with np.errstate(invalid="ignore", divide="ignore"):
            f = np.where(dof > 0, fit.dof / np.where(dof > 0, dof, 1.0), np.nan)
            adj = 1.0 - (1.0 - fit.r2) * (fit.n - 1.0 - extra_groups) / np.where(dof > 0, dof, np.nan)
        fit = dataclasses.replace(
            fit,
            dof=dof,
            sigma2=fit.sigma2 * f,
            cov=fit.cov * f[:, None, None],
            se=fit.se * np.sqrt(f)[:, None],
            adj_r2=adj,
        )
    eff = {ref: borg_effects(fit, util=0, tasks=1, reference=ref) for ref in ("mean", "intercept")}
    rows = []
    for g in range(fit.coef.shape[0]):
        row = {
            "fit": fit_name,
            "platform_id": plat[g],
            "primary": False,
            "y": "cpi / platform mean cpi" if fit_name == "platform-fixed-effects" else "cpi",
            "n": int(fit.n[g]),
            "cpu_seconds": float(fit.W[g]),
            "intercept": fit.coef[g, 0],
            "intercept_se": fit.se[g, 0],
            "b_util": fit.coef[g, 1],
            "b_util_se": fit.se[g, 1],
            "b_ntasks": fit.coef[g, 2],
            "b_ntasks_se": fit.se[g, 2],
            "r2": fit.r2[g],
            "adj_r2": fit.adj_r2[g],
            "dof": float(fit.dof[g]),
            "cpi_mean": fit.y_mean[g],
            "util_mean": fit.x_mean[g, 0],
            "ntasks_mean": fit.x_mean[g, 1],
        }
        for ref, e in eff.items():
            row[f"pct_per_task_vs_{ref}"] = e["pct_per_task"][g]
            row[f"pct_per_task_vs_{ref}_se"] = e["pct_per_task_se"][g]
            row[f"pct_per_10pct_util_vs_{ref}"] = e["pct_per_util_step"][g]
            row[f"pct_per_10pct_util_vs_{ref}_se"] = e["pct_per_util_step_se"][g]
        rows.append(row)
    return rows


def regression_table(a: Cpi, p: dict[str, np.ndarray], ctx: CpiContext) -> pd.DataFrame:
    key = np.asarray(p["r_key"], dtype=np.int64)
    names = [*ctx.platforms, None]
    per = _moments_of(p, "r_")
    rows: list[dict[str, Any]] = []
    if key.shape[0]:
        pooled = regroup_moments(per, np.zeros(key.shape[0], np.int64), 1)
        rows += fit_rows("pooled", [None], pooled)
        # fixed effects (multiplicative): CPI / its platform's weighted mean, within co-moments pooled
        W = per.W
        ym = per.mean[:, 0]
        s = np.where(ym > 0, 1.0 / np.where(ym > 0, ym, 1.0), np.nan)
        mean = per.mean.copy()
        mean[:, 0] = 1.0
        C = per.C.copy()
        C[:, 0, :] *= s[:, None]
        C[:, :, 0] *= s[:, None]
        ok = np.isfinite(s) & (W > 0)
        if ok.any():
            Wt = W[ok].sum()
            fe = Moments(
                np.array([per.n[ok].sum()], np.int64),
                np.array([Wt]),
                ((W[ok, None] * mean[ok]).sum(axis=0) / Wt)[None, :],
                C[ok].sum(axis=0)[None],
            )
            rows += fit_rows("platform-fixed-effects", [None], fe, extra_groups=int(ok.sum()) - 1)
        rows += fit_rows("per-platform", [names[k] for k in key], per)
    df = pd.DataFrame(rows, columns=_REGRESSION_COLUMNS)
    if len(df):
        df["primary"] = df["fit"] == a.regression
    df["primary"] = df["primary"].astype(bool)
    df["n"] = df["n"].astype(np.int64)
    for c in _REGRESSION_COLUMNS:
        if c not in ("fit", "platform_id", "primary", "y", "n"):
            df[c] = df[c].astype(np.float64)
    for c in ("fit", "platform_id", "y"):
        df[c] = df[c].astype(object)
    return df


def binned_table(p: dict[str, np.ndarray], ctx: CpiContext) -> pd.DataFrame:
    key = np.asarray(p["b_key"], dtype=np.int64)
    pv, b = unpack_bits(key, _BIN_BITS)
    var = np.where(pv % 2 == 0, "util", "k").astype(object)
    names = np.array([*ctx.platforms, None], dtype=object)
    is_u = pv % 2 == 0
    lo = np.where(is_u, b * UTIL_BIN, b).astype(np.float64)
    hi = np.where(
        is_u, np.where(b == UTIL_BINS - 1, np.inf, (b + 1) * UTIL_BIN), np.where(b == K_BINS - 1, np.inf, b + 1)
    ).astype(np.float64)
    W = np.asarray(p["b_cpu_seconds"], dtype=np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):
        cm = np.where(W > 0, np.asarray(p["b_wcpi"]) / np.where(W > 0, W, 1.0), np.nan)
    df = pd.DataFrame(
        {
            "variable": pd.Series(var, dtype=object),
            "platform_id": pd.Series(names[pv // 2] if key.size else np.array([], dtype=object), dtype=object),
            "bin_lo": lo,
            "bin_hi": hi,
            "n": np.asarray(p["b_n"], dtype=np.int64),
            "cpu_seconds": W,
            "cpi_mean": cm,
        }
    )
    return df


def grid_spearman(partial: dict[str, Any]) -> dict[str, Any]:
    """``partial`` with the Spearman ``(rho, bound)`` of its grid per group (``g_rho``, ``g_bound``:
    host arrays) in place of ``g_grid``, computed where the grid is: a grid left on the device (a
    gpu run's partial, ``stays`` of :attr:`gpuclust.analyses.cpi.Cpi.kinds`) is reduced there, on the backend
    :func:`~gpuclust.backends.finalize_backend` gives (on the host under ``finalizing_on_host``),
    so that two values per group leave it instead of its ``bins x bins``; a host grid on the host."""
    out = {k: v for k, v in partial.items() if k != "g_grid"}
    grid = partial["g_grid"]
    if int(grid.shape[0]) == 0:
        out["g_rho"], out["g_bound"] = np.zeros(0), np.zeros(0)
        return out
    be = finalize_backend("cpu" if isinstance(grid, np.ndarray) else partial["backend"])
    rho, bound = spearman_from_grid(be.asarray(grid), be.xp)
    out["g_rho"], out["g_bound"] = be.to_host(rho), be.to_host(bound)
    return out


def result_tables(a: Cpi, partial: dict[str, Any], ctx: CpiContext) -> dict[str, pd.DataFrame]:
    """The result tables of a merged partial, whose per-group fields (``g_*``) may be on the device
    (the grid reduced there, :func:`grid_spearman`; the others copied out)."""
    if a.spearman == "grid":
        partial = grid_spearman(partial)
    p = {k: np.asarray(to_host(v)) for k, v in partial.items() if k not in ("backend", "g_grid")}  # grid: reduced above
    counts = dict(zip(COUNTERS, (int(x) for x in p["counts"]), strict=True))
    groups = groups_table(a, p, ctx)
    regression = regression_table(a, p, ctx)
    binned = binned_table(p, ctx)
    reasons = [("filter", r) for r in ("missing", "cpu_seconds", "cpi_range", "mai_range")] + [("filter", "kept")]
    if a.regression != "none":
        reasons += [
            ("regression", "no_capacity"),
            ("regression", "no_machine_cell"),
            ("regression", "unknown_util"),
            ("regression", "regression_used"),
        ]
    flt = pd.DataFrame(
        {
            "stage": pd.Series([s for s, _ in reasons], dtype=object),
            "reason": pd.Series([r for _, r in reasons], dtype=object),
            "windows": np.array([counts[r] for _, r in reasons], dtype=np.int64),
        }
    )
    flt["fraction"] = flt["windows"] / counts["total"] if counts["total"] else np.nan
    if counts["total"] == 0:
        flt = flt.iloc[0:0].reset_index(drop=True)
    f = ctx.filter
    info = pd.DataFrame(
        [
            {
                "analysis": a.name,
                "by": a.by,
                "regression": a.regression,
                "spearman": a.spearman,
                "spearman_bins": a.spearman_bins if a.spearman == "grid" else 0,
                "cpi_bins": int(ctx.cpi_cuts.shape[0] + 1) if a.spearman == "grid" else 0,
                "mai_bins": int(ctx.mai_cuts.shape[0] + 1) if a.spearman == "grid" else 0,
                "cpi_min": f.cpi_min,
                "cpi_max": f.cpi_max,
                "mai_min": f.mai_min,
                "mai_max": f.mai_max,
                "min_cpu_seconds": f.min_cpu_seconds,
                "tier_map": ctx.tier_map.name if ctx.tier_map else None,
                "platforms": ",".join(ctx.platforms),
                "trace_window_start_us": ctx.trace_window_us[0] if ctx.trace_window_us else None,
                "trace_window_end_us": ctx.trace_window_us[1] if ctx.trace_window_us else None,
                **ctx.info,
                "machine_cells": int(p["stats"][1]),
                "machine_cells_unknown_util": int(p["stats"][2]),
                "bad_cell_rows": int(p["stats"][0]),
                **{f"windows_{k}": v for k, v in counts.items()},
            }
        ]
    )
    return {"groups": groups, "regression": regression, "binned": binned, "filter": flt, "info": info}


def summary_text(a: Cpi, result: dict[str, pd.DataFrame]) -> str:
    info = result["info"].iloc[0]
    lines = [
        f"{a.label}: {info['windows_kept']} of {info['windows_total']} windows pass the CPI/MAI filter "
        f"(missing {info['windows_missing']}, low CPU time {info['windows_cpu_seconds']}, "
        f"CPI range {info['windows_cpi_range']}, MAI range {info['windows_mai_range']}); "
        + (
            "regression not computed (regression='none'): no regression or binned rows"
            if a.regression == "none"
            else f"regression uses {info['windows_regression_used']} (no capacity {info['windows_no_capacity']}, "
            f"no machine-cell {info['windows_no_machine_cell']}, unknown util {info['windows_unknown_util']})"
        )
    ]
    g = result["groups"]
    if len(g):
        col = g.columns[0]
        shown = min(len(g), _SUMMARY_GROUPS)
        lines.append(
            f"  {len(g)} group(s) by {a.by}" + (f", the {shown} with the most CPU time:" if shown < len(g) else ":")
        )
        for _, r in g.sort_values("cpu_seconds", ascending=False).head(shown).iterrows():
            lines.append(
                f"    {str(r[col])[:22]:>22}: n={r['n']} CPI {fmt(r['cpi_mean'], '.3f')} "
                f"(sd {fmt(r['cpi_std'], '.3f')}) MAI {fmt(r['mai_mean'])} r={fmt(r['pearson_r'], '.3f')} "
                f"rho={fmt(r['spearman_rho'], '.3f')} [{r['spearman_method']}]"
            )
        if shown < len(g):
            lines.append(f"    ... {len(g) - shown} more (every group is in the groups table)")
    reg = result["regression"]
    for _, r in reg.iterrows():
        tag = r["fit"] + ("" if pd.isna(r["platform_id"]) else f"[{str(r['platform_id'])[:12]}]")
        star = "*" if r["primary"] else " "
        lines.append(
            f"  {star}{tag:>36}: {fmt(r['pct_per_task_vs_intercept'], '+.3f', unit='%')} CPI per extra"
            f" task (±{fmt(r['pct_per_task_vs_intercept_se'], '.3f')}), "
            f"{fmt(r['pct_per_10pct_util_vs_intercept'], '+.2f', unit='%')} "
            f"per +10% util (±{fmt(r['pct_per_10pct_util_vs_intercept_se'], '.2f')}) vs intercept; "
            f"vs mean {fmt(r['pct_per_task_vs_mean'], '+.3f', unit='%')} / "
            f"{fmt(r['pct_per_10pct_util_vs_mean'], '+.2f', unit='%')}; "
            f"R²={fmt(r['r2'], '.3f')} n={r['n']}"
        )
    if len(reg):
        lines.append(f"  (* = primary fit: regression={a.regression!r})")
    return "\n".join(lines)


#: Groups the summary lists (those with the most CPU time; the rest are counted).
_SUMMARY_GROUPS = 8

_REGRESSION_COLUMNS = [
    "fit",
    "platform_id",
    "primary",
    "y",
    "n",
    "cpu_seconds",
    "intercept",
    "intercept_se",
    "b_util",
    "b_util_se",
    "b_ntasks",
    "b_ntasks_se",
    "r2",
    "adj_r2",
    "dof",
    "cpi_mean",
    "util_mean",
    "ntasks_mean",
    "pct_per_task_vs_mean",
    "pct_per_task_vs_mean_se",
    "pct_per_10pct_util_vs_mean",
    "pct_per_10pct_util_vs_mean_se",
    "pct_per_task_vs_intercept",
    "pct_per_task_vs_intercept_se",
    "pct_per_10pct_util_vs_intercept",
    "pct_per_10pct_util_vs_intercept_se",
]
