"""bench/cpu_vs_duckdb.py runs end to end (a tiny dataset, one round) and writes what it reports."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"


def cpu_vs_duckdb_cases() -> tuple[str, ...]:
    return (
        "cell-usage",
        "cpi (SQL subset)",
        "lifecycle",
        "lifecycle (all tables)",
        "usage-change",
        "usage-change (all tables)",
        "job-usage",
        "job-usage (tiers)",
        "job-usage (all tables)",
        "usage-vs-request",
        "usage-vs-request (all tables)",
        "machine-utilization",
        "machine-utilization (all tables)",
        "data-quality (SQL subset)",
        "data-quality (all tables)",
        "peak-prediction (SQL part)",
    )


def _planted_dataset(tmp_path: Path, windows: int, seed: int) -> tuple[Path, Path, Path]:
    """A benchmark dataset to plant cases in (bench/ on ``sys.path``): the dataset, its one usage
    file and its one events file."""
    from gen_canonical import make_dataset

    ds = make_dataset(tmp_path / "ds", windows, seed=seed)
    (uf,) = sorted((ds / "instance_usage").rglob("*.parquet"))
    (ef,) = sorted((ds / "instance_events").rglob("*.parquet"))
    return ds, uf, ef


def _with(t: Any, name: str, values: Any, mask: Any = None) -> Any:
    """Arrow table ``t`` with column ``name`` replaced by ``values`` (its type kept; NULL where
    ``mask``)."""
    import pyarrow as pa

    return t.set_column(
        t.schema.get_field_index(name), name, pa.array(values, type=t.schema.field(name).type, mask=mask)
    )


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
        (c, w) for c in cpu_vs_duckdb_cases() for w in ("gpuclust", "duckdb", "floor")
    }
    for r in res["rows"]:
        assert r["wall_s"] > 0 and r["peak_rss_mib"] > 0 and len(r["runs"]) == 1
    # the same gpuclust command (and floor) against other SQL: measured once a round, shared; DuckDB's differ
    runs = {(r["case"], r["contender"]): r["runs"] for r in res["rows"]}
    for who in ("gpuclust", "floor"):
        assert runs[("job-usage", who)] == runs[("job-usage (tiers)", who)] == runs[("job-usage (all tables)", who)]
    assert runs[("job-usage", "duckdb")] != runs[("job-usage (tiers)", "duckdb")]
    assert runs[("cell-usage", "gpuclust")] != runs[("cpi (SQL subset)", "gpuclust")]
    assert {(r["case"], r["contender"]) for r in res["ratios"]} == {
        (c, w) for c in cpu_vs_duckdb_cases() for w in ("gpuclust", "floor")
    }
    md = (tmp_path / "c.md").read_text()
    assert (
        "| 20,000 | cell-usage | gpuclust |" in md and "| 20,000 | cell-usage | floor |" in md and "Environment:" in md
    )
    assert res["marginal"] == []  # one size: nothing between sizes


def test_a_refused_case_is_recorded_and_the_others_go_on(tmp_path, monkeypatch):
    """A case whose gpuclust run fails (here: exits 2 with a one-line error, as an analysis that
    needs whole instances does on a large flat table) is listed under ``refused`` with that line
    and left out at the larger sizes; the other cases are measured at every size."""
    pytest.importorskip("duckdb")
    monkeypatch.syspath_prepend(str(BENCH))
    import _harness
    import cpu_vs_duckdb
    from gen_canonical import make_dataset

    monkeypatch.setattr(_harness, "RESULTS", tmp_path)
    ds = make_dataset(tmp_path / "ds", 20_000, seed=1)
    monkeypatch.setattr(cpu_vs_duckdb, "bench_dataset", lambda size: ds)
    commands = cpu_vs_duckdb.commands

    def failing(case: str, *a: Any, **k: Any) -> dict[str, list[str]]:
        cmds = commands(case, *a, **k)
        if case == "lifecycle":
            cmds["gpuclust"] = [
                sys.executable,
                "-c",
                "import sys; print('gpuclust analyze: error: lifecycle: no'); sys.exit(2)",
            ]
        return cmds

    monkeypatch.setattr(cpu_vs_duckdb, "commands", failing)
    try:
        assert (
            cpu_vs_duckdb.main(
                ["--sizes", "2e4,3e4", "--repeat", "1", "--no-floor", "--cases", "lifecycle,cell-usage", "--name", "r"]
            )
            == 0
        )
    finally:
        sys.modules.pop("cpu_vs_duckdb", None)
    res = json.loads((tmp_path / "r.json").read_text())
    assert res["refused"] == [{"size": 20_000, "case": "lifecycle", "error": "gpuclust analyze: error: lifecycle: no"}]
    assert {(r["size"], r["case"]) for r in res["rows"]} == {(20_000, "cell-usage"), (30_000, "cell-usage")}
    assert "* lifecycle at 20,000 windows: gpuclust analyze: error: lifecycle: no" in (tmp_path / "r.md").read_text()


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
        assert cols == [
            "start_time",
            "end_time",
            "collection_id",
            "instance_index",
            "machine_id",
            "alloc_collection_id",
            "avg_cpu",
            "avg_mem",
        ]
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
        rows = [
            {"size": s, "case": "c", "contender": w, "wall_s": t, "user_s": u, "sys_s": 0.5, "peak_rss_mib": 1}
            for s, w, t, u in (
                (4_000_000, "gpuclust", 0.6, 0.7),
                (16_000_000, "gpuclust", 1.2, 1.9),
                (4_000_000, "duckdb", 0.3, 0.4),
                (16_000_000, "duckdb", 0.9, 1.0),
            )
        ]
        m = {r["contender"]: r for r in cpu_vs_duckdb.marginal(rows)}
        md = cpu_vs_duckdb.markdown(rows, {"affinity_cores": 2, "cpu": "x"}, 1, None)
    finally:
        sys.modules.pop("cpu_vs_duckdb", None)
    assert m["gpuclust"]["wall_s_per_m"] == 0.05 and m["gpuclust"]["cpu_s_per_m"] == 0.1
    assert m["duckdb"]["wall_s_per_m"] == 0.05 and m["duckdb"]["cpu_s_per_m"] == 0.05
    assert "| c | gpuclust | 4,000,000 -> 16,000,000 | 0.0500 | 0.1000 | 1.00 |" in md


def test_merge_keeps_the_latest_run_of_each_size_and_case(tmp_path, monkeypatch):
    """``--merge``: per (size, case) the rows of the latest run (by date, whatever the order given),
    each naming its run; ratios and marginal costs within a run; the runs listed in the Markdown
    (``--render`` writes the same); runs of two layouts refused."""
    monkeypatch.syspath_prepend(str(BENCH))
    import _harness
    import cpu_vs_duckdb

    monkeypatch.setattr(_harness, "RESULTS", tmp_path)

    def run(name: str, date: str, cells: list[tuple[int, str, float]], layout: str = "bucketed") -> Path:
        env = {"date": date, "commit": name * 8, "cpu": "x", "affinity_cores": 2, "load_avg_1m": 1.0}
        rows = [
            {"size": s, "case": c, "contender": w, "wall_s": t * k, "user_s": t * k, "sys_s": 0.0, "peak_rss_mib": 1}
            for s, c, t in cells
            for w, k in (("gpuclust", 1.0), ("duckdb", 2.0))
        ]
        p = tmp_path / f"{name}.json"
        p.write_text(json.dumps({"repeat": 3, "layout": layout, "rows": rows, "refused": [], "environment": env}))
        return p

    old = run("a", "2026-11-27 09:00:00 UTC", [(1_000_000, "lifecycle", 1.0), (4_000_000, "lifecycle", 2.0)])
    new = run("b", "2026-11-28 09:00:00 UTC", [(1_000_000, "lifecycle", 0.5), (1_000_000, "cell-usage", 3.0)])
    later = run("d", "2026-11-29 09:00:00 UTC", [(4_000_000, "lifecycle", 1.5), (4_000_000, "cpi", 1.0)])
    try:
        assert cpu_vs_duckdb.main(["--merge", str(new), str(old), "--name", "m"]) == 0
        flat = run("c", "2026-11-28 10:00:00 UTC", [(1_000_000, "lifecycle", 0.5)], layout="flat")
        with pytest.raises(ValueError, match="layouts"):
            cpu_vs_duckdb.merge_runs([old, flat])
        md = (tmp_path / "m.md").read_text()
        assert cpu_vs_duckdb.main(["--render", str(tmp_path / "m.json")]) == 0
        # a merged result takes a further run: the same as merging the three runs at once
        added = cpu_vs_duckdb.merge_runs([tmp_path / "m.json", later])
        assert added == cpu_vs_duckdb.merge_runs([old, later, new])
        assert [r["run"] for r in added["rows"] if r["size"] == 4_000_000] == [2] * 4
    finally:
        sys.modules.pop("cpu_vs_duckdb", None)
    res = json.loads((tmp_path / "m.json").read_text())
    assert [r["source"] for r in res["runs"]] == [str(old), str(new)]  # oldest first
    got = {(r["size"], r["case"], r["contender"]): (r["wall_s"], r["run"]) for r in res["rows"]}
    assert got == {
        (1_000_000, "lifecycle", "gpuclust"): (0.5, 1),
        (1_000_000, "lifecycle", "duckdb"): (1.0, 1),
        (1_000_000, "cell-usage", "gpuclust"): (3.0, 1),
        (1_000_000, "cell-usage", "duckdb"): (6.0, 1),
        (4_000_000, "lifecycle", "gpuclust"): (2.0, 0),
        (4_000_000, "lifecycle", "duckdb"): (4.0, 0),
    }
    assert [(r["size"], r["case"]) for r in res["rows"]][:2] == [(1_000_000, "cell-usage")] * 2  # the CASES order
    assert {r["time"] for r in res["ratios"]} == {0.5}
    assert res["marginal"] == []  # 1e6 and 4e6 of lifecycle are from two runs
    assert "| 4,000,000 | lifecycle | gpuclust | 2.00 | 2.00 | 0.00 | 1 | 0.50 | 0.50 | 1.00 | 0 |" in md
    assert "* 0: 2026-11-27 09:00:00 UTC, commit aaaaaaa, medians of 3" in md
    assert "Environment:" not in md
    assert (tmp_path / "m.md").read_text() == md


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
        assert (
            cpu_vs_duckdb.main(
                ["--sizes", "2e4", "--repeat", "1", "--name", "b", "--layout", "bucketed", "--cases", "cell-usage"]
            )
            == 0
        )
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
    from gen_canonical import make_dataset
    from references.sql_job_usage import job_usage_tiers_sql

    from gpuclust.analyses.registry import create
    from gpuclust.engine import run

    ds = make_dataset(tmp_path / "ds", 40_000, seed=2)
    got = duckdb.sql(job_usage_tiers_sql(ds)).fetchall()
    stats = run(ds, [create("job-usage")], backend="cpu")["job-usage"]["stats"]
    cpu = stats[stats["resource"] == "cpu"].set_index("tier")
    assert len(got) == len(cpu) >= 2
    for tier, n, total, mean, var, qs, mx, top in got:
        row = cpu.loc[tier or "all"]
        assert n == row["jobs"]
        for a, b in (
            (total, row["total_hours"]),
            (mean, row["mean"]),
            (var, row["variance"]),
            (qs[0], row["median"]),
            (qs[1], row["p90"]),
            (qs[2], row["p99"]),
            (qs[3], row["p999"]),
            (mx, row["max"]),
            (top, row["top1pct_share"]),
        ):
            assert a == pytest.approx(b, rel=1e-9)


def test_data_quality_sql_counts_what_gpuclust_reports(tmp_path, monkeypatch):
    """The DuckDB contender of ``data-quality (SQL subset)`` counts what gpuclust's ``checks`` and
    ``columns`` tables report, on a benchmark dataset with planted faults: NULL and NaN values,
    short and long windows, start_time 0, machine 0, p100 below and above max_cpu, swapped
    percentiles, instances without events and windows after a final FINISH."""
    duckdb = pytest.importorskip("duckdb")
    monkeypatch.syspath_prepend(str(BENCH))
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq
    from references.sql_data_quality import DATA_QUALITY_SQL_CHECKS, data_quality_sql

    from gpuclust.analyses.registry import create
    from gpuclust.engine import run

    ds, uf, ef = _planted_dataset(tmp_path, 20_000, seed=3)
    u, ev = pq.read_table(uf), pq.read_table(ef)
    n = u.num_rows
    row = np.arange(n)

    s, e = u["start_time"].to_numpy(), u["end_time"].to_numpy()
    u = _with(u, "avg_cpu", u["avg_cpu"].to_numpy(zero_copy_only=False), mask=row % 7 == 0)
    u = _with(u, "avg_mem", np.where(row % 9 == 0, np.nan, u["avg_mem"].to_numpy(zero_copy_only=False)))
    u = _with(u, "end_time", np.where(row % 11 == 0, s + 250_000_000, np.where(row % 13 == 0, s + 900_000_000, e)))
    u = _with(u, "start_time", np.where(row % 101 == 0, 0, s))
    u = _with(u, "machine_id", np.where(row % 17 == 0, 0, u["machine_id"].to_numpy()))
    p100 = u["cpu_p100"].to_numpy(zero_copy_only=False)
    u = _with(u, "max_cpu", np.where(row % 5 == 0, p100 * 2, np.where(row % 5 == 1, p100 / 2, p100)))
    p10, p90 = u["cpu_p10"].to_numpy(zero_copy_only=False), u["cpu_p90"].to_numpy(zero_copy_only=False)
    u = _with(u, "cpu_p10", np.where(row % 19 == 0, p90 + 0.01, p10))
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

    (got,) = duckdb.sql(data_quality_sql(ds)).fetchall()
    res = run(ds, [create("data-quality")], backend="cpu")["data-quality"]
    checks = {r.check: r.count for r in res["checks"].itertuples() if r.table == "instance_usage"}
    columns = res["columns"][res["columns"]["table"] == "instance_usage"]
    cols = create("data-quality").columns
    assert got[0] == n == checks["rows"]
    assert dict(zip(cols, got[1 : 1 + len(cols)], strict=True)) == dict(
        zip(columns["column"], columns["nulls"], strict=True)
    )
    sql = dict(zip(DATA_QUALITY_SQL_CHECKS, got[1 + len(cols) :], strict=True))
    assert sql == {k: checks[k] for k in DATA_QUALITY_SQL_CHECKS}
    for k in (
        "short_windows",
        "long_windows",
        "p100_below_max",
        "p100_above_max",
        "percentiles_non_monotone",
        "start_zero",
        "machine_zero",
        "no_events_rows",
        "after_end_rows",
    ):
        assert sql[k] > 0, k  # every planted fault is there to count


def test_job_usage_full_sql_writes_what_gpuclust_writes(tmp_path, monkeypatch):
    """The DuckDB contender of ``job-usage (all tables)`` writes gpuclust's four tables: ``jobs``
    (same collections, tiers and windows in the same order; hours to 1e-9), ``stats`` (every
    column, CPU and memory, per tier and over all), ``correlation`` and ``info``, on a benchmark
    dataset with planted faults: NULL and NaN averages, windows that end before they start or at
    2^63-1, rows of alloc sets, collections that use no CPU and keys without events."""
    duckdb = pytest.importorskip("duckdb")
    monkeypatch.syspath_prepend(str(BENCH))
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq
    from references.sql_job_usage import job_usage_full_sql

    from gpuclust.analyses.registry import create
    from gpuclust.engine import run

    ds, uf, ef = _planted_dataset(tmp_path, 40_000, seed=4)
    u, ev = pq.read_table(uf), pq.read_table(ef)
    row = np.arange(u.num_rows)

    s, e = u["start_time"].to_numpy(), u["end_time"].to_numpy()
    coll = u["collection_id"].to_numpy()
    cpu = u["avg_cpu"].to_numpy(zero_copy_only=False)
    u = _with(u, "avg_cpu", np.where(coll % 23 == 0, 0.0, cpu), mask=row % 7 == 0)  # collections without CPU; NULLs
    u = _with(u, "avg_mem", np.where(row % 9 == 0, np.nan, u["avg_mem"].to_numpy(zero_copy_only=False)))
    u = _with(u, "end_time", np.where(row % 31 == 0, s, np.where(row % 37 == 0, np.iinfo(np.int64).max, e)))
    u = _with(u, "collection_type", np.where(coll % 19 == 0, 1, 0))  # alloc sets: not jobs
    pq.write_table(u, uf)
    ev = ev.filter(pa.array(ev["instance_index"].to_numpy() % 10 != 3))  # keys without events
    pq.write_table(ev, ef)

    out = tmp_path / "duck"
    out.mkdir()
    duckdb.connect().execute(job_usage_full_sql(ds, out, tail=0.1))
    got = {t: pq.read_table(out / f"{t}.parquet").to_pandas() for t in ("jobs", "stats", "correlation", "info")}
    res = run(ds, [create("job-usage")], backend="cpu")["job-usage"]

    jobs, want = got["jobs"], res["jobs"]
    assert len(jobs) == len(want) > 500
    for c in ("collection_id", "tier", "windows"):
        assert jobs[c].tolist() == want[c].tolist(), c
    for c in ("ncu_hours", "nmu_hours"):
        np.testing.assert_allclose(jobs[c], want[c], rtol=1e-9, atol=1e-12)
    assert (want["tier"] == "unknown").any() and (want["ncu_hours"] == 0).any()

    def by_key(df: Any, keys: list[str]) -> Any:
        return df.set_index(keys).sort_index()

    for t, keys in (("stats", ["tier", "resource"]), ("correlation", ["tier"])):
        a, b = by_key(got[t], keys), by_key(res[t], keys)
        assert a.index.tolist() == b.index.tolist() and list(a.columns) == list(b.columns), t
        for c in a.columns:
            np.testing.assert_allclose(a[c].astype(float), b[c].astype(float), rtol=1e-7, err_msg=f"{t}.{c}")
    assert (res["stats"]["zero_jobs"] > 0).any()
    info = res["info"].iloc[0]
    for c in got["info"].columns:
        assert int(got["info"][c].iloc[0]) == int(info[c]), c
    for c in ("unknown_cpu_rows", "unknown_mem_rows", "bad_duration_rows"):
        assert info[c] > 0, c
    assert info["used_rows"] < info["rows"]


def _same_table(got: Any, want: Any, keys: list[str], what: str) -> None:
    """Two result tables (DataFrames) hold the same rows, matched by ``keys``: integers and
    strings equal, floats to 1e-9 (NaN where NaN)."""
    import numpy as np

    a, b = got.set_index(keys).sort_index(), want.set_index(keys).sort_index()
    assert a.index.tolist() == b.index.tolist(), what
    assert sorted(a.columns) == sorted(b.columns), what
    for c in b.columns:
        x, y = a[c].to_numpy(), b[c].to_numpy()
        if y.dtype.kind == "f":
            np.testing.assert_allclose(x.astype(float), y, rtol=1e-9, equal_nan=True, err_msg=f"{what}.{c}")
        else:
            assert x.tolist() == y.tolist(), f"{what}.{c}"


def test_lifecycle_full_sql_writes_what_gpuclust_writes(tmp_path, monkeypatch):
    """The DuckDB contender of ``lifecycle (all tables)`` writes gpuclust's tables of every kind
    together (``events``, ``transitions``, ``series``, ``delays``, ``delay_hist``) and the counters
    of ``info``, row for row, on instances with random event sequences over every v3 type (and
    invalid ones), ties at one microsecond, time 0 (instances present at the start), the
    after-trace sentinel, NULL priorities and synthesised events (``missing_type``), in two files.
    ``survival`` and the ``*_by_kind`` tables are not the SQL's."""
    duckdb = pytest.importorskip("duckdb")
    monkeypatch.syspath_prepend(str(BENCH))
    import numpy as np
    import pyarrow.parquet as pq
    from references.sql_lifecycle import lifecycle_full_sql
    from strategies import table, write_dataset

    from gpuclust.analyses.registry import create
    from gpuclust.engine import run

    rng = np.random.default_rng(11)
    n_inst, hour = 1500, 3_600_000_000
    k = rng.integers(1, 12, n_inst)  # events per instance
    inst = np.repeat(np.arange(n_inst), k)
    n = int(inst.shape[0])
    start = rng.choice([0, 0, 5 * hour, 9 * hour + 7], n_inst)[inst]
    step = rng.choice([0, 0, 1, 999_999, 300_000_000, 2 * hour, 10**11], n)
    t = start + np.cumsum(step) - np.cumsum(step)[np.r_[0, np.cumsum(k)[:-1]]][inst]  # per instance from its start
    t = np.where(rng.integers(0, 30, n) == 0, np.iinfo(np.int64).max, t)
    e = rng.choice([0, 0, 0, 1, 2, 2, 3, 3, 3, 4, 5, 6, 6, 7, 8, 9, 10, 11], n)  # 11: no such type
    prio = rng.choice([-1, 0, 99, 105, 118, 120, 360], n_inst)[inst]
    null = (rng.integers(0, 8, n) == 0) | (prio < 0)
    perm = rng.permutation(n)
    miss = rng.choice([-1, -1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 2, 3, 4, 5], n)  # -1: NULL (NONE); 1..5 synthesised
    cols = {
        "time": t[perm].tolist(),
        "type": e[perm].tolist(),
        "collection_id": (inst[perm] // 4 + 2**40).tolist(),
        "instance_index": (inst[perm] % 4).tolist(),
        "priority": [None if z else int(p) for z, p in zip(null[perm], prio[perm], strict=True)],
        "missing_type": [None if m < 0 else int(m) for m in miss[perm]],
    }
    ds = write_dataset(tmp_path / "ds", {"instance_events": table("instance_events", cols)}, files=2)

    out = tmp_path / "duck"
    out.mkdir()
    duckdb.connect().execute(lifecycle_full_sql(ds, out, bucket_s=1800))
    res = run(ds, [create("lifecycle", bucket_s=1800)], backend="cpu")["lifecycle"]
    got = {
        name: pq.read_table(out / f"{name}.parquet").to_pandas()
        for name in ("events", "transitions", "series", "delays", "delay_hist", "info")
    }
    for name, keys in (
        ("events", ["tier", "event"]),
        ("transitions", ["tier", "from_event", "to_event"]),
        ("series", ["bucket", "tier"]),
        ("delays", ["tier", "measure", "outcome"]),
        ("delay_hist", ["tier", "measure", "outcome", "bin"]),
    ):
        _same_table(got[name], res[name], keys, name)
    measures = set(zip(res["delays"]["measure"], res["delays"]["outcome"], strict=True))
    assert {
        ("enable_to_schedule", "scheduled"),
        ("scheduling", "censored"),
        ("execution", "censored"),
        ("scheduling", "resubmitted"),
        ("execution", "interrupted"),
        ("queued", "enabled"),
        ("queued", "scheduled"),
        ("queued", "died"),
        ("queued", "censored"),
    } <= measures
    info = res["info"].iloc[0]
    assert {"present_at_start", "synthesized_events", "synthesized_duration_episodes"} <= set(got["info"].columns)
    for c in got["info"].columns:
        assert int(got["info"][c].iloc[0]) == int(info[c]), c
    for c in (
        "invalid_type_rows",
        "time_zero_events",
        "after_trace_events",
        "unexpected_transitions",
        "unknown_priority_instances",
        "first_not_submit",
        "present_at_start",
        "synthesized_events",
        "synthesized_duration_episodes",
    ):
        assert info[c] > 0, c
    series = res["series"]
    for c in ("new_submissions", "resubmissions", "present_at_start", "queued", "eligible"):
        assert series[c].sum() > 0, c


def test_usage_vs_request_full_sql_writes_what_gpuclust_writes(tmp_path, monkeypatch):
    """The DuckDB contender of ``usage-vs-request (all tables)`` writes gpuclust's tables row for
    row on a benchmark dataset with planted cases: NULL and NaN usage, zero, NULL and changing
    requests (two at one microsecond: the later row wins), windows before their instance's first
    request, instances without events and windows on machines their key has no event on."""
    duckdb = pytest.importorskip("duckdb")
    monkeypatch.syspath_prepend(str(BENCH))
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq
    from references.sql_usage_vs_request import usage_vs_request_full_sql

    from gpuclust.analyses.registry import create
    from gpuclust.engine import run

    ds, uf, ef = _planted_dataset(tmp_path, 30_000, seed=5)
    u, ev = pq.read_table(uf), pq.read_table(ef)
    row = np.arange(u.num_rows)
    u = _with(u, "avg_cpu", u["avg_cpu"].to_numpy(zero_copy_only=False), mask=row % 13 == 0)
    u = _with(u, "max_mem", np.where(row % 11 == 0, np.nan, u["max_mem"].to_numpy(zero_copy_only=False)))
    u = _with(u, "machine_id", np.where(row % 17 == 0, 123_456_789, u["machine_id"].to_numpy()))  # no event there
    pq.write_table(u, uf)
    inst = ev["instance_index"].to_numpy()
    keep = inst % 10 != 3  # instances without events
    ev = ev.filter(pa.array(keep))
    k = np.arange(ev.num_rows)
    t = ev["time"].to_numpy()
    req = ev["req_cpu"].to_numpy(zero_copy_only=False)
    ev = _with(ev, "req_cpu", np.where(k % 7 == 0, 0.0, req * (1 + (k % 3))), mask=k % 9 == 0)
    ev = _with(ev, "req_mem", np.where(k % 5 == 0, 0.0, ev["req_mem"].to_numpy(zero_copy_only=False)))
    ev = _with(ev, "time", np.where(k % 4 == 1, t + 10**11, t))  # later requests (windows before them)
    tie = ev.slice(0, 500)  # a second event at the same microsecond, a later row: its request wins
    tie = _with(tie, "req_cpu", tie["req_cpu"].to_numpy(zero_copy_only=False) * 3)
    pq.write_table(pa.concat_tables([ev, tie]), ef)

    out = tmp_path / "duck"
    out.mkdir()
    duckdb.connect().execute(usage_vs_request_full_sql(ds, out))
    res = run(ds, [create("usage-vs-request")], backend="cpu")["usage-vs-request"]
    got = {name: pq.read_table(out / f"{name}.parquet").to_pandas() for name in ("summary", "hist", "info")}
    _same_table(got["summary"], res["summary"], ["tier", "measure"], "summary")
    _same_table(got["hist"], res["hist"], ["tier", "measure", "bin"], "hist")
    assert int(got["info"]["windows"].iloc[0]) == int(res["info"]["windows"].iloc[0]) == u.num_rows
    s = res["summary"].set_index(["tier", "measure"])
    for c in ("no_limit", "unknown", "above_limit", "at_most_half"):
        assert s[c].sum() > 0, c
    assert ("unknown", "cpu_avg") in s.index


@pytest.mark.parametrize("max_gap_s", [0, 400])
def test_usage_change_full_sql_writes_what_gpuclust_writes(tmp_path, monkeypatch, max_gap_s):
    """The DuckDB contender of ``usage-change (all tables)`` writes gpuclust's tables row for row
    on a benchmark dataset with planted cases: NULL and NaN usage, zero usage before zero and
    positive usage, windows apart (gaps), windows ending at 2^63-1, two windows of an instance
    starting at one microsecond (row order decides), and keys without events."""
    duckdb = pytest.importorskip("duckdb")
    monkeypatch.syspath_prepend(str(BENCH))
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq
    from references.sql_usage_change import usage_change_full_sql

    from gpuclust.analyses.registry import create
    from gpuclust.engine import run

    ds, uf, ef = _planted_dataset(tmp_path, 30_000, seed=6)
    u = pq.read_table(uf)
    row = np.arange(u.num_rows)
    s, e = u["start_time"].to_numpy(), u["end_time"].to_numpy()
    u = _with(
        u, "avg_cpu", np.where(row % 5 == 0, 0.0, u["avg_cpu"].to_numpy(zero_copy_only=False)), mask=row % 13 == 0
    )
    u = _with(
        u,
        "avg_mem",
        np.where(row % 11 == 0, np.nan, np.where(row % 7 < 2, 0.0, u["avg_mem"].to_numpy(zero_copy_only=False))),
    )
    u = _with(
        u, "end_time", np.where(row % 29 == 0, np.iinfo(np.int64).max, np.where(row % 31 == 0, e - 200_000_000, e))
    )
    u = _with(u, "start_time", np.where(row % 37 == 0, s + 300_000_000, s))  # gaps; ties with the next window
    ev = pq.read_table(ef)
    ev = ev.filter(pa.array(ev["instance_index"].to_numpy() % 10 != 3))  # keys without events
    pq.write_table(ev, ef)
    half = u.num_rows // 2  # two files: ties across them keep the files' order
    pq.write_table(u.slice(0, half), uf)
    pq.write_table(u.slice(half), uf.with_name("part-bench-00001.parquet"))
    manifest = json.loads((ds / "manifest.json").read_text())
    manifest["tables"]["instance_usage"]["files"].append("instance_usage/part-bench-00001.parquet")
    (ds / "manifest.json").write_text(json.dumps(manifest))

    out = tmp_path / "duck"
    out.mkdir()
    duckdb.connect().execute(usage_change_full_sql(ds, out, max_gap_s=max_gap_s))
    res = run(ds, [create("usage-change", level="instance", max_gap_s=max_gap_s)], backend="cpu")["usage-change"]
    got = {name: pq.read_table(out / f"{name}.parquet").to_pandas() for name in res}
    _same_table(got["summary"], res["summary"], ["tier", "resource"], "summary")
    _same_table(got["hist"], res["hist"], ["tier", "resource", "bin"], "hist")
    info = res["info"].iloc[0]
    for c in got["info"].columns:
        assert int(got["info"][c].iloc[0]) == int(info[c]), c
    sm = res["summary"]
    for c in ("unknown", "zero_to_zero", "zero_to_positive"):
        assert sm[c].sum() > 0, c
    assert info["gaps"] > 0 and info["unplaced_ends"] > 0 and (sm["tier"] == "unknown").any()


def _add_file(ds: Path, table: str, t: Any, name: str) -> None:
    """Write ``t`` as one more Parquet file of ``table`` and list it in the manifest (after the
    others: its rows come later in the dataset's row order)."""
    import pyarrow.parquet as pq

    from gpuclust.schema import SCHEMAS

    (ds / table).mkdir(exist_ok=True)
    pq.write_table(t.select(SCHEMAS[table].names).cast(SCHEMAS[table]), ds / table / name)
    manifest = json.loads((ds / "manifest.json").read_text())
    entry = manifest["tables"].setdefault(table, {"rows": 0, "files": []})
    entry["files"] = sorted([*entry.get("files", []), f"{table}/{name}"])
    entry["rows"] = entry.get("rows", 0) + t.num_rows
    (ds / "manifest.json").write_text(json.dumps(manifest))


def _data_quality_dataset(tmp_path: Path) -> Path:
    """A benchmark dataset with data-quality's faults planted in every table (see the test)."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq
    from strategies import table

    ds, uf, ef = _planted_dataset(tmp_path, 30_000, seed=7)
    never, s_ = np.iinfo(np.int64).max, 1_000_000
    # -- instance_usage ------------------------------------------------------------------------
    u = pq.read_table(uf)
    row = np.arange(u.num_rows)

    def col(name: str) -> Any:
        return u[name].to_numpy(zero_copy_only=False).copy()

    s, e = col("start_time"), col("end_time")
    cpu = col("avg_cpu")
    cpu[row % 23 == 0] = np.nan
    cpu[row % 29 == 0] = 1e-6  # too little CPU time for CPI
    u = _with(u, "avg_cpu", cpu, mask=row % 7 == 0)
    u = _with(u, "avg_mem", np.where(row % 9 == 0, np.nan, col("avg_mem")))
    cpi, mai = col("cpi"), col("mai")
    cpi = np.where(row % 31 == 0, 150.0, np.where(row % 37 == 0, 0.0, np.where(row % 43 == 0, np.nan, cpi)))
    cpi = np.where(row % 53 == 0, np.inf, cpi)
    mai = np.where(row % 41 == 0, 2.0, np.where(row % 47 == 0, -0.1, mai))
    u = _with(u, "cpi", cpi, mask=np.isnan(cpi) & (row % 2 == 0))  # NULL and NaN
    u = _with(u, "mai", mai)
    e = np.where(row % 11 == 0, s + 250 * s_, np.where(row % 13 == 0, s + 900 * s_, e))
    e = np.where(row % 79 == 0, s + 30 * s_, np.where(row % 59 == 0, s, np.where(row % 61 == 0, s - 100 * s_, e)))
    e = np.where(row % 67 == 0, never, np.where(row % 73 == 0, 0, e))
    s = np.where(row % 101 == 0, 0, np.where(row % 71 == 0, never, s))
    u = _with(u, "end_time", e)
    u = _with(u, "start_time", s)
    u = _with(u, "machine_id", np.where(row % 17 == 0, 0, np.where(row % 83 == 0, -1, col("machine_id"))))
    p100 = col("cpu_p100")
    mx = np.where(row % 5 == 0, p100 * 2, np.where(row % 5 == 1, p100 / 2, p100))
    mx = np.where(row % 113 == 0, 0.0, np.where(row % 127 == 0, p100 * 1e5, np.where(row % 131 == 0, np.nan, mx)))
    u = _with(u, "max_cpu", mx, mask=row % 107 == 0)
    u = _with(u, "cpu_p100", np.where(row % 109 == 0, 0.0, p100))
    u = _with(u, "cpu_p10", np.where(row % 19 == 0, col("cpu_p90") + 0.01, col("cpu_p10")))
    u = _with(u, "cpu_p30", np.where(row % 103 == 0, col("cpu_p10") * 0.9, col("cpu_p30")))  # below p10, across a NULL
    u = _with(u, "cpu_p20", col("cpu_p20"), mask=(row % 103 == 0) | (row % 97 == 0))
    u = _with(u, "cpu_p0", np.where(row % 97 == 0, np.nan, col("cpu_p0")))  # partly NULL (NaN), monotone
    for c in (
        "cpu_p0",
        "cpu_p10",
        "cpu_p20",
        "cpu_p30",
        "cpu_p40",
        "cpu_p50",
        "cpu_p60",
        "cpu_p70",
        "cpu_p80",
        "cpu_p90",
        "cpu_p91",
        "cpu_p92",
        "cpu_p93",
        "cpu_p94",
        "cpu_p95",
        "cpu_p96",
        "cpu_p97",
        "cpu_p98",
        "cpu_p99",
        "cpu_p100",
    ):
        x = col(c)
        u = _with(
            u,
            c,
            np.where(row % 139 == 0, np.nan, x),
            mask=(row % 89 == 0) | u[c].is_null().to_numpy(zero_copy_only=False),
        )  # all NULL; all NULL or NaN
    pq.write_table(u, uf)

    # -- instance_events: two files; the second's rows come later ------------------------------
    ev = pq.read_table(ef)  # SCHEDULE at each instance's first window, FINISH at the end of its last
    ev = ev.filter(pa.array(ev["instance_index"].to_numpy() % 10 != 3))  # instances without events
    g = ev["instance_index"].to_numpy() % 10
    typ, t = ev["type"].to_numpy(), ev["time"].to_numpy()
    fin = typ == 6
    start = dict(
        zip(
            zip(
                ev["collection_id"].to_numpy()[~fin].tolist(),
                ev["instance_index"].to_numpy()[~fin].tolist(),
                strict=True,
            ),
            t[~fin].tolist(),
            strict=True,
        )
    )
    t = np.where(fin & (g == 5), t - 450 * s_, t)  # a window past the end, one after it (< 300 s)
    t = np.where(fin & (g == 6), t - 900 * s_, t)  # windows at the end, exactly 300 s after it, later
    t = np.where(fin & np.isin(g, [7, 8]), t - 1000 * s_, t)
    t = np.where(~fin & (g == 2), 0, np.where(fin & (g == 4), never, t))  # snapshot; a death after the trace
    k = np.arange(ev.num_rows)
    ev = _with(ev, "time", t)
    ev = _with(ev, "machine_id", np.where(k % 13 == 0, 0, np.where(k % 17 == 0, -1, ev["machine_id"].to_numpy())))
    ev = _with(ev, "missing_type", np.where(k % 19 == 0, 3, 0), mask=k % 23 == 0)
    ev = _with(ev, "req_cpu", np.where(k % 29 == 0, np.nan, ev["req_cpu"].to_numpy(zero_copy_only=False)))
    first = np.flatnonzero((g == 1) & fin)  # these instances' FINISH rows first: time goes backwards
    ev = ev.take(pa.array(np.r_[first, np.setdiff1d(k, first)]))
    pq.write_table(ev, ef)
    fin_rows = ev.filter(pc.equal(ev["type"], 6)).to_pylist()
    extra = []
    for r in fin_rows:
        i, c = r["instance_index"], r["collection_id"]
        if i % 10 == 7:  # resubmitted after its death: no final terminal event
            extra.append({**r, "type": 0, "time": r["time"] + 500 * s_})
        elif i % 10 == 8:  # a SUBMIT at its FINISH's microsecond, a later row: the last event
            extra.append({**r, "type": 0})
        elif i % 10 == 9:  # a SUBMIT while running (out of order, twice), listed after its FINISH
            extra.append({**r, "type": 0, "time": start[(c, i)] + 1})
        elif i % 10 == 0 and c % 3 == 0:  # an EVICT at the SCHEDULE's microsecond, a later row
            extra.append({**r, "type": 4, "time": start[(c, i)]})
        elif i % 10 == 0 and c % 3 == 1:  # an UPDATE_PENDING while running
            extra.append({**r, "type": 9, "time": start[(c, i)] + 7})
    for j in range(40):  # instances with events and no usage
        base = {**fin_rows[0], "collection_id": 777_000 + j, "instance_index": j}
        extra += [
            {**base, "type": 0, "time": 10 * s_},
            {**base, "type": 3, "time": 20 * s_},
            {**base, "type": 6, "time": 30 * s_ + j},
        ]
    _add_file(ds, "instance_events", pa.Table.from_pylist(extra, schema=ev.schema), "part-bench-00001.parquet")

    # -- collection_events: random life cycles, ties, sentinels ---------------------------------
    rng = np.random.default_rng(3)
    n_coll = 300
    kk = rng.integers(1, 8, n_coll)
    cid = np.repeat(np.arange(n_coll), kk)
    n = int(cid.shape[0])
    tc = rng.choice([0, 5 * s_, 7 * s_, 7 * s_, 9 * s_, never], n)
    tc = np.where(rng.integers(0, 3, n) == 0, 0, tc)
    types = rng.choice([0, 0, 1, 2, 3, 3, 4, 5, 6, 7, 8, 9, 10], n)
    ce = table(
        "collection_events",
        {
            "time": tc.tolist(),
            "type": types.tolist(),
            "collection_id": (cid + 5_000).tolist(),
            "missing_type": [None if z % 11 == 0 else (7 if z % 13 == 0 else 0) for z in range(n)],
            "user": [None if z % 5 == 0 else f"u{z % 9}" for z in range(n)],
            "start_after_collection_ids": [None if z % 4 == 0 else [z] for z in range(n)],
            "priority": [None if z % 6 == 0 else 200 for z in range(n)],
        },
    )
    half = n // 2  # two files, a collection's events across both
    _add_file(ds, "collection_events", ce.slice(0, half), "part-00000.parquet")
    _add_file(ds, "collection_events", ce.slice(half), "part-00001.parquet")

    # -- machine_events --------------------------------------------------------------------------
    me_f = next((ds / "machine_events").rglob("*.parquet"))
    me = pq.read_table(me_f)  # an ADD at time 0 per machine, with capacity
    m = me["machine_id"].to_numpy().tolist()
    rows = [  # (machine, time, type, cap_cpu, missing_data_reason)
        (m[0], 10, 3, 0.5, 0),
        (m[0], 20, 2, 0.5, 0),
        (m[0], 30, 1, 0.5, 0),  # in order
        (m[1], 10, 1, 0.5, 0),  # ADD after ADD
        (m[2], 10, 2, 0.5, 0),
        (m[2], 20, 2, 0.5, 0),
        (m[2], 30, 3, 0.5, 0),  # REMOVE, UPDATE after REMOVE
        (m[3], 10, 0, 0.5, 0),
        (m[3], 20, 1, 0.5, 0),  # UNKNOWN: never flagged, nor what follows it
        (m[4], 10, 12, 0.5, None),
        (m[4], 20, 1, 0.5, 3),  # a code outside 0..10
        (m[5], 50, 2, 0.5, 0),
        (m[5], 50, 1, 0.5, 0),  # a tie: REMOVE then ADD, in row order
        (m[6], 5, 3, None, 0),
        (m[6], 6, 3, 0.5, 0),  # a NULL capacity
        (m[7], 7, 3, np.nan, 0),
        (m[8], never, 2, 0.5, 0),
        (m[9], 100, 3, 0.5, 0),
        (m[9], 50, 3, 0.5, 0),  # backwards in row order
        (123, 0, 1, None, 0),
        (123, 5, 3, None, None),  # never a capacity
        (0, 0, 1, 0.5, 0),
        (-1, 0, 1, 0.5, 0),
    ]
    more = pa.table(
        {
            "time": [r[1] for r in rows],
            "machine_id": [r[0] for r in rows],
            "type": [r[2] for r in rows],
            "switch_id": pa.nulls(len(rows), pa.string()),
            "cap_cpu": [r[3] for r in rows],
            "cap_mem": [0.25] * len(rows),
            "platform_id": [None] * len(rows),
            "missing_data_reason": [r[4] for r in rows],
        }
    )
    _add_file(ds, "machine_events", more, "part-bench-00001.parquet")
    return ds


@pytest.mark.parametrize(("short_window_s", "row_order"), [(300, False), (60, True)])
def test_data_quality_full_sql_writes_what_gpuclust_writes(tmp_path, monkeypatch, short_window_s, row_order):
    """The DuckDB contender of ``data-quality (all tables)`` writes gpuclust's five tables, every row
    and column, on a benchmark dataset with planted faults: NULL and NaN values (floats, strings,
    lists, codes), time sentinels (0, 2^63-1) and machines 0 / -1 in every table, short, long, zero-
    length and reversed windows, NULL, partly NULL (across which a vector descends) and non-monotone
    percentile vectors, max above, below, without p100 and p100 = 0, implausible CPU time, CPI and
    MAI, usage without events and events without usage, windows after an instance's final
    terminal event (and 300 s after), running past it, a death after the trace, resubmissions,
    ties in time broken by the rows' order (within a file and across two), events out of order,
    rows backwards in time, machine events in and out of order with NULL, NaN and never a
    capacity, and codes NULL, unknown and outside 0..10."""
    duckdb = pytest.importorskip("duckdb")
    monkeypatch.syspath_prepend(str(BENCH))
    monkeypatch.syspath_prepend(str(BENCH.parent / "tests"))
    import pyarrow.parquet as pq
    from references.sql_data_quality import data_quality_full_sql

    from gpuclust.analyses.registry import create
    from gpuclust.engine import run

    ds = _data_quality_dataset(tmp_path)
    out = tmp_path / "duck"
    out.mkdir()
    duckdb.connect().execute(data_quality_full_sql(ds, out, short_window_s=short_window_s, row_order=row_order))
    res = run(ds, [create("data-quality", short_window_s=short_window_s, row_order=row_order)], backend="cpu")[
        "data-quality"
    ]
    got = {name: pq.read_table(out / f"{name}.parquet").to_pandas() for name in res}
    assert set(got) == {"checks", "columns", "codes", "max_over_p100", "info"}
    for name, keys in (
        ("checks", ["table", "check"]),
        ("columns", ["table", "column"]),
        ("codes", ["table", "column", "code"]),
        ("max_over_p100", ["bin"]),
        ("info", ["analysis"]),
    ):
        assert list(got[name].columns) == list(res[name].columns), name
        _same_table(got[name], res[name], keys, name)
    assert got["checks"][["table", "check"]].values.tolist() == res["checks"][["table", "check"]].values.tolist()

    c = res["checks"].set_index(["table", "check"])["count"]
    planted = [
        ("instance_usage", k)
        for k in (
            "start_zero",
            "start_after_trace",
            "end_zero",
            "end_after_trace",
            "machine_zero",
            "machine_dedicated",
            "end_before_start",
            "zero_length",
            "short_windows",
            "long_windows",
            "percentiles_null",
            "percentiles_partly_null",
            "percentiles_non_monotone",
            "p100_below_max",
            "p100_above_max",
            "cpi_mai_low_cpu_time",
            "cpi_out_of_range",
            "mai_out_of_range",
            "no_events_rows",
            "no_events_instances",
            "after_end_rows",
            "after_end_300s_rows",
            "after_end_instances",
            "past_end_rows",
        )
    ]
    planted += [
        (t, k)
        for t in ("instance_events", "collection_events", "machine_events")
        for k in ("time_zero", "time_after_trace", "time_ties", "out_of_order")
    ]
    planted += [("instance_events", k) for k in ("machine_zero", "machine_dedicated", "instances_without_usage")]
    planted += [
        ("machine_events", k)
        for k in ("machine_zero", "machine_dedicated", "null_capacity_rows", "never_capacity_machines")
    ]
    if row_order:
        planted += [(t, "time_backwards") for t in ("instance_events", "collection_events", "machine_events")]
    for k in planted:
        assert c[k] > 0, k
    assert c[("instance_usage", "after_end_300s_rows")] < c[("instance_usage", "after_end_rows")]
    assert {-1, -2} <= set(res["codes"]["code"]) and "unknown" in set(res["codes"]["name"])
    assert len(res["max_over_p100"]) > 3 and {0, 161} <= set(res["max_over_p100"]["bin"])
    cols = res["columns"].set_index(["table", "column"])["nulls"]
    for k in (
        ("collection_events", "user"),
        ("collection_events", "start_after_collection_ids"),
        ("instance_usage", "avg_mem"),
        ("instance_events", "req_cpu"),
        ("machine_events", "cap_cpu"),
    ):
        assert 0 < cols[k], k


@pytest.mark.parametrize("missing", [("instance_usage",), ("instance_events", "machine_events")])
def test_data_quality_full_sql_with_tables_missing(tmp_path, monkeypatch, missing):
    """Tables the dataset does not have (no folder at all: collection_events here, and ``missing``)
    get no rows in ``checks``, ``columns`` and ``codes`` and a row count of 0 in ``info``, as in
    gpuclust's tables: an events-only dataset (no usage: no ``instances_without_usage``, no bins,
    NaN quantiles) and a usage-only one (every window without events)."""
    duckdb = pytest.importorskip("duckdb")
    monkeypatch.syspath_prepend(str(BENCH))
    import shutil

    import pyarrow.parquet as pq
    from references.sql_data_quality import data_quality_full_sql

    from gpuclust.analyses.registry import create
    from gpuclust.engine import run

    ds, _, _ = _planted_dataset(tmp_path, 5_000, seed=8)
    manifest = json.loads((ds / "manifest.json").read_text())
    for t in ("collection_events", *missing):  # the generator writes collection events: none here
        shutil.rmtree(ds / t)
        manifest["tables"][t] = {"rows": 0, "files": []}
    (ds / "manifest.json").write_text(json.dumps(manifest))
    assert not (ds / "collection_events").exists()
    out = tmp_path / "duck"
    out.mkdir()
    duckdb.connect().execute(data_quality_full_sql(ds, out, row_order=True))
    res = run(ds, [create("data-quality", row_order=True)], backend="cpu")["data-quality"]
    got = {name: pq.read_table(out / f"{name}.parquet").to_pandas() for name in res}
    for name, keys in (
        ("checks", ["table", "check"]),
        ("columns", ["table", "column"]),
        ("codes", ["table", "column", "code"]),
        ("max_over_p100", ["bin"]),
        ("info", ["analysis"]),
    ):
        _same_table(got[name], res[name], keys, name)
    assert set(res["checks"]["table"]).isdisjoint({"collection_events", *missing})
    info = res["info"].iloc[0]
    assert all(info[f"{t}_rows"] == 0 for t in ("collection_events", *missing))


def _machine_utilization_dataset(tmp_path: Path) -> Path:
    """A benchmark dataset with machine-utilization's cases planted (see the test)."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    ds, uf, _ = _planted_dataset(tmp_path, 20_000, seed=9)
    never, b_us = np.iinfo(np.int64).max, 300_000_000
    me_f = next((ds / "machine_events").rglob("*.parquet"))
    me = pq.read_table(me_f)  # an ADD at time 0 per machine, with capacity
    m = me["machine_id"].to_numpy()
    # -- instance_usage: 300 s windows on the 5-minute grid, about 12 a machine-bucket ------------
    u = pq.read_table(uf)
    row = np.arange(u.num_rows)

    def col(name: str) -> Any:
        return u[name].to_numpy(zero_copy_only=False).copy()

    s, e, mach = col("start_time"), col("end_time"), col("machine_id")
    cpu, mem = col("avg_cpu"), col("avg_mem")
    cpu[mach == m[5]] *= 20  # far over capacity: the notebook's cap
    cpu_null = (row % 7 == 0) | ((mach == m[0]) & ((s // b_us) % 3 == 0))  # NULL; every window NULL (m[0])
    mem[row % 9 == 0] = np.nan  # NaN is NULL
    shift = np.where(row % 19 == 0, -1, np.where(row % 23 == 0, 1, 0))  # 1 µs before / after a bucket's start
    s, e = s + shift, e + shift
    e = np.where(row % 11 == 0, s + b_us - 1, np.where(row % 13 == 0, s + 3 * b_us + 7, e))  # 1 µs short; long
    e = np.where(row % 29 == 0, never, np.where(row % 31 == 0, s, np.where(row % 37 == 0, s - 5, e)))
    s = np.where(row % 41 == 0, never, s)  # unplaced start (ending before it)
    e = np.where((row % 43 == 0) & (s != never), s + 1, np.where(row % 53 == 0, never, e))
    s = np.where(row % 53 == 0, never, s)  # both at the sentinel
    u = _with(u, "alloc_collection_id", col("alloc_collection_id"), mask=row % 47 == 0)  # NULL: top level
    u = _with(u, "avg_cpu", cpu, mask=cpu_null)
    u = _with(u, "avg_mem", mem)
    u = _with(u, "start_time", s)
    u = _with(u, "end_time", e)
    u = _with(u, "machine_id", np.where(row % 17 == 0, 123_456_789, mach))  # not in machine_events
    # buckets far from the rest: only unknown CPU ratios (NULL usage; capacity 0), none known at all,
    # usage exactly at capacity (not over it)
    cc, cm = me["cap_cpu"].to_numpy(zero_copy_only=False).copy(), me["cap_mem"].to_numpy(zero_copy_only=False).copy()
    far = 100 * b_us  # (the time-weighted mode has a row per machine-bucket up to here)
    lone = u.slice(0, 7)
    starts = np.array([far, far + 5, far + b_us, far + b_us, far + 2 * b_us, far + 3 * b_us + 1, far + 5 * b_us])
    lone = _with(lone, "start_time", starts)
    lone = _with(lone, "end_time", starts + b_us)
    lone = _with(lone, "machine_id", [m[8], m[8], m[2], m[2], 997, 997, m[9]])
    lone = _with(lone, "alloc_collection_id", [0] * 7)
    lone = _with(lone, "avg_cpu", [0.1] * 6 + [cc[9]], mask=np.array([True, True] + [False] * 5))
    lone = _with(lone, "avg_mem", [0.1] * 6 + [cm[9]])
    # one file: DuckDB 2.0.1 folds isnan() to false from its min/max (not from two files')
    pq.write_table(pa.concat_tables([u, lone]), uf)
    # -- machine_events: capacities NULL, 0, -0.0, over two rows; machines without usage -----------
    cc[2], cm[3], cc[4] = 0.0, 0.0, -0.0
    k = np.arange(len(m))
    me = _with(me, "cap_cpu", cc, mask=k == 1)
    me = _with(me, "cap_mem", cm, mask=k == 6)
    pq.write_table(me, me_f)
    rows = [
        (m[7], 3, 2.0, None),
        (m[7], 3, None, 3.0),
        (m[1], 3, None, None),  # the MAX of its rows; still none
        (999, 1, 0.5, 0.5),
        (998, 1, None, 0.5),
        (997, 1, None, None),  # 999, 998: no usage
        (996, 3, 0.5, 0.5),  # only an UPDATE: never up
        (m[3], 2, None, None),
        (m[3], 1, 0.4, 0.4),
    ]  # removed mid-bucket 10, added again in bucket 20
    times = [10 * (i + 1) for i in range(len(rows) - 2)] + [10 * b_us + 123_456_789, 20 * b_us + 7]
    more = pa.table(
        {
            "time": times,
            "machine_id": [r[0] for r in rows],
            "type": [r[1] for r in rows],
            "switch_id": pa.nulls(len(rows), pa.string()),
            "cap_cpu": pa.array([r[2] for r in rows], pa.float32()),
            "cap_mem": pa.array([r[3] for r in rows], pa.float32()),
            "platform_id": [None] * len(rows),
            "missing_data_reason": [0] * len(rows),
        }
    )
    _add_file(ds, "machine_events", more, "part-bench-00001.parquet")
    return ds


@pytest.mark.parametrize("mode", ["notebook", "time-weighted"])
def test_machine_utilization_full_sql_writes_what_gpuclust_writes(tmp_path, monkeypatch, mode):
    """The DuckDB contender of ``machine-utilization (all tables)`` writes gpuclust's five tables,
    every row and column (the ``machine`` table against the parts gpuclust writes under its results
    folder), on a benchmark dataset with planted cases: NULL and NaN usage (and machine-buckets
    whose every window is NULL), alloc rows (and NULL ``alloc_collection_id``: top level), windows
    1 µs short of 300 s, long ones, zero-length, reversed and at 2^63-1, windows starting 1 µs
    before and after a bucket's start, machines without capacity, capacity 0 and -0.0, capacity
    over two rows, usage above capacity (the notebook's cap), usage on machines absent from
    machine_events, machines with events and no usage, and buckets with no known CPU ratio or no
    known ratio at all."""
    duckdb = pytest.importorskip("duckdb")
    monkeypatch.syspath_prepend(str(BENCH))
    import pyarrow.parquet as pq
    from references.sql_machine_utilization import machine_utilization_full_sql

    from gpuclust.analyses.registry import create
    from gpuclust.parted import PartedTable
    from gpuclust.report.analyze import analyze

    ds = _machine_utilization_dataset(tmp_path)
    out = tmp_path / "duck"
    out.mkdir()
    duckdb.connect().execute(machine_utilization_full_sql(ds, out, mode=mode))
    gp = tmp_path / "gpuclust"
    (res,) = analyze(ds, [create("machine-utilization", mode=mode)], out=gp, plots=False, partitions=3).values()
    a = "machine-utilization"
    assert isinstance(res["machine"], PartedTable) and res["machine"].folder == gp / a / "machine"
    want = {name: res[name].read() if name == "machine" else res[name] for name in res}
    got = {name: pq.read_table(out / f"{name}.parquet").to_pandas() for name in res}
    assert set(got) == {"machine", "quantiles", "summary", "series", "info"}
    for name, keys in (
        ("machine", ["machine_id", "bucket"]),
        ("quantiles", ["resource", "quantile"]),
        ("summary", ["resource"]),
        ("series", ["bucket"]),
        ("info", ["analysis"]),
    ):
        written = res["machine"].folder / res["machine"].files[0] if name == "machine" else gp / f"{a}/{name}.parquet"
        assert [(f.name, f.type) for f in pq.read_schema(out / f"{name}.parquet")] == [
            (f.name, f.type) for f in pq.read_schema(written)
        ], name  # the same columns, in order, of the same types
        _same_table(got[name], want[name], keys, name)

    info, mb = want["info"].iloc[0], want["machine"]
    planted = ("alloc_rows", "short_rows" if mode == "notebook" else "unbounded_rows", "unknown_machine_rows")
    for c in planted:
        assert info[c] > 0, c
    assert info["machines"] > mb["machine_id"].nunique() and info["machines_known_cpu_capacity"] < info["machines"]
    sm = want["summary"].set_index("resource")
    assert (sm["unknown"] > 0).all() and sm.loc["cpu", "over_capacity"] > 0
    assert mb["cpu_util"].max() == 1.0 if mode == "notebook" else mb["cpu_util"].max() > 1.0
    assert mb["cap_cpu"].isna().any() and (mb["cap_cpu"] == 0).any() and (mb["windows"] > 10).any()
    if mode == "notebook":
        assert (want["series"]["cpu_machines"] == 0).any()
    else:  # idle machine-buckets, machines up part of a bucket, usage where the machine is down
        assert min(info["idle_machine_buckets"], info["partial_machine_buckets"], info["usage_buckets_not_up"]) > 0
    assert ((mb["cpu_usage"] == mb["cap_cpu"]) & (mb["cpu_util"] == 1.0)).any()  # at capacity, not over it
    assert len(got["quantiles"]) == 202


def _peak_prediction_dataset(tmp_path: Path) -> Path:
    """A benchmark dataset (5 machines over 2 days: the 24 h oracle is computed for about half the
    steps) with peak-prediction's cases planted (see the test)."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq
    from gen_canonical import make_dataset

    from gpuclust.schema import SCHEMAS

    ds = make_dataset(tmp_path / "ds", 30_000, machines=5, days=2, seed=12)
    (uf,) = sorted((ds / "instance_usage").rglob("*.parquet"))
    (ef,) = sorted((ds / "instance_events").rglob("*.parquet"))
    never, b_us = np.iinfo(np.int64).max, 300_000_000
    ev = pq.read_table(ef)  # per instance: a submit at its first window's start, an end event (both with requests)
    n = ev.num_rows // 2
    k = np.arange(ev.num_rows)
    t = ev["time"].to_numpy()
    # requests changing mid-run: a later event 10 steps in (at a window's start: it counts there), or
    # 1 µs after one (the next window's); every 5th with a zero or NULL request (ignored)
    mid = ev.slice(0, n)
    j = np.arange(n)
    mid = _with(mid, "time", t[:n] + 10 * b_us + (j % 2))
    mid = _with(mid, "type", np.full(n, 8))  # UPDATE_RUNNING
    mid = _with(
        mid,
        "req_cpu",
        np.where(j % 5 == 0, 0.0, mid["req_cpu"].to_numpy() * np.where(j % 3 == 0, 0.5, 2.0)),
        mask=j % 10 == 4,
    )
    mid = _with(mid, "req_mem", mid["req_mem"].to_numpy(), mask=j % 10 == 8)
    # priorities and classes the event is filtered by: NULL, above the range
    mid = _with(mid, "priority", np.where(j % 13 == 0, 450, mid["priority"].to_numpy()), mask=j % 17 == 0)
    ev = _with(ev, "req_cpu", np.where(k % 23 == 0, 0.0, ev["req_cpu"].to_numpy()))  # instances with no limit at first
    ev = _with(ev, "scheduling_class", ev["scheduling_class"].to_numpy(), mask=k % 19 == 0)
    pq.write_table(pa.concat_tables([x.cast(SCHEMAS["instance_events"]) for x in (ev, mid)]), ef)
    # ties at one microsecond in a later file: the later row wins where both requests are positive
    tie = mid.slice(0, 400)
    q = np.arange(tie.num_rows)
    tie = _with(tie, "req_cpu", np.where(q % 4 == 3, 0.0, tie["req_cpu"].to_numpy(zero_copy_only=False) * 3 + 0.01))
    _add_file(ds, "instance_events", tie, "part-bench-00001.parquet")
    # usage: NULL and NaN metrics, far above the limit (the cap), NULL alloc (top level), machines
    # without events, unplaced starts, a second window in some steps (the max of both)
    u = pq.read_table(uf)
    row = np.arange(u.num_rows)
    p90 = u["cpu_p90"].to_numpy(zero_copy_only=False).copy()
    p90[row % 7 == 0] *= 5
    p90[row % 11 == 0] = np.nan
    u = _with(u, "cpu_p90", p90, mask=row % 13 == 0)
    u = _with(u, "alloc_collection_id", u["alloc_collection_id"].to_numpy(), mask=row % 29 == 0)
    u = _with(u, "machine_id", np.where(row % 31 == 0, 123_456_789, u["machine_id"].to_numpy()))
    u = _with(u, "start_time", np.where(row % 37 == 0, never, u["start_time"].to_numpy()))
    extra = u.filter(pa.array(row % 3 == 0))
    extra = _with(
        extra,
        "start_time",
        np.where(extra["start_time"].to_numpy() == never, never, extra["start_time"].to_numpy() + 150_000_000),
    )
    extra = _with(extra, "cpu_p90", extra["cpu_p90"].to_numpy(zero_copy_only=False) * 0.7)
    pq.write_table(pa.concat_tables([x.cast(SCHEMAS["instance_usage"]) for x in (u, extra)]), uf)
    return ds


def test_peak_prediction_sql_computes_what_gpuclust_writes(tmp_path, monkeypatch):
    """The DuckDB contender of ``peak-prediction (SQL part)`` writes what gpuclust's ``machine``
    table (written in parts under its results folder) holds in the columns SQL computes — the
    instances, the sums of limits and of capped usage, ``borg_default`` and the oracle (NULL where
    censored) — per machine and step, on a benchmark dataset with planted cases: requests changing
    mid-run (at a window's start and 1 µs after it), zero, NULL and zero-then-positive requests,
    ties at one microsecond across two files (the later positive row wins), NULL priorities and
    classes and priorities out of range, NULL and NaN metrics, usage far above the limit, alloc rows
    and NULL ``alloc_collection_id``, machines without events, unplaced starts and two windows of
    an instance in one step."""
    duckdb = pytest.importorskip("duckdb")
    monkeypatch.syspath_prepend(str(BENCH))
    import pyarrow.parquet as pq
    from references.sql_peak_prediction import peak_prediction_sql

    from gpuclust.analyses.registry import create
    from gpuclust.parted import PartedTable
    from gpuclust.report.analyze import analyze

    ds = _peak_prediction_dataset(tmp_path)
    out = tmp_path / "duck"
    out.mkdir()
    duckdb.connect().execute(peak_prediction_sql(ds, out))
    gp = tmp_path / "gpuclust"
    (res,) = analyze(ds, [create("peak-prediction")], out=gp, plots=False, partitions=3).values()
    assert isinstance(res["machine"], PartedTable) and res["machine"].folder == gp / "peak-prediction" / "machine"
    got = pq.read_table(out / "machine.parquet")
    written = pq.read_schema(res["machine"].folder / res["machine"].files[0])
    assert [(f.name, f.type) for f in got.schema] == [(f.name, written.field(f.name).type) for f in got.schema]
    assert got.column_names == [c for c in written.names if c in got.column_names]  # in gpuclust's order
    want = res["machine"].read()
    _same_table(got.to_pandas(), want[got.column_names], ["machine_id", "bucket"], "machine")

    info = res["info"].iloc[0]
    for c in (
        "alloc_rows",
        "unplaced_rows",
        "unknown_machine_rows",
        "null_metric_rows",
        "no_limit_rows",
        "filtered_rows",
    ):
        assert info[c] > 0, c
    assert 0 < info["censored_rows"] < info["machine_rows"] / 1.5
    assert (want["total_usage"] < want["limit"] * (1 - 1e-6)).any() and (want["total_usage"] == want["limit"]).any()
    assert (want["instances"] >= 5).any()
