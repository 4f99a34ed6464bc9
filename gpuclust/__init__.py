"""gpuclust: GPU-accelerated analytics for the Google cluster-usage traces.

The public API.  ``import gpuclust`` never imports CuPy, cuDF or dask-cuda, and works on a
machine with no GPU.
"""

from __future__ import annotations

from gpuclust.schema import DATASET_FORMAT_VERSION, SCHEMAS, TABLES, TIER_MAPS, tier_map

__version__ = "0.1.0"

__all__ = ["DATASET_FORMAT_VERSION", "SCHEMAS", "TABLES", "TIER_MAPS", "__version__", "tier_map"]
