"""The engine: partitions -> arrays on the chosen backend -> partials -> merge tree -> finalize.

Imports neither dask nor CuPy at import time (dask is imported when a scheduler is used, CuPy
when the gpu backend is).  Running analyses into a results folder (``gpuclust.analyze``) is the
report's: :func:`gpuclust.report.analyze.analyze`.
"""

from __future__ import annotations

from gpuclust.engine.local import run
from gpuclust.engine.partition import PartitionSpec, TableSource, plan_partitions
from gpuclust.engine.reading import read_partition

__all__ = ["PartitionSpec", "TableSource", "plan_partitions", "read_partition", "run"]
