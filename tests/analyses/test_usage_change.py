"""``usage-change`` against independent references, one per level: DuckDB SQL (cluster), a slow
pure-Python replay (machine, instance: tests/references/usage_change.py); hand-worked cases, and
the layouts it may and may not run on."""

from __future__ import annotations

import bisect
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from references.usage_change import THRESHOLDS, describe, pairs, period_pairs, period_usage, tiers_of
from strategies import assert_results_same, cell, examples, random_cell, table, write_dataset

from gpuclust.analyses.usage_change import RATIO_EDGES, UsageChange
from gpuclust.dataset import Dataset
from gpuclust.engine import TableSource, run
from gpuclust.schema import tier_map

EDGES = [float(x) for x in RATIO_EDGES]
LO = [0.0, *EDGES]


def check(res: dict, tables: dict, max_gap_s: int = 0, tm_name: str = "notebook") -> None:
    tm = tier_map(tm_name)
    tiers = tiers_of(tables["instance_events"].to_pylist(), tm.bounds, tm.names)
    ref = pairs(tables["instance_usage"].to_pylist(), tiers, max_gap_s * 1_000_000)
    info = res["info"].iloc[0]
    assert (info["pairs"], info["instances"], info["gaps"], info["unplaced_ends"]) == (
        ref["n_pairs"],
        ref["instances"],
        ref["gaps"],
        ref["unplaced"],
    )
    groups = dict(ref["pairs"])
    for res_name in ("cpu", "mem"):  # the "all" rows: every tier's pairs
        every = [ab for (t, r), v in ref["pairs"].items() if r == res_name for ab in v]
        if every:
            groups[("all", res_name)] = every
    got = {(r.tier, r.resource): r for r in res["summary"].itertuples()}
    assert set(got) == set(groups)
    hist = {(r.tier, r.resource, r.bin): r.pairs for r in res["hist"].itertuples()}
    want_hist = {}
    for key, ab in groups.items():
        d = describe(ab, EDGES)
        r = got[key]
        assert (r.pairs, r.unknown, r.zero_to_zero, r.zero_to_positive, r.defined) == (
            d["pairs"],
            d["unknown"],
            d["zero_to_zero"],
            d["zero_to_positive"],
            d["defined"],
        ), key
        for h in THRESHOLDS:
            v = getattr(r, f"within_{round(h * 100)}pct")
            assert (np.isnan(v) and not d["defined"]) or v == d["within"][h] / d["defined"], (key, h)
        for b, n in d["bins"].items():
            want_hist[(*key, b)] = n
        if not d["defined"]:
            assert np.isnan(r.mean_change) and np.isnan(r.p50_change)
            continue
        assert r.mean_change == pytest.approx(sum(d["changes"]) / d["defined"], rel=1e-9, abs=1e-12)
        for q in (1, 10, 50, 90, 99):  # the bin of the exact (inverted-CDF) quantile of the ratios b / a
            exact = float(np.quantile(np.array(d["ratios"]), q / 100, method="inverted_cdf"))
            j = bisect.bisect_right(EDGES, exact)
            assert getattr(r, f"p{q}_change") == max(LO[j] - 1.0, -1.0), (key, q, exact)
    assert hist == want_hist


