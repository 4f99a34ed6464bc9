"""``job-usage`` against DuckDB SQL (the per-collection hours and tiers, over the same Parquet),
plain-Python statistics of those, and the synthetic cell's planted top-1% share."""

from __future__ import annotations

import math
from pathlib import Path

import by_path
import numpy as np
import pyarrow as pa
import pytest
from strategies import assert_results_same, random_cell, write_dataset

from gpuclust.analyses.job_usage import STAT_COLUMNS, JobUsage
from gpuclust.dataset import Dataset
from gpuclust.engine import run
from gpuclust.schema import tier_map

duckdb = pytest.importorskip("duckdb")
_cells = by_path.load("gpuclust_planted_cells", Path(__file__).with_name("planted_cells.py"))


def cell_with_types(seed: int, n_windows: int = 6000) -> dict[str, pa.Table]:
    """A random cell whose usage rows carry a collection type: most collections are jobs, some are
    alloc sets; some rows are NULL-typed (neither)."""
    t = random_cell(seed, n_windows=n_windows)
    u = t["instance_usage"]
    rng = np.random.default_rng(seed)
    c = u.column("collection_id").to_numpy()
    kind = {int(x): int(rng.random() < 0.2) for x in np.unique(c)}
    ct = [None if rng.random() < 0.01 else kind[int(x)] for x in c]
    idx = u.schema.get_field_index("collection_type")
    t["instance_usage"] = u.set_column(idx, u.schema.field(idx), pa.array(ct, type=pa.int8()))
    return t


def sql_jobs(ds, rows: str, tm_name: str = "notebook") -> dict[int, tuple[float, float, int, str]]:
    """collection_id -> (NCU-hours, NMU-hours, windows, tier), by DuckDB over the dataset's Parquet."""
    where = "collection_type = 0" if rows == "jobs" else "(alloc_collection_id IS NULL OR alloc_collection_id = 0)"
    q = f"""
    WITH u AS (SELECT * FROM read_parquet('{ds}/instance_usage/*.parquet')
               WHERE {where} AND end_time > start_time AND end_time < 9223372036854775807),
         e AS (SELECT collection_id, instance_index, machine_id, MAX(priority) AS p
               FROM read_parquet('{ds}/instance_events/*.parquet') WHERE machine_id IS NOT NULL GROUP BY ALL),
         k AS (SELECT DISTINCT collection_id, instance_index, machine_id FROM u),
         pr AS (SELECT k.collection_id, MAX(e.p) AS p FROM k JOIN e USING (collection_id, instance_index, machine_id)
                GROUP BY 1)
    SELECT u.collection_id,
           SUM(COALESCE(CAST(avg_cpu AS DOUBLE), 0) * CAST(end_time - start_time AS DOUBLE) / 3.6e9),
           SUM(COALESCE(CAST(avg_mem AS DOUBLE), 0) * CAST(end_time - start_time AS DOUBLE) / 3.6e9),
           COUNT(*), ANY_VALUE(pr.p)
    FROM u LEFT JOIN pr USING (collection_id) GROUP BY u.collection_id"""
    tm = tier_map(tm_name)
    out = {}
    for cid, cpu, mem, n, p in duckdb.sql(q).fetchall():
        tier = "unknown"
        if p is not None and p >= 0:
            tier = [name for name, lo in zip(tm.names, tm.bounds, strict=True) if p >= lo][-1]
        out[int(cid)] = (cpu, mem, int(n), tier)
    return out


def quantile(xs: list[float], q: float) -> float:
    """Linear interpolation between order statistics (NumPy's default), by hand."""
    s = sorted(xs)
    h = (len(s) - 1) * q
    lo = math.floor(h)
    return s[lo] + (h - lo) * (s[min(lo + 1, len(s) - 1)] - s[lo])


