"""The NumPy mixture ops against hand-computed cases and the slow reference (``reference.py``)."""

from __future__ import annotations

import gpuclust_mixture_reference as ref
import gpuclust_mixture_strategies as strat
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from strategies import examples

from gpuclust.backends import mixture_cpu as mx

LV = np.asarray(mx.SOURCE_LEVELS)
STD = LV.copy()
EXTRA = np.array([0.0, 1e-9, 0.05, 0.25, 0.333, 0.5, 0.905, 0.999, 1.0 - 1e-12, 1.0])


def uniform(a: float, b: float) -> np.ndarray:
    """Percentile vector of the uniform distribution on [a, b]."""
    return a + (b - a) * LV


def point(x: float) -> np.ndarray:
    return np.full(20, float(x))


def quantiles(
    rows: list[np.ndarray], w: list[float], levels: np.ndarray, group: list[int] | None = None, n_groups: int = 1
) -> np.ndarray:
    q = np.ascontiguousarray(np.stack(rows))
    g = np.zeros(len(rows), dtype=np.int64) if group is None else np.asarray(group, dtype=np.int64)
    return mx.mixture_quantiles(q, np.asarray(w, dtype=np.float64), g, n_groups, np.asarray(levels, dtype=np.float64))


# --------------------------------------------------------------------------------------------
# hand-computed cases
# --------------------------------------------------------------------------------------------
def test_two_uniforms_equal_weight() -> None:
    # U[0,1] and U[1,2], equal weights: the mixture is U[0,2], so Q(p) = 2p
    p = np.array([0.0, 0.1, 0.25, 0.5, 0.75, 0.9, 1.0])
    out = quantiles([uniform(0, 1), uniform(1, 2)], [5.0, 5.0], p)
    np.testing.assert_allclose(out[0], 2 * p, rtol=1e-12, atol=1e-15)


def test_two_uniforms_weighted() -> None:
    # U[0,1] weight 1 and U[1,2] weight 3: F = x/4 on [0,1], 1/4 + 3(x-1)/4 on [1,2]
    p = np.array([0.125, 0.25, 0.5, 0.625, 1.0])
    want = np.array([0.5, 1.0, 1 + 1 / 3, 1.5, 2.0])
    np.testing.assert_allclose(quantiles([uniform(0, 1), uniform(1, 2)], [1.0, 3.0], p)[0], want, rtol=1e-12)


def test_overlapping_uniforms() -> None:
    # U[0,2] and U[1,3], equal weights: F = x/4 on [0,1], (2x-1)/4 on [1,2], (x+1)/4 on [2,3]
    p = np.array([0.125, 0.25, 0.5, 0.75, 0.875])
    want = np.array([0.5, 1.0, 1.5, 2.0, 2.5])
    np.testing.assert_allclose(quantiles([uniform(0, 2), uniform(1, 3)], [2.0, 2.0], p)[0], want, rtol=1e-12)


def test_point_mass_and_uniform() -> None:
    # a point mass at 5 and U[0,10], equal weights: F(5-) = 1/4, F(5) = 3/4
    p = np.array([0.1, 0.25, 0.5, 0.75, 0.8, 1.0, 0.0])
    want = np.array([2.0, 5.0, 5.0, 5.0, 6.0, 10.0, 0.0])
    np.testing.assert_allclose(quantiles([point(5), uniform(0, 10)], [1.0, 1.0], p)[0], want, rtol=1e-12)


def test_flat_steps_are_point_masses() -> None:
    q = uniform(0, 1)
    q[3:8] = q[3]  # levels .3 .. .7 collapse: a point mass of 0.4 at 0.3
    out = quantiles([q], [1.0], np.array([0.3, 0.31, 0.5, 0.7, 0.75]))[0]
    # above the atom, F = 0.7 + 0.1 (x - 0.3) / 0.5 on [0.3, 0.8]
    np.testing.assert_allclose(out, [0.3, 0.3, 0.3, 0.3, 0.55], rtol=1e-12)


