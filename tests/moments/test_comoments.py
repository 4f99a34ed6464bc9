"""grouped_comoments / merge_moments / regroup_moments (NumPy op) against independent references.

References: ``np.average`` and ``np.cov(aweights=..., bias=True)`` on each group's rows at once;
exact rational arithmetic (``fractions.Fraction``) for the ill-conditioned cases.  Merge algebra
is checked with Hypothesis (identity exact, commutativity exact, associativity and partition
invariance to tight relative tolerances).
"""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from strategies import examples

from gpuclust.backends.moments_cpu import (
    Moments,
    empty_moments,
    grouped_comoments,
    merge_moments,
    regroup_moments,
)

SETTINGS = settings(
    max_examples=examples(60),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)


# ----------------------------------------------------------------------------- helpers


def direct(x: np.ndarray, w: np.ndarray, group: np.ndarray, G: int) -> Moments:
    """Per-group reference with np.average / np.cov on all of the group's rows at once."""
    d = x.shape[1]
    out = empty_moments(G, d)
    for g in range(G):
        sel = group == g
        if not sel.any():
            continue
        xs, ws = x[sel].astype(np.float64), w[sel]
        out.n[g] = sel.sum()
        out.W[g] = ws.sum()
        out.mean[g] = np.average(xs, axis=0, weights=ws)
        if sel.sum() > 1:
            out.C[g] = np.atleast_2d(np.cov(xs.T, aweights=ws, bias=True)) * ws.sum()
    return out


def exact(x: np.ndarray, w: np.ndarray) -> tuple[list[Fraction], list[list[Fraction]]]:
    """Mean and co-moment of one group in exact rational arithmetic."""
    X = [[Fraction(float(v)) for v in row] for row in x]
    Wf = [Fraction(float(v)) for v in w]
    W = sum(Wf)
    d = x.shape[1]
    mean = [sum(wi * r[k] for wi, r in zip(Wf, X, strict=True)) / W for k in range(d)]
    C = [
        [sum(wi * (r[i] - mean[i]) * (r[j] - mean[j]) for wi, r in zip(Wf, X, strict=True)) for j in range(d)]
        for i in range(d)
    ]
    return mean, C


EPS = np.finfo(np.float64).eps


def assert_close(a: Moments, b: Moments, rtol: float) -> None:
    """n equal; W, mean and C equal to ``rtol`` relative to the natural scale of each entry.

    Means are doubles, so a merged co-moment can only be as good as ``eps * kappa`` relative,
    ``kappa = |mean| / sd`` (the between-part term uses differences of rounded means); the
    tolerance on ``C`` adds ``32 eps (kappa_i + kappa_j)``.  For CPI-like data kappa ~ 5.
    """
    np.testing.assert_array_equal(a.n, b.n)
    np.testing.assert_allclose(a.W, b.W, rtol=rtol, atol=0)
    W = np.where(b.W > 0, b.W, 1.0)
    sd = np.sqrt(np.maximum(np.diagonal(b.C, axis1=1, axis2=2), 0) / W[:, None])
    scale_m = np.abs(b.mean) + sd
    assert np.all(np.abs(a.mean - b.mean) <= rtol * scale_m + 1e-300), (a.mean, b.mean)
    diag = np.maximum(np.diagonal(b.C, axis1=1, axis2=2), 0)
    with np.errstate(divide="ignore", invalid="ignore"):
        kappa = np.where(sd > 0, np.abs(b.mean) / np.where(sd > 0, sd, 1.0), 0.0)
    rt = rtol + 32 * EPS * (kappa[:, :, None] + kappa[:, None, :])
    scale_c = rt * np.sqrt(diag[:, :, None] * diag[:, None, :])
    # constant columns: C_kk ~ 0 up to rounding of fl_k = (1e-13 |mean_k|)^2 W, and by
    # Cauchy-Schwarz their cross terms up to sqrt(C_ii fl_j)
    fl = (1e-13 * np.abs(b.mean)) ** 2 * W[:, None]
    D = np.maximum(diag, fl)
    floor = np.sqrt(D[:, :, None] * fl[:, None, :]) + np.sqrt(fl[:, :, None] * D[:, None, :]) + 1e-300
    assert np.all(np.abs(a.C - b.C) <= scale_c + floor), (a.C, b.C)


def make_data(
    seed: int,
    n: int,
    d: int,
    G: int,
    *,
    offset: float = 0.0,
    spread: float = 1.0,
    wlog: float = 0.0,
    const_col: bool = False,
    dtype: type = np.float64,
):
    rng = np.random.default_rng(seed)
    x = offset + spread * rng.standard_normal((n, d))
    if d > 1:
        x[:, 1] += 0.7 * x[:, 0]
    if const_col:
        x[:, -1] = offset + 0.3
    x = np.ascontiguousarray(x.astype(dtype))
    w = 10.0 ** rng.uniform(-wlog, wlog, n) if wlog else rng.uniform(0.5, 2.0, n)
    group = rng.integers(0, G, n).astype(np.int64)
    return x, w, group


