"""Value domains of the canonical columns: what the v3 spec allows, checked on ingest.

:func:`gpuclust.ingest.normalize.conform` calls :func:`check_domain` on every column after the
type cast, so every reader (v3 JSON and Parquet, v2 CSV, Kaggle CSV) applies the same policy.
A value outside its domain rejects its row with a reason; the other rows are kept.

Policy (``docs/user/ingest.md``, "Value domains"):

* **Times** (``time``, ``start_time``, ``end_time``) are microseconds since 600 s before the
  trace start and never negative.  ``0`` ("before the trace window") and ``2^63 - 1`` ("after
  it") are the spec's sentinels and are kept as they are.
* **Resources** (every float column: capacities, requests, usage, CPI, MAI, sample rate,
  percentiles) must be finite numbers: ``NaN`` and ``inf`` (quoted or not) are rejected, and so
  are negative values.
* **Capacities and requests** (``cap_cpu``, ``cap_mem``, ``req_cpu``, ``req_mem``) are
  normalised by the largest machine of all the traces, so they lie in ``[0, 1]``; above 1 is
  rejected.  Usage is not bounded above (an alloc instance reports the sum of its tasks).
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from gpuclust.ingest import arrays

#: Time columns: int64 microseconds, never negative (0 and 2^63-1 are sentinels).
TIME_COLUMNS = frozenset({"time", "start_time", "end_time"})
#: Normalised capacities and requests: within [0, 1].
UNIT_COLUMNS = frozenset({"cap_cpu", "cap_mem", "req_cpu", "req_mem"})


def _mark(mask: np.ndarray, bad: np.ndarray, why: list[str | None], reason: object) -> None:
    """Reject the rows of ``mask``; ``reason(i)`` names the first problem of a row not yet bad."""
    if not mask.any():
        return
    for i in np.flatnonzero(mask & ~bad):
        why[i] = reason(int(i))  # type: ignore[operator]
    bad |= mask


def check_domain(col: str, arr: pa.Array, bad: np.ndarray, why: list[str | None]) -> None:
    """Mark the rows of ``arr`` (canonical column ``col``, already cast) outside the column's domain."""
    if col in TIME_COLUMNS and pa.types.is_integer(arr.type):
        v = arrays.values(arr, fill=0)
        neg = v < 0
        _mark(
            neg,
            bad,
            why,
            lambda i: (
                f"column {col}: negative time {int(v[i])} (only 0 = before the trace and 2^63-1 = after are special)"
            ),
        )
        return
    if not pa.types.is_floating(arr.type):
        return
    f = arrays.values(arr).astype(np.float64)
    valid = arrays.valid(arr)
    with np.errstate(invalid="ignore"):
        nonfinite = valid & ~np.isfinite(f)
        neg = valid & (f < 0)
        over = valid & (f > 1) & np.isfinite(f) if col in UNIT_COLUMNS else None
    _mark(nonfinite, bad, why, lambda i: f"column {col}: {f[i]!r} is not a finite number")
    _mark(neg, bad, why, lambda i: f"column {col}: negative value {float(f[i])!r}")
    if over is not None:
        _mark(
            over,
            bad,
            why,
            lambda i: f"column {col}: {float(f[i])!r} above 1 (capacities and requests are normalised to [0, 1])",
        )