def plain_stats(xs: list[float], tail: float) -> dict[str, float]:
    n = len(xs)
    mean = sum(xs) / n
    var = sum((x - mean) ** 2 for x in xs) / n
    desc = sorted(xs, reverse=True)
    out = {
        "jobs": n,
        "total_hours": sum(xs),
        "mean": mean,
        "variance": var,
        "median": quantile(xs, 0.5),
        "p90": quantile(xs, 0.9),
        "p99": quantile(xs, 0.99),
        "p999": quantile(xs, 0.999),
        "max": desc[0],
        "top1pct_share": sum(desc[: max(1, math.ceil(0.01 * n))]) / sum(xs),
        "top01pct_share": sum(desc[: max(1, math.ceil(0.001 * n))]) / sum(xs),
        "scv": var / mean**2,
    }
    m = min(n, max(2, math.ceil(tail * n)))
    if n >= 2:
        lx = [math.log10(x) for x in desc[:m]]
        ly = [math.log10((j + 1) / n) for j in range(m)]
        mx, my = sum(lx) / m, sum(ly) / m
        sxx = sum((a - mx) ** 2 for a in lx)
        if sxx > 0:
            slope = sum((a - mx) * (b - my) for a, b in zip(lx, ly, strict=True)) / sxx
            icept = my - slope * mx
            ss_res = sum((b - (slope * a + icept)) ** 2 for a, b in zip(lx, ly, strict=True))
            ss_tot = sum((b - my) ** 2 for b in ly)
            out.update(tail_jobs=m, pareto_alpha=-slope, pareto_r2=1 - ss_res / ss_tot)
    return out


def pearson(a: list[float], b: list[float]) -> float:
    n = len(a)
    ma, mb = sum(a) / n, sum(b) / n
    cov = sum((x - ma) * (y - mb) for x, y in zip(a, b, strict=True))
    return cov / math.sqrt(sum((x - ma) ** 2 for x in a) * sum((y - mb) ** 2 for y in b))


@pytest.mark.parametrize("seed, rows", [(1, "jobs"), (2, "top-level"), (3, "jobs")])
def test_matches_sql_and_plain_statistics(tmp_path, seed, rows):
    tables = cell_with_types(seed)
    ds = write_dataset(tmp_path / "ds", tables, files=3, row_group_size=900)
    a = JobUsage(rows=rows, tail=0.2)
    res = run(Dataset(ds), a, partitions=4, workers=2)["job-usage"]
    want = sql_jobs(ds, rows)
    jobs = res["jobs"]
    assert sorted(jobs["collection_id"]) == sorted(want)
    for r in jobs.itertuples():
        cpu, mem, n, tier = want[r.collection_id]
        assert (r.windows, r.tier) == (n, tier), r.collection_id
        assert r.ncu_hours == pytest.approx(cpu, rel=1e-9, abs=1e-15)
        assert r.nmu_hours == pytest.approx(mem, rel=1e-9, abs=1e-15)
    # statistics per tier and over all, from DuckDB's per-collection hours
    st = res["stats"].set_index(["tier", "resource"])
    for tier in {*(v[3] for v in want.values()), "all"}:
        for k, res_name in ((0, "cpu"), (1, "mem")):
            xs = [v[k] for v in want.values() if (tier == "all" or v[3] == tier)]
            pos = [x for x in xs if x > 0]
            row = st.loc[(tier, res_name)]
            assert row["zero_jobs"] == len(xs) - len(pos)
            for col, v in plain_stats(pos, 0.2).items():
                assert row[col] == pytest.approx(v, rel=1e-9, abs=1e-12), (tier, res_name, col)
    corr = res["correlation"].set_index("tier")
    both = [(v[0], v[1]) for v in want.values() if v[0] > 0 and v[1] > 0]
    assert corr.loc["all", "jobs"] == len(both)
    assert corr.loc["all", "pearson_r"] == pytest.approx(pearson(*map(list, zip(*both, strict=True))), rel=1e-9)
    logs = [(math.log10(x), math.log10(y)) for x, y in both]
    assert corr.loc["all", "log_pearson_r"] == pytest.approx(pearson(*map(list, zip(*logs, strict=True))), rel=1e-9)
    assert set(STAT_COLUMNS) <= set(res["stats"].columns)


