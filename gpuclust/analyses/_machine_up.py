"""The up time of ``machine-utilization``'s time-weighted mode: where its window starts
(:func:`min_start`, the earliest ``start_time`` of instance_usage) and, per shard of machines, the
seconds each machine is up in each bucket and its capacity-seconds there (:func:`up_grid`, swept
from the machines' up pieces, :func:`gpuclust.analyses._intervals.capacity_intervals`).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from gpuclust.analyses._extent import to_i64
from gpuclust.backends import finalize_backend
from gpuclust.schema import TIME_AFTER_TRACE

__all__ = ["min_start", "up_grid"]


def min_start(source: Any) -> int | None:
    """The earliest ``start_time`` of instance_usage at or above 0 and below 2^63-1 (``None``: no
    such value), from Parquet row-group statistics where they can be trusted (else the row group
    is read); an in-memory source reads the column."""

    def low(a: np.ndarray) -> int | None:
        a = a[(a >= 0) & (a < TIME_AFTER_TRACE)]
        return int(a.min()) if a.size else None

    files = source.files("instance_usage") if hasattr(source, "files") else None
    if not files:
        return low(to_i64(source.read("instance_usage", ["start_time"]).column(0)))
    import pyarrow.parquet as pq

    best: int | None = None
    for f in files:
        pf = pq.ParquetFile(f)
        md = pf.metadata
        j = md.schema.to_arrow_schema().get_field_index("start_time")
        for g in range(md.num_row_groups):
            if md.row_group(g).num_rows == 0:
                continue
            st = md.row_group(g).column(j).statistics
            if st is not None and st.has_min_max and 0 <= int(st.min) < TIME_AFTER_TRACE:
                v: int | None = int(st.min)
            else:
                v = low(to_i64(pf.read_row_group(g, columns=["start_time"]).column(0)))
            if v is not None:
                best = v if best is None else min(best, v)
    return best


def up_grid(
    up: dict[str, np.ndarray] | None, lo: int, hi: int, span: int, width: int, be: Any = None
) -> tuple[Any, dict[str, Any]]:
    """Dense over machine codes ``[lo, hi)`` x the ``span`` buckets of ``width`` µs (flat,
    machine-major): the seconds each machine is up, and per resource (``cpu``, ``mem``) its
    capacity-seconds there (NaN where an up piece has an unknown capacity), swept from the shard's
    up pieces (``up``: the context's code, start, end, cap_cpu, cap_mem, sorted by code) by
    backend ``be``'s ``bucket_overlap`` (default the cpu's; what ``overcommit`` sweeps its
    capacity with), as arrays of that backend (the pieces are copied there).  A shard holds at
    most about ``machine_utilization.SHARD_CELLS`` machine-buckets (or one machine), so nothing
    here grows with the cell."""
    be = finalize_backend("cpu") if be is None else be
    xp = be.xp
    cells = (hi - lo) * span
    if up is None:
        raise RuntimeError("machine-utilization: the time-weighted mode needs the context's up pieces")
    i0, i1 = np.searchsorted(up["code"], [lo, hi])
    if cells == 0 or i1 == i0:
        return xp.zeros(cells), {r: xp.zeros(cells) for r in ("cpu", "mem")}
    cc, cm = up["cap_cpu"][i0:i1], up["cap_mem"][i0:i1]
    vals = np.stack([np.ones(i1 - i0), cc, cm, np.isnan(cc).astype(np.float64), np.isnan(cm).astype(np.float64)])
    sw = be.ops.bucket_overlap(  # the shard's up pieces
        be.asarray(np.ascontiguousarray(up["start"][i0:i1])),
        be.asarray(np.ascontiguousarray(up["end"][i0:i1])),
        be.asarray(vals),
        be.asarray((up["code"][i0:i1] - lo).astype(np.int32)),
        n_groups=hi - lo,
        n_buckets=span,
        origin=0,
        width=width,
    ).reshape(5, cells)
    return sw[0], {"cpu": xp.where(sw[3] > 0, np.nan, sw[1]), "mem": xp.where(sw[4] > 0, np.nan, sw[2])}
