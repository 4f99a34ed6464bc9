"""``usage-distribution``'s refinement passes (``exact-two-pass`` with ``refine`` >= 1): the same
tables as one-pass ``exact``; refined brackets that hold the exact quantile, lie inside the ones
they refine, and leave the exact pass far fewer pieces; sub-bin masses equal to a slow reference;
``refine`` = -1 plans passes as the rows grow, and a pass cuts only while the pieces it is
estimated to leave pass the budget (here 0, so that every pass cuts, unless a test says otherwise).
"""

from __future__ import annotations

from fractions import Fraction
from pathlib import Path

import by_path
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from strategies import examples

import gpuclust.engine as engine
from gpuclust.analyses import _hybrid_summary as hs
from gpuclust.analyses import _usage_distribution_refine as rf
from gpuclust.analyses import _usage_distribution_two_pass as tp
from gpuclust.analyses import mixture_summary as ms
from gpuclust.analyses.usage_distribution import (
    UsageDistribution,
    UsageDistributionBrackets,
    UsageDistributionRefine,
)
from gpuclust.backends import get_backend
from gpuclust.engine import TableSource

CPU = get_backend("cpu")
_two = by_path.load("gpuclust_test_ud_two_pass", Path(__file__).with_name("test_usage_distribution_two_pass.py"))
make_cell, assert_same, pool_cell, merged_partial = (
    _two.make_cell,
    _two.assert_same,
    _two.pool_cell,
    _two._merged_partial,
)
mix_ref = _two.mix_ref


@pytest.fixture(autouse=True)
def every_pass_cuts(monkeypatch):
    monkeypatch.setattr(rf, "PIECE_BUDGET", 0)


@pytest.fixture(scope="module")
def cell():
    return make_cell(2, n_windows=400, n_instances=40)


def _run(src, a, **kw):
    return engine.run(src, [a], **kw)[a.name]


@pytest.mark.parametrize("by", [("machine",), ("tier",), ("machine", "time")])
def test_refined_runs_equal_exact(cell, by):
    src = TableSource(cell)
    exact = _run(src, UsageDistribution(by=by, bucket_s=1800, strategy="exact"), partitions=3)
    for refine, k, kw in ((1, 8, dict(partitions=5)), (2, 64, dict(partitions=4, scheduler="threads", split_every=2))):
        a = UsageDistribution(by=by, bucket_s=1800, strategy="exact-two-pass", bracket_k=k, refine=refine)
        got = _run(src, a, **kw)
        assert_same(got, exact)
        info = got["info"].iloc[0]
        assert info["strategy"] == "exact-two-pass" and info["refine"] == refine and info["k"] == k


def test_the_passes_chain_as_prerequisites(cell):
    src = TableSource(cell)
    a = UsageDistribution(by="machine", strategy="exact-two-pass", refine=2)
    chain = []
    p = a
    while (pre := p.prerequisites(src)) != {}:
        (p,) = pre.values()
        chain.append(p)
    assert [type(p) for p in chain] == [UsageDistributionRefine, UsageDistributionRefine, UsageDistributionBrackets]
    assert [p.refine for p in chain[:2]] == [2, 1] and chain[2].strategy == "bounded"
    assert chain[2].k == a.first_pass_k == UsageDistribution(by="machine").first_pass_k
    assert not UsageDistribution(by="machine", strategy="exact").prerequisites(src)


