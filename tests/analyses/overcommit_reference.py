"""Slow, obviously-correct references for the ``overcommit`` analysis.

* :func:`replay`: plain Python.  Per instance, walk its events in order; per machine, walk its
  capacity events; integrate every piece over every bucket it overlaps with integer arithmetic.
  Shares no code with ``gpuclust.analyses._intervals`` / ``overcommit``.
* :func:`usage_sql`: DuckDB SQL for the usage part (``generate_series`` over buckets); a group
  whose values are all NULL is NULL (plain ``SUM``: unknown, never 0).

Semantics restated (see ``docs/analyses/overcommit.md``): events of a thing are ordered by time,
ties by row order; event times are clipped to the window; tasks inside allocs are dropped row by
row; SCHEDULE opens (closing a running piece first), UPDATE_RUNNING while running splits,
EVICT/FAIL/FINISH/KILL/LOST close; NULL requests / priorities carry forward; ADD / UPDATE / REMOVE
set capacity / change it / make it 0; NULL capacity is unknown.  Buckets follow the time-bucket
convention of ``docs/user/dataset.md``: bucket ``b`` is ``[b*width, (b+1)*width)`` of absolute trace
time (origin 0), keyed by that absolute ``b``; the window clips the first and last bucket.
"""

from __future__ import annotations

import math
from collections import defaultdict
from typing import Any

import pyarrow as pa

SENTINEL = 2**63 - 1
TERMINALS = {4, 5, 6, 7, 8}


def default_window_end(tables: dict[str, pa.Table], start: int) -> int:
    best = start
    ev = tables.get("instance_events")
    if ev is not None:
        for t in ev.column("time").to_pylist():
            if t is not None and t < SENTINEL:
                best = max(best, t)
    us = tables.get("instance_usage")
    if us is not None:
        for t in us.column("end_time").to_pylist():
            if t is not None and t < SENTINEL:
                best = max(best, t)
    return best


def tier_of(p: Any, bounds: tuple[int, ...], names: tuple[str, ...]) -> str:
    if p is None or (isinstance(p, float) and math.isnan(p)) or p < 0:
        return "unknown"
    name = names[0]
    for b, n in zip(bounds, names, strict=True):
        if p >= b:
            name = n
    return name


def _rows(t: pa.Table | None) -> list[dict[str, Any]]:
    return [] if t is None else t.to_pylist()


