"""The ``overcommit`` analysis against independent references.

* a slow Python replay (``overcommit_reference.replay``) for capacity, requests and instance
  counts, on hand-written and hypothesis-generated cells with the ugly cases;
* DuckDB SQL (``generate_series`` over buckets) for the usage part;
* partition invariance (1 / 2 / 7 partitions, random cut points) to 1e-9 relative;
* recovery of the overcommit planted by ``gpuclust.synth``; the real 2011 trace (skipped when
  absent); GPU parity (marked ``gpu``).
"""

from __future__ import annotations

import math
import pickle
from pathlib import Path

import by_path
import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from strategies import BIG_IDS, cell, examples, random_cell, table, write_dataset

from gpuclust.analyses import create
from gpuclust.analyses.base import to_host
from gpuclust.analyses.overcommit import Overcommit
from gpuclust.engine import TableSource, run
from gpuclust.engine.local import context_of
from gpuclust.engine.partition import column_to_numpy
from gpuclust.schema import SCHEMAS, TIER_MAPS
from gpuclust.tables import as_pandas

_ref = by_path.load("gpuclust_overcommit_reference", Path(__file__).with_name("overcommit_reference.py"))
replay, usage_sql, figure_reference = _ref.replay, _ref.usage_sql, _ref.figure_reference
_cells = by_path.load("gpuclust_planted_cells", Path(__file__).with_name("planted_cells.py"))
S = 1_000_000
T0 = 600 * S
MAXT = 2**63 - 1
NB = TIER_MAPS["notebook"]


# ------------------------------------------------------------------------------------ helpers
def _run(tables, a: Overcommit, **kw):
    return run(TableSource(tables, tier_map="notebook"), [a], **kw)["overcommit"]


def check_against_reference(tables, res, a: Overcommit, tm=NB):
    """Every machine-bucket value against the slow replay (intervals) and DuckDB (usage)."""
    duckdb = pytest.importorskip("duckdb")
    ref = replay(
        tables, bucket_s=a.bucket_s, names=tm.names, bounds=tm.bounds, start=a.window_start_us, end=a.window_end_us
    )
    start, end, width = a.window_start_us, ref["end"], a.bucket_s * S
    con = duckdb.connect()
    con.register("usage", tables["instance_usage"])
    con.register("events", tables["instance_events"])
    udf = usage_sql(
        con, bucket_s=a.bucket_s, names=tm.names, bounds=tm.bounds, start=start, end=end, machines=ref["machines"]
    )
    info = res["info"].iloc[0]
    assert info["window_end_us"] == end and info["buckets"] == ref["n_buckets"]
    # the running pieces in no machine row: not placed (machine 0 / NULL) and on dedicated machines
    assert info["pieces_unplaced"] == sum(p[1] in (0, None) for p in ref["pieces"])
    assert info["pieces_dedicated"] == sum(p[1] == -1 for p in ref["pieces"])
    tiers = [*tm.names, "unknown"]
    use = {}
    for r in udf.itertuples(index=False):
        use[(r.machine_id, r.tier, r.bucket)] = r
    m = res["machine"]
    rows = {(int(r["machine_id"]), int(r["bucket"])): r for r in m.to_dict("records")}
    # every reference machine-bucket with something in it is a row
    expect_keys = {k for k, v in ref["up"].items() if v > 0} | {k[:1] + k[2:] for k, v in ref["reqc"].items() if v}
    expect_keys |= {k for k, v in ref["inst"].items() if v > 0} | {(k[0], k[2]) for k in use}
    assert expect_keys <= set(rows), sorted(expect_keys - set(rows))[:5]

    def close(x, y, what):
        if isinstance(y, float) and math.isnan(y):
            assert isinstance(x, float) and math.isnan(x), (what, x, y)
        else:
            assert math.isclose(x, y, rel_tol=1e-9, abs_tol=1e-12), (what, x, y)

    # buckets are absolute (trace time 0 origin): every row's bucket is one the window meets
    assert {b for _, b in rows} <= set(ref["buckets"])
    # without any instance_usage row, usage was not measured: NaN (unknown), never 0
    measured = tables.get("instance_usage") is not None and tables["instance_usage"].num_rows > 0
    nan = float("nan")
    for (mid, b), r in rows.items():
        L = (min((b + 1) * width, end) - max(b * width, start)) / 1e6
        close(r["covered_s"], L, "covered_s")
        assert r["bucket_start_us"] == b * width
        close(r["up_s"], ref["up"].get((mid, b), 0.0), ("up", mid, b))
        for res_col, acc, unk in (("cap_cpu", "capc", "unkc"), ("cap_mem", "capm", "unkm")):
            unknown = mid not in ref["with_events"] or ref[unk].get((mid, b), 0.0) > 0
            close(r[res_col], float("nan") if unknown else ref[acc].get((mid, b), 0.0) / L, (res_col, mid, b))
        close(r["instances"], ref["inst"].get((mid, b), 0.0) / L, ("instances", mid, b))
        assert r["instances_distinct"] == len(ref["distinct"].get((mid, b), ())), (mid, b)
        tot = {"req_cpu": 0.0, "req_mem": 0.0, "use_cpu": 0.0, "use_mem": 0.0, "max_cpu_sum": 0.0, "max_mem_sum": 0.0}
        nwin = 0
        for t in tiers:
            u = use.get((mid, t, b))
            zero = 0.0 if measured else nan
            exp = {
                "req_cpu": ref["reqc"].get((mid, t, b), 0.0) / L,
                "req_mem": ref["reqm"].get((mid, t, b), 0.0) / L,
                "use_cpu": (u.use_cpu_s / L) if u else zero,
                "use_mem": (u.use_mem_s / L) if u else zero,
                "max_cpu_sum": u.max_cpu if u else zero,
                "max_mem_sum": u.max_mem if u else zero,
            }
            nwin += int(u.windows) if u else 0
            for k, v in exp.items():
                close(r[f"{k}_{t}"], v, (k, t, mid, b))
                tot[k] += v
        for k, v in tot.items():
            close(r[k], v, (k, mid, b))
        assert r["windows"] == nwin
        if not measured:
            for c in ("usage_ratio_cpu", "usage_ratio_mem", "peak_ratio_cpu", "peak_ratio_mem"):
                assert math.isnan(r[c]), (c, mid, b)
    check_figure_tables(res)
    return ref