def test_auto_plans_refinement_passes_as_the_rows_grow(cell, monkeypatch):
    src = TableSource(cell)
    n = cell["instance_usage"].num_rows
    a = UsageDistribution(by="machine", exact_max_windows=0)
    monkeypatch.setattr(rf, "PIECE_BUDGET", 1 << 22)
    assert a.refine_passes(src) == 0  # a small table: the exact pass's pieces are few
    # the estimate: rows x levels x 200 / bracket_k pieces, cut 32-fold a pass, within the budget
    est = n * 20 * rf.PIECES_PER_WINDOW_LEVEL_K / a.first_pass_k
    monkeypatch.setattr(rf, "PIECE_BUDGET", est / (rf.ASSUMED_CUT + 8))
    assert a.refine_passes(src) == 2
    assert rf.rounds_for(10**9, 20, 4096) > rf.rounds_for(10**7, 20, 4096) >= 1
    got = _run(src, a, partitions=3)
    assert got["info"]["refine"].iloc[0] <= 2  # the passes that cut
    assert_same(got, _run(src, UsageDistribution(by="machine", strategy="exact"), partitions=2))


def test_a_pass_cuts_only_while_its_brackets_promise_too_many_pieces(monkeypatch):
    """The first pass estimates the exact pass's pieces, a cutting pass bounds them (the window
    knots left inside, at least the pieces); a pass whose brackets promise no more than the budget
    leaves them as they are (and does not compute), and the run is still exact."""
    tables = pool_cell(3000, seed=12)
    src = TableSource(tables)
    first = _run(src, UsageDistributionBrackets(by="machine", strategy="bounded", k=256), partitions=3)["brackets"]
    est0 = tp.estimate_of_table(first, 20).sum()
    pieces = {}
    tables_of = {}
    for r in (0, 1):
        a = UsageDistribution(by="machine", strategy="exact-two-pass", bracket_k=256, refine=r)
        pieces[r] = int(merged_partial(a, tables, 3)["tp"]["state"]["p_pid"].shape[0])
        if r:
            one = UsageDistributionRefine(by="machine", strategy="exact-two-pass", bracket_k=256, refine=1)
            tables_of[r] = _run(src, one, partitions=3)["brackets"]
    est1 = tp.estimate_of_table(tables_of[1], 20).sum()
    assert pieces[1] <= est1 < est0 and pieces[1] * 10 <= pieces[0]
    assert tp.cuts_of_table(first) == 0 and tp.cuts_of_table(tables_of[1]) == 1
    monkeypatch.setattr(rf, "PIECE_BUDGET", est0)  # the first pass's brackets already do
    a = UsageDistribution(by="machine", strategy="exact-two-pass", bracket_k=256, refine=2)
    assert int(merged_partial(a, tables, 3)["tp"]["state"]["p_pid"].shape[0]) == pieces[0]
    got = _run(src, a, partitions=3)
    assert got["info"]["refine"].iloc[0] == 0
    assert_same(got, _run(src, UsageDistribution(by="machine", strategy="exact"), partitions=2))


def test_a_refinement_pass_cuts_the_pieces_of_the_exact_pass():
    """By machine at the default ``bracket_k``: one refinement pass leaves the exact pass at least
    20 times fewer pieces, every refined bracket inside the one it refines and holding the exact
    quantile."""
    tables = pool_cell(4000, seed=11)
    src = TableSource(tables)
    pieces = {}
    for r in (0, 1):
        a = UsageDistribution(by="machine", strategy="exact-two-pass", refine=r)
        pieces[r] = int(merged_partial(a, tables, 3)["tp"]["state"]["p_pid"].shape[0])
    assert pieces[1] * 20 <= pieces[0], pieces
    first = _run(src, UsageDistributionBrackets(by="machine", strategy="bounded", k=4096), partitions=3)["brackets"]
    refined = _run(src, UsageDistributionRefine(by="machine", strategy="exact-two-pass", refine=1), partitions=3)
    exact = _run(src, UsageDistribution(by="machine", strategy="exact"), partitions=1)["quantiles"]
    L = 20
    k0, lo0, hi0 = tp.brackets_of_table(first, L)
    k1, lo1, hi1 = tp.brackets_of_table(refined["brackets"], L)
    assert k0.tolist() == k1.tolist() and len(k0) == 3
    assert (lo1 >= lo0).all() and (hi1 <= hi0).all() and (lo1 <= hi1).all()
    q = exact[[c for c in exact.columns if c.startswith("q")]].to_numpy()
    assert (lo1 <= q * (1 + 1e-12)).all() and (q <= hi1 * (1 + 1e-12)).all()
    assert np.median((hi1 - lo1)[hi0 > lo0] / (hi0 - lo0)[hi0 > lo0]) <= 1 / 64


