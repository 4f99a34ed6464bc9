"""``peak-prediction`` against a slow pure-Python simulator written from the specification
(tests/references/peak_prediction.py), planted truths (constant usage: known predictions, no
violation; a planted spike: a known violation), and the CLI, the Python API, the layouts and
the schedulers it runs on."""

from __future__ import annotations

from collections import defaultdict

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from references import peak_prediction as ref
from strategies import assert_results_same, examples, table, write_dataset

from gpuclust.analyses import _peak_sim
from gpuclust.analyses import peak_prediction as pp_mod
from gpuclust.analyses._peak_sim import percentile_rows
from gpuclust.analyses.peak_prediction import PeakPrediction
from gpuclust.dataset import Dataset
from gpuclust.engine import TableSource, run
from gpuclust.tables import as_pandas

S = 1_000_000
STEP = 300 * S
#: Small histories and horizon, so that a small cell exercises warm-up, forgetting and the oracle.
SMALL = dict(
    min_samples=3,
    n_sigma_history=4,
    instance_history=5,
    machine_history=3,
    horizon_s=1800,
    instance_percentile=90.0,
    machine_percentile=80.0,
    n_sigma=2.0,
)


def cell(seed: int, n_machines: int = 3, n_inst: int = 14, n_steps: int = 40) -> dict:
    """Instances running in stretches of steps on machines (sometimes moving, sometimes with a gap),
    several windows per step for some, limits changing over time, NULL metrics, alloc rows,
    filtered priorities and scheduling classes, events without requests."""
    rng = np.random.default_rng(seed)
    mids = [int(x) for x in rng.choice([5, 77, 2**40 + 3, 2**53 + 1], n_machines, replace=False)]
    me = table(
        "machine_events",
        {
            "time": [0] * n_machines,
            "machine_id": mids,
            "type": [1] * n_machines,
            "cap_cpu": [1.0] * n_machines,
            "cap_mem": [1.0] * n_machines,
        },
    )
    ev, us = defaultdict(list), defaultdict(list)
    for k in range(n_inst):
        c, i = int(rng.choice([3, 2**40 + 1, 2**62 + 9])), int(k)  # index 0 kept (Google's query drops it)
        m = mids[rng.integers(len(mids))]
        t0 = int(rng.integers(0, n_steps - 2))
        t1 = int(rng.integers(t0 + 1, n_steps + 1))
        # events: a request at or before the start, sometimes a change later, sometimes a zero / NULL one
        for te, rc, rm in [
            (t0 * STEP - int(rng.integers(0, 2)) * STEP, rng.uniform(0.1, 0.5), rng.uniform(0.1, 0.5)),
            ((t0 + t1) // 2 * STEP, rng.choice([0.0, rng.uniform(0.1, 0.5)]), rng.uniform(0.1, 0.5)),
            (int(rng.integers(t0, t1 + 1)) * STEP, None, rng.uniform(0.1, 0.5)),
        ]:
            if rng.random() < 0.15:
                continue
            ev["time"].append(max(int(te), 0))
            ev["type"].append(3)
            ev["collection_id"].append(c)
            ev["instance_index"].append(i)
            ev["machine_id"].append(m)
            ev["req_cpu"].append(None if rc is None else float(np.float32(rc)))
            ev["req_mem"].append(float(np.float32(rm)))
            ev["priority"].append(None if rng.random() < 0.05 else int(rng.choice([0, 100, 200, 400, 450])))
            ev["scheduling_class"].append(None if rng.random() < 0.05 else int(rng.choice([0, 1, 2, 3, 3, 2])))
        gap = int(rng.integers(t0, t1)) if rng.random() < 0.3 else -1
        move = int(rng.integers(t0, t1)) if rng.random() < 0.2 else -1
        for t in range(t0, t1):
            if t == gap:
                continue
            mm = mids[(mids.index(m) + 1) % len(mids)] if move >= 0 and t >= move else m
            for _ in range(int(rng.choice([1, 1, 1, 2]))):
                s = t * STEP + int(rng.integers(0, 300)) * S
                us["start_time"].append(s)
                us["end_time"].append(s + 300 * S)
                us["collection_id"].append(c)
                us["instance_index"].append(i)
                us["machine_id"].append(mm)
                us["alloc_collection_id"].append(None if rng.random() < 0.5 else (0 if rng.random() < 0.95 else 9))
                base = rng.uniform(0, 0.6)
                for col in ("avg_cpu", "max_cpu", "cpu_p90", "cpu_p50", "avg_mem", "max_mem"):
                    us[col].append(None if rng.random() < 0.03 else float(np.float32(base * rng.uniform(0.5, 1.5))))
    # a window on a machine absent from machine_events
    us_extra = {
        "start_time": 0,
        "end_time": STEP,
        "collection_id": 3,
        "instance_index": 0,
        "machine_id": 999,
        "alloc_collection_id": None,
        "avg_cpu": 0.1,
        "max_cpu": 0.1,
        "cpu_p90": 0.1,
        "cpu_p50": 0.1,
        "avg_mem": 0.1,
        "max_mem": 0.1,
    }
    for k, v in us_extra.items():
        us[k].append(v)
    return {
        "machine_events": me,
        "instance_events": table("instance_events", dict(ev)),
        "instance_usage": table("instance_usage", dict(us)),
    }


def last_step(tables: dict) -> int:
    return max(tables["instance_usage"].column("start_time").to_pylist()) // STEP


def check(res: dict, tables: dict, opts: dict) -> None:
    keep_all = not opts.get("apply_ranges", True)
    rows, stats = ref.samples(
        tables,
        opts.get("metric", "cpu_p90"),
        None if keep_all else opts.get("priority_range", (0, 400)),
        None if keep_all else opts.get("scheduling_class_range", (2, 3)),
    )
    info = res["info"].iloc[0]
    for k, v in stats.items():
        assert info[k] == v, k
    want = ref.simulate(rows, last_step(tables), **opts)
    got = res["machine"].sort_values(["machine_id", "bucket"]).reset_index(drop=True)
    assert len(got) == len(want)
    assert got["machine_id"].tolist() == [r["machine_id"] for r in want]
    assert got["bucket"].tolist() == [r["bucket"] for r in want]
    assert (got["bucket_start_us"] == got["bucket"] * STEP).all()
    assert got["instances"].tolist() == [r["instances"] for r in want]
    for c in ("limit", "total_usage", "oracle", *pp_mod.PREDICTORS):
        w = np.array([np.nan if r[c] is None else r[c] for r in want], dtype=np.float64)
        np.testing.assert_allclose(got[c].to_numpy(), w, rtol=1e-9, atol=1e-12, equal_nan=True, err_msg=c)
    m = ref.metrics(want)
    summ = res["summary"].set_index("predictor")
    assert list(summ.index) == (list(ref.PREDICTORS) if want else [])
    for p, g in m.items():
        if not want:
            break
        r = summ.loc[p]
        assert (r.machine_steps, r.violations) == (g["machine_steps"], g["violations"]), p
        sev = g["severities"]
        for col, val in (
            ("violation_rate", g["violation_rate"]),
            ("savings", g["savings"]),
            ("mean_savings", g["mean_savings"]),
            ("severity_mean", sum(sev) / len(sev) if sev else None),
            ("severity_p99", float(np.quantile(sev, 0.99)) if sev else None),
            ("severity_max", max(sev) if sev else None),
            ("machine_rate_p90", float(np.quantile(g["machine_rates"], 0.9)) if g["machine_rates"] else None),
        ):
            if val is None:
                assert np.isnan(r[col]), (p, col)
            else:
                assert r[col] == pytest.approx(val, rel=1e-9, abs=1e-12), (p, col)


@settings(max_examples=examples(20), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 10**6), variant=st.sampled_from(["small", "small-uncapped", "small-p", "avg_mem"]))
def test_matches_the_reference(seed, variant):
    tables = cell(seed)
    opts = dict(SMALL)
    if variant == "small-uncapped":
        opts.update(cap_to_limit=False, combine=("borg_default", "machine_percentile"))
    elif variant == "small-p":
        opts.update(oracle_percentile=95.0, min_samples=0, apply_ranges=False)
    elif variant == "avg_mem":
        opts.update(metric="avg_mem", scheduling_class_range=(0, 3))
    a = PeakPrediction(**opts)
    check(run(TableSource(tables), a)["peak-prediction"], tables, opts)


