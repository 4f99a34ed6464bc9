"""bench/cpu_vs_duckdb.py runs end to end (a tiny dataset, one round) and writes what it reports."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"


def test_cpu_vs_duckdb_tiny(tmp_path, monkeypatch):
    pytest.importorskip("duckdb")
    monkeypatch.syspath_prepend(str(BENCH))
    import _harness
    import cpu_vs_duckdb
    from gen_canonical import make_dataset

    monkeypatch.setattr(_harness, "RESULTS", tmp_path)
    ds = make_dataset(tmp_path / "ds", 20_000, seed=1)
    monkeypatch.setattr(cpu_vs_duckdb, "bench_dataset", lambda size: ds)
    try:
        assert cpu_vs_duckdb.main(["--sizes", "2e4", "--repeat", "1", "--name", "c"]) == 0
    finally:
        sys.modules.pop("cpu_vs_duckdb", None)
    res = json.loads((tmp_path / "c.json").read_text())
    assert {(r["case"], r["contender"]) for r in res["rows"]} == {
        (c, w) for c in ("cell-usage", "cpi (SQL subset)") for w in ("gpuclust", "duckdb")}
    for r in res["rows"]:
        assert r["wall_s"] > 0 and r["peak_rss_mib"] > 0 and len(r["runs"]) == 1
    assert {r["case"] for r in res["ratios"]} == {"cell-usage", "cpi (SQL subset)"}
    md = (tmp_path / "c.md").read_text()
    assert "| 20,000 | cell-usage | gpuclust |" in md and "Environment:" in md


def test_cpu_vs_duckdb_bucketed_layout(tmp_path, monkeypatch):
    """``--layout bucketed``: both contenders read the `gpuclust optimize`d copy (hive folders),
    and DuckDB's SQL finds its files there."""
    pytest.importorskip("duckdb")
    monkeypatch.syspath_prepend(str(BENCH))
    import _harness
    import cpu_vs_duckdb
    from gen_canonical import make_dataset

    monkeypatch.setattr(_harness, "RESULTS", tmp_path)
    ds = make_dataset(tmp_path / "canonical-20000", 20_000, seed=1)
    monkeypatch.setattr(cpu_vs_duckdb, "bench_dataset", lambda size, **kw: ds)
    try:
        assert cpu_vs_duckdb.main(["--sizes", "2e4", "--repeat", "1", "--name", "b", "--layout", "bucketed",
                                   "--cases", "cell-usage"]) == 0
    finally:
        sys.modules.pop("cpu_vs_duckdb", None)
    assert (tmp_path / "canonical-20000-bucketed" / "instance_usage").is_dir()
    assert any((tmp_path / "canonical-20000-bucketed" / "instance_usage").glob("bucket=*/*.parquet"))
    res = json.loads((tmp_path / "b.json").read_text())
    assert res["layout"] == "bucketed" and {r["contender"] for r in res["rows"]} == {"gpuclust", "duckdb"}