def split_points(rng: np.random.Generator, n: int, pieces: int) -> list[np.ndarray]:
    cuts = np.sort(rng.integers(0, n + 1, pieces - 1)) if n else np.zeros(pieces - 1, dtype=int)
    return np.split(np.arange(n), cuts)


# ----------------------------------------------------------------------------- references


@pytest.mark.parametrize("d", [1, 2, 3, 4, 6])
def test_matches_numpy_direct(d: int) -> None:
    x, w, g = make_data(1, 3000, d, 17, offset=1.5, wlog=3.0)
    m = grouped_comoments(x, w, g, 17)
    assert m.mean.shape == (17, d) and m.C.shape == (17, d, d) and m.n.dtype == np.int64
    assert_close(m, direct(x, w, g, 17), rtol=1e-10)


def test_float32_input_is_widened() -> None:
    x, w, g = make_data(2, 500, 3, 4, dtype=np.float32)
    m = grouped_comoments(x, w, g, 4)
    assert_close(m, grouped_comoments(x.astype(np.float64), w, g, 4), rtol=1e-14)
    assert_close(m, direct(x.astype(np.float64), w, g, 4), rtol=1e-10)


def test_invalid_rows_are_ignored_listwise() -> None:
    x, w, g = make_data(3, 400, 2, 3)
    x[5, 0] = np.nan
    x[6, 1] = np.inf
    w[7] = 0.0
    w[8] = -1.0
    w[9] = np.nan
    g[10] = -1
    g[11] = 3  # == n_groups
    g32 = g.astype(np.int32)
    keep = np.ones(400, bool)
    keep[5:12] = False
    ref = direct(x[keep], w[keep], g[keep], 3)
    assert_close(grouped_comoments(x, w, g, 3), ref, rtol=1e-10)
    assert_close(grouped_comoments(x, w, g32, 3), ref, rtol=1e-10)


@pytest.mark.parametrize("block", [1, 7, 64])
def test_row_blocks_match_direct(monkeypatch: pytest.MonkeyPatch, block: int) -> None:
    """Both passes run over row blocks (per-group sums add block sums); tiny blocks, invalid rows
    inside some blocks, blocks of only invalid rows and more groups than block rows."""
    import gpuclust.backends.moments_cpu as mc

    x, w, g = make_data(4, 700, 3, 5, offset=1e3, wlog=2.0)
    x[40:60, 1] = np.nan  # whole blocks without a valid row when block <= 20
    w[100:103] = 0.0
    g[200] = 9
    keep = np.isfinite(x).all(axis=1) & (w > 0) & (g < 5)
    ref = direct(x[keep], w[keep], g[keep], 5)
    monkeypatch.setattr(mc, "_BLOCK_ROWS", block)
    assert_close(grouped_comoments(x, w, g, 5), ref, rtol=1e-10)
    assert_close(grouped_comoments(x, w, g.astype(np.int32), 5), ref, rtol=1e-10)
    wide = np.random.default_rng(5).integers(0, 300, x.shape[0])
    kw = np.isfinite(x).all(axis=1) & (w > 0)
    assert_close(grouped_comoments(x, w, wide, 300), direct(x[kw], w[kw], wide[kw], 300), rtol=1e-10)


def test_empty_inputs_and_groups() -> None:
    x = np.zeros((0, 2))
    m = grouped_comoments(x, np.zeros(0), np.zeros(0, dtype=np.int64), 3)
    assert m.n.tolist() == [0, 0, 0] and not m.mean.any() and not m.C.any()
    m0 = grouped_comoments(x, np.zeros(0), np.zeros(0, dtype=np.int64), 0)
    assert m0.mean.shape == (0, 2)
    x, w, g = make_data(4, 50, 2, 1)
    m = grouped_comoments(x, w, g + 2, 5)  # groups 0, 1, 3, 4 empty
    assert m.n.tolist() == [0, 0, 50, 0, 0]
    assert np.all(m.W[[0, 1, 3, 4]] == 0) and np.all(m.C[[0, 1, 3, 4]] == 0)


def test_single_row_group() -> None:
    m = grouped_comoments(np.array([[1.25, 3.0]]), np.array([7.0]), np.array([0]), 1)
    assert m.n.tolist() == [1] and m.W.tolist() == [7.0]
    assert m.mean.tolist() == [[1.25, 3.0]]
    assert not m.C.any()


