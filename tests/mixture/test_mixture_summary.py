"""The mergeable summaries of ``gpuclust.analyses.mixture_summary``: the exact strategy is
independent of partitioning and merge order; the bounded strategy keeps its proven Kolmogorov
bound (tracked per group, and at most ``(1 + merge depth) / K``) on random and adversarial
partitionings."""

from __future__ import annotations

import gpuclust_mixture_reference as ref
import gpuclust_mixture_strategies as strat
import numpy as np
import pytest
from device_backend import DEVICE, DeviceArray, resolve_gpu_to_device
from hypothesis import given, settings
from hypothesis import strategies as st
from strategies import examples

from gpuclust.analyses import mixture_summary as ms
from gpuclust.analyses.base import to_host
from gpuclust.backends import mixture_cpu as mx

STD = np.asarray(mx.SOURCE_LEVELS)
LEVELS = np.concatenate([STD, [0.01, 0.333, 0.5, 0.999]])


# --------------------------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------------------------
def split(n: int, cuts: list[int]) -> list[np.ndarray]:
    edges = [0, *sorted(set(min(max(c, 0), n) for c in cuts)), n]
    return [np.arange(a, b) for a, b in zip(edges[:-1], edges[1:], strict=False)]


def merge_tree(parts: list[dict], shape: str, rng: np.random.Generator) -> tuple[dict, int]:
    """Merge ``parts`` as a chain, a balanced tree or a random tree; returns (root, depth)."""
    items = [(p, 0) for p in parts]
    if shape == "chain":
        acc, d = items[0]
        for p, _ in items[1:]:
            acc, d = ms.merge(acc, p), d + 1
        return acc, d
    while len(items) > 1:
        if shape == "balanced":
            nxt = []
            for i in range(0, len(items) - 1, 2):
                (a, da), (b, db) = items[i], items[i + 1]
                nxt.append((ms.merge(a, b), 1 + max(da, db)))
            if len(items) % 2:
                nxt.append(items[-1])
            items = nxt
        else:
            i, j = sorted(rng.choice(len(items), 2, replace=False))
            (b, db), (a, da) = items.pop(j), items.pop(i)
            items.append((ms.merge(a, b) if rng.random() < 0.5 else ms.merge(b, a), 1 + max(da, db)))
    return items[0]


def synthetic(n: int, seed: int, n_keys: int = 6) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    q = np.sort(rng.gamma(0.6, 0.1, (n, 20)), axis=1)
    q[rng.random(n) < 0.3, :7] = 0.0
    bad = rng.random(n) < 0.05
    q[bad] = q[bad][:, ::-1]  # non-monotone rows (repaired)
    q[rng.random(n) < 0.03, 4] = np.nan  # NULL rows (skipped)
    w = ms.window_weights(rng.choice([300.0, 120.0, 7.0], n), np.where(rng.random(n) < 0.2, np.nan, 1.0))
    keys = (10**12 + rng.integers(0, n_keys, n)).astype(np.int64)
    return np.ascontiguousarray(q), w, keys


# --------------------------------------------------------------------------------------------
# exact strategy
# --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("n_parts", [1, 2, 7])
@pytest.mark.parametrize("shape", ["chain", "balanced", "random"])
def test_exact_independent_of_partitioning(n_parts: int, shape: str) -> None:
    q, w, keys = synthetic(400, 1)
    rng = np.random.default_rng(n_parts)
    whole = ms.finalize(ms.exact_partial(q, w, keys), LEVELS)
    parts = [ms.exact_partial(q[ix], w[ix], keys[ix]) for ix in split(400, list(rng.integers(0, 400, n_parts - 1)))]
    parts.append(ms.empty("exact"))
    got = ms.finalize(merge_tree(parts, shape, rng)[0], LEVELS)
    np.testing.assert_array_equal(got["key"], whole["key"])
    for f in ("n_windows", "n_repaired", "n_null"):
        np.testing.assert_array_equal(got[f], whole[f])
    np.testing.assert_allclose(got["weight"], whole["weight"], rtol=1e-12)
    np.testing.assert_allclose(got["mean"], whole["mean"], rtol=1e-12)
    np.testing.assert_allclose(got["quantiles"], whole["quantiles"], rtol=1e-9)


