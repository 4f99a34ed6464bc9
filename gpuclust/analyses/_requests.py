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

On the cpu backend (``backend.ops.lookup_slot_tables``) ``usage-vs-request`` joins through a
:class:`KeyedSlots` table instead: one 64-byte slot per (collection, instance, machine) key with
its tier code, the times of its instance's last two events and the limits as of each (float32,
where the requests are float32), so a window at or after its instance's next-to-last event reads
one cache line (:func:`asof_keyed_slots`); the others take the path above.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from gpuclust._parallel import threads
from gpuclust.analyses._lookup import triple_hash
from gpuclust.analyses.grouping import instance_order
from gpuclust.arrow_numpy import to_numpy
from gpuclust.keys import pack_bits, unpack_bits

__all__ = [
    "REQUEST_COLUMNS",
    "KeyedRuns",
    "KeyedSlots",
    "ReadOnce",
    "RequestTimeline",
    "asof_events",
    "asof_index",
    "asof_keyed",
    "asof_keyed_slots",
    "asof_run",
    "instance_positions",
    "timeline_order",
]

#: The instance_events columns a :class:`RequestTimeline` reads (plus any ``extra``).
REQUEST_COLUMNS = ("time", "collection_id", "instance_index", "req_cpu", "req_mem")


def _key(xp: Any, collection: Any, instance: Any) -> Any:
    """The 64-bit hash of an instance (collection_id, instance_index)."""
    return triple_hash(xp, collection, instance, xp.zeros(1, dtype=xp.int64))


def timeline_order(key: np.ndarray, t: np.ndarray) -> np.ndarray:
    """``np.lexsort((t, key))`` for uint64 instance hashes ``key``: by key, then time, then row
    (:func:`~gpuclust.analyses.grouping.instance_order` of the keys with their sign bit flipped, an
    order-preserving map to int64)."""
    flipped = (key ^ np.uint64(1 << 63)).view(np.int64)
    return instance_order(np, flipped, np.zeros(key.shape[0], np.int64), t)


class ReadOnce:
    """A side table's rows read once (``columns`` of every batch, a row group per thread where the
    client may use threads: :func:`gpuclust._parallel.threads`) and handed to several readers
    through the same ``batches(columns)`` interface (e.g. a tier lookup and a
    :class:`RequestTimeline` of the same instance events)."""

    def __init__(self, side: Any, columns: Sequence[str]):
        cols = list(columns)
        if hasattr(side, "map"):
            self.tables = [t for t in side.map(lambda t: t, cols, threads=threads()) if t.num_rows]
        else:
            self.tables = [t for t in side.batches(cols) if t.num_rows]

    def batches(self, columns: Sequence[str]) -> Any:
        for t in self.tables:
            yield t.select(list(columns))


