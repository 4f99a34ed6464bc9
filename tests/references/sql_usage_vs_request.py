"""usage-vs-request's DuckDB SQL references (docs/analyses/usage-vs-request.md):
``usage_vs_request_sql``, its SQL-expressible subset, and ``usage_vs_request_full_sql``, which writes
every table."""

from __future__ import annotations

from pathlib import Path

from references._sql import RATIO_BINS_TABLE, ratio_bin, ratio_bin_guess, tier_case


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


def usage_vs_request_full_sql(ds: Path | str, out: Path | str) -> str:
    """Every table gpuclust's usage-vs-request writes, as DuckDB statements that write them to
    ``out`` as Parquet, from docs/analyses/usage-vs-request.md (not from gpuclust's code): each
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
    CREATE TEMP TABLE tk AS SELECT c, i, m, {tier_case(ds)} AS tier FROM
        (SELECT c, i, m, MAX(priority) AS p FROM ev WHERE m IS NOT NULL GROUP BY ALL);
    {RATIO_BINS_TABLE};
    CREATE TEMP TABLE g AS
      WITH w AS (SELECT COALESCE(tk.tier, 'unknown') AS tier,
                        UNNEST([{rows}]) AS s
                 FROM {usage} u
                 ASOF LEFT JOIN lim ON u.collection_id = lim.c AND u.instance_index = lim.i AND u.start_time >= lim.time
                 LEFT JOIN tk ON u.collection_id = tk.c AND u.instance_index = tk.i AND u.machine_id = tk.m),
           k AS (SELECT tier, s.m AS measure,
                        CASE WHEN s.l IS NULL OR NOT s.l > 0 THEN 0 WHEN s.x IS NULL OR NOT isfinite(s.x) THEN 1 ELSE 2 END AS kind,
                        s.x / s.l AS ratio FROM w),
           c AS (SELECT *, CASE WHEN kind = 2 THEN {ratio_bin_guess("ratio")} END AS cand FROM k)
      SELECT tier, measure, kind, CASE WHEN kind = 2 THEN {ratio_bin("ratio")} END AS bin,
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