def test_planted_top_share_of_a_synthetic_cell(synth_cell_40):
    """`gpuclust synth` writes the share of job CPU-seconds used by the top 1% of jobs it
    generated (synth_truth.json usage.job_cpu_seconds_top1pct_share, also in the dataset's manifest);
    job-usage recovers it."""
    ds = Dataset(synth_cell_40 / "ds")
    truth = ds.manifest["synthetic"]
    res = run(ds, JobUsage(), partitions="auto")["job-usage"]
    row = res["stats"].set_index(["tier", "resource"]).loc[("all", "cpu")]
    assert row["top1pct_share"] == pytest.approx(truth["usage"]["job_cpu_seconds_top1pct_share"], rel=1e-6)


def test_bucketed_equals_flat(tmp_path):
    """A flat dataset and its `gpuclust optimize`d copy in 8 buckets (optimized in this process:
    the command's own tests are in tests/test_layout.py) give one result, on either scheduler."""
    from gpuclust.optimize import optimize

    tables = cell_with_types(4)
    flat = write_dataset(tmp_path / "flat", tables, files=2)
    optimize(flat, buckets=8, out=tmp_path / "opt", progress=False)
    a = JobUsage()
    want = run(Dataset(flat), a, partitions=3)["job-usage"]
    for sched in (None, "threads"):
        got = run(Dataset(tmp_path / "opt"), a, partitions=3, scheduler=sched)["job-usage"]
        assert_results_same({"job-usage": got}, {"job-usage": want}, rtol=1e-9)