def test_defaults_on_a_long_cell():
    """The paper's defaults (24 samples, 24 / 120 history, 24 h horizon) on two days of samples."""
    tables = cell(7, n_machines=2, n_inst=6, n_steps=600)
    res = run(TableSource(tables), PeakPrediction(scheduling_class_range=(0, 3)))["peak-prediction"]
    check(res, tables, {"scheduling_class_range": (0, 3)})
    assert res["machine"]["oracle"].notna().sum() > 100


def test_chunked_oracle_and_percentiles(monkeypatch):
    """Small working matrices: the oracle walks its snapshots in many chunks and the per-instance
    percentile its rows in many blocks (the defaults' 288-step horizon over 2 x 600 snapshots):
    the same table as the reference."""
    monkeypatch.setattr(_peak_sim, "CHUNK_CELLS", {"cpu": 2048, "gpu": 2048})
    tables = cell(7, n_machines=2, n_inst=6, n_steps=600)
    res = run(TableSource(tables), PeakPrediction(scheduling_class_range=(0, 3)))["peak-prediction"]
    check(res, tables, {"scheduling_class_range": (0, 3)})


@pytest.mark.gpu
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_gpu_simulation_matches_the_reference(gpu_backend, seed, monkeypatch):
    """The simulation on the device (the partials are computed there, so the finalize runs there):
    the reference's table, as on the cpu; with small working matrices as well (chunk walks)."""
    tables = cell(seed, n_machines=3, n_inst=20, n_steps=120)
    for opts in (dict(SMALL), {**SMALL, "oracle_percentile": 95.0, "cap_to_limit": False}):
        check(run(TableSource(tables), PeakPrediction(**opts), backend=gpu_backend)["peak-prediction"], tables, opts)
    monkeypatch.setattr(_peak_sim, "CHUNK_CELLS", {"cpu": 2048, "gpu": 2048})
    long = cell(7, n_machines=2, n_inst=6, n_steps=600)
    res = run(TableSource(long), PeakPrediction(scheduling_class_range=(0, 3)), backend=gpu_backend)
    check(res["peak-prediction"], long, {"scheduling_class_range": (0, 3)})


