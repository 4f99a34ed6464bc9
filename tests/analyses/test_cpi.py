"""The ``cpi`` analysis: planted-slope recovery on a synthetic cell, independent references
(DuckDB SQL, NumPy lstsq on joined rows, scipy's spearmanr), partition invariance, the merge laws on
hypothesis tables *with* CPI/MAI (the shared conformance tables have none), report output, GPU parity.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import by_path
import numpy as np
import pandas as pd
import pyarrow as pa
import pytest
import scipy.stats
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from strategies import cell, examples, table

import gpuclust.engine as engine
from gpuclust.analyses import create
from gpuclust.analyses.base import to_host
from gpuclust.analyses.cpi import BY, Cpi
from gpuclust.dataset import Dataset
from gpuclust.engine import TableSource
from gpuclust.engine.local import context_of
from gpuclust.engine.partition import column_to_numpy
from gpuclust.report.analyze import analyze

# distributed leaks the socket it uses to pick a free port; the ResourceWarning surfaces as an
# "unraisable" warning in whichever test runs at GC time (as in tests/engine/test_engine.py).
pytestmark = [
    pytest.mark.filterwarnings("ignore:unclosed <socket:ResourceWarning"),
    pytest.mark.filterwarnings("ignore:Exception ignored in. <socket:pytest.PytestUnraisableExceptionWarning"),
]

_cells = by_path.load("gpuclust_planted_cells", Path(__file__).with_name("planted_cells.py"))
RTOL = 1e-9
HOUR = 3_600_000_000


# ----------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="session")
def synth_ds(tmp_path_factory):
    """The synthetic cell with planted CPI slopes (150 machines x 4 h, seed 1: tests/analyses/
    planted_cells.py, which says how well it recovers them), synthesized once per pytest run
    (whatever the xdist workers: :func:`run_once.once_per_run`; test_overcommit.py and
    test_job_usage.py read it too); the tests only read it; docs/analyses/cpi.md quotes its
    result."""
    return _cells.synth_150x4(tmp_path_factory)


@pytest.fixture(scope="session")
def synth_result(synth_ds):
    return engine.run(synth_ds, Cpi(by="platform"), partitions=2)["cpi"]


@pytest.fixture(scope="session")
def synth_rows(synth_ds):
    """The filtered windows joined to k and util, computed with DuckDB SQL over the Parquet parts."""
    pytest.importorskip("duckdb")
    return duckdb_windows(synth_ds)


def duckdb_windows(ds_path: Any, win_end: int | None = None) -> pd.DataFrame:
    """A synthetic cell's windows that pass cpi's filter, each with its CPU-seconds ``w`` and its
    machine-cell's ``k`` (top-level windows) and ``util`` (their CPU-seconds over the cell's
    capacity-seconds; ``win_end``: the trace window's end, by default the one the synthesizer
    wrote in the manifest), by DuckDB SQL over the Parquet parts (tests/test_claims.py uses it too)."""
    import duckdb

    ds = Dataset(ds_path)
    us = [str(f) for f in ds.files("instance_usage")]
    me = [str(f) for f in ds.files("machine_events")]
    win_end = ds.manifest["synthetic"]["trace_window_us"][1] if win_end is None else win_end
    con = duckdb.connect()
    con.execute("SET threads TO 2")
    q = f"""
    WITH u AS (SELECT *, (end_time - start_time) / 1e6 AS dur, CAST(avg_cpu AS DOUBLE) * (end_time - start_time) / 1e6 AS cs,
                      start_time // 300000000 AS cell
               FROM read_parquet({us})),
    cap AS (SELECT machine_id, MAX(CAST(cap_cpu AS DOUBLE)) AS cap FROM read_parquet({me}) GROUP BY machine_id HAVING MAX(cap_cpu) > 0),
    plat AS (SELECT machine_id, ANY_VALUE(platform_id) AS platform_id FROM read_parquet({me})
             WHERE platform_id IS NOT NULL GROUP BY machine_id),
    mc AS (SELECT machine_id, cell, COUNT(*) AS k, SUM(cs) AS scs FROM u
           WHERE COALESCE(alloc_collection_id, 0) = 0 GROUP BY machine_id, cell)
    SELECT u.machine_id, u.collection_id, u.instance_index, plat.platform_id, CAST(u.cpi AS DOUBLE) AS cpi,
           CAST(u.mai AS DOUBLE) AS mai, u.cs AS w, mc.k,
           mc.scs / ((LEAST((u.cell + 1) * 300000000, {win_end}) - GREATEST(u.cell * 300000000, 600000000)) / 1e6 * cap.cap) AS util
    FROM u LEFT JOIN mc USING (machine_id, cell) LEFT JOIN cap USING (machine_id) LEFT JOIN plat USING (machine_id)
    WHERE u.cpi IS NOT NULL AND u.mai IS NOT NULL AND u.cpi > 0 AND u.cpi <= 100 AND u.mai >= 0 AND u.mai <= 1
          AND u.cs >= 0.01 AND u.cs > 0
    """
    return con.execute(q).df()


def _assert_frames(a: pd.DataFrame, b: pd.DataFrame, rtol: float = RTOL) -> None:
    assert list(a.columns) == list(b.columns)
    assert len(a) == len(b)
    for c in a.columns:
        x, y = a[c].reset_index(drop=True), b[c].reset_index(drop=True)
        if x.dtype.kind == y.dtype.kind == "f" and np.array_equal(x.to_numpy(), y.to_numpy(), equal_nan=True):
            continue  # equal bit for bit (NaN where NaN): within any tolerance, without assert_allclose's cost
        if x.dtype.kind == "f":
            # a standard error is the sqrt of a residual variance: for an (almost) exact fit that
            # variance is a cancellation at ~eps x var(y), so its sqrt has an absolute noise floor
            # of ~sqrt(eps) x the CPI scale (O(1)): 0 vs 4e-8 are the same answer there
            # likewise a std of (near-)constant values is rounding noise at ~eps x |mean| (MAI
            # ~1e-2: 1.2e-25 vs 8.5e-26 found by hypothesis are both zero)
            atol = 1e-7 if c.endswith("_se") else 1e-12 if c.endswith("_std") else 1e-300
            np.testing.assert_allclose(x.to_numpy(), y.to_numpy(), rtol=rtol, atol=atol, equal_nan=True, err_msg=c)
        else:
            assert (
                x.tolist() == y.tolist()
                or (x.isna() == y.isna()).all()
                and x[x.notna()].tolist() == y[y.notna()].tolist()
            ), c


def _assert_results(r1, r2, rtol=RTOL):
    assert r1.keys() == r2.keys()
    for k in r1:
        _assert_frames(r1[k], r2[k], rtol)


# ----------------------------------------------------------------------------- planted truth


def test_synth_recovers_planted_slopes(synth_ds, synth_result):
    planted = Dataset(synth_ds).manifest["synthetic"]["planted"]
    a, b = planted["cpi_per_task"], planted["cpi_per_util"]
    reg = synth_result["regression"]
    fe = reg[reg["fit"] == "platform-fixed-effects"].iloc[0]
    assert bool(fe["primary"])  # the default fit is the one that recovers the planted slopes
    a_hat = fe["pct_per_task_vs_intercept"] / 100.0
    b_hat = fe["pct_per_10pct_util_vs_intercept"] / 10.0
    assert abs(a_hat / a - 1) < 0.10, (a_hat, a)
    assert abs(b_hat / b - 1) < 0.10, (b_hat, b)
    # per platform: b0 = base, slopes relative to it = a, b (largest platform)
    per = reg[reg["fit"] == "per-platform"].sort_values("n", ascending=False)
    top = per.iloc[0]
    base = planted["platforms"][top["platform_id"]]["cpi_base"]
    assert abs(top["intercept"] / base - 1) < 0.02
    assert abs(top["pct_per_task_vs_intercept"] / (100 * a) - 1) < 0.10
    assert abs(top["pct_per_10pct_util_vs_intercept"] / (10 * b) - 1) < 0.10
    # every platform with counters is found, with its base CPI as the intercept (within 5%)
    with_counters = {p for p, v in planted["platforms"].items() if v["has_counters"]}
    assert set(per["platform_id"]) == with_counters
    for _, r in per.iterrows():
        assert abs(r["intercept"] / planted["platforms"][r["platform_id"]]["cpi_base"] - 1) < 0.05


def test_the_documented_result_is_the_planted_cells(synth_ds, synth_result):
    """docs/analyses/cpi.md's "Result on the synthetic cell" is this run's, to its digits."""
    doc = " ".join((Path(__file__).resolve().parents[2] / "docs" / "analyses" / "cpi.md").read_text().split())
    planted = Dataset(synth_ds).manifest["synthetic"]["planted"]
    info, reg = synth_result["info"].iloc[0], synth_result["regression"]
    task, util = "pct_per_task_vs_intercept", "pct_per_10pct_util_vs_intercept"
    fe, pooled = (reg[reg["fit"] == f].iloc[0] for f in ("platform-fixed-effects", "pooled"))
    bases = {p: v["cpi_base"] for p, v in planted["platforms"].items() if v["has_counters"]}
    per = reg[reg["fit"] == "per-platform"].set_index("platform_id").loc[sorted(bases, key=bases.get)]
    a, b = 100 * planted["cpi_per_task"], 10 * planted["cpi_per_util"]

    def off(x: float, want: float, digits: int) -> str:
        return f"{100 * (x / want - 1):+.{digits}f} %".replace("-", "−")

    def slash(values: Any, fmt: str) -> str:
        return " / ".join(format(v, fmt) for v in values)

    for line in (
        f"{info['windows_total']:,} windows, {info['windows_kept']:,} pass the filter",
        f"| **platform-fixed-effects** | {fe[task]:.3f} ± {fe[task + '_se']:.3f} ({off(fe[task], a, 1)}) "
        f"| {fe[util]:.3f} ± {fe[util + '_se']:.3f} ({off(fe[util], b, 1)}) |",
        f"| per-platform (bases {slash(sorted(bases.values()), '.2f')}) | {slash(per[task], '.3f')} "
        f"| {slash(per[util], '.2f')} |",
        f"| pooled | {pooled[task]:.3f} ({off(pooled[task], a, 0)}) | {pooled[util]:.2f} ({off(pooled[util], b, 0)}) |",
        f"Per-platform intercepts {slash(per['intercept'], '.3f')} vs planted bases",
    ):
        assert line in doc, line


def test_filter_drops_exactly_the_planted_outliers(synth_ds):
    duckdb = pytest.importorskip("duckdb")
    planted = Dataset(synth_ds).manifest["synthetic"]["planted"]
    res = engine.run(synth_ds, Cpi(min_cpu_seconds=0.0, spearman="none"))["cpi"]
    f = res["filter"].set_index("reason")["windows"]
    ds = Dataset(synth_ds)
    us = [str(x) for x in ds.files("instance_usage")]
    n_out, n_out_cpu = (
        duckdb.connect()
        .execute(f"""SELECT COUNT(*), COUNT(*) FILTER (WHERE avg_cpu * (end_time - start_time) > 0)
                                     FROM read_parquet({us}) WHERE cpi > 100""")
        .fetchone()
    )
    assert n_out == planted["cpi_outlier_rows"]
    assert f["cpi_range"] == n_out_cpu  # an outlier window with no CPU time fails the weight test first
    assert (
        f["missing"] + f["cpu_seconds"] + f["cpi_range"] + f["mai_range"] + f["kept"] == res["info"]["windows_total"][0]
    )
    assert f["missing"] == res["info"]["windows_total"][0] - planted["cpi_rows"]


# ----------------------------------------------------------------------------- references


def test_k_and_util_match_sql(synth_ds):
    """The machine-cell sums (k, util per machine and 300 s cell; merged partials of two
    partitions) against DuckDB SQL over the same Parquet."""
    duckdb = pytest.importorskip("duckdb")
    from gpuclust.backends import get_backend
    from gpuclust.engine.partition import as_source

    ds = Dataset(synth_ds)
    a = Cpi()
    ctx = context_of(a, ds)
    t = as_source(ds).read("instance_usage", list(a.columns))
    be = get_backend("cpu")
    half = t.num_rows // 2
    parts = [
        a.partial({c: column_to_numpy(t.slice(lo, hi - lo).column(c)) for c in a.columns}, ctx, be)
        for lo, hi in ((0, half), (half, t.num_rows))
    ]
    _, keyed = a.kinds.split(a.kinds.merge(*parts))
    got = a.machine_cells(keyed["c"], ctx)
    con = duckdb.connect()
    us = [str(f) for f in ds.files("instance_usage")]
    me = [str(f) for f in ds.files("machine_events")]
    ref = con.execute(f"""
        WITH cap AS (SELECT machine_id, MAX(CAST(cap_cpu AS DOUBLE)) AS cap FROM read_parquet({me}) GROUP BY machine_id HAVING MAX(cap_cpu) > 0)
        SELECT machine_id, start_time // 300000000 AS cell, COUNT(*) AS k,
               SUM(CAST(avg_cpu AS DOUBLE) * (end_time - start_time) / 1e6) / (300.0 * ANY_VALUE(cap.cap)) AS util
        FROM read_parquet({us}) JOIN cap USING (machine_id)
        WHERE COALESCE(alloc_collection_id, 0) = 0 GROUP BY machine_id, cell ORDER BY machine_id, cell""").df()
    got = got.sort_values(["machine_id", "cell"]).reset_index(drop=True)
    assert len(got) == len(ref) > 1000
    assert got["machine_id"].tolist() == ref["machine_id"].tolist()
    assert got["cell"].tolist() == ref["cell"].tolist()
    assert got["k"].tolist() == ref["k"].tolist()
    np.testing.assert_allclose(got["util"], ref["util"], rtol=1e-9)  # whole hours: every cell is 300 s long


def test_split_of_a_device_partial_and_rests_merged_on_the_host(synth_ds, monkeypatch):
    """A device partial's split (as a one-partition gpu run leaves it: tests/device_backend.py):
    the keyed (machine, cell) sums and the per-group fields (moments, Spearman grid) stay where
    they are, the rest goes to the host; a rest whose per-group fields are on the device merges
    with a host one on the host, and with another device one on the device, into what the host
    partials' rests merge into."""
    from device_backend import DEVICE, resolve_gpu_to_device

    from gpuclust.backends import get_backend
    from gpuclust.engine.partition import as_source

    resolve_gpu_to_device(monkeypatch)  # backend_of(a device array): the device-shaped backend

    def on_device(v):
        return hasattr(v, "__cuda_array_interface__")

    ds = Dataset(synth_ds)
    a = Cpi(by="machine")
    ctx = context_of(a, ds)
    t = as_source(ds).read("instance_usage", list(a.columns))
    cpu, half = get_backend("cpu"), t.num_rows // 2

    def partial(lo, hi, be):
        return a.partial({c: be.asarray(column_to_numpy(t.slice(lo, hi - lo).column(c))) for c in a.columns}, ctx, be)

    rest, keyed = a.kinds.split(partial(0, half, DEVICE))
    assert set(keyed) == {"c", "w"} and all(on_device(v) for k in keyed.values() for v in k.values())
    assert all(on_device(v) == k.startswith("g_") for k, v in rest.items() if k != "backend")
    assert not any(k.startswith(("c_", "w_")) for k in rest)
    other = a.kinds.split(to_host(partial(half, t.num_rows, cpu)))[0]
    want = a.kinds.merge_rest(a.kinds.split(to_host(partial(0, half, cpu)))[0], other)
    got = a.kinds.merge_rest(rest, other)
    assert list(got) == list(want) and not any(on_device(v) for v in got.values())
    on_dev = a.kinds.merge_rest(rest, a.kinds.split(partial(half, t.num_rows, DEVICE))[0])
    assert all(on_device(v) == k.startswith("g_") for k, v in on_dev.items() if k != "backend")
    assert got["g_grid"].shape[0] > 100  # a grid per machine
    for merged in (got, to_host(on_dev)):
        for k, v in want.items():
            if isinstance(v, np.ndarray) and v.dtype.kind == "f":
                np.testing.assert_allclose(merged[k], v, rtol=1e-12, atol=1e-300, err_msg=k)
            elif isinstance(v, np.ndarray):
                np.testing.assert_array_equal(merged[k], v, err_msg=k)
            else:
                assert merged[k] == v, k