def test_all_point_masses() -> None:
    out = quantiles([point(1), point(2), point(3)], [1.0, 1.0, 2.0], np.array([0, 0.2, 0.25, 0.26, 0.5, 0.51, 1]))[0]
    np.testing.assert_array_equal(out, [1, 1, 1, 2, 2, 3, 3])


def test_single_window_standard_levels_are_its_breakpoints() -> None:
    q = np.sort(np.random.default_rng(3).gamma(0.5, 0.1, 20))
    np.testing.assert_array_equal(quantiles([q], [300.0], STD)[0], q)
    # identical windows with wildly different weights: still the breakpoints
    np.testing.assert_allclose(quantiles([q, q, q], [1e-3, 7.0, 1e6], STD)[0], q, rtol=1e-12)


def test_gap_between_windows_gives_left_edge() -> None:
    # plateau of F at exactly 1/2 between 1 and 5: inf{x : F >= W/2} = 1
    out = quantiles([uniform(0, 1), uniform(5, 6)], [1.0, 1.0], np.array([0.5, 0.5000001]))[0]
    assert out[0] == 1.0
    assert 5.0 < out[1] < 5.001


def test_empty_zero_weight_and_out_of_range_groups() -> None:
    rows = [uniform(0, 1), uniform(2, 3), uniform(4, 5), uniform(6, 7)]
    out = quantiles(rows, [1.0, 0.0, 1.0, 1.0], np.array([0.0, 0.5, 1.0]), group=[0, 1, 5, -1], n_groups=3)
    np.testing.assert_allclose(out[0], [0.0, 0.5, 1.0], rtol=1e-12)
    assert np.isnan(out[1]).all() and np.isnan(out[2]).all()
    nanrow = uniform(0, 1)
    nanrow[4] = np.nan
    out = quantiles([nanrow, uniform(2, 3)], [1.0, 1.0], np.array([0.0, 1.0]))
    np.testing.assert_array_equal(out[0], [2.0, 3.0])
    assert mx.mixture_quantiles(np.zeros((0, 20)), np.zeros(0), np.zeros(0, np.int64), 2, STD).shape == (2, 20)


@pytest.mark.parametrize("scale", [1e-200, 1e-6, 1e3, 1e200])
def test_scale_invariance_huge_and_tiny(scale: float) -> None:
    rng = np.random.default_rng(4)
    q = np.sort(rng.random((30, 20)), axis=1)
    q[::3, 5:9] = q[::3, 5:6]
    w = 10 ** rng.uniform(-3, 6, 30)
    g = rng.integers(0, 3, 30)
    lv = np.concatenate([STD, EXTRA])
    base = mx.mixture_quantiles(q, w, g, 3, lv)
    np.testing.assert_allclose(
        mx.mixture_quantiles(np.ascontiguousarray(q * scale), w, g, 3, lv), base * scale, rtol=1e-12
    )
    # weights rescaled by a huge factor change nothing
    np.testing.assert_allclose(mx.mixture_quantiles(q, w * 1e250, g, 3, lv), base, rtol=1e-12)


def test_weights_spanning_many_orders() -> None:
    # a 1e-12-weight window beyond a heavy one only moves the very top quantiles
    out = quantiles([uniform(0, 1), uniform(10, 11)], [1e12, 1.0], np.array([0.5, 0.999999, 1.0]))[0]
    np.testing.assert_allclose(out[:2], [0.5, 0.999999], rtol=1e-9)
    assert out[2] == 11.0