def check_figure_tables(res) -> None:
    """The heatmap and the ratio histogram, summed by the finalize, against pandas over the
    written machine table (``figure_reference``)."""
    want = figure_reference(as_pandas(res["machine"]), as_pandas(res["info"]).iloc[0])
    heat, hist = as_pandas(res["heatmap"]), as_pandas(res["ratio_hist"])
    assert len(heat) == len(want["heatmap"])
    for c in want["heatmap"].columns:
        got, exp = heat[c].to_numpy(), want["heatmap"][c].to_numpy()
        if c == "alloc_ratio_cpu":
            np.testing.assert_allclose(got, exp.astype(float), rtol=1e-12, equal_nan=True)
        else:
            assert got.tolist() == exp.tolist(), c
    if len(heat):
        width = int(as_pandas(res["info"]).iloc[0]["bucket_s"]) * S
        assert (heat["bucket_start_us"] == heat["bucket"] * width).all()
        m = as_pandas(res["machine"])
        assert (
            heat.groupby("band")["machines"].first().sum() == m[np.isfinite(m["alloc_ratio_cpu"])].machine_id.nunique()
        )
    assert hist.to_dict("records") == want["ratio_hist"].to_dict("records")


# ------------------------------------------------------------------------------------ hand-written
def hand_cell():
    """Two machines, ugly lifecycles; every number below is worked out by hand in the asserts."""
    me = table(
        "machine_events",
        {
            "time": [0, 0, T0 + 200 * S, T0 + 400 * S, T0 + 100 * S, MAXT],
            "machine_id": [1, 2, 1, 1, 2, 2],
            "type": [1, 1, 2, 1, 3, 2],  # m1: ADD, REMOVE@200s, ADD@400s; m2: ADD(NULL mem), UPDATE@100s, REMOVE@MAXT
            "cap_cpu": [0.5, 1.0, 0.5, 0.25, 1.0, 1.0],
            "cap_mem": [0.5, None, 0.5, 0.25, 0.5, 0.5],
        },
    )
    ev = {
        k: []
        for k in (
            "time",
            "type",
            "collection_id",
            "instance_index",
            "machine_id",
            "priority",
            "alloc_collection_id",
            "req_cpu",
            "req_mem",
        )
    }

    def e(t, typ, c, i, m, p, cpu, mem, alloc=0):
        for k, v in zip(ev, (t, typ, c, i, m, p, alloc, cpu, mem), strict=True):
            ev[k].append(v)

    # A (c=10, i=0): running before the trace on m1 (SUBMIT+SCHEDULE at 0), UPDATE_RUNNING at 150 s
    # (cpu 0.1 -> 0.3), EVICT at 200 s (machine REMOVE), resubmitted and scheduled on m2 at 200 s,
    # runs past the end (no terminal).
    e(0, 0, 10, 0, 0, 200, 0.1, 0.1)
    e(0, 3, 10, 0, 1, 200, 0.1, 0.1)
    e(T0 + 150 * S, 10, 10, 0, 1, 200, 0.3, None)  # NULL mem carried forward (0.1)
    e(T0 + 200 * S, 4, 10, 0, 1, 200, 0.3, 0.1)
    e(T0 + 200 * S, 0, 10, 0, 0, 200, 0.3, 0.1)
    e(T0 + 200 * S, 3, 10, 0, 2, 200, 0.3, 0.1)
    # B (c=11, i=0): free tier task on m1 from 400 s to the "after the trace" sentinel FINISH
    e(T0 + 400 * S, 3, 11, 0, 1, 0, 0.2, 0.05)
    e(MAXT, 6, 11, 0, 1, 0, 0.2, 0.05)
    # C (c=12, i=0): a task inside an alloc (dropped) on m2
    e(T0 + 10 * S, 3, 12, 0, 2, 200, 0.7, 0.7, alloc=99)
    # D (c=13, i=1): terminal without SCHEDULE; E (c=14, i=0): SUBMIT only (never placed)
    e(T0 + 50 * S, 7, 13, 1, 2, 100, 0.4, 0.4)
    e(T0 + 50 * S, 0, 14, 0, 0, 100, 0.4, 0.4)
    # F (c=15, i=0): SCHEDULE on m2 at 500 s with NULL priority (tier unknown), KILL at 550 s;
    # then it ends the trace window: the latest finite time is 600 s (G's usage window)
    e(T0 + 500 * S, 3, 15, 0, 2, None, 0.05, 0.05)
    e(T0 + 550 * S, 7, 15, 0, 2, None, 0.05, 0.05)
    us = table(
        "instance_usage",
        {
            "start_time": [T0 - 100 * S, T0 + 250 * S, T0 + 250 * S, T0 + 420 * S],
            "end_time": [T0 + 200 * S, T0 + 550 * S, T0 + 550 * S, MAXT],
            "collection_id": [10, 10, 12, 11],
            "instance_index": [0, 0, 0, 0],
            "machine_id": [1, 2, 2, 1],
            "alloc_collection_id": [0, 0, 99, 0],
            "avg_cpu": [0.05, 0.2, 0.5, 0.1],
            "avg_mem": [0.1, 0.1, 0.5, 0.1],
            "max_cpu": [0.1, 0.4, 0.9, 0.2],
            "max_mem": [0.2, 0.2, 0.9, 0.2],
        },
    )
    return {"machine_events": me, "instance_events": table("instance_events", ev), "instance_usage": us}