@pytest.mark.parametrize("by", ["platform", "machine", "collection", "cell"])
def test_groups_match_sql(synth_ds, synth_rows, by):
    duckdb = pytest.importorskip("duckdb")
    res = engine.run(synth_ds, Cpi(by=by, spearman="none"), partitions=2)["cpi"]["groups"]
    col = {"platform": "platform_id", "machine": "machine_id", "collection": "collection_id", "cell": None}[by]
    df = synth_rows.copy()
    gcol = col or "g"
    if col is None:
        df["g"] = "cell"
    ref = duckdb.sql(f"""
        WITH m AS (SELECT {gcol} AS g, SUM(w) AS Wt, SUM(w * cpi) / SUM(w) AS mc, SUM(w * mai) / SUM(w) AS mm
                   FROM df GROUP BY {gcol})
        SELECT m.g, COUNT(*) AS n, ANY_VALUE(m.Wt) AS Wt, ANY_VALUE(mc) AS cpi_mean,
               SQRT(SUM(w * (cpi - mc) ^ 2) / ANY_VALUE(m.Wt)) AS cpi_std,
               ANY_VALUE(mm) AS mai_mean, SQRT(SUM(w * (mai - mm) ^ 2) / ANY_VALUE(m.Wt)) AS mai_std,
               SUM(w * (cpi - mc) * (mai - mm)) / SQRT(SUM(w * (cpi - mc) ^ 2) * SUM(w * (mai - mm) ^ 2)) AS r
        FROM df JOIN m ON df.{gcol} = m.g GROUP BY m.g ORDER BY m.g""").df()
    key = res.columns[0]
    got = res.sort_values(key).reset_index(drop=True)
    assert got[key].tolist() == ref["g"].tolist()
    assert got["n"].tolist() == ref["n"].tolist()
    for a, b in (
        ("cpu_seconds", "Wt"),
        ("cpi_mean", "cpi_mean"),
        ("cpi_std", "cpi_std"),
        ("mai_mean", "mai_mean"),
        ("mai_std", "mai_std"),
        ("pearson_r", "r"),
    ):
        ok = ref["n"] > 2
        np.testing.assert_allclose(got[a][ok], ref[b][ok], rtol=1e-9, atol=1e-12, err_msg=a)