def bucket_range(start: int, end: int, width: int) -> range:
    """Absolute bucket numbers ``b`` whose ``[b*width, (b+1)*width)`` meets ``[start, end)``."""
    return range(start // width, -(-end // width)) if end > start else range(0)


def _integrate(acc: dict, key: tuple, s: int, e: int, value: float, start: int, width: int, buckets: range) -> None:
    """acc[key + (b,)] += value * overlap seconds, bucket by bucket (plain loop)."""
    if value is None or (isinstance(value, float) and math.isnan(value)) or e <= s:
        return
    for b in buckets:
        bs = b * width
        ov = min(e, bs + width) - max(s, bs)
        if ov > 0:
            acc[(*key, b)] += value * (ov / 1e6)


def replay(
    tables: dict[str, pa.Table],
    *,
    bucket_s: int,
    names: tuple[str, ...],
    bounds: tuple[int, ...],
    start: int = 600_000_000,
    end: int | None = None,
) -> dict[str, Any]:
    """Interval-derived series (capacity, requests, instance counts) by plain loops.

    Returns dict with ``end``, ``n_buckets``, ``machines`` (set of machine ids) and accumulators
    keyed ``(machine, bucket)`` (``up``, ``capc``, ``capm``, ``unkc``, ``unkm``, ``inst``,
    ``distinct`` -> set) or ``(machine, tier, bucket)`` (``reqc``, ``reqm``) in seconds-weighted
    sums (value x seconds).
    """
    if end is None:
        end = default_window_end(tables, start)
    width = bucket_s * 1_000_000
    buckets = bucket_range(start, end, width)
    n_buckets = len(buckets)

    def clip(t: int) -> int:
        return min(max(t, start), end)

    out: dict[str, Any] = {
        k: defaultdict(float) for k in ("up", "capc", "capm", "unkc", "unkm", "inst", "reqc", "reqm")
    }
    out["distinct"] = defaultdict(set)
    # ---- instances
    by_inst: dict[tuple[int, int], list[tuple[int, int, dict]]] = defaultdict(list)
    for idx, r in enumerate(_rows(tables.get("instance_events"))):
        if r["alloc_collection_id"] not in (None, 0):
            continue
        by_inst[(r["collection_id"], r["instance_index"])].append((r["time"], idx, r))
    pieces = []  # (instance key, machine, s, e, cpu, mem, prio)
    for key, evs in by_inst.items():
        evs.sort(key=lambda x: (x[0], x[1]))
        running = False
        cur: list[Any] = []
        last = {"req_cpu": None, "req_mem": None, "priority": None}

        for t_raw, _, r in evs:
            for f in last:
                if r[f] is not None:
                    last[f] = r[f]
            t = clip(t_raw)
            typ = r["type"]
            if typ == 3:
                if running:
                    pieces.append((key, cur[0], cur[1], t, *cur[2:]))
                cur = [r["machine_id"], t, last["req_cpu"], last["req_mem"], last["priority"]]
                running = True
            elif typ == 10:
                if running:
                    pieces.append((key, cur[0], cur[1], t, *cur[2:]))
                    cur = [cur[0], t, last["req_cpu"], last["req_mem"], last["priority"]]
            elif typ in TERMINALS:
                if running:
                    pieces.append((key, cur[0], cur[1], t, *cur[2:]))
                    running = False
        if running:
            pieces.append((key, cur[0], cur[1], end, *cur[2:]))
    # ---- machines
    me_rows = _rows(tables.get("machine_events"))
    machines = {r["machine_id"] for r in me_rows}
    with_events = set(machines)
    for p in pieces:
        if p[1] is not None and p[1] > 0:
            machines.add(p[1])
    by_m: dict[int, list[tuple[int, int, dict]]] = defaultdict(list)
    for idx, r in enumerate(me_rows):
        if r["type"] in (1, 2, 3):
            by_m[r["machine_id"]].append((r["time"], idx, r))
    nan = float("nan")
    for m, evs in by_m.items():
        evs.sort(key=lambda x: (x[0], x[1]))
        up, capc, capm = False, nan, nan
        for k, (t_raw, _, r) in enumerate(evs):
            if r["type"] == 1:
                up = True
                capc, capm = _val(r["cap_cpu"]), _val(r["cap_mem"])
            elif r["type"] == 2:
                up = False
            else:
                capc, capm = _val(r["cap_cpu"]), _val(r["cap_mem"])
            s = clip(t_raw)
            e = clip(evs[k + 1][0]) if k + 1 < len(evs) else end
            if up and e > s:
                _integrate(out["up"], (m,), s, e, 1.0, start, width, buckets)
                _integrate(out["capc"], (m,), s, e, 0.0 if math.isnan(capc) else capc, start, width, buckets)
                _integrate(out["capm"], (m,), s, e, 0.0 if math.isnan(capm) else capm, start, width, buckets)
                _integrate(out["unkc"], (m,), s, e, 1.0 if math.isnan(capc) else 0.0, start, width, buckets)
                _integrate(out["unkm"], (m,), s, e, 1.0 if math.isnan(capm) else 0.0, start, width, buckets)
    # ---- requests and counts
    for key, m, s, e, cpu, mem, prio in pieces:
        if m is None or m <= 0:
            continue
        tier = tier_of(prio, bounds, names)
        _integrate(out["reqc"], (m, tier), s, e, cpu, start, width, buckets)
        _integrate(out["reqm"], (m, tier), s, e, mem, start, width, buckets)
        _integrate(out["inst"], (m,), s, e, 1.0, start, width, buckets)
        for b in buckets:
            bs = b * width
            if min(e, bs + width) - max(s, bs) > 0:
                out["distinct"][(m, b)].add(key)
    out.update(end=end, n_buckets=n_buckets, buckets=buckets, machines=machines, with_events=with_events, pieces=pieces)
    return out


def _val(v: Any) -> float:
    return float("nan") if v is None else float(v)


def usage_sql(
    con: Any,
    *,
    bucket_s: int,
    names: tuple[str, ...],
    bounds: tuple[int, ...],
    start: int,
    end: int,
    machines: set[int],
) -> Any:
    """DuckDB: per (machine, tier, bucket) time-weighted usage seconds, sums of window maxima and
    window counts over views ``usage`` and ``events``; returns a pandas DataFrame."""
    width = bucket_s * 1_000_000
    b_lo, b_hi = start // width, -(-end // width)  # absolute buckets meeting [start, end)
    case = (
        "CASE WHEN p IS NULL OR p < 0 THEN 'unknown' "
        + " ".join(f"WHEN p >= {b} THEN '{n}'" for b, n in reversed(list(zip(bounds, names, strict=True))))
        + " END"
    )
    con.execute("CREATE OR REPLACE TEMP TABLE known_machines (m BIGINT)")
    if machines:
        con.executemany("INSERT INTO known_machines VALUES (?)", [[int(m)] for m in machines])
    return con.execute(f"""
        WITH u AS (
            SELECT * FROM usage
            WHERE coalesce(alloc_collection_id, 0) = 0 AND end_time <> {SENTINEL}
              AND machine_id IN (SELECT m FROM known_machines)),
        lk AS (
            SELECT collection_id AS c, instance_index AS i, machine_id AS m, max(priority) AS p
            FROM events WHERE coalesce(alloc_collection_id, 0) = 0 AND machine_id IS NOT NULL
            GROUP BY ALL),
        j AS (SELECT u.*, {case} AS tier FROM u LEFT JOIN lk
              ON u.collection_id = lk.c AND u.instance_index = lk.i AND u.machine_id = lk.m),
        b AS (SELECT generate_series AS b FROM generate_series({b_lo}, {b_hi - 1})),
        x AS (
            SELECT j.*, b.b,
                   least(end_time, {end}::BIGINT, (b.b + 1) * {width}::BIGINT)
                   - greatest(start_time, {start}::BIGINT, b.b * {width}::BIGINT) AS ov
            FROM j JOIN b
              ON b.b * {width}::BIGINT < least(end_time, {end}::BIGINT)
             AND (b.b + 1) * {width}::BIGINT > greatest(start_time, {start}::BIGINT))
        SELECT machine_id, tier, b AS bucket,
               sum(avg_cpu::DOUBLE * ov / 1e6) AS use_cpu_s,
               sum(avg_mem::DOUBLE * ov / 1e6) AS use_mem_s,
               sum(max_cpu::DOUBLE) AS max_cpu, sum(max_mem::DOUBLE) AS max_mem,
               count(*) AS windows
        FROM x WHERE ov > 0 GROUP BY ALL ORDER BY ALL""").df()


def figure_reference(machine: Any, info: dict[str, Any], rows: int = 160, cols: int = 240) -> dict[str, Any]:
    """The figure tables from the written machine table, with pandas: ``heatmap`` (machines with a
    finite ``alloc_ratio_cpu`` sorted by their mean, ties by id, cut into at most ``rows`` bands
    of equal count; buckets of the grid grouped ``ceil(buckets / cols)`` a column; each cell the
    mean of its finite values) and ``ratio_hist`` (per resource, the ratios of machine-buckets
    with a finite, positive capacity, in bins ``[k / 100, (k + 1) / 100)`` below 100 and one from
    100 up), as DataFrames in the analysis' row order."""
    import numpy as np
    import pandas as pd

    width = int(info["bucket_s"]) * 1_000_000
    n_buckets = int(info["buckets"])
    first = int(info["window_start_us"]) // width
    per = max(1, -(-n_buckets // cols))
    n_cols = max(1, -(-n_buckets // per))
    m = machine[np.isfinite(machine["alloc_ratio_cpu"])]
    heat = pd.DataFrame()
    if len(m):
        mean = m.groupby("machine_id")["alloc_ratio_cpu"].mean()
        ids = sorted(mean.index, key=lambda i: (mean[i], i))
        n = len(ids)
        bands = min(rows, n)
        band = pd.Series([k * bands // n for k in range(n)], index=ids)
        g = pd.DataFrame(
            {"band": band[m["machine_id"]].to_numpy(), "col": (m["bucket"] - first) // per, "v": m["alloc_ratio_cpu"]}
        )
        agg = g.groupby(["band", "col"])["v"].agg(["mean", "count"])
        full = pd.MultiIndex.from_product([range(bands), range(n_cols)], names=["band", "col"])
        agg = agg.reindex(full)
        heat = pd.DataFrame(
            {
                "band": full.get_level_values(0),
                "machines": band.value_counts().reindex(full.get_level_values(0)).to_numpy(),
                "bucket": first + full.get_level_values(1) * per,
                "alloc_ratio_cpu": agg["mean"].to_numpy(),
                "machine_buckets": agg["count"].fillna(0).astype(np.int64).to_numpy(),
            }
        )
    hist = []
    for r in ("cpu", "mem"):
        v, cap = machine[f"alloc_ratio_{r}"].to_numpy(float), machine[f"cap_{r}"].to_numpy(float)
        v = v[np.isfinite(v) & np.isfinite(cap) & (cap > 0) & (v >= 0)]
        counts, _ = np.histogram(v[v < 100], bins=np.arange(10_001) / 100)
        for k in np.flatnonzero(counts):
            hist.append((r, k / 100, (k + 1) / 100, int(counts[k])))
        if (v >= 100).any():
            hist.append((r, 100.0, np.inf, int((v >= 100).sum())))
    return {
        "heatmap": heat,
        "ratio_hist": pd.DataFrame(hist, columns=["resource", "ratio_lo", "ratio_hi", "machine_buckets"]),
    }