def test_planted_pareto_tail_of_job_sizes(tmp_path_factory):
    """`gpuclust synth` plants the sizes of the batch and free jobs outside alloc sets (instances x
    CPU request x expected task work ~ Pareto with tail index ``job_size_alpha``; synth_truth.json
    planted.job_sizes), so their NCU-hours have that tail; job-usage's Pareto fit of the CCDF
    (rows=top-level keeps jobs inside allocs out; tail=0.5) recovers alpha, per tier and over both.

    Tolerance: a simulation of the rank-regression fit (300 runs of N Pareto sizes times the per-job
    noise of the generator: the mean of the instances' usage and work factors, log-sd 0.4-0.7)
    gives a mean of 0.95-0.99 alpha and a standard deviation of about 2 alpha / sqrt(N) at
    tail=0.5 (N = 300: 0.11 alpha, 600: 0.08, 1200: 0.055), so |alpha_hat / alpha - 1| <=
    0.06 + 3 x 2 / sqrt(N).  Seed 1, 150 machines x 4 h, alpha 1.5: free 1.22 (346 jobs), beb 1.47
    (652), both 1.40 (998), R^2 >= 0.985 (seeds 2, 3: both 1.49, 1.65).  Free jobs run longer (median
    30 min), so the trace end and preemption cut more of them short: their fit comes out lower.
    The cell is the one test_cpi.py and test_overcommit.py read too (tests/analyses/planted_cells.py),
    built once per run."""
    from gpuclust.analyses.job_usage import job_stats

    alpha = _cells.JOB_SIZE_ALPHA
    ds = Dataset(_cells.synth_150x4(tmp_path_factory))
    planted = ds.manifest["synthetic"]["planted"]["job_sizes"]
    assert planted["alpha"] == alpha == 1.5 and planted["tiers"] == ["free", "beb"]
    res = run(ds, JobUsage(rows="top-level", tail=0.5, tier_map="notebook"), partitions="auto")["job-usage"]
    stats = res["stats"].set_index(["tier", "resource"])
    jobs = res["jobs"]
    x = jobs.loc[jobs["tier"].isin(planted["tiers"]), "ncu_hours"].to_numpy()
    both = job_stats(x[x > 0], 0.5)
    fits = {
        t: (
            int(stats.loc[(t, "cpu"), "jobs"]),
            stats.loc[(t, "cpu"), "pareto_alpha"],
            stats.loc[(t, "cpu"), "pareto_r2"],
        )
        for t in planted["tiers"]
    }
    fits["both"] = (int(both["jobs"]), both["pareto_alpha"], both["pareto_r2"])
    for name, (n, a_hat, r2) in fits.items():
        assert n >= 300, (name, n)
        assert abs(a_hat / alpha - 1) <= 0.06 + 6 / math.sqrt(n), (name, n, a_hat)
        assert r2 >= 0.95, (name, r2)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_grouping_by_lookup_codes_equals_grouping_by_sort(seed):
    """The partial's two groupings give the same partial bit for bit: by the lookup table's
    collection codes (no sort; used while the table's collections are few against the rows) and by
    a stable sort of the collection ids.  Windows whose key has events, whose key has none but whose
    collection has other keys with events, and whose collection has no events at all; priorities
    NULL (-1) too."""
    from gpuclust.analyses._lookup import InstanceLookup
    from gpuclust.analyses.job_usage import JobUsageContext
    from gpuclust.backends import get_backend

    be = get_backend("cpu")
    rng = np.random.default_rng(seed)
    keys = np.unique(
        np.stack([rng.integers(0, 60, 400), rng.integers(0, 5, 400), rng.integers(1, 9, 400)], axis=1), axis=0
    )
    prio = np.where(rng.random(keys.shape[0]) < 0.2, -1, rng.integers(0, 400, keys.shape[0])).astype(np.int32)
    lk = InstanceLookup.build(keys[:, 0], keys[:, 1], keys[:, 2], prio)
    colls, key_coll = np.unique(lk.collection, return_inverse=True)
    ctx = JobUsageContext(tier_map("notebook"), lk, colls, key_coll.reshape(-1).astype(np.int64))
    n = 5000
    c = rng.integers(0, 80, n)  # collections 60..79 have no events
    cols = {
        "collection_id": c,
        "instance_index": rng.integers(0, 6, n).astype(np.int32),
        "machine_id": rng.integers(1, 10, n),
    }  # instance 5 and machine 9 never have events
    r = np.flatnonzero(rng.random(n) < 0.9)
    vals = {k: rng.gamma(0.5, 0.3, r.shape[0]) for k in ("cpu", "mem")}
    by_code = JobUsage._by_code(be, ctx, cols, r, c[r], vals)
    found, p = lk.find(be, cols["collection_id"], cols["instance_index"], cols["machine_id"], rows=r)
    by_sort = JobUsage._by_sort(be, c[r], np.where(found, p, -1).astype(np.int64), vals)
    assert (~found).any() and found.any() and (p[found] == -1).any()
    assert set(by_code) == set(by_sort)
    for k in by_sort:
        assert by_code[k].dtype == by_sort[k].dtype, k
        np.testing.assert_array_equal(by_code[k], by_sort[k], err_msg=k)
    # and against a slow loop
    want: dict[int, list] = {}
    for j, row in enumerate(r.tolist()):
        w = want.setdefault(int(c[row]), [0.0, 0.0, 0, -1])
        w[0] += vals["cpu"][j]
        w[1] += vals["mem"][j]
        w[2] += 1
        w[3] = max(w[3], int(p[j]) if found[j] else -1)
    assert by_code["key"].tolist() == sorted(want)
    assert by_code["windows"].tolist() == [want[k][2] for k in sorted(want)]
    assert by_code["prio"].tolist() == [want[k][3] for k in sorted(want)]
    np.testing.assert_allclose(by_code["cpu"], [want[k][0] for k in sorted(want)], rtol=1e-12)
    # every row counting (rows=None: no gathers) gives the partial of all rows
    every = JobUsage._by_code(be, ctx, cols, None, c, {k: rng.gamma(0.5, 0.3, n) for k in ("cpu", "mem")})
    r_all = np.arange(n)
    assert every["key"].tolist() == sorted(set(c.tolist()))
    found, p = lk.find(be, cols["collection_id"], cols["instance_index"], cols["machine_id"], rows=r_all)
    assert (
        every["prio"].tolist()
        == JobUsage._by_sort(be, c, np.where(found, p, -1).astype(np.int64), {k: np.zeros(n) for k in ("cpu", "mem")})[
            "prio"
        ].tolist()
    )