def _wls(X: np.ndarray, y: np.ndarray, w: np.ndarray, extra_params: int = 0):
    sw = np.sqrt(w)
    A = X * sw[:, None]
    coef, *_ = np.linalg.lstsq(A, y * sw, rcond=None)
    resid = (y - X @ coef) * sw
    dof = X.shape[0] - X.shape[1]
    s2 = resid @ resid / dof
    cov = s2 * np.linalg.inv(A.T @ A)
    return coef, np.sqrt(np.diag(cov)), 1 - resid @ resid / np.sum(w * (y - np.average(y, weights=w)) ** 2)


def test_regression_matches_lstsq(synth_result, synth_rows):
    reg = synth_result["regression"]
    df = synth_rows
    assert int(reg[reg["fit"] == "pooled"]["n"].iloc[0]) == len(df)
    y, w = df["cpi"].to_numpy(), df["w"].to_numpy()
    X = np.column_stack([np.ones(len(df)), df["util"], df["k"] - 1.0])
    coef, se, r2 = _wls(X, y, w)
    row = reg[reg["fit"] == "pooled"].iloc[0]
    np.testing.assert_allclose(row[["intercept", "b_util", "b_ntasks"]].astype(float), coef, rtol=1e-9)
    np.testing.assert_allclose(row[["intercept_se", "b_util_se", "b_ntasks_se"]].astype(float), se, rtol=1e-9)
    np.testing.assert_allclose(row["r2"], r2, rtol=1e-9)
    # per platform
    for _, r in reg[reg["fit"] == "per-platform"].iterrows():
        s = (df["platform_id"] == r["platform_id"]).to_numpy()
        coef, se, r2 = _wls(X[s], y[s], w[s])
        np.testing.assert_allclose(r[["intercept", "b_util", "b_ntasks"]].astype(float), coef, rtol=1e-9)
        np.testing.assert_allclose(r[["intercept_se", "b_util_se", "b_ntasks_se"]].astype(float), se, rtol=1e-9)
        np.testing.assert_allclose(r["r2"], r2, rtol=1e-9)
    # multiplicative fixed effects = platform dummies on CPI / (platform's weighted mean CPI)
    plats = sorted(df["platform_id"].unique())
    ybar = {p: np.average(y[df["platform_id"] == p], weights=w[df["platform_id"] == p]) for p in plats}
    yr = y / df["platform_id"].map(ybar).to_numpy()
    D = np.column_stack([(df["platform_id"] == p).to_numpy(float) for p in plats])
    coef, se, _ = _wls(np.column_stack([df["util"], df["k"] - 1.0, D]), yr, w)
    fe = reg[reg["fit"] == "platform-fixed-effects"].iloc[0]
    np.testing.assert_allclose(fe[["b_util", "b_ntasks"]].astype(float), coef[:2], rtol=1e-9)
    np.testing.assert_allclose(fe[["b_util_se", "b_ntasks_se"]].astype(float), se[:2], rtol=1e-9)
    # its intercept = CPU-second-weighted mean of the platform intercepts
    Wp = np.array([w[df["platform_id"] == p].sum() for p in plats])
    np.testing.assert_allclose(fe["intercept"], (Wp * coef[2:]).sum() / Wp.sum(), rtol=1e-9)