def test_row_order_and_chunking_do_not_matter(monkeypatch: pytest.MonkeyPatch) -> None:
    rng = np.random.default_rng(5)
    n, G = 3000, 40
    q = np.sort(rng.gamma(0.7, 0.1, (n, 20)), axis=1)
    q[rng.random(n) < 0.3, :6] = 0.0
    w = rng.uniform(1, 300, n)
    g = rng.zipf(1.6, n) % G  # very uneven group sizes -> several padded widths
    lv = np.concatenate([STD, EXTRA])
    base = mx.mixture_quantiles(q, w, g, G, lv)
    perm = rng.permutation(n)
    # (row order changes the float sums, hence the last bits; 1e-9 is the accuracy target, the
    # level 1 - 1e-12 sits in a sparse tail where the last bits of F move x by ~1e-11)
    np.testing.assert_allclose(
        mx.mixture_quantiles(np.ascontiguousarray(q[perm]), w[perm], g[perm], G, lv), base, rtol=1e-9
    )
    monkeypatch.setattr(mx, "_CHUNK", 64)  # one row per chunk, a group wider than a chunk
    np.testing.assert_array_equal(mx.mixture_quantiles(q, w, g, G, lv), base)
    # and every answer satisfies the definition against the reference CDF
    for gg in range(0, G, 7):
        sel = g == gg
        if not sel.any():
            continue
        W = 1.0
        f = ref.mixture_cdf_np(q[sel], w[sel], base[gg])
        fl = ref.mixture_cdf_np(q[sel], w[sel], base[gg], left=True)
        assert np.all(f >= lv * W - 1e-10) and np.all(fl <= lv * W + 1e-10)


def test_argument_checks() -> None:
    q = np.ascontiguousarray(np.stack([uniform(0, 1)]))
    w, g = np.ones(1), np.zeros(1, np.int64)
    with pytest.raises(TypeError):
        mx.mixture_quantiles(q.astype(np.float32), w, g, 1, STD)
    with pytest.raises(TypeError):
        mx.mixture_quantiles(q, w, g.astype(np.float64), 1, STD)
    with pytest.raises(ValueError):
        mx.mixture_quantiles(np.asfortranarray(np.vstack([q, q])), np.ones(2), np.zeros(2, np.int64), 1, STD)
    with pytest.raises(ValueError):
        mx.mixture_quantiles(q, w, g, 1, np.array([0.5, 1.5]))
    with pytest.raises(ValueError):
        mx.mixture_quantiles(q[:, ::-1].copy(), w, g, 1, STD)  # not monotone
    with pytest.raises(ValueError):
        mx.mixture_quantiles(q, w, g, 1, STD, q_levels=np.linspace(0, 1, 5))


# --------------------------------------------------------------------------------------------
# repair and means
# --------------------------------------------------------------------------------------------
@given(st.lists(strat.window(monotone=False, allow_null=True), min_size=1, max_size=5), st.booleans())
@settings(max_examples=examples(60), deadline=None)
def test_repair_percentiles(rows: list[np.ndarray], as32: bool) -> None:
    q = np.stack(rows).astype(np.float32 if as32 else np.float64)
    r, rep, null = mx.repair_percentiles(q)
    assert r.dtype == np.float64 and rep.dtype == bool and null.dtype == bool
    for i, row in enumerate(q.astype(np.float64)):
        if np.isnan(row).any():
            assert null[i] and not rep[i] and np.isnan(r[i]).all()
            continue
        running = [max(row[: k + 1]) for k in range(20)]
        assert r[i].tolist() == running
        assert rep[i] == any(a != b for a, b in zip(running, row, strict=False))


@given(st.lists(strat.window(), min_size=1, max_size=6))
@settings(max_examples=examples(60), deadline=None)
def test_window_means_match_reference(rows: list[np.ndarray]) -> None:
    q = np.stack(rows)
    got = mx.window_means(q)
    for i, row in enumerate(q):
        want = ref.window_mean(row)
        assert abs(got[i] - want) <= 1e-12 * max(abs(want), 1e-300) + 1e-300


# --------------------------------------------------------------------------------------------
# against the reference, on hypothesis-generated groups
# --------------------------------------------------------------------------------------------
def _check_against_reference(q: np.ndarray, w: np.ndarray, g: np.ndarray, G: int, lv: np.ndarray) -> None:
    fast = mx.mixture_quantiles(q, w, g, G, lv)
    for gg in range(G):
        sel = g == gg
        want = ref.group_quantiles(q[sel], w[sel], lv)
        for j, p in enumerate(lv):
            assert ref.quantile_ok(float(fast[gg, j]), float(want[j]), q[sel], w[sel], float(p)), (
                gg,
                p,
                fast[gg, j],
                want[j],
            )