@dataclass(frozen=True)
class RequestTimeline:
    """Events with a positive request, sorted by (instance hash, time, row): what windows are
    joined to as of their start.  ``extra`` holds further event columns (as float64, NULL as NaN)
    in the same order.

    ``ukey``: the distinct instance hashes, sorted; per instance, in ``ukey`` order: ``ucol`` its
    ``collection_id, instance_index`` and ``urun`` its ``last event, the first event's time, the
    time of the event before the last (the last's where it is alone), the last event's time, the
    first event`` (int64 rows; ``urun`` has one more row, for "no instance")."""

    key: np.ndarray = field(default_factory=lambda: np.zeros(0, np.uint64))
    collection: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    instance: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int32))
    time: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    req: np.ndarray = field(default_factory=lambda: np.zeros((0, 2)))
    extra: dict[str, np.ndarray] = field(default_factory=dict)
    ukey: np.ndarray = field(default_factory=lambda: np.zeros(0, np.uint64))
    ucol: np.ndarray = field(default_factory=lambda: np.zeros((0, 2), np.int64))
    urun: np.ndarray = field(default_factory=lambda: np.array([[-1, *[np.iinfo(np.int64).min] * 3, 0]]))
    #: the most events of one instance, less one
    max_span: int = 0
    #: host arrays derived from the timeline, made once (:meth:`derived`)
    _derived: dict[Any, np.ndarray] = field(default_factory=dict, compare=False, repr=False)

    def derived(self, key: Any, make: Any) -> np.ndarray:
        """``make()``, a host array derived from this timeline, made once per ``key``: the same
        array object on every partition, so that ``Backend.stage`` copies it to a device once."""
        out = self._derived.get(key)
        if out is None:
            out = self._derived[key] = make()
        return out

    @classmethod
    def build(cls, side: Any, extra: Sequence[str] = ()) -> RequestTimeline:
        cols_needed = list(dict.fromkeys((*REQUEST_COLUMNS, *extra)))
        parts = [t for t in side.batches(cols_needed) if t.num_rows]
        if not parts:
            return cls(extra={c: np.zeros(0) for c in extra})
        cols = {
            c: np.concatenate([to_numpy(t.column(c)) for t in parts])  # (NULL: NaN, or the int minimum)
            for c in cols_needed
        }
        req = np.empty((int(cols["time"].shape[0]), 2))
        req[:, 0], req[:, 1] = cols["req_cpu"], cols["req_mem"]
        np.nan_to_num(req, copy=False, nan=0.0)
        keep = (req[:, 0] > 0) | (req[:, 1] > 0)  # (not .any(1): a reduction over 2 columns is slow)
        c, i, t = (
            cols[n].astype(d, copy=False)
            for n, d in (("collection_id", np.int64), ("instance_index", np.int32), ("time", np.int64))
        )
        if not bool(keep.all()):
            c, i, t, req = c[keep], i[keep], t[keep], req[keep]
            cols = {n: cols[n][keep] for n in extra}
        key = _key(np, c, i)
        order = timeline_order(key, t)  # equal (key, time) keep their row order
        ex = {n: np.take(np.asarray(cols[n], dtype=np.float64), order) for n in extra}
        # np.take: a 2-d fancy index is several times slower
        key, c, i, t, req = (np.take(a, order, axis=0) for a in (key, c, i, t, req))
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
        ucol = np.ascontiguousarray(np.stack([c[first], i[first].astype(np.int64)], 1))
        # the event before the last (the last itself where it is alone)
        prev = np.maximum(last - 1, first)
        # "no instance": a last event at index -1 and the earliest time (none, see _asof)
        small = np.iinfo(np.int64).min
        urun = np.concatenate([np.stack([last, t[first], t[prev], t[last], first], 1), [[-1, small, small, small, 0]]])
        return cls(
            key,
            c,
            i,
            t,
            req,
            ex,
            key[first],
            ucol,
            np.ascontiguousarray(urun, dtype=np.int64),
            int((last - first).max()),
        )

    @property
    def n_instances(self) -> int:
        return int(self.ukey.shape[0])

    def instances_of(self, collection: np.ndarray, instance: np.ndarray) -> np.ndarray:
        """On the host: per (``collection``, ``instance``) its instance's position in ``ukey``, or
        :attr:`n_instances` where it has no events here."""
        nk = self.n_instances
        if not nk:
            return np.zeros(collection.shape[0], np.int64)
        c = np.asarray(collection, np.int64)
        i = np.asarray(instance, np.int64)
        h = _key(np, c, i)
        o = np.argsort(h)  # sorted queries: a binary search narrowed by the previous one
        u = np.empty(h.shape[0], np.int64)
        u[o] = np.minimum(np.searchsorted(self.ukey, h[o]), nk - 1)
        uc = np.take(self.ucol, u, axis=0)
        ok = (uc[:, 0] == c) & (uc[:, 1] == i)
        return np.where(ok, u, nk)

    def latest(self, flag: np.ndarray) -> np.ndarray:
        """Per event: the index of the latest event at or before it (in this order) of its instance
        with ``flag`` set (a boolean host array over the events), else -1."""
        ne = int(self.key.shape[0])
        flag = np.asarray(flag, dtype=bool)
        at = np.where(flag, np.arange(ne, dtype=np.int64), -1)
        np.maximum.accumulate(at, out=at)
        run = self.urun[:-1]
        run_first = np.repeat(run[:, 4], run[:, 0] - run[:, 4] + 1)
        return np.where(at >= run_first, at, -1)


def instance_positions(backend: Any, rq: RequestTimeline, collection: Any, instance: Any) -> Any:
    """Per window (``collection``, ``instance`` on ``backend.xp``): its instance's position in
    ``rq.ukey`` (one ``hash_index`` probe, the key checked), or ``rq.n_instances`` where its
    instance has no events in ``rq``."""
    xp = backend.xp
    nk = rq.n_instances
    n = int(collection.shape[0])
    if not n or not nk:
        return xp.full(n, nk, dtype=xp.int64)
    pos = backend.ops.hash_index(backend.stage(rq.ukey), _key(xp, collection, instance))
    u = xp.maximum(pos, 0)
    rec = xp.take(backend.stage(rq.ucol), u, axis=0)
    found = (pos >= 0) & (rec[:, 0] == collection) & (rec[:, 1] == instance)
    return xp.where(found, u, nk)


