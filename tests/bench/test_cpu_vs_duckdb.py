"""bench/cpu_vs_duckdb.py runs end to end (a tiny dataset, one round) and writes what it reports."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"


def cpu_vs_duckdb_cases() -> tuple[str, ...]:
    return ("cell-usage", "cpi (SQL subset)", "lifecycle", "usage-change", "job-usage", "job-usage (tiers)",
            "usage-vs-request", "machine-utilization", "data-quality (SQL subset)")


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
        (c, w) for c in cpu_vs_duckdb_cases() for w in ("gpuclust", "duckdb", "floor")}
    for r in res["rows"]:
        assert r["wall_s"] > 0 and r["peak_rss_mib"] > 0 and len(r["runs"]) == 1
    assert {(r["case"], r["contender"]) for r in res["ratios"]} == {
        (c, w) for c in cpu_vs_duckdb_cases() for w in ("gpuclust", "floor")}
    md = (tmp_path / "c.md").read_text()
    assert "| 20,000 | cell-usage | gpuclust |" in md and "| 20,000 | cell-usage | floor |" in md and "Environment:" in md
    assert res["marginal"] == []  # one size: nothing between sizes


def test_floor_reads_what_the_analysis_reads(tmp_path, monkeypatch):
    """The floor contender reads every row of the case's declared columns (a count checked against
    the dataset's Parquet metadata), and nothing is run but the read."""
    import subprocess

    import pyarrow.parquet as pq

    monkeypatch.syspath_prepend(str(BENCH))
    import cpu_vs_duckdb
    from gen_canonical import make_dataset

    try:
        ds = make_dataset(tmp_path / "ds", 20_000, seed=1)
        cmd = cpu_vs_duckdb.commands("cell-usage", ds, tmp_path / "out")["floor"]
        assert cmd[-1] == "instance_usage"
        cols = cmd[-2].split(",")
        assert cols == ["start_time", "end_time", "collection_id", "instance_index", "machine_id",
                        "alloc_collection_id", "avg_cpu", "avg_mem"]
    finally:
        sys.modules.pop("cpu_vs_duckdb", None)
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    rows = sum(pq.ParquetFile(f).metadata.num_rows for f in (ds / "instance_usage").rglob("*.parquet"))
    assert int(out) == rows > 0
    assert not (tmp_path / "out").exists()


def test_marginal_costs_between_sizes(monkeypatch):
    """Seconds per million windows between consecutive sizes, per case and contender (hand-computed)."""
    monkeypatch.syspath_prepend(str(BENCH))
    import cpu_vs_duckdb

    try:
        rows = [{"size": s, "case": "c", "contender": w, "wall_s": t, "user_s": u, "sys_s": 0.5, "peak_rss_mib": 1}
                for s, w, t, u in ((4_000_000, "gpuclust", 0.6, 0.7), (16_000_000, "gpuclust", 1.2, 1.9),
                                   (4_000_000, "duckdb", 0.3, 0.4), (16_000_000, "duckdb", 0.9, 1.0))]
        m = {r["contender"]: r for r in cpu_vs_duckdb.marginal(rows)}
        md = cpu_vs_duckdb.markdown(rows, {"affinity_cores": 2, "cpu": "x"}, 1, None)
    finally:
        sys.modules.pop("cpu_vs_duckdb", None)
    assert m["gpuclust"]["wall_s_per_m"] == 0.05 and m["gpuclust"]["cpu_s_per_m"] == 0.1
    assert m["duckdb"]["wall_s_per_m"] == 0.05 and m["duckdb"]["cpu_s_per_m"] == 0.05
    assert "| c | gpuclust | 4,000,000 -> 16,000,000 | 0.0500 | 0.1000 | 1.00 |" in md


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
    assert res["layout"] == "bucketed" and {r["contender"] for r in res["rows"]} == {"gpuclust", "duckdb", "floor"}


def test_job_usage_tiers_sql_computes_what_gpuclust_reports(tmp_path, monkeypatch):
    """The DuckDB contender of ``job-usage (tiers)`` does gpuclust's work: its per-tier and overall
    CPU statistics equal gpuclust's ``stats`` table (rows=jobs) on a benchmark dataset."""
    duckdb = pytest.importorskip("duckdb")
    monkeypatch.syspath_prepend(str(BENCH))
    import analyses_bench
    from gen_canonical import make_dataset

    from gpuclust.analyses.registry import create
    from gpuclust.engine import run

    ds = make_dataset(tmp_path / "ds", 40_000, seed=2)
    got = duckdb.sql(analyses_bench.job_usage_tiers_sql(ds)).fetchall()
    stats = run(ds, [create("job-usage")], backend="cpu")["job-usage"]["stats"]
    cpu = stats[stats["resource"] == "cpu"].set_index("tier")
    assert len(got) == len(cpu) >= 2
    for tier, n, total, mean, var, qs, mx, top in got:
        row = cpu.loc[tier or "all"]
        assert n == row["jobs"]
        for a, b in ((total, row["total_hours"]), (mean, row["mean"]), (var, row["variance"]), (qs[0], row["median"]),
                     (qs[1], row["p90"]), (qs[2], row["p99"]), (qs[3], row["p999"]), (mx, row["max"]),
                     (top, row["top1pct_share"])):
            assert a == pytest.approx(b, rel=1e-9)


