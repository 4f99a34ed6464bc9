"""Analyses benchmark: every registered analysis on the cpu backend, the gpu backend where present,
and the peers a user would otherwise pick, at 10^6 and 10^7 usage windows (10^8 on a GPU machine).

    python bench/analyses_bench.py                         # 1e6 and 1e7 windows, every analysis
    python bench/analyses_bench.py --sizes 1e6 --analyses cell-usage,cpi
    python bench/analyses_bench.py --sizes 1e6,1e7,1e8     # on a GPU machine

Data: `bench/gen_canonical.py` (canonical Parquet written directly, cached under bench/data/).
Each measurement runs in its own process; the parent samples the process tree's RSS. Reported
per (size, analysis, contender): seconds inside the timed call (imports and process start
excluded), rows/s of the analysed table, achieved GB/s over the in-memory bytes of the columns
the analysis reads, and peak RSS. Writes bench/results/<name>.json and .md with device, versions
and commit.

Peers (what SQL / pandas can express of each analysis, written the way a user would):
cell-usage: DuckDB SQL of Google's notebook query and a pandas merge + groupby;
machine-shapes: DuckDB COUNT(DISTINCT); cpi: DuckDB and pandas grouped weighted Pearson per
machine (compared with gpuclust's cpi restricted to that: regression=none, spearman=none);
overcommit: DuckDB machine x 5-min bucket CPU sums with exact overlap (generate_series), DuckDB
computing all of gpuclust's usage sums (tier join, CPU/memory overlap, maxima, counts), and
pandas on the 300 s grid; usage-distribution: the straightforward per-group loop (timed on a
subset of groups and scaled by window count, reported as such).

The trace studies' SQL (run by bench/cpu_vs_duckdb.py): ``*_sql`` are SQL-expressible subsets;
``job_usage_full_sql``, ``lifecycle_full_sql``, ``usage_vs_request_full_sql``,
``usage_change_full_sql``, ``data_quality_full_sql`` and ``machine_utilization_full_sql`` are
DuckDB scripts that write every table the analysis writes, as Parquet, written from its document
and checked table for table against gpuclust's in tests/bench/test_cpu_vs_duckdb.py (so they are
also independent references for those numbers); ``peak_prediction_sql`` writes the columns of
peak-prediction's ``machine`` table that SQL computes (instances, the sums of limits and of capped
usage, ``borg_default``, the oracle; not the stateful predictors), checked the same way.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from _harness import bench_dataset, environment, run_measured, write_results  # noqa: E402

US = 1_000_000


# ------------------------------------------------------------------------------------------
# Contenders (run inside the child process)
# ------------------------------------------------------------------------------------------
#: Options that make gpuclust compute what its peers compute (same groups).
BENCH_OPTIONS: dict[str, dict[str, Any]] = {
    "cpi": {"by": "machine"},  # peers: grouped weighted Pearson per machine
    "usage-distribution": {"by": "machine"},  # peer: the per-group loop over machines
    "usage-change": {"level": "instance"},  # peer: pairs of an instance's windows by LEAD
    "machine-utilization": {"mode": "notebook"},  # peer: the notebook's query
}
#: Extra gpuclust rows: the analysis restricted to what its SQL peer computes (contender name
#: ``gpuclust-<backend>[opt=value,...]``).
BENCH_VARIANTS: dict[str, list[dict[str, Any]]] = {
    "cpi": [{"regression": "none", "spearman": "none"}],  # moments + Pearson only, as the SQL
}


def variant_label(name: str, opts: dict[str, Any]) -> str:
    """``name[opt=value,...]`` (``name`` without options): a gpuclust run restricted by ``opts``."""
    return f"{name}[{','.join(f'{k}={v}' for k, v in opts.items())}]" if opts else name


def _variant_name(backend: str, opts: dict[str, Any]) -> str:
    return variant_label(f"gpuclust-{backend}", opts)


def _parse_contender(name: str) -> tuple[str, dict[str, Any]]:
    """``gpuclust-cpu[a=1,b=x]`` -> ("cpu", {"a": "1", "b": "x"})."""
    body = name.split("-", 1)[1]
    if "[" not in body:
        return body, {}
    backend, opts = body[:-1].split("[", 1)
    return backend, dict(kv.split("=", 1) for kv in opts.split(","))


def gpuclust_runner(backend: str, extra: dict[str, Any] | None = None) -> Callable[[Path, str], Callable[[], Any]]:
    def make(ds: Path, analysis: str) -> Callable[[], Any]:
        from gpuclust.analyses.registry import create
        from gpuclust.dataset import Dataset
        from gpuclust.engine import run

        d = Dataset(ds)
        a = create(analysis, **{**BENCH_OPTIONS.get(analysis, {}), **(extra or {})})
        # the engine's defaults: about 4 Mi rows a partition, one thread per usable core (the
        # DuckDB peers run with one thread per usable core too: same cores)
        return lambda: run(d, [a], backend=backend, partitions="auto")

    return make


def _duck() -> Any:
    import duckdb

    con = duckdb.connect()
    con.execute(f"SET threads={len(os.sched_getaffinity(0))}")
    return con


def cell_usage_sql(ds: Path | str) -> str:
    """Google's notebook query (cell-usage, notebook mode) over the dataset's Parquet."""
    sql = f"""
    WITH cap AS (SELECT SUM(c) AS cpu, SUM(m) AS mem FROM (
            SELECT machine_id, MAX(cap_cpu) AS c, MAX(cap_mem) AS m
            FROM read_parquet('{ds}/machine_events/**/*.parquet', hive_partitioning=false) GROUP BY machine_id)),
         e AS (SELECT collection_id, instance_index, machine_id, MAX(priority) AS p
               FROM read_parquet('{ds}/instance_events/**/*.parquet', hive_partitioning=false)
               WHERE alloc_collection_id IS NULL OR alloc_collection_id = 0 GROUP BY ALL),
         u AS (SELECT start_time, collection_id, instance_index, machine_id, avg_cpu, avg_mem
               FROM read_parquet('{ds}/instance_usage/**/*.parquet', hive_partitioning=false)
               WHERE (alloc_collection_id IS NULL OR alloc_collection_id = 0)
                 AND end_time - start_time >= 300000000)
    SELECT CAST(floor(u.start_time / 3.6e9) AS BIGINT) AS bucket,
           CASE WHEN p BETWEEN 0 AND 99 THEN 'free' WHEN p BETWEEN 100 AND 115 THEN 'beb'
                WHEN p BETWEEN 116 AND 119 THEN 'mid' ELSE 'prod' END AS tier,
           SUM(avg_cpu) / (12 * ANY_VALUE(cap.cpu)) AS cpu, SUM(avg_mem) / (12 * ANY_VALUE(cap.mem)) AS mem
    FROM u JOIN e USING (collection_id, instance_index, machine_id), cap GROUP BY ALL"""
    return sql


def pandas_cell_usage(ds: Path, _: str) -> Callable[[], Any]:
    import pandas as pd

    def go() -> Any:
        me = pd.read_parquet(ds / "machine_events", columns=["machine_id", "cap_cpu", "cap_mem"])
        cap = me.groupby("machine_id").max().sum()
        ev = pd.read_parquet(
            ds / "instance_events",
            columns=["collection_id", "instance_index", "machine_id", "priority", "alloc_collection_id"],
        )
        ev = (
            ev[ev.alloc_collection_id == 0]
            .groupby(["collection_id", "instance_index", "machine_id"], as_index=False)["priority"]
            .max()
        )
        u = pd.read_parquet(
            ds / "instance_usage",
            columns=[
                "start_time",
                "end_time",
                "collection_id",
                "instance_index",
                "machine_id",
                "alloc_collection_id",
                "avg_cpu",
                "avg_mem",
            ],
        )
        u = u[(u.alloc_collection_id == 0) & (u.end_time - u.start_time >= 300 * US)]
        j = u.merge(ev, on=["collection_id", "instance_index", "machine_id"])
        j["bucket"] = j.start_time // 3_600_000_000  # hours from trace time 0 (docs/dataset.md "Time buckets")
        j["tier"] = pd.cut(j.priority, [-1, 99, 115, 119, 10**9], labels=["free", "beb", "mid", "prod"])
        g = j.groupby(["bucket", "tier"], observed=True)[["avg_cpu", "avg_mem"]].sum()
        return g.avg_cpu / (12 * cap.cap_cpu), g.avg_mem / (12 * cap.cap_mem)

    return go


def machine_shapes_sql(ds: Path | str) -> str:
    """Machines per (cap_cpu, cap_mem) over machine_events."""
    return (
        f"SELECT cap_cpu, cap_mem, COUNT(DISTINCT machine_id) "
        f"FROM read_parquet('{ds}/machine_events/**/*.parquet', hive_partitioning=false) GROUP BY ALL"
    )


def cpi_sql(ds: Path | str) -> str:
    """cpi's SQL-expressible subset: weighted moments and Pearson r(CPI, MAI) per machine."""
    sql = f"""
    WITH w AS (SELECT machine_id, cpi, mai, avg_cpu * (end_time - start_time) / 1e6 AS w
               FROM read_parquet('{ds}/instance_usage/**/*.parquet', hive_partitioning=false)
               WHERE cpi IS NOT NULL AND mai IS NOT NULL AND cpi > 0 AND cpi <= 100 AND mai >= 0 AND mai <= 1),
         m AS (SELECT machine_id, SUM(w) AS wsum, SUM(w * cpi) / SUM(w) AS mc, SUM(w * mai) / SUM(w) AS mm FROM w GROUP BY machine_id)
    SELECT machine_id, COUNT(*), ANY_VALUE(wsum), ANY_VALUE(mc), ANY_VALUE(mm),
           SUM(w * (cpi - mc) * (mai - mm)) / sqrt(SUM(w * (cpi - mc) ^ 2) * SUM(w * (mai - mm) ^ 2)) AS r
    FROM w JOIN m USING (machine_id) GROUP BY machine_id"""
    return sql


def pandas_cpi(ds: Path, _: str) -> Callable[[], Any]:
    import pandas as pd

    def go() -> Any:
        u = pd.read_parquet(
            ds / "instance_usage", columns=["machine_id", "cpi", "mai", "avg_cpu", "start_time", "end_time"]
        )
        u = u[u.cpi.notna() & u.mai.notna() & (u.cpi > 0) & (u.cpi <= 100) & (u.mai >= 0) & (u.mai <= 1)]
        u = u.assign(w=u.avg_cpu.astype("float64") * (u.end_time - u.start_time) / 1e6)
        g = u.groupby("machine_id")
        mc = g.apply(lambda s: (s.w * s.cpi).sum() / s.w.sum(), include_groups=False)
        u = u.join(mc.rename("mc"), on="machine_id")
        mm = g.apply(lambda s: (s.w * s.mai).sum() / s.w.sum(), include_groups=False)
        u = u.join(mm.rename("mm"), on="machine_id")
        u = u.assign(
            xy=u.w * (u.cpi - u.mc) * (u.mai - u.mm), xx=u.w * (u.cpi - u.mc) ** 2, yy=u.w * (u.mai - u.mm) ** 2
        )
        s = u.groupby("machine_id")[["xy", "xx", "yy"]].sum()
        return s.xy / (s.xx * s.yy) ** 0.5

    return go


def overcommit_sql(ds: Path | str) -> str:
    """Per machine x 5-min bucket CPU usage.  Buckets follow docs/dataset.md "Time buckets" (origin
    trace time 0: ``bucket = floor(t / width)``), the grid overcommit itself uses, so the peers
    compute the same buckets (the bench data starts at 600 s, so overcommit's window clips nothing)."""
    b = 300 * US
    return f"""
    SELECT machine_id, g.b AS bucket,
           SUM(avg_cpu * (LEAST(end_time, (g.b + 1) * {b}) - GREATEST(start_time, g.b * {b}))) / {b} AS cpu
    FROM read_parquet('{ds}/instance_usage/**/*.parquet', hive_partitioning=false) AS u,
         generate_series(u.start_time // {b}, (u.end_time - 1) // {b}) AS g(b)
    WHERE alloc_collection_id = 0 AND end_time > start_time
    GROUP BY ALL"""


def overcommit_tiers_sql(ds: Path | str) -> str:
    """The usage sums gpuclust's overcommit partial computes: machine x tier x 5-min bucket, tier
    from MAX(priority) per instance (notebook tier map), exact-overlap CPU and memory, sums of
    window maxima and window counts per bucket touched."""
    b = 300 * US
    return f"""
    WITH e AS (SELECT collection_id, instance_index, machine_id, MAX(priority) AS p
               FROM read_parquet('{ds}/instance_events/**/*.parquet', hive_partitioning=false)
               WHERE alloc_collection_id IS NULL OR alloc_collection_id = 0 GROUP BY ALL),
         u AS (SELECT u.*, CASE WHEN p BETWEEN 0 AND 99 THEN 0 WHEN p BETWEEN 100 AND 115 THEN 1
                                WHEN p BETWEEN 116 AND 119 THEN 2 WHEN p >= 120 THEN 3 ELSE 4 END AS tier
               FROM read_parquet('{ds}/instance_usage/**/*.parquet', hive_partitioning=false) AS u
               LEFT JOIN e USING (collection_id, instance_index, machine_id)
               WHERE (u.alloc_collection_id IS NULL OR u.alloc_collection_id = 0)
                 AND end_time > start_time AND end_time < 9223372036854775807)
    SELECT machine_id, tier, g.b AS bucket,
           SUM(avg_cpu * (LEAST(end_time, (g.b + 1) * {b}) - GREATEST(start_time, g.b * {b}))) / {b} AS cpu,
           SUM(avg_mem * (LEAST(end_time, (g.b + 1) * {b}) - GREATEST(start_time, g.b * {b}))) / {b} AS mem,
           SUM(max_cpu) AS max_cpu, SUM(max_mem) AS max_mem, COUNT(*) AS windows
    FROM u, generate_series(u.start_time // {b}, (u.end_time - 1) // {b}) AS g(b)
    GROUP BY ALL"""