# --------------------------------------------------------------------------------------------
# the refinement math alone
# --------------------------------------------------------------------------------------------
def _slow_bins(pieces, lo, hi, S):
    """Sub-bin masses by plain Python over exact fractions: a point mass in the sub-bin
    ``(x_{k-1}, x_k]`` holding it, a segment's mass spread over its overlap with each (the edges
    ``x_k`` are the floats the module defines)."""
    grid = [lo + k * ((hi - lo) / S) for k in range(S)] + [hi]
    out = [Fraction(0)] * S
    for a, b, m in pieces:
        if a == b:
            k = next(k for k in range(1, S + 1) if grid[k - 1] < a <= grid[k])
            out[k - 1] += Fraction(m)
            continue
        for k in range(1, S + 1):
            ov = min(Fraction(b), Fraction(grid[k])) - max(Fraction(a), Fraction(grid[k - 1]))
            if ov > 0:
                out[k - 1] += Fraction(m) * ov / (Fraction(b) - Fraction(a))
    return np.array([float(v) for v in out])


@settings(max_examples=examples(40), deadline=None)
@given(seed=st.integers(0, 2**32 - 1), S=st.sampled_from([1, 2, 7, 64]), n=st.integers(1, 40))
def test_sub_bin_masses_equal_a_slow_reference(seed, S, n):
    rng = np.random.default_rng(seed)
    lo, hi = sorted(rng.gamma(1.0, 1.0, 2) * 10.0 ** rng.integers(-3, 3))
    hi = hi if hi > lo else lo + 1.0
    grid = [lo + k * ((hi - lo) / S) for k in range(S)] + [hi]
    ends = np.concatenate([rng.uniform(lo, hi, 2 * n), rng.choice(grid, 2 * n)])  # some on sub-bin edges
    a, b = np.sort(rng.choice(ends, (n, 2)), axis=1).T
    point = rng.random(n) < 0.3
    b = np.where(point, a, b)
    a = np.where(point & ((a <= lo) | (a >= hi)), (lo + hi) / 2, a)  # point masses strictly inside
    b = np.where(point, a, b)
    keep = point | (a < b)
    a, b, m = a[keep], b[keep], rng.random(int(keep.sum())) + 0.1
    if not a.shape[0]:
        return
    run = np.zeros(a.shape[0], np.int64)
    masses, ends = rf._bin_masses(np, run, a, b, m, np.array([lo]), np.array([hi]), S)
    got = masses[0]
    want = _slow_bins(list(zip(a, b, m, strict=True)), lo, hi, S)
    np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-12 * m.sum())
    assert abs(got.sum() - m.sum()) <= 1e-12 * m.sum()
    # the window knots: a segment's start above lo in the sub-bin it opens [x_{k-1}, x_k), its end
    # below hi in the one it closes (x_{k-1}, x_k]; a point mass's two in (x_{k-1}, x_k]
    g = np.asarray(grid)

    def sub_bin(x, closed_right):  # 1..S
        return min(max(int(np.searchsorted(g, x, side="left" if closed_right else "right")), 1), S)

    want_ends = np.zeros(S)
    for x, y in zip(a, b, strict=True):
        if x == y:
            want_ends[sub_bin(x, True) - 1] += 2
            continue
        if x > lo:
            want_ends[sub_bin(x, False) - 1] += 1
        if y < hi:
            want_ends[sub_bin(y, True) - 1] += 1
    np.testing.assert_array_equal(ends[0], want_ends)


