"""``machine-utilization`` against Google's notebook query run by DuckDB (mode ``notebook``), a slow
pure-Python overlap computation (mode ``time-weighted``), a worked machine, and the layouts and
schedulers it runs on."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from strategies import assert_results_same, cell, random_cell, table, write_dataset

import gpuclust.analyses.machine_utilization as mu
from gpuclust.analyses.machine_utilization import QUANTILES, MachineHash, MachineUtilization
from gpuclust.backends import get_backend
from gpuclust.dataset import Dataset
from gpuclust.engine import TableSource, run
from gpuclust.schema import TIME_AFTER_TRACE

duckdb = pytest.importorskip("duckdb")
W = 300_000_000
QLIST = "[" + ", ".join(repr(float(q)) for q in QUANTILES) + "]"

#: The notebook's "per machine resource usage distribution" query, in DuckDB's dialect, with the
#: exact quantile_cont for APPROX_QUANTILES(x, 100) and a NULL ratio for a capacity that is not
#: positive (BigQuery raises on a division by zero).
NOTEBOOK_SQL = """
WITH cap AS (
  SELECT machine_id, MAX(cap_cpu) AS cpu_cap, MAX(cap_mem) AS memory_cap FROM me GROUP BY 1),
u AS (
  SELECT CAST(FLOOR(start_time / (1e6 * 300)) AS BIGINT) AS bucket, machine_id,
         avg_cpu AS cpu_usage, avg_mem AS memory_usage
  FROM iu
  WHERE (alloc_collection_id IS NULL OR alloc_collection_id = 0)
    AND (end_time - start_time) >= (5 * 60 * 1e6) AND start_time >= 0 AND start_time < {after})
SELECT u.machine_id, u.bucket, COUNT(*) AS windows,
       SUM(u.cpu_usage) AS cpu_usage, SUM(u.memory_usage) AS mem_usage,
       MAX(cap.cpu_cap) AS cap_cpu, MAX(cap.memory_cap) AS cap_mem
