"""Loading and launching gpuclust's CUDA kernels: find ``kernels/``, inline local includes,
compile with CuPy, launch over a grid-stride loop (:func:`launch`); :func:`bincount` on CuPy.

One :class:`cupy.RawModule` per ``.cu`` file, template arguments and device, memoised: a run
compiles only the instantiations it uses.  Template instantiations are
*declared* in :data:`INSTANTIATIONS` (kernel template name x tuples of template arguments); the
``name_expressions`` handed to NVRTC are generated from that table, and ``tests/kernels/test_nvcc.py``
instantiates exactly the same list when it compiles every file with ``nvcc``.  No f-string CUDA,
no jitify: the CUDA source is read verbatim from the ``.cu`` file; local ``#include "x.cuh"`` lines
are replaced by the header's text (recursively, once per header), so editing a header changes the
compiled source and therefore CuPy's cache key.

This module imports CuPy lazily (only compiling and launching need it).
"""

from __future__ import annotations

import itertools
import re
import threading
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np

#: Compiler options used for every module (NVRTC through CuPy, and nvcc in the tests).
NVRTC_OPTIONS: tuple[str, ...] = ("-std=c++17",)

_FLOATS = ("float", "double")
_CODES = ("int", "long long")


class KernelSourceError(RuntimeError):
    """The kernels folder or a kernel source/header could not be found."""


#: file -> {kernel template -> list of template-argument tuples}.  The single source of truth for
#: which kernels exist; ``name_expressions(file)`` expands it.
INSTANTIATIONS: dict[str, dict[str, list[tuple[str, ...]]]] = {
    "bucket_overlap.cu": {
        "gpuclust::bucket_overlap_shared": [(t,) for t in _FLOATS],
        "gpuclust::bucket_overlap_global": [(t,) for t in _FLOATS],
    },
    # ops.grouped_sum (gpuclust/backends/gpu.py) and bincount (below; gpuclust._xp.bincount on CuPy)
    "grouped_sum.cu": {
        "gpuclust::grouped_sum_shared": list(itertools.product(_CODES, _FLOATS)),
        "gpuclust::grouped_sum_global": list(itertools.product(_CODES, _FLOATS)),
        "gpuclust::grouped_sum_runs_shared": list(itertools.product(_CODES, _FLOATS)),
        "gpuclust::grouped_sum_runs_global": list(itertools.product(_CODES, _FLOATS)),
        "gpuclust::bincount_shared": list(itertools.product(_CODES, _FLOATS)),
        "gpuclust::bincount_global": list(itertools.product(_CODES, _FLOATS)),
        # (the values are not read: the codes stand in for them)
        "gpuclust::bincount_count_shared": [(c, c) for c in _CODES],
        "gpuclust::bincount_count_global": [(c, c) for c in _CODES],
    },
    # (T, C, D): co-moments of up to 4 variables (CPI, MAI, util, ntasks); gpuclust/backends/moments_gpu.py
    "grouped_moments.cu": {
        t: list(itertools.product(_FLOATS, _CODES, ("1", "2", "3", "4")))
        for t in (
            "gpuclust::comoments_sums_shared",
            "gpuclust::comoments_sums_global",
            "gpuclust::comoments_centered_shared",
            "gpuclust::comoments_centered_global",
        )
    },
    # gpuclust/backends/mixture_gpu.py
    "mixture.cu": {
        "gpuclust::mixture_repair": [("float",), ("double",)],
        "gpuclust::mixture_window_means": [("float",), ("double",)],
        "gpuclust::mixture_sweep": [("double",)],
        "gpuclust::mixture_tile_slope": [("double",)],
        "gpuclust::mixture_tile_carry": [("gpuclust::TileSum",), ("gpuclust::TileMax",)],
        "gpuclust::mixture_tile_slopes": [("double",)],
        "gpuclust::mixture_tile_cdf": [("double",)],
        "gpuclust::mixture_tile_max": [("double",)],
        "gpuclust::mixture_invert": [("double",)],
    },
}


_INCLUDE_RE = re.compile(r'^[ \t]*#[ \t]*include[ \t]*"([^"]+)"[ \t]*$', re.MULTILINE)