# ----------------------------------------------------------------------------- Spearman


def _tiny_cell(seed: int, n: int = 400, equal_weights: bool = True) -> dict[str, pa.Table]:
    rng = np.random.default_rng(seed)
    mids = np.array([11, 12, 2**53 + 1], dtype=np.int64)
    me = table(
        "machine_events",
        {
            "time": [0, 0, 0],
            "machine_id": mids,
            "type": [1, 1, 1],
            "cap_cpu": [0.5, 1.0, None],
            "cap_mem": [0.5, 0.5, 0.5],
            "platform_id": ["pA", "pB", "pA"],
        },
    )
    m = rng.choice(mids, n)
    start = 600_000_000 + rng.integers(0, 12, n) * 300_000_000
    x = rng.normal(size=n)
    cpi = np.round(1.5 + 0.3 * x + 0.2 * rng.normal(size=n), 2)  # rounded: many ties
    mai = np.round(0.01 + 0.002 * x + 0.002 * rng.normal(size=n), 4)
    us = table(
        "instance_usage",
        {
            "start_time": start,
            "end_time": start + 300_000_000,
            "collection_id": rng.integers(1, 4, n),
            "instance_index": rng.integers(0, 5, n).astype(np.int32),
            "machine_id": m,
            "alloc_collection_id": np.where(rng.random(n) < 0.1, 7, 0),
            "avg_cpu": np.full(n, 0.05, np.float32) if equal_weights else rng.uniform(0.01, 0.2, n).astype(np.float32),
            "cpi": cpi.astype(np.float32),
            "mai": mai.astype(np.float32),
        },
    )
    return {"machine_events": me, "instance_usage": us}