FROM u JOIN cap ON u.machine_id = cap.machine_id
GROUP BY 1, 2
"""


def util_sql(r: str, capped: bool) -> str:
    ratio = f"{r}_usage / cap_{r}"
    return (f"CASE WHEN cap_{r} > 0 THEN " + (f"IF({r}_usage > cap_{r}, 1.0, {ratio})" if capped else ratio)
            + f" END AS {r}_util")


def notebook_reference(tables: dict) -> tuple[pd.DataFrame, dict[str, list[float]]]:
    con = duckdb.connect()
    con.register("me", tables["machine_events"])
    con.register("iu", tables["instance_usage"])
    m = con.sql(f"SELECT *, {util_sql('cpu', True)}, {util_sql('mem', True)} FROM ("
                + NOTEBOOK_SQL.format(after=TIME_AFTER_TRACE) + ") ORDER BY machine_id, bucket").df()
    con.register("m", m)
    qs = {r: con.sql(f"SELECT quantile_cont({r}_util, {QLIST}) FROM m").fetchall()[0][0] for r in ("cpu", "mem")}
    return m, qs


def time_weighted_reference(tables: dict) -> tuple[pd.DataFrame, dict[str, list[float]]]:
    """Each top-level window with a known end split at bucket edges, by plain loops."""
    caps: dict[int, list] = {}
    for e in tables["machine_events"].to_pylist():
        c = caps.setdefault(e["machine_id"], [None, None])
        for j, k in enumerate(("cap_cpu", "cap_mem")):
            if e[k] is not None:
                c[j] = e[k] if c[j] is None else max(c[j], e[k])
    acc: dict[tuple[int, int], list] = {}
    for u in tables["instance_usage"].to_pylist():
        s, e = u["start_time"], u["end_time"]
        if u["alloc_collection_id"] not in (None, 0) or e == TIME_AFTER_TRACE or e <= s or u["machine_id"] not in caps:
            continue
        for b in range(s // W, (e - 1) // W + 1):
            ov = min(e, (b + 1) * W) - max(s, b * W)
            a = acc.setdefault((u["machine_id"], b), [0, None, None])
            a[0] += 1
            for j, k in ((1, "avg_cpu"), (2, "avg_mem")):
                if u[k] is not None:
                    a[j] = (a[j] or 0.0) + u[k] * ov / W
    rows = []
    for (mid, b), (n, cpu, mem) in sorted(acc.items()):
        row = {"machine_id": mid, "bucket": b, "windows": n, "cpu_usage": cpu, "mem_usage": mem,
               "cap_cpu": caps[mid][0], "cap_mem": caps[mid][1]}
        for r in ("cpu", "mem"):
            use, cap = row[f"{r}_usage"], row[f"cap_{r}"]
            row[f"{r}_util"] = use / cap if use is not None and cap is not None and cap > 0 else None
        rows.append(row)
    m = pd.DataFrame(rows, columns=["machine_id", "bucket", "windows", "cpu_usage", "mem_usage", "cap_cpu", "cap_mem",
                                    "cpu_util", "mem_util"])
    qs = {}
    for r in ("cpu", "mem"):
        v = np.array([x for x in m[f"{r}_util"] if x is not None and x == x], dtype=float)
        qs[r] = np.quantile(v, QUANTILES).tolist() if v.size else None
    return m, qs


def check(res: dict, want: pd.DataFrame, want_q: dict, capped: bool) -> None:
    got = res["machine"].sort_values(["machine_id", "bucket"]).reset_index(drop=True)
    assert got["machine_id"].tolist() == [int(x) for x in want["machine_id"]]
    assert got["bucket"].tolist() == [int(x) for x in want["bucket"]]
    assert (got["bucket_start_us"] == got["bucket"] * W).all()
    assert got["windows"].tolist() == [int(x) for x in want["windows"]]
    for c in ("cpu_usage", "mem_usage", "cap_cpu", "cap_mem", "cpu_util", "mem_util"):
        w = pd.to_numeric(want[c], errors="coerce").to_numpy(np.float64)
        np.testing.assert_allclose(got[c].to_numpy(np.float64), w, rtol=1e-9, atol=1e-12, equal_nan=True, err_msg=c)
    q = res["quantiles"]
    summ = res["summary"].set_index("resource")
    if want.empty:
        assert summ.empty and q.empty
        return
    for r in ("cpu", "mem"):
        gq = q[q["resource"] == r]["util"].to_numpy()
        u = pd.to_numeric(want[f"{r}_util"], errors="coerce").to_numpy(np.float64)
        known = u[np.isfinite(u)]
        if want_q[r] is None:
            assert np.isnan(gq).all() and summ.loc[r, "known"] == 0
            continue
        np.testing.assert_allclose(gq, np.asarray(want_q[r], np.float64), rtol=1e-9, atol=1e-12)
        assert summ.loc[r, "known"] == known.size and summ.loc[r, "unknown"] == len(u) - known.size
        assert summ.loc[r, "mean_util"] == pytest.approx(known.mean(), rel=1e-9, abs=1e-12)
        use = pd.to_numeric(want[f"{r}_usage"], errors="coerce").to_numpy(np.float64)
        cap = pd.to_numeric(want[f"cap_{r}"], errors="coerce").to_numpy(np.float64)
        with np.errstate(invalid="ignore", divide="ignore"):
            over = int(np.count_nonzero((cap > 0) & (use > cap)))
        assert summ.loc[r, "over_capacity"] == over
        if capped:
            assert (known <= 1.0).all()


def run_both(tables: dict) -> None:
    src = TableSource(tables)
    res = run(src, [MachineUtilization(), MachineUtilization(mode="time-weighted")])
    check(res["machine-utilization"], *notebook_reference(tables), capped=True)
    check(res["machine-utilization[mode=time-weighted]"], *time_weighted_reference(tables), capped=False)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(tables=cell(max_windows=40))
def test_matches_the_references(tables):
    run_both(tables)


@pytest.mark.parametrize("seed", [3, 4])
def test_random_cells(seed):
    run_both(random_cell(seed, n_windows=5000))


@pytest.mark.parametrize(("dense_ratio", "row_bits"), [(4, 24), (0, 24), (0, 2)])
def test_dense_and_sorted_sums(monkeypatch, dense_ratio, row_bits):
    """Every way of summing a partition's keys (bincount over every machine-bucket; the used rows
    sorted by key and row packed in one int64, or by an argsort), NULL usage in both columns,
    several partitions merged."""
    monkeypatch.setattr(mu, "_DENSE_RATIO", dense_ratio)
    monkeypatch.setattr(mu, "_ROW_BITS", row_bits)
    tables = random_cell(8, n_windows=5000)
    us = tables["instance_usage"]
    mem = us.column("avg_mem").to_pylist()
    rng = np.random.default_rng(8)
    us = us.set_column(us.schema.get_field_index("avg_mem"), "avg_mem",
                       pa.array([None if r < 0.03 else v for r, v in zip(rng.random(len(mem)), mem, strict=True)],
                                pa.float32()))
    tables = {**tables, "instance_usage": us}
    run_both(tables)
    src = TableSource(tables)
    a = MachineUtilization()
    assert_results_same(run(src, a, partitions=4), run(src, a, partitions=1), rtol=1e-12)


@pytest.mark.parametrize("n", [0, 1, 2, 37, 3000])
def test_machine_hash(n):
    """The perfect hash finds exactly the machine ids (any int64, negative too) and their positions."""
    rng = np.random.default_rng(n)
    ids = np.unique(rng.integers(-(2**62), 2**62, n, dtype=np.int64))
    q = np.concatenate([ids, rng.integers(-(2**62), 2**62, 500, dtype=np.int64), ids[::-1] + 1,
                        np.array([np.iinfo(np.int64).min, 0, -1], np.int64)])
    code, found = MachineHash.build(ids).find(get_backend("cpu"), q)
    pos = np.clip(np.searchsorted(ids, q), 0, max(ids.shape[0] - 1, 0))
    want = (ids[pos] == q) if ids.shape[0] else np.zeros(q.shape[0], bool)
    assert found.tolist() == want.tolist()
    assert code[found].tolist() == pos[found].tolist()


def test_a_worked_machine():
    """Machine 7 (capacity CPU 0.5, memory 1.0 after an UPDATE), two tasks and an alloc:

    * task A, 0-300 s, CPU 0.2; task B, 100-400 s, CPU 0.4 (both 300 s); an alloc member 0-300 s
      (dropped); task C, 0-60 s, CPU 0.3 (short: the notebook drops it).
    * notebook, bucket 0: 0.2 + 0.4 = 0.6 > 0.5 -> 1.0 (over capacity); time-weighted, bucket 0:
      0.2 + 0.4 x 200/300 + 0.3 x 60/300 = 0.5267 -> 1.0533; bucket 1: 0.4 x 100/300 -> 0.2667.
    """
    s = [0, 100 * 10**6, 0, 0]
    e = [W, 400 * 10**6, W, 60 * 10**6]
    t = {"machine_events": table("machine_events", {"time": [0, 5], "machine_id": [7, 7], "type": [1, 3],
                                                    "cap_cpu": [0.5, 0.5], "cap_mem": [0.5, 1.0]}),
         "instance_usage": table("instance_usage", {
             "start_time": s, "end_time": e, "collection_id": [1, 2, 3, 4], "instance_index": [0] * 4,
             "machine_id": [7] * 4, "alloc_collection_id": [0, None, 99, 0], "avg_cpu": [0.2, 0.4, 0.9, 0.3],
             "avg_mem": [0.1, 0.1, 0.1, 0.1]})}
    res = run(TableSource(t), [MachineUtilization(), MachineUtilization(mode="time-weighted")])
    nb = res["machine-utilization"]["machine"]
    assert nb[["bucket", "windows"]].values.tolist() == [[0, 2]]
    assert nb["cpu_usage"].iloc[0] == pytest.approx(0.6) and nb["cpu_util"].iloc[0] == 1.0
    assert nb["mem_util"].iloc[0] == pytest.approx(0.2)  # MAX(cap_mem) over the machine's events: 1.0
    info = res["machine-utilization"]["info"].iloc[0]
    assert (info["alloc_rows"], info["short_rows"], info["used_rows"]) == (1, 1, 2)
    assert res["machine-utilization"]["summary"].set_index("resource").loc["cpu", "over_capacity"] == 1
    tw = res["machine-utilization[mode=time-weighted]"]["machine"]
    assert tw["bucket"].tolist() == [0, 1] and tw["windows"].tolist() == [3, 1]
    np.testing.assert_allclose(tw["cpu_util"], [(0.2 + 0.4 * 2 / 3 + 0.3 * 0.2) / 0.5, 0.4 / 3 / 0.5])


def test_layouts_schedulers_and_the_results_folder(tmp_path):
    tables = random_cell(6, n_windows=6000)
    flat = write_dataset(tmp_path / "flat", tables, files=3, row_group_size=700)
    a = MachineUtilization(mode="time-weighted")
    ref = run(Dataset(flat), a, partitions=1)
    check(ref[a.name], *time_weighted_reference(tables), capped=False)
    r = subprocess.run([sys.executable, "-m", "gpuclust.cli", "optimize", str(flat), "--out", str(tmp_path / "opt"),
                        "--buckets", "8"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    for ds, parts, scheduler in ((flat, 5, "threads"), (tmp_path / "opt", 3, None), (tmp_path / "opt", "auto", "threads")):
        got = run(Dataset(ds), a, partitions=parts, workers=2, scheduler=scheduler)
        assert_results_same(got, ref, rtol=1e-12)
    # the CLI writes the machine table as parts and the small tables beside it
    out = tmp_path / "res"
    r = subprocess.run([sys.executable, "-m", "gpuclust.cli", "analyze", str(flat), "machine-utilization",
                        "-O", "mode=time-weighted", "--partitions", "4", "--out", str(out)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert "machine-buckets over capacity" in r.stdout
    parts = sorted((out / "machine-utilization" / "machine").glob("part-*.parquet"))
    assert parts
    written = pd.concat([pd.read_parquet(p) for p in parts], ignore_index=True)
    pd.testing.assert_frame_equal(written, ref[a.name]["machine"].reset_index(drop=True), check_exact=False, rtol=1e-12)


REAL = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "real" / "2019-cell-a"


@pytest.mark.skipif(not REAL.is_dir(), reason=f"real trace files not found at {REAL}")
def test_real_cell_a_capacities(tmp_path):
    """The real cell-a machine_events shard: the notebook's capacity (MAX over a machine's events)
    as DuckDB computes it from the raw export, and usage planted on 50 of its machines."""
    from gpuclust.ingest import ingest

    src = REAL / "machine_events-000000000000.parquet.gz"
    rep = ingest([src], tmp_path / "ds", cell="a", progress=False)
    assert rep.exit_status == 0, rep.summary()
    ref = duckdb.sql(f"""SELECT machine_id, MAX(capacity.cpus) AS c, MAX(capacity.memory) AS m
                         FROM read_parquet('{src}') GROUP BY 1 ORDER BY 1""").df()
    me = Dataset(tmp_path / "ds").read("machine_events", None)
    ctx = MachineUtilization().context(TableSource({"machine_events": me}))
    assert ctx.machine_ids.tolist() == ref["machine_id"].tolist() and len(ref) == 10_001
    np.testing.assert_allclose(ctx.cap_cpu, ref["c"].to_numpy(np.float64), rtol=1e-6)
    assert int(np.count_nonzero(ctx.cap_cpu > 0)) == int(ref["c"].notna().sum()) == 10_001
    # three 5-minute windows of 0.05 CPU on each of 50 real machines, in buckets 0, 0 and 1
    mids = ref["machine_id"].to_numpy()[::200][:50]
    n = len(mids)
    usage = table("instance_usage", {
        "start_time": [0] * n + [10**6] * n + [W] * n, "end_time": [W] * n + [W + 10**6] * n + [2 * W] * n,
        "collection_id": list(range(3 * n)), "instance_index": [0] * (3 * n), "machine_id": [int(m) for m in mids] * 3,
        "alloc_collection_id": [0] * (3 * n), "avg_cpu": [0.05] * (3 * n), "avg_mem": [0.01] * (3 * n)})
    res = run(TableSource({"machine_events": me, "instance_usage": usage}), MachineUtilization())["machine-utilization"]
    m = res["machine"].set_index(["machine_id", "bucket"])
    cap = dict(zip(ref["machine_id"], ref["c"], strict=True))
    for mid in mids:
        assert m.loc[(mid, 0), "cpu_util"] == pytest.approx(min(0.1 / cap[mid], 1.0), rel=1e-6)
        assert m.loc[(mid, 1), "cpu_util"] == pytest.approx(min(0.05 / cap[mid], 1.0), rel=1e-6)
