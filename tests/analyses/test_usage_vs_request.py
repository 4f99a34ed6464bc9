"""``usage-vs-request`` against a slow pure-Python as-of join and ratio count, on random cells
with requests (zero, NULL, changing over time, events at exactly a window's start)."""

from __future__ import annotations

import bisect
import subprocess
import sys
from collections import defaultdict

import numpy as np
import pyarrow as pa
import pytest
from generic_backend import CPU, GENERIC
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from references.usage_change import tiers_of
from strategies import assert_results_same, examples, table, write_dataset

from gpuclust.analyses._lookup import InstanceLookup, triple_hash
from gpuclust.analyses._requests import KeyedSlots, RequestTimeline
from gpuclust.analyses.usage_change import RATIO_EDGES
from gpuclust.analyses.usage_vs_request import _REFINED, MEASURES, UsageVsRequest, refined_bins
from gpuclust.backends import get_backend
from gpuclust.dataset import Dataset
from gpuclust.engine import TableSource, run
from gpuclust.schema import tier_map

EDGES = [float(x) for x in RATIO_EDGES]
LO = [0.0, *EDGES]
S = 1_000_000


def cell(seed: int, n_inst: int = 60, n_ev: int = 200, n_win: int = 1500) -> dict:
    rng = np.random.default_rng(seed)
    inst = [
        (int(c), int(i), int(m))
        for c, i, m in zip(
            rng.choice([3, 2**40 + 1, 2**62 + 9], n_inst),
            rng.integers(0, 30, n_inst),
            rng.choice([5, 6, 2**53 + 1], n_inst),
            strict=True,
        )
    ]
    inst = list(dict.fromkeys(inst))
    ev = defaultdict(list)
    for _ in range(n_ev):
        c, i, m = inst[rng.integers(len(inst))]
        req = lambda: None if rng.random() < 0.1 else float(np.float32(rng.choice([0.0, rng.uniform(0.01, 0.5)])))  # noqa: E731
        for k, v in (
            ("time", int(rng.integers(0, 40)) * 300 * S),
            ("type", int(rng.choice([0, 3, 9, 10]))),
            ("collection_id", c),
            ("instance_index", i),
            ("machine_id", None if rng.random() < 0.05 else m),
            ("priority", None if rng.random() < 0.05 else int(rng.choice([0, 103, 117, 200, 400]))),
            ("req_cpu", req()),
            ("req_mem", req()),
        ):
            ev[k].append(v)
    us = defaultdict(list)
    for _ in range(n_win):
        c, i, m = inst[rng.integers(len(inst))]
        start = int(rng.integers(0, 45)) * 300 * S
        for k, v in (
            ("start_time", start),
            ("end_time", start + 300 * S),
            ("collection_id", c),
            ("instance_index", i),
            ("machine_id", m),
        ):
            us[k].append(v)
        for col in ("avg_cpu", "max_cpu", "avg_mem", "max_mem"):
            us[col].append(None if rng.random() < 0.03 else float(np.float32(rng.uniform(0, 0.6))))
    return {"instance_events": table("instance_events", dict(ev)), "instance_usage": table("instance_usage", dict(us))}


def reference(tables: dict, tm_name: str = "notebook") -> dict:
    """(tier, measure) -> (counts, ratios): every window joined by a loop over its instance's events."""
    tm = tier_map(tm_name)
    evs = tables["instance_events"].to_pylist()
    tiers = tiers_of(evs, tm.bounds, tm.names)
    by_inst = defaultdict(list)
    for k, e in enumerate(evs):
        by_inst[(e["collection_id"], e["instance_index"])].append((e["time"], k, e))
    for v in by_inst.values():
        v.sort(key=lambda x: (x[0], x[1]))
    out: dict = {}
    for w in tables["instance_usage"].to_pylist():
        tier = tiers.get((w["collection_id"], w["instance_index"], w["machine_id"]), "unknown")
        limits = []
        for col in ("req_cpu", "req_mem"):
            lim = None
            for t, _, e in by_inst.get((w["collection_id"], w["instance_index"]), []):
                if t <= w["start_time"] and e[col] is not None and e[col] > 0:
                    lim = e[col]
            limits.append(lim)
        for name, col, r in MEASURES:
            for key in ((tier, name), ("all", name)):
                g = out.setdefault(key, {"windows": 0, "no_limit": 0, "unknown": 0, "ratios": []})
                g["windows"] += 1
                if limits[r] is None:
                    g["no_limit"] += 1
                elif w[col] is None:
                    g["unknown"] += 1
                else:
                    g["ratios"].append(w[col] / limits[r])
    return out


