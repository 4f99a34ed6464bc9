"""Analyses: each declared once (a frozen dataclass), registered by name in :mod:`.registry`."""

from __future__ import annotations

from gpuclust.analyses.base import Analysis
from gpuclust.analyses.cell_usage import CellUsage
from gpuclust.analyses.cpi import Cpi
from gpuclust.analyses.machine_shapes import MachineShapes
from gpuclust.analyses.overcommit import Overcommit
from gpuclust.analyses.registry import REGISTRY, capability_table, create, names
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
