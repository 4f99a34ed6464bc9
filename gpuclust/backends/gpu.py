"""CuPy backend: typed wrappers around gpuclust's CUDA kernels (``kernels/*.cu``).

Every op here has a NumPy twin with the same name and signature in ``backends/cpu.py`` (the test
oracle).  Wrappers check dtypes, shapes and contiguity (raising instead of converting), then
launch the kernel with *named* arguments ordered by the kernel's declared parameter list.

CuPy is imported lazily: importing this module never needs CuPy.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from gpuclust._kernels import CTYPE as _CTYPE
from gpuclust._kernels import GROUPED_SUM_PARAMS, SHARED_BYTES, sm_count
from gpuclust._kernels import PTR as _PTR
from gpuclust._kernels import launch as _launch
from gpuclust.backends.cpu import check_bucket_overlap, check_grouped_sum, check_hash_index

__all__ = [
    "bucket_overlap",
    "cupy_distributions",
    "device_count",
    "grouped_sum",
    "hash_index",
    "lookup_block_rows",
    "lookup_slot_tables",
    "require",
    "require_device",
    "sm_count",
]

#: ``backend.ops.lookup_block_rows``: None, a lookup is one launch over all its rows (the cpu
#: backend's is a cache-sized block).
lookup_block_rows: int | None = None
#: ``backend.ops.lookup_slot_tables``: False, lookups probe ``hash_index`` (the cpu backend's
#: host arrays probe a slot table instead).
lookup_slot_tables = False

#: How ``grouped_sum`` adds a warp's rows of one code together before its atomics: False, every
#: lane of a code (``__match_any_sync``, then a shuffle per lane that shares its code); True, the
#: runs of equal consecutive codes only (five shuffles of a segmented scan, accumulate.cuh's
#: ``warp_run_sum``).  bench/kernels_bench.py measures both on a device.
WARP_RUNS = False
# (BLOCK, SHARED_BYTES, the parameter lists' PTR and the launch: gpuclust._kernels)
#: Declared kernel parameter lists: (name, numpy scalar type or "ptr").  Kept next to the
#: wrappers and in the order of the CUDA signatures in kernels/*.cu.
BUCKET_OVERLAP_PARAMS: tuple[tuple[str, Any], ...] = (
    ("start", _PTR),
    ("end", _PTR),
    ("value", _PTR),
    ("k", np.int32),
    ("group", _PTR),
    ("n", np.int64),
    ("n_groups", np.int32),
    ("n_buckets", np.int64),
    ("origin", np.int64),
    ("width", np.int64),
    ("out", _PTR),
)


def _cupy() -> Any:
    import cupy

    return cupy


def device_count() -> int:
    """Number of visible CUDA devices; 0 when CuPy is missing or the runtime fails.  Never raises."""
    try:
        cp = _cupy()
        return int(cp.cuda.runtime.getDeviceCount())
    except Exception:
        return 0


#: CuPy, once :func:`require` found it usable (its checks read every installed distribution's
#: metadata: ~5 ms a call, which the mixture ops' calls added up to 0.4 s a run on an H200).
_REQUIRED: Any = None


def require() -> Any:
    """Return the :mod:`cupy` module, or raise a clear error when the GPU backend cannot run."""
    global _REQUIRED
    if _REQUIRED is not None:
        return _REQUIRED
    from gpuclust.errors import BackendUnavailable

    dists = cupy_distributions()
    if len(dists) > 1:
        raise BackendUnavailable(
            f"backend 'gpu': {len(dists)} CuPy distributions are installed ({', '.join(dists)}); they overwrite "
            "each other's files. Uninstall all but the one matching your CUDA driver's major version "
            "(nvidia-smi shows it), e.g. pip uninstall " + dists[0]
        )
    try:
        cp = _cupy()
    except Exception as e:
        raise BackendUnavailable(
            f"backend 'gpu' needs CuPy (pip install 'gpuclust[gpu-cu13]' for a CUDA 13 driver, '[gpu-cu12]' for CUDA 12): import cupy failed: {e}; "
            "use backend='cpu' to run on the CPU"
        ) from e
    try:
        n = int(cp.cuda.runtime.getDeviceCount())
    except Exception as e:
        raise BackendUnavailable(f"backend 'gpu': the CUDA runtime reports no usable device: {e}") from e
    if n == 0:
        raise BackendUnavailable("backend 'gpu': CuPy is installed but no CUDA device is visible")
    _REQUIRED = cp
    return cp


def cupy_distributions() -> list[str]:
    """Names of the installed CuPy distributions (``cupy``, ``cupy-cuda12x``, ``cupy-cuda13x``, ...)."""
    from importlib import metadata

    names = set()
    for d in metadata.distributions():
        name = (d.metadata["Name"] or "").lower().replace("_", "-")
        if name == "cupy" or (name.startswith("cupy-cuda") and name[9:10].isdigit()) or name.startswith("cupy-rocm"):
            names.add(name)
    return sorted(names)


def require_device(**arrays: Any) -> None:
    """Raise ``TypeError`` naming the argument when one of ``arrays`` is not a CuPy array (the
    gpu ops never copy host arrays implicitly)."""
    cp = _cupy()
    for name, a in arrays.items():
        if not isinstance(a, cp.ndarray):
            raise TypeError(
                f"{name} must be a CuPy (device) array, got {type(a).__module__}.{type(a).__name__}; "
                f"pass cupy.asarray({name})"
            )


def bucket_overlap(
    start: Any, end: Any, value: Any, group: Any, *, n_groups: int, n_buckets: int, origin: int, width: int
) -> Any:
    """GPU twin of :func:`gpuclust.backends.cpu.bucket_overlap` (same arguments and result).

    One launch for all series of a 2-D ``value`` (the intervals read and the keys matched once per
    step for every series).  Uses ``bucket_overlap_shared`` (block-local shared-memory
    accumulator) when the whole ``(k, n_groups, n_buckets)`` output fits in :data:`SHARED_BYTES`,
    else ``bucket_overlap_global``; both aggregate equal (group, bucket) keys across a warp before
    any atomic (see docs/developer/kernels.md).
    """
    from gpuclust import _kernels

    cp = _cupy()
    n = check_bucket_overlap(start, end, value, group, n_groups, n_buckets, origin, width)
    k = int(value.shape[0]) if value.ndim == 2 else 1
    out = cp.zeros((k, n_groups, n_buckets) if value.ndim == 2 else (n_groups, n_buckets), dtype=cp.float64)
    cells = k * n_groups * n_buckets
    if n == 0 or cells == 0:
        return out
    small = cells * 8 <= SHARED_BYTES
    tmpl = "gpuclust::bucket_overlap_shared" if small else "gpuclust::bucket_overlap_global"
    kernel = _kernels.get_function("bucket_overlap.cu", tmpl, (_CTYPE[value.dtype],))
    _launch(
        kernel,
        n,
        BUCKET_OVERLAP_PARAMS,
        shared_mem=cells * 8 if small else 0,
        start=start,
        end=end,
        value=value,
        k=k,
        group=group,
        n=n,
        n_groups=n_groups,
        n_buckets=n_buckets,
        origin=origin,
        width=width,
        out=out,
    )
    return out


def grouped_sum(codes: Any, values: Any, *, n_groups: int) -> Any:
    """GPU twin of :func:`gpuclust.backends.cpu.grouped_sum` (same arguments and result)."""
    from gpuclust import _kernels

    cp = _cupy()
    n = check_grouped_sum(codes, values, n_groups)
    out = cp.zeros(n_groups, dtype=cp.float64)
    if n == 0 or n_groups == 0:
        return out
    small = n_groups * 8 <= SHARED_BYTES
    tmpl = f"gpuclust::grouped_sum{'_runs' if WARP_RUNS else ''}_{'shared' if small else 'global'}"
    kernel = _kernels.get_function("grouped_sum.cu", tmpl, (_CTYPE[codes.dtype], _CTYPE[values.dtype]))
    _launch(
        kernel,
        n,
        GROUPED_SUM_PARAMS,
        shared_mem=n_groups * 8 if small else 0,
        codes=codes,
        values=values,
        n=n,
        n_groups=n_groups,
        out=out,
    )
    return out


def hash_index(keys: Any, queries: Any) -> Any:
    """GPU twin of :func:`gpuclust.backends.cpu.hash_index`: a binary search of the sorted keys
    (CuPy's ``searchsorted``), -1 where a query is absent."""
    cp = _cupy()
    check_hash_index(keys, queries)
    if keys.shape[0] == 0 or queries.shape[0] == 0:
        return cp.full(queries.shape[0], -1, dtype=cp.int64)
    pos = cp.clip(cp.searchsorted(keys, queries), 0, keys.shape[0] - 1)
    return cp.where(keys[pos] == queries, pos, -1).astype(cp.int64)