def pandas_overcommit(ds: Path, _: str) -> Callable[[], Any]:
    import pandas as pd

    def go() -> Any:
        u = pd.read_parquet(
            ds / "instance_usage", columns=["machine_id", "start_time", "end_time", "avg_cpu", "alloc_collection_id"]
        )
        u = u[u.alloc_collection_id == 0]
        u = u.assign(bucket=u.start_time // (300 * US), cs=u.avg_cpu * (u.end_time - u.start_time) / (300 * US))
        return u.groupby(["machine_id", "bucket"]).cs.sum()  # grid-aligned windows only

    return go


def loop_usage_distribution(ds: Path, _: str) -> Callable[[], Any]:
    """The per-group loop of bench/mixture_bench.py on the per-machine groups of a subset."""
    import numpy as np
    import pandas as pd
    from mixture_bench import per_group_loop

    from gpuclust.schema import CPU_PERCENTILE_COLUMNS_SORTED

    cols = list(CPU_PERCENTILE_COLUMNS_SORTED)
    u = pd.read_parquet(ds / "instance_usage", columns=["machine_id", "start_time", "end_time", "sample_rate", *cols])
    u = u.dropna(subset=cols)
    u["group"] = u.machine_id
    u["w"] = (u.end_time - u.start_time) / 1e6 * u.sample_rate.fillna(1.0).replace(0, 1.0)
    machines = u.machine_id.unique()
    sub = u[u.machine_id.isin(machines[: max(1, len(machines) // 20)])]
    scale = len(u) / max(1, len(sub))
    _ = np

    def go() -> Any:
        per_group_loop(sub, 2049)
        return scale

    return go


def lifecycle_sql(ds: Path | str) -> str:
    """lifecycle's SQL-expressible subset: per instance its tier (notebook map, of its highest
    priority) and, with LAG over the instance's events in time order, the count of events and of
    transitions by (previous event, event, tier)."""
    sql = f"""
    WITH e AS (SELECT time, type, collection_id, instance_index, priority
               FROM read_parquet('{ds}/instance_events/**/*.parquet', hive_partitioning=false)),
         t AS (SELECT collection_id, instance_index, MAX(priority) AS p FROM e GROUP BY ALL),
         s AS (SELECT e.type, LAG(e.type) OVER (PARTITION BY e.collection_id, e.instance_index ORDER BY e.time) AS prev,
                      CASE WHEN p IS NULL OR p < 0 THEN 'unknown' WHEN p < 100 THEN 'free' WHEN p < 116 THEN 'beb'
                           WHEN p < 120 THEN 'mid' ELSE 'prod' END AS tier
               FROM e JOIN t USING (collection_id, instance_index))
    SELECT tier, prev, type, COUNT(*) FROM s GROUP BY ALL"""
    return sql


#: v3 event type names by code (v3 document, "Event types"): what lifecycle_full_sql names them.
_V3_EVENTS = (
    "SUBMIT",
    "QUEUE",
    "ENABLE",
    "SCHEDULE",
    "EVICT",
    "FAIL",
    "FINISH",
    "KILL",
    "LOST",
    "UPDATE_PENDING",
    "UPDATE_RUNNING",
)


def lifecycle_full_sql(ds: Path | str, out: Path | str, bucket_s: int = 3600) -> str:
    """gpuclust lifecycle's tables of every kind together (``events``, ``transitions``, ``series``,
    ``delays``, ``delay_hist``) and ``info``, as DuckDB statements that write them to ``out`` as
    Parquet, from docs/analysis-lifecycle.md (not from gpuclust's code): each instance's events in
    time order (ties in the files' row order), the state after each event by its type (pending:
    SUBMIT, QUEUE, ENABLE, UPDATE_PENDING; running: SCHEDULE, UPDATE_RUNNING; dead: the rest) and
    the pending sub-state (queued after a QUEUE, eligible after an ENABLE, until the next SUBMIT,
    QUEUE, ENABLE or the end of the stay), the instance's tier from its highest priority, present
    at the trace start when its first event is at time 0; ``events``, ``transitions``
    (``expected`` from the v3 state diagram), ``series`` (per bucket of ``bucket_s`` and tier with
    events: submissions, new ones (an instance's first SUBMIT, unless it is present at the start),
    resubmissions, the instances present at the start, schedules, deaths by kind, and the instances
    pending, running, queued and eligible at the bucket's end, every bucket from the first to the
    last), ``delays`` and ``delay_hist`` (scheduling, ENABLE-to-SCHEDULE, execution and queued
    episodes with their outcomes, censored ones measured to the last finite event time, events the
    trace synthesised (``missing_type`` set, not NONE; where the column is present) replayed but
    timing no duration, durations in the log bins ``ceil(10^(k/50))`` µs), and ``info`` (the
    counters of the replay; not the tier map, kinds or collections).  Not ``survival``,
    ``events_by_kind`` or ``delays_by_kind``: the per-kind tables and the Kaplan-Meier estimate are
    out of scope for this SQL peer.  tests/bench/test_cpu_vs_duckdb.py checks it against
    gpuclust's tables."""
    import math

    import pyarrow.parquet as pq

    events = f"read_parquet('{ds}/instance_events/**/*.parquet', hive_partitioning=false, file_row_number=true)"
    files = sorted(Path(ds, "instance_events").rglob("*.parquet"))
    synth = (
        "COALESCE(missing_type > 0, false)" if files and "missing_type" in pq.read_schema(files[0]).names else "false"
    )
    edges = sorted({math.ceil(10.0 ** (k / 50)) for k in range(651)})  # the bins' lower edges, µs
    names = "[" + ", ".join(f"'{n}'" for n in _V3_EVENTS) + "]"
    after = "9223372036854775807"
    width = int(bucket_s) * 1_000_000

    def state(e: str) -> str:  # 1 pending, 2 running, 3 dead, 0 none (no event)
        return f"CASE WHEN {e} IN (0, 1, 2, 9) THEN 1 WHEN {e} IN (3, 10) THEN 2 WHEN {e} IS NULL THEN 0 ELSE 3 END"

    def last(cond: str, v: str) -> str:  # v at the instance's last row so far where cond holds
        return f"LAST_VALUE(CASE WHEN {cond} THEN {v} END IGNORE NULLS) OVER {upto}"

    def lag(*cols: str) -> str:
        return ", ".join(f"LAG({c}) OVER ({inst}) AS p{c}" for c in cols)

    inst = "PARTITION BY c, i ORDER BY r"
    upto = f"({inst} ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW)"
    died = f"lower({names}[e + 1])"
    series_counts = (
        "submissions",
        "new_submissions",
        "resubmissions",
        "present_at_start",
        "schedules",
        "evictions",
        "failures",
        "finishes",
        "kills",
        "losses",
    )
    levels = ("pending", "running", "queued", "eligible")
    return f"""
    CREATE TEMP TABLE raw AS SELECT time AS t, type AS e, collection_id AS c, instance_index AS i, priority,
        {synth} AS sy, ROW_NUMBER() OVER (ORDER BY file_index, file_row_number) AS r FROM {events};
    CREATE TEMP TABLE x AS
      WITH v AS (SELECT *, MAX(priority) OVER (PARTITION BY c, i) AS p, MIN(t) OVER (PARTITION BY c, i) = 0 AS pas,
                        LAG(e) OVER ({inst}) AS pe,
                        SUM(CASE WHEN e = 0 THEN 1 ELSE 0 END) OVER {upto} AS nsub,
                        ROW_NUMBER() OVER (PARTITION BY c, i ORDER BY r DESC) = 1 AS last
                 FROM (SELECT t, e, c, i, priority, sy, ROW_NUMBER() OVER (ORDER BY t, r) AS r FROM raw
                       WHERE e BETWEEN 0 AND 10)),
           w AS (SELECT *, {_tier_case(ds)} AS tier, {state("e")} AS st, {state("pe")} AS pst FROM v),
           z AS (SELECT *, st = 1 AND (pst <> 1 OR e = 0) AS pentry, st = 2 AND (pst <> 2 OR e = 3) AS rentry,
                        {last("e IN (0, 1, 2) OR st <> 1", "e")} AS sub_e FROM w),
           q AS (SELECT *, COALESCE(st = 1 AND sub_e = 1, false) AS queued,
                        COALESCE(st = 1 AND sub_e = 2, false) AS eligible FROM z),
           u AS (SELECT *, COALESCE(LAG(queued) OVER ({inst}), false) AS was_q,
                        COALESCE(LAG(eligible) OVER ({inst}), false) AS was_el FROM q)
      SELECT *,
             CASE pst WHEN 1 THEN e IN (1, 2, 3, 9, 5, 7, 8) WHEN 2 THEN e IN (10, 4, 5, 6, 7, 8) ELSE e = 0 END AS expected,
             {last("pentry", "t")} AS ps_t, {last("pentry", "e")} AS ps_e, {last("pentry", "sy")} AS ps_sy,
             {last("pentry", "r")} AS ps_r,
             {last("rentry", "t")} AS rs_t, {last("rentry", "e")} AS rs_e, {last("rentry", "sy")} AS rs_sy,
             {last("e = 2", "r")} AS en_r, {last("e = 2", "t")} AS en_t, {last("e = 2", "sy")} AS en_sy,
             {last("queued AND NOT was_q", "t")} AS qs_t, {last("queued AND NOT was_q", "sy")} AS qs_sy
      FROM u;
    CREATE TEMP TABLE ep AS
      WITH y AS (SELECT *, {
        lag("ps_t", "ps_e", "ps_sy", "ps_r", "rs_t", "rs_e", "rs_sy", "en_r", "en_t", "en_sy", "qs_t", "qs_sy")
    } FROM x),
           dend AS (SELECT MAX(t) FILTER (WHERE t < {after}) AS d FROM raw),
           eps AS (
      SELECT tier, 'scheduling' AS measure,
             CASE WHEN e = 0 THEN 'resubmitted' WHEN e = 3 THEN 'scheduled' WHEN e BETWEEN 4 AND 8
                  THEN {died} ELSE 'other' END AS outcome,
             t - pps_t AS dur, pps_e = 0 AND pps_t <> 0 AND t <> {after} AS timed, NOT pps_sy AND NOT sy AS real
        FROM y WHERE pst = 1 AND (st <> 1 OR e = 0)
      UNION ALL
      SELECT tier, 'enable_to_schedule', 'scheduled', t - pen_t, true, true
        FROM y WHERE pst = 1 AND e = 3 AND pen_r > pps_r AND pps_e = 0 AND pps_t <> 0 AND t <> {after}
                     AND NOT pps_sy AND NOT sy AND NOT pen_sy
      UNION ALL
      SELECT tier, 'execution', CASE WHEN e BETWEEN 4 AND 8 THEN {died} ELSE 'interrupted' END,
             t - prs_t, prs_e = 3 AND prs_t <> 0 AND t <> {after}, NOT prs_sy AND NOT sy
        FROM y WHERE pst = 2 AND (st <> 2 OR e = 3)
      UNION ALL
      SELECT tier, 'queued',
             CASE WHEN e = 2 THEN 'enabled' WHEN e = 3 THEN 'scheduled' WHEN e = 0 THEN 'resubmitted'
                  WHEN e BETWEEN 4 AND 8 THEN 'died' ELSE 'other' END,
             t - pqs_t, pqs_t <> 0 AND t <> {after}, NOT pqs_sy AND NOT sy
        FROM y WHERE was_q AND NOT queued
      UNION ALL
      SELECT tier, CASE WHEN st = 1 THEN 'scheduling' ELSE 'execution' END, 'censored',
             (SELECT d FROM dend) - CASE WHEN st = 1 THEN ps_t ELSE rs_t END,
             COALESCE(CASE WHEN st = 1 THEN ps_e = 0 AND ps_t <> 0 AND ps_t <= (SELECT d FROM dend)
                           ELSE rs_e = 3 AND rs_t <> 0 AND rs_t <= (SELECT d FROM dend) END, false),
             NOT CASE WHEN st = 1 THEN ps_sy ELSE rs_sy END
        FROM y WHERE last AND st IN (1, 2)
      UNION ALL
      SELECT tier, 'queued', 'censored', (SELECT d FROM dend) - qs_t,
             COALESCE(qs_t <> 0 AND qs_t <= (SELECT d FROM dend), false), NOT qs_sy
        FROM y WHERE last AND queued)
      SELECT tier, measure, outcome, dur, timed AND real AS known, timed AND NOT real AS synth_lost FROM eps;
    CREATE TEMP TABLE edges AS SELECT UNNEST(range(1, {len(edges) + 1})) AS b, UNNEST({edges}::BIGINT[]) AS lo;
    CREATE TEMP TABLE hist AS
      SELECT tier, measure, outcome, COALESCE(edges.b, 0) AS bin, COUNT(*) AS episodes
      FROM (SELECT * FROM ep WHERE known) k ASOF LEFT JOIN edges ON k.dur >= edges.lo GROUP BY ALL;
    COPY (SELECT tier, {names}[e + 1] AS event, COUNT(*) AS count FROM x GROUP BY tier, e)
      TO '{out}/events.parquet' (FORMAT parquet);
    COPY (SELECT tier, {names}[pe + 1] AS from_event, {names}[e + 1] AS to_event, COUNT(*) AS count, expected
          FROM x WHERE pe IS NOT NULL GROUP BY tier, pe, e, expected) TO '{out}/transitions.parquet' (FORMAT parquet);
    COPY (WITH live AS (SELECT *, t // {width} AS bucket FROM x WHERE t <> {after}),
               g AS (SELECT bucket, tier, COUNT(*) FILTER (WHERE e = 0) AS submissions,
                            COUNT(*) FILTER (WHERE e = 0 AND nsub = 1 AND NOT pas) AS new_submissions,
                            COUNT(*) FILTER (WHERE e = 0 AND (nsub > 1 OR (pas AND t <> 0))) AS resubmissions,
                            COUNT(*) FILTER (WHERE pe IS NULL AND pas) AS present_at_start,
                            COUNT(*) FILTER (WHERE e = 3) AS schedules, COUNT(*) FILTER (WHERE e = 4) AS evictions,
                            COUNT(*) FILTER (WHERE e = 5) AS failures, COUNT(*) FILTER (WHERE e = 6) AS finishes,
                            COUNT(*) FILTER (WHERE e = 7) AS kills, COUNT(*) FILTER (WHERE e = 8) AS losses,
                            SUM(CAST(st = 1 AS INT) - CAST(pst = 1 AS INT)) AS d_pending,
                            SUM(CAST(st = 2 AS INT) - CAST(pst = 2 AS INT)) AS d_running,
                            SUM(CAST(queued AS INT) - CAST(was_q AS INT)) AS d_queued,
                            SUM(CAST(eligible AS INT) - CAST(was_el AS INT)) AS d_eligible
                     FROM live GROUP BY ALL),
               grid AS (SELECT bucket, tier FROM range((SELECT MIN(bucket) FROM live), (SELECT MAX(bucket) FROM live) + 1)
                        t(bucket) CROSS JOIN (SELECT DISTINCT tier FROM live))
          SELECT bucket, bucket * {width} AS bucket_start_us, tier,
                 {", ".join(f"COALESCE({f}, 0) AS {f}" for f in series_counts)},
                 {
        ", ".join(
            f"CAST(SUM(COALESCE(d_{f}, 0)) OVER (PARTITION BY tier ORDER BY bucket) AS BIGINT) AS {f}" for f in levels
        )
    }
          FROM grid LEFT JOIN g USING (bucket, tier)) TO '{out}/series.parquet' (FORMAT parquet);
    COPY (WITH s AS (SELECT tier, measure, outcome, COUNT(*) AS episodes, COUNT(*) FILTER (WHERE known) AS with_duration,
                            AVG(dur) FILTER (WHERE known) / 1e6 AS mean_s, MIN(dur) FILTER (WHERE known) / 1e6 AS min_s,
                            MAX(dur) FILTER (WHERE known) / 1e6 AS max_s FROM ep GROUP BY ALL),
               c AS (SELECT *, SUM(episodes) OVER (PARTITION BY tier, measure, outcome ORDER BY bin) AS cum,
                            SUM(episodes) OVER (PARTITION BY tier, measure, outcome) AS n FROM hist),
               q AS (SELECT tier, measure, outcome,
                            MIN(bin) FILTER (WHERE cum >= CEIL(50 * n / 100)) AS b50,
                            MIN(bin) FILTER (WHERE cum >= CEIL(90 * n / 100)) AS b90,
                            MIN(bin) FILTER (WHERE cum >= CEIL(99 * n / 100)) AS b99 FROM c GROUP BY ALL)
          SELECT s.*, {
        ", ".join(
            f"CASE WHEN q.b{p} IS NOT NULL THEN GREATEST(COALESCE((SELECT lo FROM edges "
            f"WHERE edges.b = q.b{p}), 0) / 1e6, min_s) END AS p{p}_s"
            for p in (50, 90, 99)
        )
    }
          FROM s LEFT JOIN q USING (tier, measure, outcome)) TO '{out}/delays.parquet' (FORMAT parquet);
    COPY (SELECT tier, measure, outcome, bin, COALESCE((SELECT lo FROM edges WHERE edges.b = bin), 0) / 1e6 AS lo_s,
                 CASE WHEN bin = 0 THEN 0 ELSE COALESCE((SELECT lo FROM edges WHERE edges.b = bin + 1) / 1e6,
                                                        'inf'::DOUBLE) END AS hi_s, episodes
          FROM hist) TO '{out}/delay_hist.parquet' (FORMAT parquet);
    COPY (SELECT (SELECT COUNT(*) FROM raw) AS rows,
                 (SELECT COUNT(*) FROM raw WHERE e IS NULL OR NOT e BETWEEN 0 AND 10) AS invalid_type_rows,
                 (SELECT COUNT(*) FROM x WHERE last) AS instances,
                 (SELECT COUNT(*) FROM x WHERE pe IS NULL AND e <> 0) AS first_not_submit,
                 (SELECT COUNT(*) FROM x WHERE last AND (p IS NULL OR p < 0)) AS unknown_priority_instances,
                 (SELECT COUNT(*) FROM x WHERE t = 0) AS time_zero_events,
                 (SELECT COUNT(*) FROM x WHERE t = {after}) AS after_trace_events,
                 (SELECT COUNT(*) FROM x WHERE last AND pas) AS present_at_start,
                 (SELECT COUNT(*) FROM x WHERE sy) AS synthesized_events,
                 (SELECT COUNT(*) FROM ep WHERE synth_lost) AS synthesized_duration_episodes,
                 (SELECT COUNT(*) FROM x WHERE pe IS NOT NULL) AS transitions,
                 (SELECT COUNT(*) FROM x WHERE pe IS NOT NULL AND NOT expected) AS unexpected_transitions,
                 (SELECT MAX(t) FILTER (WHERE t < {after}) FROM raw) AS data_end_us
          ) TO '{out}/info.parquet' (FORMAT parquet)"""


def usage_change_sql(ds: Path | str) -> str:
    """usage-change's SQL-expressible subset: pairs of consecutive contiguous windows of an instance
    (LEAD over its windows by start time), by tier (notebook map, the highest priority of the
    earlier window's (collection, instance, machine)): pairs, defined CPU and memory changes and
    those within ±20%."""
    sql = f"""
    WITH ev AS (SELECT collection_id, instance_index, machine_id, MAX(priority) AS p
                FROM read_parquet('{ds}/instance_events/**/*.parquet', hive_partitioning=false)
                WHERE machine_id IS NOT NULL GROUP BY ALL),
         w AS (SELECT collection_id, instance_index, machine_id, end_time, avg_cpu, avg_mem,
                      LEAD(start_time) OVER win AS ns, LEAD(avg_cpu) OVER win AS nc, LEAD(avg_mem) OVER win AS nm
               FROM read_parquet('{ds}/instance_usage/**/*.parquet', hive_partitioning=false)
               WINDOW win AS (PARTITION BY collection_id, instance_index ORDER BY start_time))
    SELECT CASE WHEN p IS NULL OR p < 0 THEN 'unknown' WHEN p < 100 THEN 'free' WHEN p < 116 THEN 'beb'
                WHEN p < 120 THEN 'mid' ELSE 'prod' END AS tier,
           COUNT(*) AS pairs,
           COUNT(*) FILTER (WHERE avg_cpu > 0 AND nc IS NOT NULL) AS cpu_defined,
           COUNT(*) FILTER (WHERE avg_cpu > 0 AND abs(nc / avg_cpu - 1) <= 0.2) AS cpu_within_20,
           COUNT(*) FILTER (WHERE avg_mem > 0 AND nm IS NOT NULL) AS mem_defined,
           COUNT(*) FILTER (WHERE avg_mem > 0 AND abs(nm / avg_mem - 1) <= 0.2) AS mem_within_20
    FROM w LEFT JOIN ev USING (collection_id, instance_index, machine_id)
    WHERE ns IS NOT NULL AND end_time < 9223372036854775807 AND ns <= end_time
    GROUP BY 1"""
    return sql


def usage_change_full_sql(ds: Path | str, out: Path | str, max_gap_s: int = 0) -> str:
    """Every table gpuclust's usage-change writes, as DuckDB statements that write them to ``out``
    as Parquet, from docs/analysis-usage-change.md (not from gpuclust's code): each instance's
    windows in start-time order (ties in the files' row order), a pair where the next window starts
    at most ``max_gap_s`` after the earlier one ends (an end at 2^63-1 starts none), its tier the
    earlier window's key's; per tier (and ``all``) and resource: pairs, unknown, 0 -> 0, 0 -> x,
    defined, the shares within ±5/10/20/50%, the mean change and the ratio ``b / a`` in the log
    bins ``10^(k/100)`` (quantiles: the bin holding the inverted-CDF quantile, as a change);
    ``summary``, ``hist`` and ``info``.  tests/bench/test_cpu_vs_duckdb.py checks it against
    gpuclust's tables."""
    usage = f"read_parquet('{ds}/instance_usage/**/*.parquet', hive_partitioning=false, file_row_number=true)"
    events = f"read_parquet('{ds}/instance_events/**/*.parquet', hive_partitioning=false)"
    after = "9223372036854775807"
    win = "(PARTITION BY collection_id, instance_index ORDER BY start_time, file_index, file_row_number)"
    within = ", ".join(f"CASE WHEN defined > 0 THEN w{h} / defined END AS within_{h}pct" for h in (5, 10, 20, 50))
    quant = ", ".join(
        f"CASE WHEN q.b{p} IS NOT NULL THEN GREATEST(COALESCE((SELECT lo FROM bins WHERE bins.b = q.b{p}), 0) "
        f"- 1, -1) END AS p{p}_change"
        for p in (1, 10, 50, 90, 99)
    )
    return f"""
    CREATE TEMP TABLE tk AS SELECT collection_id, instance_index, machine_id, {_tier_case(ds)} AS tier FROM
        (SELECT collection_id, instance_index, machine_id, MAX(priority) AS p FROM {events}
         WHERE machine_id IS NOT NULL GROUP BY ALL);
    {_RATIO_BINS_TABLE};
    CREATE TEMP TABLE w AS
      SELECT COALESCE(tk.tier, 'unknown') AS tier, end_time, LEAD(start_time) OVER {win} AS ns,
             CAST(avg_cpu AS DOUBLE) AS ca, LEAD(CAST(avg_cpu AS DOUBLE)) OVER {win} AS cb,
             CAST(avg_mem AS DOUBLE) AS ma, LEAD(CAST(avg_mem AS DOUBLE)) OVER {win} AS mb,
             ROW_NUMBER() OVER {win} = 1 AS first
      FROM {usage} LEFT JOIN tk USING (collection_id, instance_index, machine_id);
    CREATE TEMP TABLE g AS
      WITH p AS (SELECT tier, UNNEST([{{'r': 'cpu', 'a': ca, 'b': cb}}, {{'r': 'mem', 'a': ma, 'b': mb}}]) AS s FROM w
                 WHERE ns IS NOT NULL AND end_time <> {after} AND ns - end_time <= {int(max_gap_s) * 1_000_000}),
           k AS (SELECT tier, s.r AS resource,
                        CASE WHEN s.a IS NULL OR s.b IS NULL OR NOT isfinite(s.a) OR NOT isfinite(s.b) THEN 1
                             WHEN s.a = 0 THEN CASE WHEN s.b = 0 THEN 2 ELSE 3 END ELSE 4 END AS kind,
                        s.b / s.a AS ratio FROM p),
           c AS (SELECT *, CASE WHEN kind = 4 THEN {_ratio_bin_guess("ratio")} END AS cand FROM k)
      SELECT tier, resource, kind, CASE WHEN kind = 4 THEN {_ratio_bin("ratio")} END AS bin,
             CASE WHEN kind <> 4 THEN NULL WHEN abs(ratio - 1) <= 0.05 THEN 5 WHEN abs(ratio - 1) <= 0.1 THEN 10
                  WHEN abs(ratio - 1) <= 0.2 THEN 20 WHEN abs(ratio - 1) <= 0.5 THEN 50 ELSE 100 END AS within,
             COUNT(*) AS n, SUM(CASE WHEN kind = 4 THEN ratio - 1 END) AS rs
      FROM c LEFT JOIN bins ON bins.b = c.cand GROUP BY ALL;
    CREATE TEMP TABLE gh AS SELECT COALESCE(tier, 'all') AS tier, resource, bin, SUM(n) AS pairs
      FROM g WHERE kind = 4 GROUP BY GROUPING SETS ((tier, resource, bin), (resource, bin));
    COPY (WITH s AS (SELECT COALESCE(tier, 'all') AS tier, resource, SUM(n) AS pairs,
                            {
        ", ".join(
            f"COALESCE(SUM(n) FILTER (WHERE kind = {k}), 0) AS {f}"
            for k, f in ((1, "unknown"), (2, "zero_to_zero"), (3, "zero_to_positive"), (4, "defined"))
        )
    },
                            {
        ", ".join(f"COALESCE(SUM(n) FILTER (WHERE within <= {h}), 0) AS w{h}" for h in (5, 10, 20, 50))
    },
                            SUM(rs) FILTER (WHERE kind = 4) AS rsum
                     FROM g GROUP BY GROUPING SETS ((tier, resource), (resource))),
               cu AS (SELECT *, SUM(pairs) OVER (PARTITION BY tier, resource ORDER BY bin) AS cum,
                             SUM(pairs) OVER (PARTITION BY tier, resource) AS nd FROM gh),
               q AS (SELECT tier, resource, {
        ", ".join(f"MIN(bin) FILTER (WHERE cum >= CEIL({p} * nd / 100)) AS b{p}" for p in (1, 10, 50, 90, 99))
    }
                     FROM cu GROUP BY ALL)
          SELECT s.tier, s.resource, {
        ", ".join(
            f"CAST({f} AS BIGINT) AS {f}" for f in ("pairs", "unknown", "zero_to_zero", "zero_to_positive", "defined")
        )
    },
                 {within}, CASE WHEN defined > 0 THEN rsum / defined END AS mean_change, {quant}
          FROM s LEFT JOIN q USING (tier, resource)) TO '{out}/summary.parquet' (FORMAT parquet);
    COPY (SELECT tier, resource, bin, CASE WHEN bin = 0 THEN -1 ELSE GREATEST(lo - 1, -1) END AS lo_change,
                 hi - 1 AS hi_change, CAST(pairs AS BIGINT) AS pairs
          FROM gh JOIN bins ON bins.b = gh.bin) TO '{out}/hist.parquet' (FORMAT parquet);
    COPY (SELECT COUNT(*) AS rows, COUNT(*) FILTER (WHERE first) AS instances,
                 COUNT(*) FILTER (WHERE ns IS NOT NULL AND end_time <> {after} AND ns - end_time <= {
        int(max_gap_s) * 1_000_000
    }) AS pairs,
                 COUNT(*) FILTER (WHERE ns IS NOT NULL AND end_time <> {after} AND ns - end_time > {
        int(max_gap_s) * 1_000_000
    }) AS gaps,
                 COUNT(*) FILTER (WHERE ns IS NOT NULL AND end_time = {after}) AS unplaced_ends
          FROM w) TO '{out}/info.parquet' (FORMAT parquet)"""


def data_quality_sql(ds: Path | str) -> str:
    """data-quality's SQL-expressible subset over instance_usage, one row: the windows, NULLs (and
    NaNs) per column (in data-quality's column order), the time and machine sentinels
    (``start_zero``, ``end_after_trace``, ``machine_zero``, ``machine_dedicated``), ``short_windows``
    and ``long_windows`` against data-quality's default ``short_window_s``, ``p100_below_max`` / ``p100_above_max``,
    ``percentiles_non_monotone`` (the plain comparison chain: the benchmark data has no NULL
    levels), ``cpi_mai_present``; then, against each instance's last event (``arg_max(type,
    time)``: the benchmark's event times are distinct per instance), ``no_events_rows`` and
    ``after_end_rows``.  The events table's own checks (ties, out-of-order sequences) and the
    ratio histogram are left out: gpuclust does more than this."""
    import pyarrow as pa

    from gpuclust.analyses.registry import create
    from gpuclust.schema import CPU_PERCENTILE_COLUMNS_SORTED, SCHEMAS, TERMINAL_EVENTS, TIME_AFTER_TRACE

    dq = create("data-quality")
    cols, short_us = dq.columns, int(dq.short_window_s) * 1_000_000
    schema = SCHEMAS["instance_usage"]
    nulls = ", ".join(
        f"COUNT(*) FILTER (WHERE {c} IS NULL{f' OR isnan({c})' if pa.types.is_floating(schema.field(c).type) else ''})"
        for c in cols
    )
    levels = CPU_PERCENTILE_COLUMNS_SORTED
    chain = " AND ".join(f"{a} <= {b}" for a, b in zip(levels, levels[1:], strict=False))
    terminal = ", ".join(str(int(t)) for t in TERMINAL_EVENTS)
    u = f"read_parquet('{ds}/instance_usage/**/*.parquet', hive_partitioning=false)"
    e = f"read_parquet('{ds}/instance_events/**/*.parquet', hive_partitioning=false)"
    sql = f"""
    WITH counts AS (
        SELECT COUNT(*), {nulls},
               COUNT(*) FILTER (WHERE start_time = 0), COUNT(*) FILTER (WHERE end_time = {TIME_AFTER_TRACE}),
               COUNT(*) FILTER (WHERE machine_id = 0), COUNT(*) FILTER (WHERE machine_id = -1),
               COUNT(*) FILTER (WHERE end_time - start_time >= 0 AND end_time - start_time < {short_us}),
               COUNT(*) FILTER (WHERE end_time - start_time > {short_us}),
               COUNT(*) FILTER (WHERE cpu_p100 < max_cpu), COUNT(*) FILTER (WHERE cpu_p100 > max_cpu),
               COUNT(*) FILTER (WHERE NOT ({chain})),
               COUNT(*) FILTER (WHERE isfinite(cpi) AND isfinite(mai))
        FROM {u}),
         last AS (SELECT collection_id, instance_index, arg_max(type, time) AS type, max(time) AS time
                  FROM {e} GROUP BY ALL),
         joined AS (
        SELECT COUNT(*) FILTER (WHERE last.time IS NULL),
               COUNT(*) FILTER (WHERE last.type IN ({terminal}) AND x.start_time >= last.time)
        FROM (SELECT collection_id, instance_index, start_time FROM {u}) x
             LEFT JOIN last USING (collection_id, instance_index))
    SELECT * FROM counts, joined"""
    return sql


#: The checks of data-quality's ``checks`` table (instance_usage) that :func:`data_quality_sql`
#: returns after the windows and the NULLs per column, in its order.
DATA_QUALITY_SQL_CHECKS = (
    "start_zero",
    "end_after_trace",
    "machine_zero",
    "machine_dedicated",
    "short_windows",
    "long_windows",
    "p100_below_max",
    "p100_above_max",
    "percentiles_non_monotone",
    "cpi_mai_present",
    "no_events_rows",
    "after_end_rows",
)


def _duck_type(t: Any) -> str:
    """The DuckDB type of an Arrow type of the canonical schemas."""
    import pyarrow as pa

    if pa.types.is_list(t):
        return _duck_type(t.value_type) + "[]"
    return {
        "int8": "TINYINT",
        "int32": "INTEGER",
        "int64": "BIGINT",
        "float": "FLOAT",
        "double": "DOUBLE",
        "string": "VARCHAR",
        "large_string": "VARCHAR",
        "bool": "BOOLEAN",
    }[str(t)]


def _table_scan(ds: Path | str, table: str) -> str:
    """``table``'s rows with ``r``, a number that orders them in the dataset's row order (the files
    in sorted order, then each file's rows: ``file_index << 40 | file_row_number``, no sort), or an
    empty relation of its schema where the dataset has no file of it."""
    from gpuclust.schema import SCHEMAS

    if any(Path(ds, table).rglob("*.parquet")):
        return (
            f"(SELECT *, (CAST(file_index AS BIGINT) << 40) + file_row_number AS r FROM read_parquet("
            f"'{ds}/{table}/**/*.parquet', hive_partitioning=false, file_row_number=true))"
        )
    cols = ", ".join(f"CAST(NULL AS {_duck_type(f.type)}) AS {f.name}" for f in SCHEMAS[table])
    return f"(SELECT {cols}, CAST(NULL AS BIGINT) AS r WHERE false)"


def data_quality_full_sql(ds: Path | str, out: Path | str, short_window_s: int = 300, row_order: bool = False) -> str:
    """Every table gpuclust's data-quality writes (``checks``, ``columns``, ``codes``,
    ``max_over_p100``, ``info``), as DuckDB statements that write them to ``out`` as Parquet, from
    docs/analysis-data-quality.md (not from gpuclust's code).

    instance_usage's counts in one scan, each window LEFT JOINed to its instance's final terminal
    event (the instance's last event in time order, ties: the later row in the dataset's row order,
    when it is EVICT .. LOST at a finite time): the sentinels, window lengths against ``short_window_s``, NULL, partly
    NULL and non-monotone percentile vectors (NaN is NULL; NULL levels skipped: a level below the
    largest known lower one), p100 against max, the first rule of ``cpi``'s default plausibility
    filter a window with CPI and MAI fails (CPU time, CPI in (0, 100], MAI in [0, 1]), windows of
    instances without events, at or after the final terminal event (and 300 s after), running past
    it, NULLs (and NaNs) per column; its instances (with the per-instance counts) and ``max_cpu /
    cpu_p100`` (windows with both and ``cpu_p100 > 0``) in 20 bins per decade from 10^-4 to 10^4
    (quantiles: the lower edge of the bin holding the inverted-CDF quantile) in two narrow scans.  Each events table (instance, collection, machine): per instance (collection,
    machine) in time order (ties: row order) the ties and the events the v3 state diagram
    (machines: ADD / REMOVE / UPDATE) does not allow after the one before them (an event of a type
    outside 0..10, or after one, is not flagged), with ``row_order`` the events earlier than the
    previous row of their instance, the sentinels, NULL capacities, instances without usage; NULLs
    per column and rows per code (-1 NULL, -2 outside 0..10).  A table without rows gets no rows
    in ``checks``, ``columns`` and ``codes``.  tests/bench/test_cpu_vs_duckdb.py checks it against
    gpuclust's tables."""
    import pyarrow as pa

    from gpuclust.schema import (
        CPU_PERCENTILE_COLUMNS_SORTED,
        SCHEMAS,
        EventType,
        MachineEventType,
        MissingDataReason,
        MissingType,
    )

    after = "9223372036854775807"
    short_us = int(short_window_s) * 1_000_000
    # table -> (the one-row table of its counts, its key, the key's unit, its code columns and their enums)
    tables: dict[str, tuple[str, str, str, tuple[tuple[str, Any], ...]]] = {
        "instance_usage": ("us", "collection_id, instance_index", "instances", ()),
        "instance_events": (
            "ie",
            "collection_id, instance_index",
            "instances",
            (("type", EventType), ("missing_type", MissingType)),
        ),
        "collection_events": (
            "ce",
            "collection_id",
            "collections",
            (("type", EventType), ("missing_type", MissingType)),
        ),
        "machine_events": (
            "me",
            "machine_id",
            "machines",
            (("type", MachineEventType), ("missing_data_reason", MissingDataReason)),
        ),
    }

    def nan(x: str) -> str:  # isnan(x), but DuckDB 2.0 folds isnan() to false from Parquet min/max (they skip NaN)
        return f"(NOT isfinite({x}) AND NOT isinf({x}))"

    def n_if(cond: str) -> str:  # count_if, not COUNT(*) FILTER: a filter copies the aggregate's wide input
        return f"COALESCE(count_if({cond}), 0)"

    def nulls(table: str, where: dict[str, str] | None = None) -> str:
        """NULLs per column (a float's NaN is NULL too), as n_<column>; NaNs are looked for only
        where ``where`` (column -> condition) says they may be."""

        def nans(c: str) -> str:
            return " + " + n_if(f"{where[c]} AND {nan(c)}" if where and c in where else nan(c))

        return ", ".join(
            f"COUNT(*) - COUNT({f.name})" + (nans(f.name) if pa.types.is_floating(f.type) else "") + f" AS n_{f.name}"
            for f in SCHEMAS[table]
        )

    def code(c: str) -> str:
        return f"CASE WHEN {c} IS NULL THEN -1 WHEN {c} BETWEEN 0 AND 10 THEN {c} ELSE -2 END"

    # -- instance_usage: one scan of its 38 columns for the counts, each window joined to its ---
    # instance's final terminal event; the instances (3 columns) and the max / p100 bins (2) in
    # scans of their own: cheaper, at 1e6 windows, than grouping the 38-column pass by instance
    # or by bin, or a histogram() aggregate in it
    usage = _table_scan(ds, "instance_usage")
    raw = list(CPU_PERCENTILE_COLUMNS_SORTED)  # the levels, ascending
    allf = " AND ".join(f"isfinite({c})" for c in raw)  # the usual window: every level known and finite
    missing = " + ".join(f"CAST(COALESCE({nan(c)}, true) AS INT)" for c in raw)
    known = [f"(CASE WHEN NOT {nan(c)} THEN {c} END)" for c in raw]  # NaN is NULL
    # some level below the last known lower one (a descent of the known values, NULLs skipped);
    # with every level finite, the plain comparison chain
    chain = " AND ".join(f"{a} <= {b}" for a, b in zip(raw, raw[1:], strict=False))
    skip = " OR ".join(f"{q} < coalesce({', '.join(reversed(known[:j]))})" for j, q in enumerate(known) if j > 0)
    finite = f"start_time <> {after} AND end_time <> {after}"
    length = "end_time - start_time"
    cpu_ok = f"(NOT {nan('cpu_s')} AND cpu_s > 0 AND cpu_s >= 0.01)"
    usage_checks = [  # (check, condition, denominator)
        ("start_zero", "start_time = 0", "rows"),
        ("start_after_trace", f"start_time = {after}", "rows"),
        ("end_zero", "end_time = 0", "rows"),
        ("end_after_trace", f"end_time = {after}", "rows"),
        ("machine_zero", "machine_id = 0", "rows"),
        ("machine_dedicated", "machine_id = -1", "rows"),
        ("end_before_start", f"{finite} AND end_time < start_time", "rows"),
        ("zero_length", f"{finite} AND end_time = start_time", "rows"),
        ("short_windows", f"{finite} AND {length} >= 0 AND {length} < {short_us}", "rows"),
        ("long_windows", f"{finite} AND {length} > {short_us}", "rows"),
        ("percentiles_null", f"nmiss = {len(raw)}", "rows"),
        ("percentiles_partly_null", f"nmiss > 0 AND nmiss < {len(raw)}", "rows"),
        ("percentiles_non_monotone", "nonmono", "rows"),
        ("p100_and_max", "pm", "rows"),
        ("p100_below_max", "pm AND cpu_p100 < max_cpu", "p100_and_max"),
        ("p100_above_max", "pm AND cpu_p100 > max_cpu", "p100_and_max"),
        ("cpi_mai_present", "cf IS NOT NULL", "rows"),
        ("cpi_mai_low_cpu_time", "cf = 1", "rows"),
        ("cpi_out_of_range", "cf = 2", "rows"),
        ("mai_out_of_range", "cf = 3", "rows"),
        ("no_events_rows", "no_ev", "rows"),
        ("no_events_instances", None, "instances"),
        ("after_end_rows", "start_time >= tt", "rows"),
        ("after_end_300s_rows", "start_time - tt >= 300000000", "rows"),
        ("after_end_instances", None, "instances"),
        ("past_end_rows", "start_time < tt AND end_time > tt", "rows"),
    ]
    usage_stmt = f"""
    CREATE TEMP TABLE us AS
      WITH x AS (SELECT u.*, ei.c IS NULL AS no_ev, ei.tt, COALESCE({allf}, false) AS allf,
                        CASE WHEN {finite} THEN CAST(avg_cpu AS DOUBLE) * CAST({length} AS DOUBLE) / 1e6 END AS cpu_s,
                        COALESCE(NOT {nan("cpu_p100")} AND NOT {nan("max_cpu")}, false) AS pm
                 FROM {usage} u LEFT JOIN ei ON u.collection_id = ei.c AND u.instance_index = ei.i),
           y AS (SELECT *, CASE WHEN allf THEN 0 ELSE {missing} END AS nmiss,
                        CASE WHEN allf THEN NOT ({chain}) ELSE {skip} END AS nonmono,
                        CASE WHEN COALESCE(isfinite(cpi) AND isfinite(mai), false) THEN
                             CASE WHEN NOT COALESCE({cpu_ok}, false) THEN 1 WHEN NOT (cpi > 0 AND cpi <= 100) THEN 2
                                  WHEN NOT (mai >= 0 AND mai <= 1) THEN 3 ELSE 0 END END AS cf
                 FROM x)
      SELECT COUNT(*) AS rows, {", ".join(f"{n_if(w)} AS {c}" for c, w, _ in usage_checks if w)},
             {nulls("instance_usage", dict.fromkeys(raw, "NOT allf"))}
      FROM y"""
    # bin b >= 1 holds [10^((b-81)/20), 10^((b-80)/20)), bin 0 what is below 10^-4, bin 161 from 10^4 on
    edge = "pow(10.0, ({} - 81) / 20.0)"
    guess = "CAST(LEAST(GREATEST(floor(20 * log10(ratio)) + 81, 0), 161) AS INT)"
    instances_stmt = f"""
    CREATE TEMP TABLE ui AS
      SELECT COUNT(*) AS instances, {n_if("no_ev")} AS no_events_instances, {n_if("ae")} AS after_end_instances
      FROM (SELECT bool_or(ei.c IS NULL) AS no_ev, bool_or(start_time >= ei.tt) AS ae
            FROM (SELECT collection_id, instance_index, start_time FROM {usage}) u
            LEFT JOIN ei ON u.collection_id = ei.c AND u.instance_index = ei.i
            GROUP BY u.collection_id, u.instance_index);
    CREATE TEMP TABLE hist AS
      WITH x AS (SELECT CASE WHEN cpu_p100 > 0 AND NOT {nan("cpu_p100")} AND NOT {nan("max_cpu")}
                             THEN CAST(max_cpu AS DOUBLE) / CAST(cpu_p100 AS DOUBLE) END AS ratio
                 FROM (SELECT max_cpu, cpu_p100 FROM {usage})),
           y AS (SELECT ratio, CASE WHEN ratio > 0 THEN {guess} WHEN ratio IS NOT NULL THEN 0 END AS g FROM x)
      SELECT CAST(CASE WHEN g > 0 AND ratio < {edge.format("g")} THEN g - 1
                       WHEN g < 161 AND ratio >= {edge.format("g + 1")} THEN g + 1 ELSE g END AS BIGINT) AS bin,
             COUNT(*) AS windows
      FROM y WHERE g IS NOT NULL GROUP BY bin"""

    # -- the events tables: each key's events in time order (ties: row order) --------------------
    stmts = []
    ev_checks: dict[str, list[tuple[str, str]]] = {}  # table -> [(check, unit)], in gpuclust's order
    for table in ("instance_events", "collection_events", "machine_events"):
        n, key, unit, codes = tables[table]
        if table == "machine_events":
            bad = "(pe IN (1, 3) AND e = 1) OR (pe = 2 AND e IN (2, 3))"
        else:  # the v3 state diagram: pending -> ...; running -> ...; dead -> SUBMIT
            bad = (
                "pe BETWEEN 0 AND 10 AND e BETWEEN 0 AND 10 AND NOT CASE WHEN pe IN (0, 1, 2, 9) "
                "THEN e IN (1, 2, 3, 9, 5, 7, 8) WHEN pe IN (3, 10) THEN e IN (10, 4, 5, 6, 7, 8) ELSE e = 0 END"
            )
        per_row = [("time_zero", "t = 0"), ("time_after_trace", f"t = {after}")]
        if table != "collection_events":
            per_row += [("machine_zero", "machine_id = 0"), ("machine_dedicated", "machine_id = -1")]
        per_row += [("time_ties", "t = pt"), ("out_of_order", bad)]
        if table == "machine_events":
            per_row.append(("null_capacity_rows", "nc"))
        if row_order:
            per_row.append(("time_backwards", "t < rt"))
        stmts.append(f"""
    CREATE TEMP TABLE {n}_k AS
      WITH s AS (SELECT {key}, time AS t, type AS e, {"machine_id, " if table == "instance_events" else ""}
                        {f"COALESCE({nan('cap_cpu')} OR {nan('cap_mem')}, true) AS nc, " if table == "machine_events" else ""}
                        LAG(time) OVER w AS pt, LAG(type) OVER w AS pe, LEAD(r) OVER w IS NULL AS last
                        {f", LAG(time) OVER (PARTITION BY {key} ORDER BY r) AS rt" if row_order else ""}
                 FROM {_table_scan(ds, table)} WINDOW w AS (PARTITION BY {key} ORDER BY time, r))
      SELECT {key}, COUNT(*) AS rows, {", ".join(f"{n_if(w)} AS {c}" for c, w in per_row)}
             {f", MAX(t) FILTER (WHERE last AND e BETWEEN 4 AND 8 AND t <> {after}) AS tt" if n == "ie" else ""}
      FROM s GROUP BY ALL""")
        per_key = [("out_of_order", f"out_of_order_{unit}", "out_of_order > 0")]
        if table == "machine_events":
            per_key += [
                ("null_capacity_rows", "null_capacity_machines", "null_capacity_rows > 0"),
                ("null_capacity_rows", "never_capacity_machines", "null_capacity_rows = rows"),
            ]
        if row_order:
            per_key.append(("time_backwards", f"time_backwards_{unit}", "time_backwards > 0"))
        stmts.append(f"""
    CREATE TEMP TABLE {n}_s AS
      SELECT COUNT(*) AS {unit}, {", ".join(f"COALESCE(SUM({c}), 0) AS {c}" for c, _ in per_row)},
             {", ".join(f"{n_if(w)} AS {c}" for _, c, w in per_key)}
      FROM {n}_k""")
        # each instance (collection, machine) count right after the row count it is about
        ev_checks[table] = [x for c, _ in per_row for x in [(c, "rows"), *((k, unit) for b, k, _ in per_key if b == c)]]
        stmts.append(f"""
    CREATE TEMP TABLE {n}_n AS
      SELECT COUNT(*) AS rows, {nulls(table)}, {", ".join(f"histogram({code(c)}) AS h_{c}" for c, _ in codes)}
      FROM {_table_scan(ds, table)}""")
    # the instances' final terminal events, then the usage scan that joins them
    stmts.append("CREATE TEMP TABLE ei AS SELECT collection_id AS c, instance_index AS i, tt FROM ie_k")
    stmts += [instances_stmt, usage_stmt]

    # -- checks ----------------------------------------------------------------------------------
    def u(c: str) -> str:  # a usage count: the instance counts come from ui
        return f"ui.{c}" if c.endswith("instances") else f"us.{c}"

    entries = [
        ("instance_usage", "rows", "us.rows", "rows", "us.rows", "us.rows > 0"),
        ("instance_usage", "instances", "ui.instances", "instances", "ui.instances", "us.rows > 0"),
    ]
    entries += [
        ("instance_usage", c, u(c), "instances" if of == "instances" else "rows", u(of), "us.rows > 0")
        for c, _, of in usage_checks
    ]
    for table in ("instance_events", "collection_events", "machine_events"):
        n, _, unit, _ = tables[table]
        keep = f"{n}_n.rows > 0"
        entries += [
            (table, "rows", f"{n}_n.rows", "rows", f"{n}_n.rows", keep),
            (table, unit, f"{n}_s.{unit}", unit, f"{n}_s.{unit}", keep),
        ]
        entries += [
            (table, c, f"{n}_s.{c}", cu, f"{n}_s.{unit}" if cu == unit else f"{n}_n.rows", keep)
            for c, cu in ev_checks[table]
        ]
        if table == "instance_events":  # instances with events less those the windows matched; with usage only
            entries.append(
                (
                    table,
                    "instances_without_usage",
                    "ie_s.instances - (ui.instances - ui.no_events_instances)",
                    "instances",
                    "ie_s.instances",
                    "ie_n.rows > 0 AND us.rows > 0",
                )
            )
    structs = ", ".join(
        f"{{'o': {k}, 't': '{t}', 'c': '{c}', 'n': CAST({cnt} AS BIGINT), 'u': '{cu}', "
        f"'of': CAST({of} AS BIGINT), 'keep': {keep}}}"
        for k, (t, c, cnt, cu, of, keep) in enumerate(entries)
    )
    one_row = "us, ui, ie_s, ie_n, ce_s, ce_n, me_s, me_n"
    stmts.append(f"""
    COPY (SELECT e.t AS "table", e.c AS "check", e.n AS count, e.u AS unit, e.of AS of,
                 CASE WHEN e.of = 0 THEN 'NaN'::DOUBLE ELSE e.n / e.of END AS share
          FROM (SELECT UNNEST([{structs}]) AS e FROM {one_row}) WHERE e.keep ORDER BY e.o)
      TO '{out}/checks.parquet' (FORMAT parquet)""")

    # -- columns ---------------------------------------------------------------------------------
    cols = []
    for table, (n, _, _, _) in tables.items():
        src = "us" if table == "instance_usage" else f"{n}_n"
        cols += [(table, f.name, f"{src}.rows", f"{src}.n_{f.name}") for f in SCHEMAS[table]]
    structs = ", ".join(
        f"{{'o': {k}, 't': '{t}', 'c': '{c}', 'rows': CAST({r} AS BIGINT), 'nulls': CAST({x} AS BIGINT)}}"
        for k, (t, c, r, x) in enumerate(cols)
    )
    stmts.append(f"""
    COPY (SELECT e.t AS "table", e.c AS "column", e.rows AS rows, e.nulls AS nulls
          FROM (SELECT UNNEST([{structs}]) AS e FROM {one_row}) WHERE e.rows > 0 ORDER BY e.o)
      TO '{out}/columns.parquet' (FORMAT parquet)""")

    # -- codes -----------------------------------------------------------------------------------
    parts = []
    k = 0
    for table, (n, _, _, codes) in tables.items():
        for col, enum in codes:
            name = (
                "CASE code WHEN -1 THEN 'NULL' WHEN -2 THEN 'other' "
                + " ".join(f"WHEN {int(v)} THEN '{v.name}'" for v in enum)
                + " ELSE 'unknown' END"
            )
            parts.append(
                f"SELECT {k} AS o, '{table}' AS \"table\", '{col}' AS \"column\", code, {name} AS name, rows FROM "
                f"(SELECT CAST(UNNEST(map_keys(h_{col})) AS BIGINT) AS code, "
                f"CAST(UNNEST(map_values(h_{col})) AS BIGINT) AS rows FROM {n}_n)"
            )
            k += 1
    stmts.append(f"""
    COPY (SELECT "table", "column", code, name, rows FROM ({" UNION ALL ".join(parts)})
          ORDER BY o, code < 0, code) TO '{out}/codes.parquet' (FORMAT parquet)""")

    # -- max_over_p100 and info ------------------------------------------------------------------
    lo = f"CASE WHEN bin = 0 THEN 0.0 ELSE {edge.format('bin')} END"
    stmts.append(f"""
    COPY (SELECT bin, {lo} AS lo_ratio, CASE WHEN bin = 161 THEN 'inf'::DOUBLE ELSE {edge.format("bin + 1")} END AS hi_ratio,
                 windows FROM hist ORDER BY bin) TO '{out}/max_over_p100.parquet' (FORMAT parquet)""")
    quant = ", ".join(
        f"(SELECT {lo} FROM (SELECT MIN(bin) FILTER (WHERE cum >= CEIL({p} * n / 100)) AS bin FROM c)) "
        f"AS max_over_p100_p{p}"
        for p in (50, 90, 99)
    )
    stmts.append(f"""
    COPY (WITH c AS (SELECT bin, SUM(windows) OVER (ORDER BY bin) AS cum, SUM(windows) OVER () AS n FROM hist)
          SELECT 'data-quality' AS analysis, CAST({int(short_window_s)} AS BIGINT) AS short_window_s,
                 {
        ", ".join(
            f"(SELECT CAST(rows AS BIGINT) FROM {'us' if t == 'instance_usage' else n + '_n'}) AS {t}_rows"
            for t, (n, _, _, _) in tables.items()
        )
    }, {quant})
      TO '{out}/info.parquet' (FORMAT parquet)""")
    return ";\n".join(stmts)


def job_usage_sql(ds: Path | str) -> str:
    """job-usage's SQL-expressible subset: per JOB collection its NCU-hours and NMU-hours, then over
    all collections with positive CPU: count, total, mean, variance, quantiles, max and the top-1%
    share (tiers left out)."""
    sql = f"""
    WITH j AS (SELECT collection_id,
                      SUM(COALESCE(avg_cpu, 0) * (end_time - start_time) / 3.6e9) AS ncu,
                      SUM(COALESCE(avg_mem, 0) * (end_time - start_time) / 3.6e9) AS nmu
               FROM read_parquet('{ds}/instance_usage/**/*.parquet', hive_partitioning=false)
               WHERE collection_type = 0 AND end_time > start_time AND end_time < 9223372036854775807
               GROUP BY collection_id),
         r AS (SELECT ncu, ROW_NUMBER() OVER (ORDER BY ncu DESC) AS k, COUNT(*) OVER () AS n FROM j WHERE ncu > 0)
    SELECT COUNT(*), SUM(ncu), AVG(ncu), VAR_POP(ncu), QUANTILE_CONT(ncu, [0.5, 0.9, 0.99, 0.999]), MAX(ncu),
           SUM(ncu) FILTER (WHERE k <= GREATEST(1, CEIL(0.01 * n))) / SUM(ncu)
    FROM r"""
    return sql


def job_usage_tiers_sql(ds: Path | str) -> str:
    """job-usage as gpuclust computes it, tiers included: per JOB collection its NCU-hours,
    NMU-hours, windows and tier (the tier of the MAX priority of the events of its
    ``(collection_id, instance_index, machine_id)`` keys that have usage rows, by the dataset's tier
    map), then per tier and over all: count, total, mean, population variance, quantiles, max and
    the top-1% share of the collections with positive CPU."""
    tier = _tier_case(ds)
    sql = f"""
    WITH u AS (SELECT collection_id, instance_index, machine_id, avg_cpu, avg_mem, start_time, end_time
               FROM read_parquet('{ds}/instance_usage/**/*.parquet', hive_partitioning=false)
               WHERE collection_type = 0 AND end_time > start_time AND end_time < 9223372036854775807),
         e AS (SELECT collection_id, instance_index, machine_id, MAX(priority) AS p
               FROM read_parquet('{ds}/instance_events/**/*.parquet', hive_partitioning=false)
               WHERE machine_id IS NOT NULL GROUP BY ALL),
         k AS (SELECT collection_id, instance_index, machine_id,
                      SUM(COALESCE(CAST(avg_cpu AS DOUBLE), 0) * CAST(end_time - start_time AS DOUBLE) / 3.6e9) AS ncu,
                      SUM(COALESCE(CAST(avg_mem AS DOUBLE), 0) * CAST(end_time - start_time AS DOUBLE) / 3.6e9) AS nmu,
                      COUNT(*) AS n
               FROM u GROUP BY ALL),
         j AS (SELECT k.collection_id, SUM(ncu) AS ncu, SUM(nmu) AS nmu, SUM(n) AS n, MAX(e.p) AS p
               FROM k LEFT JOIN e USING (collection_id, instance_index, machine_id) GROUP BY 1),
         t AS (SELECT ncu, {tier} AS tier FROM j WHERE ncu > 0),
         r AS (SELECT ncu, tier, ROW_NUMBER() OVER (PARTITION BY tier ORDER BY ncu DESC) AS k,
                      COUNT(*) OVER (PARTITION BY tier) AS n, ROW_NUMBER() OVER (ORDER BY ncu DESC) AS ka,
                      COUNT(*) OVER () AS na FROM t)
    SELECT tier, COUNT(*), SUM(ncu), AVG(ncu), VAR_POP(ncu), QUANTILE_CONT(ncu, [0.5, 0.9, 0.99, 0.999]), MAX(ncu),
           CASE WHEN GROUPING(tier) = 1 THEN SUM(ncu) FILTER (WHERE ka <= GREATEST(1, CEIL(0.01 * na)))
                ELSE SUM(ncu) FILTER (WHERE k <= GREATEST(1, CEIL(0.01 * n))) END / SUM(ncu)
    FROM r GROUP BY ROLLUP (tier) ORDER BY tier NULLS LAST"""
    return sql


def _tier_case(ds: Path | str) -> str:
    """The dataset's tier map (its manifest's, else the trace's default) as a SQL CASE over ``p``
    (the highest priority; NULL, negative or below every tier: ``'unknown'``)."""
    from gpuclust.analyses.base import resolve_tier_map
    from gpuclust.dataset import Dataset

    tm = resolve_tier_map(None, Dataset(ds))
    return (
        "CASE "
        + " ".join(
            f"WHEN p >= {lo} THEN '{name}'" for name, lo in reversed(list(zip(tm.names, tm.bounds, strict=True)))
        )
        + " ELSE 'unknown' END"
    )


def job_usage_full_sql(ds: Path | str, out: Path | str, tail: float = 0.1) -> str:
    """Every table gpuclust's job-usage writes (rows=jobs), as DuckDB statements that write them to
    ``out`` as Parquet: ``jobs`` (per JOB collection: tier, NCU-hours, NMU-hours, windows, by
    NCU-hours descending then collection_id), ``stats`` (per tier and ``all``, CPU and memory:
    count, zero jobs, total, mean, population variance, quantiles, max, top 1% and 0.1% shares,
    squared coefficient of variation and the Pareto fit of the CCDF tail: least squares of
    ``log10(rank / n)`` on ``log10(x)`` over the largest ``ceil(tail x n)``, at least 2),
    ``correlation`` (Pearson r of NCU- and NMU-hours and of their logarithms, collections with
    both positive) and ``info`` (the row counts).  Written from docs/analysis-job-usage.md, not
    from gpuclust's code; tests/bench/test_cpu_vs_duckdb.py checks it against gpuclust's tables."""
    usage = f"read_parquet('{ds}/instance_usage/**/*.parquet', hive_partitioning=false)"
    events = f"read_parquet('{ds}/instance_events/**/*.parquet', hive_partitioning=false)"
    keep = "collection_type = 0 AND end_time > start_time AND end_time < 9223372036854775807"

    def hours(col: str) -> str:  # NULL, NaN or infinite averages add nothing
        return (
            f"CASE WHEN isfinite({col}) THEN CAST({col} AS DOUBLE) * CAST(end_time - start_time AS DOUBLE) / 3.6e9 "
            f"ELSE 0 END"
        )

    def stats(x: str, res: str) -> str:
        top = (
            "CASE WHEN GROUPING(tier) = 1 THEN SUM({x}) FILTER (WHERE ka <= GREATEST(1, CEIL({s} * na))) "
            "ELSE SUM({x}) FILTER (WHERE k <= GREATEST(1, CEIL({s} * n))) END / SUM({x})"
        )
        fit = (
            "CASE WHEN GROUPING(tier) = 1 THEN {f}(log10(ka / na), log10({x})) FILTER (WHERE ka <= LEAST(na, "
            "GREATEST(2, CEIL({tail} * na)))) ELSE {f}(log10(k / n), log10({x})) FILTER (WHERE k <= LEAST(n, "
            "GREATEST(2, CEIL({tail} * n)))) END"
        )
        return f"""
        SELECT COALESCE(tier, 'all') AS tier, '{res}' AS resource, COUNT(*) AS jobs, SUM({x}) AS total_hours,
               AVG({x}) AS mean, VAR_POP({x}) AS variance, QUANTILE_CONT({x}, [0.5, 0.9, 0.99, 0.999]) AS q,
               MAX({x}) AS max, {top.format(x=x, s=0.01)} AS top1pct_share, {top.format(x=x, s=0.001)} AS top01pct_share,
               VAR_POP({x}) / AVG({x}) ^ 2 AS scv,
               CAST(CASE WHEN GROUPING(tier) = 1 THEN LEAST(MAX(na), GREATEST(2, CEIL({tail} * MAX(na))))
                         ELSE LEAST(MAX(n), GREATEST(2, CEIL({tail} * MAX(n)))) END AS DOUBLE) AS tail_jobs,
               -{fit.format(f="REGR_SLOPE", x=x, tail=tail)} AS pareto_alpha, {fit.format(f="REGR_R2", x=x, tail=tail)} AS pareto_r2
        FROM (SELECT tier, {x}, ROW_NUMBER() OVER (PARTITION BY tier ORDER BY {x} DESC) AS k,
                     COUNT(*) OVER (PARTITION BY tier) AS n, ROW_NUMBER() OVER (ORDER BY {x} DESC) AS ka,
                     COUNT(*) OVER () AS na FROM j WHERE {x} > 0)
        GROUP BY ROLLUP (tier)"""

    return f"""
    CREATE TEMP TABLE j AS
      WITH k AS (SELECT collection_id, instance_index, machine_id, SUM({hours("avg_cpu")}) AS ncu,
                        SUM({hours("avg_mem")}) AS nmu, COUNT(*) AS n
                 FROM {usage} WHERE {keep} GROUP BY ALL),
           e AS (SELECT collection_id, instance_index, machine_id, MAX(priority) AS p
                 FROM {events} WHERE machine_id IS NOT NULL GROUP BY ALL),
           c AS (SELECT k.collection_id, SUM(ncu) AS ncu, SUM(nmu) AS nmu, CAST(SUM(n) AS BIGINT) AS windows,
                        MAX(e.p) AS p
                 FROM k LEFT JOIN e USING (collection_id, instance_index, machine_id) GROUP BY 1)
      SELECT collection_id, {_tier_case(ds)} AS tier, ncu, nmu, windows FROM c;
    COPY (SELECT collection_id, tier, ncu AS ncu_hours, nmu AS nmu_hours, windows FROM j
          ORDER BY ncu DESC, collection_id) TO '{out}/jobs.parquet' (FORMAT parquet);
    COPY (SELECT s.tier, s.resource, s.jobs, COALESCE(z.zero_jobs, 0) AS zero_jobs, total_hours, mean, variance,
                 q[1] AS median, q[2] AS p90, q[3] AS p99, q[4] AS p999, max, top1pct_share, top01pct_share, scv,
                 tail_jobs, pareto_alpha, pareto_r2
          FROM ({stats("ncu", "cpu")} UNION ALL {stats("nmu", "mem")}) s
          LEFT JOIN (SELECT COALESCE(tier, 'all') AS tier, r.resource, COUNT(*) AS zero_jobs
                     FROM (SELECT tier, 'cpu' AS resource FROM j WHERE NOT ncu > 0
                           UNION ALL SELECT tier, 'mem' FROM j WHERE NOT nmu > 0) r
                     GROUP BY GROUPING SETS ((tier, resource), (resource))) z USING (tier, resource)
          ) TO '{out}/stats.parquet' (FORMAT parquet);
    COPY (SELECT COALESCE(tier, 'all') AS tier, COUNT(*) AS jobs, CORR(ncu, nmu) AS pearson_r,
                 CORR(log10(ncu), log10(nmu)) AS log_pearson_r
          FROM j WHERE ncu > 0 AND nmu > 0 GROUP BY ROLLUP (tier)) TO '{out}/correlation.parquet' (FORMAT parquet);
    COPY (SELECT COUNT(*) AS rows, COUNT(*) FILTER (WHERE {keep}) AS used_rows,
                 COUNT(*) FILTER (WHERE {keep} AND NOT COALESCE(isfinite(avg_cpu), false)) AS unknown_cpu_rows,
                 COUNT(*) FILTER (WHERE {keep} AND NOT COALESCE(isfinite(avg_mem), false)) AS unknown_mem_rows,
                 COUNT(*) FILTER (WHERE collection_type = 0 AND NOT ({keep})) AS bad_duration_rows
          FROM {usage}) TO '{out}/info.parquet' (FORMAT parquet)"""


def usage_vs_request_sql(ds: Path | str) -> str:
    """usage-vs-request's SQL-expressible subset: each window ASOF-joined to its instance's latest
    event with a positive CPU request at or before its start; windows, those with a limit, the mean
    average-CPU / limit and the count above the limit (one measure, no tiers)."""
    sql = f"""
    WITH ev AS (SELECT collection_id, instance_index, time, req_cpu
                FROM read_parquet('{ds}/instance_events/**/*.parquet', hive_partitioning=false) WHERE req_cpu > 0),
         u AS (SELECT collection_id, instance_index, start_time, avg_cpu
               FROM read_parquet('{ds}/instance_usage/**/*.parquet', hive_partitioning=false))
    SELECT COUNT(*), COUNT(ev.req_cpu), AVG(u.avg_cpu / ev.req_cpu), COUNT(*) FILTER (WHERE u.avg_cpu > ev.req_cpu)
    FROM u ASOF LEFT JOIN ev ON u.collection_id = ev.collection_id AND u.instance_index = ev.instance_index
                             AND u.start_time >= ev.time"""
    return sql


#: The ratio bins of usage-change and usage-vs-request (docs/analysis-usage-change.md): lower
#: edges 10^(k/100), k = -600..600, of bins 1, 2, ...; bin 0 below 10^-6 (zero included), the last
#: from 10^6 on.  A table ``bins(b, lo, hi)`` (bin 0: lo -inf; the last: hi inf).
_RATIO_EDGES_SQL = [10.0 ** (k / 100) for k in range(-600, 601)]
_RATIO_BINS_TABLE = f"""CREATE TEMP TABLE bins AS SELECT b, CASE WHEN b = 0 THEN '-inf'::DOUBLE ELSE e[b] END AS lo,
        CASE WHEN b = {len(_RATIO_EDGES_SQL)} THEN 'inf'::DOUBLE ELSE e[b + 1] END AS hi
        FROM (SELECT UNNEST(range({len(_RATIO_EDGES_SQL) + 1})) AS b, {_RATIO_EDGES_SQL}::DOUBLE[] AS e)"""


def _ratio_bin_guess(x: str) -> str:
    """The bin of a ratio ``x`` from its logarithm: right or one off where rounding puts ``x``
    near an edge (:func:`_ratio_bin` corrects it against the exact edges)."""
    return (
        f"CAST(LEAST(GREATEST(CASE WHEN {x} > 0 THEN floor(100 * log10({x})) + 601 ELSE 0 END, 0), "
        f"{len(_RATIO_EDGES_SQL)}) AS INT)"
    )


def _ratio_bin(x: str) -> str:
    """The exact bin of ``x`` (the number of edges at or below it), given ``cand`` (its
    :func:`_ratio_bin_guess`) joined to ``bins`` on ``bins.b = cand``."""
    return f"CASE WHEN {x} < bins.lo THEN cand - 1 WHEN {x} >= bins.hi THEN cand + 1 ELSE cand END"


def usage_vs_request_full_sql(ds: Path | str, out: Path | str) -> str:
    """Every table gpuclust's usage-vs-request writes, as DuckDB statements that write them to
    ``out`` as Parquet, from docs/analysis-usage-vs-request.md (not from gpuclust's code): each
    window ASOF-joined, per resource, to the latest event of its instance at or before its start
    with a positive request (ties: the last in the files' row order), its tier from the highest
    priority of its (collection, instance, machine) key's events; per tier (and ``all``) and
    measure (average and maximum CPU and memory over the limit): windows, no limit, unknown usage,
    defined, above the limit, at most half of it, the shares and mean ratio, and the ratios counted
    in the log bins ``10^(k/100)``, k = -600..600 (quantiles: the lower edge of the bin holding the
    inverted-CDF quantile); ``summary``, ``hist`` and ``info``.
    tests/bench/test_cpu_vs_duckdb.py checks it against gpuclust's tables."""
    usage = f"read_parquet('{ds}/instance_usage/**/*.parquet', hive_partitioning=false)"
    events = f"read_parquet('{ds}/instance_events/**/*.parquet', hive_partitioning=false, file_row_number=true)"
    measures = (
        ("cpu_avg", "avg_cpu", "lc"),
        ("cpu_max", "max_cpu", "lc"),
        ("mem_avg", "avg_mem", "lm"),
        ("mem_max", "max_mem", "lm"),
    )

    def latest(req: str) -> str:  # the latest positive request at or before each event
        return f"LAST_VALUE(CASE WHEN {req} > 0 AND NOT isnan({req}) THEN {req} END IGNORE NULLS) OVER w"

    rows = ", ".join(
        f"{{'m': '{m}', 'x': CAST({col} AS DOUBLE), 'l': CAST(lim.{lim} AS DOUBLE)}}" for m, col, lim in measures
    )
    quant = ", ".join(
        f"CASE WHEN q.b{p} IS NOT NULL THEN COALESCE((SELECT lo FROM bins WHERE bins.b = q.b{p}), 0) END AS p{p}_ratio"
        for p in (10, 50, 90, 99)
    )
    return f"""
    CREATE TEMP TABLE ev AS SELECT collection_id AS c, instance_index AS i, machine_id AS m, time, priority, req_cpu,
        req_mem, ROW_NUMBER() OVER (ORDER BY file_index, file_row_number) AS r FROM {events};
    CREATE TEMP TABLE lim AS SELECT c, i, time, {latest("req_cpu")} AS lc, {latest("req_mem")} AS lm FROM ev
        WINDOW w AS (PARTITION BY c, i ORDER BY time, r ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW)
        QUALIFY ROW_NUMBER() OVER (PARTITION BY c, i, time ORDER BY r DESC) = 1;
    CREATE TEMP TABLE tk AS SELECT c, i, m, {_tier_case(ds)} AS tier FROM
        (SELECT c, i, m, MAX(priority) AS p FROM ev WHERE m IS NOT NULL GROUP BY ALL);
    {_RATIO_BINS_TABLE};
    CREATE TEMP TABLE g AS
      WITH w AS (SELECT COALESCE(tk.tier, 'unknown') AS tier,
                        UNNEST([{rows}]) AS s
                 FROM {usage} u
                 ASOF LEFT JOIN lim ON u.collection_id = lim.c AND u.instance_index = lim.i AND u.start_time >= lim.time
                 LEFT JOIN tk ON u.collection_id = tk.c AND u.instance_index = tk.i AND u.machine_id = tk.m),
           k AS (SELECT tier, s.m AS measure,
                        CASE WHEN s.l IS NULL OR NOT s.l > 0 THEN 0 WHEN s.x IS NULL OR NOT isfinite(s.x) THEN 1 ELSE 2 END AS kind,
                        s.x / s.l AS ratio FROM w),
           c AS (SELECT *, CASE WHEN kind = 2 THEN {_ratio_bin_guess("ratio")} END AS cand FROM k)
      SELECT tier, measure, kind, CASE WHEN kind = 2 THEN {_ratio_bin("ratio")} END AS bin,
             CASE WHEN kind <> 2 THEN NULL WHEN ratio > 1 THEN 2 WHEN ratio <= 0.5 THEN 0 ELSE 1 END AS cls,
             COUNT(*) AS n, SUM(CASE WHEN kind = 2 THEN ratio END) AS rs
      FROM c LEFT JOIN bins ON bins.b = c.cand GROUP BY ALL;
    CREATE TEMP TABLE gh AS SELECT COALESCE(tier, 'all') AS tier, measure, bin, SUM(n) AS windows
      FROM g WHERE kind = 2 GROUP BY GROUPING SETS ((tier, measure, bin), (measure, bin));
    COPY (WITH s AS (SELECT COALESCE(tier, 'all') AS tier, measure, SUM(n) AS windows,
                            COALESCE(SUM(n) FILTER (WHERE kind = 0), 0) AS no_limit,
                            COALESCE(SUM(n) FILTER (WHERE kind = 1), 0) AS unknown,
                            COALESCE(SUM(n) FILTER (WHERE kind = 2), 0) AS defined,
                            COALESCE(SUM(n) FILTER (WHERE cls = 2), 0) AS above_limit,
                            COALESCE(SUM(n) FILTER (WHERE cls = 0), 0) AS at_most_half,
                            SUM(rs) FILTER (WHERE kind = 2) AS rsum
                     FROM g GROUP BY GROUPING SETS ((tier, measure), (measure))),
               cu AS (SELECT *, SUM(windows) OVER (PARTITION BY tier, measure ORDER BY bin) AS cum,
                             SUM(windows) OVER (PARTITION BY tier, measure) AS nd FROM gh),
               q AS (SELECT tier, measure, {
        ", ".join(f"MIN(bin) FILTER (WHERE cum >= CEIL({p} * nd / 100)) AS b{p}" for p in (10, 50, 90, 99))
    }
                     FROM cu GROUP BY ALL)
          SELECT s.tier, s.measure, CAST(windows AS BIGINT) AS windows, CAST(no_limit AS BIGINT) AS no_limit,
                 CAST(unknown AS BIGINT) AS unknown, CAST(defined AS BIGINT) AS defined,
                 CAST(above_limit AS BIGINT) AS above_limit, CAST(at_most_half AS BIGINT) AS at_most_half,
                 CASE WHEN defined > 0 THEN above_limit / defined END AS above_limit_share,
                 CASE WHEN defined > 0 THEN at_most_half / defined END AS at_most_half_share,
                 CASE WHEN defined > 0 THEN rsum / defined END AS mean_ratio, {quant}
          FROM s LEFT JOIN q USING (tier, measure)) TO '{out}/summary.parquet' (FORMAT parquet);
    COPY (SELECT tier, measure, bin, CASE WHEN bin = 0 THEN 0 ELSE lo END AS lo_ratio, hi AS hi_ratio,
                 CAST(windows AS BIGINT) AS windows
          FROM gh JOIN bins ON bins.b = gh.bin) TO '{out}/hist.parquet' (FORMAT parquet);
    COPY (SELECT CAST(SUM(n) AS BIGINT) AS windows FROM g WHERE measure = 'cpu_avg') TO '{out}/info.parquet'
      (FORMAT parquet)"""


def machine_utilization_sql(ds: Path | str) -> str:
    """machine-utilization (mode notebook) whole: Google's notebook query, with the exact
    quantile_cont in place of APPROX_QUANTILES(x, 100)."""
    qs = ", ".join(str(k / 100) for k in range(101))
    sql = f"""
    WITH cap AS (SELECT machine_id, MAX(cap_cpu) AS c, MAX(cap_mem) AS m
                 FROM read_parquet('{ds}/machine_events/**/*.parquet', hive_partitioning=false) GROUP BY 1),
         u AS (SELECT CAST(FLOOR(start_time / 3e8) AS BIGINT) AS bucket, machine_id, avg_cpu, avg_mem
               FROM read_parquet('{ds}/instance_usage/**/*.parquet', hive_partitioning=false)
               WHERE (alloc_collection_id IS NULL OR alloc_collection_id = 0) AND end_time - start_time >= 300000000),
         mb AS (SELECT machine_id, bucket, SUM(avg_cpu) AS cu, SUM(avg_mem) AS mu, MAX(c) AS c, MAX(m) AS m
                FROM u JOIN cap USING (machine_id) GROUP BY 1, 2)
    SELECT COUNT(*), QUANTILE_CONT(CASE WHEN c > 0 THEN IF(cu > c, 1.0, cu / c) END, [{qs}]),
           QUANTILE_CONT(CASE WHEN m > 0 THEN IF(mu > m, 1.0, mu / m) END, [{qs}])
    FROM mb"""
    return sql


def machine_utilization_full_sql(ds: Path | str, out: Path | str, mode: str = "notebook") -> str:
    """Every table gpuclust's machine-utilization writes (``machine``, ``quantiles``, ``summary``,
    ``series``, ``info``), as DuckDB statements that write them to ``out`` as Parquet (``machine``,
    parted in gpuclust's folder, as one file here), from docs/analysis-machine-utilization.md (not
    from gpuclust's code), in either ``mode``.

    Top-level usage rows (``alloc_collection_id`` NULL or 0) on machines present in
    ``machine_events``; 5-minute buckets ``[k · 300 s, (k + 1) · 300 s)``.  ``notebook``: windows
    lasting at least 300 s, each in the bucket of its start, usage ``SUM(avg)``, capacity
    ``MAX(cap_cpu)`` / ``MAX(cap_mem)`` over all the machine's rows (NULLs ignored), ``util`` capped
    at 1, a row per machine-bucket with a window; ``time-weighted``: a row per machine-bucket in
    which the machine is up (ADD to REMOVE, capacity of the latest ADD / UPDATE, event times
    clipped to the usage's window: its earliest start to its latest known time), windows with a
    known end after their start in every bucket they overlap with ``avg × overlap``, ``util`` =
    usage-seconds / capacity-seconds (an up piece with a NULL capacity: unknown), not capped.
    NaN usage is NULL (skipped by the sums); a NULL
    sum, a NULL or non-positive capacity: ``util`` NULL (unknown).  ``over_capacity``: usage above
    a known capacity, before the cap; ``share_over_capacity`` of the known; quantiles 0, 0.01, ..,
    1 by ``quantile_cont`` (NumPy's linear interpolation) over the known; ``series``: buckets with a
    known CPU or memory ratio.  ``info``: a row is counted in the first of alloc, short (notebook:
    under 300 s) or unbounded (time-weighted: end at 2^63-1 or not after the start), unplaced
    (start at 2^63-1: as no such window lasts 300 s or ends after its start, always 0 here; NULL
    and negative starts, which gpuclust also counts as unplaced, are not handled), unknown
    machine, used.  tests/bench/test_cpu_vs_duckdb.py checks it against gpuclust's tables."""
    if mode not in ("notebook", "time-weighted"):
        raise ValueError(f"mode: {mode!r}")
    usage = f"read_parquet('{ds}/instance_usage/**/*.parquet', hive_partitioning=false)"
    mevents = f"read_parquet('{ds}/machine_events/**/*.parquet', hive_partitioning=false)"
    after = "9223372036854775807"
    b_us = 300_000_000
    qs = "[" + ", ".join(repr(k / 100) for k in range(101)) + "]::DOUBLE[]"
    notebook = mode == "notebook"
    # each row's fate: -1 alloc, -2 short (notebook) / unbounded (time-weighted), -3 unplaced, else
    # its (first) bucket
    dropped = f"end_time - start_time < {b_us}" if notebook else f"end_time = {after} OR end_time <= start_time"
    kind = (
        f"CASE WHEN NOT (alloc_collection_id IS NULL OR alloc_collection_id = 0) THEN -1 WHEN {dropped} THEN -2 "
        f"WHEN start_time = {after} THEN -3 ELSE start_time // {b_us} END"
    )

    def val(x: str) -> str:  # NaN is NULL (not isnan(): DuckDB 2.0 folds it to false from Parquet min/max)
        return f"CASE WHEN isfinite({x}) OR isinf({x}) THEN CAST({x} AS DOUBLE) END"

    def util(u: str, c: str) -> str:
        ratio = f"CASE WHEN {u} > {c} THEN 1.0 ELSE {u} / {c} END" if notebook else f"{u} / {c}"
        return f"CASE WHEN {c} > 0 AND {u} IS NOT NULL THEN {ratio} END"

    # g: per machine and bucket (or fate), the windows counted there, ``rows`` (the windows whose
    # first bucket or fate it is: what info counts) and the usage sums; one scan of the usage
    if notebook:
        grouped = f"""
      SELECT machine_id, {kind} AS bucket, COUNT(*) AS windows, COUNT(*) AS rows, SUM({val("avg_cpu")}) AS cu,
             SUM({val("avg_mem")}) AS mu
      FROM {usage} GROUP BY ALL"""
    else:

        def part(x: str, overlap: str) -> str:  # x times the window's overlap with the bucket over 300 s
            return f"{val(x)} * CAST({overlap} AS DOUBLE) / {b_us}"

        # a window within one bucket (all of them on the 5-minute grid) overlaps it by its length;
        # only the others are unnested into their buckets (unnesting every window: 1.1x the wall
        # and CPU time of the whole process at 1e6 windows)
        cut = f"LEAST(e, (b + 1) * {b_us}) - GREATEST(s, b * {b_us})"
        grouped = f"""
      WITH k AS (SELECT machine_id, start_time AS s, end_time AS e, {kind} AS k, (end_time - 1) // {b_us} AS kl,
                        avg_cpu, avg_mem FROM {usage})
      SELECT machine_id, bucket, COUNT(*) AS windows, COUNT(*) FILTER (WHERE first) AS rows, SUM(cu) AS cu,
             SUM(mu) AS mu
      FROM (SELECT machine_id, k AS bucket, true AS first, CASE WHEN k >= 0 THEN {part("avg_cpu", "e - s")} END AS cu,
                   CASE WHEN k >= 0 THEN {part("avg_mem", "e - s")} END AS mu FROM k WHERE k < 0 OR kl = k
            UNION ALL
            SELECT machine_id, b, b = k, {part("avg_cpu", cut)}, {part("avg_mem", cut)}
            FROM (SELECT *, UNNEST(range(k, kl + 1)) AS b FROM k WHERE k >= 0 AND kl > k))
      GROUP BY ALL"""
    both = "(SELECT 'cpu' AS resource, qc AS q FROM q UNION ALL SELECT 'mem', qm FROM q)"
    if notebook:
        machine_buckets = f"""
    CREATE TEMP TABLE mb AS
      SELECT machine_id, bucket, windows, rows, cu, mu, c, m, {util("cu", "c")} AS cpu_util, {util("mu", "m")} AS mem_util,
             cu > c AND c > 0 AS cpu_over, mu > m AND m > 0 AS mem_over
      FROM g JOIN cap USING (machine_id) WHERE bucket >= 0;
    COPY (SELECT machine_id, bucket, bucket * {b_us} AS bucket_start_us, windows, cu AS cpu_usage, mu AS mem_usage,
                 c AS cap_cpu, m AS cap_mem, cpu_util, mem_util FROM mb ORDER BY machine_id, bucket)
      TO '{out}/machine.parquet' (FORMAT parquet);"""
        extra_info = ""
    else:
        me_rows = f"read_parquet('{ds}/machine_events/**/*.parquet', hive_partitioning=false, file_row_number=true)"
        order = "(PARTITION BY machine_id ORDER BY t, file_index, file_row_number)"
        # up pieces: each event row (type ADD 1 / REMOVE 2 / UPDATE 3) opens [t, next t) when the
        # latest ADD / REMOVE at or before it is an ADD; the capacity of the latest ADD / UPDATE
        # (a struct, so that a NULL capacity is kept, not skipped); per bucket the up µs and the
        # capacity µs (NULL when an up piece there has none); usage µs = cu x 300 s
        machine_buckets = f"""
    CREATE TEMP TABLE w AS
      SELECT MIN(start_time) FILTER (WHERE start_time >= 0 AND start_time < {after}) AS w0,
             GREATEST(MAX(start_time) FILTER (WHERE start_time < {after}),
                      MAX(end_time) FILTER (WHERE end_time < {after})) AS last FROM {usage};
    CREATE TEMP TABLE pieces AS
      SELECT machine_id, t, LEAD(t, 1, w1) OVER {order} AS e,
             LAST_VALUE(CASE WHEN type IN (1, 2) THEN type END IGNORE NULLS) OVER {order} = 1 AS up,
             LAST_VALUE(CASE WHEN type IN (1, 3) THEN {{'c': {val("cap_cpu")}, 'm': {val("cap_mem")}}} END
                        IGNORE NULLS) OVER {order} AS cap
      FROM (SELECT machine_id, type, cap_cpu, cap_mem, file_index, file_row_number, w1,
                   LEAST(GREATEST(COALESCE(time, -9223372036854775808), w0), w1) AS t
            FROM {me_rows}, (SELECT w0, GREATEST(w0, last) AS w1 FROM w WHERE w0 IS NOT NULL)
            WHERE type IN (1, 2, 3) AND machine_id IS NOT NULL);
    CREATE TEMP TABLE upb AS
      SELECT machine_id, b AS bucket, SUM(ov) AS up_us,
             CASE WHEN COUNT(*) FILTER (WHERE cap.c IS NULL) = 0 THEN SUM(cap.c * ov) END AS c_us,
             CASE WHEN COUNT(*) FILTER (WHERE cap.m IS NULL) = 0 THEN SUM(cap.m * ov) END AS m_us
      FROM (SELECT machine_id, cap, b, CAST(LEAST(e, (b + 1) * {b_us}) - GREATEST(t, b * {b_us}) AS DOUBLE) AS ov
            FROM (SELECT *, UNNEST(range(t // {b_us}, (e - 1) // {b_us} + 1)) AS b FROM pieces WHERE up AND e > t))
      GROUP BY ALL HAVING SUM(ov) > 0;
    CREATE TEMP TABLE gk AS SELECT g.* FROM g JOIN cap USING (machine_id) WHERE bucket >= 0;
    CREATE TEMP TABLE mb AS
      SELECT machine_id, bucket, up_us, COALESCE(windows, 0) AS windows, rows,
             CASE WHEN windows IS NULL THEN 0.0 ELSE cu * {b_us} END AS cu_us,
             CASE WHEN windows IS NULL THEN 0.0 ELSE mu * {b_us} END AS mu_us, c_us, m_us
      FROM upb LEFT JOIN gk USING (machine_id, bucket);
    CREATE OR REPLACE TEMP TABLE mb AS
      SELECT *, {util("cu_us", "c_us")} AS cpu_util, {util("mu_us", "m_us")} AS mem_util,
             {util("cu_us", "c_us")} > 1 AS cpu_over, {util("mu_us", "m_us")} > 1 AS mem_over FROM mb;
    COPY (SELECT machine_id, bucket, bucket * {b_us} AS bucket_start_us, up_us / 1e6 AS up_s, windows,
                 cu_us / up_us AS cpu_usage, mu_us / up_us AS mem_usage, c_us / up_us AS cap_cpu,
                 m_us / up_us AS cap_mem, cpu_util, mem_util FROM mb ORDER BY machine_id, bucket)
      TO '{out}/machine.parquet' (FORMAT parquet);"""
        extra_info = f""",
                 (SELECT COALESCE(w0, 0) FROM w) AS window_start_us,
                 (SELECT COALESCE(GREATEST(w0, last), 0) FROM w) AS window_end_us,
                 (SELECT COUNT(*) FILTER (WHERE windows = 0) FROM mb) AS idle_machine_buckets,
                 (SELECT COUNT(*) FILTER (WHERE up_us < {b_us}) FROM mb) AS partial_machine_buckets,
                 (SELECT COUNT(*) FROM gk ANTI JOIN mb USING (machine_id, bucket)) AS usage_buckets_not_up"""
    return f"""
    CREATE TEMP TABLE cap AS SELECT machine_id, CAST(MAX(cap_cpu) AS DOUBLE) AS c, CAST(MAX(cap_mem) AS DOUBLE) AS m
      FROM {mevents} GROUP BY machine_id;
    CREATE TEMP TABLE g AS {grouped};
    {machine_buckets}
    CREATE TEMP TABLE q AS SELECT quantile_cont(cpu_util, {qs}) AS qc, quantile_cont(mem_util, {qs}) AS qm FROM mb;
    COPY (SELECT r.resource, qq.quantile, r.q[qq.k] AS util
          FROM {both} r, (SELECT UNNEST(range(1, 102)) AS k, UNNEST({qs}) AS quantile) qq
          ORDER BY r.resource, qq.k) TO '{out}/quantiles.parquet' (FORMAT parquet);
    COPY (SELECT r.resource, machine_buckets, known, machine_buckets - known AS unknown, mean_util, over_capacity,
                 over_capacity / known AS share_over_capacity, q[51] AS p50, q[91] AS p90, q[100] AS p99, q[101] AS max
          FROM (SELECT 'cpu' AS resource, COUNT(*) AS machine_buckets, COUNT(cpu_util) AS known, AVG(cpu_util) AS mean_util,
                       COUNT(*) FILTER (WHERE cpu_over) AS over_capacity FROM mb
                UNION ALL
                SELECT 'mem', COUNT(*), COUNT(mem_util), AVG(mem_util), COUNT(*) FILTER (WHERE mem_over) FROM mb) r
          JOIN {both} USING (resource) ORDER BY r.resource) TO '{out}/summary.parquet' (FORMAT parquet);
    COPY (SELECT bucket, bucket * {b_us} AS bucket_start_us, COUNT(cpu_util) AS cpu_machines,
                 AVG(cpu_util) AS cpu_mean_util, COUNT(mem_util) AS mem_machines, AVG(mem_util) AS mem_mean_util
          FROM mb GROUP BY bucket HAVING COUNT(cpu_util) + COUNT(mem_util) > 0 ORDER BY bucket)
      TO '{out}/series.parquet' (FORMAT parquet);
    COPY (WITH n AS (SELECT {
        ", ".join(
            f"CAST(COALESCE(SUM(rows) FILTER (WHERE {w}), 0) AS BIGINT) AS {c}"
            for c, w in (
                ("rows", "true"),
                ("alloc_rows", "bucket = -1"),
                ("dropped", "bucket = -2"),
                ("unplaced_rows", "bucket = -3"),
                ("placed", "bucket >= 0"),
            )
        )
    } FROM g),
               used AS (SELECT (SELECT COUNT(*) FROM mb) AS machine_rows, CAST(COALESCE(SUM(rows), 0) AS BIGINT) AS used_rows
                        FROM g JOIN cap USING (machine_id) WHERE bucket >= 0)
          SELECT 'machine-utilization' AS analysis, '{mode}' AS mode, (SELECT COUNT(*) FROM cap) AS machines,
                 (SELECT COUNT(*) FROM cap WHERE c > 0) AS machines_known_cpu_capacity, machine_rows, rows, alloc_rows,
                 {"dropped" if notebook else "0::BIGINT"} AS short_rows,
                 {"0::BIGINT" if notebook else "dropped"} AS unbounded_rows, unplaced_rows,
                 placed - used_rows AS unknown_machine_rows, used_rows{extra_info}
          FROM n, used) TO '{out}/info.parquet' (FORMAT parquet)"""


def peak_prediction_sql(ds: Path | str, out: Path | str, oracle: bool = True) -> str:
    """The SQL-expressible part of gpuclust's peak-prediction with its default options, as DuckDB
    statements that write gpuclust's ``machine`` table (parted in gpuclust's folder, as one
    ``machine.parquet`` here) to ``out``, from docs/analysis-peak-prediction.md (not from gpuclust's
    code): ``machine_id``, ``bucket``, ``bucket_start_us``, ``instances``, ``limit``,
    ``total_usage``, ``borg_default`` and (``oracle``) ``oracle``.

    Samples: usage windows of top-level instances (``alloc_collection_id`` NULL or 0) on machines in
    ``machine_events``, starting at a trace time (not 2^63-1), with a ``cpu_p90`` (NULL and NaN
    are no sample), ASOF-joined to their instance's latest event at or before their start whose
    ``req_cpu`` and ``req_mem`` are both positive (ties at one microsecond: the later row in the
    files' order); that event's ``req_cpu`` is the limit, its priority in 0..400 and scheduling class
    in 2..3 (NULL: out).  Per (machine, instance, 5-minute step) the maximum usage and limit; per
    machine and step the instances, the sum of limits, the sum of usage capped at the limit, and
    ``borg_default`` = 0.9 x the sum of limits.  ``oracle``: for a step t whose 24 h horizon ends
    at or before the last step of any usage window start (else NULL: censored), the maximum over
    the machine's snapshots s in (t, t + 288] of the sum, over the instances present at t and s, of
    their usage at s capped at their limit at t (0 for a snapshot sharing none); the limit at t
    where the machine has no snapshot in the horizon.  A self-join of each sample with its
    instance's samples up to 288 steps later (samples x horizon steps: the cost gpuclust's
    difference array avoids).  The stateful predictors (``n_sigma``, ``instance_percentile``,
    ``machine_percentile``, ``max_of``, ``avg_of``: warm-up runs, the forget rule, ratio series over
    the last 24 / 120 snapshots and their percentiles) are left out.
    tests/bench/test_cpu_vs_duckdb.py checks it against gpuclust's ``machine`` table."""
    usage = f"read_parquet('{ds}/instance_usage/**/*.parquet', hive_partitioning=false)"
    mevents = f"read_parquet('{ds}/machine_events/**/*.parquet', hive_partitioning=false)"
    never, b_us, horizon = "9223372036854775807", 300_000_000, 86400 // 300

    def positive(x: str) -> str:  # > 0 and not NaN (DuckDB orders NaN above every number; isnan() is folded)
        return f"({x} > 0 AND (isfinite({x}) OR isinf({x})))"

    oracle_sql = f"""
    CREATE TEMP TABLE last AS SELECT MAX(start_time // {b_us}) AS lb FROM {usage} WHERE start_time <> {never};
    CREATE TEMP TABLE fut AS
      SELECT m, b, COUNT(*) OVER (PARTITION BY m ORDER BY b RANGE BETWEEN 1 FOLLOWING AND {horizon} FOLLOWING) AS nf
      FROM mb;
    CREATE TEMP TABLE pair AS
      SELECT m, t, COUNT(*) AS np, MAX(su) AS mx
      FROM (SELECT a.m, a.b AS t, f.b AS s, SUM(LEAST(f.u, a.l)) AS su
            FROM smp a JOIN smp f ON f.m = a.m AND f.c = a.c AND f.i = a.i AND f.b > a.b AND f.b <= a.b + {horizon}
            WHERE a.b + {horizon} <= (SELECT lb FROM last) GROUP BY ALL)
      GROUP BY ALL;
    CREATE TEMP TABLE orc AS
      SELECT fut.m, fut.b, CASE WHEN fut.b + {horizon} > (SELECT lb FROM last) THEN NULL WHEN nf = 0 THEN mb.lim
                                WHEN COALESCE(np, 0) < nf THEN GREATEST(COALESCE(mx, 0), 0) ELSE mx END AS oracle
      FROM fut JOIN mb USING (m, b) LEFT JOIN pair ON pair.m = fut.m AND pair.t = fut.b;"""
    return f"""
    CREATE TEMP TABLE ev AS
      SELECT collection_id AS c, instance_index AS i, time, CAST(req_cpu AS DOUBLE) AS l, priority, scheduling_class
      FROM {_table_scan(ds, "instance_events")} WHERE {positive("req_cpu")} AND {positive("req_mem")}
      QUALIFY ROW_NUMBER() OVER (PARTITION BY collection_id, instance_index, time ORDER BY r DESC) = 1;
    CREATE TEMP TABLE smp AS
      SELECT u.machine_id AS m, u.collection_id AS c, u.instance_index AS i, u.start_time // {b_us} AS b,
             MAX(CAST(u.cpu_p90 AS DOUBLE)) AS u, MAX(ev.l) AS l
      FROM {usage} u ASOF JOIN ev ON u.collection_id = ev.c AND u.instance_index = ev.i AND u.start_time >= ev.time
      WHERE (u.alloc_collection_id IS NULL OR u.alloc_collection_id = 0) AND u.start_time <> {never}
        AND (isfinite(u.cpu_p90) OR isinf(u.cpu_p90))
        AND u.machine_id IN (SELECT machine_id FROM {mevents})
        AND ev.priority BETWEEN 0 AND 400 AND ev.scheduling_class BETWEEN 2 AND 3
      GROUP BY ALL;
    CREATE TEMP TABLE mb AS SELECT m, b, COUNT(*) AS n, SUM(l) AS lim, SUM(LEAST(u, l)) AS tu FROM smp GROUP BY ALL;
    {oracle_sql if oracle else ""}
    COPY (SELECT mb.m AS machine_id, mb.b AS bucket, mb.b * {b_us} AS bucket_start_us, n AS instances, lim AS "limit",
                 tu AS total_usage, {"oracle, " if oracle else ""}0.9 * lim AS borg_default
          FROM mb {"LEFT JOIN orc USING (m, b)" if oracle else ""} ORDER BY machine_id, bucket)
      TO '{out}/machine.parquet' (FORMAT parquet)"""


#: The DuckDB peers: each analysis' SQL-expressible part, as SQL over the dataset's Parquet
#: (``bench/study_bench.py`` runs the same queries over tables loaded into DuckDB's memory).
DUCKDB_SQL: dict[str, dict[str, Callable[[Path | str], str]]] = {
    "machine-utilization": {"duckdb": machine_utilization_sql},
    "data-quality": {"duckdb": data_quality_sql},
    "usage-vs-request": {"duckdb": usage_vs_request_sql},
    "job-usage": {"duckdb": job_usage_sql},
    "lifecycle": {"duckdb": lifecycle_sql},
    "usage-change": {"duckdb": usage_change_sql},
    "cell-usage": {"duckdb": cell_usage_sql},
    "machine-shapes": {"duckdb": machine_shapes_sql},
    "cpi": {"duckdb": cpi_sql},
    "overcommit": {"duckdb": overcommit_sql, "duckdb (usage by tier)": overcommit_tiers_sql},
}


def resident_sql(sql: str, ds: Path | str) -> str | None:
    """``sql`` over tables loaded into DuckDB's memory, named as the dataset's tables, instead of
    the dataset's Parquet; None where it reads the Parquet in another form (``file_row_number``:
    the files' row order, which a table does not keep).

    >>> resident_sql("SELECT * FROM read_parquet('/d/instance_usage/**/*.parquet', hive_partitioning=false) u", "/d")
    'SELECT * FROM instance_usage u'
    """
    pattern = rf"read_parquet\('{re.escape(str(ds))}/(\w+)/\*\*/\*\.parquet', hive_partitioning=false\)"
    out = re.sub(pattern, r"\1", sql)
    return None if "read_parquet(" in out else out


def duck_peer(sql_of: Callable[[Path | str], str]) -> Callable[[Path, str], Callable[[], Any]]:
    """A contender running ``sql_of(ds)`` in DuckDB (one thread per usable core)."""

    def make(ds: Path, _: str) -> Callable[[], Any]:
        con = _duck()
        sql = sql_of(ds)
        return lambda: con.execute(sql).fetchall()

    return make


PEERS: dict[str, dict[str, Callable[[Path, str], Callable[[], Any]]]] = {
    a: {name: duck_peer(f) for name, f in peers.items()} for a, peers in DUCKDB_SQL.items()
}
PEERS["cell-usage"]["pandas"] = pandas_cell_usage
PEERS["cpi"]["pandas"] = pandas_cpi
PEERS["overcommit"]["pandas"] = pandas_overcommit
PEERS["usage-distribution"] = {"per-group loop": loop_usage_distribution}


def child(analysis: str, contender: str, ds: Path, repeat: int) -> None:
    if contender.startswith("gpuclust-"):
        be, extra = _parse_contender(contender)
        fn = gpuclust_runner(be, extra)(ds, analysis)
    else:
        fn = PEERS[analysis][contender](ds, analysis)
    best, scale = float("inf"), 1.0
    for _ in range(repeat):
        t0 = time.perf_counter()
        r = fn()
        best = min(best, time.perf_counter() - t0)
        if isinstance(r, float):
            scale = r
    from gpuclust.analyses.registry import create
    from gpuclust.dataset import Dataset

    a = create(analysis)
    d = Dataset(ds)
    nbytes = d.read(a.table, list(a.columns)).nbytes
    print(
        json.dumps(
            {
                "seconds": best * scale,
                "measured_seconds": best,
                "scaled": scale != 1.0,
                "rows": d.num_rows(a.table),
                "table": a.table,
                "bytes": nbytes,
            }
        )
    )


# ------------------------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="1e6,1e7", help="comma-separated window counts")
    ap.add_argument("--analyses", default="all", help="comma-separated analysis names, or all")
    ap.add_argument("--backends", default="auto", help="cpu,gpu or auto (gpu when a device is present)")
    ap.add_argument("--no-peers", action="store_true")
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--name", default="analyses")
    ap.add_argument("--child", nargs=3, metavar=("ANALYSIS", "CONTENDER", "DATASET"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        child(args.child[0], args.child[1], Path(args.child[2]), args.repeat)
        return 0

    from gpuclust.analyses.registry import names
    from gpuclust.backends import gpu_available

    analyses = names() if args.analyses == "all" else args.analyses.split(",")
    backends = (
        ["cpu", "gpu"]
        if args.backends == "auto" and gpu_available()
        else (["cpu"] if args.backends == "auto" else args.backends.split(","))
    )
    rows = []
    for size in [int(float(s)) for s in args.sizes.split(",")]:
        ds = bench_dataset(size)
        for an in analyses:
            contenders = (
                [f"gpuclust-{b}" for b in backends]
                + [_variant_name(b, v) for b in backends for v in BENCH_VARIANTS.get(an, [])]
                + ([] if args.no_peers else list(PEERS.get(an, {})))
            )
            for c in contenders:
                m = run_measured(
                    [
                        sys.executable,
                        str(HERE / "analyses_bench.py"),
                        "--repeat",
                        str(args.repeat),
                        "--child",
                        an,
                        c,
                        str(ds),
                    ]
                )
                if m.returncode != 0:
                    print(f"{an} / {c} failed:\n{m.stdout_tail}", file=sys.stderr)
                    rows.append({"size": size, "analysis": an, "contender": c, "error": m.stdout_tail[-500:]})
                    continue
                r = json.loads(m.stdout_tail.strip().splitlines()[-1])
                row = {
                    "size": size,
                    "analysis": an,
                    "contender": c,
                    "table": r["table"],
                    "rows": r["rows"],
                    "seconds": round(r["seconds"], 3),
                    "rows_per_s": round(r["rows"] / r["seconds"]),
                    "gb_per_s": round(r["bytes"] / r["seconds"] / 1e9, 3),
                    "peak_rss_mib": round(m.peak_rss_bytes / 2**20),
                    "scaled_from_subset": r["scaled"],
                }
                rows.append(row)
                print(json.dumps(row), flush=True)
    env = environment()
    notes = [
        "gpuclust options: " + "; ".join(f"{k}: {v}" for k, v in BENCH_OPTIONS.items()),
        "gpuclust runs with the engine's defaults: partitions='auto' (about 4 Mi rows each, rounded up to the "
        "thread count) on one thread per usable core; DuckDB runs with one thread per usable core ("
        + str(len(os.sched_getaffinity(0)))
        + ").",
        "gpuclust times include the analysis' context pass (e.g. priority lookups, interval construction, cpi's "
        "machine-cell pass), reading Parquet and finalize. Rows named gpuclust-cpu[...] run the analysis "
        "restricted to what its SQL peer computes (cpi: moments and Pearson r only); peers are compared with "
        "that row where there is one ('base' column). overcommit also computes capacity and request series "
        "besides the usage sums; 'duckdb (usage by tier)' computes the same usage sums as gpuclust's partial "
        "(tier join, 5 sums), 'duckdb' only the CPU sum. The per-group loop is timed on 1/20 of the machines "
        "and scaled by window count.",
    ]
    md = [
        f"# Analyses benchmark ({env['cores']} cores{', ' + env['gpu'] if env['gpu'] else ', no GPU'})",
        "",
        "| windows | analysis | contender | s | rows/s | GB/s | peak RSS MiB | base | vs base |",
        "|---:|---|---|---:|---:|---:|---:|---|---:|",
    ]
    times = {(r["size"], r["analysis"], r["contender"]): r["seconds"] for r in rows if "seconds" in r}

    def base_of(r: dict[str, Any]) -> str:
        own = r["contender"]
        if own.startswith("gpuclust-"):
            return "gpuclust-cpu" if own != "gpuclust-cpu" else ""
        for v in BENCH_VARIANTS.get(r["analysis"], []):
            if (r["size"], r["analysis"], _variant_name("cpu", v)) in times:
                return _variant_name("cpu", v)
        return "gpuclust-cpu"

    for r in rows:
        if "error" in r:
            md.append(f"| {r['size']:,} | {r['analysis']} | {r['contender']} | failed | | | | | |")
            continue
        bname = base_of(r)
        b = times.get((r["size"], r["analysis"], bname))
        rel = (
            f"{r['seconds'] / b:.2f}x slower"
            if b and r["seconds"] >= b
            else (f"{b / r['seconds']:.2f}x faster" if b else "")
        )
        note = " (subset, scaled)" if r["scaled_from_subset"] else ""
        md.append(
            f"| {r['size']:,} | {r['analysis']} | {r['contender']}{note} | {r['seconds']} | {r['rows_per_s']:,} "
            f"| {r['gb_per_s']} | {r['peak_rss_mib']:,} | {bname} | {rel} |"
        )
    md += ["", *notes, "", "Environment: " + ", ".join(f"{k}={v}" for k, v in env.items()), ""]
    jp, mp = write_results(args.name, {"benchmark": "analyses", "rows": rows, "environment": env}, "\n".join(md))
    print("\n".join(md))
    print(f"wrote {jp} and {mp}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