def check(res: dict, tables: dict) -> None:
    ref = reference(tables)
    got = {(r.tier, r.measure): r for r in res["summary"].itertuples()}
    assert set(got) == set(ref)
    hist = {(r.tier, r.measure, r.bin): r.windows for r in res["hist"].itertuples()}
    want_hist: dict = defaultdict(int)
    for key, g in ref.items():
        r, xs = got[key], g["ratios"]
        assert (r.windows, r.no_limit, r.unknown, r.defined) == (g["windows"], g["no_limit"], g["unknown"], len(xs)), (
            key
        )
        assert r.above_limit == sum(1 for x in xs if x > 1) and r.at_most_half == sum(1 for x in xs if x <= 0.5)
        for x in xs:
            want_hist[(*key, bisect.bisect_right(EDGES, x))] += 1
        if not xs:
            assert np.isnan(r.mean_ratio)
            continue
        assert r.mean_ratio == pytest.approx(sum(xs) / len(xs), rel=1e-9)
        for q in (10, 50, 90, 99):
            exact = float(np.quantile(np.array(xs), q / 100, method="inverted_cdf"))
            assert getattr(r, f"p{q}_ratio") == LO[bisect.bisect_right(EDGES, exact)], (key, q)
    assert hist == dict(want_hist)


@settings(max_examples=examples(25), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 10**6))
def test_matches_the_reference(seed):
    tables = cell(seed)
    check(run(TableSource(tables), UsageVsRequest(tier_map="notebook"))["usage-vs-request"], tables)


def test_a_worked_instance():
    """Requests 0.2 at 0 s, 0 (ignored) at 600 s, 0.4 at 900 s; windows at 300, 900 and 1200 s with
    CPU 0.1, 0.5, 0.1: ratios 0.5 (limit 0.2), 1.25 (0.4: the event at the window's start counts), 0.25."""
    ev = table(
        "instance_events",
        {
            "time": [0, 600 * S, 900 * S],
            "type": [0, 9, 10],
            "collection_id": [7] * 3,
            "instance_index": [1] * 3,
            "machine_id": [5] * 3,
            "priority": [200] * 3,
            "req_cpu": [0.2, 0.0, 0.4],
            "req_mem": [0.1, 0.1, 0.1],
        },
    )
    starts = [300 * S, 900 * S, 1200 * S]
    us = table(
        "instance_usage",
        {
            "start_time": starts,
            "end_time": [s + 300 * S for s in starts],
            "collection_id": [7] * 3,
            "instance_index": [1] * 3,
            "machine_id": [5] * 3,
            "avg_cpu": [0.1, 0.5, 0.1],
            "max_cpu": [0.2, 0.6, 0.2],
            "avg_mem": [0.05] * 3,
            "max_mem": [0.05] * 3,
        },
    )
    res = run(TableSource({"instance_events": ev, "instance_usage": us}), UsageVsRequest(tier_map="notebook"))
    r = res["usage-vs-request"]["summary"].set_index(["tier", "measure"]).loc[("prod", "cpu_avg")]
    assert (r["defined"], r["above_limit"], r["at_most_half"]) == (3, 1, 2)
    assert r["mean_ratio"] == pytest.approx((0.1 / 0.2 + 0.5 / 0.4 + 0.1 / 0.4) / 3, rel=1e-6)


