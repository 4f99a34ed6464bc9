"""The real 2019 cell-a machine_events shard, as JSON and as its Parquet twin."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pyarrow.compute as pc
import pytest

from gpuclust.dataset import Dataset
from gpuclust.ingest import ingest
from gpuclust.schema import SCHEMAS

from .conftest import expected_tables, sorted_rows, table_rows

JSON = "2019-cell-a/machine_events-000000000000.json.gz"
PARQUET = "2019-cell-a/machine_events-000000000000.parquet.gz"


def test_json_and_parquet_twins_identical(real_dir: Path, tmp_path: Path) -> None:
    a = ingest([real_dir / JSON], tmp_path / "json", cell="a")
    b = ingest([real_dir / PARQUET], tmp_path / "parquet", cell="a")
    assert a.ok and b.ok
    ta = Dataset(tmp_path / "json").read("machine_events")
    tb = Dataset(tmp_path / "parquet").read("machine_events")
    assert ta.schema.equals(SCHEMAS["machine_events"])
    assert ta.num_rows == tb.num_rows == 46_219
    assert ta.sort_by([("machine_id", "ascending"), ("time", "ascending"), ("type", "ascending")]).equals(
        tb.sort_by([("machine_id", "ascending"), ("time", "ascending"), ("type", "ascending")])
    )
    assert ta.equals(tb)  # same row order too
    assert ta.column("cap_cpu").null_count == 459 == tb.column("cap_cpu").null_count
    assert pc.max(ta.column("machine_id")).as_py() > 2**32  # IDs exceed 32 bits
    m = Dataset(tmp_path / "json").manifest
    assert m["tables"]["machine_events"]["rows"] == 46_219 and m["cell"] == "a"
    assert m["tier_map"]["name"] == "notebook"


def test_json_against_python_reference(real_dir: Path, tmp_path: Path) -> None:
    """Independent check: Python's json module + the reference flattening, row for row."""
    with gzip.open(real_dir / JSON, "rt") as f:
        raw = [json.loads(line) for line in f if line.strip()]
    recs = [
        {k: (int(v) if k in ("time", "machine_id", "type", "missing_data_reason") else v) for k, v in r.items()}
        for r in raw
    ]
    want = expected_tables("machine_events", recs)["machine_events"]
    rep = ingest([real_dir / JSON], tmp_path / "ds")
    assert rep.rows_rejected == 0
    assert table_rows(Dataset(tmp_path / "ds").read("machine_events")) == sorted_rows(want)


def test_against_duckdb(real_dir: Path, tmp_path: Path) -> None:
    """Independent engine: DuckDB reads the raw JSON shard; aggregates match the dataset's parts."""
    duckdb = pytest.importorskip("duckdb")
    ingest([real_dir / JSON], tmp_path / "ds")
    parts = [str(p) for p in Dataset(tmp_path / "ds").files("machine_events")]
    con = duckdb.connect()
    raw = con.execute(
        f"""SELECT count(*), sum(CAST(machine_id AS HUGEINT)), sum(CAST(time AS HUGEINT)),
                   count(*) FILTER (WHERE capacity IS NULL), sum(CAST(capacity.cpus AS FLOAT)),
                   count(DISTINCT platform_id)
            FROM read_json('{real_dir / JSON}', format='newline_delimited',
                 columns={{'time': 'BIGINT', 'machine_id': 'BIGINT', 'type': 'TINYINT',
                          'capacity': 'STRUCT(cpus DOUBLE, memory DOUBLE)', 'platform_id': 'VARCHAR'}})"""
    ).fetchone()
    ours = con.execute(
        f"""SELECT count(*), sum(CAST(machine_id AS HUGEINT)), sum(CAST(time AS HUGEINT)),
                   count(*) FILTER (WHERE cap_cpu IS NULL), sum(cap_cpu), count(DISTINCT platform_id)
            FROM read_parquet({parts!r})"""
    ).fetchone()
    assert raw[:4] == ours[:4] and raw[5] == ours[5]
    assert raw[4] == pytest.approx(ours[4], rel=1e-6)
    assert ours[0] == 46_219 and ours[3] == 459