def test_exact_matches_reference_and_counts() -> None:
    q, w, keys = synthetic(120, 2, n_keys=3)
    res = ms.finalize(ms.exact_partial(q, w, keys), LEVELS)
    qr = np.maximum.accumulate(q, axis=1)
    null = np.isnan(q).any(axis=1)
    for i, k in enumerate(res["key"]):
        sel = keys == k
        use = sel & ~null & (w > 0)
        assert res["n_null"][i] == int((sel & null).sum())
        assert res["n_windows"][i] == int((sel & ~null).sum())
        assert res["n_repaired"][i] == int((sel & ~null & (qr != q).any(axis=1)).sum())
        W = w[use].sum()
        np.testing.assert_allclose(res["weight"][i], W, rtol=1e-12)
        want_mean = sum(w[j] * ref.window_mean(qr[j]) for j in np.flatnonzero(use)) / W
        np.testing.assert_allclose(res["mean"][i], want_mean, rtol=1e-12)
        want = ref.group_quantiles(qr[use], w[use], LEVELS)
        for j, p in enumerate(LEVELS):
            assert ref.quantile_ok(res["quantiles"][i, j], want[j], qr[use], w[use], float(p))
    assert res["err_bound"].tolist() == [0.0] * len(res["key"])


def test_empty_and_zero_weight_groups() -> None:
    e = ms.empty("exact")
    r = ms.finalize(e)
    assert r["quantiles"].shape == (0, 20)
    q = np.ascontiguousarray(np.stack([STD, STD]))
    p = ms.exact_partial(q, np.array([0.0, np.nan]), np.array([3, 3]))
    r = ms.finalize(ms.merge(e, p))
    assert r["n_windows"].tolist() == [2] and r["weight"].tolist() == [0.0]
    assert np.isnan(r["mean"]).all() and np.isnan(r["quantiles"]).all()
    b = ms.finalize(
        ms.merge(ms.bounded_partial(q, np.array([0.0, 0.0]), np.array([3, 3]), k=8), ms.empty("bounded", 8))
    )
    assert np.isnan(b["quantiles"]).all() and b["err_bound"].tolist() == [0.0]
    with pytest.raises(ValueError):
        ms.merge(ms.empty("exact"), ms.empty("bounded"))


def test_window_weights() -> None:
    w = ms.window_weights(np.array([300.0, 300.0, 300.0, np.nan, -5.0]), np.array([0.5, 0.0, np.nan, 1.0, 1.0]))
    assert w.tolist() == [150.0, 300.0, 300.0, 0.0, 0.0]


# --------------------------------------------------------------------------------------------
# bounded strategy: the error bound
# --------------------------------------------------------------------------------------------
DELTA = 1e-11  # x-tolerance for segments collapsed to point masses (NARROW_REL ~ 9e-13)
TOL = 1e-9  # rounding slack in probability


def check_cdf_bound(knots: np.ndarray, k: int, qs: np.ndarray, ws: np.ndarray, eps: float) -> float:
    """Assert sup_x |F_hat(x) - F(x)| <= eps (up to DELTA in x and TOL); returns the sup found."""
    klv = ms.summary_levels(k)
    pts = np.unique(np.concatenate([knots, qs[ws > 0].ravel()]))
    up, dn = pts + DELTA * np.abs(pts), pts - DELTA * np.abs(pts)
    fh = ref.window_cdf_np(knots, pts, klv)
    fh_l = ref.window_cdf_np(knots, pts, klv, left=True)
    assert np.all(fh <= ref.mixture_cdf_np(qs, ws, up) + eps + TOL)
    assert np.all(fh >= ref.mixture_cdf_np(qs, ws, dn) - eps - TOL)
    assert np.all(fh_l <= ref.mixture_cdf_np(qs, ws, up, left=True) + eps + TOL)
    assert np.all(fh_l >= ref.mixture_cdf_np(qs, ws, dn, left=True) - eps - TOL)
    return float(
        max(
            np.abs(fh - ref.mixture_cdf_np(qs, ws, pts)).max(),
            np.abs(fh_l - ref.mixture_cdf_np(qs, ws, pts, left=True)).max(),
        )
    )


