"""job-usage's DuckDB SQL references (docs/analyses/job-usage.md): ``job_usage_sql`` (no tiers),
``job_usage_tiers_sql`` (the statistics per tier) and ``job_usage_full_sql``, which writes every
table."""

from __future__ import annotations

from pathlib import Path

from references._sql import tier_case


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
    tier = tier_case(ds)
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


def job_usage_full_sql(ds: Path | str, out: Path | str, tail: float = 0.1) -> str:
    """Every table gpuclust's job-usage writes (rows=jobs), as DuckDB statements that write them to
    ``out`` as Parquet: ``jobs`` (per JOB collection: tier, NCU-hours, NMU-hours, windows, by
    NCU-hours descending then collection_id), ``stats`` (per tier and ``all``, CPU and memory:
    count, zero jobs, total, mean, population variance, quantiles, max, top 1% and 0.1% shares,
    squared coefficient of variation and the Pareto fit of the CCDF tail: least squares of
    ``log10(rank / n)`` on ``log10(x)`` over the largest ``ceil(tail x n)``, at least 2),
    ``correlation`` (Pearson r of NCU- and NMU-hours and of their logarithms, collections with
    both positive) and ``info`` (the row counts).  Written from docs/analyses/job-usage.md, not
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
      SELECT collection_id, {tier_case(ds)} AS tier, ncu, nmu, windows FROM c;
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
