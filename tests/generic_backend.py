"""The cpu backend as the analyses' generic (GPU-shaped) code sees it: its ops without
``lookup_slot_tables``, so the cpu-only slot-table paths are off and the code the gpu backend runs
is exercised on NumPy (tests compare the two paths bit for bit)."""

from __future__ import annotations

import dataclasses
from typing import Any

from gpuclust.backends import get_backend

__all__ = ["CPU", "GENERIC"]


class _GenericOps:
    """The cpu backend's ops without ``lookup_slot_tables``."""

    def __init__(self, ops: Any):
        self._ops = ops

    def __getattr__(self, name: str) -> Any:
        if name == "lookup_slot_tables":
            return False
        return getattr(self._ops, name)


CPU = get_backend("cpu")
GENERIC = dataclasses.replace(CPU, ops=_GenericOps(CPU.ops))
