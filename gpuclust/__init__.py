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

from typing import Any

from gpuclust.schema import DATASET_FORMAT_VERSION, SCHEMAS, TABLES, TIER_MAPS, tier_map

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
    "open",
    "run",
    "synthesize",
    "tier_map",
]

_LAZY = {
    "Dataset": ("gpuclust.dataset", "Dataset"),
    "analyze": ("gpuclust.engine", "analyze"),
    "run": ("gpuclust.engine", "run"),
    "ingest": ("gpuclust.ingest", "ingest"),
    "open": ("gpuclust.engine.study", "open_study"),
    "synthesize": ("gpuclust.synth", "synthesize"),
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        mod, attr = _LAZY[name]
        return getattr(importlib.import_module(mod), attr)
    raise AttributeError(f"module 'gpuclust' has no attribute {name!r}")
