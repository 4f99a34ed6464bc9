"""The as-of join of usage windows to their instance's requests (shared by ``usage-vs-request``
and ``peak-prediction``).

:class:`RequestTimeline` holds the instance events that carry a positive request, sorted by
(instance hash, time, row), and one record per instance (its key, its first and last event, the
last event's time).  :func:`asof_index` finds, per window, the latest of those events of the
window's (``collection_id``, ``instance_index``) at or before the window's start (an event at the
same microsecond counts; of events at the same microsecond, the last in row order);
:func:`asof_events` then the latest one per event flag (e.g. "CPU request positive"), through
:meth:`RequestTimeline.latest`, a per-event table built once on the host.

Nothing is sorted per window: the window's instance is found with the backend's ``hash_index`` op
(one probe), its key checked against the instance record (so a hash collision between a window's
instance and an event's can never join them); a window at or after its instance's last event (the
common case) is done, the others binary-search their instance's events (a few steps over the
few windows left), on ``backend.xp``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from gpuclust.analyses._lookup import triple_hash

__all__ = ["REQUEST_COLUMNS", "RequestTimeline", "asof_events", "asof_index"]

#: The instance_events columns a :class:`RequestTimeline` reads (plus any ``extra``).
REQUEST_COLUMNS = ("time", "collection_id", "instance_index", "req_cpu", "req_mem")


def _key(xp: Any, collection: Any, instance: Any) -> Any:
    """The 64-bit hash of an instance (collection_id, instance_index)."""
    return triple_hash(xp, collection, instance, xp.zeros(1, dtype=xp.int64))


@dataclass(frozen=True)
class RequestTimeline:
    """Events with a positive request, sorted by (instance hash, time, row): what windows are
    joined to as of their start.  ``extra`` holds further event columns (as float64, NULL as NaN)
    in the same order.

    ``ukey``: the distinct instance hashes, sorted; ``urec``: per instance (in ``ukey`` order) one
    int64 row ``collection_id, instance_index, first event, last event, last event's time``."""

    key: np.ndarray = field(default_factory=lambda: np.zeros(0, np.uint64))
    collection: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    instance: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int32))
    time: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    req: np.ndarray = field(default_factory=lambda: np.zeros((0, 2)))
    extra: dict[str, np.ndarray] = field(default_factory=dict)
    ukey: np.ndarray = field(default_factory=lambda: np.zeros(0, np.uint64))
    urec: np.ndarray = field(default_factory=lambda: np.zeros((0, 5), np.int64))

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
        key = _key(np, c, i)
        order = np.lexsort((t, key))  # stable: equal (key, time) keep their row order
        ex = {n: np.asarray(cols[n][keep], dtype=np.float64)[order] for n in extra}
        key, c, i, t = key[order], c[order], i[order], t[order]
        ne = int(key.shape[0])
        if not ne:
            return cls(extra=ex)
        new = np.ones(ne, dtype=bool)
        new[1:] = key[1:] != key[:-1]
        first = np.flatnonzero(new)
        last = np.append(first[1:], ne) - 1
        # one instance per hash: two instances sharing a hash would share a run of events
        same = ~new[1:]
        if bool((same & ((c[1:] != c[:-1]) | (i[1:] != i[:-1]))).any()):
            raise RuntimeError("request timeline: 64-bit hash collision between two instance keys (please report)")
        urec = np.ascontiguousarray(np.stack([c[first], i[first].astype(np.int64), first, last, t[last]], 1))
        return cls(key, c, i, t, req[keep][order], ex, key[first], urec)

    def latest(self, flag: np.ndarray) -> np.ndarray:
        """Per event: the index of the latest event at or before it (in this order) of its instance
        with ``flag`` set (a boolean host array over the events), else -1."""
        ne = int(self.key.shape[0])
        flag = np.asarray(flag, dtype=bool)
        at = np.where(flag, np.arange(ne, dtype=np.int64), -1)
        np.maximum.accumulate(at, out=at)
        run_first = np.repeat(self.urec[:, 2], self.urec[:, 3] - self.urec[:, 2] + 1)
        return np.where(at >= run_first, at, -1)


def asof_index(backend: Any, rq: RequestTimeline, collection: Any, instance: Any, start: Any,
               none: int = -1) -> Any:
    """Per window (``collection``, ``instance``, ``start`` on ``backend.xp``): the index in ``rq``
    of the latest event of its instance at or before ``start`` (the last in ``rq``'s order), or
    ``none`` where its instance has none."""
    xp = backend.xp
    n = int(start.shape[0])
    if not n or not int(rq.ukey.shape[0]):
        return xp.full(n, none, dtype=xp.int64)
    pos = backend.ops.hash_index(backend.stage(rq.ukey), _key(xp, collection, instance))
    rec = xp.take(backend.stage(rq.urec), xp.maximum(pos, 0), axis=0)
    found = (pos >= 0) & (rec[:, 0] == collection) & (rec[:, 1] == instance)
    done = rec[:, 4] <= start
    j = xp.where(found & done, rec[:, 3], none)
    rest = xp.nonzero(found & ~done)[0]
    if int(rest.shape[0]):
        # the first event after start lies in [first, last] (the last one is after start): binary search
        lo0, hi = rec[rest, 2], rec[rest, 3]
        lo, s, t = lo0, start[rest], backend.stage(rq.time)
        for _ in range(int((hi - lo).max()).bit_length()):
            mid = (lo + hi) >> 1
            go = t[mid] <= s  # at lo == hi: t[lo] > s, so nothing moves
            lo = xp.where(go, mid + 1, lo)
            hi = xp.where(go, hi, mid)
        j[rest] = xp.where(lo > lo0, lo - 1, none)
    return j


def asof_events(backend: Any, rq: RequestTimeline, collection: Any, instance: Any, start: Any,
                flags: Sequence[np.ndarray], what: str) -> list[tuple[Any, Any]]:
    """Per flag (a boolean host array over ``rq``'s events) and per window (``collection``,
    ``instance``, ``start`` on ``backend.xp``): ``(hit, event)``, whether its instance has a flagged
    event at or before ``start`` and the index in ``rq`` of the latest one (0 where none), both in
    window order.  (``what`` names the caller; kept for its signature.)"""
    xp = backend.xp
    n = int(start.shape[0])
    ne = int(rq.key.shape[0])
    if not ne or not n:
        return [(xp.zeros(n, dtype=bool), xp.zeros(n, dtype=xp.int64)) for _ in flags]
    j = asof_index(backend, rq, collection, instance, start, none=ne)
    out = []
    for flag in flags:
        prev = backend.stage(np.append(rq.latest(flag), -1))  # row ne: no event
        ev = prev[j]
        hit = ev >= 0
        out.append((hit, xp.maximum(ev, 0)))
    return out
