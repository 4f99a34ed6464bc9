"""The whole-cell projection of ``bench/gpu_check.py``: one 2019 cell, all 13 analyses, in minutes,
from the check's measured out-of-core rate, and what the key passes of the dense sums add at a
cell's size.

A whole cell cannot be resident (~150 B a window: 400 GB), so it streams: the projection is the
out-of-core seconds per window times a cell's windows.  The check's data holds 1,000 machines
over a few weeks, where overcommit's, cpi's and machine-utilization's dense keyed sums (machine x
bucket) fit the device's room for them; at a cell's 12,500 machines over 31 days some may not,
and a run takes those in key passes over ranges of machines (``gpuclust/engine/key_passes.py``),
each further pass a read of the analysis' columns: about the analysis' own out-of-core time again.
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
    (``DEVICE_DENSE_SHARE`` of its memory, all the analyses' together; None on the cpu backend,
    which takes no key passes)."""
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
    the passes over its key ranges and the further reads of its columns the device's room takes
    (as the engine places them: one room for all, those that fit the largest first,
    :func:`gpuclust.engine.shards.dense_targets`; each other in ``ceil(bytes / room)`` passes, the
    run's own stream the first where what is left holds it, each other a read more,
    :func:`gpuclust.engine.key_passes.key_passes`), and the minutes those reads add (each
    about the analysis' own out-of-core seconds per window, ``ooc_s``, times a cell's windows).
    None without a room (no device) or without the data's days.

    >>> d = {"analyses": {"overcommit": {"bytes": 1_000, "machines": 1_250}, "cpi": {"bytes": 100, "machines": 1_250}},
    ...      "days": 3.1, "room_bytes": 40_000}
    >>> r = key_passes_at_cell(d, {"overcommit": 27.0, "cpi": 9.0}, 2_700_000)
    >>> [(n, v["cell_bytes"], v["passes"], v["reads"]) for n, v in r["analyses"].items()]
    [('overcommit', 100000, 3, 3), ('cpi', 10000, 1, 0)]
    >>> round(r["extra_min"], 9)
    1350.0
    >>> d["room_bytes"] = 110_000  # both on the device at once
    >>> key_passes_at_cell(d, {"overcommit": 27.0, "cpi": 9.0}, 2_700_000)["extra_min"]
    0.0
    """
    from gpuclust.engine.shards import DeviceRoom

    room_bytes, days = dense.get("room_bytes"), dense.get("days")
    if not room_bytes or not days or not windows:
        return None
    room = DeviceRoom(total=room_bytes)
    out: dict[str, Any] = {"room_bytes": room_bytes, "analyses": {}, "extra_min": 0.0}
    cells = {
        n: d["bytes"] * (CELL_MACHINES / max(1, d["machines"])) * (CELL_DAYS / days)
        for n, d in dense.get("analyses", {}).items()
    }
    placed = {n for n, cell in sorted(cells.items(), key=lambda kv: -kv[1]) if room.take(cell)}
    for n, cell in cells.items():  # (the others' passes in the run's order)
        passes = 1 if n in placed else max(1, math.ceil(cell / room_bytes))
        reads = 0 if n in placed else passes - (passes > 1 and room.take(cell / passes))
        s = ooc_s.get(n)
        extra = reads * s / windows * CELL_WINDOWS / 60 if s is not None else None
        out["analyses"][n] = {"cell_bytes": round(cell), "passes": passes, "reads": reads, "extra_min": extra}
        if extra is None:  # (an analysis not timed out of core: no projection of its passes)
            out["extra_min"] = None
        elif out["extra_min"] is not None:
            out["extra_min"] += extra
    return out
