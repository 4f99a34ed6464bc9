"""``usage-distribution``'s tables (:mod:`gpuclust.analyses.usage_distribution`): the ``quantiles``
and ``naive`` rows of finalized groups (keys decoded from their components, sorted by key), the
text summary and its heaviest groups, and the union of two host group tables.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from gpuclust._lazy import pandas as pd
from gpuclust.analyses.base import fmt
from gpuclust.analyses.grouping import KEY_COLUMNS
from gpuclust.backends import backend_of
from gpuclust.parted import frames
from gpuclust.schema import CPU_PERCENTILE_LEVELS_SORTED

if TYPE_CHECKING:
    from gpuclust.analyses._usage_distribution_context import UsageDistributionContext

_STD_LEVELS = np.asarray(CPU_PERCENTILE_LEVELS_SORTED, dtype=np.float64)


def level_name(level: float) -> str:
    """Quantile column name of a level: ``q0``, ``q50``, ``q99``, ``q100``, ``q0.5``, ``q99.9``."""
    return "q" + f"{float(level) * 100:.10g}"


def _group_tables(
    by: tuple[str, ...],
    bucket_us: int,
    n_components: int,
    res: dict[str, Any],
    g: dict[str, Any],
    ctx: UsageDistributionContext,
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The ``quantiles`` and ``naive`` rows of groups ``res`` / ``g`` (aligned), sorted by key."""
    G = int(np.asarray(res["n_windows"]).shape[0])
    keys = _decode_keys(by, bucket_us, np.asarray(g["kc"]).reshape(G, n_components), ctx)
    lv = ctx.levels
    qcols = [level_name(x) for x in lv]
    df = keys.copy()
    df["n_windows"] = np.asarray(res["n_windows"], dtype=np.int64)
    if "time" in by:
        df["n_windows_frac"] = np.asarray(g["frac"], dtype=np.float64)
    df["weight"] = np.asarray(res["weight"], dtype=np.float64)
    df["mean"] = np.asarray(res["mean"], dtype=np.float64)
    df["cdf_error_bound"] = np.asarray(res["err_bound"], dtype=np.float64)
    quant = np.asarray(res["quantiles"], dtype=np.float64).reshape(G, lv.shape[0])
    qdf = pd.DataFrame(quant, columns=qcols)
    df = pd.concat([df.reset_index(drop=True), qdf], axis=1)
    W = df["weight"].to_numpy()
    with np.errstate(invalid="ignore", divide="ignore"):
        navg = np.asarray(g["wq"], dtype=np.float64).reshape(G, 20) / np.where(W > 0, W, np.nan)[:, None]
    naive = pd.concat(
        [keys.reset_index(drop=True), df[["weight"]], pd.DataFrame(navg, columns=[level_name(x) for x in _STD_LEVELS])],
        axis=1,
    )
    sort_cols = [c for c in _sort_columns(by) if c in df.columns]
    if sort_cols and G:
        order = np.lexsort([df[c].to_numpy() for c in reversed(sort_cols)])
        df, naive = df.iloc[order], naive.iloc[order]
    df = df.drop(columns=[c for c in df.columns if c.startswith("_")]).reset_index(drop=True)
    naive = naive.drop(columns=[c for c in naive.columns if c.startswith("_")]).reset_index(drop=True)
    return df, naive


def _sort_columns(by: tuple[str, ...]) -> list[str]:
    out: list[str] = []
    for b in by:
        out.extend({"tier": ("_tier_code",), "cell": (), "time": ("bucket",)}.get(b, KEY_COLUMNS[b]))
    return out


def _decode_keys(by: tuple[str, ...], bucket_us: int, kc: np.ndarray, ctx: UsageDistributionContext) -> pd.DataFrame:
    cols: dict[str, Any] = {}
    j = 0
    G = kc.shape[0]
    for b in by:
        if b == "instance":
            cols["collection_id"] = kc[:, j].astype(np.int64)
            cols["instance_index"] = kc[:, j + 1].astype(np.int32)
            j += 2
        elif b in ("collection", "machine"):
            cols[KEY_COLUMNS[b][0]] = kc[:, j].astype(np.int64)
            j += 1
        elif b == "tier":
            names = np.array(ctx.tier_names, dtype=object)
            code = kc[:, j].astype(np.int64)
            cols["tier"] = pd.Series(names[code] if G else np.array([], dtype=object), dtype=object)
            cols["_tier_code"] = code
            j += 1
        elif b == "cell":
            cols["cell"] = pd.Series([ctx.cell] * G, dtype=object)
        elif b == "time":
            cols["bucket"] = kc[:, j].astype(np.int64)
            cols["bucket_start_us"] = kc[:, j].astype(np.int64) * np.int64(bucket_us)
            j += 1
    return pd.DataFrame(
        {k: (v.to_numpy() if isinstance(v, pd.Series) else v) for k, v in cols.items()}, index=pd.RangeIndex(G)
    )