@settings(max_examples=examples(40), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(tables=cell(max_windows=60), gap=st.sampled_from([0, 300, 10**6]))
def test_matches_the_reference(tables, gap):
    res = run(TableSource(tables), UsageChange(level="instance", tier_map="notebook", max_gap_s=gap))["usage-change"]
    check(res, tables, gap)


@pytest.mark.parametrize("seed", [1, 2])
def test_random_cells(seed):
    tables = random_cell(seed, n_windows=4000)
    res = run(TableSource(tables), UsageChange(level="instance", tier_map="notebook", max_gap_s=3600))["usage-change"]
    check(res, tables, 3600)


def test_a_worked_instance():
    """Windows of one instance, 5 minutes each, CPU 1.0 -> 1.1 -> 0.0 -> 0.0 -> 0.5 (then a gap) -> 0.5:
    changes +10% and -100%; a zero-to-zero and a zero-to-positive pair; the gap breaks the last pair."""
    w = 300_000_000
    starts = [0, w, 2 * w, 3 * w, 4 * w, 6 * w]
    cpu = [1.0, 1.1, 0.0, 0.0, 0.5, 0.5]
    t = {
        "instance_usage": table(
            "instance_usage",
            {
                "start_time": starts,
                "end_time": [s + w for s in starts],
                "collection_id": [9] * 6,
                "instance_index": [0] * 6,
                "machine_id": [5] * 6,
                "avg_cpu": cpu,
                "avg_mem": [0.25] * 6,
            },
        ),
        "instance_events": table(
            "instance_events",
            {
                "time": [0],
                "type": [0],
                "collection_id": [9],
                "instance_index": [0],
                "machine_id": [5],
                "priority": [200],
            },
        ),
    }
    res = run(TableSource(t), UsageChange(level="instance", tier_map="notebook"))["usage-change"]
    s = res["summary"].set_index(["tier", "resource"])
    cpu_row = s.loc[("prod", "cpu")]
    assert (cpu_row["pairs"], cpu_row["zero_to_zero"], cpu_row["zero_to_positive"], cpu_row["defined"]) == (4, 1, 1, 2)
    assert cpu_row["within_20pct"] == 0.5 and cpu_row["within_5pct"] == 0.0
    assert cpu_row["mean_change"] == pytest.approx((1.1 / 1.0 - 1 + -1.0) / 2, rel=1e-6)
    assert s.loc[("prod", "mem"), "within_5pct"] == 1.0
    assert res["info"].iloc[0]["gaps"] == 1


def test_bucketed_equals_flat_and_a_flat_table_is_never_cut(tmp_path):
    tables = random_cell(5, n_windows=6000)
    flat = write_dataset(tmp_path / "flat", tables, files=3, row_group_size=700)
    a = UsageChange(level="instance", max_gap_s=7200)
    r_flat = run(Dataset(flat), a, partitions="auto")["usage-change"]
    check(r_flat, tables, 7200)
    r = subprocess.run(
        [sys.executable, "-m", "gpuclust.cli", "optimize", str(flat), "--out", str(tmp_path / "opt"), "--buckets", "8"],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0, r.stderr
    for parts, scheduler in ((3, None), ("auto", None), (3, "threads")):
        r_opt = run(Dataset(tmp_path / "opt"), a, partitions=parts, workers=2, scheduler=scheduler)["usage-change"]
        assert_results_same({"usage-change": r_opt}, {"usage-change": r_flat}, rtol=1e-12)
    # asked for 4 partitions, a flat table is still one for a whole-instance analysis
    r4 = run(Dataset(flat), a, partitions=4)["usage-change"]
    assert all(r4[k].equals(r_flat[k]) for k in r_flat)


def test_planted_usage_change_of_a_synthetic_cell(tmp_path):
    """`gpuclust synth` plants how an instance's CPU usage changes between consecutive 5-minute
    windows: independent lognormal window factors (``usage_window_sigma``) and machine-cell factors
    (``machine_cell_load_sigma``), so log(b / a) ~ N(0, 2 (sw^2 + smc^2)) plus the sampling noise of a
    300-sample mean; synth_truth.json planted.usage_change has the shares within 5/10/20/50% in
    closed form.  usage-change recovers them, per tier and over all, within 0.015 + 3 binomial
    standard errors (the pairs are not independent: windows of one instance share its burstiness,
    pairs on one machine-cell its factor; partial windows have fewer samples).  Machine throttling
    is off (it flattens the busiest machine-cells).  Seed 4, 40 machines x 2 h, sw 0.2, smc 0.1:
    within 20% planted 0.475, all 0.473 (23,397 pairs), free 0.501, beb 0.454, mid 0.472."""
    from gpuclust.synth import SynthConfig, synthesize

    syn = synthesize(
        SynthConfig(
            machines=40,
            hours=2,
            seed=4,
            usage_window_sigma=0.2,
            machine_cell_load_sigma=0.1,
            max_machine_utilisation=float("inf"),
        ),
        tmp_path / "raw",
        dataset=tmp_path / "ds",
        progress=None,
    )
    p = syn.truth["planted"]["usage_change"]
    assert p["sigma_log_change_without_sampling"] == pytest.approx(np.sqrt(2 * (0.2**2 + 0.1**2)))
    res = run(Dataset(tmp_path / "ds"), UsageChange(level="instance", tier_map="notebook"), partitions="auto")[
        "usage-change"
    ]
    s = res["summary"]
    s = s[s["resource"] == "cpu"].set_index("tier")
    for tier in ("free", "beb", "mid", "prod", "all"):
        n = int(s.loc[tier, "defined"])
        assert n >= 1000, (tier, n)
        for h in (5, 10, 20, 50):
            want = p[f"share_within_{h}pct"]
            got = s.loc[tier, f"within_{h}pct"]
            assert abs(got - want) <= 0.015 + 3 * np.sqrt(want * (1 - want) / n), (tier, h, got, want)


# ------------------------------------------------------------------ cluster and machine levels
P = 300_000_000  # the sampling period, µs


def check_periods(res: dict, ab: dict[str, list], periods: int, n_pairs: int, gaps: int) -> None:
    """The cluster or machine level's tables against the pairs ``(a, b)`` of a reference, per
    resource: every count, exact share, ratio bin and quantile bin; the info counters."""
    info = res["info"].iloc[0]
    assert (info["periods"], info["pairs"], info["gaps"]) == (periods, n_pairs, gaps)
    got = {(r.tier, r.resource): r for r in res["summary"].itertuples()}
    assert set(got) == {("all", k) for k, v in ab.items() if v}
    hist = {(r.resource, r.bin): r.pairs for r in res["hist"].itertuples()}
    want_hist = {}
    for name, pairs_ in ab.items():
        if not pairs_:
            continue
        d = describe(pairs_, EDGES)
        r = got[("all", name)]
        assert (r.pairs, r.unknown, r.zero_to_zero, r.zero_to_positive, r.defined) == (
            d["pairs"],
            d["unknown"],
            d["zero_to_zero"],
            d["zero_to_positive"],
            d["defined"],
        ), name
        for h in THRESHOLDS:
            v = getattr(r, f"within_{round(h * 100)}pct")
            assert (np.isnan(v) and not d["defined"]) or v == d["within"][h] / d["defined"], (name, h)
        want_hist.update({(name, b): n for b, n in d["bins"].items()})
        if d["defined"]:
            assert r.mean_change == pytest.approx(sum(d["changes"]) / d["defined"], rel=1e-9, abs=1e-12)
            for q in (1, 10, 50, 90, 99):
                exact = float(np.quantile(np.array(d["ratios"]), q / 100, method="inverted_cdf"))
                assert getattr(r, f"p{q}_change") == max(LO[bisect.bisect_right(EDGES, exact)] - 1.0, -1.0)
    assert hist == want_hist


def cluster_pairs_sql(tables: dict) -> dict:
    """The cluster level in DuckDB, from docs/analyses/usage-change.md: each top-level window's
    usage spread over the 300 s periods it overlaps, summed per period, consecutive periods paired
    by LEAD."""
    import duckdb

    con = duckdb.connect()
    con.register("u", tables["instance_usage"])
    periods = f"""
        WITH w AS (SELECT start_time AS s, end_time AS e, avg_cpu, avg_mem FROM u
                   WHERE (alloc_collection_id IS NULL OR alloc_collection_id = 0)
                     AND start_time >= 0 AND end_time > start_time AND end_time < 9223372036854775807),
        pieces AS (SELECT *, unnest(range(s // {P}, (e - 1) // {P} + 1)) AS k FROM w),
        p AS (SELECT k, SUM(avg_cpu * ((LEAST(e, (k + 1) * {P}) - GREATEST(s, k * {P})) / {P}.0)) AS cpu,
                        SUM(avg_mem * ((LEAST(e, (k + 1) * {P}) - GREATEST(s, k * {P})) / {P}.0)) AS mem
              FROM pieces GROUP BY k)"""
    rows = con.execute(
        periods
        + """
        , q AS (SELECT k, cpu, mem, LEAD(k) OVER (ORDER BY k) AS k2, LEAD(cpu) OVER (ORDER BY k) AS cpu2,
                       LEAD(mem) OVER (ORDER BY k) AS mem2 FROM p)
        SELECT cpu, cpu2, mem, mem2 FROM q WHERE k2 = k + 1 ORDER BY k"""
    ).fetchall()
    n = con.execute(periods + " SELECT count(*) FROM p").fetchone()[0]
    return {
        "pairs": {"cpu": [(r[0], r[1]) for r in rows], "mem": [(r[2], r[3]) for r in rows]},
        "periods": n,
        "n_pairs": len(rows),
        "gaps": max(n - 1 - len(rows), 0),
    }


@pytest.mark.parametrize("seed", [1, 2])
def test_cluster_level_matches_duckdb(seed):
    tables = random_cell(seed, n_windows=3000)
    res = run(TableSource(tables), UsageChange())["usage-change"]  # level=cluster: the default
    ref = cluster_pairs_sql(tables)
    check_periods(res, ref["pairs"], ref["periods"], ref["n_pairs"], ref["gaps"])
    assert res["info"].iloc[0]["level"] == "cluster" and set(res["summary"]["tier"]) == {"all"}


@settings(max_examples=examples(30), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(tables=cell(max_windows=40), level=st.sampled_from(["cluster", "machine"]))
def test_cluster_and_machine_levels_match_the_replay(tables, level):
    """Hypothesis cells (NULL and zero usage, after-trace ends, NULL machines): the window-by-window
    replay of tests/references/usage_change.py, same float sums (one partition: the same order)."""
    machines = None if level == "cluster" else set(tables["machine_events"].column("machine_id").to_pylist())
    ref = period_pairs(period_usage(tables["instance_usage"].to_pylist(), machines))
    res = run(TableSource(tables), UsageChange(level=level))["usage-change"]
    check_periods(res, ref["pairs"], ref["periods"], ref["n_pairs"], ref["gaps"])
    if level == "machine":
        assert res["info"].iloc[0]["machines"] == ref["machines"]


@pytest.mark.parametrize("seed", [1, 3])
def test_machine_level_matches_the_replay(seed):
    tables = random_cell(seed, n_windows=3000)
    machines = set(tables["machine_events"].column("machine_id").to_pylist())
    ref = period_pairs(period_usage(tables["instance_usage"].to_pylist(), machines))
    res = run(TableSource(tables), UsageChange(level="machine"))["usage-change"]
    check_periods(res, ref["pairs"], ref["periods"], ref["n_pairs"], ref["gaps"])
    assert ref["n_pairs"] > 1000


def test_a_worked_cluster():
    """Periods of 300 s: window A [0, 600 s) CPU 1.0 counts 1.0 in periods 0 and 1; B [300, 450 s)
    CPU 0.375 adds 0.375 x 150 / 300 = 0.1875 to period 1; C [600, 900 s) CPU 1.25 is period 2; D,
    an alloc instance's task, is left out; E [1500, 1800 s) follows a period without usage (a gap).
    Cluster CPU: 1.0, 1.1875, 1.25, (gap), 0.5: changes +18.75% and +5.26% (values exact in
    float32, the column's type)."""
    s = [0, 300, 600, 0, 1500]
    e = [600, 450, 900, 900, 1800]
    t = {
        "instance_usage": table(
            "instance_usage",
            {
                "start_time": [x * 10**6 for x in s],
                "end_time": [x * 10**6 for x in e],
                "collection_id": [1, 2, 3, 4, 5],
                "instance_index": [0] * 5,
                "machine_id": [5, 6, 5, 5, 6],
                "alloc_collection_id": [None, 0, 0, 9, None],
                "avg_cpu": [1.0, 0.375, 1.25, 7.0, 0.5],
                "avg_mem": [0.5] * 5,
            },
        ),
        "machine_events": table(
            "machine_events",
            {"time": [0, 0], "machine_id": [5, 6], "type": [0, 0], "cap_cpu": [1.0, 1.0], "cap_mem": [1.0, 1.0]},
        ),
    }
    res = run(TableSource(t), UsageChange())["usage-change"]
    s_ = res["summary"].set_index("resource")
    assert (s_.loc["cpu", "pairs"], s_.loc["cpu", "defined"]) == (2, 2)
    assert (s_.loc["cpu", "within_5pct"], s_.loc["cpu", "within_10pct"], s_.loc["cpu", "within_20pct"]) == (0, 0.5, 1)
    assert s_.loc["cpu", "mean_change"] == pytest.approx((0.1875 + 1.25 / 1.1875 - 1) / 2)
    assert s_.loc["mem", "within_5pct"] == 0.0  # 0.5, 0.75 (A + half of B), 0.5: -33%, +50%
    info = res["info"].iloc[0]
    assert (info["periods"], info["pairs"], info["gaps"], info["alloc_rows"]) == (4, 2, 1, 1)
    # machine 5: 1.0 (A), 1.0 (A), 1.25 (C): 0% and +25%; machine 6: B in period 1, E after a gap
    m = run(TableSource(t), UsageChange(level="machine"))["usage-change"]
    row = m["summary"].set_index("resource").loc["cpu"]
    assert (row["pairs"], row["within_5pct"], row["within_50pct"]) == (2, 0.5, 1.0)
    assert (m["info"].iloc[0]["machines"], m["info"].iloc[0]["gaps"]) == (2, 1)


def test_partitions_and_shards_give_the_same_tables(tmp_path, monkeypatch):
    """Cluster and machine levels over 3 files and 3 partitions (sums merged across partitions),
    and the machine level's keyed sums spilled and reduced by 5 shards of machines, equal the
    one-partition run (float sums in another order: rtol)."""
    from gpuclust.analyses import machine_utilization

    tables = random_cell(4, n_windows=4000)
    flat = write_dataset(tmp_path / "flat", tables, files=3, row_group_size=500)
    for level in ("cluster", "machine"):
        one = run(TableSource(tables), UsageChange(level=level))
        many = run(Dataset(flat), UsageChange(level=level), partitions=3)
        assert_results_same(many, one, rtol=1e-9)
    monkeypatch.setattr(machine_utilization, "DENSE_CELLS", 0)  # spill, then shards
    span = int(max(tables["instance_usage"].column("end_time").to_pylist()) // P + 1)
    monkeypatch.setattr(machine_utilization, "SHARD_CELLS", span * 8)  # 8 of the 40 machines a shard
    sharded = run(Dataset(flat), UsageChange(level="machine"), partitions=3)
    assert_results_same(sharded, run(TableSource(tables), UsageChange(level="machine")), rtol=1e-9)


def test_cluster_sums_of_different_spans_merge_padded():
    """The cluster level's per-period sums: the empty partial spans no period, and partials of
    different spans merge as if the shorter one were padded with zeros."""
    kinds = UsageChange().kinds
    short = {"sums": np.arange(10.0).reshape(5, 2), "stats": np.arange(5)}
    long = {"sums": np.ones((5, 3)), "stats": np.ones(5, np.int64)}
    want = np.ones((5, 3))
    want[:, :2] += short["sums"]
    for x, y in ((short, long), (long, short)):
        m = kinds.merge(x, y)
        assert np.array_equal(m["sums"], want) and m["stats"].tolist() == [1, 2, 3, 4, 5]
    m = kinds.merge(UsageChange().empty(), short)
    assert np.array_equal(m["sums"], short["sums"]) and m["stats"].tolist() == [0, 1, 2, 3, 4]


def test_level_option_and_tables():
    assert UsageChange().label == "usage-change" and UsageChange().level == "cluster"
    assert UsageChange(level="machine").label == "usage-change[level=machine]"
    with pytest.raises(ValueError, match="level"):
        UsageChange(level="job")
    assert UsageChange().needed_tables()[0] == {"instance_usage": ""}
    assert set(UsageChange(level="machine").needed_tables()[0]) == {"instance_usage", "machine_events"}
    assert set(UsageChange(level="instance").needed_tables()[0]) == {"instance_usage", "instance_events"}
    assert UsageChange(level="instance").whole_instances and not UsageChange().whole_instances


@pytest.mark.parametrize("level", ["cluster", "machine", "instance"])
def test_every_level_on_the_device_shaped_backend(level, monkeypatch):
    """The partial on the device-shaped backend (tests/device_backend.py: arrays that refuse host
    operands and implicit conversion, as CuPy's do) gives the cpu's tables at every level (the
    conformance suite runs the first two choices of each option: cluster and machine)."""
    from device_backend import DEVICE, resolve_gpu_to_device

    from gpuclust.analyses.base import to_host
    from gpuclust.backends import get_backend
    from gpuclust.engine.local import context_of
    from gpuclust.engine.partition import column_to_numpy

    resolve_gpu_to_device(monkeypatch)
    tables = random_cell(6, n_windows=2000)
    a = UsageChange(level=level, tier_map="notebook")
    ctx = context_of(a, TableSource(tables))
    t = tables[a.table]
    got, want = (
        {
            k: v
            for k, v in a.finalize(
                to_host(a.partial({c: be.asarray(column_to_numpy(t.column(c))) for c in a.columns}, ctx, be)), ctx
            ).items()
        }
        for be in (DEVICE, get_backend("cpu"))
    )
    assert_results_same(
        {"u": {k: v.to_pandas() for k, v in got.items()}},
        {"u": {k: v.to_pandas() for k, v in want.items()}},
        rtol=1e-12,
    )
    assert got["summary"].num_rows >= 2