def test_argument_checks() -> None:
    x, w, g = make_data(5, 10, 2, 2)
    with pytest.raises(ValueError, match="2-D"):
        grouped_comoments(x[:, 0], w, g, 2)
    with pytest.raises(TypeError, match="x must have dtype"):
        grouped_comoments(x.astype(np.int64), w, g, 2)
    with pytest.raises(TypeError, match="w must have dtype"):
        grouped_comoments(x, w.astype(np.float32), g, 2)
    with pytest.raises(TypeError, match="group must have dtype"):
        grouped_comoments(x, w, g.astype(np.float64), 2)
    with pytest.raises(ValueError, match="length"):
        grouped_comoments(x, w[:-1], g, 2)
    with pytest.raises(ValueError, match="C-contiguous"):
        grouped_comoments(np.asfortranarray(x), w, g, 2)
    with pytest.raises(ValueError, match="n_groups"):
        grouped_comoments(x, w, g, -1)


# ----------------------------------------------------------------------------- stability


@pytest.mark.parametrize("offset,spread", [(1e3, 1e-3), (1e6, 1e-2), (-5e4, 1e-6)])
def test_huge_offset_matches_exact_rational(offset: float, spread: float) -> None:
    x, w, g = make_data(6, 300, 2, 1, offset=offset, spread=spread, wlog=6.0)
    mean, C = exact(x, w)
    m = grouped_comoments(x, w, g, 1)
    for k in range(2):
        assert abs(m.mean[0, k] - float(mean[k])) <= 1e-12 * abs(float(mean[k]))
    for i in range(2):
        for j in range(2):
            ref = float(C[i][j])
            scale = float(C[i][i] * C[j][j]) ** 0.5
            assert abs(m.C[0, i, j] - ref) <= 1e-9 * scale, (i, j, m.C[0, i, j], ref)
    # split in 7 pieces and merged.  Partition means are doubles, so the between-partition term
    # carries an error ~ eps * kappa, kappa = |mean| / sd (docs/analyses/cpi-math.md, "Accuracy").
    kappa = abs(offset) / spread
    tol = max(1e-9, 20 * np.finfo(float).eps * kappa)
    rng = np.random.default_rng(0)
    acc = empty_moments(1, 2)
    for idx in split_points(rng, 300, 7):
        acc = merge_moments(acc, grouped_comoments(x[idx], w[idx], g[idx], 1))
    for i in range(2):
        for j in range(2):
            scale = float(C[i][i] * C[j][j]) ** 0.5
            assert abs(acc.C[0, i, j] - float(C[i][j])) <= tol * scale


def test_naive_raw_sums_would_fail_here() -> None:
    # documents why the representation matters: sum(w x^2) - W mean^2 loses everything
    x, w, g = make_data(7, 300, 1, 1, offset=1e6, spread=1e-3)
    _, C = exact(x, w)
    naive = (w * x[:, 0] ** 2).sum() - (w * x[:, 0]).sum() ** 2 / w.sum()
    assert abs(naive - float(C[0][0])) > 0.5 * float(C[0][0])
    m = grouped_comoments(x, w, g, 1)
    assert abs(m.C[0, 0, 0] - float(C[0][0])) <= 1e-9 * float(C[0][0])


def test_constant_column_has_zero_comoment() -> None:
    x, w, g = make_data(8, 500, 3, 2, offset=1e3, const_col=True, wlog=6.0)
    m = grouped_comoments(x, w, g, 2)
    tiny = (1e-13 * 1e3) ** 2 * m.W
    assert np.all(
        np.abs(m.C[:, 2, :]) <= np.sqrt(tiny[:, None] * np.maximum(m.C[:, [0, 1, 2], [0, 1, 2]], tiny[:, None]))
    )
    assert np.all(m.C[:, 2, 2] <= tiny)
    np.testing.assert_allclose(m.mean[:, 2], 1e3 + 0.3, rtol=1e-15)


# ----------------------------------------------------------------------------- merge algebra

ugly = st.fixed_dictionaries(
    {
        "seed": st.integers(0, 2**32 - 1),
        "n": st.integers(0, 80),
        "d": st.integers(1, 3),
        "G": st.integers(1, 4),
        "offset": st.sampled_from([0.0, 1.0, 1e3, -1e6]),
        "spread": st.sampled_from([1.0, 1e-3, 1e3]),
        "wlog": st.sampled_from([0.0, 6.0]),
        "const_col": st.booleans(),
    }
)


def _data(p: dict):
    return make_data(
        p["seed"],
        p["n"],
        p["d"],
        p["G"],
        offset=p["offset"],
        spread=p["spread"],
        wlog=p["wlog"],
        const_col=p["const_col"],
    )