@st.composite
def partitioned(draw: st.DrawFn) -> tuple:
    q, w, g, G = draw(strat.groups(max_windows=14, max_groups=2))
    n = q.shape[0]
    n_parts = draw(st.integers(1, 6))
    how = draw(st.sampled_from(["random", "by_value", "one_per_part", "heavy_first"]))
    if how == "random":
        part = np.array([draw(st.integers(0, n_parts - 1)) for _ in range(n)])
    elif how == "by_value":  # adversarial: each partition sees one region of the support only
        part = np.argsort(np.argsort(q[:, 10], kind="stable"), kind="stable") * n_parts // n
    elif how == "one_per_part":  # every window alone: the deepest chains
        part = np.arange(n)
    else:  # the heaviest window first, then many light ones
        part = np.argsort(np.argsort(-w, kind="stable"), kind="stable")
    k = draw(st.sampled_from([2, 4, 16, 64]))
    shape = draw(st.sampled_from(["chain", "balanced", "random"]))
    seed = draw(st.integers(0, 2**16))
    return q, w, g, part, k, shape, seed


@given(partitioned())
@settings(max_examples=examples(60), deadline=None)
def test_bounded_error_bound(case: tuple) -> None:
    q, w, g, part, k, shape, seed = case
    rng = np.random.default_rng(seed)
    parts = [ms.bounded_partial(q[part == p], w[part == p], g[part == p], k=k) for p in np.unique(part)]
    root, depth = merge_tree(parts, shape, rng)
    res = ms.finalize(root, LEVELS)
    for i, key in enumerate(root["key"]):
        sel = g == key
        eps = float(root["err"][i])
        if not (w[sel] > 0).any():
            assert np.isnan(root["knots"][i]).all() and eps == 0.0
            continue
        assert eps <= (1 + depth) / k + 1e-12
        check_cdf_bound(root["knots"][i], k, q[sel], w[sel], eps)
        # the quantile form of the bound: Q(p - eps) <= Q_hat(p) <= Q(p + eps)
        lo = ref.group_quantiles(q[sel], w[sel], np.clip(LEVELS - eps - TOL, 0, 1))
        hi = ref.group_quantiles(q[sel], w[sel], np.clip(LEVELS + eps + TOL, 0, 1))
        got = res["quantiles"][i]
        assert np.all(got >= lo - 1e-9 * np.abs(lo)) and np.all(got <= hi + 1e-9 * np.abs(hi))
        # means and weights stay exact
        use = sel & (w > 0)
        np.testing.assert_allclose(res["weight"][i], w[use].sum(), rtol=1e-12)
        want_mean = sum(w[j] * ref.window_mean(q[j]) for j in np.flatnonzero(use)) / w[use].sum()
        np.testing.assert_allclose(res["mean"][i], want_mean, rtol=1e-12, atol=1e-300)


def test_bounded_leaf_bound_is_attained_order() -> None:
    # a single leaf is within 1/K; with K large the bounded quantiles approach the exact ones
    q, w, keys = synthetic(300, 3, n_keys=2)
    exact = ms.finalize(ms.exact_partial(q, w, keys), LEVELS)
    for k in (8, 1024):
        b = ms.bounded_partial(q, w, keys, k=k)
        assert np.all(b["err"] == 1.0 / k)
        fb = ms.finalize(b, LEVELS)
        np.testing.assert_array_equal(fb["mean"], exact["mean"])
        qr = np.maximum.accumulate(q, axis=1)
        null = np.isnan(q).any(axis=1)
        for i, key in enumerate(b["key"]):
            use = (keys == key) & ~null & (w > 0)
            sup = check_cdf_bound(b["knots"][i], k, qr[use], w[use], 1.0 / k)
            assert sup <= 1.0 / k + TOL
    # knots at the K + 1 levels of the exact mixture
    np.testing.assert_allclose(
        ms.bounded_partial(q, w, keys, k=20)["knots"][:, [0, 20]], exact["quantiles"][:, [0, 19]], rtol=1e-12
    )


def test_bounded_merge_commutes_and_skips_weightless_side() -> None:
    q, w, keys = synthetic(200, 4, n_keys=3)
    a = ms.bounded_partial(q[:120], w[:120], keys[:120], k=32)
    b = ms.bounded_partial(q[120:], w[120:], keys[120:], k=32)
    ab, ba = ms.merge(a, b), ms.merge(b, a)
    np.testing.assert_allclose(ab["knots"], ba["knots"], rtol=1e-9)
    np.testing.assert_allclose(ab["err"], ba["err"], rtol=1e-12)
    same = ms.merge(a, ms.empty("bounded", 32))
    np.testing.assert_array_equal(same["knots"], a["knots"])
    np.testing.assert_array_equal(same["err"], a["err"])
    with pytest.raises(ValueError):
        ms.merge(a, ms.empty("bounded", 16))


