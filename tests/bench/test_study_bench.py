"""bench/study_bench.py runs on the cpu (a tiny dataset, one round) and writes what it reports."""

from __future__ import annotations

from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"


def test_study_bench_tiny_cpu(tiny_bench):
    res, md = tiny_bench(
        "study_bench", ["--sizes", "2e4", "--backends", "cpu,cpu+local:2,duckdb", "--rounds", "1", "--repeat", "1"]
    )
    assert [r["backend"] for r in res["rows"]] == ["cpu", "cpu+local:2"] and "environment" in res
    # DuckDB on resident tables: every SQL peer that reads no file row order, each set against a
    # gpuclust column (cpi's SQL-subset variant, run by the gpuclust processes too)
    (duck,) = res["duckdb"]
    assert duck["load_s"] > 0 and {"cell-usage duckdb", "cpi duckdb", "overcommit duckdb (usage by tier)"} <= set(
        duck["queries"]
    )
    assert all(q["s"] > 0 for q in duck["queries"].values())
    assert "cpi[regression=none,spearman=none]" in res["rows"][0]["analyses"]
    assert "DuckDB on resident data" in md and "| cpi duckdb |" in md
    assert " | cpi[regression=none,spearman=none] | " in md  # the gpuclust column cpi's peer is set against
    local, cluster = res["rows"]
    assert local["analyses"].keys() == cluster["analyses"].keys() and cluster["loaded_bytes"] == local["loaded_bytes"]
    assert "Environment:" in md and "Where each analysis' best run went" in md
    for r in (local, cluster):  # each analysis' phases (partials are summed over threads: not bounded by the wall)
        assert r["phases"].keys() == r["analyses"].keys()
        for a, ph in r["phases"].items():
            assert set(ph) == {"contexts", "partials", "read", "merge", "finalize", "convert"}
            rest = ph["contexts"] + ph["merge"] + ph["finalize"] + ph["convert"]
            assert 0 < ph["partials"] and rest <= r["analyses"][a] + 1e-3, (a, ph)


def _by_keys(rows):
    """Result rows in one order whatever the order of their sums: sorted by their values, floats
    to 9 significant digits (group keys may be floats: machine-shapes' capacities)."""
    return sorted(rows, key=lambda r: repr([f"{v:.9g}" if isinstance(v, float) else v for v in r]))


def test_resident_sql_gives_the_parquet_results(tmp_path, monkeypatch):
    """Each DuckDB peer the study bench runs over resident tables returns, over the same data, the
    rows it returns over the Parquet files (the resident form only renames the scans)."""
    duckdb = pytest.importorskip("duckdb")
    monkeypatch.syspath_prepend(str(BENCH))
    from analyses_bench import resident_sql
    from gen_canonical import make_dataset
    from references.sql_peers import DUCKDB_SQL
    from study_bench import DUCK_TABLES

    ds = make_dataset(tmp_path / "ds", 20_000, seed=2)
    con = duckdb.connect()
    for t in DUCK_TABLES:
        if (ds / t).is_dir():
            con.execute(
                f"CREATE TABLE {t} AS SELECT * FROM read_parquet('{ds}/{t}/**/*.parquet', hive_partitioning=false)"
            )
    ran = 0
    for peers in DUCKDB_SQL.values():
        for sql_of in peers.values():
            sql = sql_of(ds)
            resident = resident_sql(sql, ds)
            if resident is None:
                assert "file_row_number" in sql
                continue
            assert "read_parquet" not in resident and str(ds) not in resident
            got, want = (_by_keys(con.execute(q).fetchall()) for q in (resident, sql))
            assert len(got) == len(want)
            for g, w in zip(got, want, strict=True):  # the same rows; sums in another order may differ in the last bits
                assert [v for v in g if not isinstance(v, float)] == [v for v in w if not isinstance(v, float)]
                assert [v for v in g if isinstance(v, float)] == pytest.approx(
                    [v for v in w if isinstance(v, float)], rel=1e-9, abs=1e-12, nan_ok=True
                )
            ran += 1
    assert ran >= 8