def test_spearman_exact_matches_scipy_and_grid_within_bound():
    tables = _tiny_cell(1)
    us = tables["instance_usage"].to_pandas()
    ex = engine.run(tables, Cpi(by="machine", spearman="exact"), partitions=3)["cpi"]["groups"]
    gr = engine.run(tables, Cpi(by="machine", spearman="grid", spearman_bins=16), partitions=3)["cpi"]["groups"]
    assert (ex["spearman_method"] == "exact").all() and (gr["spearman_method"] == "grid").all()
    for (_, e), (_, g) in zip(ex.iterrows(), gr.iterrows(), strict=True):
        sub = us[us["machine_id"] == e["machine_id"]]
        rho = scipy.stats.spearmanr(sub["cpi"], sub["mai"]).statistic  # equal weights: weighted = unweighted
        np.testing.assert_allclose(e["spearman_rho"], rho, rtol=1e-9)
        assert abs(g["spearman_rho"] - rho) <= g["spearman_bound"] + 1e-12
        assert g["spearman_bound"] < 0.5


def test_weighted_spearman_is_replicated_unweighted():
    """Weighted exact Spearman = scipy on rows replicated by their (integer) weight."""
    tables = _tiny_cell(2, n=120)
    t = tables["instance_usage"]
    rng = np.random.default_rng(5)
    reps = rng.integers(1, 4, t.num_rows)
    t = t.set_column(t.schema.get_field_index("avg_cpu"), "avg_cpu", pa.array((reps * 0.01).astype(np.float32)))
    tables["instance_usage"] = t
    g = engine.run(tables, Cpi(by="cell", spearman="exact"))["cpi"]["groups"]
    us = t.to_pandas()
    cs = us["avg_cpu"].astype(float) * 300
    rep = np.rint(cs / cs.min()).astype(int)
    rho = scipy.stats.spearmanr(np.repeat(us["cpi"], rep), np.repeat(us["mai"], rep)).statistic
    np.testing.assert_allclose(g["spearman_rho"].iloc[0], rho, rtol=1e-9)


# ----------------------------------------------------------------------------- partitions / schedulers


def test_partition_invariance(synth_ds, synth_result):
    n = Dataset(synth_ds).num_rows("instance_usage")
    for kw in (
        {"partitions": 1},
        {"partitions": 7},
        {"cut_points": {"instance_usage": sorted(np.random.default_rng(0).integers(1, n, 4).tolist())}},
    ):
        _assert_results(engine.run(synth_ds, Cpi(by="platform"), **kw)["cpi"], synth_result)


def test_local_cluster(tmp_path):
    tables = _tiny_cell(3, n=2000, equal_weights=False)
    a = Cpi(by="machine", spearman="exact")
    ref = engine.run(tables, a)["cpi"]
    _assert_results(engine.run(tables, a, partitions=5, scheduler="threads")["cpi"], ref)
    _assert_results(engine.run(tables, a, partitions=4, scheduler="local:2")["cpi"], ref)


# ----------------------------------------------------------------------------- merge laws with CPI present


@st.composite
def shared_cell_with_cpi(draw):
    """The shared conformance cell (tests/strategies.py) with CPI, MAI and platforms added."""
    t = draw(cell())
    us = t["instance_usage"]
    n = us.num_rows
    f32 = st.one_of(st.floats(-1, 300, width=32), st.just(float("nan")))
    cpi = draw(st.lists(st.one_of(st.none(), st.sampled_from([0.0, 1.5, 1.5, 250.0]), f32), min_size=n, max_size=n))
    mai = draw(
        st.lists(
            st.one_of(st.none(), st.sampled_from([0.0, 0.01, 2.0]), st.floats(0, 1, width=32)), min_size=n, max_size=n
        )
    )
    us = us.set_column(us.schema.get_field_index("cpi"), "cpi", pa.array(cpi, pa.float32()))
    us = us.set_column(us.schema.get_field_index("mai"), "mai", pa.array(mai, pa.float32()))
    me = t["machine_events"]
    plats = draw(st.lists(st.sampled_from([None, "p1", "p2"]), min_size=me.num_rows, max_size=me.num_rows))
    me = me.set_column(me.schema.get_field_index("platform_id"), "platform_id", pa.array(plats, pa.string()))
    return {**t, "instance_usage": us, "machine_events": me}


