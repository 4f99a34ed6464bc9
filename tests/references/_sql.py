"""What the SQL references share: the dataset's tables as DuckDB relations in row order, its tier
map as a SQL CASE, and the log-spaced ratio bins of usage-change and usage-vs-request."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def duck_type(t: Any) -> str:
    """The DuckDB type of an Arrow type of the canonical schemas."""
    import pyarrow as pa

    if pa.types.is_list(t):
        return duck_type(t.value_type) + "[]"
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


def table_scan(ds: Path | str, table: str) -> str:
    """``table``'s rows with ``r``, a number that orders them in the dataset's row order (the files
    in sorted order, then each file's rows: ``file_index << 40 | file_row_number``, no sort), or an
    empty relation of its schema where the dataset has no file of it."""
    from gpuclust.schema import SCHEMAS

    if any(Path(ds, table).rglob("*.parquet")):
        return (
            f"(SELECT *, (CAST(file_index AS BIGINT) << 40) + file_row_number AS r FROM read_parquet("
            f"'{ds}/{table}/**/*.parquet', hive_partitioning=false, file_row_number=true))"
        )
    cols = ", ".join(f"CAST(NULL AS {duck_type(f.type)}) AS {f.name}" for f in SCHEMAS[table])
    return f"(SELECT {cols}, CAST(NULL AS BIGINT) AS r WHERE false)"


def tier_case(ds: Path | str) -> str:
    """The dataset's tier map (its manifest's, else the trace's default) as a SQL CASE over ``p``
    (the highest priority; NULL, negative or below every tier: ``'unknown'``)."""
    from gpuclust.dataset import Dataset
    from gpuclust.tiers import resolve_tier_map

    tm = resolve_tier_map(None, Dataset(ds))
    return (
        "CASE "
        + " ".join(
            f"WHEN p >= {lo} THEN '{name}'" for name, lo in reversed(list(zip(tm.names, tm.bounds, strict=True)))
        )
        + " ELSE 'unknown' END"
    )


#: The ratio bins of usage-change and usage-vs-request (docs/analyses/usage-change.md): lower
#: edges 10^(k/100), k = -600..600, of bins 1, 2, ...; bin 0 below 10^-6 (zero included), the last
#: from 10^6 on.  A table ``bins(b, lo, hi)`` (bin 0: lo -inf; the last: hi inf).
RATIO_EDGES_SQL = [10.0 ** (k / 100) for k in range(-600, 601)]


RATIO_BINS_TABLE = f"""CREATE TEMP TABLE bins AS SELECT b, CASE WHEN b = 0 THEN '-inf'::DOUBLE ELSE e[b] END AS lo,
        CASE WHEN b = {len(RATIO_EDGES_SQL)} THEN 'inf'::DOUBLE ELSE e[b + 1] END AS hi
        FROM (SELECT UNNEST(range({len(RATIO_EDGES_SQL) + 1})) AS b, {RATIO_EDGES_SQL}::DOUBLE[] AS e)"""


def ratio_bin_guess(x: str) -> str:
    """The bin of a ratio ``x`` from its logarithm: right or one off where rounding puts ``x``
    near an edge (:func:`ratio_bin` corrects it against the exact edges)."""
    return (
        f"CAST(LEAST(GREATEST(CASE WHEN {x} > 0 THEN floor(100 * log10({x})) + 601 ELSE 0 END, 0), "
        f"{len(RATIO_EDGES_SQL)}) AS INT)"
    )


def ratio_bin(x: str) -> str:
    """The exact bin of ``x`` (the number of edges at or below it), given ``cand`` (its
    :func:`ratio_bin_guess`) joined to ``bins`` on ``bins.b = cand``."""
    return f"CASE WHEN {x} < bins.lo THEN cand - 1 WHEN {x} >= bins.hi THEN cand + 1 ELSE cand END"
