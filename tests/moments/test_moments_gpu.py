"""CPU/GPU parity of grouped_comoments and merge_moments (marked ``gpu``).

Skipped without CuPy or a CUDA device; ``GPUCLUST_REQUIRE_GPU=1`` turns the skip into a failure.
Tolerance 1e-9 relative (the kernels accumulate in float64 with atomics, so the order of additions,
and therefore the last bits, differ from NumPy's sequential bincount).
"""

from __future__ import annotations

import os

import numpy as np
import pytest

from gpuclust import _kernels
from gpuclust.backends import moments_gpu
from gpuclust.backends.moments_cpu import grouped_comoments, merge_moments
from gpuclust.partials import Moments


def test_loader_declares_the_same_instantiations() -> None:
    # Once the loader lists grouped_moments.cu it must list exactly what the wrapper can pick.
    declared = _kernels.INSTANTIATIONS.get(moments_gpu.KERNEL_FILE)
    if declared is not None:
        assert {k: sorted(v) for k, v in declared.items()} == {
            k: sorted(v) for k, v in moments_gpu.INSTANTIATIONS.items()
        }


@pytest.fixture(scope="module")
def cp():
    try:
        import cupy

        ok = cupy.cuda.runtime.getDeviceCount() > 0
    except Exception as e:  # any failure means "no usable GPU"
        ok, err = False, e
    else:
        err = None
    if not ok:
        msg = f"CuPy with a CUDA device is required ({err or 'no device'})"
        if os.environ.get("GPUCLUST_REQUIRE_GPU") == "1":
            pytest.fail(msg)
        pytest.skip(msg)
    if moments_gpu.KERNEL_FILE not in _kernels.INSTANTIATIONS:  # until the loader registers the file
        _kernels.INSTANTIATIONS[moments_gpu.KERNEL_FILE] = moments_gpu.INSTANTIATIONS
    return cupy


def _close(gpu: Moments, ref: Moments, rtol: float = 1e-9) -> None:
    h = gpu.to_host()
    np.testing.assert_array_equal(h.n, ref.n)
    np.testing.assert_allclose(h.W, ref.W, rtol=rtol)
    W = np.where(ref.W > 0, ref.W, 1.0)
    diag = np.maximum(np.diagonal(ref.C, axis1=1, axis2=2), 0)
    sd = np.sqrt(diag / W[:, None])
    assert np.all(np.abs(h.mean - ref.mean) <= rtol * (np.abs(ref.mean) + sd) + 1e-300)
    fl = (1e-13 * np.abs(ref.mean)) ** 2 * W[:, None]
    D = np.maximum(diag, fl)
    tol = (
        rtol * np.sqrt(diag[:, :, None] * diag[:, None, :])
        + np.sqrt(D[:, :, None] * fl[:, None, :])
        + np.sqrt(fl[:, :, None] * D[:, None, :])
        + 1e-300
    )
    assert np.all(np.abs(h.C - ref.C) <= tol)


def _data(
    seed: int, n: int, d: int, G: int, xdtype=np.float64, gdtype=np.int64, sorted_groups=False, offset: float = 1.5
):
    rng = np.random.default_rng(seed)
    x = (offset + rng.standard_normal((n, d))).astype(xdtype)
    w = 10.0 ** rng.uniform(-3, 3, n)
    g = rng.integers(0, G, n)
    if sorted_groups:
        g = np.sort(g)
    g = g.astype(gdtype)
    x[::97, 0] = np.nan  # invalid rows
    w[::89] = 0.0
    g[::83] = -1
    return np.ascontiguousarray(x), w, g


@pytest.mark.gpu
@pytest.mark.parametrize("d", [1, 2, 3, 4])
@pytest.mark.parametrize("xdtype", [np.float32, np.float64])
@pytest.mark.parametrize("gdtype", [np.int32, np.int64])
@pytest.mark.parametrize("G", [1, 7, 1000, 100_000])  # shared (small G) and global (large G) kernels
def test_parity(cp, d, xdtype, gdtype, G) -> None:
    x, w, g = _data(G + d, 200_000, d, G, xdtype, gdtype)
    ref = grouped_comoments(x, w, g, G)
    _close(moments_gpu.grouped_comoments(cp.asarray(x), cp.asarray(w), cp.asarray(g), G), ref)


@pytest.mark.gpu
@pytest.mark.parametrize("sorted_groups", [True, False])
def test_parity_one_hot_group_and_offsets(cp, sorted_groups) -> None:
    # 10^6 rows into 3 groups (uniform warps) and CPI ~ 1e3 +- 1e-3 (stability)
    rng = np.random.default_rng(5)
    n = 1_000_000
    x = np.ascontiguousarray(np.column_stack([1e3 + 1e-3 * rng.standard_normal(n), rng.uniform(0, 1, n)]))
    w = rng.uniform(1, 300, n)
    g = rng.choice(3, n, p=[0.98, 0.01, 0.01]).astype(np.int64)
    if sorted_groups:
        g = np.sort(g)
    ref = grouped_comoments(x, w, g, 3)
    _close(moments_gpu.grouped_comoments(cp.asarray(x), cp.asarray(w), cp.asarray(g), 3), ref)


@pytest.mark.gpu
def test_gpu_empty_and_merge(cp) -> None:
    m = moments_gpu.grouped_comoments(cp.zeros((0, 2)), cp.zeros(0), cp.zeros(0, dtype=cp.int64), 4)
    assert m.to_host().n.tolist() == [0, 0, 0, 0]
    x, w, g = _data(1, 10_000, 3, 5)
    a_ref, b_ref = (
        grouped_comoments(x[:4000], w[:4000], g[:4000], 5),
        grouped_comoments(x[4000:], w[4000:], g[4000:], 5),
    )
    a = moments_gpu.grouped_comoments(cp.asarray(x[:4000]), cp.asarray(w[:4000]), cp.asarray(g[:4000]), 5)
    b = moments_gpu.grouped_comoments(cp.asarray(x[4000:]), cp.asarray(w[4000:]), cp.asarray(g[4000:]), 5)
    _close(moments_gpu.merge_moments(a, b), merge_moments(a_ref, b_ref))
    with pytest.raises(ValueError, match="up to"):
        moments_gpu.grouped_comoments(cp.zeros((3, 5)), cp.ones(3), cp.zeros(3, dtype=cp.int64), 1)
    with pytest.raises(TypeError):
        moments_gpu.grouped_comoments(cp.zeros((3, 2)), cp.ones(3, dtype=cp.float32), cp.zeros(3, dtype=cp.int64), 1)