def test_hand_written_case():
    tables = hand_cell()
    a = Overcommit(bucket_s=300)
    res = _run(tables, a)
    check_against_reference(tables, res, a)
    info = res["info"].iloc[0]
    assert info["window_end_us"] == T0 + 550 * S  # the largest finite time (usage end 550 s; MAXT ignored)
    assert info["buckets"] == 2 and info["alloc_event_rows"] == 1 and info["terminal_without_schedule"] == 1
    assert info["usage_alloc_rows"] == 1 and info["usage_unbounded"] == 1
    m = res["machine"].set_index(["machine_id", "bucket"])
    # buckets are numbered from trace time 0: [600 s, 900 s) is bucket 2, [900 s, 1200 s) bucket 3
    assert sorted(set(res["machine"]["bucket"])) == [2, 3]
    assert sorted(set(res["machine"]["bucket_start_us"])) == [600 * S, 900 * S]
    # m1 bucket 2 [600 s, 900 s): up 0-200 s (cap 0.5) -> cap mean 0.5*200/300
    r = m.loc[(1, 2)]
    assert r["up_s"] == pytest.approx(200) and r["cap_cpu"] == pytest.approx(0.5 * 200 / 300)
    # A on m1: 0.1 x 150 s + 0.3 x 50 s, prod tier
    assert r["req_cpu_prod"] == pytest.approx((0.1 * 150 + 0.3 * 50) / 300)
    assert r["req_mem_prod"] == pytest.approx(0.1 * 200 / 300)
    # usage window from 500 s before the window: only its 200 s inside count
    assert r["use_cpu_prod"] == pytest.approx(0.05 * 200 / 300) and r["max_cpu_sum_prod"] == pytest.approx(0.1)
    # m1 bucket 3 [900 s, 1150 s): re-ADDed at 1000 s with cap 0.25; B free from 1000 s to the end
    r = m.loc[(1, 3)]
    assert r["covered_s"] == pytest.approx(250) and r["up_s"] == pytest.approx(150)
    assert r["cap_cpu"] == pytest.approx(0.25 * 150 / 250)
    assert r["req_cpu_free"] == pytest.approx(0.2 * 150 / 250) and r["instances_distinct"] == 1
    assert r["alloc_ratio_cpu"] == pytest.approx((0.2 * 150 / 250) / (0.25 * 150 / 250))
    # m2: NULL memory capacity until the UPDATE at 100 s -> memory unknown in bucket 0, known in 1
    r0, r1 = m.loc[(2, 2)], m.loc[(2, 3)]
    assert np.isnan(r0["cap_mem"]) and r0["cap_unknown"] and r0["cap_cpu"] == pytest.approx(1.0)
    assert r1["cap_mem"] == pytest.approx(0.5) and not r1["cap_unknown"]
    # A on m2 from 200 s: 0.3 cpu; F (unknown tier) 500-550 s; the alloc task C adds nothing
    assert r0["req_cpu_prod"] == pytest.approx(0.3 * 100 / 300)
    assert r1["req_cpu_prod"] == pytest.approx(0.3) and r1["req_cpu_unknown"] == pytest.approx(0.05 * 50 / 250)
    assert r1["instances_distinct"] == 2 and r1["instances"] == pytest.approx(1 + 50 / 250)
    # usage of A on m2 [850 s, 1150 s): 50 s in bucket 0, 250 s in bucket 1; its maximum counted in both
    assert r0["use_cpu_prod"] == pytest.approx(0.2 * 50 / 300) and r1["use_cpu_prod"] == pytest.approx(0.2)
    assert r0["max_cpu_sum"] == pytest.approx(0.4) and r1["max_cpu_sum"] == pytest.approx(0.4)
    # cell: capacity-weighted ratio over machines with known capacity
    cell = res["cell"].set_index("bucket")
    assert cell.loc[2, "cap_cpu"] == pytest.approx(0.5 * 200 / 300 + 1.0)
    assert cell.loc[2, "alloc_ratio_cpu"] == pytest.approx(
        ((0.1 * 150 + 0.3 * 50) / 300 + 0.3 * 100 / 300) / (0.5 * 200 / 300 + 1.0)
    )
    assert np.isnan(cell.loc[2, "alloc_ratio_mem"]) or cell.loc[2, "machines_cap_unknown"] == 1