@st.composite
def dense_cpi_cell(draw):
    """Few machines and cells, so machine-cells hold several rows; mostly valid CPI with ugly cases
    (NULL / zero / huge CPI, NULL or zero CPU, zero-length and "after the trace" windows, allocs,
    NULL capacity, platform changes, ids above 2^53)."""
    mids = draw(st.lists(st.sampled_from([3, 10, 2**53 + 1, 2**62 + 12345]), min_size=1, max_size=4, unique=True))
    me: dict[str, list] = {k: [] for k in ("time", "machine_id", "type", "cap_cpu", "cap_mem", "platform_id")}
    for m in mids:
        for j in range(draw(st.integers(1, 2))):
            me["time"].append([0, 600_000_000 + 900_000_000][j])
            me["machine_id"].append(m)
            me["type"].append(1 if j == 0 else 3)
            me["cap_cpu"].append(draw(st.sampled_from([None, 0.5, 0.5, 1.0, 0.25])))
            me["cap_mem"].append(0.5)
            me["platform_id"].append(draw(st.sampled_from([None, "p1", "p2", "p2"])))
    inst = draw(
        st.lists(
            st.tuples(st.sampled_from([5, 2**40 + 1, 2**60]), st.integers(0, 2), st.sampled_from(mids)),
            min_size=1,
            max_size=6,
            unique=True,
        )
    )
    ev: dict[str, list] = {k: [] for k in ("time", "type", "collection_id", "instance_index", "machine_id", "priority")}
    for c, i, m in inst:
        if draw(st.booleans()):
            ev["time"].append(0)
            ev["type"].append(3)
            ev["collection_id"].append(c)
            ev["instance_index"].append(i)
            ev["machine_id"].append(m)
            ev["priority"].append(draw(st.sampled_from([None, 0, 105, 117, 200, 400, -1])))
    us: dict[str, list] = {
        k: []
        for k in (
            "start_time",
            "end_time",
            "collection_id",
            "instance_index",
            "machine_id",
            "alloc_collection_id",
            "avg_cpu",
            "cpi",
            "mai",
        )
    }
    for _ in range(draw(st.integers(1, 60))):
        c, i, m = draw(st.sampled_from(inst))
        s = 600_000_000 + draw(st.integers(0, 4)) * 300_000_000 + draw(st.sampled_from([0, 0, 100_000_000]))
        kind = draw(st.sampled_from(["full"] * 8 + ["short", "zero", "after"]))
        e = {
            "full": s + 300_000_000 - (s % 300_000_000 if s % 300_000_000 else 0),
            "short": s + 50_000_000,
            "zero": s,
            "after": 2**63 - 1,
        }[kind]
        us["start_time"].append(s)
        us["end_time"].append(e)
        us["collection_id"].append(c)
        us["instance_index"].append(i)
        us["machine_id"].append(m)
        us["alloc_collection_id"].append(draw(st.sampled_from([0, 0, 0, None, 2**33 + 1])))
        ugly = draw(st.integers(0, 9)) == 0  # one row in ten gets an ugly value somewhere
        us["avg_cpu"].append(
            draw(st.sampled_from([None, 0.0]) if ugly and draw(st.booleans()) else st.floats(0.0009765625, 1, width=32))
        )
        us["cpi"].append(
            draw(st.sampled_from([None, 0.0, 250.0]) if ugly and draw(st.booleans()) else st.floats(0.25, 5, width=32))
        )
        us["mai"].append(
            draw(st.sampled_from([None, 2.0]) if ugly and draw(st.booleans()) else st.floats(0, 0.0625, width=32))
        )
    return {
        "machine_events": table("machine_events", me),
        "instance_events": table("instance_events", ev),
        "instance_usage": table("instance_usage", us),
    }


def cpi_cell():
    return st.one_of(dense_cpi_cell(), shared_cell_with_cpi())


def _partial(a, t, ctx, backend):
    cols = {c: backend.asarray(column_to_numpy(t.column(c))) for c in a.columns}
    return to_host(a.partial(cols, ctx, backend))


VARIANTS = [Cpi(by=b) for b in BY] + [
    Cpi(by="machine", spearman="exact"),
    Cpi(by="tier", spearman="none"),
    Cpi(by="collection", regression="pooled", spearman_bins=4),
    Cpi(by="machine", regression="none", spearman="none"),
    Cpi(by="platform", regression="none", spearman="exact"),
    Cpi(by="cell", regression="none", spearman_bins=4),
]


