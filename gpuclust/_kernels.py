"""Loading gpuclust's CUDA kernels: find ``kernels/``, inline local includes, compile with CuPy.

One :class:`cupy.RawModule` per ``.cu`` file, template arguments and device, memoised: a run
compiles only the instantiations it uses.  Template instantiations are
*declared* in :data:`INSTANTIATIONS` (kernel template name x tuples of template arguments); the
``name_expressions`` handed to NVRTC are generated from that table, and ``tests/kernels/test_nvcc.py``
instantiates exactly the same list when it compiles every file with ``nvcc``.  No f-string CUDA,
no jitify: the CUDA source is read verbatim from the ``.cu`` file; local ``#include "x.cuh"`` lines
are replaced by the header's text (recursively, once per header), so editing a header changes the
compiled source and therefore CuPy's cache key.

This module imports CuPy lazily (only :func:`get_module` / :func:`get_function` need it).
"""

from __future__ import annotations

import itertools
import re
import threading
from functools import cache
from pathlib import Path
from typing import Any

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
    "grouped_sum.cu": {
        "gpuclust::grouped_sum_shared": list(itertools.product(_CODES, _FLOATS)),
        "gpuclust::grouped_sum_global": list(itertools.product(_CODES, _FLOATS)),
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