def kernels_dir() -> Path:
    """The folder holding the ``.cu`` sources.

    An installed wheel carries them as ``gpuclust/kernels`` (setup.py maps that package to kernels/); a source
    checkout has them at ``<repo>/kernels``.  The installed copy wins when both exist.
    """
    here = Path(__file__).resolve().parent
    for cand in (here / "kernels", here.parent / "kernels"):
        if cand.is_dir() and any(cand.glob("*.cu")):
            return cand
    raise KernelSourceError(f"no kernels folder with .cu files next to {here} or {here.parent}")


def kernel_files() -> list[str]:
    """Names of the declared kernel files (keys of :data:`INSTANTIATIONS`)."""
    return sorted(INSTANTIATIONS)


def name_expression(template: str, args: tuple[str, ...]) -> str:
    """``'ns::kernel<float, double>'`` for a template name and its arguments."""
    return template + "<" + ", ".join(args) + ">"


def name_expressions(filename: str) -> list[str]:
    """All name expressions declared for ``filename``, in a stable order."""
    try:
        decl = INSTANTIATIONS[filename]
    except KeyError:
        raise KernelSourceError(f"no instantiations declared for {filename!r}") from None
    return [name_expression(t, a) for t, args in decl.items() for a in args]


def load_source(filename: str, directory: Path | None = None) -> str:
    """The source of ``filename`` with local ``#include "x"`` lines inlined recursively.

    Each header is inlined once (later includes of the same header become a comment), which
    also makes include cycles harmless.
    """
    d = directory if directory is not None else kernels_dir()
    seen: set[str] = set()

    def expand(name: str, stack: tuple[str, ...]) -> str:
        path = d / name
        if not path.is_file():
            raise KernelSourceError(f"kernel source {name!r} not found in {d} (included from {list(stack)})")
        text = path.read_text()

        def repl(m: re.Match[str]) -> str:
            inc = m.group(1)
            if inc in seen:
                return f"// (already inlined: {inc})"
            seen.add(inc)
            return f"// ---- begin {inc}\n{expand(inc, stack + (name,))}\n// ---- end {inc}"

        return _INCLUDE_RE.sub(repl, text)

    seen.add(filename)
    return expand(filename, ())


_lock = threading.Lock()
_modules: dict[tuple[str, tuple[str, ...], int], Any] = {}


def module_expressions(filename: str, args: tuple[str, ...]) -> list[str]:
    """The name expressions compiled together with any kernel ``<args>`` of ``filename``: every
    template of the file declared with those template arguments (e.g. grouped_moments.cu's four
    passes of one ``(T, C, D)``)."""
    exprs = [name_expression(t, a) for t, decl in INSTANTIATIONS[filename].items() for a in decl if a == args]
    if not exprs:
        raise KernelSourceError(f"no kernel of {filename} is declared with template arguments {args}")
    return exprs


def get_module(filename: str, args: tuple[str, ...]) -> Any:
    """The compiled :class:`cupy.RawModule` of ``filename``'s kernels with template arguments
    ``args`` (:func:`module_expressions`) on the current device (memoised).  A run compiles only
    the instantiations it uses: NVRTC's time grows with the kernels in a module (nvcc, sm_90: all
    64 of grouped_moments.cu 4.9 s, the four of one ``(T, C, D)`` 0.5 s), which a process with a
    cold kernel cache pays on first use."""
    import cupy

    dev = cupy.cuda.Device().id
    key = (filename, tuple(args), dev)
    with _lock:
        mod = _modules.get(key)
        if mod is None:
            mod = cupy.RawModule(
                code=_source_cached(filename),
                options=NVRTC_OPTIONS,
                name_expressions=module_expressions(filename, tuple(args)),
            )
            mod.compile()
            _modules[key] = mod
    return mod


@cache
def _source_cached(filename: str) -> str:
    return load_source(filename)


def get_function(filename: str, template: str, args: tuple[str, ...]) -> Any:
    """The kernel ``template<args>`` from ``filename``; it must be declared in :data:`INSTANTIATIONS`."""
    expr = name_expression(template, args)
    if expr not in name_expressions(filename):
        raise KernelSourceError(f"{expr} is not a declared instantiation of {filename}")
    return get_module(filename, tuple(args)).get_function(expr)


