"""Finalize math (gpuclust.stats) against independent references.

References: np.cov/np.corrcoef with aweights; a direct WLS by ``np.linalg.lstsq`` on the
sqrt(w)-scaled design with the textbook ``s^2 (A^T A)^-1`` standard errors; closed forms for simple
regression; a finite-difference delta method; scipy.stats.spearmanr / pearsonr (scipy is a test-only
dependency: importorskip); a slow O(n^2) weighted-rank reference.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from strategies import examples

from gpuclust.analyses.cpi.binning import quantile_cuts, spearman_from_grid, spearman_grid_partial
from gpuclust.analyses.cpi.correlation import pearson_from_moments, spearman_exact, weighted_std
from gpuclust.analyses.cpi.regression import borg_effects, wls_from_moments
from gpuclust.backends import get_backend
from gpuclust.backends.moments_cpu import empty_moments, grouped_comoments, merge_moments

SETTINGS = settings(
    max_examples=examples(40),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
I64 = np.int64


def borg_like(seed: int, n: int, G: int = 1, noise: float = 0.3):
    """Synthetic windows: CPI ~ 1.58 with a small planted interference effect (Borg §5.2 scale)."""
    rng = np.random.default_rng(seed)
    util = rng.beta(4, 3, n)
    ntasks = rng.poisson(20, n).astype(np.float64)
    cpi = 1.3 * (1 + 0.003 * ntasks + 0.15 * util) + noise * rng.standard_normal(n)
    mai = 0.004 + 0.002 * (cpi - 1.5) + 0.001 * rng.standard_normal(n)
    w = rng.uniform(0.1, 300, n) * 10.0 ** rng.uniform(-2, 2, n)  # CPU-seconds
    g = rng.integers(0, G, n).astype(I64)
    return cpi, mai, util, ntasks, w, g


def lstsq_reference(X: np.ndarray, y: np.ndarray, w: np.ndarray, frequency: bool = False):
    """Textbook WLS: lstsq on sqrt(w)-scaled design, s^2 = RSS / dof, cov = s^2 (A^T A)^-1."""
    A = np.column_stack([np.ones(len(y)), X]) * np.sqrt(w)[:, None]
    b = y * np.sqrt(w)
    coef, *_ = np.linalg.lstsq(A, b, rcond=None)
    r = b - A @ coef
    rss = r @ r
    p = A.shape[1]
    dof = (w.sum() if frequency else len(y)) - p
    cov = rss / dof * np.linalg.inv(A.T @ A)
    ybar = np.average(y, weights=w)
    r2 = 1 - rss / (w * (y - ybar) ** 2).sum()
    return coef, np.sqrt(np.diag(cov)), cov, r2


# ----------------------------------------------------------------------------- mean / std / Pearson


def test_weighted_std_and_pearson_match_numpy() -> None:
    cpi, mai, _, _, w, g = borg_like(1, 4000, G=5)
    m = grouped_comoments(np.ascontiguousarray(np.column_stack([cpi, mai])), w, g, 5)
    sd = weighted_std(m)
    r = pearson_from_moments(m, 0, 1)
    for k in range(5):
        s = g == k
        cov = np.cov(np.vstack([cpi[s], mai[s]]), aweights=w[s], bias=True)
        np.testing.assert_allclose(sd[k], np.sqrt(np.diag(cov)), rtol=1e-12)
        np.testing.assert_allclose(r[k], cov[0, 1] / np.sqrt(cov[0, 0] * cov[1, 1]), rtol=1e-12)
        np.testing.assert_allclose(
            m.mean[k], np.average(np.column_stack([cpi[s], mai[s]]), axis=0, weights=w[s]), rtol=1e-13
        )


def test_pearson_unweighted_matches_scipy() -> None:
    stats = pytest.importorskip("scipy.stats")
    cpi, mai, *_ = borg_like(2, 500)
    m = grouped_comoments(np.ascontiguousarray(np.column_stack([cpi, mai])), np.ones(500), np.zeros(500, I64), 1)
    np.testing.assert_allclose(pearson_from_moments(m)[0], stats.pearsonr(cpi, mai).statistic, rtol=1e-12)


def test_pearson_degenerate_cases_are_nan() -> None:
    x = np.array([[1.5, 2.0], [1.5, 3.0], [2.0, 1.0], [7.0, 7.0], [1e3 + 0.1, 5.0], [1e3 + 0.1, 6.0]])
    w = np.array([1.0, 2.0, 1.0, 1.0, 3.0, 1e-6])
    g = np.array([0, 0, 1, 2, 3, 3], dtype=I64)
    m = grouped_comoments(x, w, g, 5)
    r = pearson_from_moments(m)
    assert np.isnan(r[0])  # constant first column
    assert np.isnan(r[1]) and np.isnan(r[2])  # single rows
    assert np.isnan(r[3])  # constant 1e3+0.1 (rounding noise in C must not become a correlation)
    assert np.isnan(r[4])  # empty
    assert np.isnan(weighted_std(m)[4]).all()
    assert weighted_std(m)[1].tolist() == [0.0, 0.0]


# ----------------------------------------------------------------------------- WLS


@pytest.mark.parametrize("weights", ["analytic", "frequency"])
def test_wls_matches_lstsq_reference(weights: str) -> None:
    cpi, mai, util, nt, w, g = borg_like(3, 6000, G=3)
    x = np.ascontiguousarray(np.column_stack([cpi, mai, util, nt]))
    m = grouped_comoments(x, w, g, 3)
    fit = wls_from_moments(m, 0, [2, 3], weights=weights)
    assert fit.coef.shape == (3, 3) and fit.cov.shape == (3, 3, 3)
    for k in range(3):
        s = g == k
        coef, se, cov, r2 = lstsq_reference(np.column_stack([util[s], nt[s]]), cpi[s], w[s], weights == "frequency")
        np.testing.assert_allclose(fit.coef[k], coef, rtol=1e-9)
        np.testing.assert_allclose(fit.se[k], se, rtol=1e-8)
        np.testing.assert_allclose(fit.cov[k], cov, rtol=1e-8, atol=1e-12 * np.abs(cov).max())
        np.testing.assert_allclose(fit.r2[k], r2, rtol=1e-9)
        assert fit.n[k] == s.sum()


def test_wls_simple_regression_closed_form() -> None:
    rng = np.random.default_rng(4)
    xv = rng.uniform(0, 1, 300)
    y = 2.0 - 0.5 * xv + rng.normal(0, 0.1, 300)
    w = rng.uniform(1, 5, 300)
    m = grouped_comoments(np.ascontiguousarray(np.column_stack([y, xv])), w, np.zeros(300, I64), 1)
    fit = wls_from_moments(m, 0, [1])
    xb, yb = np.average(xv, weights=w), np.average(y, weights=w)
    sxx = (w * (xv - xb) ** 2).sum()
    slope = (w * (xv - xb) * (y - yb)).sum() / sxx
    b0 = yb - slope * xb
    s2 = (w * (y - b0 - slope * xv) ** 2).sum() / (300 - 2)
    np.testing.assert_allclose(fit.coef[0], [b0, slope], rtol=1e-12)
    np.testing.assert_allclose(fit.se[0, 1], np.sqrt(s2 / sxx), rtol=1e-10)
    np.testing.assert_allclose(fit.se[0, 0], np.sqrt(s2 * (1 / w.sum() + xb**2 / sxx)), rtol=1e-10)
    np.testing.assert_allclose(fit.sigma2[0], s2, rtol=1e-10)


def test_wls_analytic_se_invariant_to_weight_units() -> None:
    cpi, _, util, nt, w, g = borg_like(5, 800)
    x = np.ascontiguousarray(np.column_stack([cpi, util, nt]))
    a = wls_from_moments(grouped_comoments(x, w, g, 1), 0, [1, 2])
    b = wls_from_moments(grouped_comoments(x, w / 3600.0, g, 1), 0, [1, 2])  # CPU-hours
    np.testing.assert_allclose(a.se, b.se, rtol=1e-10)
    np.testing.assert_allclose(a.coef, b.coef, rtol=1e-11)


@SETTINGS
@given(st.integers(0, 2**31), st.sampled_from([1, 2, 7]), st.integers(0, 100))
def test_wls_from_merged_partitions(seed: int, pieces: int, cut_seed: int) -> None:
    cpi, mai, util, nt, w, g = borg_like(seed, 400, G=2)
    x = np.ascontiguousarray(np.column_stack([cpi, mai, util, nt]))
    one = wls_from_moments(grouped_comoments(x, w, g, 2), 0, [2, 3])
    rng = np.random.default_rng(cut_seed)
    cuts = np.sort(rng.integers(0, 401, pieces - 1))
    acc = empty_moments(2, 4)
    for idx in np.split(np.arange(400), cuts):
        acc = merge_moments(acc, grouped_comoments(x[idx], w[idx], g[idx], 2))
    fit = wls_from_moments(acc, 0, [2, 3])
    np.testing.assert_allclose(fit.coef, one.coef, rtol=1e-10)
    np.testing.assert_allclose(fit.se, one.se, rtol=1e-9)
    np.testing.assert_allclose(fit.r2, one.r2, rtol=1e-9)


def test_wls_degenerate_groups() -> None:
    rng = np.random.default_rng(6)
    n = 12
    y = rng.normal(size=n)
    u = rng.uniform(size=n)
    rows = []
    # g0: collinear regressors (t = 2u + 1); g1: constant regressor; g2: n == p (exact fit);
    # g3: constant y; g4: n < p; g5: fine
    rows += [(0, y[i], u[i], 2 * u[i] + 1) for i in range(n)]
    rows += [(1, y[i], u[i], 5.0) for i in range(n)]
    rows += [(2, y[i], u[i], float(i * i)) for i in range(3)]
    rows += [(3, 1.5, u[i], float(i)) for i in range(n)]
    rows += [(4, y[i], u[i], float(i)) for i in range(2)]
    rows += [(5, y[i], u[i], float(i % 4)) for i in range(n)]
    a = np.array(rows)
    m = grouped_comoments(np.ascontiguousarray(a[:, 1:]), np.ones(len(a)), a[:, 0].astype(I64), 7)
    fit = wls_from_moments(m, 0, [1, 2])
    assert np.isnan(fit.coef[0]).all() and np.isnan(fit.se[0]).all()
    assert np.isnan(fit.coef[1]).all()
    assert np.isfinite(fit.coef[2]).all() and np.isnan(fit.se[2]).all()
    np.testing.assert_allclose(fit.r2[2], 1.0, atol=1e-9)
    assert np.isnan(fit.r2[3]) and np.allclose(fit.coef[3], [1.5, 0, 0], atol=1e-12)
    assert np.isnan(fit.coef[4]).all()
    assert np.isfinite(fit.coef[5]).all() and np.isfinite(fit.se[5]).all()
    assert np.isnan(fit.coef[6]).all() and fit.n[6] == 0  # empty
    with pytest.raises(ValueError):
        wls_from_moments(m, 0, [1], weights="normalised")


# ----------------------------------------------------------------------------- Borg effects


@pytest.mark.parametrize("reference", ["mean", "intercept"])
def test_borg_effects_values_and_delta_method(reference: str) -> None:
    cpi, _, util, nt, w, g = borg_like(7, 20000, noise=0.2)
    x = np.ascontiguousarray(np.column_stack([cpi, util, nt]))
    fit = wls_from_moments(grouped_comoments(x, w, g, 1), 0, [1, 2])
    e = borg_effects(fit, util=0, tasks=1, reference=reference)
    coef, cov = fit.coef[0], fit.cov[0]
    a = np.array([1.0, *fit.x_mean[0]]) if reference == "mean" else np.array([1.0, 0.0, 0.0])
    ref = a @ coef
    if reference == "mean":
        np.testing.assert_allclose(ref, np.average(cpi, weights=w), rtol=1e-12)
    np.testing.assert_allclose(e["pct_per_task"][0], 100 * coef[2] / ref, rtol=1e-12)
    np.testing.assert_allclose(e["pct_per_util_step"][0], 100 * 0.1 * coef[1] / ref, rtol=1e-12)
    # planted: d CPI / d task = 1.3 * 0.003, d CPI / d util = 1.3 * 0.15
    assert np.all(np.abs(coef[1:] - [1.3 * 0.15, 1.3 * 0.003]) < 4 * fit.se[0, 1:])
    # delta method against a central finite-difference gradient
    for name, j, step in (("pct_per_task", 2, 1.0), ("pct_per_util_step", 1, 0.1)):

        def f(c: np.ndarray, j: int = j, step: float = step) -> float:
            return 100 * step * c[j] / (a @ c)

        h = 1e-6 * np.maximum(np.abs(coef), 1e-3)
        grad = np.array(
            [(f(coef + h[i] * np.eye(3)[i]) - f(coef - h[i] * np.eye(3)[i])) / (2 * h[i]) for i in range(3)]
        )
        np.testing.assert_allclose(e[name + "_se"][0], np.sqrt(grad @ cov @ grad), rtol=1e-5)


# ----------------------------------------------------------------------------- Spearman, exact


def slow_weighted_spearman(x: np.ndarray, y: np.ndarray, w: np.ndarray) -> float:
    """O(n^2) definition: rank = weight strictly below + half the weight of ties; weighted Pearson."""
    rx = np.array([w[x < v].sum() + 0.5 * w[x == v].sum() for v in x])
    ry = np.array([w[y < v].sum() + 0.5 * w[y == v].sum() for v in y])
    c = np.cov(np.vstack([rx, ry]), aweights=w, bias=True)
    return float(c[0, 1] / np.sqrt(c[0, 0] * c[1, 1]))


def test_spearman_unweighted_matches_scipy_with_ties() -> None:
    stats = pytest.importorskip("scipy.stats")
    rng = np.random.default_rng(8)
    n = 3000
    g = rng.integers(0, 6, n).astype(I64)
    x = np.round(rng.normal(size=n), 1)  # many ties
    y = np.round(x + rng.normal(size=n), 1)
    rho, cnt = spearman_exact(x, y, g, 6)
    for k in range(6):
        s = g == k
        np.testing.assert_allclose(rho[k], stats.spearmanr(x[s], y[s]).statistic, rtol=1e-11)
        assert cnt[k] == s.sum()


def test_spearman_weighted_matches_slow_definition() -> None:
    rng = np.random.default_rng(9)
    n = 400
    g = rng.integers(0, 3, n).astype(I64)
    x = np.round(rng.normal(size=n), 1)
    y = np.round(x**2 + rng.normal(size=n), 1)
    w = 10.0 ** rng.uniform(-6, 6, n)
    rho, _ = spearman_exact(x, y, g, 3, w=w)
    for k in range(3):
        s = g == k
        np.testing.assert_allclose(rho[k], slow_weighted_spearman(x[s], y[s], w[s]), rtol=1e-9)


def test_spearman_integer_weights_equal_replicated_rows() -> None:
    stats = pytest.importorskip("scipy.stats")
    rng = np.random.default_rng(10)
    x, y = rng.normal(size=200), rng.normal(size=200)
    y = y + x
    k = rng.integers(1, 6, 200)
    rho, _ = spearman_exact(x, y, w=k.astype(np.float64))
    np.testing.assert_allclose(rho[0], stats.spearmanr(np.repeat(x, k), np.repeat(y, k)).statistic, rtol=1e-11)


def test_spearman_degenerate() -> None:
    rho, n = spearman_exact(
        np.array([1.0, 1.0, 1.0, 2.0, np.nan]), np.array([1.0, 2.0, 3.0, 4.0, 5.0]), np.array([0, 0, 0, 1, 1]), 3
    )
    assert np.isnan(rho).all() and n.tolist() == [3, 1, 0]


# ----------------------------------------------------------------------------- Spearman, grid


def test_grid_equals_exact_when_bins_hold_single_values() -> None:
    rng = np.random.default_rng(11)
    n = 5000
    g = rng.integers(0, 4, n).astype(I64)
    x = rng.integers(0, 30, n).astype(np.float64)
    y = np.clip(x + rng.integers(-8, 9, n), 0, 40).astype(np.float64)
    w = rng.uniform(0.1, 10, n)
    be = get_backend("cpu")
    xc, yc = np.arange(30) + 0.5, np.arange(40) + 0.5
    for wt in (None, w):
        h = spearman_grid_partial(be, x, y, g, 4, xc, yc, w=wt)
        rho_g, bound = spearman_from_grid(h)
        rho_e, _ = spearman_exact(x, y, g, 4, w=wt)
        np.testing.assert_allclose(rho_g, rho_e, rtol=1e-10)
        assert np.all(bound > 0)


@SETTINGS
@given(st.integers(0, 2**31), st.floats(-0.95, 0.95), st.sampled_from([4, 16, 64]), st.booleans())
def test_grid_bound_holds(seed: int, corr: float, bins: int, weighted: bool) -> None:
    rng = np.random.default_rng(seed)
    n = 1500
    z = rng.standard_normal((n, 2))
    x = z[:, 0]
    y = corr * z[:, 0] + np.sqrt(1 - corr**2) * z[:, 1]
    y = np.exp(y)  # monotone transform: Spearman unchanged, Pearson not
    w = 10.0 ** rng.uniform(-2, 2, n) if weighted else None
    g = np.zeros(n, I64)
    h = spearman_grid_partial(
        get_backend("cpu"), x, y, g, 1, quantile_cuts(x[:300], bins), quantile_cuts(y[:300], bins), w=w
    )
    rho_g, bound = spearman_from_grid(h)
    rho_e, _ = spearman_exact(x, y, g, 1, w=w)
    assert abs(rho_g[0] - rho_e[0]) <= bound[0]


def test_grid_partials_merge_by_addition() -> None:
    rng = np.random.default_rng(12)
    n = 3000
    x, y = rng.normal(size=n), rng.normal(size=n)
    g = rng.integers(0, 3, n).astype(I64)
    be = get_backend("cpu")
    xc, yc = quantile_cuts(x, 32), quantile_cuts(y, 32)
    whole = spearman_grid_partial(be, x, y, g, 3, xc, yc)
    parts = sum(
        spearman_grid_partial(be, x[i], y[i], g[i], 3, xc, yc) for i in np.split(np.arange(n), [100, 1700, 2999])
    )
    np.testing.assert_array_equal(whole, parts)  # counts: exact
    assert whole.shape == (3, 32, 32) and whole.sum() == n  # 31 cuts -> 32 bins


def test_grid_bound_shrinks_with_bins() -> None:
    rng = np.random.default_rng(13)
    x = rng.normal(size=20000)
    y = x + rng.normal(size=20000)
    g = np.zeros(20000, I64)
    be = get_backend("cpu")
    bounds, errs = [], []
    exact_rho = spearman_exact(x, y)[0][0]
    for bins in (8, 32, 128):
        rho, b = spearman_from_grid(
            spearman_grid_partial(be, x, y, g, 1, quantile_cuts(x, bins), quantile_cuts(y, bins))
        )
        bounds.append(b[0])
        errs.append(abs(rho[0] - exact_rho))
    assert bounds[0] > bounds[1] > bounds[2] and bounds[2] < 0.03
    assert errs[2] < 1e-3  # typical error is far below the worst-case bound


def test_cpi_mai_summary_columns() -> None:
    from gpuclust.analyses.cpi.correlation import cpi_mai_summary

    cpi, mai, util, nt, w, g = borg_like(14, 2000, G=3)
    m = grouped_comoments(np.ascontiguousarray(np.column_stack([util, cpi, nt, mai])), w, g, 4)
    s = cpi_mai_summary(m, cpi=1, mai=3)
    for k in range(3):
        sel = g == k
        assert s["n"][k] == sel.sum()
        np.testing.assert_allclose(s["cpu_seconds"][k], w[sel].sum(), rtol=1e-12)
        np.testing.assert_allclose(s["cpi_mean"][k], np.average(cpi[sel], weights=w[sel]), rtol=1e-12)
        np.testing.assert_allclose(s["mai_std"][k], np.sqrt(np.cov(mai[sel], aweights=w[sel], bias=True)), rtol=1e-10)
        c = np.cov(np.vstack([cpi[sel], mai[sel]]), aweights=w[sel])
        np.testing.assert_allclose(s["pearson_r"][k], c[0, 1] / np.sqrt(c[0, 0] * c[1, 1]), rtol=1e-11)
    assert s["n"][3] == 0 and np.isnan(s["cpi_mean"][3]) and np.isnan(s["pearson_r"][3])