def test_window_options_and_bucket_width_invariance():
    tables = hand_cell()
    a = Overcommit(bucket_s=60, window_start_us=T0 + 30 * S, window_end_us=T0 + 1000 * S)
    res = _run(tables, a)
    check_against_reference(tables, res, a)
    # the window starts mid-bucket: bucket 10 = [600 s, 660 s) covers only 630-660 s of it
    first = res["cell"].iloc[0]
    assert first["bucket"] == 10 and first["bucket_start_us"] == 600 * S and first["covered_s"] == 30
    # integrals over the whole window do not depend on the bucket width
    b = _run(tables, Overcommit(bucket_s=7))
    c = _run(tables, Overcommit(bucket_s=300))
    for col in ("req_cpu", "req_mem", "use_cpu", "up_s"):
        w = "covered_s"
        vb = (b["machine"][col] * (b["machine"][w] if col != "up_s" else 1)).sum()
        vc = (c["machine"][col] * (c["machine"][w] if col != "up_s" else 1)).sum()
        assert vb == pytest.approx(vc, rel=1e-9)
    with pytest.raises(ValueError):
        Overcommit(bucket_s=0)
    with pytest.raises(ValueError):
        Overcommit(tier_map="nope")


def test_without_usage_is_unknown_not_zero():
    """Issue 7 (12): a dataset without instance_usage has no measured usage: every usage column of
    the machine and cell tables is NaN (not 0, not "0% usage"), the summary says unknown; the
    request side is unaffected."""
    tables = hand_cell()
    tables["instance_usage"] = SCHEMAS["instance_usage"].empty_table()
    a = Overcommit(bucket_s=300)
    res = _run(tables, a)
    check_against_reference(tables, res, a)
    for name in ("machine", "cell"):
        df = res[name]
        assert len(df)
        usage_cols = [
            c for c in df.columns if c.startswith(("use_", "max_cpu_sum", "max_mem_sum", "usage_ratio_", "peak_ratio_"))
        ]
        assert "use_cpu" in usage_cols and "usage_ratio_cpu" in usage_cols and "use_cpu_prod" in usage_cols
        for c in usage_cols:
            assert df[c].isna().all(), (name, c)
        assert (df["req_cpu"].notna()).all() and df["alloc_ratio_cpu"].notna().any()
    s = res["summary"].set_index(["metric", "resource", "tier"])["value"]
    assert np.isnan(s[("usage_ratio_mean", "cpu", "all")]) and np.isfinite(s[("alloc_ratio_mean", "cpu", "all")])
    text = a.summary(res)
    assert "by usage unknown" in text and "usage/capacity mean unknown" in text and "nan" not in text


