"""gpuclust: GPU-accelerated analytics for the Google cluster-usage traces.

The public API.  ``import gpuclust`` never imports CuPy, cuDF, dask or dask-cuda, and works on a
machine with no GPU; the engine (and pandas) load on first use of :func:`analyze` / :func:`run`.

Examples
--------
>>> import gpuclust
>>> sorted(gpuclust.TIER_MAPS)
['notebook', 'seed-002', 'v2', 'v3-doc']
"""

from __future__ import annotations

import os as _os
import sys as _sys
from typing import Any


def _as_program() -> bool:
    """Whether this process is the ``gpuclust`` command (the console script, ``python -m
    gpuclust`` or ``python -m gpuclust.cli``), not a program importing the library."""
    orig = list(getattr(_sys, "orig_argv", []))
    module = next((orig[k + 1] for k, a in enumerate(orig[:-1]) if a == "-m"), None)
    return module in ("gpuclust", "gpuclust.cli") or _os.path.basename(_sys.argv[0] if _sys.argv else "") == "gpuclust"


# The command runs OpenBLAS single-threaded unless the user says otherwise: loading it with a
# thread per core costs ~40 ms of every run's start on the 2-core VM (more with more cores), and
# gpuclust's only BLAS work is batched small solves (cpi's regressions), which one thread serves.
if _as_program() and "numpy" not in _sys.modules:
    _os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

# One malloc arena (glibc), set before pyarrow's import starts a thread that would make a second
# one (gpuclust/_memory.py); GPUCLUST_MALLOC_TUNING=0 leaves the allocator alone.
from gpuclust._memory import cap_arenas as _cap_arenas  # noqa: E402

_cap_arenas()

from gpuclust.schema import DATASET_FORMAT_VERSION, SCHEMAS, TABLES, TIER_MAPS, tier_map  # noqa: E402

__version__ = "0.1.0"

__all__ = [
    "DATASET_FORMAT_VERSION",
    "SCHEMAS",
    "TABLES",
    "TIER_MAPS",
    "Dataset",
    "__version__",
    "analyze",
    "ingest",
    "load_results",
    "open",
    "run",
    "synthesize",
    "tier_map",
]

_LAZY = {
    "Dataset": ("gpuclust.dataset", "Dataset"),
    "analyze": ("gpuclust.report.analyze", "analyze"),
    "run": ("gpuclust.engine", "run"),
    "ingest": ("gpuclust.ingest", "ingest"),
    "load_results": ("gpuclust.report.provenance", "load_results"),
    "open": ("gpuclust.engine.study", "open_study"),
    "synthesize": ("gpuclust.synth", "synthesize"),
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        mod, attr = _LAZY[name]
        return getattr(importlib.import_module(mod), attr)
    raise AttributeError(f"module 'gpuclust' has no attribute {name!r}")
