"""``overcommit``'s ``summary`` table and text: statistics over the *full* machine-buckets of the
machine table, from per-chunk sums (:func:`chunk_sums`, computed by the finalize where the chunk
is, or else read back from the table) and the exact ratio quantiles.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np
import pyarrow as pa

from gpuclust.analyses._kept import KeptValues, kept_quantiles
from gpuclust.analyses.base import fmt
from gpuclust.arrow_numpy import schema_table
from gpuclust.parted import array_batches
from gpuclust.tables import as_arrow

__all__ = ["OVER_EPS", "QUANTILES", "chunk_sums", "req_columns"]

#: A ratio counts as "over capacity" when it exceeds 1 by more than this (float rounding).
OVER_EPS = 1e-9
QUANTILES = (0.5, 0.9, 0.99, 1.0)


def _summary_text(label: str, result: dict[str, Any]) -> str:
    """The text summary of an overcommit result (:meth:`Overcommit.summary`)."""
    info = as_arrow(result["info"]).to_pylist()[0]
    values = {(r["metric"], r["resource"], r["tier"]): r["value"] for r in as_arrow(result["summary"]).to_pylist()}
    lines = [
        f"{label}: tier map {info['tier_map']!r}, {info['machines']} machines x {info['buckets']} "
        f"buckets of {info['bucket_s']} s, window [{info['window_start_us']}, {info['window_end_us']}) us",
        f"  instances {info['instances']}, running pieces {info['pieces']} (unplaced {info['pieces_unplaced']},"
        f" dedicated {info['pieces_dedicated']}, running at end {info['running_at_end']}, terminal without"
        f" SCHEDULE {info['terminal_without_schedule']}); usage rows used {info['usage_used']} of"
        f" {info['usage_rows']}",
    ]

    def get(metric: str, r: str, t: str = "all") -> float:
        v = values.get((metric, r, t))
        return float("nan") if v is None else float(v)

    for r in ("cpu", "mem"):
        if not any(k[1] == r for k in values):
            continue
        lines.append(
            f"  {r}: {int(get('machine_buckets', r))} full machine-buckets; requested/capacity mean "
            f"{fmt(get('alloc_ratio_mean', r), '.3f')}, p50 {fmt(get('alloc_ratio_p50', r), '.3f')}, "
            f"p99 {fmt(get('alloc_ratio_p99', r), '.3f')}, max {fmt(get('alloc_ratio_max', r), '.3f')}; "
            f"over capacity by request {fmt(get('share_over_capacity_request', r), '.2f', 100, '%')}"
            f" of machine-time, by usage {fmt(get('share_over_capacity_usage', r), '.2f', 100, '%')}; "
            f"usage/capacity mean {fmt(get('usage_ratio_mean', r), '.3f')}"
        )
    return "\n".join(lines)


#: The ``summary`` table's columns and types (an empty table keeps them).
_SUMMARY_SCHEMA = pa.schema(
    [("metric", pa.string()), ("resource", pa.string()), ("tier", pa.string()), ("value", pa.float64())]
)


def _full(up_s: Any, covered_s: Any, cap: Any) -> Any:
    """The *full* machine-buckets: up the whole bucket, known capacity > 0 (any array module)."""
    return (up_s >= covered_s * (1 - 1e-12)) & (cap > 0) & (cap < np.inf)  # (NaN compares false)


def req_columns(tiers: list[str]) -> dict[tuple[str, str], str]:
    """The request column of each (resource, tier): ``req_cpu`` for all tiers, ``req_cpu_<tier>``."""
    return {(r, t): f"req_{r}" if t == "all" else f"req_{r}_{t}" for r in ("cpu", "mem") for t in ("all", *tiers)}


#: per resource, the sums :func:`chunk_sums` keeps, in order
_KEYS = ("n", "tw", "tk_request", "over_request", "tk_usage", "over_usage", "tk_peak", "over_peak", "den", "num")


def chunk_sums(xp: Any, b: dict[str, Any], req_col: dict[tuple[str, str], str], has_usage: bool) -> Any:
    """Of a chunk ``b`` of the machine table (its columns, ``xp``'s arrays), one vector of the
    sums the summary adds up: the machine-seconds up; per resource the full machine-buckets,
    their seconds, the seconds with a known and an over-capacity request / usage / peak, and the
    capacity- and usage-seconds of known usage (0 without usage: ``has_usage``); per (resource,
    tier) of ``req_col`` the request- and capacity-seconds.  Computed where the chunk is (on a
    device: no copy out, one vector a chunk)."""
    f = {c: xp.asarray(v, dtype=xp.float64) for c, v in b.items()}
    zero = xp.zeros((), xp.float64)
    out = [f["up_s"].sum()]
    for r in ("cpu", "mem"):
        L, c_all = f["covered_s"], f[f"cap_{r}"]
        full = _full(f["up_s"], L, c_all)
        w, c = L[full], c_all[full]
        out += [full.sum().astype(xp.float64), w.sum()]
        for kind, col in (("request", f"req_{r}"), ("usage", f"use_{r}"), ("peak", f"max_{r}_sum")):
            if kind != "request" and not has_usage:  # the table's usage columns are NaN (unknown)
                out += [zero, zero]
                continue
            v = f[col][full]
            kn = xp.isfinite(v)  # usage statistics over the machine-buckets whose usage is known
            out += [w[kn].sum(), w[kn & (v > c * (1 + OVER_EPS))].sum()]
        if has_usage:
            u = f[f"use_{r}"][full]
            kn = xp.isfinite(u)
            out += [(c[kn] * w[kn]).sum(), (u[kn] * w[kn]).sum()]
        else:
            out += [zero, zero]
        for (rr, _), col in req_col.items():
            if rr == r:
                req = f[col][full]
                out += [(req * w).sum(), (c * w).sum()]
    return xp.stack([xp.asarray(x, dtype=xp.float64) for x in out])


def _add_sums(
    sums: Iterable[Any], req_col: dict[tuple[str, str], str]
) -> tuple[float, dict[str, Any], dict[Any, list[float]]]:
    """The :func:`chunk_sums` vectors added up in order (host arrays, one chunk after another)."""
    avail = 0.0
    z = {r: dict.fromkeys(_KEYS, 0.0) for r in ("cpu", "mem")}
    reqw = {k: [0.0, 0.0] for k in req_col}  # sum(req * w), sum(cap * w)
    for vec in sums:
        v = iter(np.asarray(vec).tolist())
        avail += next(v)
        for r in ("cpu", "mem"):
            a = z[r]
            a["n"] += int(next(v))
            for k in _KEYS[1:]:
                a[k] += next(v)
            for rr, t in req_col:
                if rr == r:
                    reqw[(r, t)][0] += next(v)
                    reqw[(r, t)][1] += next(v)
    return avail, z, reqw


def _summary(
    be: Any,
    machine: Any,
    tiers: list[str],
    has_usage: bool,
    ratios: KeptValues | None = None,
    sums: Iterable[Any] | None = None,
) -> pa.Table:
    """Statistics over *full* machine-buckets: available the whole bucket, known capacity > 0.
    Usage statistics are NaN when the dataset has no instance_usage rows (e.g. 2011 events only).

    ``machine`` is the machine table (a parted table, a DataFrame or an Arrow table), read a batch
    at a time without pandas (:func:`gpuclust.parted.array_batches`): the sums in one pass, and
    the exact ratio quantiles of every (resource, tier) together in a few more
    (:func:`gpuclust.stream_quantiles.stream_quantiles_many`), so nothing grows with the table.
    On a device backend ``be`` (the partials' backend) the quantiles take one sort a series of
    ``ratios``, the ratios the finalize kept on the device (:meth:`_CellSums.add_ratios`), or
    else of the ratios copied there (:func:`gpuclust.analyses._kept.kept_quantiles`).
    ``sums``: the finalize's :func:`chunk_sums` of the machine table's chunks, in table order
    (then the table is not read for them)."""
    series = [(r, t) for r in ("cpu", "mem") for t in ("all", *tiers)]
    req_col = req_columns(tiers)
    if sums is None:
        cols = sorted(
            {
                "covered_s",
                "up_s",
                *{c for r in ("cpu", "mem") for c in (f"cap_{r}", f"use_{r}", f"max_{r}_sum")},
                *req_col.values(),
            }
        )
        sums = (chunk_sums(np, b, req_col, True) for b in array_batches(machine, cols))
    avail, z, reqw = _add_sums(sums, req_col)
    # the ratios of the resources with full machine-buckets, every tier's in the same passes
    quantiled = [(r, t) for r, t in series if z[r]["n"] > 0]
    qrow = dict(zip(quantiled, _ratio_quantiles(be, machine, quantiled, req_col, ratios), strict=True))
    rows: list[dict[str, Any]] = []

    def add(metric: str, r: str, t: str, v: float) -> None:
        rows.append({"metric": metric, "resource": r, "tier": t, "value": float(v)})

    for r in ("cpu", "mem"):
        a = z[r]
        if a["n"] == 0:
            continue
        add("machine_buckets", r, "all", float(a["n"]))
        add("machine_time_share", r, "all", a["tw"] / avail if avail > 0 else np.nan)
        for kind in ("request", "usage", "peak"):
            tk = a[f"tk_{kind}"]
            share = a[f"over_{kind}"] / tk if tk > 0 else np.nan
            add(f"share_over_capacity_{kind}", r, "all", share if has_usage or kind == "request" else np.nan)
        mean_use = a["num"] / a["den"] if a["den"] > 0 else np.nan
        add("usage_ratio_mean", r, "all", mean_use if has_usage else np.nan)
        for t in ("all", *tiers):
            num, den = reqw[(r, t)]
            add("alloc_ratio_mean", r, t, num / den)
            for q, v in zip(QUANTILES, qrow[(r, t)], strict=True):
                add("alloc_ratio_max" if q == 1.0 else f"alloc_ratio_p{round(q * 100)}", r, t, v)
    return schema_table(rows, _SUMMARY_SCHEMA)


def _full_of(b: dict[str, np.ndarray], r: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Of a batch ``b`` of the machine table, for resource ``r``: the mask of full machine-buckets
    and their seconds and capacity."""
    L, cap = b["covered_s"], b[f"cap_{r}"]
    full = _full(b["up_s"], L, cap)
    return full, L[full], cap[full]


def _ratio_quantiles(
    be: Any,
    machine: Any,
    quantiled: list[tuple[str, str]],
    req_col: dict[tuple[str, str], str],
    ratios: KeptValues | None,
) -> Any:
    """The :data:`QUANTILES` of the request / capacity ratios of the full machine-buckets, per
    (resource, tier) of ``quantiled``: of the ``ratios`` kept on the device by the finalize, or
    else read from the machine table a batch at a time."""

    def batch_ratios() -> Any:
        for b in array_batches(machine, ["covered_s", "up_s", "cap_cpu", "cap_mem", *{req_col[k] for k in quantiled}]):
            b = {c: np.asarray(v, np.float64) for c, v in b.items()}
            full = {r: _full_of(b, r) for r in {r for r, _ in quantiled}}
            yield [b[req_col[(r, t)]][full[r][0]] / full[r][2] for r, t in quantiled]

    if not quantiled:
        return np.zeros((0, len(QUANTILES)))
    return kept_quantiles(be, [] if ratios is None else [ratios], quantiled, batch_ratios, QUANTILES)