@settings(max_examples=examples(40), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(tables=cpi_cell(), data=st.data())
def test_merge_laws_with_cpi(tables, data):
    from gpuclust.backends import get_backend

    be = get_backend("cpu")
    a = data.draw(st.sampled_from(VARIANTS))
    ctx = context_of(a, TableSource(tables))
    t = tables["instance_usage"]
    n = t.num_rows
    whole = _partial(a, t, ctx, be)
    full = a.finalize(whole, ctx)
    e = to_host(a.empty(be))
    _assert_results(a.finalize(a.kinds.merge(e, whole), ctx), full, 1e-9)
    c1, c2 = sorted(data.draw(st.lists(st.integers(0, n), min_size=2, max_size=2)))
    p = [_partial(a, t.slice(lo, hi - lo), ctx, be) for lo, hi in ((0, c1), (c1, c2), (c2, n))]
    for m in (a.kinds.merge(a.kinds.merge(p[0], p[1]), p[2]), a.kinds.merge(p[2], a.kinds.merge(p[1], p[0]))):
        _assert_results(a.finalize(m, ctx), full, 1e-9)
    acc = e
    for k in range(n):
        acc = a.kinds.merge(acc, _partial(a, t.slice(k, 1), ctx, be))
    _assert_results(a.finalize(acc, ctx), full, 1e-9)
    f = full["filter"]
    if len(f):
        fs = f.set_index("reason")["windows"]
        assert fs[["missing", "cpu_seconds", "cpi_range", "mai_range", "kept"]].sum() == n


def test_primary_fit_option():
    tables = _tiny_cell(4, n=600, equal_weights=False)
    for choice in ("pooled", "per-platform", "platform-fixed-effects"):
        reg = engine.run(tables, Cpi(regression=choice))["cpi"]["regression"]
        assert set(reg["fit"]) == {"pooled", "per-platform", "platform-fixed-effects"}
        assert (reg["primary"] == (reg["fit"] == choice)).all()
        assert reg[reg["primary"]]["b_util"].notna().all()


_MOMENTS = ["n", "cpu_seconds", "cpi_mean", "cpi_std", "mai_mean", "mai_std", "pearson_r"]


@pytest.mark.parametrize("by", ["machine", "platform", "collection", "tier", "cell"])
def test_regression_none_is_the_sql_subset(synth_ds, monkeypatch, by):
    """``regression="none"``: groups identical to the default run's moments and Pearson r (and
    Spearman for the same method), regression and binned tables empty with the right columns, no
    first pass at all unless the Spearman grid needs its cuts."""
    from gpuclust.analyses import _machine_cells

    full = {sp: engine.run(synth_ds, Cpi(by=by, spearman=sp), partitions=2)["cpi"] for sp in ("exact", "grid")}
    calls = []
    orig = _machine_cells.CpiHistograms.partial
    monkeypatch.setattr(
        _machine_cells.CpiHistograms, "partial", lambda self, *a, **k: calls.append(self.name) or orig(self, *a, **k)
    )
    for sp in ("none", "exact", "grid"):
        calls.clear()
        a = Cpi(by=by, regression="none", spearman=sp)
        r = engine.run(synth_ds, a, partitions=2)["cpi"]
        ref = full["grid" if sp == "grid" else "exact"]
        key = r["groups"].columns[0]
        cols = [key, *_MOMENTS] + (["spearman_rho", "spearman_bound"] if sp != "none" else [])
        pd.testing.assert_frame_equal(r["groups"][cols], ref["groups"][cols], check_exact=True)
        if sp == "none":
            assert r["groups"]["spearman_rho"].isna().all()
        for t in ("regression", "binned"):
            assert len(r[t]) == 0 and list(r[t].columns) == list(ref[t].columns)
        assert (r["filter"]["stage"] == "filter").all()
        pd.testing.assert_frame_equal(r["filter"], ref["filter"][ref["filter"]["stage"] == "filter"])
        info = r["info"].iloc[0]
        assert info["machine_cells"] == 0 and info["windows_regression_used"] == 0
        assert info["windows_kept"] == ref["info"].iloc[0]["windows_kept"]
        # the first pass runs only for the grid's cut points
        assert bool(calls) == (sp == "grid")
        assert "regression not computed" in a.summary(r)
        assert "alloc_collection_id" not in a.columns
        assert ("machine_id" in a.columns) == (by in ("machine", "platform", "tier"))


def test_fine_bins_and_grid_lookup_equal_searchsorted():
    """The log-guess fine binning is the binary search exactly (bin edges, neighbours of edges,
    float32-cast values, 0, negatives, NaN, infinities), and the fine-bin -> grid-bin table gives
    the grid partial the searchsorted bins."""
    from gpuclust.analyses._machine_cells import grid_cuts, hist_edges
    from gpuclust.analyses.cpi.binning import spearman_grid_partial
    from gpuclust.backends import get_backend
    from gpuclust.partials import log_bins

    rng = np.random.default_rng(11)
    for var, hi in (("cpi", 100.0), ("mai", 1.0), ("cpi", 3.0), ("mai", 1e-9)):
        e = hist_edges(var, hi)
        v = np.concatenate(
            [
                np.exp(rng.normal(np.log(e[len(e) // 3]), 4, 20_000)),
                e,
                np.nextafter(e, 0),
                np.nextafter(e, np.inf),
                [0.0, -0.0, -1.0, np.nan, np.inf, -np.inf, 1e-300, 1e300],
            ]
        )
        with np.errstate(over="ignore"):
            for x in (v, v.astype(np.float32).astype(np.float64)):
                np.testing.assert_array_equal(log_bins(np, e, x), np.searchsorted(e, x, side="right"))
    e = hist_edges("cpi", 100.0)
    y = np.exp(rng.normal(0.5, 0.4, 5000))
    z = np.exp(rng.normal(0.0, 0.4, 5000))
    counts = np.bincount(log_bins(np, e, y), minlength=len(e) + 1)
    cuts = grid_cuts(counts, e, 8)
    lut = np.concatenate([[0], np.searchsorted(cuts, e, side="right")])
    np.testing.assert_array_equal(lut[log_bins(np, e, y)], np.searchsorted(cuts, y, side="right"))
    be = get_backend("cpu")
    g = rng.integers(0, 3, 5000)
    w = rng.uniform(0.1, 2.0, 5000)
    w[::50] = np.nan
    zc = np.quantile(z, [0.25, 0.5, 0.75])
    ref = spearman_grid_partial(be, y, z, g, 3, cuts, zc, w)
    got = spearman_grid_partial(
        be, y, z, g, 3, cuts, zc, w, (lut[log_bins(np, e, y)], np.searchsorted(zc, z, side="right"))
    )
    np.testing.assert_array_equal(got, ref)


def test_empty_and_options():
    r = engine.run({}, Cpi())["cpi"]
    assert all(len(df) == 0 for k, df in r.items() if k != "info")
    r = engine.run({}, Cpi(regression="none", spearman="none"))["cpi"]
    assert all(len(df) == 0 for k, df in r.items() if k != "info")
    assert create("cpi", by="machine", regression="pooled") == Cpi(by="machine", regression="pooled")
    assert Cpi(by="tier", cpi_max=20.0).label == "cpi[by=tier,cpi_max=20.0]"
    for bad in (
        {"by": "rack"},
        {"regression": "ols"},
        {"spearman": "fast"},
        {"spearman_bins": 1},
        {"cpi_min": 5.0, "cpi_max": 1.0},
        {"tier_map": "nope"},
    ):
        with pytest.raises(ValueError):
            Cpi(**bad)


def test_platform_as_of_window():
    """A machine whose platform changes: each window takes the platform of the last event at or
    before its start (the first platform before the machine's first event)."""
    me = table(
        "machine_events",
        {
            "time": [0, 5 * HOUR, 0],
            "machine_id": [1, 1, 2],
            "type": [1, 3, 1],
            "cap_cpu": [0.5, 0.5, 0.5],
            "cap_mem": [0.5, 0.5, 0.5],
            "platform_id": ["old", "new", "old"],
        },
    )
    st_ = np.array([HOUR, 6 * HOUR, 5 * HOUR, 7 * HOUR])
    us = table(
        "instance_usage",
        {
            "start_time": st_,
            "end_time": st_ + 300_000_000,
            "collection_id": [1, 1, 2, 2],
            "instance_index": [0, 0, 0, 0],
            "machine_id": [1, 1, 2, 99],
            "alloc_collection_id": [0, 0, 0, 0],
            "avg_cpu": [0.1, 0.2, 0.3, 0.4],
            "cpi": [1.0, 2.0, 3.0, 4.0],
            "mai": [0.01, 0.01, 0.01, 0.01],
        },
    )
    r = engine.run({"machine_events": me, "instance_usage": us}, Cpi(by="platform"))["cpi"]
    g = r["groups"].dropna(subset=["platform_id"]).set_index("platform_id")
    assert g.loc["new", "n"] == 1 and g.loc["old", "n"] == 2
    assert g.loc["new", "cpi_mean"] == 2.0
    assert r["info"]["windows_no_capacity"][0] == 1  # machine 99 is not in machine_events
    assert pd.isna(r["groups"]["platform_id"].iloc[-1])  # ... and has no platform


def test_report_files(synth_ds, tmp_path):
    analyze(synth_ds, ["cpi"], out=tmp_path)
    text = (tmp_path / "summary.txt").read_text()
    assert "platform-fixed-effects" in text and "per extra task" in text
    assert (tmp_path / "cpi" / "cpi.png").stat().st_size > 10_000
    for t in ("groups", "regression", "binned", "filter", "info"):
        assert (tmp_path / "cpi" / f"{t}.parquet").exists()


# ----------------------------------------------------------------------------- GPU parity


def test_backend_parity(backend, synth_ds, synth_result):
    for a, ref in ((Cpi(by="platform"), synth_result), (Cpi(by="machine", spearman="exact"), None)):
        got = engine.run(synth_ds, a, backend=backend, partitions=3)["cpi"]
        ref = ref if ref is not None else engine.run(synth_ds, a, backend="cpu", partitions=3)["cpi"]
        _assert_results(got, ref, 1e-9)


def test_tier_groups_sum_to_cell(synth_ds):
    r = engine.run(synth_ds, Cpi(by="tier", spearman="none"))["cpi"]
    c = engine.run(synth_ds, Cpi(by="cell", spearman="none"))["cpi"]
    g = r["groups"]
    assert set(g["tier"]) <= {"free", "beb", "mid", "prod", "unknown"}
    assert g["n"].sum() == c["groups"]["n"].iloc[0]
    np.testing.assert_allclose(g["cpu_seconds"].sum(), c["groups"]["cpu_seconds"].iloc[0], rtol=1e-12)


# ----------------------------------------------------------------------------- device traffic


def _cpi_cell(path, machines: int):
    """A random cell of ``machines`` machines whose windows have CPI and MAI (most pass the filter)."""
    from strategies import random_cell, write_dataset

    tables = random_cell(29, n_machines=machines, n_instances=10 * machines, n_windows=60 * machines)
    us = tables["instance_usage"]
    rng = np.random.default_rng(machines)
    for name, values in (("cpi", rng.uniform(0.5, 4.0, us.num_rows)), ("mai", rng.uniform(0.0, 0.05, us.num_rows))):
        us = us.set_column(us.schema.get_field_index(name), name, pa.array(values, pa.float32()))
    return Dataset(write_dataset(path, {**tables, "instance_usage": us}))


def test_a_gpu_run_brings_back_results_not_grids(tmp_path, monkeypatch):
    """issue 34: a gpu run of cpi by machine (its Spearman grid: 32 x 32 doubles a machine) reduces
    the grids on the device (tables.grid_spearman), so what leaves the device grows with the result
    tables as the machines do, not by 8 KiB a machine; the results are the cpu backend's."""
    from device_backend import DEVICE, counting_device_work, mark_partials_gpu, resolve_gpu_to_device, result_bytes

    import gpuclust

    resolve_gpu_to_device(monkeypatch)
    mark_partials_gpu(monkeypatch)  # finalized on the device-shaped backend, as a gpu run on the device
    a = Cpi(by="machine")
    got = []
    for machines in (25, 100):
        ds = _cpi_cell(tmp_path / f"cell{machines}", machines)
        study = gpuclust.open(ds, backend=DEVICE, workers=1)
        study.run(a)  # cold: loads the columns, stages the contexts
        with counting_device_work() as w:
            res = study.run(a)["cpi"]
        study.close()
        _assert_results(res, engine.run(ds, a, backend="cpu")["cpi"], 0.0)
        got.append((int(w["d2h_bytes"]), result_bytes(res), len(res["groups"])))
    (d2h_small, res_small, groups_small), (d2h_large, res_large, groups_large) = got
    assert groups_large >= 3 * groups_small  # the machines grew
    # the extra machines' rows leave the device, their grids (8 KiB a machine) do not
    assert d2h_large - d2h_small <= 1.2 * max(0, res_large - res_small) + 4096, got
    assert d2h_large <= 1.2 * res_large + (16 << 10), got
