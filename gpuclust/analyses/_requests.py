"""The as-of join of usage windows to their instance's requests (shared by ``usage-vs-request``
and ``peak-prediction``).

:class:`RequestTimeline` holds the instance events that carry a positive request, sorted by
(instance hash, time, row); :func:`asof_events` finds, per window and per event flag (e.g. "CPU
request positive"), the latest flagged event of the window's (``collection_id``,
``instance_index``) at or before the window's start (an event at the same microsecond counts).
It runs on ``backend.xp`` (one lexsort of events and windows together, one segmented running
maximum per flag).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from gpuclust.analyses._lookup import triple_hash
from gpuclust.analyses.grouping import segmented_last

__all__ = ["REQUEST_COLUMNS", "RequestTimeline", "asof_events"]

#: The instance_events columns a :class:`RequestTimeline` reads (plus any ``extra``).
REQUEST_COLUMNS = ("time", "collection_id", "instance_index", "req_cpu", "req_mem")


@dataclass(frozen=True)
class RequestTimeline:
    """Events with a positive request, sorted by (instance hash, time, row): what windows are
    joined to as of their start.  ``extra`` holds further event columns (as float64, NULL as NaN)
    in the same order."""

    key: np.ndarray = field(default_factory=lambda: np.zeros(0, np.uint64))
    collection: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    instance: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int32))
    time: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    req: np.ndarray = field(default_factory=lambda: np.zeros((0, 2)))
    extra: dict[str, np.ndarray] = field(default_factory=dict)

    @classmethod
    def build(cls, side: Any, extra: Sequence[str] = ()) -> RequestTimeline:
        cols_needed = list(dict.fromkeys((*REQUEST_COLUMNS, *extra)))
        parts = [t for t in side.batches(cols_needed) if t.num_rows]
        if not parts:
            return cls(extra={c: np.zeros(0) for c in extra})
        cols = {c: np.concatenate([np.asarray(t.column(c).to_numpy(zero_copy_only=False)) for t in parts])
                for c in cols_needed}
        req = np.stack([np.nan_to_num(cols["req_cpu"].astype(np.float64), nan=0.0),
                        np.nan_to_num(cols["req_mem"].astype(np.float64), nan=0.0)], 1)
        keep = (req > 0).any(1)
        c, i, t = cols["collection_id"][keep].astype(np.int64), cols["instance_index"][keep].astype(np.int32), \
            cols["time"][keep].astype(np.int64)
        key = triple_hash(np, c, i, np.zeros_like(c))
        order = np.lexsort((t, key))  # stable: equal (key, time) keep their row order
        ex = {n: np.asarray(cols[n][keep], dtype=np.float64)[order] for n in extra}
        return cls(key[order], c[order], i[order], t[order], req[keep][order], ex)


def asof_events(backend: Any, rq: RequestTimeline, collection: Any, instance: Any, start: Any,
                flags: Sequence[np.ndarray], what: str) -> list[tuple[Any, Any]]:
    """Per flag (a boolean host array over ``rq``'s events) and per window (``collection``,
    ``instance``, ``start`` on ``backend.xp``): ``(hit, event)``, whether its instance has a flagged
    event at or before ``start`` and the index in ``rq`` of the latest one (0 where none), both in
    window order."""
    xp, ops = backend.xp, backend.ops
    n = int(start.shape[0])
    ne = int(rq.key.shape[0])
    if not ne or not n:
        return [(xp.zeros(n, dtype=bool), xp.zeros(n, dtype=xp.int64)) for _ in flags]
    c, i = collection.astype(xp.int64), instance
    # events and windows in one order by (instance, time), an event before a window at the same
    # time; each window takes the last flagged event of its instance run
    wkey = triple_hash(xp, c, i, xp.zeros_like(c))
    key = xp.concatenate([backend.stage(rq.key), wkey])
    t = xp.concatenate([backend.stage(rq.time), start])
    tag = xp.concatenate([xp.zeros(ne, xp.int64), xp.ones(n, xp.int64)])
    order = xp.lexsort(xp.stack([tag, t, key.view(xp.int64)]))
    ks = key[order]
    run_start = xp.ones(ks.shape[0], dtype=bool)
    run_start[1:] = ks[1:] != ks[:-1]
    first = segmented_last(ops, xp, run_start, 0)  # each row's run start
    is_win = order >= ne
    win_row = order[is_win] - ne
    ev_c, ev_i = backend.stage(rq.collection), backend.stage(rq.instance)
    out = []
    for flag in flags:
        fl = backend.stage(np.ascontiguousarray(flag, dtype=bool))
        has = order < ne
        has[has] = fl[order[has]]
        at = segmented_last(ops, xp, has, first)
        hit = (at >= 0)[is_win]
        ev = xp.where(hit, order[xp.maximum(at[is_win], 0)], 0)
        # the hash joined them: the keys must match too (a collision would raise here)
        bad = hit & ((ev_c[ev] != c[win_row]) | (ev_i[ev] != i[win_row]))
        if bool(bad.any()):
            raise RuntimeError(f"{what}: 64-bit hash collision between two instance keys (please report)")
        h, e = xp.zeros(n, dtype=bool), xp.zeros(n, dtype=xp.int64)
        h[win_row], e[win_row] = hit, ev
        out.append((h, e))
    return out