def _parts(p: dict, pieces: int, seed: int) -> list[Moments]:
    x, w, g = _data(p)
    rng = np.random.default_rng(seed)
    return [grouped_comoments(x[i], w[i], g[i], p["G"]) for i in split_points(rng, p["n"], pieces)]


@SETTINGS
@given(ugly)
def test_identity_is_exact(p: dict) -> None:
    x, w, g = _data(p)
    m = grouped_comoments(x, w, g, p["G"])
    e = empty_moments(p["G"], p["d"])
    for r in (merge_moments(e, m), merge_moments(m, e)):
        for a, b in zip(r.astuple(), m.astuple(), strict=True):
            np.testing.assert_array_equal(a, b)


@SETTINGS
@given(ugly, st.integers(0, 1000))
def test_commutative_exactly(p: dict, seed: int) -> None:
    a, b = _parts(p, 2, seed)
    ab, ba = merge_moments(a, b), merge_moments(b, a)
    for u, v in zip(ab.astuple(), ba.astuple(), strict=True):
        np.testing.assert_array_equal(u, v)


@SETTINGS
@given(ugly, st.integers(0, 1000))
def test_associative(p: dict, seed: int) -> None:
    a, b, c = _parts(p, 3, seed)
    assert_close(merge_moments(merge_moments(a, b), c), merge_moments(a, merge_moments(b, c)), rtol=1e-12)


@SETTINGS
@given(ugly, st.sampled_from([1, 2, 7]), st.integers(0, 1000), st.booleans())
def test_partitioning_does_not_matter(p: dict, pieces: int, seed: int, tree: bool) -> None:
    x, w, g = _data(p)
    one = grouped_comoments(x, w, g, p["G"])
    parts = _parts(p, pieces, seed)
    if tree:  # pairwise tree, like dask's split_every=2
        while len(parts) > 1:
            parts = [
                merge_moments(parts[i], parts[i + 1]) if i + 1 < len(parts) else parts[i]
                for i in range(0, len(parts), 2)
            ]
        merged = parts[0]
    else:
        merged = empty_moments(p["G"], p["d"])
        for q in parts:
            merged = merge_moments(merged, q)
    assert_close(merged, one, rtol=1e-11)
    assert_close(one, direct(x, w, g, p["G"]), rtol=1e-9 if p["spread"] * 1e3 < abs(p["offset"]) else 1e-10)


def test_merge_shape_mismatch_raises() -> None:
    with pytest.raises(ValueError, match="shapes"):
        merge_moments(empty_moments(2, 2), empty_moments(2, 3))


# ----------------------------------------------------------------------------- regroup


@SETTINGS
@given(ugly, st.integers(1, 3))
def test_regroup_equals_grouping_directly(p: dict, coarse: int) -> None:
    x, w, g = _data(p)
    rng = np.random.default_rng(p["seed"] % 1000)
    mapping = rng.integers(-1, coarse, p["G"])  # -1 drops a group
    fine = grouped_comoments(x, w, g, p["G"])
    got = regroup_moments(fine, mapping, coarse)
    assert_close(got, grouped_comoments(x, w, np.ascontiguousarray(mapping[g]), coarse), rtol=1e-10)


def test_keyed_merge_by_concat_and_regroup() -> None:
    # two partitions with different key sets: concatenate, then regroup by key
    x, w, g = make_data(9, 1000, 2, 6)
    keys = np.array([10, 20, 30, 40, 50, 60])
    a_sel, b_sel = g < 4, g >= 2
    ma = grouped_comoments(x[a_sel], w[a_sel], np.unique(g[a_sel], return_inverse=True)[1].astype(np.int64), 4)
    b_idx = np.where(b_sel & ~a_sel)[0]
    mb = grouped_comoments(x[b_idx], w[b_idx], g[b_idx] - 2, 4)
    cat = ma.concat(mb)
    cat_keys = np.concatenate([keys[:4], keys[2:6]])
    uniq, inv = np.unique(cat_keys, return_inverse=True)
    got = regroup_moments(cat, inv, uniq.shape[0])
    assert_close(got, grouped_comoments(x, w, g, 6), rtol=1e-11)


def test_select_and_take() -> None:
    x, w, g = make_data(10, 300, 4, 3)
    m = grouped_comoments(x, w, g, 3)
    s = m.select([2, 0])
    assert_close(s, grouped_comoments(np.ascontiguousarray(x[:, [2, 0]]), w, g, 3), rtol=1e-12)
    t = m.take(np.array([2]))
    assert t.n_groups == 1 and t.d == 4
    assert m.to_host() is not m and np.array_equal(m.to_host().C, m.C)
