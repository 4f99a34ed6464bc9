"""``usage-distribution`` against the slow mixture reference (``tests/mixture/reference.py``).

The expected per-group window lists, weights and overlap fractions are built here by slow plain
Python over the Arrow rows (its own tier lookup, its own bucket splitting), independently of the
analysis; the reference then evaluates each group's mixture from its definition.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import replace
from pathlib import Path

import by_path
import numpy as np
import pyarrow as pa
import pytest
from strategies import HOW_IT_RAN, table

import gpuclust.engine as engine
from gpuclust.analyses import create
from gpuclust.analyses._hybrid_summary import spill_threshold
from gpuclust.analyses._usage_distribution_parts import merge_partials, open_fields
from gpuclust.analyses.base import to_host
from gpuclust.analyses.usage_distribution import STATS, UsageDistribution, UsageDistributionBrackets, level_name
from gpuclust.backends import get_backend
from gpuclust.engine import TableSource
from gpuclust.engine.local import context_of
from gpuclust.engine.partition import column_to_numpy
from gpuclust.report.analyze import analyze
from gpuclust.schema import CPU_PERCENTILE_COLUMNS, CPU_PERCENTILE_LEVELS_SORTED, TIME_AFTER_TRACE

# the mixture folder's slow reference, under the name its conftest uses
ref = by_path.load("gpuclust_mixture_reference", Path(__file__).resolve().parents[1] / "mixture" / "reference.py")
STD = [float(x) for x in CPU_PERCENTILE_LEVELS_SORTED]
SORTED_COLS = [f"cpu_p{round(x * 100)}" for x in STD]
S = 1_000_000
HOUR = 3600 * S
BIG = [3, 2**40 + 1, 2**53 + 3, 2**62 + 9]


# --------------------------------------------------------------------------------------------
# data
# --------------------------------------------------------------------------------------------
def make_cell(
    seed: int, n_windows: int = 240, n_instances: int = 30, n_machines: int = 6, percentiles: bool = True
) -> dict[str, pa.Table]:
    """instance_usage with realistic and ugly percentile vectors, rates, lengths and allocs, plus
    instance_events for the tier lookup."""
    rng = np.random.default_rng(seed)
    mids = np.array([5, 7, 2**33 + 1, 2**53 + 5, 11, 13][:n_machines], dtype=np.int64)
    ic = rng.choice(np.array(BIG, dtype=np.int64), n_instances)
    ii = rng.integers(0, 5, n_instances).astype(np.int32)
    im = rng.choice(mids, n_instances)
    inst_alloc = rng.random(n_instances) < 0.2  # tasks inside an alloc
    # events: 0-2 per instance (0 = no event row -> tier unknown)
    ev: dict[str, list] = defaultdict(list)
    for j in range(n_instances):
        for _ in range(int(rng.integers(0, 3))):
            ev["time"].append(int(rng.integers(0, 10 * HOUR)))
            ev["type"].append(3)
            ev["collection_id"].append(int(ic[j]))
            ev["instance_index"].append(int(ii[j]))
            ev["machine_id"].append(None if rng.random() < 0.05 else int(im[j]))
            r = rng.random()
            ev["priority"].append(
                None if r < 0.05 else (-1 if r < 0.08 else int(rng.choice([0, 50, 100, 115, 116, 119, 120, 200, 360])))
            )
            ev["alloc_collection_id"].append(2**35 if inst_alloc[j] else (None if rng.random() < 0.3 else 0))
    w = rng.integers(0, n_instances, n_windows)
    start = rng.integers(0, 6 * HOUR, n_windows)
    kind = rng.choice(np.array(["5min", "5min", "short", "zero", "long", "cross"]), n_windows)
    length = np.where(
        kind == "5min",
        300 * S,
        np.where(
            kind == "short",
            rng.integers(1, 300 * S, n_windows),
            np.where(kind == "zero", 0, np.where(kind == "long", 2 * HOUR + 17 * S, 300 * S)),
        ),
    )
    cross = kind == "cross"
    start = np.where(cross, (start // (1800 * S) + 1) * 1800 * S - rng.integers(1, 300 * S, n_windows), start)
    end = start + length
    end = np.where(rng.random(n_windows) < 0.01, TIME_AFTER_TRACE, end)  # unbounded windows (excluded)
    end[:2] = TIME_AFTER_TRACE
    end[2] = start[2] - 5  # ends before it starts (excluded)
    rate = rng.choice(np.array([1.0, 1.0, 0.5, 0.0, np.nan]), n_windows)
    cols = {
        "start_time": start,
        "end_time": end,
        "collection_id": ic[w],
        "instance_index": ii[w],
        "machine_id": im[w],
        "alloc_collection_id": [2**35 if inst_alloc[x] else (None if rng.random() < 0.3 else 0) for x in w],
        "sample_rate": [None if np.isnan(r) else float(r) for r in rate],
    }
    if percentiles:
        scale = np.exp(rng.normal(-2, 1.5, n_windows))
        q = np.sort(rng.gamma(0.7, 1.0, (n_windows, 20)), axis=1) * scale[:, None]
        idle = rng.random(n_windows) < 0.3
        q[idle, :8] = 0.0  # point mass at 0
        flat = rng.random(n_windows) < 0.05
        q[flat] = q[flat, :1]  # one-point windows
        bad = rng.random(n_windows) < 0.06
        q[bad, 12] = q[bad, 12] * 0.3 - 0.01  # non-monotone (repaired by a running max)
        q = q.astype(np.float32)
        null_row = rng.random(n_windows) < 0.04
        for k, c in enumerate(SORTED_COLS):
            v = q[:, k].astype(float)
            cols[c] = [None if (null_row[r] and k == 7) else float(v[r]) for r in range(n_windows)]
    assert set(SORTED_COLS) == set(CPU_PERCENTILE_COLUMNS)
    return {"instance_usage": table("instance_usage", cols), "instance_events": table("instance_events", dict(ev))}


# --------------------------------------------------------------------------------------------
# the independent expectation (slow plain Python)
# --------------------------------------------------------------------------------------------
def notebook_tier(p):
    if p is None or p < 0:
        return "unknown"
    if p < 100:
        return "free"
    if p < 116:
        return "beb"
    if p < 120:
        return "mid"
    return "prod"


def expected_groups(tables, by, *, bucket_s=3600, rows="auto"):
    """{key tuple: [(repaired q list, weight, fraction)]} and the global counts."""
    if rows == "auto":
        rows = "all" if ("instance" in by or "collection" in by) else "top-level"
    prio: dict = {}
    events = tables["instance_events"].to_pylist() if "instance_events" in tables else []
    for e in events:
        if e["machine_id"] is None:
            continue
        k = (e["collection_id"], e["instance_index"], e["machine_id"])
        cur = prio.get(k)
        p = e["priority"]
        prio[k] = p if cur is None else (cur if p is None else max(cur, p))
    groups: dict = defaultdict(list)
    counts = dict.fromkeys(
        (
            "windows_read",
            "alloc_task_windows",
            "bad_time_windows",
            "skipped_no_percentiles",
            "repaired",
            "used_windows",
        ),
        0,
    )
    B = round(bucket_s * S)
    for r in tables["instance_usage"].to_pylist():
        counts["windows_read"] += 1
        if rows == "top-level" and r["alloc_collection_id"] not in (None, 0):
            counts["alloc_task_windows"] += 1
            continue
        s, e = r["start_time"], r["end_time"]
        if e == TIME_AFTER_TRACE or e < s:
            counts["bad_time_windows"] += 1
            continue
        q = [r.get(c) for c in SORTED_COLS]
        if any(v is None or not math.isfinite(v) for v in q):
            counts["skipped_no_percentiles"] += 1
            continue
        rep, m = [], -math.inf
        for v in q:
            m = max(m, v)
            rep.append(m)
        counts["repaired"] += rep != q
        counts["used_windows"] += 1
        dur = (e - s) / S
        rate = r["sample_rate"]
        w = dur * rate if (rate is not None and math.isfinite(rate) and rate > 0) else dur
        w = w if w > 0 else 0.0
        base = []
        for b in by:
            if b == "instance":
                base += [r["collection_id"], r["instance_index"]]
            elif b == "collection":
                base.append(r["collection_id"])
            elif b == "machine":
                base.append(r["machine_id"])
            elif b == "tier":
                base.append(notebook_tier(prio.get((r["collection_id"], r["instance_index"], r["machine_id"]))))
            elif b == "cell":
                base.append("all")
            else:
                base.append("TIME")
        if "time" not in by:
            groups[tuple(base)].append((rep, w, 1.0))
            continue
        if e == s:
            pieces = [(s // B, 1.0)]
        else:
            pieces = []
            b = s // B
            while b * B < e:
                ov = min(e, (b + 1) * B) - max(s, b * B)
                pieces.append((b, ov / (e - s)))
                b += 1
        for b, f in pieces:
            groups[tuple(b if x == "TIME" else x for x in base)].append((rep, w * f, f))
    return groups, counts


def key_of(row, by):
    out = []
    for b in by:
        out += {
            "instance": ["collection_id", "instance_index"],
            "collection": ["collection_id"],
            "machine": ["machine_id"],
            "tier": ["tier"],
            "cell": ["cell"],
            "time": ["bucket"],
        }[b]
    return tuple(row[c] if not isinstance(row[c], (np.integer,)) else int(row[c]) for c in out)


def check_against_reference(res, groups, by, levels, *, bounded=False):
    qd = res["quantiles"]
    got = {key_of(r, by): r for r in qd.to_dict("records")}
    assert set(got) == set(groups)
    qcols = [level_name(x) for x in levels]
    for key, wins in groups.items():
        r = got[key]
        qs = np.array([w[0] for w in wins], dtype=np.float64).reshape(-1, 20)
        ws = np.array([w[1] for w in wins], dtype=np.float64)
        assert r["n_windows"] == len(wins)
        if "time" in by:
            assert r["n_windows_frac"] == pytest.approx(math.fsum(w[2] for w in wins), rel=1e-12)
        W = math.fsum(ws)
        assert r["weight"] == pytest.approx(W, rel=1e-12, abs=0)
        if W == 0:
            assert math.isnan(r["mean"]) and all(math.isnan(r[c]) for c in qcols)
            continue
        want_mean = math.fsum(w * ref.window_mean(q) for q, w in zip(qs, ws, strict=True) if w > 0) / W
        assert r["mean"] == pytest.approx(want_mean, rel=1e-9, abs=1e-300)
        eps = r["cdf_error_bound"]
        if not bounded or eps == 0.0:  # the bounded strategy keeps small groups exact
            assert eps == 0.0
            want = ref.group_quantiles(qs, ws, levels)
            for j, p in enumerate(levels):
                assert ref.quantile_ok(r[qcols[j]], want[j], qs, ws, float(p)), (key, p, r[qcols[j]], want[j])
        else:
            assert 0 < eps < 1
            lv = np.asarray(levels)
            lo = ref.group_quantiles(qs, ws, np.clip(lv - eps - 1e-9, 0, 1))
            hi = ref.group_quantiles(qs, ws, np.clip(lv + eps + 1e-9, 0, 1))
            x = np.array([r[c] for c in qcols])
            assert np.all(x >= lo - 1e-9 * np.abs(lo)) and np.all(x <= hi + 1e-9 * np.abs(hi)), key


@pytest.fixture(scope="module")
def cell1():
    return make_cell(1)


# --------------------------------------------------------------------------------------------
# per group against the reference (one partition)
# --------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "by,kw",
    [
        (("tier",), {}),
        (("instance",), {}),
        (("collection",), {"rows": "top-level"}),
        (("machine", "time"), {"bucket_s": 1800}),
        (("tier", "time"), {"bucket_s": 1800, "rows": "all"}),
        (("time",), {"bucket_s": 1200, "levels": (0.0, 0.005, 0.5, 0.95, 0.999, 1.0)}),
        (("cell",), {}),
    ],
)
def test_matches_reference(cell1, by, kw):
    a = UsageDistribution(by=by, **kw)
    res = engine.run(TableSource(cell1), [a])[a.name]
    groups, counts = expected_groups(cell1, by, bucket_s=kw.get("bucket_s", 3600), rows=kw.get("rows", "auto"))
    levels = list(kw.get("levels", STD))
    check_against_reference(res, groups, by, levels)
    info = res["info"].iloc[0]
    for c, v in counts.items():
        assert info[c] == v, c
    assert info["strategy"] == "exact" and info["groups"] == len(groups)
    assert counts["repaired"] > 0 and counts["skipped_no_percentiles"] > 0 and counts["bad_time_windows"] > 0
    if "time" in by:
        assert info["pieces"] > info["used_windows"]  # windows crossing buckets were split


def test_crossing_window_by_hand():
    # one window of 300 s starting 100 s before a bucket boundary: 1/3 and 2/3 of its weight, and
    # its whole percentile shape in each bucket
    q = np.linspace(0.1, 2.0, 20)
    cols = {
        "start_time": [HOUR - 100 * S],
        "end_time": [HOUR + 200 * S],
        "collection_id": [1],
        "instance_index": [0],
        "machine_id": [5],
        "alloc_collection_id": [0],
        "sample_rate": [0.5],
    }
    cols.update({c: [float(np.float32(q[k]))] for k, c in enumerate(SORTED_COLS)})
    t = {"instance_usage": table("instance_usage", cols)}
    a = UsageDistribution(by="time")
    r = engine.run(TableSource(t), [a])[a.name]["quantiles"]
    assert r["bucket"].tolist() == [0, 1] and r["bucket_start_us"].tolist() == [0, 3_600_000_000]
    assert r["n_windows"].tolist() == [1, 1]
    np.testing.assert_allclose(r["n_windows_frac"], [1 / 3, 2 / 3], rtol=1e-15)
    np.testing.assert_allclose(r["weight"], [50.0, 100.0], rtol=1e-15)
    qf = np.float32(q).astype(np.float64)
    np.testing.assert_allclose(r[[level_name(x) for x in STD]].to_numpy(), np.stack([qf, qf]), rtol=1e-12)


def test_docs_worked_example():
    # docs/analyses/mixture.md "How far the shortcuts land": A uniform [0.5, 1] w=300, B uniform [0, 0.05]
    # w=300, C a point mass at 2.0 w=30, D 0 up to its p50 then linear to 0.4, w=300
    lv = np.asarray(STD)
    A, B, C = 0.5 + 0.5 * lv, 0.05 * lv, np.full(20, 2.0)
    D = np.where(lv <= 0.5, 0.0, (lv - 0.5) / 0.5 * 0.4)
    qs = [A, B, C, D]
    dur = [300, 300, 30, 300]
    cols = {
        "start_time": [0] * 4,
        "end_time": [d * S for d in dur],
        "collection_id": [1, 2, 3, 4],
        "instance_index": [0] * 4,
        "machine_id": [5] * 4,
        "alloc_collection_id": [0] * 4,
        "sample_rate": [1.0] * 4,
    }
    cols.update({c: [float(q[k]) for q in qs] for k, c in enumerate(SORTED_COLS)})
    a = UsageDistribution(by="cell", levels=(0.5, 0.9, 0.99))
    res = engine.run(TableSource({"instance_usage": table("instance_usage", cols)}), [a])[a.name]
    r = res["quantiles"].iloc[0]
    # float32 storage moves the values by < 1e-7 relative
    assert r["q50"] == pytest.approx(315 / 6375, rel=1e-6)
    assert r["q90"] == pytest.approx(0.895, rel=1e-6)
    assert r["q99"] == pytest.approx(2.0, rel=1e-6)
    assert r["mean"] == pytest.approx(322.5 / 930, rel=1e-6)
    # the weighted average of the percentile vectors (the shortcut in the naive table)
    nv = res["naive"].iloc[0]
    assert nv["q50"] == pytest.approx(0.3145, abs=1e-4) and nv["q99"] == pytest.approx(0.5279, abs=1e-4)


# --------------------------------------------------------------------------------------------
# partition invariance
# --------------------------------------------------------------------------------------------
def _assert_same(r1, r2, rtol_q=1e-9):
    for name in ("quantiles", "naive", "info"):
        a, b = r1[name], r2[name]
        assert list(a.columns) == list(b.columns) and len(a) == len(b)
        for c in a.columns:
            if a[c].dtype.kind == "f":
                rt = rtol_q if (c.startswith("q") or name == "naive") else 1e-12
                np.testing.assert_allclose(a[c].to_numpy(), b[c].to_numpy(), rtol=rt, atol=1e-300, equal_nan=True)
            elif ("usage-distribution", name, c) not in HOW_IT_RAN:
                assert a[c].tolist() == b[c].tolist(), (name, c)


@pytest.mark.parametrize("by", [("tier",), ("machine", "time"), ("instance",)])
def test_exact_partition_invariance(cell1, by):
    a = UsageDistribution(by=by, bucket_s=1800, strategy="exact")
    src = TableSource(cell1)
    whole = engine.run(src, [a])[a.name]
    n = cell1["instance_usage"].num_rows
    rng = np.random.default_rng(7)
    runs = [
        dict(partitions=2),
        dict(partitions=7),
        dict(cut_points=sorted(rng.integers(0, n, 5).tolist())),
        dict(partitions=4, scheduler="threads", split_every=2),
    ]
    for kw in runs:
        _assert_same(engine.run(src, [a], **kw)[a.name], whole)


def _partials(a, tables, cuts, **ctx_kw):
    """``a``'s host partials of the usage rows ``[cuts[i], cuts[i + 1])`` (context fields ``ctx_kw``)."""
    ctx = replace(context_of(a, TableSource(tables), partitions=1), **ctx_kw)
    t, cpu = tables["instance_usage"], get_backend("cpu")
    out = []
    for lo, hi in zip(cuts[:-1], cuts[1:], strict=True):
        s = t.slice(lo, hi - lo)
        out.append(to_host(a.partial({c: column_to_numpy(s.column(c)) for c in a.columns}, ctx, cpu)))
    return out


