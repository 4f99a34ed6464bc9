"""cell-usage's DuckDB SQL reference: Google's notebook query."""

from __future__ import annotations

from pathlib import Path


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
