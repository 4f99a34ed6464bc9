"""machine-shapes' DuckDB SQL reference: machines per capacity pair."""

from __future__ import annotations

from pathlib import Path


def machine_shapes_sql(ds: Path | str) -> str:
    """Machines per (cap_cpu, cap_mem) over machine_events."""
    return (
        f"SELECT cap_cpu, cap_mem, COUNT(DISTINCT machine_id) "
        f"FROM read_parquet('{ds}/machine_events/**/*.parquet', hive_partitioning=false) GROUP BY ALL"
    )
