"""Per-instance lookup tables keyed by ``(collection_id, instance_index, machine_id)``.

Several analyses attach a per-instance code (a priority tier) to every usage window: cell-usage,
cpi (``by="tier"``), overcommit and usage-distribution.  The context builds one
:class:`InstanceLookup` on the client; every partial looks its rows up with
:meth:`InstanceLookup.find` on its backend.

The table is keyed by the 64-bit hash of the triple (:func:`triple_hash`, that is
:func:`gpuclust.keys.hash64`), sorted by hash, with the three key columns kept beside it: a hit
is confirmed on the full key, so a hash
collision between a *query* and a table key can never attach the wrong code; a collision between
two *table* keys is detected when the table is built (and raises).

On the cpu backend (``backend.ops.lookup_slot_tables``) a query is found in a slot table that
holds the whole key and the code in one 32-byte record (:class:`_SlotTable`: one gather per query,
built without a sort); elsewhere the position comes from the backend op ``hash_index`` (a binary
search on the gpu backend) and the key is checked in a second gather.  Machine ids (:func:`id_index`) are found by :class:`MachineHash`, a
perfect hash of the machine list: no probe loop, the same elementwise code on either backend
(:mod:`gpuclust.analyses._machine_hash`, re-exported here with :func:`machine_capacities`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from gpuclust import _parallel
from gpuclust._cache import PerArrayCache
from gpuclust._lazy import pandas as pd
from gpuclust.analyses._machine_hash import MachineHash, id_index, machine_capacities
from gpuclust.analyses.grouping import hash_order
from gpuclust.arrow_numpy import to_numpy, valid
from gpuclust.keys import hash64
from gpuclust.tiers import TierNames, tier_codes

__all__ = [
    "EVENT_COLUMNS",
    "InstanceLookup",
    "MachineHash",
    "TierLookupContext",
    "id_index",
    "machine_capacities",
    "max_priority",
    "priority_lookup",
    "tier_lookup",
    "triple_hash",
]

#: The instance_events columns :func:`tier_lookup` reads.
EVENT_COLUMNS = ("collection_id", "instance_index", "machine_id", "priority", "alloc_collection_id")


def triple_hash(xp: Any, collection_id: Any, instance_index: Any, machine_id: Any) -> Any:
    """The 64-bit hash of (collection_id, instance_index, machine_id): :func:`gpuclust.keys.hash64`."""
    return hash64(xp, [collection_id, instance_index, machine_id])


@dataclass(frozen=True)
class InstanceLookup:
    """``(collection_id, instance_index, machine_id) -> int32 code``, sorted by key hash.

    Examples
    --------
    >>> import numpy as np
    >>> from gpuclust.backends import get_backend
    >>> lk = InstanceLookup.build(np.array([7, 7]), np.array([0, 1]), np.array([5, 5]), np.array([2, 3]))
    >>> found, code = lk.find(get_backend("cpu"), np.array([7, 7, 8]), np.array([1, 0, 0]), np.array([5, 5, 5]))
    >>> found.tolist(), code[found].tolist()
    ([True, True, False], [3, 2])
    """

    hash: np.ndarray
    collection: np.ndarray
    instance: np.ndarray
    machine: np.ndarray
    code: np.ndarray

    @classmethod
    def empty(cls) -> InstanceLookup:
        return cls(
            np.zeros(0, np.uint64),
            np.zeros(0, np.int64),
            np.zeros(0, np.int32),
            np.zeros(0, np.int64),
            np.zeros(0, np.int32),
        )

    @classmethod
    def build(
        cls, collection: Any, instance: Any, machine: Any, code: Any, *, what: str = "instance lookup"
    ) -> InstanceLookup:
        """A lookup from unique key triples (the caller has reduced duplicates) and their codes."""
        c = np.asarray(collection, dtype=np.int64)
        i = np.asarray(instance, dtype=np.int32)
        m = np.asarray(machine, dtype=np.int64)
        k = np.asarray(code, dtype=np.int32)
        h = triple_hash(np, c, i, m)
        order = np.argsort(h)  # ties (equal hashes) raise below
        h = h[order]
        if h.shape[0] > 1 and bool((h[1:] == h[:-1]).any()):
            raise RuntimeError(f"{what}: 64-bit hash collision between two instance keys (please report)")
        return cls(h, c[order], i[order], m[order], k[order])

    def __len__(self) -> int:
        return int(self.hash.shape[0])

    def find(self, backend: Any, collection: Any, instance: Any, machine: Any, rows: Any = None) -> tuple[Any, Any]:
        """Per query row: whether its triple is in the table, and its code (0 where not found).

        ``rows``: look up only these positions of the three columns (the result has one entry
        per row of ``rows``), without gathering the columns first.  The rows are looked up in
        blocks of ``backend.ops.lookup_block_rows`` where the backend sets it (the cpu backend:
        one block's hash, probe and key checks stay in cache), else all at once."""
        xp = backend.xp
        n = int(collection.shape[0] if rows is None else rows.shape[0])
        if len(self) == 0 or n == 0:
            return xp.zeros(n, dtype=bool), xp.zeros(n, dtype=xp.int32)
        return self._blocked(
            backend,
            collection,
            instance,
            machine,
            rows,
            (bool, xp.int32),
            lambda found, pos, code: (found, xp.where(found, code, 0)),
        )

    def index(self, backend: Any, collection: Any, instance: Any, machine: Any, rows: Any = None) -> Any:
        """Per query row: its triple's row in the table (an index into :attr:`collection`,
        :attr:`code`, ...), -1 where absent; ``rows`` and blocks as :meth:`find`.

        >>> import numpy as np
        >>> from gpuclust.backends import get_backend
        >>> lk = InstanceLookup.build(np.array([7, 7]), np.array([0, 1]), np.array([5, 5]), np.array([2, 3]))
        >>> at = lk.index(get_backend("cpu"), np.array([7, 7, 8]), np.array([1, 0, 0]), np.array([5, 5, 5]))
        >>> at[at >= 0].tolist() == [lk.instance.tolist().index(1), lk.instance.tolist().index(0)], int(at[2])
        (True, -1)
        """
        xp = backend.xp
        n = int(collection.shape[0] if rows is None else rows.shape[0])
        if len(self) == 0 or n == 0:
            return xp.full(n, -1, dtype=xp.int64)
        return self._blocked(
            backend,
            collection,
            instance,
            machine,
            rows,
            (xp.int64,),
            lambda found, pos, code: (xp.where(found, pos, -1),),
        )[0]

    def _blocked(
        self, backend: Any, collection: Any, instance: Any, machine: Any, rows: Any, dtypes: tuple[Any, ...], pick: Any
    ) -> tuple[Any, ...]:
        """``pick(found, pos, code)`` of every query row, a block of rows at a time, as arrays
        of ``dtypes``."""
        xp = backend.xp
        n = int(collection.shape[0] if rows is None else rows.shape[0])
        block = backend.ops.lookup_block_rows or n
        inst = np.dtype(instance.dtype)
        if (
            backend.ops.lookup_slot_tables
            and inst.kind == "i"
            and inst.itemsize <= 4
            and self._slot_table() is not None
        ):
            # host arrays (the cpu backend), canonical int32 instance_index: one gather per query
            tables: tuple[Any, ...] = (self._slot_table(),)
            probe = self._probe_slots
        else:
            tables = (backend.stage(self.hash), backend.stage(self._records()))
            probe = self._probe
        if block >= n:
            got = pick(
                *probe(backend, tables, *(a if rows is None else a[rows] for a in (collection, instance, machine)))
            )
            return tuple(g.astype(d, copy=False) for g, d in zip(got, dtypes, strict=True))
        out = [xp.empty(n, dtype=d) for d in dtypes]
        for lo in range(0, n, block):
            hi = min(n, lo + block)
            r = slice(lo, hi) if rows is None else rows[lo:hi]
            for o, g in zip(out, pick(*probe(backend, tables, collection[r], instance[r], machine[r])), strict=True):
                o[lo:hi] = g
        return tuple(out)

    @staticmethod
    def _probe(
        backend: Any, tables: tuple[Any, ...], collection: Any, instance: Any, machine: Any
    ) -> tuple[Any, Any, Any]:
        """``(found, pos, code)``: per query, whether its full key is in the table, its table
        position and its code (both meaningful where found)."""
        xp = backend.xp
        t_hash, t_rec = tables
        h = triple_hash(xp, collection, instance, machine)
        pos = backend.ops.hash_index(t_hash, h)
        hit = pos >= 0
        pos = xp.maximum(pos, 0)
        rec = xp.take(t_rec, pos, axis=0)  # one row (one cache line) per query (take: 4x rec[pos])
        found = hit & (rec[:, 0] == collection) & (rec[:, 1] == machine) & (rec[:, 2] == instance)
        return found, pos, rec[:, 3]

    @staticmethod
    def _probe_slots(
        backend: Any, tables: tuple[Any, ...], collection: Any, instance: Any, machine: Any
    ) -> tuple[Any, Any, Any]:
        """:meth:`_probe` on the cpu backend, by the :class:`_SlotTable` of the lookup."""
        return tables[0].find(triple_hash(np, collection, instance, machine), collection, instance, machine)

    def _slot_table(self) -> _SlotTable | None:
        """The cpu backend's open-addressing table of the lookup (built once per lookup; None for
        a table too large for its packed positions)."""
        if len(self) >= _SlotTable.MAX_ROWS:
            return None
        return _slot_tables.get(
            self.hash, lambda _h: _SlotTable(self.hash, self.collection, self.instance, self.machine, self.code)
        )

    def _records(self) -> np.ndarray:
        """The table as one (n, 4) int64 array: collection, machine, instance, code per row (so a
        hit's key check and code read one row), built once per lookup."""
        return _records.get(
            self.hash,
            lambda _h: np.ascontiguousarray(
                np.stack(
                    [self.collection, self.machine, self.instance.astype(np.int64), self.code.astype(np.int64)], axis=1
                )
            ),
        )


@dataclass(frozen=True)
class TierLookupContext(TierNames):
    """The context of an analysis that splits by tier through a per-instance lookup: the tier map,
    and the lookup ``bind`` builds from the partition's events (tier codes or priorities)."""

    tier_map: Any
    lookup: InstanceLookup = InstanceLookup.empty()


_records = PerArrayCache()
_slot_tables = PerArrayCache()


class _SlotTable:
    """Linear probing over an :class:`InstanceLookup`'s keys for the cpu backend, the whole key in
    the slot: each slot is a 32-byte record ``(collection, machine, code, instance, row)``
    (aligned: one cache line per probe), so a query costs one gather where ``hash_index`` and the
    record cost two, and its key is checked and its code read there.  The slot of a key is the
    top ``bits`` of its :func:`triple_hash` (mixed already): the lookup's keys, sorted by that
    hash, are sorted by slot, so the table is built without a sort.  Slots ``2**bits + n`` (no
    wrap-around); an empty slot holds row -1 and a copy of row 0's key, which no query that
    reaches it has (row 0's key lies between its home slot and the first empty slot after it), so
    an empty slot never matches."""

    MAX_ROWS = 1 << 31
    #: Largest table kept at load factor 1/4 (4 to 8 slots of 32 bytes per key: about 1M keys);
    #: larger lookups get load factor 1/2.  At 1.6e7 windows (380k keys, a 64 MiB table) the sparser
    #: table cuts cell-usage's partial from ~41 to ~33 ms per Mi rows: fewer second probes.
    SPARSE_MAX_BYTES = 1 << 27
    SLOT = np.dtype([("c", "<i8"), ("m", "<i8"), ("code", "<i4"), ("i", "<i4"), ("row", "<i4"), ("pad", "<i4")])

    def __init__(
        self, h: np.ndarray, collection: np.ndarray, instance: np.ndarray, machine: np.ndarray, code: np.ndarray
    ):
        n = int(h.shape[0])
        self.bits = max(4, int(4 * n - 1).bit_length())  # load factor <= 1/4: ~1.1 probes per hit
        if (1 << self.bits) * self.SLOT.itemsize > self.SPARSE_MAX_BYTES:
            self.bits -= 1  # a large lookup: load factor <= 1/2 (~1.3 probes), half the memory
        self.shift = np.uint64(64 - self.bits)
        slot = (h >> self.shift).astype(np.int64)  # non-decreasing: h is sorted
        ar = np.arange(n, dtype=np.int64)
        pos = np.maximum.accumulate(slot - ar) + ar if n else ar  # first free slot at or after its own
        tab = np.zeros((1 << self.bits) + n, self.SLOT)
        if n:
            tab["c"], tab["m"], tab["code"], tab["i"] = collection[0], machine[0], code[0], instance[0]
        tab["row"] = -1
        tab["c"][pos] = collection
        tab["m"][pos] = machine
        tab["code"][pos] = code
        tab["i"][pos] = instance
        tab["row"][pos] = ar
        self.tab = tab

    def find(
        self, h: np.ndarray, collection: np.ndarray, instance: np.ndarray, machine: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Per query (``h``: its hash): whether it is in the lookup, its row and its code (both
        meaningless where it is not)."""
        p = (h >> self.shift).astype(np.int64)
        e = np.take(self.tab, p)
        hit = (e["c"] == collection) & (e["m"] == machine) & (e["i"] == instance)
        row = e["row"]
        code = e["code"]
        more = np.flatnonzero(~hit & (row >= 0))  # occupied by another key: probe on
        if more.shape[0]:
            row, code = row.copy(), code.copy()
            p, c, m, i = p[more] + 1, collection[more], machine[more], instance[more]
        while more.shape[0]:
            e = np.take(self.tab, p)
            ok = (e["c"] == c) & (e["m"] == m) & (e["i"] == i)
            at = more[ok]
            hit[at] = True
            row[at] = e["row"][ok]
            code[at] = e["code"][ok]
            go = ~ok & (e["row"] >= 0)
            more, p, c, m, i = more[go], p[go] + 1, c[go], m[go], i[go]
        return hit, row, code


def max_priority(ev: Any, top_level_only: bool = True) -> pd.DataFrame:
    """MAX(priority) per (collection_id, instance_index, machine_id) over one Arrow table of events
    (only those with alloc_collection_id NULL or 0 when ``top_level_only``, as Google's notebook
    does); a NULL machine_id never joins (SQL NULL semantics).  Columns ``c, i, m, p`` (``p`` NaN
    where every priority of the key is NULL)."""
    return _group_max(*_event_arrays(ev, top_level_only))


def _event_arrays(ev: Any, top_level_only: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The ``c, i, m, p`` arrays of the events :func:`max_priority` groups (rows filtered as it says)."""
    keep = valid(ev.column("machine_id"))
    if top_level_only:
        alloc = ev.column("alloc_collection_id")
        keep &= ~valid(alloc) | (to_numpy(alloc, np.int64) == 0)
    rows = None if keep.all() else np.flatnonzero(keep)

    def col(name: str, dtype: Any) -> np.ndarray:
        a = to_numpy(ev.column(name), dtype)
        return a if rows is None else a[rows]

    return (
        col("collection_id", np.int64),
        col("instance_index", np.int32),
        col("machine_id", np.int64),
        col("priority", np.float64),
    )


def _group_max(c: np.ndarray, i: np.ndarray, m: np.ndarray, p: np.ndarray) -> pd.DataFrame:
    """``DataFrame(c, i, m, p).groupby(["c", "i", "m"], sort=False)["p"].max().reset_index()`` in
    NumPy (a fraction of pandas' time and memory): rows grouped by a sort of their key hash
    (by the keys themselves should two keys share a hash), NaN skipped unless a group has nothing
    else, groups in order of first appearance."""
    n = int(c.shape[0])
    if n == 0:
        return pd.DataFrame(
            {"c": c.astype(np.int64), "i": i.astype(np.int32), "m": m.astype(np.int64), "p": p.astype(np.float64)}
        )
    h = triple_hash(np, c, i, m)
    # any sort order will do (a group's first appearance is its smallest row, whatever the order)
    order = np.argsort(h)
    hs = h[order]
    del h
    cs, is_, ms = c[order], i[order], m[order]
    new = np.ones(n, dtype=bool)
    new[1:] = (cs[1:] != cs[:-1]) | (is_[1:] != is_[:-1]) | (ms[1:] != ms[:-1])
    starts = np.flatnonzero(new)
    # Equal keys share a hash, so each key's rows lie in its hash's run; they are adjacent unless
    # two keys share a hash (the key changes inside a run of equal hashes): then sort by the keys.
    if bool((new[1:] & (hs[1:] == hs[:-1])).any()):
        order = np.lexsort((m, i, c))
        cs, is_, ms = c[order], i[order], m[order]
        new[1:] = (cs[1:] != cs[:-1]) | (is_[1:] != is_[:-1]) | (ms[1:] != ms[:-1])
        starts = np.flatnonzero(new)
    pmax = np.fmax.reduceat(p[order], starts)
    first = order[starts] if starts.shape[0] else starts
    if bool((order[1:] < order[:-1]).any()):  # (order is a permutation: sorted iff it is arange)
        # first appearance of each group: the smallest original row of the group
        first = np.minimum.reduceat(order, starts)
    o2 = np.argsort(first)  # distinct rows: no ties
    first = first[o2]
    return pd.DataFrame({"c": c[first], "i": i[first], "m": m[first], "p": pmax[o2]})


def _max_priorities(events: Any, top_level_only: bool) -> pd.DataFrame | None:
    """:func:`max_priority` over every batch of ``events`` (a side table), merged; None: no rows."""
    parts = [max_priority(t, top_level_only) for t in events.batches(list(EVENT_COLUMNS))]
    if not parts:
        return None
    return (
        parts[0]
        if len(parts) == 1
        else (_group_max(*(np.concatenate([d[k].to_numpy() for d in parts]) for k in ("c", "i", "m", "p"))))
    )


def _sorted_max(
    c: np.ndarray, i: np.ndarray, m: np.ndarray, p: np.ndarray, h: np.ndarray | None = None
) -> tuple[np.ndarray, ...] | None:
    """``(hash, c, i, m, MAX(p))`` of each distinct key, sorted by :func:`triple_hash` (NaN
    skipped unless a key has nothing else, as :func:`_group_max`): the arrays an
    :class:`InstanceLookup` holds, without its second hash and sort.  ``None`` when two distinct
    keys share a hash (the caller takes :func:`_group_max`'s path, which reports it).  ``h``: the
    keys' hashes, given when they are runs already sorted (parts being merged: a stable sort,
    i.e. a merge of the runs)."""
    if h is None:
        h = triple_hash(np, c, i, m)
        order = hash_order(h)
    else:
        order = np.argsort(h, kind="stable")
    hs = h[order]
    del h
    cs, is_, ms = c[order], i[order], m[order]
    new = np.ones(hs.shape[0], dtype=bool)
    new[1:] = (cs[1:] != cs[:-1]) | (is_[1:] != is_[:-1]) | (ms[1:] != ms[:-1])
    if bool((new[1:] & (hs[1:] == hs[:-1])).any()):
        return None
    starts = np.flatnonzero(new)
    return hs[starts], cs[starts], is_[starts], ms[starts], np.fmax.reduceat(p[order], starts)


def _sorted_max_priorities(events: Any, top_level_only: bool) -> tuple[np.ndarray, ...] | None:
    """:func:`_sorted_max` of every batch of ``events``, merged (a batch at a time, as
    :func:`_max_priorities`; on the client, a row group per thread on
    :func:`gpuclust._parallel.threads` threads); ``None``: a hash shared by two keys.  Empty
    arrays for no rows."""

    def part(t: Any) -> tuple[np.ndarray, ...] | None:
        return _sorted_max(*_event_arrays(t, top_level_only))

    columns = list(EVENT_COLUMNS)
    parts = (
        events.map(part, columns, threads=_parallel.threads())
        if hasattr(events, "map")
        else [part(t) for t in events.batches(columns)]
    )
    if any(r is None for r in parts):
        return None
    if not parts:
        return (
            np.zeros(0, np.uint64),
            np.zeros(0, np.int64),
            np.zeros(0, np.int32),
            np.zeros(0, np.int64),
            np.zeros(0, np.float64),
        )
    if len(parts) == 1:
        return parts[0]
    cat = [np.concatenate([q[k] for q in parts]) for k in range(5)]  # type: ignore[index]
    return _sorted_max(cat[1], cat[2], cat[3], cat[4], h=cat[0])


def _fused_lookup(events: Any, top_level_only: bool, codes_of: Any, what: str) -> InstanceLookup | None:
    """The lookup :func:`tier_lookup` / :func:`priority_lookup` build, straight from the hash-sorted
    groups (the same arrays); ``None`` where their own path must run (a shared hash)."""
    r = _sorted_max_priorities(events, top_level_only)
    if r is None:
        return None
    h, c, i, m, p = r
    if h.shape[0] == 0:
        return InstanceLookup.empty()
    return InstanceLookup(
        h,
        c.astype(np.int64, copy=False),
        i.astype(np.int32, copy=False),
        m.astype(np.int64, copy=False),
        np.asarray(codes_of(p), dtype=np.int32),
    )


def _priority_codes(p: np.ndarray) -> np.ndarray:
    prio = np.where(np.isnan(p) | (p < 0), -1, np.nan_to_num(p, nan=-1.0)).astype(np.int64)
    return np.minimum(prio, np.iinfo(np.int32).max).astype(np.int32)


def tier_lookup(events: Any, tm: Any, *, top_level_only: bool, unmatched: int, what: str) -> InstanceLookup:
    """``(collection_id, instance_index, machine_id) -> tier code`` from instance_events rows.

    ``events`` yields Arrow tables of :data:`EVENT_COLUMNS` from ``batches(columns)`` (a
    :class:`gpuclust.engine.reading.SideTable`: a file or a bucket at a time, so the whole table
    is never in memory at once); the priority is :func:`max_priority` of each key, mapped by the
    tier map ``tm`` (:func:`gpuclust.tiers.tier_codes`); a NULL priority, or one no tier covers,
    gets ``unmatched``.
    """

    def codes_of(p: np.ndarray) -> np.ndarray:  # (float64 priorities, NaN: NULL)
        return tier_codes(np, tm, p, unmatched).astype(np.int32)

    fused = _fused_lookup(events, top_level_only, codes_of, what)
    if fused is not None:
        return fused
    lk = _max_priorities(events, top_level_only)
    if lk is None:
        return InstanceLookup.empty()
    codes = codes_of(lk["p"].to_numpy(np.float64))
    return InstanceLookup.build(
        lk["c"].to_numpy(np.int64), lk["i"].to_numpy(np.int32), lk["m"].to_numpy(np.int64), codes, what=what
    )


def priority_lookup(events: Any, *, top_level_only: bool, what: str) -> InstanceLookup:
    """``(collection_id, instance_index, machine_id) -> MAX(priority)`` (-1 where every priority of
    the key is NULL, or negative), as :func:`tier_lookup` reads it, before any tier map."""
    fused = _fused_lookup(events, top_level_only, _priority_codes, what)
    if fused is not None:
        return fused
    lk = _max_priorities(events, top_level_only)
    if lk is None:
        return InstanceLookup.empty()
    prio = _priority_codes(lk["p"].to_numpy(np.float64))
    return InstanceLookup.build(
        lk["c"].to_numpy(np.int64), lk["i"].to_numpy(np.int32), lk["m"].to_numpy(np.int64), prio, what=what
    )
