"""``machine-utilization`` against Google's notebook query run by DuckDB (mode ``notebook``), a slow
pure-Python replay of machine up time and usage overlap (``machine_utilization_reference.replay``;
the default mode, ``time-weighted``) on hypothesis and random cells, a worked machine (idle, and
removed mid-bucket), the real 2011 machine_events, and the layouts and schedulers it runs on."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import by_path
import numpy as np
import pandas as pd
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from strategies import assert_results_same, cell, examples, random_cell, table, write_dataset

import gpuclust.analyses._machine_sums as machine_sums
from gpuclust.analyses.machine_utilization import QUANTILES, MachineHash, MachineUtilization
from gpuclust.backends import get_backend
from gpuclust.dataset import Dataset
from gpuclust.engine import TableSource, run
from gpuclust.optimize import optimize
from gpuclust.schema import TIME_AFTER_TRACE

duckdb = pytest.importorskip("duckdb")


replay = by_path.load(
    "gpuclust_machine_utilization_reference", Path(__file__).with_name("machine_utilization_reference.py")
).replay
NB = "machine-utilization[mode=notebook]"
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
    return (
        f"CASE WHEN cap_{r} > 0 THEN "
        + (f"IF({r}_usage > cap_{r}, 1.0, {ratio})" if capped else ratio)
        + f" END AS {r}_util"
    )


def notebook_reference(tables: dict) -> tuple[pd.DataFrame, dict[str, list[float]]]:
    con = duckdb.connect()
    con.register("me", tables["machine_events"])
    con.register("iu", tables["instance_usage"])
    m = con.sql(
        f"SELECT *, {util_sql('cpu', True)}, {util_sql('mem', True)} FROM ("
        + NOTEBOOK_SQL.format(after=TIME_AFTER_TRACE)
        + ") ORDER BY machine_id, bucket"
    ).df()
    con.register("m", m)
    qs = {r: con.sql(f"SELECT quantile_cont({r}_util, {QLIST}) FROM m").fetchall()[0][0] for r in ("cpu", "mem")}
    return m, qs


def time_weighted_reference(tables: dict) -> tuple[pd.DataFrame, dict[str, list[float]]]:
    """The default mode's machine table and quantiles from the slow replay."""
    ref = replay(tables)
    rows = [{"machine_id": m, "bucket": b, **r} for (m, b), r in sorted(ref["rows"].items())]
    m = pd.DataFrame(
        rows,
        columns=[
            "machine_id",
            "bucket",
            "up_s",
            "windows",
            "cpu_usage",
            "mem_usage",
            "cap_cpu",
            "cap_mem",
            "cpu_util",
            "mem_util",
        ],
    )
    m.attrs["not_up"] = ref["not_up"]
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
    cols = ["cpu_usage", "mem_usage", "cap_cpu", "cap_mem", "cpu_util", "mem_util"]
    if not capped:  # the default mode: every up machine-bucket, idle ones included
        cols.append("up_s")
        info = res["info"].iloc[0]
        assert info["idle_machine_buckets"] == int((want["windows"] == 0).sum())
        assert info["partial_machine_buckets"] == int((want["up_s"] < 300).sum())
        assert info["usage_buckets_not_up"] == want.attrs["not_up"]
    for c in cols:
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
    res = run(src, [MachineUtilization(mode="notebook"), MachineUtilization()])
    check(res[NB], *notebook_reference(tables), capped=True)
    check(res["machine-utilization"], *time_weighted_reference(tables), capped=False)


@settings(max_examples=examples(40), deadline=None, suppress_health_check=[HealthCheck.too_slow])
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
    monkeypatch.setattr(machine_sums, "DENSE_RATIO", dense_ratio)
    monkeypatch.setattr(machine_sums, "ROW_BITS", row_bits)
    tables = random_cell(8, n_windows=5000)
    us = tables["instance_usage"]
    mem = us.column("avg_mem").to_pylist()
    rng = np.random.default_rng(8)
    us = us.set_column(
        us.schema.get_field_index("avg_mem"),
        "avg_mem",
        pa.array([None if r < 0.03 else v for r, v in zip(rng.random(len(mem)), mem, strict=True)], pa.float32()),
    )
    tables = {**tables, "instance_usage": us}
    run_both(tables)
    src = TableSource(tables)
    a = MachineUtilization()
    assert_results_same(run(src, a, partitions=4), run(src, a, partitions=1), rtol=1e-12)