def test_layouts_and_schedulers_agree(tmp_path):
    tables = cell(11, n_inst=120, n_ev=600, n_win=5000)
    flat = write_dataset(tmp_path / "flat", tables, files=3, row_group_size=700)
    want = run(Dataset(flat), UsageVsRequest(), partitions=4, workers=2)["usage-vs-request"]
    check(want, tables)
    r = subprocess.run(
        [sys.executable, "-m", "gpuclust.cli", "optimize", str(flat), "--out", str(tmp_path / "opt"), "--buckets", "8"],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0, r.stderr
    for parts, sched in ((3, None), ("auto", None), (3, "threads")):
        got = run(Dataset(tmp_path / "opt"), UsageVsRequest(), partitions=parts, scheduler=sched)["usage-vs-request"]
        assert_results_same({"usage-vs-request": got}, {"usage-vs-request": want}, rtol=1e-9)


def test_duckdb_asof_join_agrees(tmp_path):
    """DuckDB's own ASOF JOIN (latest positive CPU request at or before the start) gives the same
    windows with a limit, count above it and mean ratio, over the same Parquet."""
    duckdb = pytest.importorskip("duckdb")
    tables = cell(23, n_inst=80, n_ev=400, n_win=4000)
    # one event per instance and time: DuckDB's ASOF picks any of equal-time matches
    ev = tables["instance_events"]
    keys = list(zip(*(ev.column(k).to_pylist() for k in ("collection_id", "instance_index", "time")), strict=True))
    first = [k for k, key in enumerate(keys) if key not in keys[:k]]
    tables = {**tables, "instance_events": ev.take(first)}
    ds = write_dataset(tmp_path / "ds", tables, files=2)
    got = run(Dataset(ds), UsageVsRequest(), partitions=3)["usage-vs-request"]["summary"]
    r = got.set_index(["tier", "measure"]).loc[("all", "cpu_avg")]
    q = f"""
    WITH ev AS (SELECT collection_id, instance_index, time, req_cpu FROM read_parquet('{ds}/instance_events/*.parquet')
                WHERE req_cpu > 0),
         u AS (SELECT collection_id, instance_index, start_time, avg_cpu FROM read_parquet('{ds}/instance_usage/*.parquet'))
    SELECT COUNT(*), COUNT(ev.req_cpu), COUNT(ev.req_cpu) FILTER (WHERE u.avg_cpu IS NOT NULL),
           AVG(CAST(u.avg_cpu AS DOUBLE) / ev.req_cpu), COUNT(*) FILTER (WHERE CAST(u.avg_cpu AS DOUBLE) > ev.req_cpu)
    FROM u ASOF LEFT JOIN ev ON u.collection_id = ev.collection_id AND u.instance_index = ev.instance_index
                             AND u.start_time >= ev.time"""
    n, with_limit, defined, mean, above = duckdb.sql(q).fetchall()[0]
    assert (r["windows"], r["windows"] - r["no_limit"], r["defined"], r["above_limit"]) == (
        n,
        with_limit,
        defined,
        above,
    )
    assert r["mean_ratio"] == pytest.approx(mean, rel=1e-9)


def test_planted_usage_over_request_by_tier(tmp_path):
    """`gpuclust synth` plants the mean CPU usage / request of each tier (``usage_ratio_<tier>``;
    synth_truth.json planted.usage_ratio): every task interval's usage level is request x f x
    mean-one factors, E[f] = the tier's ratio.  usage-vs-request's mean cpu_avg ratio per tier
    recovers the law's expectation over the cell's windows (``expected_mean_by_tier``: the planted
    ratio for free, beb and mid; prod mixes in alloc instances, whose windows report their tasks' sum
    against the alloc's request) within 4 standard errors (``expected_mean_se_by_tier``, from the
    interval, machine, machine-cell and window factors and how many windows share each), and equals
    what the generator realised (against the request at SCHEDULE; UPDATE_RUNNING moves a few limits)
    within 2%.  Machine throttling is off (``max_machine_utilisation`` inf: it only lowers usage) and
    the per-machine load spread small (0.1), so the standard errors are 2-4% of the means.  Seed 3,
    60 machines x 3 h: free 0.589 (planted 0.598, se 0.021), beb 0.559 (0.549, 0.010), mid 0.455
    (0.450, 0.018), prod 0.331 (expected 0.327, 0.007)."""
    from gpuclust.synth import SynthConfig, synthesize

    syn = synthesize(
        SynthConfig(machines=60, hours=3, seed=3, machine_load_sigma=0.1, max_machine_utilisation=float("inf")),
        tmp_path / "raw",
        dataset=tmp_path / "ds",
        progress=None,
    )
    p = syn.truth["planted"]["usage_ratio"]
    res = run(Dataset(tmp_path / "ds"), UsageVsRequest(tier_map="notebook"), partitions="auto")["usage-vs-request"]
    s = res["summary"].set_index(["tier", "measure"])
    assert set(p["expected_mean_by_tier"]) == {"free", "beb", "mid", "prod"}
    for tier, want in p["expected_mean_by_tier"].items():
        if tier != "prod":  # no alloc instances outside prod: the expectation is the planted ratio itself
            assert want == pytest.approx(p["clipped_mean_by_tier"][tier], rel=1e-9)
            assert want == pytest.approx(p["mean_by_tier"][tier], rel=0.01)
        got = s.loc[(tier, "cpu_avg"), "mean_ratio"]
        assert abs(got - want) <= 4 * p["expected_mean_se_by_tier"][tier], (tier, got, want)
        assert got == pytest.approx(p["realised_mean_by_tier"][tier], rel=0.02)
        assert s.loc[(tier, "cpu_avg"), "defined"] == p["windows_by_tier"][tier]


class _Side:
    """A side table of one Arrow table (what ``RequestTimeline.build`` reads)."""

    def __init__(self, t):
        self.t = t

    def batches(self, columns):
        yield self.t.select(list(columns))


@settings(max_examples=examples(30), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 10**6))
def test_asof_join_matches_a_loop(seed):
    """The as-of join against a loop over each instance's events, with long runs of events (the
    binary search), ties in time (the last in row order wins), windows before the first event, at
    an event's time, after the last, and instances without events (or sharing a collection)."""
    from gpuclust.analyses._requests import RequestTimeline, asof_events, asof_index

    rng = np.random.default_rng(seed)
    n_inst = int(rng.integers(1, 12))
    insts = [(int(rng.choice([3, 2**40 + 1, -5])), int(rng.integers(0, 4))) for _ in range(n_inst)]
    ne = int(rng.integers(0, 120))
    pick = rng.integers(0, n_inst, ne)
    times = rng.integers(0, 30, ne) * S
    req = np.where(rng.random((ne, 2)) < 0.3, 0.0, rng.uniform(0.01, 1.0, (ne, 2)))
    ev = pa.table(
        {
            "time": pa.array(times, pa.int64()),
            "collection_id": pa.array([insts[k][0] for k in pick], pa.int64()),
            "instance_index": pa.array([insts[k][1] for k in pick], pa.int32()),
            "req_cpu": pa.array(req[:, 0], pa.float32()),
            "req_mem": pa.array(req[:, 1], pa.float32()),
        }
    )
    req = req.astype(np.float32).astype(np.float64)
    rq = RequestTimeline.build(_Side(ev))
    nw = 400
    wi = rng.integers(0, n_inst + 2, nw)  # two instances without events
    wc = np.array([insts[k][0] if k < n_inst else 3 for k in wi], np.int64)
    wn = np.array([insts[k][1] if k < n_inst else 10 + k for k in wi], np.int32)
    ws = rng.integers(-1, 32, nw) * S
    be = get_backend("cpu")
    j = asof_index(be, rq, wc, wn, ws)
    flag = rq.req[:, 0] > 0
    ((hit, e),) = asof_events(be, rq, wc, wn, ws, [flag], "test")
    # the loop: events with a positive request, in (time, row) order per instance
    rows = [k for k in range(ne) if (req[k] > 0).any()]
    for w in range(nw):
        mine = sorted((int(times[k]), k) for k in rows if insts[pick[k]] == (int(wc[w]), int(wn[w])))
        before = [k for t, k in mine if t <= ws[w]]
        if not before:
            assert j[w] == -1 and not hit[w]
            continue
        want = before[-1]
        assert (rq.time[j[w]], rq.collection[j[w]], rq.instance[j[w]]) == (times[want], wc[w], wn[w])
        assert rq.req[j[w]].tolist() == req[want].tolist()
        cpu = [k for k in before if req[k, 0] > 0]
        assert bool(hit[w]) == bool(cpu)
        if cpu:
            assert rq.req[e[w], 0] == req[cpu[-1], 0] and rq.time[e[w]] == times[cpu[-1]]


