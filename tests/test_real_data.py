"""Every real trace file in ../shared/data/real goes through the public ingest, row counts are
preserved, and the first analysis on the real 2019 cell-a shard matches DuckDB reading the raw
export directly (an independent JSON reader)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from gpuclust.dataset import Dataset
from gpuclust.engine import run
from gpuclust.ingest import ingest

REAL = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "real"
pytestmark = pytest.mark.skipif(not REAL.is_dir(), reason=f"real trace files not found at {REAL}")

# Row counts from ../shared/data/real/SOURCES.md.
V2_ROWS = {"machine_events": 37_780, "instance_events": 919_519, "collection_events": 25_437}


@pytest.fixture
def v2_dataset(real_2011: Path) -> Dataset:
    """The real 2011 parts, ingested once per run (tests/conftest.py's ``real_2011``), read-only."""
    return Dataset(real_2011)


def test_v2_row_counts_preserved(v2_dataset: Dataset) -> None:
    man = v2_dataset.manifest
    assert man["trace_version"] == "v2"
    assert man["tier_map"]["name"] == "v2"
    for table, rows in V2_ROWS.items():
        assert v2_dataset.num_rows(table) == rows, table
    assert sum(i["rows_rejected"] for i in man["inputs"].values()) == 0
    assert len(man["inputs"]) == 11  # 1 + 5 + 5 files


def test_v2_codes_are_v3_numbered(v2_dataset: Dataset) -> None:
    me = v2_dataset.read("machine_events", ["type", "cap_cpu"])
    assert set(np.unique(me.column("type").to_numpy())) <= {1, 2, 3}
    assert me.column("cap_cpu").null_count == 32  # SOURCES.md: 32 rows with empty CPU/memory
    ev = v2_dataset.read("instance_events", ["type"]).column("type").to_numpy()
    # v2 SCHEDULE (1) is v3 SCHEDULE (3); v3 QUEUE/ENABLE (1, 2) cannot come from v2.
    assert not np.isin(ev, [1, 2]).any()
    assert (ev == 3).sum() > 0


def test_kaggle_sample_ingests(tmp_path: Path) -> None:
    rep = ingest([REAL / "kaggle-2019-sample" / "small_slice3.csv"], tmp_path / "k", progress=False)
    assert rep.exit_status == 0, rep.summary()
    ds = Dataset(tmp_path / "k")
    assert ds.num_rows("instance_events") == 14
    entry = next(iter(ds.manifest["inputs"].values()))
    assert entry["rows_read"] == 14 and entry["rows_rejected"] == 0
    # Usage windows repeated by the Kaggle join are counted, not silently dropped.
    assert ds.num_rows("instance_usage") + entry["rows_deduplicated"] == 14


@pytest.mark.parametrize("name", ["machine_events-000000000000.json.gz", "machine_events-000000000000.parquet.gz"])
def test_real_2019_machine_shapes_match_duckdb_on_raw_file(tmp_path: Path, name: str) -> None:
    duckdb = pytest.importorskip("duckdb")
    src = REAL / "2019-cell-a" / name
    rep = ingest([src], tmp_path / "ds", cell="a", progress=False)
    assert rep.exit_status == 0, rep.summary()
    shapes = run(Dataset(tmp_path / "ds"), ["machine-shapes"])["machine-shapes"]["shapes"]
    reader = "read_parquet" if name.endswith("parquet.gz") else "read_json"
    ref = duckdb.sql(
        f"""SELECT CAST(capacity.cpus AS FLOAT) AS c, CAST(capacity.memory AS FLOAT) AS m,
                   COUNT(DISTINCT machine_id) AS n
            FROM {reader}('{src}') GROUP BY ALL"""
    ).df()
    got = {
        (None if np.isnan(c) else np.float32(c), None if np.isnan(m) else np.float32(m)): int(n)
        for c, m, n in zip(shapes["cap_cpu"], shapes["cap_mem"], shapes["machines"], strict=True)
    }
    want = {
        (None if c != c or c is None else np.float32(c), None if m != m or m is None else np.float32(m)): int(n)
        for c, m, n in zip(ref["c"], ref["m"], ref["n"], strict=True)
    }
    assert got == want
    assert got[(None, None)] == 459  # TRACE_NOTES: 459 machines in cell a have NULL capacity
    assert sum(got.values()) == 10_461


def test_v2_machine_sample_on_real_files(v2_dataset: Dataset, tmp_path: Path) -> None:
    """`--sample machines=10%` on the real 2011 parts: exactly the rows of the machines an
    independent pure-Python splitmix64 picks, in every table that names a machine; job events whole."""
    from tests.ingest.test_sampling import in_sample

    out = tmp_path / "sample"
    rep = ingest(
        [REAL / "2011" / "machine_events", REAL / "2011" / "task_events", REAL / "2011" / "job_events"],
        out,
        progress=False,
        sample="machines=10%",
    )
    assert rep.exit_status == 0, rep.summary()
    got = Dataset(out)
    for table in ("machine_events", "instance_events"):
        cols = (
            ["time", "collection_id", "instance_index", "machine_id"]
            if table == "instance_events"
            else ["time", "machine_id", "type"]
        )
        full = v2_dataset.read(table, cols).to_pandas()
        machines = {m for m in full["machine_id"].dropna().unique().tolist() if in_sample(int(m), 0.10, machine=True)}
        want = full[full["machine_id"].isin(machines)].sort_values(cols, kind="stable").reset_index(drop=True)
        have = got.read(table, cols).to_pandas().sort_values(cols, kind="stable").reset_index(drop=True)
        assert 0 < len(have) < len(full), table
        assert have.equals(want), table
    assert got.num_rows("collection_events") == V2_ROWS["collection_events"]


def test_kaggle_sample_cpi_by_cell_needs_no_machine_events(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The Kaggle sample has no machine_events; CPI/MAI correlations by cell need only usage rows (issue 33)."""
    from gpuclust.cli import main

    assert main(["kaggle-split", str(REAL / "kaggle-2019-sample" / "small_slice3.csv"), str(tmp_path / "parts")]) == 0
    assert main(["ingest", *map(str, sorted((tmp_path / "parts").glob("*.csv"))), "--out", str(tmp_path / "k")]) == 0
    assert Dataset(tmp_path / "k").num_rows("machine_events") == 0
    capsys.readouterr()
    for opts in (["-O", "by=cell"], ["-O", "by=cell", "-O", "regression=none"]):
        assert (
            main(["analyze", str(tmp_path / "k"), "cpi", *opts, "--out", str(tmp_path / "r"), "--quiet", "--no-plots"])
            == 0
        )
        out, err = capsys.readouterr()
        assert "needs table" not in err and "2 of 2 windows pass the CPI/MAI filter" in out
    assert main(["analyze", str(tmp_path / "k"), "cpi", "--out", str(tmp_path / "r"), "--quiet", "--no-plots"]) == 2
    assert "cpi needs table(s) machine_events (by=platform" in capsys.readouterr().err