@pytest.mark.parametrize("rows", ["jobs", "top-level"])
def test_finalize_on_the_device_equals_the_host(synth_cell_40, rows, monkeypatch):
    """A gpu run's one-partition partial stays on the device (``device_partial``), and the
    finalize sorts, sums and fits there: on the device-shaped backend (tests/device_backend.py:
    device arrays that refuse host ones) it gives the host's tables, and copies out the jobs
    table's columns and a few scalars a statistic, not the partial."""
    from device_backend import DEVICE, counting_device_work, resolve_gpu_to_device

    from gpuclust.analyses.base import to_host
    from gpuclust.backends import get_backend
    from gpuclust.engine.local import context_of
    from gpuclust.engine.partition import column_to_numpy
    from gpuclust.tables import as_pandas

    a = JobUsage(rows=rows)
    d = Dataset(synth_cell_40 / "ds")
    ctx = context_of(a, d)
    t = d.read(a.table, columns=list(a.columns))
    cols = {c: column_to_numpy(t.column(c)) for c in a.columns}
    host = a.finalize(to_host(a.partial(cols, ctx, get_backend("cpu"))), ctx)
    resolve_gpu_to_device(monkeypatch)  # (the device arrays' backend)
    p = a.partial({c: DEVICE.asarray(v) for c, v in cols.items()}, ctx, DEVICE)
    assert type(p["key"]).__name__ == "DeviceArray"
    with counting_device_work() as w:
        dev = a.finalize(p, ctx)
    for name in host:
        assert_results_same({"t": {"x": as_pandas(host[name])}}, {"t": {"x": as_pandas(dev[name])}}, rtol=1e-12)
    jobs = dev["jobs"].num_rows
    assert jobs > 100
    # the sorts and statistics ran on the device (hundreds of operations: 425 here), and what
    # came out is the jobs table's columns (and the tier codes: 40 B a job) and the scalars read
    assert w["ops"] >= 200, w
    assert w["d2h_bytes"] <= jobs * 40 + 8 * w["syncs"] + 1024, (w["d2h_bytes"], jobs, w["syncs"])


@pytest.mark.gpu
def test_finalize_on_a_device_equals_the_host(synth_cell_40, gpu_backend):
    """The same on a real device (CuPy's sorts, polyfit, corrcoef): the host's tables."""
    from gpuclust.analyses.base import to_host
    from gpuclust.backends import get_backend
    from gpuclust.engine.local import context_of
    from gpuclust.engine.partition import column_to_numpy
    from gpuclust.tables import as_pandas

    a = JobUsage()
    d = Dataset(synth_cell_40 / "ds")
    ctx = context_of(a, d)
    t = d.read(a.table, columns=list(a.columns))
    cols = {c: column_to_numpy(t.column(c)) for c in a.columns}
    host = a.finalize(to_host(a.partial(cols, ctx, get_backend("cpu"))), ctx)
    dev = a.finalize(a.partial({c: gpu_backend.asarray(v) for c, v in cols.items()}, ctx, gpu_backend), ctx)
    for name in host:
        h, g = as_pandas(host[name]), as_pandas(dev[name])
        if name == "jobs":  # (collections whose totals tie to the last bits may swap: atomics add in any order)
            h, g = (f.sort_values("collection_id") for f in (h, g))
        assert_results_same({"t": {"x": h}}, {"t": {"x": g}}, rtol=1e-9)
