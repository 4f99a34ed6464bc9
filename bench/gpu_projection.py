"""The whole-cell projection of ``bench/gpu_check.py``: one 2019 cell, all 13 analyses, in minutes,
from the check's measured out-of-core rate, and what the key passes of the dense sums add at a
cell's size.

A whole cell cannot be resident (~150 B a window: 400 GB), so it streams: the projection is the
out-of-core seconds per window times a cell's windows.  The check's data holds 1,000 machines
over a few weeks, where overcommit's, cpi's and machine-utilization's dense keyed sums (machine x
bucket) fit the device's room for them; a cell's 12,500 machines over 31 days do not, and a run
takes them in key passes over ranges of machines (``gpuclust/engine/key_passes.py``), each further
pass a read of the analysis' columns: about the analysis' own out-of-core time again.
:func:`dense_record` measures each dense plan on the node (bytes, machines, the data's days);
:func:`key_passes_at_cell` scales it to a cell and counts the passes.
"""

from __future__ import annotations

import math
from typing import Any

#: a 2019 cell's usage windows (the projection's size)
CELL_WINDOWS = 2.7e9
#: a 2019 cell's machines and days (the trace covers May 2019: seed 000, "Trace versions")
CELL_MACHINES = 12_500
CELL_DAYS = 31
DAY_US = 86_400 * 1_000_000


def dense_record(study: Any, names: list[str]) -> dict[str, Any]:
    """Per analysis with dense keyed sums, what a device run plans for this data: ``bytes`` (the
    accumulators, :func:`gpuclust.engine.shards.dense_plan`) and ``machines`` (the shard
    coordinates they span); the data's ``days``; the device's ``room_bytes`` for them
    (``DEVICE_DENSE_SHARE`` of its memory; None on the cpu backend, which takes no key passes)."""
    from gpuclust.analyses.registry import create
    from gpuclust.engine.selection import data_span
    from gpuclust.engine.shards import DEVICE_DENSE_SHARE, dense_plan

    out: dict[str, Any] = {"analyses": {}}
    for n in names:
        a = create(n)
        ctx = study.context(a)
        plan = dense_plan(a, ctx, True)
        if plan is not None:
            out["analyses"][n] = {"bytes": int(plan[1]), "machines": int(a.kinds.coordinates(ctx))}
    span = data_span(study.source, "instance_usage")
    out["days"] = (span["max"] - span["min"]) / DAY_US if span else None
    xp = study.backend.xp
    out["room_bytes"] = int(DEVICE_DENSE_SHARE * xp.cuda.Device().mem_info[1]) if xp.__name__ == "cupy" else None
    return out


def key_passes_at_cell(dense: dict[str, Any], ooc_s: dict[str, float], windows: int) -> dict[str, Any] | None:
    """Each dense analysis at a cell's size: its accumulators' bytes (scaled by machines and days),
    the passes over its key ranges the device's room takes, and the minutes the further passes
    add (each about the analysis' own out-of-core seconds per window, ``ooc_s``, times a cell's
    windows).  None without a room (no device) or without the data's days.

    >>> d = {"analyses": {"overcommit": {"bytes": 1_000, "machines": 1_250}}, "days": 3.1, "room_bytes": 40_000}
    >>> r = key_passes_at_cell(d, {"overcommit": 27.0}, 2_700_000)
    >>> r["analyses"]["overcommit"]["cell_bytes"], r["analyses"]["overcommit"]["passes"], round(r["extra_min"], 9)
    (100000, 3, 900.0)
    """
    room, days = dense.get("room_bytes"), dense.get("days")
    if not room or not days or not windows:
        return None
    out: dict[str, Any] = {"room_bytes": room, "analyses": {}, "extra_min": 0.0}
    for n, d in dense.get("analyses", {}).items():
        cell = d["bytes"] * (CELL_MACHINES / max(1, d["machines"])) * (CELL_DAYS / days)
        passes = max(1, math.ceil(cell / room))
        s = ooc_s.get(n)
        extra = (passes - 1) * s / windows * CELL_WINDOWS / 60 if s is not None else None
        out["analyses"][n] = {"cell_bytes": round(cell), "passes": passes, "extra_min": extra}
        if extra is None:  # (an analysis not timed out of core: no projection of its passes)
            out["extra_min"] = None
        elif out["extra_min"] is not None:
            out["extra_min"] += extra
    return out
