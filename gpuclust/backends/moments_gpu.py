"""CuPy twins of the co-moment ops in :mod:`gpuclust.backends.moments_cpu` (same names, signatures).

``grouped_comoments`` runs the corrected two-pass algorithm on the device with the kernels of
``kernels/grouped_moments.cu`` (pass 1: counts, weight and weighted sums; pass 2: centred sums
and cross products around the pass-1 means), then the small finishing step shared with the NumPy
twin (:func:`gpuclust.backends.moments_cpu.finish_comoments`).  ``merge_moments`` is the same
Chan merge written against CuPy.

The kernel instantiations are the loader's table entry
``gpuclust._kernels.INSTANTIATIONS["grouped_moments.cu"]`` (:data:`INSTANTIATIONS`; declared in
the loader, which imports no backend module).  CuPy is imported lazily, inside functions, via
``backends/gpu.py``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from gpuclust import _kernels
from gpuclust.backends.gpu import sm_count
from gpuclust.backends.moments_cpu import check_grouped_comoments, finish_comoments, merge_moments_xp
from gpuclust.partials import Moments

__all__ = ["INSTANTIATIONS", "KERNEL_FILE", "MAX_D", "grouped_comoments", "merge_moments"]

KERNEL_FILE = "grouped_moments.cu"
#: Largest number of variables the CUDA kernels are instantiated for (CPI, MAI, util, ntasks).
MAX_D = 4
#: Threads per block (a multiple of 32: kernels combine rows across whole warps).
BLOCK = 256
#: Shared-memory budget for a block-private accumulator copy (48 KiB needs no opt-in).
SHARED_BYTES = 48 * 1024

#: Kernel template -> template-argument tuples ``(T, C, D)``: this file's entry of the loader's
#: table (declared there, so the loader imports no backend module).
INSTANTIATIONS: dict[str, list[tuple[str, ...]]] = _kernels.INSTANTIATIONS[KERNEL_FILE]
assert all(int(a[2]) <= MAX_D for args in INSTANTIATIONS.values() for a in args)

_PTR = "ptr"
#: Declared kernel parameter lists (name, NumPy scalar type or "ptr"), in CUDA signature order.
SUMS_PARAMS: tuple[tuple[str, Any], ...] = (
    ("x", _PTR),
    ("w", _PTR),
    ("group", _PTR),
    ("n", np.int64),
    ("n_groups", np.int64),
    ("out", _PTR),
)
CENTERED_PARAMS: tuple[tuple[str, Any], ...] = (
    ("x", _PTR),
    ("w", _PTR),
    ("group", _PTR),
    ("m0", _PTR),
    ("n", np.int64),
    ("n_groups", np.int64),
    ("out", _PTR),
)
#: C parameter types per kernel family, ``{T}`` / ``{C}`` substituted (used by the nvcc test to
#: write explicit instantiations; must match the signatures in grouped_moments.cu).
C_SIGNATURES: dict[str, str] = {
    "comoments_sums": "const {T}*, const double*, const {C}*, long long, long long, double*",
    "comoments_centered": "const {T}*, const double*, const {C}*, const double*, long long, long long, double*",
}

_CTYPE = {
    np.dtype(np.float32): "float",
    np.dtype(np.float64): "double",
    np.dtype(np.int32): "int",
    np.dtype(np.int64): "long long",
}


def _cupy() -> Any:
    # CuPy is imported (lazily) only through backends/gpu.py, the module the lint rule allows.
    from gpuclust.backends.gpu import _cupy as gpu_cupy

    return gpu_cupy()


def _launch(kernel: Any, n_rows: int, params: tuple[tuple[str, Any], ...], shared_mem: int, **named: Any) -> None:
    missing = [p for p, _ in params if p not in named]
    extra = sorted(set(named) - {p for p, _ in params})
    if missing or extra:
        raise TypeError(f"kernel arguments: missing {missing}, unexpected {extra}")
    args = tuple(named[p] if t is _PTR else t(named[p]) for p, t in params)
    sms = sm_count()
    # Shared variants flush n_groups * K cells per block: fewer, fuller blocks amortise that.
    per_sm = 4 if shared_mem else 8
    blocks = max(1, min(-(-n_rows // BLOCK), sms * per_sm))
    kernel((blocks,), (BLOCK,), args, shared_mem=shared_mem)


def _function(template: str, args: tuple[str, ...]) -> Any:
    return _kernels.get_function(KERNEL_FILE, template, args)


def grouped_comoments(x: Any, w: Any, group: Any, n_groups: int) -> Moments:
    """GPU twin of :func:`gpuclust.backends.moments_cpu.grouped_comoments` (same arguments, result).

    ``x`` float32/float64 ``(n, d)`` with ``1 <= d <= MAX_D``, ``w`` float64, ``group``
    int32/int64, all C-contiguous CuPy arrays.  Returns :class:`Moments` of CuPy arrays.
    Uses the ``*_shared`` kernels when ``n_groups * K`` doubles fit in :data:`SHARED_BYTES`, else
    ``*_global`` (see kernels/grouped_moments.cu for the contention strategy).
    """
    cp = _cupy()
    n, d = check_grouped_comoments(x, w, group, n_groups)
    if d > MAX_D:
        raise ValueError(
            f"the GPU grouped_comoments supports up to {MAX_D} variables, got {d}; "
            "split the variables or use backend='cpu'"
        )
    G = int(n_groups)
    k1, k2 = 2 + d, d + d * (d + 1) // 2
    acc1 = cp.zeros((G, k1), dtype=cp.float64)
    acc2 = cp.zeros((G, k2), dtype=cp.float64)
    m0 = cp.zeros((G, d), dtype=cp.float64)
    if n > 0 and G > 0:
        targs = (_CTYPE[x.dtype], _CTYPE[group.dtype], str(d))
        small1 = G * k1 * 8 <= SHARED_BYTES
        kern = _function("gpuclust::comoments_sums_shared" if small1 else "gpuclust::comoments_sums_global", targs)
        _launch(kern, n, SUMS_PARAMS, G * k1 * 8 if small1 else 0, x=x, w=w, group=group, n=n, n_groups=G, out=acc1)
        W = acc1[:, 1]
        has = W > 0
        m0 = cp.ascontiguousarray(cp.where(has[:, None], acc1[:, 2:] / cp.where(has, W, 1.0)[:, None], 0.0))
        small2 = G * k2 * 8 <= SHARED_BYTES
        kern = _function(
            "gpuclust::comoments_centered_shared" if small2 else "gpuclust::comoments_centered_global", targs
        )
        _launch(
            kern,
            n,
            CENTERED_PARAMS,
            G * k2 * 8 if small2 else 0,
            x=x,
            w=w,
            group=group,
            m0=m0,
            n=n,
            n_groups=G,
            out=acc2,
        )
    return finish_comoments(cp, acc1, acc2, m0, d)


def merge_moments(a: Moments, b: Moments) -> Moments:
    """GPU twin of :func:`gpuclust.backends.moments_cpu.merge_moments` (CuPy arrays in and out)."""
    return merge_moments_xp(_cupy(), a, b)