def _asof(
    backend: Any, rq: RequestTimeline, last: Any, t_first: Any, t_prev: Any, t_last: Any, start: Any, first_of: Any
) -> Any:
    """The latest event at or before ``start`` (-1: none) from the instance's last event and the
    times of its first, next-to-last and last events: at or after the last, the last; else at or
    after the next-to-last, the one before the last; else before the first, none; else (with four
    events or more: three leave the first) a binary search between the first and the next-to-last,
    over those windows only (``first_of(rows)``: their instances' first events)."""
    xp = backend.xp
    before_first = start < t_first
    j = last - (start < t_last) - (start < t_prev)
    j = xp.where(before_first, -1, j)
    if rq.max_span >= 3:
        rest = xp.nonzero((start < t_prev) > before_first)[0]
        if int(rest.shape[0]):
            # the first event after start lies in (first, next-to-last]: binary search
            lo = first_of(rest) + 1
            hi = last[rest] - 1
            s, t = start[rest], backend.stage(rq.time)
            for _ in range(int((hi - lo).max()).bit_length()):
                mid = (lo + hi) >> 1
                go = t[mid] <= s  # at lo == hi: t[lo] > s, so nothing moves
                lo = xp.where(go, mid + 1, lo)
                hi = xp.where(go, hi, mid)
            j[rest] = lo - 1
    return j


def asof_run(backend: Any, rq: RequestTimeline, u: Any, start: Any) -> Any:
    """Per window (its instance's position ``u`` from :func:`instance_positions`, its ``start``):
    the index in ``rq`` of the latest event of its instance at or before ``start`` (the last in
    ``rq``'s order), or -1 where there is none (so a table of one row per event plus a last row for
    "none" is read with ``take`` or an index, on either backend)."""
    xp = backend.xp
    n = int(start.shape[0])
    if not n or not rq.n_instances:
        return xp.full(n, -1, dtype=xp.int64)
    urun = backend.stage(rq.urun)
    run = xp.take(urun, u, axis=0)
    return _asof(backend, rq, run[:, 0], run[:, 1], run[:, 2], run[:, 3], start, lambda rows: run[rows, 4])


def asof_index(backend: Any, rq: RequestTimeline, collection: Any, instance: Any, start: Any) -> Any:
    """Per window (``collection``, ``instance``, ``start`` on ``backend.xp``): the index in ``rq``
    of the latest event of its instance at or before ``start`` (the last in ``rq``'s order), or -1
    where its instance has none."""
    return asof_run(backend, rq, instance_positions(backend, rq, collection, instance), start)


@dataclass(frozen=True)
class KeyedRuns:
    """An :class:`~gpuclust.analyses._lookup.InstanceLookup` (``(collection_id, instance_index,
    machine_id) -> code``, codes >= 0) whose records also carry the key's instance run in a
    :class:`RequestTimeline`, so one probe per window finds both (:func:`asof_keyed`).

    ``hash``: the lookup's sorted key hashes; ``rec``: per key one int64 row ``collection_id,
    machine_id, instance_index << 32 | code, the instance's position in the timeline`` and then its
    :attr:`RequestTimeline.urun` row's first four (last event, times of the first, next-to-last and
    last events): 64 bytes, one cache line."""

    hash: np.ndarray = field(default_factory=lambda: np.zeros(0, np.uint64))
    rec: np.ndarray = field(default_factory=lambda: np.zeros((0, 8), np.int64))

    @classmethod
    def build(cls, lookup: Any, rq: RequestTimeline) -> KeyedRuns:
        code = np.asarray(lookup.code, dtype=np.int64)
        if code.shape[0] and int(code.min()) < 0:
            raise ValueError("KeyedRuns: the lookup's codes must be >= 0")
        u = rq.instances_of(lookup.collection, lookup.instance)
        run = np.take(rq.urun, u, axis=0)
        ic = pack_bits(np.asarray(lookup.instance, dtype=np.int64), code, 32)
        rec = np.stack(
            [
                np.asarray(lookup.collection, np.int64),
                np.asarray(lookup.machine, np.int64),
                ic,
                u,
                run[:, 0],
                run[:, 1],
                run[:, 2],
                run[:, 3],
            ],
            1,
        )
        return cls(np.asarray(lookup.hash), np.ascontiguousarray(rec, dtype=np.int64))

    def __len__(self) -> int:
        return int(self.hash.shape[0])