def test_partial_kinds(cell1):
    """The declared kinds: the rows of finished groups sharded (one key per leading key component)
    only when the group tables are parted; the rests of a split merged field by field (``n`` an int
    and ``err_max`` a Python float, as the split makes them; ``full`` None-aware, by the whole
    partials' merge); whole partials merged by ``merge_partials`` (the first pass: its own merge)."""
    n = cell1["instance_usage"].num_rows
    inst = UsageDistribution(by="instance", strategy="exact")
    assert inst.kinds.sharded == ("rows",) and inst.kinds.rows == ("rows",)
    lo, hi = int(np.iinfo(np.int64).min), int(np.iinfo(np.int64).max)
    assert inst.kinds.key_range(None, "rows", lo, hi) == (lo, hi)
    assert inst.kinds.key_range(None, "rows", -3, 17) == (-3, 17)
    assert inst.kinds.dense_keys(None) is None
    for other in (UsageDistribution(by="tier"), UsageDistributionBrackets(by="instance", strategy="bounded")):
        assert other.kinds.sharded == () and other.kinds.rows == ()

    # finished groups (an instance-bucketed source): rows, and a rest with counts and a sample
    p1, p2 = _partials(inst, cell1, [0, n // 3, n], local_groups=True)
    (r1, k1), (r2, k2) = inst.kinds.split(p1), inst.kinds.split(p2)
    m = inst.kinds.merge_rest(r1, {**r2, "backend": "gpu"})
    assert list(m) == ["backend", "stats", "full", "n", "err_max", "sample"]
    assert m["backend"] == "gpu" and m["full"] is None
    assert type(m["n"]) is int and m["n"] == k1["rows"]["key"].shape[0] + k2["rows"]["key"].shape[0] > 0
    assert type(m["err_max"]) is float and m["err_max"] == max(r1["err_max"], r2["err_max"])
    assert m["sample"].tolist() == [*r1["sample"].tolist(), *r2["sample"].tolist()]
    assert m["stats"].tolist() == (np.asarray(p1["stats"]) + np.asarray(p2["stats"])).tolist()
    whole = inst.kinds.merge(p1, p2)  # finished groups concatenated
    assert whole["done"]["key"].tolist() == [*p1["done"]["key"].tolist(), *p2["done"]["key"].tolist()]

    # open groups (a flat source): the whole partial in ``full``, merged by merge_partials, None
    # (the empty partial's) the identity
    q1, q2 = _partials(inst, cell1, [0, n // 2, n])
    (s1, _), (s2, _), (s0, _) = (inst.kinds.split(q) for q in (q1, q2, inst.empty()))
    assert s0["full"] is None and inst.kinds.merge_rest(s0, s1)["full"] is q1
    assert inst.kinds.merge_rest(s2, s0)["full"] is q2
    got, want = inst.kinds.merge_rest(s1, s2)["full"], merge_partials(q1, q2)
    for x, y in ((got["stats"], want["stats"]), (got["ms"]["exact"]["key"], want["ms"]["exact"]["key"])):
        np.testing.assert_array_equal(x, y)
    for f in want["groups"]:
        np.testing.assert_array_equal(got["groups"][f], want["groups"][f])

    # the first pass: summaries stacked by its own merge
    br = UsageDistributionBrackets(by="tier", strategy="bounded", k=64)
    b1, b2 = _partials(br, cell1, [0, n // 2, n])
    merged = br.kinds.merge(b1, b2)
    assert merged["ms"] is None and [r for r, _ in merged["stack"]] == [2]


def test_empty_partial(cell1):
    """The empty partial is the identity of an open partial's fields (``open_fields``: no mixture
    state, no groups, zero counters), declared as those fields merge in ``merge_partials``."""
    n = cell1["instance_usage"].num_rows
    a = UsageDistribution(by="machine,time", strategy="exact")
    nc = len(a.key_columns()) - 1  # time: one key component, two columns
    e = a.empty()
    assert list(e) == ["backend", "ms", "groups", "stats"] and e["backend"] == "cpu" and e["ms"] is None
    assert e["groups"]["kc"].shape == (0, nc) and e["groups"]["wq"].shape == (0, 20)
    assert e["stats"].dtype == np.int64 and e["stats"].tolist() == [0] * len(STATS)
    q1, q2 = _partials(a, cell1, [0, n // 2, n])
    got, want = open_fields(nc, len(STATS)).merge(q1, q2), merge_partials(q1, q2)
    assert got.keys() == want.keys() and got["backend"] == want["backend"]
    np.testing.assert_array_equal(got["stats"], want["stats"])
    np.testing.assert_array_equal(got["ms"]["exact"]["key"], want["ms"]["exact"]["key"])
    for f in want["groups"]:
        np.testing.assert_array_equal(got["groups"][f], want["groups"][f])
        np.testing.assert_array_equal(merge_partials(e, q1)["groups"][f], q1["groups"][f])


@pytest.mark.parametrize(
    "by,kw",
    [
        (("tier",), dict(partitions=7)),
        (("machine", "time"), dict(cut_points=[3, 40, 41, 150, 233])),
        (("instance",), dict(partitions=2)),
    ],
)
def test_bounded_within_reported_bound(cell1, by, kw):
    k = 64
    levels = (0.0, 0.1, 0.5, 0.9, 0.99, 1.0)  # a few levels: the reference is slow
    a = UsageDistribution(by=by, bucket_s=1800, strategy="bounded", k=k, levels=levels)
    src = TableSource(cell1)
    res = engine.run(src, [a], **kw)[a.name]
    groups, _ = expected_groups(cell1, by, bucket_s=1800)
    check_against_reference(res, groups, by, list(levels), bounded=True)
    q = res["quantiles"]
    n_parts = kw.get("partitions", len(kw.get("cut_points", [])) + 1)
    eb = q.loc[q["weight"] > 0, "cdf_error_bound"]
    assert (eb <= (1 + n_parts) / k + 1e-12).all()  # local engine: a left fold, depth <= partitions
    info = res["info"].iloc[0]
    assert info["strategy"] == "bounded" and info["k"] == k and info["max_cdf_error_bound"] == eb.max()
    # one partition: a leaf, bound exactly 1/K; weights, means and counts identical to exact
    one = engine.run(src, [a])[a.name]["quantiles"]
    # (spilling counts windows with positive weight; n_windows also counts weightless ones)
    small = one["n_windows"] <= spill_threshold(k)
    assert (one.loc[small, "cdf_error_bound"] == 0).all()
    assert one["cdf_error_bound"].isin([0.0, 1 / k]).all() and (one["cdf_error_bound"] > 0).sum() > 3
    assert (q["cdf_error_bound"] > 0).sum() > 3
    ex = engine.run(src, [UsageDistribution(by=by, bucket_s=1800, strategy="exact", levels=levels)])[a.name][
        "quantiles"
    ]
    assert ex["n_windows"].tolist() == q["n_windows"].tolist()
    np.testing.assert_allclose(ex[["weight", "mean"]].to_numpy(), q[["weight", "mean"]].to_numpy(), rtol=1e-12)


def test_auto_strategy_budget(cell1):
    src = TableSource(cell1)
    n = cell1["instance_usage"].num_rows
    for budget, want in ((n, "exact"), (n - 1, "exact-two-pass")):
        a = UsageDistribution(exact_max_windows=budget)
        info = engine.run(src, [a], partitions=3)[a.name]["info"].iloc[0]
        assert info["strategy"] == want and info["strategy_option"] == "auto" and info["total_rows"] == n


def test_auto_row_limit_of_the_exact_strategy_follows_the_grouping():
    # by tier / cell a group's windows are inverted at once on one core: past 2e6 rows exact is no
    # faster than two passes and holds twice their memory; with many groups the limit is 5e6 rows
    from gpuclust.analyses import usage_distribution as ud

    class Rows:
        def __init__(self, n: int) -> None:
            self.n = n

        def num_rows(self, table: str) -> int:
            return self.n

    few, many = ud.EXACT_MAX_WINDOWS
    assert (few, many) == (2_000_000, 5_000_000)
    for by, limit in (("tier", few), ("cell", few), ("tier,cell", few), ("machine", many), ("tier,time", many)):
        a = UsageDistribution(by=by)
        assert a.exact_max_windows == -1 and a.exact_rows_limit == limit
        assert a.resolved_strategy(Rows(limit)) == "exact" and not a.prerequisites(Rows(limit))
        assert a.resolved_strategy(Rows(limit + 1)) == "exact-two-pass" and a.prerequisites(Rows(limit + 1))
        assert UsageDistribution(by=by, exact_max_windows=3).exact_rows_limit == 3  # the option, given, decides
        assert UsageDistribution(by=by, exact_max_windows=0).resolved_strategy(Rows(1)) == "exact-two-pass"
    with pytest.raises(ValueError, match="exact_max_windows"):
        UsageDistribution(exact_max_windows=-2)


def test_auto_keeps_the_exact_strategy_within_the_run_memory_budget(cell1):
    # exact peaks at about exact_bytes_per_row a row: under a smaller --memory-limit, auto takes
    # the passes whose memory does not grow with the windows, for the same tables
    from gpuclust._memory import memory_budget, run_memory
    from gpuclust.analyses import usage_distribution as ud

    src = TableSource(cell1)
    n = cell1["instance_usage"].num_rows
    assert UsageDistribution(by="tier").exact_bytes_per_row == UsageDistribution(by="cell").exact_bytes_per_row
    assert UsageDistribution(by="tier").exact_bytes_per_row == ud.EXACT_BYTES_PER_ROW[0]
    assert UsageDistribution(by="tier,time").exact_bytes_per_row == ud.EXACT_BYTES_PER_ROW[1]
    a = UsageDistribution(by=("tier", "time"), bucket_s=1800)
    per = a.exact_bytes_per_row
    assert memory_budget() is None and a.resolved_strategy(src) == "exact"  # outside a run: the rows decide
    for limit, want in ((n * per, "exact"), (n * per - 1, "exact-two-pass")):
        with run_memory(limit):
            assert a.resolved_strategy(src) == want and bool(a.prerequisites(src)) == (want != "exact")
        got = engine.run(src, [a], partitions=3, memory_limit=limit)[a.name]
        assert got["info"]["strategy"].iloc[0] == want and memory_budget() is None
    want = engine.run(src, [a], partitions=3)[a.name]
    _assert_same({**got, "info": want["info"]}, want, rtol_q=1e-9)  # the tables; info says the strategy
    assert UsageDistribution(exact_max_windows=n - 1).resolved_strategy(src) == "exact-two-pass"  # either rule


# --------------------------------------------------------------------------------------------
# inputs without percentiles, options
# --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("by", [("tier",), ("instance", "time")])
def test_v2_like_input_is_skipped_and_counted(by):
    t = make_cell(3, percentiles=False)
    a = UsageDistribution(by=by)
    res = engine.run(TableSource(t), [a], partitions=3)[a.name]
    assert len(res["quantiles"]) == 0 and len(res["naive"]) == 0
    assert list(res["quantiles"].columns)[-1] == "q100"
    info = res["info"].iloc[0]
    _, counts = expected_groups(t, by)
    assert info["used_windows"] == 0 and info["groups"] == 0
    assert info["skipped_no_percentiles"] == counts["skipped_no_percentiles"] > 0
    assert (
        info["skipped_no_percentiles"] + info["alloc_task_windows"] + info["bad_time_windows"]
        == info["windows_read"]
        == t["instance_usage"].num_rows
    )
    assert "0 groups" in a.summary(res)


def test_options():
    a = create("usage-distribution", by="tier,time", bucket_s=900, levels="0.99,0.5")
    assert a.by == ("tier", "time") and a.levels == (0.5, 0.99)
    assert a.label == "usage-distribution[by=tier+time,bucket_s=900,levels=0.5+0.99]"
    assert a.key_columns() == ["tier", "bucket", "bucket_start_us"]
    assert UsageDistribution().resolved_rows() == "top-level"
    assert UsageDistribution(by="collection").resolved_rows() == "all"
    assert UsageDistribution(by="instance,machine").resolved_rows() == "all"
    assert level_name(0.005) == "q0.5" and level_name(0.91) == "q91" and level_name(1.0) == "q100"
    assert hash(a) == hash(create("usage-distribution", by=["tier", "time"], bucket_s=900, levels=[0.5, 0.99]))
    for bad in (
        dict(by="tier,nope"),
        dict(by=""),
        dict(by="tier,tier"),
        dict(by="instance,collection"),
        dict(levels=[0.5, 1.5]),
        dict(rows="some"),
        dict(strategy="fast"),
        dict(bucket_s=0),
        dict(k=0),
        dict(tier_map="nope"),
    ):
        with pytest.raises(ValueError):
            UsageDistribution(**bad)


# --------------------------------------------------------------------------------------------
# GPU parity: on the gpu (marked ``gpu`` by the backend fixture), else on the device-shaped backend
# --------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "strategy", ["exact", "bounded", "exact-two-pass", "exact-two-pass+refine", "exact-two-pass+slices"]
)
def test_backend_parity(cell1, backend, strategy, monkeypatch):
    # bracket_k=8 (exact-two-pass): wide first-pass brackets, many pieces, resolved on the backend;
    # +refine: a refinement pass's sub-bins on the backend first (it cuts, whatever the pieces);
    # +slices: by collection, its first pass in three slices of the collections
    from gpuclust.analyses import _usage_distribution_refine as rf

    monkeypatch.setattr(rf, "PIECE_BUDGET", 0)
    strategy, _, more = strategy.partition("+")
    by = ("collection", "time") if more == "slices" else ("tier", "time")
    a = UsageDistribution(
        by=by, bucket_s=1800, strategy=strategy, k=128, bracket_k=8, refine=int(more == "refine"), slices=3
    )
    src = TableSource(cell1)
    cpu = engine.run(src, [a], backend="cpu", partitions=3)[a.name]
    if backend.name == "cpu":  # the device-shaped backend under the gpu's name: a run on a device
        from device_backend import DEVICE_GPU, resolve_gpu_to_device

        resolve_gpu_to_device(monkeypatch)
        backend = DEVICE_GPU
    got = engine.run(src, [a], backend=backend, partitions=3)[a.name]
    assert got["info"]["exact_max_windows"].tolist() == [-1]  # (no row limit on a device)
    if strategy == "bounded":
        _assert_bounded_alike(got, cpu, cell1, by, k=128, partitions=3)
    else:
        _assert_same(got, cpu, rtol_q=1e-9)


def _assert_bounded_alike(got, want, cell, by, *, k, partitions):
    """A bounded run on another backend: the same groups, counts, weights and means; quantiles
    within the bound each reports (against the exact mixture), bounds within the merge depth's,
    and most quantiles as the other's.  Not bit for bit: a sum in another order moves a knot at a
    gap of a group's CDF (where its level is reached within rounding) across the gap, and the
    merges after it re-tabulate another piecewise-linear CDF (an H200 run: 5 of 68 bounds off by
    up to 24%, the device's per-key weights summed by its warp kernel)."""
    q, w = got["quantiles"], want["quantiles"]
    qcols = [c for c in q.columns if c.startswith("q")]
    loose = {"quantiles": qcols + ["cdf_error_bound"], "info": ["max_cdf_error_bound"], "naive": []}
    _assert_same({n: got[n].drop(columns=loose[n]) for n in loose}, {n: want[n].drop(columns=loose[n]) for n in loose})
    groups, _ = expected_groups(cell, by, bucket_s=1800)
    check_against_reference(got, groups, by, list(STD), bounded=True)
    eb = q.loc[q["weight"] > 0, "cdf_error_bound"]
    assert (eb <= (1 + partitions) / k + 1e-12).all() and (eb > 1 / k).sum() > 3  # small groups: exact
    same = np.isclose(q[qcols].to_numpy(), w[qcols].to_numpy(), rtol=1e-9, atol=0.0, equal_nan=True)
    assert same.mean() > 0.9, same.mean()


# --------------------------------------------------------------------------------------------
# a small synthetic cell
# --------------------------------------------------------------------------------------------
@pytest.fixture(scope="session")
def synth_cell(tmp_path_factory):
    from gpuclust.synth import SynthConfig, synthesize

    root = tmp_path_factory.mktemp("ud_synth")
    synthesize(SynthConfig(machines=25, hours=1.5, seed=5), root / "raw", dataset=root / "ds", progress=None)
    return root / "ds"


def test_synth_tier_means(synth_cell, tmp_path):
    import pandas as pd

    from gpuclust.dataset import Dataset

    a = UsageDistribution(by="tier")
    res = analyze(synth_cell, [a], out=tmp_path / "out", partitions=3)[a.name]
    q = res["quantiles"].set_index("tier")
    # independent pandas: top-level rows, tier = notebook map of MAX(priority) per (c, i, m) over
    # all events (no event row -> unknown), window mean = trapezoid of the running-max-repaired
    # vector, weight = duration_s x sample_rate (duration_s when the rate is missing or 0)
    ds = Dataset(synth_cell)
    u = ds.read("instance_usage").to_pandas()
    ev = ds.read("instance_events", ["collection_id", "instance_index", "machine_id", "priority"]).to_pandas()
    pr = ev.dropna(subset=["machine_id"]).groupby(["collection_id", "instance_index", "machine_id"])["priority"].max()
    u = u[u["alloc_collection_id"].fillna(0) == 0]
    qv = np.maximum.accumulate(u[SORTED_COLS].to_numpy(np.float64), axis=1)
    ok = np.isfinite(qv).all(axis=1)
    lv = np.asarray(STD)
    wmean = ((lv[1:] - lv[:-1]) * (qv[:, 1:] + qv[:, :-1]) / 2).sum(axis=1)
    dur = (u["end_time"] - u["start_time"]).to_numpy() / 1e6
    rate = u["sample_rate"].to_numpy(np.float64)
    w = np.where(np.isfinite(rate) & (rate > 0), dur * rate, dur)
    key = pd.MultiIndex.from_frame(u[["collection_id", "instance_index", "machine_id"]].astype("int64"))
    p = pr.reindex(key).to_numpy(np.float64)
    tier = np.array([notebook_tier(None if np.isnan(x) else x) for x in p], dtype=object)
    df = pd.DataFrame({"tier": tier, "w": w, "wm": w * wmean, "wa": w * u["avg_cpu"].to_numpy(np.float64)})[ok]
    g = df.groupby("tier")[["w", "wm", "wa"]].sum()
    assert set(g.index) == set(q.index)
    np.testing.assert_allclose(q.loc[g.index, "weight"], g["w"], rtol=1e-12)
    np.testing.assert_allclose(q.loc[g.index, "mean"], g["wm"] / g["w"], rtol=1e-9)
    # how close the piecewise-linear mixture mean is to the sample-weighted mean of avg_cpu
    rel = (q.loc[g.index, "mean"] / (g["wa"] / g["w"]) - 1).abs()
    print("mixture mean vs sample-weighted avg_cpu, relative difference per tier:", rel.round(4).to_dict())
    assert (rel < 0.1).all()
    # report: the summary names the analysis, the plot exists
    text = (tmp_path / "out" / "summary.txt").read_text()
    assert "usage-distribution" in text and "strategy exact" in text
    assert (tmp_path / "out" / a.name / f"{a.name}.png").stat().st_size > 1000
    assert (tmp_path / "out" / a.name / "quantiles.parquet").exists()


def test_bounded_strategy_keeps_small_groups_exact_and_spills_big_ones():
    from gpuclust.analyses import _hybrid_summary as hs

    rng = np.random.default_rng(11)
    k = 64
    q = np.sort(rng.gamma(0.7, 1.0, (44, 20)), axis=1)
    w = rng.choice([300.0, 30.0, 0.0], 44)
    w[[0, 1, 2, 40]] = 300.0  # group 1 has weight on both sides
    keys = np.array([1] * 41 + [2, 2, 3], dtype=np.int64)
    a_rows, b_rows = np.r_[0:40, 41], np.r_[40, 42, 43]  # group 1: 40 + 1 windows; group 2: 1 + 1
    a = hs.leaf(q[a_rows], w[a_rows], keys[a_rows], k)
    b = hs.leaf(q[b_rows], w[b_rows], keys[b_rows], k)
    assert a["bounded"]["key"].tolist() == [1] and a["exact"]["key"].tolist() == [2]
    assert b["bounded"]["key"].tolist() == [] and b["exact"]["key"].tolist() == [1, 2, 3]
    lv = np.asarray(STD)
    for m in (hs.merge(a, b), hs.merge(b, a), hs.merge(hs.merge(a, hs.empty(k)), b)):
        assert m["bounded"]["key"].tolist() == [1] and m["exact"]["key"].tolist() == [2, 3]
        r = hs.finalize(m, lv)
        assert r["key"].tolist() == [1, 2, 3]
        for i, g in enumerate((1, 2, 3)):
            sel = keys == g
            eps = r["err_bound"][i]
            assert eps == 0.0 if g != 1 else 1 / k < eps <= 2 / k
            assert r["weight"][i] == pytest.approx(w[sel].sum(), rel=1e-12)
            if g == 1:
                lo = ref.group_quantiles(q[sel], w[sel], np.clip(lv - eps - 1e-9, 0, 1))
                hi = ref.group_quantiles(q[sel], w[sel], np.clip(lv + eps + 1e-9, 0, 1))
                assert np.all(r["quantiles"][i] >= lo - 1e-9 * lo) and np.all(r["quantiles"][i] <= hi + 1e-9 * hi)
            elif w[sel].sum() > 0:
                want = ref.group_quantiles(q[sel], w[sel], lv)
                for j, p in enumerate(lv):
                    assert ref.quantile_ok(r["quantiles"][i, j], want[j], q[sel], w[sel], float(p))


@pytest.mark.parametrize("opts", [{"by": "tier"}, {"by": "machine"}, {"by": "tier", "strategy": "bounded"}])
def test_mixture_finalize_on_the_device_shaped_backend(opts, monkeypatch):
    """The finalize a gpu run does on the device (the merged partial moved there, the mixture
    inverted there): on the device-shaped backend (tests/device_backend.py: arrays that refuse
    host operands and implicit conversion, as CuPy's do) the cpu's result."""
    from device_backend import DEVICE, resolve_gpu_to_device

    from gpuclust.analyses import _hybrid_summary as hs
    from gpuclust.analyses.base import to_host
    from gpuclust.backends import get_backend
    from gpuclust.engine.local import context_of
    from gpuclust.engine.partition import column_to_numpy

    resolve_gpu_to_device(monkeypatch)
    tables = make_cell(5, n_windows=3000, n_instances=200, n_machines=20)
    a = create("usage-distribution", **opts)
    ctx = context_of(a, TableSource(tables))
    t = tables[a.table]
    mp = to_host(a.partial({c: column_to_numpy(t.column(c)) for c in a.columns}, ctx, get_backend("cpu")))["ms"]
    want = hs.finalize(mp, ctx.levels)
    got = to_host(hs.finalize(hs.to_backend(mp, DEVICE), ctx.levels))
    assert set(got) == set(want) and len(want["key"]) > 1
    for k, w in want.items():
        np.testing.assert_allclose(got[k], w, rtol=1e-12, equal_nan=True, err_msg=k)