def test_window_on_another_machine_keeps_its_limit():
    """A window whose (collection, instance, machine) has no event (its tier: unknown) still joins
    its instance's requests (the separate instance probe of usage-vs-request)."""
    ev = table(
        "instance_events",
        {
            "time": [0, 600 * S],
            "type": [0, 10],
            "collection_id": [7] * 2,
            "instance_index": [1] * 2,
            "machine_id": [5] * 2,
            "priority": [200] * 2,
            "req_cpu": [0.2, 0.4],
            "req_mem": [0.1, 0.1],
        },
    )
    starts = [300 * S, 900 * S]
    us = table(
        "instance_usage",
        {
            "start_time": starts,
            "end_time": [s + 300 * S for s in starts],
            "collection_id": [7] * 2,
            "instance_index": [1] * 2,
            "machine_id": [5, 6],
            "avg_cpu": [0.1, 0.1],
            "max_cpu": [0.2, 0.2],
            "avg_mem": [0.05] * 2,
            "max_mem": [0.05] * 2,
        },
    )
    tables = {"instance_events": ev, "instance_usage": us}
    res = run(TableSource(tables), UsageVsRequest(tier_map="notebook"))["usage-vs-request"]
    s = res["summary"].set_index(["tier", "measure"])
    assert (s.loc[("prod", "cpu_avg"), "defined"], s.loc[("unknown", "cpu_avg"), "defined"]) == (1, 1)
    assert s.loc[("unknown", "cpu_avg"), "mean_ratio"] == pytest.approx(0.1 / 0.4)
    check(res, tables)


