"""The DuckDB peers the benchmarks run: each analysis' SQL-expressible part, as SQL over the
dataset's Parquet (``bench/study_bench.py`` runs the same queries over tables loaded into DuckDB's
memory)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from references.sql_cell_usage import cell_usage_sql
from references.sql_cpi import cpi_sql
from references.sql_data_quality import data_quality_sql
from references.sql_job_usage import job_usage_sql
from references.sql_lifecycle import lifecycle_sql
from references.sql_machine_shapes import machine_shapes_sql
from references.sql_machine_utilization import machine_utilization_sql
from references.sql_overcommit import overcommit_sql, overcommit_tiers_sql
from references.sql_usage_change import usage_change_sql
from references.sql_usage_vs_request import usage_vs_request_sql

#: analysis -> {peer name: the SQL of that peer over a dataset}
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