def test_simulate_on_the_device_shaped_backend():
    """``simulate`` written for either array module: on the device-shaped backend (NumPy arrays
    that refuse what CuPy and its arrays refuse: tests/device_backend.py) the same bits as on the
    cpu."""
    from device_backend import DEVICE
    from generic_backend import CPU

    rng = np.random.default_rng(8)
    n = 20_000
    args = (
        rng.integers(0, 5, n),
        rng.integers(0, 400, n),
        rng.integers(0, 60, n) * 31,
        rng.gamma(1.0, 0.1, n),
        rng.choice([0.2, 0.5, 1.0], n),
    )
    for prm in (
        _peak_sim.SimParams(horizon_steps=100, min_samples=5),
        _peak_sim.SimParams(horizon_steps=50, oracle_percentile=90.0, cap_to_limit=False),
    ):
        want = _peak_sim.simulate(CPU, *args, 1 << 10, 390, prm)
        got = _peak_sim.simulate(DEVICE, *(DEVICE.asarray(x) for x in args), 1 << 10, 390, prm)
        assert set(got) == set(want)
        for k, w in want.items():
            np.testing.assert_array_equal(DEVICE.to_host(got[k]), w, err_msg=k)
        assert np.isfinite(want["oracle"]).sum() > 1000


@pytest.mark.parametrize("oracle_percentile", [100.0, 95.0])
def test_device_work_per_chunk_is_a_few_launches_and_no_sync(monkeypatch, oracle_percentile):
    """The oracle walks chunks of snapshots and the per-instance percentile blocks of warm rows,
    each a bounded working matrix (``CHUNK_CELLS``).  On the device-shaped backend under the gpu's
    name (every launch and host sync counted: tests/device_backend.py), from one chunk and one
    block to many (small matrices forced: 25 chunks, 140 blocks) the syncs stay the same and the
    launches grow by at most 12 a chunk or block (a walk of per-step operations takes ~35 and a
    sync for the chunk's bounds), and the results are the same bits; as on the cpu, to rounding."""
    from device_backend import DEVICE_GPU, counting_device_work
    from generic_backend import CPU

    n_m, n_i, n_t, E, H, ms = 3, 8, 400, 48, 30, 6
    rng = np.random.default_rng(3)
    m, st_, i = (x.ravel() for x in np.meshgrid(np.arange(n_m), np.arange(n_t), np.arange(n_i), indexing="ij"))
    rep = rng.random(m.shape[0]) < 0.1  # a second window for some (machine, step, instance)
    m, st_, i = (np.concatenate([x, x[rep]]) for x in (m, st_, i))
    usage = rng.gamma(2.0, 0.1, m.shape[0])
    lim = np.where(st_ > (i * 37) % n_t, 0.5, 0.8)  # each instance's limit changes once
    args = (m, st_, i * 7919 + 1, usage, lim)
    prm = _peak_sim.SimParams(horizon_steps=E, min_samples=ms, instance_history=H, oracle_percentile=oracle_percentile)
    # every instance runs on its machine at every step: n_m x n_t snapshots, warm from step ms - 1
    n_snap, n_warm = n_m * n_t, n_m * n_i * (n_t - ms + 1)
    work, out = {}, {}
    for cells in (1 << 20, 2048):
        monkeypatch.setattr(_peak_sim, "CHUNK_CELLS", {"cpu": cells, "gpu": cells})
        dev = [DEVICE_GPU.asarray(x) for x in args]
        with counting_device_work() as w:
            got = _peak_sim.simulate(DEVICE_GPU, *dev, 1 << 10, n_t - 1, prm)
        chunks = -(-n_snap // max(E, cells // (E + 2))) + -(-n_warm // max(1, cells // H))
        work[cells] = (w["ops"] + w["kernels"], w["syncs"], chunks)
        out[cells] = {k: DEVICE_GPU.to_host(v) for k, v in got.items()}
    (one, sync_one, n_one), (many, sync_many, n_many) = work[1 << 20], work[2048]
    assert (n_one, n_many) == (2, 165)
    # the same syncs in 2 and 165 chunks: the bounds' read, and the selections sized by the data
    # (flatnonzero: CuPy reads their sizes; 42 today) outside the chunk loops, none in them
    assert sync_many == sync_one <= 48, (sync_one, sync_many)
    assert many - one <= 12 * (n_many - n_one), (one, many)
    want = _peak_sim.simulate(CPU, *args, 1 << 10, n_t - 1, prm)
    assert np.isfinite(want["oracle"]).sum() > 1000 and (want["instance_percentile"] < want["limit"]).any()
    for k, w_ in want.items():
        np.testing.assert_array_equal(out[2048][k], out[1 << 20][k], err_msg=k)
        np.testing.assert_allclose(out[2048][k], w_, rtol=1e-12, atol=1e-12, equal_nan=True, err_msg=k)


@pytest.mark.gpu
def test_gpu_simulate_agrees_with_the_cpu(gpu_backend):
    """``simulate`` on both backends over the same 200k random samples (repeats, gaps, moves,
    limit changes): the same snapshots, the same values to rounding (the device adds in another
    order)."""
    from gpuclust.backends import get_backend

    rng = np.random.default_rng(9)
    n, span = 200_000, 1 << 12
    code = rng.integers(0, 40, n)
    step = rng.integers(0, 600, n)
    inst = rng.integers(0, 300, n) * 7919
    usage = rng.gamma(1.0, 0.1, n)
    lim = rng.choice([0.2, 0.5, 1.0], n)
    prm = _peak_sim.SimParams(horizon_steps=288, min_samples=24, oracle_percentile=99.0)
    cpu = get_backend("cpu")
    want = _peak_sim.simulate(cpu, code, step, inst, usage, lim, span, 590, prm)
    got = _peak_sim.simulate(
        gpu_backend, *(gpu_backend.asarray(a) for a in (code, step, inst, usage, lim)), span, 590, prm
    )
    assert set(got) == set(want)
    for k, w in want.items():
        g = gpu_backend.to_host(got[k])
        if w.dtype.kind in "iu":
            np.testing.assert_array_equal(g, w, err_msg=k)
        else:
            np.testing.assert_allclose(g, w, rtol=1e-9, atol=1e-12, equal_nan=True, err_msg=k)


def test_shards_and_partitions(monkeypatch):
    """Many shards (a machine whole in each), many partitions: the same result."""
    tables = cell(11, n_machines=4, n_inst=30)
    a = PeakPrediction(**SMALL)
    one = run(TableSource(tables), a)
    monkeypatch.setattr(pp_mod, "SHARD_ROWS", 7)
    many = run(TableSource(tables), a, partitions=5)
    assert_results_same(one, many)
    check(many["peak-prediction"], tables, SMALL)


def _planted(usages: dict, limits: dict, n_steps: int) -> dict:
    """One machine; instance k runs over steps [0, n_steps) with usage usages[k](t) and limit limits[k]."""
    ev, us = defaultdict(list), defaultdict(list)
    for k, lim in limits.items():
        for col, v in (
            ("time", 0),
            ("type", 3),
            ("collection_id", 1),
            ("instance_index", k),
            ("machine_id", 5),
            ("req_cpu", lim),
            ("req_mem", 1.0),
            ("priority", 200),
            ("scheduling_class", 2),
        ):
            ev[col].append(v)
        for t in range(n_steps):
            u = usages[k](t)
            for col, v in (
                ("start_time", t * STEP),
                ("end_time", (t + 1) * STEP),
                ("collection_id", 1),
                ("instance_index", k),
                ("machine_id", 5),
                ("cpu_p90", u),
            ):
                us[col].append(v)
    me = table("machine_events", {"time": [0], "machine_id": [5], "type": [1]})
    return {
        "machine_events": me,
        "instance_events": table("instance_events", dict(ev)),
        "instance_usage": table("instance_usage", dict(us)),
    }


def test_planted_constant_usage():
    """Constant usage 0.25 and 0.125 of limits 0.5 and 0.25 (ratio 0.5 each): once warm every
    stateful predictor predicts 0.375 (half the limits), before it the limits 0.75; the oracle is
    0.375; borg-default 0.675; no violation anywhere; savings known."""
    tables = _planted({0: lambda t: 0.25, 1: lambda t: 0.125}, {0: 0.5, 1: 0.25}, 40)
    res = run(TableSource(tables), PeakPrediction(**SMALL))["peak-prediction"]
    m = res["machine"]
    assert len(m) == 40 and (m["limit"] == 0.75).all() and (m["total_usage"] == 0.375).all()
    warm = m["bucket"] >= 2  # min_samples 3: the third sample (step 2) is the first warm one
    for c in ("n_sigma", "instance_percentile", "machine_percentile", "max_of", "avg_of"):
        np.testing.assert_allclose(m.loc[warm, c], 0.375, rtol=1e-12)
        np.testing.assert_allclose(m.loc[~warm, c], 0.75, rtol=1e-12)
    np.testing.assert_allclose(m["borg_default"], 0.675, rtol=1e-12)
    has = m["oracle"].notna()
    assert has.sum() == 40 - 6 and (m.loc[has, "bucket"] <= 39 - 6).all()  # the last 6 steps are censored
    np.testing.assert_allclose(m.loc[has, "oracle"], 0.375, rtol=1e-12)
    s = res["summary"].set_index("predictor")
    assert (s["violations"] == 0).all() and (s["machine_steps"] == 34).all()
    # n-sigma: 2 cold steps at the full limit, 32 warm at half of it
    assert s.loc["n_sigma", "savings"] == pytest.approx((32 * 0.375) / (34 * 0.75))
    assert s.loc["borg_default", "savings"] == pytest.approx(0.1)
    assert s.loc["oracle", "savings"] == pytest.approx(0.5)


def test_planted_spike():
    """Usage 0.1 of limit 1.0 except 0.9 at step 30: with a 1800 s horizon the oracle is 0.9 at
    steps 24..29 and 0.1 elsewhere; n-sigma (0.1 x 1.0 once warm, zero spread) violates at those
    six steps, by 0.8 of the limit each; borg-default (0.9) never does."""
    tables = _planted({0: lambda t: 0.9 if t == 30 else 0.1}, {0: 1.0}, 50)
    res = run(TableSource(tables), PeakPrediction(**SMALL))["peak-prediction"]
    m = res["machine"].set_index("bucket")
    np.testing.assert_allclose(m.loc[24:29, "oracle"], 0.9)
    np.testing.assert_allclose(m.loc[[10, 23, 30, 31, 43], "oracle"], 0.1)
    assert m.loc[44:, "oracle"].isna().all()
    np.testing.assert_allclose(m.loc[3:29, "n_sigma"], 0.1, rtol=1e-6)
    s = res["summary"].set_index("predictor")
    assert s.loc["n_sigma", "violations"] == 6
    assert s.loc["n_sigma", "severity_mean"] == pytest.approx(0.8)
    assert s.loc["n_sigma", "violation_rate"] == pytest.approx(6 / 44)
    assert s.loc["borg_default", "violations"] == 0


def test_percentile_rows_is_numpy_percentile():
    rng = np.random.default_rng(3)
    for p in (0.0, 10.0, 50.0, 90.0, 99.0, 100.0, 37.5):
        mat = np.round(rng.random((50, 9)), 1)  # ties: equal order statistics
        n = rng.integers(1, 10, 50)
        m2 = np.where(np.arange(9)[None, :] < n[:, None], mat, np.inf)
        m2.sort(axis=1)
        got = percentile_rows(np, m2, n, p)
        want = [np.percentile(mat[r, : n[r]], p) for r in range(50)]
        np.testing.assert_allclose(got, want, rtol=1e-14)
        # the walks' form of it: the order statistics' positions first, the interpolation after
        take, big, coef = _peak_sim._order_stats(np, n, p)
        ab = m2[np.arange(50)[:, None], take]
        np.testing.assert_array_equal(_peak_sim._interpolate(np, ab, big, coef), got)


def test_options_checked():
    for bad in (
        dict(metric="cpu_p95x"),
        dict(horizon_s=10),
        dict(priority_range=(3, 1)),
        dict(combine=("x",)),
        dict(instance_percentile=101.0),
        dict(n_sigma_history=0),
    ):
        with pytest.raises(ValueError):
            PeakPrediction(**bad)


@pytest.fixture(scope="module")
def ds(tmp_path_factory):
    return write_dataset(tmp_path_factory.mktemp("pp_ds"), cell(5, n_machines=3, n_inst=20), files=3)


def test_layouts_schedulers_and_cli(ds, tmp_path):
    """Flat and instance-bucketed datasets, the thread pool and a dask scheduler, the CLI: one result."""
    from gpuclust.cli import main
    from gpuclust.optimize import optimize

    a = PeakPrediction(**SMALL)
    base = run(Dataset(ds), a, partitions=1)
    check(
        base["peak-prediction"],
        {t: Dataset(ds).read(t) for t in ("machine_events", "instance_events", "instance_usage")},
        SMALL,
    )
    assert_results_same(base, run(Dataset(ds), a, partitions=4, workers=2))
    assert_results_same(base, run(Dataset(ds), a, partitions=3, scheduler="threads"))
    bucketed = tmp_path / "bucketed"
    optimize(ds, out=bucketed, buckets=4)
    assert_results_same(base, run(Dataset(bucketed), a, partitions=4))
    assert_results_same(base, run(Dataset(bucketed), a, partitions=3, scheduler="sync"))
    assert_results_same(base, run(Dataset(bucketed), a, partitions=3, workers=2, scheduler="local:2"))
    out = tmp_path / "cli"
    opts = [x for k, v in SMALL.items() for x in ("-O", f"{k}={v}")]
    assert main(["analyze", str(ds), "peak-prediction", *opts, "--out", str(out), "--quiet"]) == 0
    got = as_pandas(pq.read_table(out / "peak-prediction" / "summary.parquet"))  # (written from Arrow)
    pd.testing.assert_frame_equal(got, base["peak-prediction"]["summary"], check_exact=False, rtol=1e-12)
    assert any(out.rglob("*.svg")) or any(out.rglob("*.png"))


def test_merge_laws_with_requests():
    """The conformance checks' merge laws on a cell whose windows do join to requests (the generic
    hypothesis cells carry none): identity, associativity, commutativity, any cut."""
    from gpuclust.analyses.base import to_host
    from gpuclust.backends import get_backend
    from gpuclust.engine.local import context_of
    from gpuclust.engine.partition import column_to_numpy

    def partial_of(a, t, ctx, be):
        return to_host(a.partial({c: be.asarray(column_to_numpy(t.column(c))) for c in a.columns}, ctx, be))

    be = get_backend("cpu")
    tables = cell(23, n_machines=3, n_inst=25)
    a = PeakPrediction(**SMALL)
    ctx = context_of(a, TableSource(tables))
    t = tables["instance_usage"]
    full = a.finalize(partial_of(a, t, ctx, be), ctx)
    assert len(full["machine"]) > 30 and as_pandas(full["summary"])["violations"].sum() > 0
    e = a.empty(be)
    n = t.num_rows
    for c1, c2 in ((0, n), (n // 3, 2 * n // 3), (1, n - 1), (17, 18)):
        p1, p2, p3 = (partial_of(a, t.slice(lo, hi - lo), ctx, be) for lo, hi in ((0, c1), (c1, c2), (c2, n)))
        for p in (
            a.kinds.merge(a.kinds.merge(p1, p2), p3),
            a.kinds.merge(p1, a.kinds.merge(p2, p3)),
            a.kinds.merge(p3, a.kinds.merge(e, a.kinds.merge(p2, p1))),
        ):
            assert_results_same({"r": a.finalize(p, ctx)}, {"r": full})


@pytest.mark.parametrize("on_disk", [False, True])
def test_auto_metric_takes_max_cpu_where_the_usage_has_no_cpu_p90(on_disk, tmp_path):
    """The 2011 trace has no CPU percentiles: ``metric="auto"`` (the default) then scores the
    window's maximum CPU rate, as ``metric="max_cpu"`` does, and says so; where cpu_p90 has a
    value it is the paper's cpu_p90 (Parquet statistics decide on disk, the column in memory)."""
    tables = cell(5)
    us = tables["instance_usage"]
    v2 = {
        **tables,
        "instance_usage": us.set_column(
            us.schema.get_field_index("cpu_p90"), "cpu_p90", pa.nulls(us.num_rows, us.schema.field("cpu_p90").type)
        ),
    }
    opts = {**SMALL, "scheduling_class_range": (0, 3)}

    def source(t, name):
        return Dataset(write_dataset(tmp_path / name, t, files=2, row_group_size=50)) if on_disk else TableSource(t)

    got = run(source(v2, "v2"), PeakPrediction(**opts))["peak-prediction"]
    info = got["info"].iloc[0]
    assert (info["metric"], info["metric_option"]) == ("max_cpu", "auto")
    check(got, v2, {**opts, "metric": "max_cpu"})
    assert "auto: the usage has no cpu_p90" in PeakPrediction(**opts).summary(got)
    got = run(source(tables, "v3"), PeakPrediction(**opts))["peak-prediction"]
    assert got["info"].iloc[0]["metric"] == "cpu_p90"
    check(got, tables, opts)