def test_events_without_machines():
    """No event has a machine (every tier unknown, the keyed lookup empty): every window is joined
    by the instance probe alone, as the reference does."""
    for seed in (1, 2):
        tables = cell(seed)
        ev = tables["instance_events"]
        k = ev.schema.get_field_index("machine_id")
        tables["instance_events"] = ev.set_column(k, ev.schema.field(k), pa.nulls(ev.num_rows, ev.schema.field(k).type))
        res = run(TableSource(tables), UsageVsRequest(tier_map="notebook"))["usage-vs-request"]
        assert set(res["summary"]["tier"]) == {"unknown", "all"}
        check(res, tables)


def test_small_blocks_agree(monkeypatch):
    """Rows in many blocks (the cpu backend's ``lookup_block_rows``): the same counts, histogram and
    (the ratios summed in row order whatever the blocks) bit-identical means."""
    import gpuclust.backends.cpu as cpu

    tables = cell(5)
    want = run(TableSource(tables), UsageVsRequest(tier_map="notebook"))["usage-vs-request"]
    monkeypatch.setattr(cpu, "lookup_block_rows", 97)
    got = run(TableSource(tables), UsageVsRequest(tier_map="notebook"))["usage-vs-request"]
    check(got, tables)
    for k in want:
        assert got[k].equals(want[k]), k


@settings(max_examples=examples(40), deadline=None)
@given(n=st.integers(0, 300), kinds=st.integers(1, 6), times=st.integers(1, 8), seed=st.integers(0, 10**6))
def test_timeline_order_is_lexsort(n, kinds, times, seed):
    """The request timeline's event order (one sort of dense ranks) is ``lexsort((time, key))``:
    by key, then time, then row."""
    from gpuclust.analyses._requests import timeline_order

    rng = np.random.default_rng(seed)
    key = rng.choice(np.array([0, 1, 2**63, 2**64 - 1, 12345, 2**40], dtype=np.uint64)[:kinds], n)
    t = rng.choice(np.array([-(2**62), -1, 0, 1, 300 * S, 2**62, 7, 8])[:times], n)
    assert timeline_order(key, t).tolist() == np.lexsort((t, key)).tolist()