def asof_keyed(
    backend: Any, rq: RequestTimeline, kr: KeyedRuns, collection: Any, instance: Any, machine: Any, start: Any
) -> tuple[Any, Any, Any]:
    """Per window (``collection``, ``instance``, ``machine``, ``start`` on ``backend.xp``):
    whether its key is in ``kr``, its code there (0 where not), and, as :func:`asof_index`, the
    index in ``rq`` of the latest event of its instance at or before ``start`` (-1: none).

    One ``hash_index`` probe and one record per window, a block of ``backend.ops.lookup_block_rows``
    rows at a time where the backend sets it; the windows whose key is not in ``kr`` (a machine
    without events of the instance) are joined by :func:`asof_index` after."""
    xp, ops = backend.xp, backend.ops
    n = int(start.shape[0])
    found = xp.zeros(n, dtype=bool)
    code = xp.zeros(n, dtype=xp.int32)
    j = xp.full(n, -1, dtype=xp.int64)
    if not n:
        return found, code, j
    if len(kr):  # (with no request events every run is the "no instance" row: the codes still count)
        t_hash, t_rec, urun = backend.stage(kr.hash), backend.stage(kr.rec), backend.stage(rq.urun)
        block = ops.lookup_block_rows or n
        for lo in range(0, n, block):
            sl = slice(lo, min(n, lo + block))
            c, i, m = collection[sl], instance[sl], machine[sl]
            pos = ops.hash_index(t_hash, triple_hash(xp, c, i, m))
            rec = xp.take(t_rec, xp.maximum(pos, 0), axis=0)
            inst, kcode = unpack_bits(rec[:, 2], 32)
            f = (pos >= 0) & (rec[:, 0] == c) & (rec[:, 1] == m) & (inst == i)
            found[sl] = f
            code[sl] = xp.where(f, kcode, 0)
            jb = _asof(
                backend,
                rq,
                rec[:, 4],
                rec[:, 5],
                rec[:, 6],
                rec[:, 7],
                start[sl],
                lambda rows, rec=rec: xp.take(urun, rec[rows, 3], axis=0)[:, 4],
            )
            j[sl] = xp.where(f, jb, -1)
    miss = xp.nonzero(~found)[0]
    if int(miss.shape[0]) and rq.n_instances:
        j[miss] = asof_index(backend, rq, collection[miss], instance[miss], start[miss])
    return found, code, j


def asof_events(
    backend: Any,
    rq: RequestTimeline,
    collection: Any,
    instance: Any,
    start: Any,
    flags: Sequence[np.ndarray],
    what: str,
) -> list[tuple[Any, Any]]:
    """Per flag (a boolean host array over ``rq``'s events) and per window (``collection``,
    ``instance``, ``start`` on ``backend.xp``): ``(hit, event)``, whether its instance has a flagged
    event at or before ``start`` and the index in ``rq`` of the latest one (0 where none), both in
    window order.  ``what`` names the caller, whose flags must be the same on every call (they
    are derived from ``rq``): each flag's latest-event table is made once per timeline and
    caller, and so copied to a device once."""
    xp = backend.xp
    n = int(start.shape[0])
    ne = int(rq.key.shape[0])
    if not ne or not n:
        return [(xp.zeros(n, dtype=bool), xp.zeros(n, dtype=xp.int64)) for _ in flags]
    j = asof_index(backend, rq, collection, instance, start)
    out = []
    for k, flag in enumerate(flags):
        # the last row (j = -1): no event
        prev = backend.stage(rq.derived(("latest", what, k), lambda f=flag: np.append(rq.latest(f), -1)))
        ev = prev[j]
        hit = ev >= 0
        out.append((hit, xp.maximum(ev, 0)))
    return out


