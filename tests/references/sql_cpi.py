"""cpi's DuckDB SQL reference: its SQL-expressible subset (weighted moments and Pearson r per
machine; docs/analyses/cpi.md)."""

from __future__ import annotations

from pathlib import Path


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