def test_no_requests_keeps_the_tiers():
    """No event has a positive request: every window is counted as no limit, in its tier."""
    tables = cell(3)
    ev = tables["instance_events"]
    for col in ("req_cpu", "req_mem"):
        k = ev.schema.get_field_index(col)
        ev = ev.set_column(k, ev.schema.field(k), pa.nulls(ev.num_rows, ev.schema.field(k).type))
    tables["instance_events"] = ev
    res = run(TableSource(tables), UsageVsRequest(tier_map="notebook"))["usage-vs-request"]
    s = res["summary"]
    assert (s["no_limit"] == s["windows"]).all() and len(set(s["tier"]) - {"unknown", "all"}) >= 2
    check(res, tables)


# ---------------------------------------------------------------- the cpu backend's fast path

SPECIAL = np.array(
    [
        0.0,
        -0.0,
        -1.0,
        5e-324,
        1e-300,
        1e-7,
        1e-6,
        0.5,
        1.0,
        1e6,
        2.0**20,
        1e300,
        np.inf,
        -np.inf,
        np.finfo(np.float64).max,
    ]
)


@settings(max_examples=examples(50), deadline=None)
@given(st.lists(st.floats(allow_nan=False, width=64), max_size=200), st.integers(0, 10**6))
def test_refined_bins_is_a_binary_search(xs, seed):
    """The ratio's refined bin (bin of RATIO_EDGES + [r > 0.5] + [r > 1]) from the cell table, at
    and around every edge, 0.5 and 1, and for any float but NaN."""
    rng = np.random.default_rng(seed)
    near = rng.choice(np.concatenate([RATIO_EDGES, [0.5, 1.0]]), 200)
    r = np.concatenate(
        [
            np.array(xs, dtype=np.float64),
            SPECIAL,
            near,
            np.nextafter(near, 0),
            np.nextafter(near, 2e6),
            10.0 ** rng.uniform(-8, 8, 500),
        ]
    )
    want = np.searchsorted(RATIO_EDGES, r, side="right") + (r > 0.5) + (r > 1.0)
    assert (refined_bins(np, r) == want).all()
    assert (np.searchsorted(_REFINED, r, side="right") == want).all()


@settings(max_examples=examples(30), deadline=None)
@given(n=st.integers(0, 300), q=st.integers(1, 400), seed=st.integers(0, 10**6))
def test_slot_table_finds_every_key(n, q, seed):
    """Keys (some sharing collection, instance or machine, so home slots collide and runs form) and
    queries present and absent: found exactly where present, with the key's own code and row."""
    rng = np.random.default_rng(seed)
    ids = np.array([0, 1, 2, 3, -1, 2**40 + 1, 2**62 + 9, -(2**63), 2**63 - 1], dtype=np.int64)
    keys = {
        (int(c), int(i), int(m))
        for c, i, m in zip(rng.choice(ids, n), rng.integers(0, 5, n), rng.choice(ids, n), strict=True)
    }
    k = np.array(sorted(keys), dtype=np.int64).reshape(-1, 3)
    c, i, m = k[:, 0], k[:, 1].astype(np.int32), k[:, 2]
    h = triple_hash(np, c, i, m)
    o = np.argsort(h)
    code = rng.integers(0, 16, len(keys)).astype(np.int32)
    lk = InstanceLookup(h[o], c[o], i[o], m[o], code[o])
    ks = KeyedSlots.build(lk, RequestTimeline(), np.full((1, 2), np.nan))
    assert ks is not None
    pick = rng.integers(0, max(1, len(keys)), q)
    qc = np.where(rng.random(q) < 0.7, c[o][pick] if len(keys) else 0, rng.choice(ids, q))
    qi = np.where(rng.random(q) < 0.8, i[o][pick] if len(keys) else 0, rng.integers(0, 5, q)).astype(np.int32)
    qm = np.where(rng.random(q) < 0.8, m[o][pick] if len(keys) else 0, rng.choice(ids, q))
    hit, e = ks.find(triple_hash(np, qc, qi, qm), qc, qi, qm)
    where = {(int(a), int(b), int(d)): r for r, (a, b, d) in enumerate(zip(c[o], i[o], m[o], strict=True))}
    for r in range(q):
        row = where.get((int(qc[r]), int(qi[r]), int(qm[r])))
        assert bool(hit[r]) == (row is not None)
        if row is not None:
            assert (e["c"][r], e["m"][r], e["i"][r], e["code"][r]) == (qc[r], qm[r], qi[r], code[o][row])


