"""Analyses: each declared once (a frozen dataclass), registered by name in :mod:`.registry`."""

from __future__ import annotations

from gpuclust.analyses.base import Analysis
from gpuclust.analyses.cell_usage import CellUsage
from gpuclust.analyses.machine_shapes import MachineShapes
from gpuclust.analyses.registry import REGISTRY, capability_table, create, names

__all__ = ["REGISTRY", "Analysis", "CellUsage", "MachineShapes", "capability_table", "create", "names"]
