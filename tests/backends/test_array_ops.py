"""The array helpers whose form differs per backend (``backends/array_cpu.py`` and its CuPy twin):
each against slow obvious code, on every backend (``backend`` fixture: gpu runs are marked)."""

from __future__ import annotations

import numpy as np
import pytest

from gpuclust.backends import array_cpu, available_backend, backend_of, mixture_cpu


def _host(be, a):  # type: ignore[no-untyped-def]
    return be.to_host(a) if hasattr(a, "__cuda_array_interface__") else np.asarray(a)


def test_stable_argsort_keeps_ties_in_order(backend):
    rng = np.random.default_rng(1)
    key = rng.integers(0, 50, 5000)
    got = _host(backend, backend.ops.stable_argsort(backend.asarray(key)))
    want = sorted(range(key.shape[0]), key=lambda i: (key[i], i))
    assert got.tolist() == want


@pytest.mark.parametrize("dtype", [np.int32, np.int64, np.float64])
def test_scatter_max_matches_a_loop(backend, dtype):
    rng = np.random.default_rng(4)
    idx = rng.integers(0, 300, 20_000)  # every target hit many times
    vals = rng.integers(-5, 1000, idx.shape[0]).astype(dtype)
    out = backend.asarray(np.full(310, -1, dtype))
    backend.ops.scatter_max(out, backend.asarray(idx), backend.asarray(vals))
    want = np.full(310, -1, dtype)
    for i, v in zip(idx.tolist(), vals.tolist(), strict=True):
        want[i] = max(want[i], v)
    assert _host(backend, out).tolist() == want.tolist()


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int64])
def test_run_max_matches_a_loop(backend, dtype):
    rng = np.random.default_rng(6)
    key = np.sort(rng.integers(0, 2000, 30_000))
    starts = np.flatnonzero(np.r_[True, key[1:] != key[:-1]])
    vals = rng.normal(0, 100, key.shape[0]).astype(dtype)
    got = _host(backend, backend.ops.run_max(backend.asarray(vals), backend.asarray(starts)))
    ends = [*starts[1:].tolist(), key.shape[0]]
    assert got.dtype == dtype
    assert got.tolist() == [max(vals[a:b].tolist()) for a, b in zip(starts.tolist(), ends, strict=True)]
    assert _host(backend, backend.ops.run_max(backend.asarray(vals[:0]), backend.asarray(starts[:0]))).shape == (0,)


def test_repeat_index_matches_a_loop(backend):
    counts = np.random.default_rng(7).integers(0, 4, 5000)
    counts[:3] = 0  # leading and
    counts[-2:] = 0  # trailing empty runs
    got = _host(backend, backend.ops.repeat_index(backend.asarray(counts)))
    assert got.tolist() == [i for i, c in enumerate(counts.tolist()) for _ in range(c)]
    assert _host(backend, backend.ops.repeat_index(backend.asarray(counts[:0]))).shape == (0,)


def test_running_extrema_per_row(backend):
    rng = np.random.default_rng(2)
    a = rng.normal(size=(37, 23))
    mx = _host(backend, backend.ops.cummax_rows(backend.asarray(a)))
    mn = _host(backend, backend.ops.cummin_rows(backend.asarray(a)))
    for r in range(a.shape[0]):
        for c in range(a.shape[1]):
            assert mx[r, c] == max(a[r, : c + 1]) and mn[r, c] == min(a[r, : c + 1])


def test_run_weighted_sums_match_a_loop(backend):
    rng = np.random.default_rng(3)
    key = np.sort(rng.integers(0, 3000, 70_000))  # more than one row block of the cpu twin
    first = np.ones(key.shape[0], dtype=bool)
    first[1:] = key[1:] != key[:-1]
    inv = np.cumsum(first) - 1
    G = int(first.sum())
    w = rng.random(key.shape[0])
    q = rng.random((key.shape[0], 4))
    got = _host(
        backend,
        backend.ops.run_weighted_sums(
            *(backend.asarray(x) for x in (first, inv)), G, backend.asarray(w), backend.asarray(q)
        ),
    )
    want = np.zeros((G, 4))
    for r in range(key.shape[0]):
        want[inv[r]] += w[r] * q[r]
    np.testing.assert_allclose(got, want, rtol=1e-12)


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int64])
def test_gather_repair_percentiles_matches_the_op(backend, dtype):
    """The fused gather + repair equals ``repair_percentiles`` of the gathered matrix (values,
    repaired and NULL masks), with NaN / infinite / non-monotone rows (integer columns: the
    gathered path)."""
    rng = np.random.default_rng(5)
    n = 9000  # more than two row blocks
    q = rng.gamma(0.7, 0.1, (n, 20))
    if dtype is np.int64:
        q = (q * 1000).astype(np.int64)
    else:
        q = q.astype(dtype)
        q[5, 3] = q[11, 0] = np.nan
        q[7, 19] = np.inf
        q[9, 0] = -np.inf
    q[::3] = np.sort(q[::3], axis=1)
    cols = [np.ascontiguousarray(q[:, j]) for j in range(20)]
    idx = rng.permutation(n)[: n - 11]
    got = backend.ops.gather_repair_percentiles([backend.asarray(c) for c in cols], backend.asarray(idx))
    want = mixture_cpu.repair_percentiles(np.ascontiguousarray(q[idx]).astype(np.float64))
    for g, w_ in zip(got, want, strict=True):
        np.testing.assert_array_equal(_host(backend, g), w_)


def test_backend_of_and_available_backend():
    assert backend_of(np.zeros(1)).name == "cpu"
    assert available_backend("cpu").name == "cpu"
    be = available_backend("gpu")
    assert be is None or be.name == "gpu"
    assert array_cpu.stable_argsort(np.array([2, 1, 2, 1])).tolist() == [1, 3, 0, 2]