def test_all_null_usage_values_are_unknown():
    """A machine-bucket whose overlapping windows all have NULL avg_cpu / max_cpu has unknown (NaN)
    CPU usage and peak there (a SUM over only NULLs), while its known memory usage stays; buckets
    without any window keep 0 (nothing ran)."""
    tables = hand_cell()
    us = tables["instance_usage"].to_pylist()
    for r in us:
        if r["machine_id"] == 2:
            r["avg_cpu"] = None
            r["max_cpu"] = None
    tables["instance_usage"] = table("instance_usage", {k: [r[k] for r in us] for k in us[0]})
    a = Overcommit(bucket_s=300)
    res = _run(tables, a)
    check_against_reference(tables, res, a)
    m = res["machine"].set_index(["machine_id", "bucket"])
    r = m.loc[(2, 3)]
    assert r["windows"] == 1 and np.isnan(r["use_cpu"]) and np.isnan(r["use_cpu_prod"])
    assert np.isnan(r["max_cpu_sum"]) and np.isnan(r["usage_ratio_cpu"])
    assert r["use_mem_prod"] == pytest.approx(0.1) and r["use_cpu_free"] == 0.0
    assert m.loc[(1, 2), "use_cpu_prod"] == pytest.approx(0.05 * 200 / 300)  # machine 1 unaffected
    assert np.isnan(res["cell"].set_index("bucket").loc[3, "use_cpu"])


def test_cell_capacity_unknown_when_no_machine_known():
    """A bucket whose present machines all have unknown capacity has an unknown (NaN) cell capacity,
    not 0."""
    tables = hand_cell()
    me = tables["machine_events"].to_pylist()
    for r in me:
        r["cap_cpu"] = None
    tables["machine_events"] = table("machine_events", {k: [r[k] for r in me] for k in me[0]})
    res = _run(tables, Overcommit(bucket_s=300))
    cell = res["cell"]
    assert (cell["machines"] > 0).all()
    assert cell["cap_cpu"].isna().all() and cell["alloc_ratio_cpu"].isna().all()
    assert cell["cap_mem"].notna().any()


# ------------------------------------------------------------------------------------ hypothesis
TIMES = st.one_of(
    st.sampled_from([0, T0, T0 + 100 * S, T0 + 300 * S, T0 + 301 * S, MAXT]), st.integers(0, T0 + 2000 * S)
)


@st.composite
def lifecycle_cell(draw):
    mids = draw(st.lists(st.sampled_from([1, 2, 2**53 + 1, BIG_IDS[-1]]), min_size=0, max_size=3, unique=True))
    me = {k: [] for k in ("time", "machine_id", "type", "cap_cpu", "cap_mem")}
    cap = st.one_of(st.none(), st.sampled_from([0.25, 0.5, 1.0, 0.0]))
    for m in mids:
        for k in range(draw(st.integers(1, 4))):
            me["time"].append(draw(TIMES))
            me["machine_id"].append(m)
            me["type"].append(1 if k == 0 and draw(st.booleans()) else draw(st.sampled_from([0, 1, 2, 3])))
            me["cap_cpu"].append(draw(cap))
            me["cap_mem"].append(draw(cap))
    place = st.sampled_from([*mids, 0, -1, 77]) if mids else st.sampled_from([0, -1, 77])
    ev = {
        k: []
        for k in (
            "time",
            "type",
            "collection_id",
            "instance_index",
            "machine_id",
            "priority",
            "alloc_collection_id",
            "req_cpu",
            "req_mem",
        )
    }
    inst = draw(
        st.lists(
            st.tuples(st.sampled_from([7, 2**40 + 1, 2**62 + 3]), st.integers(0, 2)),
            min_size=0,
            max_size=5,
            unique=True,
        )
    )
    for c, i in inst:
        for _ in range(draw(st.integers(1, 6))):
            ev["time"].append(draw(TIMES))
            ev["type"].append(draw(st.sampled_from([0, 3, 3, 3, 4, 5, 6, 7, 8, 9, 10, 10])))
            ev["collection_id"].append(c)
            ev["instance_index"].append(i)
            ev["machine_id"].append(draw(st.one_of(place, st.none())))
            ev["priority"].append(draw(st.one_of(st.none(), st.sampled_from([-1, 0, 100, 117, 120, 450]))))
            ev["alloc_collection_id"].append(draw(st.sampled_from([0, 0, 0, None, 2**40])))
            ev["req_cpu"].append(draw(st.one_of(st.none(), st.sampled_from([0.0, 0.1, 0.25, 0.5]))))
            ev["req_mem"].append(draw(st.one_of(st.none(), st.sampled_from([0.0, 0.05, 0.3]))))
    us = {
        k: []
        for k in (
            "start_time",
            "end_time",
            "collection_id",
            "instance_index",
            "machine_id",
            "alloc_collection_id",
            "avg_cpu",
            "avg_mem",
            "max_cpu",
            "max_mem",
        )
    }
    if inst:
        for _ in range(draw(st.integers(0, 8))):
            c, i = draw(st.sampled_from(inst))
            s0 = draw(TIMES)
            us["start_time"].append(s0)
            us["end_time"].append(draw(st.sampled_from([MAXT, s0, min(s0 + 300 * S, MAXT), min(s0 + 17 * S, MAXT)])))
            us["collection_id"].append(c)
            us["instance_index"].append(i)
            us["machine_id"].append(draw(place))
            us["alloc_collection_id"].append(draw(st.sampled_from([0, 0, None, 5])))
            for k in ("avg_cpu", "avg_mem", "max_cpu", "max_mem"):
                us[k].append(draw(st.one_of(st.none(), st.sampled_from([0.0, 0.125, 0.5]))))
    return {
        "machine_events": table("machine_events", me),
        "instance_events": table("instance_events", ev),
        "instance_usage": table("instance_usage", us),
    }