@given(strat.groups(), st.lists(st.floats(0.0, 1.0), max_size=4))
@settings(max_examples=examples(70), deadline=None)
def test_quantiles_match_reference(data: tuple, extra: list[float]) -> None:
    q, w, g, G = data
    _check_against_reference(q, w, g, G, np.concatenate([STD, np.asarray(extra, dtype=np.float64)]))


@given(strat.groups(monotone=False, allow_null=True))
@settings(max_examples=examples(40), deadline=None)
def test_repair_then_quantiles_match_reference(data: tuple) -> None:
    q_raw, w, g, G = data
    q, _, null = mx.repair_percentiles(q_raw)
    w = np.where(null, 0.0, w)  # NULL windows are skipped (the reference gets weight 0)
    _check_against_reference(q, w, g, G, np.concatenate([STD, EXTRA]))


def test_two_windows_reference_by_bisection() -> None:
    # the scalar reference (math.fsum, explicit right-continuity check) on a fixed ugly case
    q = np.stack([uniform(0, 1), point(0.5), np.sort(np.r_[np.zeros(8), np.linspace(1e-6, 1e3, 12)])])
    w = np.array([1.0, 2.5, 1e-3])
    fast = mx.mixture_quantiles(q, w, np.zeros(3, np.int64), 1, EXTRA)[0]
    for j, p in enumerate(EXTRA):
        assert ref.quantile_ok(fast[j], ref.mixture_quantile(q, w, float(p)), q, w, float(p))


def test_reference_all_windows_cdf_is_the_one_window_cdf() -> None:
    """The reference's all-windows CDF (what its group sums use) is, row for row and bit for bit,
    its one-window CDF, right value and left limit, at breakpoints, between and outside them; a row
    it cannot take (not sorted) is left to the one-window path."""
    rng = np.random.default_rng(3)
    q = np.sort(rng.gamma(0.7, 1.0, (40, 20)), axis=1)
    q[:10, :8] = 0.0  # point mass at 0
    q[10:14] = q[10:14, :1]  # one-point windows
    q[14, 5:9] = q[14, 5]  # a flat step inside
    xs = np.r_[np.unique(q)[::7], rng.random(50) * q.max(), -1.0, 0.0, q.max(), q.max() * 2]
    for left in (False, True):
        got = ref.windows_cdf_np(q, xs, left=left)
        want = np.stack([ref.window_cdf_np(r, xs, left=left) for r in q])
        assert got is not None and np.array_equal(got, want), left
    bad = q.copy()
    bad[3, 12] = bad[3, 11] - 1.0
    assert ref.windows_cdf_np(bad, xs) is None