def test_narrow_counts_are_widened_before_a_merge():
    """A spilled partition keeps its counts narrow (uint8: 200 windows a machine-bucket); merged
    partials add them in the dtypes of ``COUNTS`` (int32 windows, int64 nulls), not wrapping around."""
    a = MachineUtilization()
    p = a.empty()
    p["u"] = {
        "key": np.array([3, 7], np.int64),
        "cpu": np.array([1.0, 2.0]),
        "mem": np.array([0.5, np.nan]),
        "windows": np.array([200, 1], np.uint8),
        "nulls": np.array([0, 1], np.uint8),
    }
    m = a.kinds.merge(p, p)
    assert (m["u"]["windows"].dtype, m["u"]["nulls"].dtype) == (np.int32, np.int64)
    assert m["u"]["windows"].tolist() == [400, 2] and m["u"]["nulls"].tolist() == [0, 2]
    assert m["u"]["cpu"].tolist() == [2.0, 4.0] and m["u"]["mem"].tolist() == [1.0, 0.0]


@pytest.mark.parametrize("n", [0, 1, 2, 37, 3000])
def test_machine_hash(n):
    """The perfect hash finds exactly the machine ids (any int64, negative too) and their positions."""
    rng = np.random.default_rng(n)
    ids = np.unique(rng.integers(-(2**62), 2**62, n, dtype=np.int64))
    q = np.concatenate(
        [
            ids,
            rng.integers(-(2**62), 2**62, 500, dtype=np.int64),
            ids[::-1] + 1,
            np.array([np.iinfo(np.int64).min, 0, -1], np.int64),
        ]
    )
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
      0.2 + 0.4 x 200/300 + 0.3 x 60/300 = 0.5267 -> 1.0533; bucket 1 (the usage ends at 400 s,
      so the window does: up 100 s): 0.4 x 100 s / (0.5 x 100 s) -> 0.8.
    """
    s = [0, 100 * 10**6, 0, 0]
    e = [W, 400 * 10**6, W, 60 * 10**6]
    t = {
        "machine_events": table(
            "machine_events",
            {"time": [0, 5], "machine_id": [7, 7], "type": [1, 3], "cap_cpu": [0.5, 0.5], "cap_mem": [0.5, 1.0]},
        ),
        "instance_usage": table(
            "instance_usage",
            {
                "start_time": s,
                "end_time": e,
                "collection_id": [1, 2, 3, 4],
                "instance_index": [0] * 4,
                "machine_id": [7] * 4,
                "alloc_collection_id": [0, None, 99, 0],
                "avg_cpu": [0.2, 0.4, 0.9, 0.3],
                "avg_mem": [0.1, 0.1, 0.1, 0.1],
            },
        ),
    }
    res = run(TableSource(t), [MachineUtilization(mode="notebook"), MachineUtilization(mode="time-weighted")])
    nb = res[NB]["machine"]
    assert nb[["bucket", "windows"]].values.tolist() == [[0, 2]]
    assert nb["cpu_usage"].iloc[0] == pytest.approx(0.6) and nb["cpu_util"].iloc[0] == 1.0
    assert nb["mem_util"].iloc[0] == pytest.approx(0.2)  # MAX(cap_mem) over the machine's events: 1.0
    info = res[NB]["info"].iloc[0]
    assert (info["alloc_rows"], info["short_rows"], info["used_rows"]) == (1, 1, 2)
    assert res[NB]["summary"].set_index("resource").loc["cpu", "over_capacity"] == 1
    tw = res["machine-utilization"]["machine"]
    # the window is [0, 400 s] (the usage's extent): bucket 1 is up 100 s
    assert tw["bucket"].tolist() == [0, 1] and tw["windows"].tolist() == [3, 1]
    assert tw["up_s"].tolist() == [300.0, 100.0]
    np.testing.assert_allclose(tw["cpu_util"], [(0.2 + 0.4 * 2 / 3 + 0.3 * 0.2) / 0.5, 0.4 / 0.5])


def test_idle_and_removed_machines():
    """The default counts every machine-bucket in which the machine is up (the window: 0-900 s,
    the usage's extent); the notebook only those holding a window of 300 s.

    * machine 7 (CPU 0.5): 0.25 in bucket 0 -> 0.5; bucket 1 idle -> 0; 0.1 in bucket 2 -> 0.2.
    * machine 8 (CPU 1.0): up and idle all along -> 0, 0, 0.
    * machine 9 (CPU 1.0): idle in bucket 0; removed at 450 s, with 0.5 from 300 s to 450 s (a
      short window: the notebook drops it) -> 0.5 over its 150 up seconds; added again at 800 s
      with CPU 2.0 -> bucket 2, up 100 s, idle.
    """
    S = 10**6
    t = {
        "machine_events": table(
            "machine_events",
            {
                "time": [0, 0, 0, 450 * S, 800 * S],
                "machine_id": [7, 8, 9, 9, 9],
                "type": [1, 1, 1, 2, 1],
                "cap_cpu": [0.5, 1.0, 1.0, None, 2.0],
                "cap_mem": [1.0, 1.0, 1.0, None, 1.0],
            },
        ),
        "instance_usage": table(
            "instance_usage",
            {
                "start_time": [0, 600 * S, 300 * S],
                "end_time": [W, 900 * S, 450 * S],
                "collection_id": [1, 2, 3],
                "instance_index": [0] * 3,
                "machine_id": [7, 7, 9],
                "alloc_collection_id": [0] * 3,
                "avg_cpu": [0.25, 0.1, 0.5],
                "avg_mem": [0.1] * 3,
            },
        ),
    }
    res = run(TableSource(t), [MachineUtilization(), MachineUtilization(mode="notebook")])
    m = res["machine-utilization"]["machine"]
    assert list(zip(m["machine_id"], m["bucket"], strict=True)) == [(i, b) for i in (7, 8, 9) for b in (0, 1, 2)]
    np.testing.assert_allclose(m["cpu_util"], [0.5, 0, 0.2, 0, 0, 0, 0, 0.5, 0])
    np.testing.assert_allclose(m["up_s"], [300] * 7 + [150, 100])
    assert m["windows"].tolist() == [1, 0, 1, 0, 0, 0, 0, 1, 0] and m["cap_cpu"].tolist()[-1] == 2.0
    info = res["machine-utilization"]["info"].iloc[0]
    assert (info["idle_machine_buckets"], info["partial_machine_buckets"], info["usage_buckets_not_up"]) == (6, 2, 0)
    summ = res["machine-utilization"]["summary"].set_index("resource")
    assert (summ.loc["cpu", "p50"], summ.loc["cpu", "mean_util"]) == (0.0, pytest.approx(1.2 / 9))
    nb = res[NB]["machine"]
    assert list(zip(nb["machine_id"], nb["bucket"], strict=True)) == [(7, 0), (7, 2)]
    np.testing.assert_allclose(nb["cpu_util"], [0.5, 0.2])
    assert res[NB]["summary"].set_index("resource").loc["cpu", "p50"] == pytest.approx(0.35)
    check(res["machine-utilization"], *time_weighted_reference(t), capped=False)


def test_layouts_schedulers_and_the_results_folder(tmp_path):
    tables = random_cell(6, n_windows=6000)
    flat = write_dataset(tmp_path / "flat", tables, files=3, row_group_size=700)
    a = MachineUtilization(mode="time-weighted")
    ref = run(Dataset(flat), a, partitions=1)
    check(ref[a.name], *time_weighted_reference(tables), capped=False)
    optimize(flat, buckets=8, out=tmp_path / "opt", progress=False)  # (the command: tests/test_layout.py)
    for ds, parts, scheduler in (
        (flat, 5, "threads"),
        (tmp_path / "opt", 3, None),
        (tmp_path / "opt", "auto", "threads"),
    ):
        got = run(Dataset(ds), a, partitions=parts, workers=2, scheduler=scheduler)
        assert_results_same(got, ref, rtol=1e-12)
    # the CLI writes the machine table as parts and the small tables beside it
    out = tmp_path / "res"
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "gpuclust.cli",
            "analyze",
            str(flat),
            "machine-utilization",
            "-O",
            "mode=time-weighted",
            "--partitions",
            "4",
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
    )
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
    ctx = MachineUtilization(mode="notebook").context(TableSource({"machine_events": me}))
    assert ctx.machine_ids.tolist() == ref["machine_id"].tolist() and len(ref) == 10_001
    np.testing.assert_allclose(ctx.cap_cpu, ref["c"].to_numpy(np.float64), rtol=1e-6)
    assert int(np.count_nonzero(ctx.cap_cpu > 0)) == int(ref["c"].notna().sum()) == 10_001
    # three 5-minute windows of 0.05 CPU on each of 50 real machines, in buckets 0, 0 and 1
    mids = ref["machine_id"].to_numpy()[::200][:50]
    n = len(mids)
    usage = table(
        "instance_usage",
        {
            "start_time": [0] * n + [10**6] * n + [W] * n,
            "end_time": [W] * n + [W + 10**6] * n + [2 * W] * n,
            "collection_id": list(range(3 * n)),
            "instance_index": [0] * (3 * n),
            "machine_id": [int(m) for m in mids] * 3,
            "alloc_collection_id": [0] * (3 * n),
            "avg_cpu": [0.05] * (3 * n),
            "avg_mem": [0.01] * (3 * n),
        },
    )
    res = run(TableSource({"machine_events": me, "instance_usage": usage}), MachineUtilization(mode="notebook"))[
        "machine-utilization"
    ]
    m = res["machine"].set_index(["machine_id", "bucket"])
    cap = dict(zip(ref["machine_id"], ref["c"], strict=True))
    for mid in mids:
        assert m.loc[(mid, 0), "cpu_util"] == pytest.approx(min(0.1 / cap[mid], 1.0), rel=1e-6)
        assert m.loc[(mid, 1), "cpu_util"] == pytest.approx(min(0.05 / cap[mid], 1.0), rel=1e-6)


def _usage_from_task_events(ds: Dataset, t_end: int, seed: int = 2011) -> pa.Table:
    """Usage windows where the real 2011 tasks ran (no real task_usage rows are available): every
    SCHEDULE on a machine runs from its time (at least the trace start, 600 s) until the task's next
    event or ``t_end``, as windows of 300 s from its start (the last one shorter), with CPU and
    memory a random share (0.1-1 and 0.3-1) of the task's request."""
    ev = ds.read(
        "instance_events", ["time", "type", "collection_id", "instance_index", "machine_id", "req_cpu", "req_mem"]
    )
    c = {k: ev.column(k).to_numpy(zero_copy_only=False) for k in ev.column_names}
    order = np.lexsort((np.arange(len(c["time"])), c["time"], c["instance_index"], c["collection_id"]))
    c = {k: v[order] for k, v in c.items()}
    nxt = np.full(order.size, t_end, np.int64)
    same = (c["collection_id"][1:] == c["collection_id"][:-1]) & (c["instance_index"][1:] == c["instance_index"][:-1])
    nxt[:-1] = np.where(same, c["time"][1:], t_end)
    sel = np.flatnonzero((c["type"] == 3) & (c["machine_id"] > 0))
    s, e = np.maximum(c["time"][sel], 600 * 10**6), np.minimum(nxt[sel], t_end)
    sel, s, e = sel[e > s], s[e > s], e[e > s]
    rng = np.random.default_rng(seed)
    cpu = c["req_cpu"][sel] * rng.uniform(0.1, 1.0, sel.size)
    mem = c["req_mem"][sel] * rng.uniform(0.3, 1.0, sel.size)
    k = -(-(e - s) // W)  # windows per running piece
    piece = np.repeat(np.arange(sel.size), k)
    ws = s[piece] + (np.arange(piece.size) - np.repeat(np.cumsum(k) - k, k)) * W
    return table(
        "instance_usage",
        {
            "start_time": ws,
            "end_time": np.minimum(ws + W, e[piece]),
            "collection_id": c["collection_id"][sel][piece],
            "instance_index": c["instance_index"][sel][piece],
            "machine_id": c["machine_id"][sel][piece],
            "alloc_collection_id": np.zeros(piece.size, np.int64),
            "avg_cpu": cpu[piece],
            "avg_mem": mem[piece],
        },
    )


def test_real_2011_machines(real_2011):
    """The real 2011 machine_events (12,583 machines: ADD, REMOVE and UPDATE, NULL capacities) with
    usage where the real task_events' tasks ran in the first 30 minutes of the trace: the default
    mode against the slow replay, the notebook mode against DuckDB running the notebook's query.
    (The 2011 parts as ingested once per run, ``real_2011``: their job_events change neither table.)"""
    ds = Dataset(real_2011)
    tables = {
        "machine_events": ds.read("machine_events", None),
        "instance_usage": _usage_from_task_events(ds, (600 + 1800) * 10**6),
    }
    res = run(TableSource(tables), [MachineUtilization(), MachineUtilization(mode="notebook")])
    tw, nb = res["machine-utilization"], res[NB]
    check(tw, *time_weighted_reference(tables), capped=False)
    check(nb, *notebook_reference(tables), capped=True)
    info = tw["info"].iloc[0]
    assert (info["machines"], info["window_start_us"], info["window_end_us"]) == (12_583, 600 * 10**6, 2400 * 10**6)
    assert info["partial_machine_buckets"] > 0 and info["usage_buckets_not_up"] > 0
    p50 = {k: r["summary"].set_index("resource").loc["cpu", "p50"] for k, r in (("default", tw), ("notebook", nb))}
    print(
        f"2011, first 30 min: {info['machine_rows']} up machine-buckets, idle {info['idle_machine_buckets']} "
        f"({info['idle_machine_buckets'] / info['machine_rows']:.4%}), partial {info['partial_machine_buckets']}, "
        f"usage where not up {info['usage_buckets_not_up']}; median CPU util default {p50['default']:.4f}, "
        f"notebook {p50['notebook']:.4f} ({nb['info'].iloc[0]['machine_rows']} machine-buckets)"
    )
