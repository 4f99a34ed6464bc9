"""``usage-change`` against a slow pure-Python computation (tests/usage_change_reference.py), a
hand-worked instance, and the layouts it may and may not run on."""

from __future__ import annotations

import bisect
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from strategies import assert_results_same, cell, random_cell, table, write_dataset
from usage_change_reference import THRESHOLDS, describe, pairs, tiers_of

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
        ref["n_pairs"], ref["instances"], ref["gaps"], ref["unplaced"])
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
            d["pairs"], d["unknown"], d["zero_to_zero"], d["zero_to_positive"], d["defined"]), key
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


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(tables=cell(max_windows=60), gap=st.sampled_from([0, 300, 10**6]))
def test_matches_the_reference(tables, gap):
    res = run(TableSource(tables), UsageChange(tier_map="notebook", max_gap_s=gap))["usage-change"]
    check(res, tables, gap)


@pytest.mark.parametrize("seed", [1, 2])
def test_random_cells(seed):
    tables = random_cell(seed, n_windows=4000)
    res = run(TableSource(tables), UsageChange(tier_map="notebook", max_gap_s=3600))["usage-change"]
    check(res, tables, 3600)


def test_a_worked_instance():
    """Windows of one instance, 5 minutes each, CPU 1.0 -> 1.1 -> 0.0 -> 0.0 -> 0.5 (then a gap) -> 0.5:
    changes +10% and -100%; a zero-to-zero and a zero-to-positive pair; the gap breaks the last pair."""
    w = 300_000_000
    starts = [0, w, 2 * w, 3 * w, 4 * w, 6 * w]
    cpu = [1.0, 1.1, 0.0, 0.0, 0.5, 0.5]
    t = {"instance_usage": table("instance_usage", {
            "start_time": starts, "end_time": [s + w for s in starts], "collection_id": [9] * 6,
            "instance_index": [0] * 6, "machine_id": [5] * 6, "avg_cpu": cpu, "avg_mem": [0.25] * 6}),
         "instance_events": table("instance_events", {"time": [0], "type": [0], "collection_id": [9],
                                                      "instance_index": [0], "machine_id": [5], "priority": [200]})}
    res = run(TableSource(t), UsageChange(tier_map="notebook"))["usage-change"]
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
    a = UsageChange(max_gap_s=7200)
    r_flat = run(Dataset(flat), a, partitions="auto")["usage-change"]
    check(r_flat, tables, 7200)
    r = subprocess.run([sys.executable, "-m", "gpuclust.cli", "optimize", str(flat), "--out", str(tmp_path / "opt"),
                        "--buckets", "8"], capture_output=True, text=True)
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

    syn = synthesize(SynthConfig(machines=40, hours=2, seed=4, usage_window_sigma=0.2, machine_cell_load_sigma=0.1,
                                 max_machine_utilisation=float("inf")), tmp_path / "raw", dataset=tmp_path / "ds",
                     progress=None)
    p = syn.truth["planted"]["usage_change"]
    assert p["sigma_log_change_without_sampling"] == pytest.approx(np.sqrt(2 * (0.2**2 + 0.1**2)))
    res = run(Dataset(tmp_path / "ds"), UsageChange(tier_map="notebook"), partitions="auto")["usage-change"]
    s = res["summary"]
    s = s[s["resource"] == "cpu"].set_index("tier")
    for tier in ("free", "beb", "mid", "prod", "all"):
        n = int(s.loc[tier, "defined"])
        assert n >= 1000, (tier, n)
        for h in (5, 10, 20, 50):
            want = p[f"share_within_{h}pct"]
            got = s.loc[tier, f"within_{h}pct"]
            assert abs(got - want) <= 0.015 + 3 * np.sqrt(want * (1 - want) / n), (tier, h, got, want)