def _summary_text(label: str, key_columns: list[str], result: dict[str, pd.DataFrame], top: int) -> str:
    """The text summary of a usage-distribution result (:meth:`UsageDistribution.summary`)."""
    info = result["info"].iloc[0]
    lines = [
        f"{label}: by {info['by']}, rows {info['rows']}, strategy {info['strategy']}"
        + (
            f" (K={info['k']}, max CDF error bound {info['max_cdf_error_bound']:.3g})"
            if info["strategy"] == "bounded"
            else " (exact)"
        )
        + (f", tier map {info['tier_map']!r}" if info["tier_map"] else ""),
        f"  windows read={info['windows_read']} used={info['used_windows']} "
        f"alloc-task (filtered)={info['alloc_task_windows']} no-percentiles (skipped)="
        f"{info['skipped_no_percentiles']} repaired={info['repaired']} bad-time={info['bad_time_windows']} "
        f"zero-weight={info['zero_weight_windows']}; {info['groups']} groups",
    ]
    heavy, _ = heaviest_groups(result, top)
    if len(heavy):
        keycols = [c for c in key_columns if c in heavy.columns and c != "bucket_start_us"]
        show = [c for c in ("q50", "q90", "q99", "q100") if c in heavy.columns]
        lines.append(
            f"  heaviest {len(heavy)} groups (CPU, normalised cores): "
            + ", ".join(["mean", *show])
            + ("" if info["strategy"] != "bounded" else ", bound")
        )
        for j in range(len(heavy)):
            k = " ".join(f"{c}={heavy[c].iloc[j]}" for c in keycols)
            v = " ".join(fmt(heavy[c].iloc[j]) for c in ("mean", *show))
            b = "" if info["strategy"] != "bounded" else f" ±{fmt(heavy['cdf_error_bound'].iloc[j], '.2g')}"
            lines.append(f"  {k}: weight={heavy['weight'].iloc[j]:.4g} {v}{b}")
    return "\n".join(lines)


def heaviest_groups(result: dict[str, Any], top: int) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The ``top`` heaviest groups' rows of the ``quantiles`` and ``naive`` tables (DataFrames or
    parted tables, streamed a batch at a time), heaviest first, ties in table order."""
    qs, ns = [], []
    for q, n in zip(frames(result["quantiles"]), frames(result["naive"]), strict=True):
        pick = np.argsort(-q["weight"].to_numpy(), kind="stable")[:top]
        qs.append(q.iloc[pick])
        ns.append(n.iloc[pick])
    if not qs:
        return pd.DataFrame(), pd.DataFrame()
    q, n = pd.concat(qs, ignore_index=True), pd.concat(ns, ignore_index=True)
    pick = np.argsort(-q["weight"].to_numpy(), kind="stable")[:top]
    return q.iloc[pick].reset_index(drop=True), n.iloc[pick].reset_index(drop=True)


def _merge_groups(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    """Union of two group tables (host or device arrays, both sides on one): fractional counts and
    ``w x q`` sums add; key components must agree for equal keys (else a hash collision: raise)."""
    if a["key"].shape[0] == 0:
        return {k: v.copy() for k, v in b.items()}
    if b["key"].shape[0] == 0:
        return {k: v.copy() for k, v in a.items()}
    xp = backend_of(a["key"]).xp
    key = xp.concatenate([a["key"], b["key"]])
    kc = xp.concatenate([a["kc"], b["kc"]])
    order = xp.argsort(key, kind="stable")
    ks = key[order]
    first = xp.ones(ks.shape[0], dtype=bool)
    first[1:] = ks[1:] != ks[:-1]
    inv = xp.cumsum(first) - 1
    kcs = kc[order]
    kc_u = kcs[first]
    if kc.shape[1] and bool((kcs != kc_u[inv]).any()):
        raise RuntimeError("usage-distribution: 64-bit hash collision between group keys (please report)")
    G = kc_u.shape[0]
    # each side's keys are distinct: its rows add by one fancy-indexed add each, a's first (the
    # additions of ``np.add.at`` over the stably sorted concatenation, without its per-element loop)
    row = xp.empty_like(inv)
    row[order] = inv
    na = a["key"].shape[0]
    out = {"key": ks[first], "frac": xp.zeros(G), "wq": xp.zeros((G, 20)), "kc": kc_u}
    for f in ("frac", "wq"):
        out[f][row[:na]] += a[f]
        out[f][row[na:]] += b[f]
    return out


def info_table(a: Any, ctx: UsageDistributionContext, stats: dict[str, int], extras: list[Any]) -> pd.DataFrame:
    """The one-row ``info`` table of analysis ``a`` (its options), its context ``ctx``, its global
    counters ``stats`` and the shards' extras ``(groups, max CDF error bound)``."""
    two = ctx.strategy == "exact-two-pass"
    return pd.DataFrame(
        [
            {
                "analysis": a.name,
                "by": ",".join(a.by),
                "rows": ctx.rows,
                "rows_option": a.rows,
                "strategy": ctx.strategy,
                "strategy_option": a.strategy,
                "k": {"bounded": int(a.k), "exact-two-pass": int(ctx.bracket_k)}.get(ctx.strategy, 0),
                "refine": int(ctx.refine) if two else 0,
                "slices": int(ctx.slices) if two else 1,
                "exact_max_windows": int(ctx.row_limit),
                "total_rows": int(ctx.total_rows),
                "bucket_s": float(a.bucket_s) if "time" in a.by else float("nan"),
                "tier_map": ctx.tier_map.name if ctx.tier_map else "",
                "levels": ",".join(f"{x:g}" for x in ctx.levels),
                **stats,
                "groups": int(sum(n for n, _ in extras)),
                "max_cdf_error_bound": max([e for _, e in extras], default=0.0),
            }
        ]
    )