class KeyedSlots:
    """The cpu backend's one-gather join (``backend.ops.lookup_slot_tables``): an
    :class:`~gpuclust.analyses._lookup.InstanceLookup` (``(collection_id, instance_index,
    machine_id) -> code``) and each key's instance in a :class:`RequestTimeline`, in an
    open-addressing table whose 64-byte slots (one cache line each) hold the key, its code, the
    times of its instance's last two events and two values as of each of them, so a window at or
    after its instance's next-to-last event (the common case) is joined by one random read where
    :func:`asof_keyed` makes three (the hash table, the record, the values of the event).

    ``values``: per event of the timeline plus a last row for "no event" (index -1), two float64
    that float32 holds exactly (NaN allowed; e.g. the CPU and memory limits as of the event, from
    float32 requests): :meth:`build` returns ``None`` for any other.  A key whose instance has no
    event gets the last row and the earliest times.  A key's slot is ``(hash >> 32) * slots >> 32``
    (``slots`` = 3 x keys: load factor 1/3), non-decreasing in the hash, so the lookup's keys
    (sorted by hash) fill the table without a sort; linear probing (no wrap-around: the table ends
    after the last key's slot with an empty one); an empty slot is all zeros (``u1``, the key's
    instance position in the timeline plus one, is 0), so the table is allocated zeroed, without a
    fill pass."""

    SLOT = np.dtype(
        [
            ("c", "<i8"),
            ("m", "<i8"),
            ("t_prev", "<i8"),
            ("t_last", "<i8"),
            ("i", "<i4"),
            ("code", "<i4"),
            ("u1", "<i4"),
            ("v_last", "<f4", (2,)),
            ("v_prev", "<f4", (2,)),
            ("pad", "<i4"),
        ]
    )

    def __init__(self, lookup: Any):
        """The table with the lookup's keys and codes (:meth:`fill` adds the timeline's part; the
        two may run on different threads, the first while the timeline is built)."""
        self.lookup: Any = lookup
        h = np.asarray(lookup.hash)
        n = int(h.shape[0])
        self.n = n
        self.slots = max(16, 3 * n)
        slot = self._home(h)
        ar = np.arange(n, dtype=np.int64)
        pos = np.maximum.accumulate(slot - ar) + ar if n else ar  # first free slot at or after its own
        self.pos: np.ndarray | None = pos  # (until fill)
        size = max(self.slots, (int(pos[-1]) if n else 0) + 2)  # an empty slot after the last key
        raw = np.zeros(size * 64 + 64, np.uint8)  # zeroed: fresh pages, no fill pass
        off = (-raw.ctypes.data) % 64  # aligned: one slot per cache line
        self.tab64 = raw[off : off + size * 64].view(np.int64).reshape(size, 8)
        self.tab = tab = self.tab64.view(self.SLOT)[:, 0]
        if n:
            tab["c"][pos] = lookup.collection
            tab["m"][pos] = lookup.machine
            tab["i"][pos] = lookup.instance
            tab["code"][pos] = lookup.code

    def fill(self, rq: RequestTimeline, values: np.ndarray) -> KeyedSlots | None:
        """The table with each key's instance in ``rq`` and ``values`` as of its last two events;
        ``None`` where ``values`` are not all exact in float32, or there are 2^31 instances."""
        values = np.asarray(values, dtype=np.float64)
        v32 = values.astype(np.float32)
        back = v32.astype(np.float64)
        if rq.n_instances >= (1 << 31) - 1 or not bool(((back == values) | (np.isnan(back) & np.isnan(values))).all()):
            return None
        if self.n:
            tab, pos, lk = self.tab, np.asarray(self.pos), self.lookup
            u = rq.instances_of(lk.collection, lk.instance)
            run = np.take(rq.urun, u, axis=0)  # (no instance: last event -1, the earliest times)
            last = run[:, 0]
            tab["t_prev"][pos] = run[:, 2]
            tab["t_last"][pos] = run[:, 3]
            tab["v_last"][pos] = np.take(v32, last, axis=0)  # (last = -1: the last row, none)
            # the event before the last (none where the instance has one event: t_prev = t_last then)
            tab["v_prev"][pos] = np.take(v32, np.where(last >= 1, last - 1, -1), axis=0)
            tab["u1"][pos] = u + 1
        self.lookup, self.pos = None, None
        return self

    @classmethod
    def start(cls, lookup: Any) -> KeyedSlots | None:
        """:class:`KeyedSlots` of ``lookup`` before :meth:`fill`; ``None`` where a code is
        negative or there are 2^31 keys or more."""
        code = np.asarray(lookup.code)
        if len(lookup) >= 1 << 31 or (code.shape[0] and int(code.min()) < 0):
            return None
        return cls(lookup)

    @classmethod
    def build(cls, lookup: Any, rq: RequestTimeline, values: np.ndarray) -> KeyedSlots | None:
        """:meth:`start` then :meth:`fill`."""
        ks = cls.start(lookup)
        return None if ks is None else ks.fill(rq, values)

    def _home(self, h: np.ndarray) -> np.ndarray:
        """The home slot of each hash."""
        return (((h >> np.uint64(32)) * np.uint64(self.slots)) >> np.uint64(32)).astype(np.int64)

    def find(
        self, h: np.ndarray, collection: np.ndarray, instance: np.ndarray, machine: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        """Per query (``h``: its :func:`~gpuclust.analyses._lookup.triple_hash`): whether its key is
        here, and its slot (meaningless where it is not).  The home slot of every query in one
        gather; the queries that find another key there (about a fifth at load factor 1/3) probe
        on, a slot at a time (the next cache line), comparing keys only; their slots are read once
        found."""
        tab = self.tab
        p = self._home(h)
        e64 = np.take(self.tab64, p, axis=0)  # 8 int64 a slot: take's fast path
        e = e64.view(self.SLOT)[:, 0]
        used = e["u1"] != 0
        hit = (e["c"] == collection) & (e["m"] == machine) & (e["i"] == instance) & used
        more = np.flatnonzero(~hit & used)  # occupied by another key: probe on
        if not more.shape[0]:
            return hit, e
        last = tab.shape[0] - 1
        pm, c, m, i = p[more], collection[more], machine[more], instance[more]
        at = np.full(more.shape[0], -1, dtype=np.int64)
        left = np.arange(more.shape[0])
        while left.shape[0]:
            pm = np.minimum(pm + 1, last)
            q = np.take(self.tab64, pm, axis=0).view(self.SLOT)[:, 0]
            used = q["u1"] != 0
            ok = (q["c"] == c) & (q["m"] == m) & (q["i"] == i) & used
            at[left[ok]] = pm[ok]
            go = np.flatnonzero(~ok & used & (pm < last))
            left, pm, c, m, i = left[go], pm[go], c[go], m[go], i[go]
        k = np.flatnonzero(at >= 0)
        rows = more[k]
        hit[rows] = True
        e64[rows] = np.take(self.tab64, at[k], axis=0)
        return hit, e


def asof_keyed_slots(
    backend: Any,
    rq: RequestTimeline,
    ks: KeyedSlots,
    values: Any,
    collection: Any,
    instance: Any,
    machine: Any,
    start: Any,
) -> tuple[Any, Any, Any, Any]:
    """:func:`asof_keyed` on the cpu backend by ``ks`` (the :class:`KeyedSlots` of a lookup, ``rq``
    and ``values``), returning the values of the joined event instead of its index: per window
    whether its key is in the lookup, its code (0 where not) and the two values (float64) as of the
    latest event of its instance at or before ``start`` (``values``' last row where there is none).
    A window before its instance's next-to-last event is joined by :func:`_asof` over its
    instance's run, one whose key is not in the lookup by :func:`asof_index`; both then read
    ``values``."""
    xp = backend.xp
    n = int(start.shape[0])
    if not ks.n:
        j = asof_index(backend, rq, collection, instance, start) if rq.n_instances else xp.full(n, -1, xp.int64)
        v = xp.take(values, j, axis=0)
        return xp.zeros(n, dtype=bool), xp.zeros(n, dtype=xp.int32), v[:, 0], v[:, 1]
    found, e = ks.find(triple_hash(xp, collection, instance, machine), collection, instance, machine)
    code = xp.where(found, e["code"], 0)
    late = start >= e["t_last"]
    vl, vp = e["v_last"], e["v_prev"]
    v0 = xp.where(late, vl[:, 0], vp[:, 0]).astype(xp.float64)
    v1 = xp.where(late, vl[:, 1], vp[:, 1]).astype(xp.float64)
    redo = xp.flatnonzero(~found | (start < e["t_prev"]))
    if int(redo.shape[0]):
        j = xp.full(int(redo.shape[0]), -1, dtype=xp.int64)
        f = found[redo]
        k = xp.flatnonzero(f)
        if int(k.shape[0]):  # before the instance's next-to-last event: its run
            rk = redo[k]
            run = xp.take(rq.urun, e["u1"][rk] - 1, axis=0)
            j[k] = _asof(backend, rq, run[:, 0], run[:, 1], run[:, 2], run[:, 3], start[rk], lambda rows: run[rows, 4])
        k = xp.flatnonzero(~f)
        if int(k.shape[0]) and rq.n_instances:  # no such key: the instance alone
            rk = redo[k]
            j[k] = asof_index(backend, rq, collection[rk], instance[rk], start[rk])
        v = xp.take(values, j, axis=0)
        v0[redo] = v[:, 0]
        v1[redo] = v[:, 1]
    return found, code, v0, v1