HYP = settings(max_examples=examples(30), deadline=None, suppress_health_check=[HealthCheck.too_slow])


@HYP
@given(tables=lifecycle_cell(), bucket_s=st.sampled_from([7, 60, 300]))
def test_matches_replay_and_sql(tables, bucket_s):
    a = Overcommit(bucket_s=bucket_s)
    check_against_reference(tables, _run(tables, a), a)


@settings(max_examples=examples(10), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(tables=cell())
def test_matches_replay_on_shared_strategy(tables):
    """The conformance strategy's cells (times up to 800 h, ids above 2^53, alloc rows)."""
    a = Overcommit(bucket_s=3600)
    check_against_reference(tables, _run(tables, a), a)


@settings(max_examples=examples(200), deadline=None)
@given(k=st.integers(0, 10_050), ulps=st.integers(-3, 3))
def test_ratio_hist_bins_are_the_edges_of_searchsorted(k, ulps):
    """A ratio at (or a few ulps off) an edge ``k / 100`` falls in the bin searchsorted gives over
    the edges (where ``v * 100`` rounds across it), from 100 up in the last one."""
    from gpuclust.analyses._overcommit_figure import HIST_BINS, hist_bins

    v = k / 100
    for _ in range(abs(ulps)):
        v = np.nextafter(v, np.inf if ulps > 0 else -np.inf)
    edges = np.arange(HIST_BINS + 1) / 100
    want = min(int(np.searchsorted(edges, v, side="right")) - 1, HIST_BINS)
    assert hist_bins(np, np.array([v])).tolist() == [want if v >= 0 else HIST_BINS + 1]


# ------------------------------------------------------------------------------------ partitions, dask
def _assert_same(r1, r2, rtol=1e-9):
    for k in r1:
        a, b = as_pandas(r1[k]).reset_index(drop=True), as_pandas(r2[k]).reset_index(drop=True)
        assert list(a.columns) == list(b.columns) and len(a) == len(b), k
        for c in a.columns:
            if a[c].dtype.kind == "f":
                np.testing.assert_allclose(a[c].to_numpy(), b[c].to_numpy(), rtol=rtol, atol=1e-12, equal_nan=True)
            else:
                assert a[c].tolist() == b[c].tolist(), (k, c)


def test_partition_invariance_and_sql(tmp_path):
    tables = random_cell(11, n_machines=12, n_instances=120, n_windows=3000)
    # give the random cell lifecycles: every event is a SCHEDULE there; turn a third into FINISH
    ev = tables["instance_events"].to_pandas()
    ev.loc[ev.index % 3 == 2, "type"] = 6
    ev["req_cpu"] = np.where(ev.index % 5 == 0, np.nan, (ev.index % 7 + 1) / 50.0)
    ev["req_mem"] = (ev.index % 4 + 1) / 40.0
    tables["instance_events"] = table(
        "instance_events",
        {
            c: [None if isinstance(v, float) and np.isnan(v) else v for v in ev[c].tolist()]
            for c in ev.columns
            if c
            in (
                "time",
                "type",
                "collection_id",
                "instance_index",
                "machine_id",
                "priority",
                "alloc_collection_id",
                "req_cpu",
                "req_mem",
            )
        },
    )
    ds = write_dataset(tmp_path / "ds", tables, files=3, row_group_size=400)
    a = Overcommit(bucket_s=3600)
    base = run(ds, [a])["overcommit"]
    check_against_reference(tables, base, a)
    assert base["info"].iloc[0]["usage_used"] > 500
    for parts in (2, 7):
        _assert_same(base, run(ds, [a], partitions=parts)["overcommit"])
    rng = np.random.default_rng(0)
    cuts = sorted(rng.choice(np.arange(1, 3000), 5, replace=False).tolist())
    _assert_same(base, run(ds, [a], cut_points={"instance_usage": [0, *cuts]})["overcommit"])
    _assert_same(base, run(ds, [a], partitions=3, scheduler="threads")["overcommit"])


def test_dataset_matches_tables(tmp_path):
    """Parquet path: the window end comes from row-group statistics (a group whose max is the
    2^63-1 sentinel is read instead); results equal the in-memory run."""
    tables = hand_cell()
    ds = write_dataset(tmp_path / "ds", tables, files=2, row_group_size=1)
    _assert_same(_run(tables, Overcommit()), run(ds, [Overcommit()], partitions=3)["overcommit"])


def test_chunked_usage_accumulation(monkeypatch):
    """A partition whose dense (machine x tier) x bucket block would exceed CELL_LIMIT is cut into
    bucket ranges; the result is the same."""
    import gpuclust.analyses.overcommit as oc

    tables = random_cell(3, n_machines=8, n_instances=80, n_windows=1500)
    a = Overcommit(bucket_s=600)
    base = _run(tables, a)
    monkeypatch.setattr(oc, "CELL_LIMIT", 50)
    _assert_same(base, _run(tables, a))
    _assert_same(base, _run(tables, a, partitions=3))


def test_context_pickles_without_client_events():
    tables = hand_cell()
    a = Overcommit()
    src = TableSource(tables, tier_map="notebook")
    ctx = context_of(a, src)
    shipped = pickle.loads(pickle.dumps(ctx))
    # the capacity intervals travel (the shards of the machine table are finalized from them);
    # the interval partial bound on the client (one entry per running piece) does not
    assert shipped.series is not None and ctx.client_events is not None
    t = tables["instance_usage"]
    from gpuclust.backends import get_backend

    be = get_backend("cpu")
    cols = {c: be.asarray(column_to_numpy(t.column(c))) for c in a.columns}
    p1 = to_host(a.partial(cols, shipped, be))
    p2 = to_host(a.partial(cols, ctx, be))
    _assert_same(a.finalize(p1, ctx), a.finalize(p2, ctx))
    with pytest.raises(RuntimeError):
        a.finalize(p1, shipped)


def test_registry_and_options():
    a = create("overcommit", bucket_s=600, tier_map="v3-doc")
    assert isinstance(a, Overcommit) and a.label == "overcommit[bucket_s=600,tier_map=v3-doc]"


def test_gpu_parity(backend):
    tables = random_cell(5, n_machines=10, n_instances=100, n_windows=2000)
    a = Overcommit(bucket_s=600)
    _assert_same(_run(tables, a, backend="cpu"), _run(tables, a, backend=backend.name, partitions=3))


# ------------------------------------------------------------------------------------ synth
@pytest.fixture(scope="module")
def synth_cell(tmp_path_factory):
    """A synthetic cell with the default planted overcommit (1.25 CPU, 1.0 memory) and what it
    planted: the 150-machine x 4 h cell test_cpi.py and test_job_usage.py read too
    (tests/analyses/planted_cells.py), built once per run."""
    from gpuclust.dataset import Dataset

    ds = _cells.synth_150x4(tmp_path_factory)
    return ds, Dataset(ds).manifest["synthetic"]


def test_synth_recovers_planted_overcommit(synth_cell):
    ds, truth = synth_cell
    res = run(ds, [Overcommit()], partitions=3)["overcommit"]
    m = res["machine"]
    oc_cpu, oc_mem = truth["planted"]["overcommit_cpu"], truth["planted"]["overcommit_mem"]
    known = np.isfinite(m["cap_cpu"]) & (m["cap_cpu"] > 0)
    r_cpu = m.loc[known, "alloc_ratio_cpu"].to_numpy()
    r_mem = m.loc[known & np.isfinite(m["cap_mem"]), "alloc_ratio_mem"].to_numpy()
    # no machine-bucket exceeds the planted factor by request; the placement binds, so the max is close.
    # The synthesizer places requests in float64, the trace stores them and the capacities as float32:
    # each rounds by at most 2**-24 relative, so a ratio of their sums may exceed the factor by ~2**-23.
    f32 = 4 * 2.0**-24
    assert r_cpu.max() <= oc_cpu * (1 + f32) and r_cpu.max() >= oc_cpu - 0.02
    assert r_mem.max() <= oc_mem * (1 + f32) and r_mem.max() >= oc_mem - 0.02
    info = res["info"].iloc[0]
    assert info["window_end_us"] == truth["trace_window_us"][1]
    # usage totals (CPU-seconds by tier) agree with the truth for ingested (valid) rows
    want = truth["usage"]["cpu_seconds_top_level_valid_by_tier"]["notebook"]
    for t, v in want.items():
        got = float((m[f"use_cpu_{t}"] * m["covered_s"]).sum())
        assert got == pytest.approx(v, rel=1e-6), t
    assert float((m["use_cpu_unknown"] * m["covered_s"]).sum()) == 0.0
    s = res["summary"]
    over = s[(s.metric == "share_over_capacity_request") & (s.resource == "cpu")]["value"].iloc[0]
    assert 0.0 < over < 1.0
    check_figure_tables(res)


def test_report_plots(synth_cell, tmp_path):
    from gpuclust.report.analyze import analyze

    ds, _ = synth_cell
    analyze(ds, ["overcommit"], out=tmp_path)
    assert (tmp_path / "overcommit" / "overcommit.png").stat().st_size > 10_000
    assert (tmp_path / "overcommit" / "machine" / "part-00000.parquet").exists()  # a parted table: a folder of parts
    assert "over capacity by request" in (tmp_path / "summary.txt").read_text()


# ------------------------------------------------------------------------------------ real 2011
# ``real_2011`` (tests/conftest.py): the real 2011 machine, task and job events, ingested once per
# run; overcommit reads no job events (its tables are those of the machine and task events alone).


def test_real_2011_sanity(real_2011):
    res = run(real_2011, [Overcommit()])["overcommit"]
    info = res["info"].iloc[0]
    assert info["tier_map"] == "v2" and info["machines"] > 12_000 and info["usage_rows"] == 0
    s = res["summary"].set_index(["metric", "resource", "tier"])["value"]
    share_cpu = s[("share_over_capacity_request", "cpu", "all")]
    share_mem = s[("share_over_capacity_request", "mem", "all")]
    # 2011: requests above capacity on most machine-time for CPU, about half for memory
    assert 0.5 < share_cpu < 0.95 and 0.2 < share_mem < 0.8
    assert 1.0 < s[("alloc_ratio_mean", "cpu", "all")] < 1.3
    assert s[("alloc_ratio_mean", "cpu", "prod")] > s[("alloc_ratio_mean", "cpu", "free")]
    cell = res["cell"]
    assert (cell["machines_up"] > 12_000).all() and np.isfinite(cell["alloc_ratio_cpu"]).all()
    check_figure_tables(res)  # 160 bands of ~78 machines
    assert res["heatmap"]["band"].nunique() == 160


def test_real_2011_subset_matches_replay(real_2011):
    """The slow replay on 1 in 40 machines of the real trace, with every instance that only ever
    ran on them (whole lifecycles)."""
    from gpuclust.dataset import Dataset

    d = Dataset(real_2011)
    me = d.read("machine_events")
    keep_m = np.unique(me.column("machine_id").to_numpy())[::40]  # ~300 machines, all their events
    me = me.filter(pa.array(np.isin(me.column("machine_id").to_numpy(), keep_m)))
    ev = d.read("instance_events")
    e = ev.select(["collection_id", "instance_index", "machine_id"]).to_pandas()
    e["ok"] = e["machine_id"].isin(keep_m) | e["machine_id"].isna() | (e["machine_id"] == 0)
    whole = e.groupby(["collection_id", "instance_index"])["ok"].transform("all")  # complete lifecycles only
    ev = ev.filter(pa.array(whole.to_numpy()))
    tables = {"machine_events": me, "instance_events": ev}
    a = Overcommit(bucket_s=900)
    res = run(TableSource(tables, tier_map="v2", trace_version="v2"), [a])["overcommit"]
    assert res["info"].iloc[0]["pieces"] > 2000 and res["info"].iloc[0]["machines"] == len(keep_m)
    tables["instance_usage"] = SCHEMAS["instance_usage"].empty_table()
    check_against_reference(tables, res, a, tm=TIER_MAPS["v2"])
