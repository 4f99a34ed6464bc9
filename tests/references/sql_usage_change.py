"""usage-change's DuckDB SQL references (docs/analyses/usage-change.md): ``usage_change_sql``,
its SQL-expressible subset, and ``usage_change_full_sql``, which writes every table."""

from __future__ import annotations

from pathlib import Path

from references._sql import RATIO_BINS_TABLE, ratio_bin, ratio_bin_guess, tier_case


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
    as Parquet, from docs/analyses/usage-change.md (not from gpuclust's code): each instance's
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
    CREATE TEMP TABLE tk AS SELECT collection_id, instance_index, machine_id, {tier_case(ds)} AS tier FROM
        (SELECT collection_id, instance_index, machine_id, MAX(priority) AS p FROM {events}
         WHERE machine_id IS NOT NULL GROUP BY ALL);
    {RATIO_BINS_TABLE};
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
           c AS (SELECT *, CASE WHEN kind = 4 THEN {ratio_bin_guess("ratio")} END AS cand FROM k)
      SELECT tier, resource, kind, CASE WHEN kind = 4 THEN {ratio_bin("ratio")} END AS bin,
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
