"""job-usage's cpu path: the windows of a partition grouped by collection in one pass of blocks.

:class:`KeyTable` is an open-addressing table over the keys ``(collection_id, instance_index,
machine_id)`` of job-usage's priority lookup, each slot a 32-byte record ``(collection,
machine, instance, collection code)``: one gather per window finds its key (checked on the
whole key, so a hash collision never attaches a wrong collection) and, in the same record, the
dense code of its collection among the lookup's sorted collections.  A key's slot is the top
bits of its :func:`gpuclust.keys.hash64`, which depend on every bit of the key; the hash decides
only where a key is looked for, never whether it is found.  A window's key found marks its slot; the collection's
priority is the maximum over its keys whose slots were marked (so the windows need no
per-row maximum).  The table is built once per lookup (no sort of the keys by hash beyond one
``argsort`` of their slots).

:func:`group_windows` is the partial's work on the cpu backend (selected by
``backend.ops.lookup_slot_tables``, as :class:`gpuclust.analyses._lookup.InstanceLookup` does):
the rows are taken a block at a time (a block's hashes, records and products stay in cache),
then per collection code one ``bincount`` per sum adds its windows in row order, exactly as the
generic path (``JobUsage._by_code``) does, so both give the same sums bit for bit.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from gpuclust._cache import PerArrayCache
from gpuclust.analyses.grouping import packed_order
from gpuclust.keys import hash64

__all__ = ["KeyTable", "group_windows", "key_table"]

#: Rows per block (a block's temporaries stay in the core's cache).
BLOCK = 1 << 15
_HOUR_US = 3.6e9


class KeyTable:
    """Linear probing over a lookup's keys (see the module docstring).

    The keys are held in the lookup's order, one 32-byte record each (``keys``: collection,
    machine, instance, code), then a sentinel record at position ``n``: a copy of key 0 with
    code -1.  The slots (``2**bits + n`` int32, load factor at most 1/4, no wrap-around) hold
    the position of a key in ``keys``, ``n`` where empty.  A key sits in the first free slot at
    or after its home slot (the top ``bits`` of its :func:`gpuclust.keys.hash64`), so a query
    probes from its home slot until it finds its key or an empty slot; no query that reaches an
    empty slot has key 0 (key 0 lies between its home slot and the first empty slot after it), so
    the sentinel matches nothing and the probe needs no other test.
    """

    REC = np.dtype([("c", "<i8"), ("m", "<i8"), ("i", "<i4"), ("code", "<i4"), ("pad", "<i8")])
    #: log2 of slots per key (at least): load factor at most 1/4
    SPARSITY = 2

    def __init__(
        self,
        collection: np.ndarray,
        instance: np.ndarray,
        machine: np.ndarray,
        code: np.ndarray,
        priority: np.ndarray,
        n_codes: int,
    ):
        code = np.asarray(code, dtype=np.int64)
        n = int(code.shape[0])
        if n >= (1 << 31) - 1:
            raise ValueError("KeyTable: too many keys for int32 positions")
        keys = np.zeros(n + 1, self.REC)
        keys["c"][:n] = collection
        keys["m"][:n] = machine
        keys["i"][:n] = instance
        keys["code"][:n] = code
        if n:
            keys[n] = keys[0]
        keys["code"][n] = -1
        self.keys = keys
        self.n = n
        self.code = code
        self.prio = np.asarray(priority, dtype=np.int64)
        self.n_codes = int(n_codes)
        self.bits = max(4, int(max(n, 1) - 1).bit_length() + self.SPARSITY)
        self.shift = np.uint64(64 - self.bits)
        home = (hash64(np, [collection, instance, machine]) >> self.shift).view(np.int64)
        order = packed_order(np, home, 1 << self.bits)  # (home < 2^bits: one sort of values)
        if order is None:
            order = np.argsort(home)
        ar = np.arange(n, dtype=np.int64)
        pos = np.maximum.accumulate(home[order] - ar) + ar if n else ar  # first free slot at or after home
        self.slots = np.full((1 << self.bits) + n, n, np.int32)
        self.slots[pos] = order

    def find(self, collection: np.ndarray, instance: np.ndarray, machine: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Per query: its collection code (-1 where its key is not in the table) and the position
        of its key in :attr:`keys` (``n``, the sentinel, where not)."""
        n = self.n
        p = (hash64(np, [collection, instance, machine]) >> self.shift).view(np.int64)
        k = np.take(self.slots, p)
        rec = np.take(self.keys, k)
        hit = rec["c"] == collection
        hit &= rec["m"] == machine
        hit &= rec["i"] == instance
        code = np.where(hit, rec["code"], -1)
        more = np.flatnonzero(~hit & (k != n))  # the slot holds another key: probe on
        if more.shape[0]:
            q, c, m, i = p[more] + 1, collection[more], machine[more], instance[more]
            while more.shape[0]:
                kq = np.take(self.slots, q)
                rec = np.take(self.keys, kq)
                ok = (rec["c"] == c) & (rec["m"] == m) & (rec["i"] == i)
                code[more[ok]] = rec["code"][ok]
                k[more] = kq  # where the probe stands: the key found, or the sentinel of an empty slot
                go = ~ok & (kq != n)
                more, q, c, m, i = more[go], q[go] + 1, c[go], m[go], i[go]
        return code, k

    def priorities(self, marked: np.ndarray) -> np.ndarray:
        """Per collection code: the maximum priority of its keys that are ``marked`` (a flag per
        key; -1 where none is)."""
        out = np.full(self.n_codes, -1, np.int64)
        hit = np.flatnonzero(marked)
        np.maximum.at(out, self.code[hit], self.prio[hit])
        return out