def _payload_rowwise(q: np.ndarray, v: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The event payload written window by window (the definition ``_event_table`` vectorises)."""
    n, nl = q.shape
    hi, lo, jump = np.zeros(n * nl + 1), np.zeros(n * nl + 1), np.zeros(n * nl + 1)
    for i in range(n):
        d = np.zeros(nl + 1)  # d[k + 1] = density of segment k; d[0] = d[nl] = 0
        for k in range(nl - 1):
            m = v[i] * (LV[k + 1] - LV[k])
            dq = q[i, k + 1] - q[i, k]
            if dq <= mx.NARROW_REL * max(abs(q[i, k]), abs(q[i, k + 1])):
                jump[i * nl + k] = m
            else:
                d[k + 1] = m / dq
        for k in range(nl):
            s = d[k + 1] - d[k]
            bb = s - d[k + 1]
            hi[i * nl + k] = s
            lo[i * nl + k] = (d[k + 1] - (s - bb)) + (-d[k] - bb)
    return hi, lo, jump


@pytest.mark.parametrize("block", [20, 64, 1 << 14])
def test_event_table_matches_rowwise_definition(monkeypatch: pytest.MonkeyPatch, block: int) -> None:
    rng = np.random.default_rng(11)
    n = 60
    q = np.sort(rng.gamma(0.7, 0.1, (n, 20)), axis=1)
    q[::4, :8] = 0.0  # point masses
    q[1::5] = q[1::5, :1]  # one-point windows
    q[2::7, 9:14] = q[2::7, 9:10] * (1 + 1e-14)  # narrow segments
    q[3::6] -= 0.05  # negative values
    q = np.ascontiguousarray(np.sort(q, axis=1))
    v = rng.uniform(1e-6, 1.0, n)
    monkeypatch.setattr(mx, "_PAYLOAD_BLOCK", block)  # blocks of windows (20 events: one window each)
    table = mx._event_table(q, v, LV)
    for j, want in enumerate(_payload_rowwise(q, v), start=1):
        np.testing.assert_array_equal(table[:, j], want)
    np.testing.assert_array_equal(table[:-1, 0], q.reshape(-1))
    np.testing.assert_array_equal(table[-1], [np.inf, 0.0, 0.0, 0.0])


def test_threads_do_not_change_results(monkeypatch: pytest.MonkeyPatch) -> None:
    rng = np.random.default_rng(12)
    n, G = 4000, 30
    q = np.ascontiguousarray(np.sort(rng.gamma(0.7, 0.1, (n, 20)), axis=1))
    w = rng.uniform(1, 300, n)
    g = rng.zipf(1.5, n) % G  # one big group (unpadded row) and padded chunks of small ones
    lv = np.concatenate([STD, EXTRA])
    monkeypatch.setattr(mx, "THREADS", 1)
    one = mx.mixture_quantiles(q, w, g, G, lv)
    monkeypatch.setattr(mx, "THREADS", 3)
    monkeypatch.setattr(mx, "_PARALLEL_MIN_EVENTS", 0)
    monkeypatch.setattr(mx, "_CHUNK", 512)  # many chunks
    np.testing.assert_array_equal(mx.mixture_quantiles(q, w, g, G, lv), one)
    with pytest.raises(ValueError, match="non-decreasing"):  # errors of a worker reach the caller
        bad = q.copy()
        bad[5, 3] = -1.0
        mx.mixture_quantiles(bad, w, g, G, lv)


@pytest.mark.parametrize("float32_values", [True, False])
def test_radix_sorted_big_group(monkeypatch: pytest.MonkeyPatch, float32_values: bool) -> None:
    """A group wider than the radix threshold (sorted by ``_radix_argsort``): the same quantiles as
    with ``argsort`` (ties -- point masses, repeated windows, -0.0 -- in another order move only the
    last bits) and the definition holds against the reference CDF."""
    rng = np.random.default_rng(13)
    n = 4000
    q = np.sort(rng.gamma(0.7, 0.1, (n, 20)), axis=1) * 10 ** rng.uniform(-3, 1, (n, 1)) - 0.01
    q[rng.random(n) < 0.3, :8] = 0.0
    q[::50, :3] = -0.0
    q[1::9] = q[1]  # repeated windows
    if float32_values:
        q = q.astype(np.float32).astype(np.float64)
    q = np.ascontiguousarray(np.sort(q, axis=1))
    w = rng.uniform(0, 300, n)
    g = np.zeros(n, np.int64)
    lv = np.concatenate([STD, EXTRA])
    monkeypatch.setattr(mx, "_RADIX_MIN_EVENTS", 1)
    got = mx.mixture_quantiles(q, w, g, 1, lv)[0]
    monkeypatch.setattr(mx, "_RADIX_MIN_EVENTS", 1 << 60)
    np.testing.assert_allclose(got, mx.mixture_quantiles(q, w, g, 1, lv)[0], rtol=1e-12, atol=1e-300)
    f = ref.mixture_cdf_np(q, w, got)  # normalised CDF at the answers, and its left limit
    fl = ref.mixture_cdf_np(q, w, got, left=True)
    assert np.all(f >= lv - 1e-10) and np.all(fl <= lv + 1e-10)


def test_radix_argsort_orders_like_a_stable_sort() -> None:
    rng = np.random.default_rng(14)
    for x in (
        rng.standard_normal(5000).astype(np.float32).astype(np.float64),  # float32 keys, 2 passes
        rng.standard_normal(5000) * 10.0 ** rng.uniform(-300, 300, 5000),  # float64 keys, 4 passes
        np.array([1e200, -1e300, 3.0, 0.0, -0.0, 1e-300, -5e-324, np.inf, 3.0, 0.0]),
    ):
        x = x.copy()
        x[::9] = x[0]  # ties
        order = mx._radix_argsort(x)
        np.testing.assert_array_equal(x[order], np.sort(x))
        tie = x[order][1:] == x[order][:-1]
        same_sign = np.signbit(x[order][1:]) == np.signbit(x[order][:-1])
        assert np.all(order[1:][tie & same_sign] > order[:-1][tie & same_sign])  # stable


@settings(max_examples=examples(200), deadline=None)
@given(
    values=st.lists(
        st.one_of(st.floats(width=32, allow_nan=False), st.sampled_from([0.0, -0.0, 1.5, -1.5])),
        min_size=1,
        max_size=60,
    ),
    data=st.data(),
)
def test_packed_event_keys_order_like_a_lexsort(values: list[float], data: st.DataObject) -> None:
    """The GPU's one-key event order (``packed_event_keys``, a stable argsort -- CuPy's is a radix
    sort): the (group, x) sequence of ``lexsort((x, group))``, ties of equal bits in row order."""
    x = np.array(values, np.float64)
    n_groups = data.draw(st.integers(1, 5))
    g = np.array(data.draw(st.lists(st.integers(0, n_groups - 1), min_size=x.size, max_size=x.size)), np.int64)
    order = np.argsort(mx.packed_event_keys(np, x, g, n_groups), kind="stable")
    want = np.lexsort((x, g))
    np.testing.assert_array_equal(g[order], g[want])
    np.testing.assert_array_equal(x[order], x[want])  # -0.0 == 0.0: either is a sorted order
    same = (g[order][1:] == g[order][:-1]) & (x[order][1:].view(np.int64) == x[order][:-1].view(np.int64))
    assert np.all(order[1:][same] > order[:-1][same])


def test_packed_event_keys_refuse_what_they_cannot_order_exactly() -> None:
    g = np.zeros(3, np.int64)
    assert mx.packed_event_keys(np, np.array([0.5, 0.1, 2.0]), g, 1) is None  # 0.1 is no float32
    assert mx.packed_event_keys(np, np.array([0.5, 1e300, 2.0]), g, 1) is None  # beyond float32's range
    assert mx.packed_event_keys(np, np.array([0.5, 0.25, 2.0]), g, (1 << 32) + 1) is None  # too many groups
    assert mx.packed_event_keys(np, np.array([0.5, 0.25, 2.0]), g, 1 << 32) is not None


@settings(max_examples=examples(80), deadline=None)
@given(st.lists(st.integers(0, 700), min_size=0, max_size=12), st.sampled_from([1, 32, 256]))
def test_tile_table_partitions_each_group(lengths: list[int], block: int) -> None:
    """The tiled GPU sweep's tiles (``mixture_gpu.tile_table``, NumPy here): each group's events cut
    in order into tiles of ``block`` from its first event, full but the last, none for an empty
    group (checked against a plain loop)."""
    from gpuclust.backends.mixture_gpu import tile_table

    row_start = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    first, start, end, s0 = tile_table(np, row_start, block)
    want: list[tuple[int, int, int]] = []
    want_first = [0]
    for g, n in enumerate(lengths):
        a = int(row_start[g])
        for j in range(a, a + n, block):
            want.append((j, min(j + block, a + n), a))
        want_first.append(len(want))
    assert first.tolist() == want_first
    assert list(zip(start.tolist(), end.tolist(), s0.tolist(), strict=True)) == want
    for a in (first, start, end, s0):
        assert a.dtype == np.int64 and a.flags.c_contiguous
