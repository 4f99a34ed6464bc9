"""Raw trace files -> the canonical gpuclust dataset.

``ingest(sources, out, ...)`` is the entry point (see :mod:`gpuclust.ingest.api`); readers live
in :mod:`gpuclust.ingest.readers`, one module per source format.
"""

from __future__ import annotations

from typing import Any

__all__ = ["IngestReport", "ingest"]


def __getattr__(name: str) -> Any:
    # Lazy: importing gpuclust.ingest.base (the reader contract) stays light.
    if name in ("ingest", "IngestReport", "FileReport", "IngestUsageError"):
        from gpuclust.ingest import api

        return getattr(api, name)
    raise AttributeError(f"module 'gpuclust.ingest' has no attribute {name!r}")