@settings(max_examples=examples(25), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    seed=st.integers(0, 2**32 - 1),
    k=st.sampled_from([2, 5, 16, 64]),
    S=st.sampled_from([2, 8, 64]),
    n=st.integers(1, 120),
    parts=st.integers(1, 4),
)
def test_refined_brackets_hold_the_exact_quantile(seed, k, S, n, parts):
    """Groups with point masses (at 0, inside, one-point windows), float32 values that recur and
    weights over nine orders of magnitude: each refined bracket lies inside its first-pass one and
    holds the exact quantile, and the exact pass on it gives the exact quantiles."""
    rng = np.random.default_rng(seed)
    q = np.sort(rng.gamma(0.7, 1.0, (n, 20)), axis=1) * np.exp(rng.normal(0, 2, n))[:, None]
    q[rng.random(n) < 0.3, :7] = 0.0
    one = rng.random(n) < 0.1
    q[one] = q[one, :1]
    q[:, 12:15] = np.where(rng.random((n, 1)) < 0.2, q[:, 12:13], q[:, 12:15])
    q = np.maximum.accumulate(q.astype(np.float32).astype(np.float64), axis=1)
    w = rng.choice([300.0, 30.0, 0.0, 1e-3, 7e5], n)
    keys = rng.integers(0, 4, n).astype(np.int64) * (2**40 + 1)
    lv = np.array([0.0, 0.005, 0.25, 0.5, 0.9, 0.99, 1.0])
    pieces = np.split(np.arange(n), np.sort(rng.integers(0, n + 1, parts - 1)))
    sorted_parts = [r[np.argsort(keys[r], kind="stable")] for r in pieces]
    h = hs.empty(k)
    for o in sorted_parts:
        h = hs.merge(h, hs.leaf(q[o], w[o], keys[o], k, repaired=True))
    br = tp.brackets(h, lv)
    state = rf.empty_state(np, S)
    for o in sorted_parts:
        state = rf.merge_state(state, rf.refine_partial(np, CPU.ops, q[o], w[o], keys[o], br, S))
    ref = rf.refine(state, br, lv)
    lo, hi = ref["lo"], ref["hi"]
    nan = np.isnan(br["lo"])  # groups without weight
    assert (np.isnan(lo) == nan).all() and (lo[~nan] >= br["lo"][~nan]).all() and (hi[~nan] <= br["hi"][~nan]).all()
    closed = ~(br["lo"] < br["hi"])
    np.testing.assert_array_equal(lo[closed], br["lo"][closed])
    np.testing.assert_array_equal(hi[closed], br["hi"][closed])
    want = ms.finalize(ms.exact_partial(q, w, keys), lv)
    exact = want["quantiles"]
    has = np.isfinite(exact)
    assert (lo[has] <= exact[has]).all() and (exact[has] <= hi[has]).all()
    br1 = {"key": br["key"], "lo": lo, "hi": hi}
    st2 = tp.empty_state()
    for o in sorted_parts:
        st2 = tp.merge_state(st2, tp.second_partial(np, CPU.ops, q[o], w[o], keys[o], br1))
    # a cut bracket's estimate bounds the exact pass's pieces in it
    cut = (br["lo"] < br["hi"]) & rf._cuttable(np, br["lo"], br["hi"], S)
    per_pair = np.bincount(st2["p_pid"], minlength=lo.size).reshape(lo.shape)
    assert (per_pair[cut] <= ref["est"][cut]).all()
    got = tp.resolve(st2, br1, lv, CPU)
    close = np.isclose(got, exact, rtol=1e-9, atol=1e-300, equal_nan=True)
    for gi, li in zip(*np.nonzero(~close), strict=True):  # ill-conditioned: a level within 1e-12 of p
        sel = keys == want["key"][gi]
        x = got[gi, li : li + 1]
        f, fl = (float(mix_ref.mixture_cdf_np(q[sel], w[sel], x, left=left)[0]) for left in (False, True))
        assert f >= lv[li] - 1e-12 and fl <= lv[li] + 1e-12, (gi, lv[li], got[gi, li], exact[gi, li])