@given(st.integers(1, 12), st.integers(0, 2**16))
@settings(max_examples=examples(40), deadline=None)
def test_tabulation_error_is_the_exact_sup(k: int, seed: int) -> None:
    # knot vectors with ties (point masses) shared across the three CDFs, compared with a direct
    # evaluation of sup |H_hat - H| at every breakpoint (values and left limits)
    rng = np.random.default_rng(seed)
    pool = np.round(rng.random(6) * 10, 1)
    rows = 3
    ka = np.sort(rng.choice(pool, (rows, k + 1)), axis=1)
    kb = np.sort(rng.choice(pool, (rows, k + 1)), axis=1)
    kn = np.sort(rng.choice(np.r_[pool, rng.random(3) * 10], (rows, k + 1)), axis=1)
    alpha = rng.random(rows)
    got = ms.tabulation_error(ka, kb, alpha, kn, ms.summary_levels(k))
    lv = ms.summary_levels(k)
    for r in range(rows):
        pts = np.unique(np.r_[ka[r], kb[r], kn[r]])
        want = 0.0
        for left in (False, True):
            h = alpha[r] * ref.window_cdf_np(ka[r], pts, lv, left=left) + (1 - alpha[r]) * ref.window_cdf_np(
                kb[r], pts, lv, left=left
            )
            want = max(want, float(np.abs(ref.window_cdf_np(kn[r], pts, lv, left=left) - h).max()))
        assert abs(got[r] - want) <= 1e-12, (r, got[r], want)


def test_tabulation_error_on_the_device_shaped_backend(monkeypatch: pytest.MonkeyPatch) -> None:
    # a device's refusals (no host array beside a device one): the host's bits, ties included
    resolve_gpu_to_device(monkeypatch)
    rng = np.random.default_rng(5)
    for k in (1, 7, 64):
        pool = np.round(rng.random(6) * 10, 1)
        ka, kb, kn = (np.sort(rng.choice(pool, (4, k + 1)), axis=1) for _ in range(3))
        alpha, lv = rng.random(4), ms.summary_levels(k)
        d = [DEVICE.asarray(x) for x in (ka, kb, alpha, kn)]
        dev = ms.tabulation_error(d[0], d[1], d[2], d[3], lv)
        assert isinstance(dev, DeviceArray)
        assert np.array_equal(to_host(dev), ms.tabulation_error(ka, kb, alpha, kn, lv)), k


def test_to_frame_uses_schema_column_names() -> None:
    from gpuclust.schema import CPU_PERCENTILE_COLUMNS_SORTED

    q, w, keys = synthetic(60, 6, n_keys=2)
    df = ms.to_frame(ms.finalize(ms.exact_partial(q, w, keys)))
    assert list(df.columns[7:]) == list(CPU_PERCENTILE_COLUMNS_SORTED)
    assert df["key"].tolist() == sorted(set(keys.tolist()))
    assert ms.level_column(0.999) == "cpu_p99.9" and ms.level_column(0.07) == "cpu_p7"


def test_hybrid_leaf_spill_equals_bounded_partial() -> None:
    """A leaf tabulates its spilled groups as ``bounded_partial`` does (knots, bound, stats,
    zero-weight windows included); a group without usable windows stays exact."""
    from gpuclust.analyses import _hybrid_summary as hs

    rng = np.random.default_rng(21)
    n, k = 3000, 63  # spill threshold T = 2 windows
    q = np.sort(rng.gamma(0.7, 0.1, (n, 20)), axis=1)
    q[rng.random(n) < 0.3, :6] = 0.0
    q, _, _ = mx.repair_percentiles(np.ascontiguousarray(q))
    w = rng.uniform(1, 300, n)
    w[::9] = 0.0
    keys = np.sort(rng.integers(0, 80, n))
    w[keys == 7] = 0.0  # a group without weight
    h = hs.leaf(q, w, keys, k, repaired=True)
    np.testing.assert_array_equal(h["exact"]["key"], [7])
    rows = keys != 7
    b = ms.bounded_partial(q[rows], w[rows], keys[rows], k=k, repaired=True)
    got = h["bounded"]
    np.testing.assert_array_equal(got["key"], b["key"])
    np.testing.assert_array_equal(got["knots"], b["knots"])
    np.testing.assert_array_equal(got["err"], b["err"])
    for s in ("n_windows", "n_repaired", "n_null", "weight", "wmean"):
        np.testing.assert_array_equal(got[s], b[s])