def test_slot_table_needs_float32_values():
    """Limits float32 does not hold exactly (a float64 request): no slot table (the records then)."""
    lk = InstanceLookup(
        np.zeros(1, np.uint64),
        np.zeros(1, np.int64),
        np.zeros(1, np.int32),
        np.zeros(1, np.int64),
        np.zeros(1, np.int32),
    )
    assert KeyedSlots.build(lk, RequestTimeline(), np.array([[0.1, np.nan]])) is None
    assert KeyedSlots.build(lk, RequestTimeline(), np.array([[np.float32(0.1), np.nan]])) is not None


def _same(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for k in a:
        assert a[k].equals(b[k]), k


@settings(max_examples=examples(25), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 10**6), block=st.sampled_from([None, 1, 7, 64]))
def test_usage_vs_request_slot_path_is_the_generic_path(seed, block):
    """The slot table's join (cpu) and the records' join (generic) give bit-identical tables, in
    any block size (``lookup_block_rows``; the slot path takes a quarter)."""
    import gpuclust.backends.cpu as cpu

    tables = cell(seed, n_win=600)
    old = cpu.lookup_block_rows
    try:
        if block is not None:
            cpu.lookup_block_rows = block
        fast = run(TableSource(tables), UsageVsRequest(tier_map="notebook"), backend=CPU)["usage-vs-request"]
        slow = run(TableSource(tables), UsageVsRequest(tier_map="notebook"), backend=GENERIC)["usage-vs-request"]
    finally:
        cpu.lookup_block_rows = old
    _same(fast, slow)
    check(fast, tables)


def test_usage_vs_request_edge_cases_agree():
    """No windows, no events, windows before every event and instances with one event, on both paths."""
    S = 1_000_000
    ev = table(
        "instance_events",
        {
            "time": [600 * S, 900 * S, 0],
            "type": [0, 10, 0],
            "collection_id": [7, 7, 8],
            "instance_index": [1, 1, 2],
            "machine_id": [5, 5, 6],
            "priority": [200, 200, 0],
            "req_cpu": [0.2, 0.4, 0.5],
            "req_mem": [None, 0.1, 0.25],
        },
    )
    starts = [0, 300 * S, 600 * S, 700 * S, 900 * S, 1200 * S, 0, 300 * S, 100 * S]
    ci = [(7, 1, 5)] * 6 + [(8, 2, 6), (8, 2, 9), (9, 9, 9)]
    us = table(
        "instance_usage",
        {
            "start_time": starts,
            "end_time": [s + 300 * S for s in starts],
            "collection_id": [x[0] for x in ci],
            "instance_index": [x[1] for x in ci],
            "machine_id": [x[2] for x in ci],
            "avg_cpu": [0.1] * 8 + [None],
            "max_cpu": [0.3] * 9,
            "avg_mem": [0.05] * 9,
            "max_mem": [0.5] * 9,
        },
    )
    for tables in (
        {"instance_events": ev, "instance_usage": us},
        {"instance_events": ev.slice(0, 0), "instance_usage": us},
        {"instance_events": ev, "instance_usage": us.slice(0, 0)},
    ):
        fast = run(TableSource(tables), UsageVsRequest(tier_map="notebook"), backend=CPU)["usage-vs-request"]
        slow = run(TableSource(tables), UsageVsRequest(tier_map="notebook"), backend=GENERIC)["usage-vs-request"]
        _same(fast, slow)
        if tables["instance_usage"].num_rows:
            check(fast, tables)