@pytest.mark.parametrize("backend_name", ["generic", "device"])
def test_refinement_on_the_gpu_shaped_backends(cell, backend_name, monkeypatch):
    from device_backend import DEVICE, resolve_gpu_to_device
    from generic_backend import GENERIC

    be = {"generic": GENERIC, "device": DEVICE}[backend_name]
    if be is DEVICE:
        resolve_gpu_to_device(monkeypatch)
    src = TableSource(cell)
    a = UsageDistribution(by=("machine", "time"), bucket_s=1800, strategy="exact-two-pass", bracket_k=8, refine=1)
    assert_same(_run(src, a, partitions=3, backend=be), _run(src, a, partitions=3))


@pytest.mark.parametrize("scale", [1e-45, 1e-300, 1e300])
def test_refinement_at_the_ends_of_the_float_range(scale):
    """Values at float32's smallest (the trace's percentiles are float32) and near float64's
    smallest normal and largest numbers: the refined brackets hold the exact quantile, the exact
    pass on them gives it."""
    rng = np.random.default_rng(4)
    n = 200
    q = np.sort(rng.gamma(0.7, 1.0, (n, 20)), axis=1) * scale
    q[:40, :5] = 0.0
    w, keys = rng.random(n) + 0.1, np.repeat(np.arange(2, dtype=np.int64), n // 2)
    lv = np.array([0.0, 0.25, 0.5, 0.9, 1.0])
    br = tp.brackets(hs.leaf(q, w, keys, 8, repaired=True), lv)
    assert (br["lo"] < br["hi"]).any()
    lo, hi = (rf.refine(rf.refine_partial(np, CPU.ops, q, w, keys, br, 64), br, lv)[f] for f in ("lo", "hi"))
    exact = ms.finalize(ms.exact_partial(q, w, keys), lv)["quantiles"]
    assert ((lo <= exact) & (exact <= hi)).all()
    br1 = {"key": br["key"], "lo": lo, "hi": hi}
    got = tp.resolve(tp.second_partial(np, CPU.ops, q, w, keys, br1), br1, lv, CPU)
    np.testing.assert_allclose(got, exact, rtol=1e-9, atol=0)


def test_a_study_runs_the_passes_resident_and_out_of_core(tmp_path):
    """A study (what a gpu node runs) runs the chain of passes on its resident partitions, and
    with an eighth of the memory on partitions it streams: the tables of a plain run."""
    from strategies import write_dataset

    import gpuclust

    ds = write_dataset(tmp_path, make_cell(6, n_windows=3000, n_instances=150), files=2, row_group_size=250)
    a = UsageDistribution(by="machine", strategy="exact-two-pass", bracket_k=16, refine=2)
    want = _run(ds, a, partitions=8)
    assert want["info"]["refine"].iloc[0] == 2
    with gpuclust.open(ds, partitions=8, workers=1).persist() as study:
        assert not study.streamed_partitions
        got = study.run([a])[a.name]
        data = study.resident_bytes
    assert_same(got, want)
    with gpuclust.open(ds, partitions=8, workers=1, memory_budget=data // 8).persist() as study:
        assert study.streamed_partitions["instance_usage"] >= 6
        assert_same(study.run([a])[a.name], want)


def test_the_sub_bins_fit_the_state_budget():
    """At most MAX_BINS sub-bins a pair, all pairs' within STATE_BYTES; a pass that would get fewer
    than MIN_BINS, or whose brackets already promise few pieces, does not cut."""
    assert rf.bins_for(10, 1e9) == rf.MAX_BINS
    S = rf.bins_for(65_536, 1e9)
    assert rf.MIN_BINS <= S < rf.MAX_BINS and 16 * S * 65_536 <= rf.STATE_BYTES
    assert rf.bins_for(4_000_000, 1e9) == 0  # 4 sub-bins a pair: no cut
    assert rf.bins_for(10, float(rf.PIECE_BUDGET)) == 0
