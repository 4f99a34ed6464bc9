"""Analyses: each declared once (a frozen dataclass), registered by name in :mod:`.registry`.

The analysis classes exported here are imported when first used (``from gpuclust.analyses import
Cpi`` imports the cpi module only), so that a run of one analysis does not import the others.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from gpuclust.analyses.base import Analysis
from gpuclust.analyses.registry import REGISTRY, capability_table, create, names

if TYPE_CHECKING:
    from gpuclust.analyses.cell_usage import CellUsage
    from gpuclust.analyses.cpi import Cpi
    from gpuclust.analyses.machine_shapes import MachineShapes
    from gpuclust.analyses.overcommit import Overcommit
    from gpuclust.analyses.usage_distribution import UsageDistribution

__all__ = [
    "REGISTRY",
    "Analysis",
    "CellUsage",
    "Cpi",
    "MachineShapes",
    "Overcommit",
    "UsageDistribution",
    "capability_table",
    "create",
    "names",
]

_CLASSES = {
    "CellUsage": "cell_usage",
    "Cpi": "cpi",
    "MachineShapes": "machine_shapes",
    "Overcommit": "overcommit",
    "UsageDistribution": "usage_distribution",
}


def __getattr__(name: str) -> Any:
    if name in _CLASSES:
        return getattr(importlib.import_module(f"gpuclust.analyses.{_CLASSES[name]}"), name)
    raise AttributeError(f"module 'gpuclust.analyses' has no attribute {name!r}")