_tables = PerArrayCache()


def key_table(lookup: Any, key_collection: np.ndarray, n_codes: int) -> KeyTable:
    """The :class:`KeyTable` of a lookup and its keys' collection codes (built once per lookup)."""
    return _tables.get(
        lookup.hash,
        lambda _h: KeyTable(lookup.collection, lookup.instance, lookup.machine, key_collection, lookup.code, n_codes),
    )


def group_windows(
    table: KeyTable, collections: np.ndarray, cols: dict[str, np.ndarray], rows: np.ndarray | None, n: int
) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray], dict[str, int]]:
    """Per collection of the windows ``rows`` of ``cols`` (``None``: all ``n``): NCU-hours, NMU-hours
    (NULL or infinite averages add nothing), windows and the priority.

    Returns ``(dense, extra, unknown)``: ``dense`` over every code of ``collections`` (the table's
    sorted collections; codes without windows have ``windows`` 0), ``extra`` keyed by the sorted
    collections of windows whose collection is not among them (priority -1), and the counts of
    unknown CPU and memory averages."""
    s, e = cols["start_time"], cols["end_time"]
    cid, inst, mach = cols["collection_id"], cols["instance_index"], cols["machine_id"]
    avg = {"cpu": cols["avg_cpu"], "mem": cols["avg_mem"]}
    code = np.empty(n, np.int64)
    w = {k: np.empty(n, np.float64) for k in avg}
    unknown = {k: 0 for k in avg}
    marked = np.zeros(table.n + 1, dtype=bool)  # a flag per key, and one for the sentinel (not found)
    for lo in range(0, n, BLOCK):
        hi = min(n, lo + BLOCK)
        r = slice(lo, hi) if rows is None else rows[lo:hi]
        c = cid[r]
        got, key = table.find(c, inst[r], mach[r])
        code[lo:hi] = got
        marked[key] = True
        hours = np.divide(e[r] - s[r], _HOUR_US)  # float64, as (e - s).astype(float64) / _HOUR_US
        for k, v in avg.items():
            vb = v[r]
            out = w[k][lo:hi]
            np.multiply(vb, hours, out=out)
            fin = np.isfinite(vb)
            nb = int(fin.shape[0] - np.count_nonzero(fin))
            if nb:
                unknown[k] += nb
                out[~fin] = 0.0
    n_coll = int(collections.shape[0])
    miss = np.flatnonzero(code < 0)
    extra_ids = np.zeros(0, np.int64)
    if miss.shape[0]:
        c = cid[miss if rows is None else rows[miss]].astype(np.int64)
        u, inv = np.unique(c, return_inverse=True)
        pos = np.searchsorted(collections, u)
        known = (
            (pos < n_coll) & (collections[np.minimum(pos, max(n_coll - 1, 0))] == u)
            if n_coll
            else np.zeros(u.shape[0], dtype=bool)
        )
        code[miss] = np.where(known, pos, n_coll + np.cumsum(~known) - 1)[inv.reshape(-1)]
        extra_ids = u[~known]
    total = n_coll + int(extra_ids.shape[0])
    windows = np.bincount(code, minlength=total)
    sums = {k: np.bincount(code, weights=w[k], minlength=total) for k in w}
    prio = table.priorities(marked[:-1])
    dense = {
        "key": collections,
        "cpu": sums["cpu"][:n_coll],
        "mem": sums["mem"][:n_coll],
        "windows": windows[:n_coll].astype(np.int64, copy=False),
        "prio": prio,
    }
    extra = {
        "key": extra_ids,
        "cpu": sums["cpu"][n_coll:],
        "mem": sums["mem"][n_coll:],
        "windows": windows[n_coll:].astype(np.int64, copy=False),
        "prio": np.full(extra_ids.shape[0], -1, np.int64),
    }
    return dense, extra, unknown