# ------------------------------------------------------------------ launching
#: Threads per block (a multiple of 32: kernels aggregate across whole warps).
BLOCK = 256
#: Shared-memory budget for block-local accumulators, in bytes (48 KiB is always available
#: without opting in to larger dynamic shared memory).
SHARED_BYTES = 48 * 1024
#: A pointer parameter in a declared kernel parameter list (else a NumPy scalar type).
PTR = "ptr"
#: The CUDA type of a template argument, by NumPy dtype.
CTYPE = {
    np.dtype(np.float32): "float",
    np.dtype(np.float64): "double",
    np.dtype(np.int32): "int",
    np.dtype(np.int64): "long long",
}
#: grouped_sum.cu's parameter list (every kernel of the file).
GROUPED_SUM_PARAMS: tuple[tuple[str, Any], ...] = (
    ("codes", PTR),
    ("values", PTR),
    ("n", np.int64),
    ("n_groups", np.int64),
    ("out", PTR),
)


@cache
def _sm_count(device_id: int) -> int:
    import cupy

    return int(cupy.cuda.runtime.getDeviceProperties(device_id)["multiProcessorCount"])


def sm_count() -> int:
    """Multiprocessors of the current device (queried once per device, not per launch)."""
    import cupy

    return _sm_count(cupy.cuda.Device().id)


def launch(kernel: Any, n_items: int, params: tuple[tuple[str, Any], ...], shared_mem: int = 0, **named: Any) -> None:
    """Launch ``kernel`` over ``n_items`` rows (a grid-stride loop: at most 8 blocks of
    :data:`BLOCK` threads per multiprocessor) with the arguments ``named``, ordered by its
    declared parameter list ``params``."""
    missing = [p for p, _ in params if p not in named]
    extra = sorted(set(named) - {p for p, _ in params})
    if missing or extra:
        raise TypeError(f"kernel arguments: missing {missing}, unexpected {extra}")
    args = tuple(named[p] if t is PTR else t(named[p]) for p, t in params)
    blocks = max(1, min(-(-n_items // BLOCK), sm_count() * 8))
    kernel((blocks,), (BLOCK,), args, shared_mem=shared_mem)


def bincount(x: Any, weights: Any = None, minlength: int = 0, bounded: bool = False) -> Any:
    """``cupy.bincount(x, weights, minlength)`` (the same result: int64 counts, or float64 sums of
    the weights, NaN included) by grouped_sum.cu's kernels, which add a warp's equal codes
    together and, up to :data:`SHARED_BYTES` of bins, into a block's copy in shared memory
    before any global atomic; CuPy's adds every row to global memory by its own atomic (on an
    H200, 16 bins: 0.9% of the copy bandwidth against 19%; one bin, a run of sorted rows, is
    worse still).  One sync, for the codes' range (CuPy's takes two); none where the caller
    says every code is in ``[0, minlength)`` (``bounded``: the output's length is ``minlength``; a
    code outside adds nothing).  ``x`` of one or more rows."""
    import cupy

    if x.ndim != 1 or x.dtype.kind not in "biu":
        raise TypeError(f"bincount: x must be a 1-D integer array, got {x.dtype} of shape {x.shape}")
    if weights is not None and weights.shape != x.shape:
        raise ValueError(f"bincount: weights of shape {weights.shape} for x of shape {x.shape}")
    codes = x if x.dtype in (np.int32, np.int64) else x.astype(np.int64)
    n_bins = int(minlength)
    if not bounded:
        lo, hi = (int(v) for v in cupy.stack([codes.min().astype(np.int64), codes.max().astype(np.int64)]).get())
        if lo < 0:
            raise ValueError(f"bincount: x must be non-negative, got {lo}")
        n_bins = max(hi + 1, n_bins)
    out = cupy.zeros(n_bins, dtype=np.float64)
    small = n_bins * 8 <= SHARED_BYTES
    if weights is None:
        name, values, targs = "bincount_count", codes, (CTYPE[codes.dtype], CTYPE[codes.dtype])
    else:
        values = weights if weights.dtype in (np.float32, np.float64) else weights.astype(np.float64)
        name, targs = "bincount", (CTYPE[codes.dtype], CTYPE[values.dtype])
    kernel = get_function("grouped_sum.cu", f"gpuclust::{name}_{'shared' if small else 'global'}", targs)
    n = int(codes.shape[0])
    named = {"codes": cupy.ascontiguousarray(codes), "values": cupy.ascontiguousarray(values), "out": out}
    launch(kernel, n, GROUPED_SUM_PARAMS, shared_mem=n_bins * 8 if small else 0, n=n, n_groups=n_bins, **named)
    return out if weights is not None else out.astype(np.int64)
