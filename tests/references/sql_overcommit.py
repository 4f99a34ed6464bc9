"""overcommit's DuckDB SQL references (docs/analyses/overcommit.md): the CPU usage per machine x
5-minute bucket, and the usage sums by tier that its partial computes."""

from __future__ import annotations

from pathlib import Path

US = 1_000_000


def overcommit_sql(ds: Path | str) -> str:
    """Per machine x 5-min bucket CPU usage.  Buckets follow docs/user/dataset.md "Time buckets" (origin
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