def test_data_quality_sql_counts_what_gpuclust_reports(tmp_path, monkeypatch):
    """The DuckDB contender of ``data-quality (SQL subset)`` counts what gpuclust's ``checks`` and
    ``columns`` tables report, on a benchmark dataset with planted faults: NULL and NaN values,
    short and long windows, start_time 0, machine 0, p100 below and above max_cpu, swapped
    percentiles, instances without events and windows after a final FINISH."""
    duckdb = pytest.importorskip("duckdb")
    monkeypatch.syspath_prepend(str(BENCH))
    import analyses_bench
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq
    from gen_canonical import make_dataset

    from gpuclust.analyses.registry import create
    from gpuclust.engine import run

    ds = make_dataset(tmp_path / "ds", 20_000, seed=3)
    (uf,) = sorted((ds / "instance_usage").rglob("*.parquet"))
    (ef,) = sorted((ds / "instance_events").rglob("*.parquet"))
    u, ev = pq.read_table(uf), pq.read_table(ef)
    n = u.num_rows
    row = np.arange(n)

    def col(name: str, values: np.ndarray, mask: np.ndarray | None = None) -> None:
        nonlocal u
        u = u.set_column(u.schema.get_field_index(name), name,
                         pa.array(values, type=u.schema.field(name).type, mask=mask))

    s, e = u["start_time"].to_numpy(), u["end_time"].to_numpy()
    col("avg_cpu", u["avg_cpu"].to_numpy(zero_copy_only=False), mask=row % 7 == 0)
    col("avg_mem", np.where(row % 9 == 0, np.nan, u["avg_mem"].to_numpy(zero_copy_only=False)))
    col("end_time", np.where(row % 11 == 0, s + 250_000_000, np.where(row % 13 == 0, s + 900_000_000, e)))
    col("start_time", np.where(row % 101 == 0, 0, s))
    col("machine_id", np.where(row % 17 == 0, 0, u["machine_id"].to_numpy()))
    p100 = u["cpu_p100"].to_numpy(zero_copy_only=False)
    col("max_cpu", np.where(row % 5 == 0, p100 * 2, np.where(row % 5 == 1, p100 / 2, p100)))
    p10, p90 = u["cpu_p10"].to_numpy(zero_copy_only=False), u["cpu_p90"].to_numpy(zero_copy_only=False)
    col("cpu_p10", np.where(row % 19 == 0, p90 + 0.01, p10))
    pq.write_table(u, uf)
    inst = ev["instance_index"].to_numpy()
    keep = inst % 10 != 3  # these instances lose their events: their windows have none
    ev = ev.filter(pa.array(keep))
    inst = ev["instance_index"].to_numpy()
    t = ev["time"].to_numpy().copy()
    early = inst % 10 == 5  # these instances' events, in their order, before any of their windows
    t[early] //= 1000
    ev = ev.set_column(ev.schema.get_field_index("time"), "time", pa.array(t, type=pa.int64()))
    pq.write_table(ev, ef)

    (got,) = duckdb.sql(analyses_bench.data_quality_sql(ds)).fetchall()
    res = run(ds, [create("data-quality")], backend="cpu")["data-quality"]
    checks = {r.check: r.count for r in res["checks"].itertuples() if r.table == "instance_usage"}
    columns = res["columns"][res["columns"]["table"] == "instance_usage"]
    cols = create("data-quality").columns
    assert got[0] == n == checks["rows"]
    assert dict(zip(cols, got[1:1 + len(cols)], strict=True)) == dict(zip(columns["column"], columns["nulls"], strict=True))
    sql = dict(zip(analyses_bench.DATA_QUALITY_SQL_CHECKS, got[1 + len(cols):], strict=True))
    assert sql == {k: checks[k] for k in analyses_bench.DATA_QUALITY_SQL_CHECKS}
    for k in ("short_windows", "long_windows", "p100_below_max", "p100_above_max", "percentiles_non_monotone",
              "start_zero", "machine_zero", "no_events_rows", "after_end_rows"):
        assert sql[k] > 0, k  # every planted fault is there to count
