"""Machine ids: :class:`MachineHash`, a perfect hash of the machine list (no probe loop, the same
elementwise code on either backend), :func:`id_index` (a machine id's position in the sorted
machine list, by a :class:`MachineHash` kept per list) and :func:`machine_capacities` (a machine's
capacity as the notebook takes it).  Re-exported by :mod:`gpuclust.analyses._lookup`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from gpuclust._cache import PerArrayCache
from gpuclust.analyses.grouping import distinct_sorted
from gpuclust.keys import GOLDEN, splitmix64

__all__ = ["MachineHash", "id_index", "machine_capacities"]


def _odd_multiplier(k: int) -> int:
    """The ``k``-th candidate multiplier of :class:`MachineHash`: splitmix64's ``k``-th output
    (seed 0x5EED, :func:`gpuclust.keys.splitmix64`), made odd and below 2^63 (``numpy.random``
    would cost ~10 ms of a run's start-up to import).

    >>> all(_odd_multiplier(k) % 2 == 1 and 0 < _odd_multiplier(k) < 1 << 63 for k in range(64))
    True
    """
    z = int(splitmix64(np, np.array([(0x5EED + k * GOLDEN) & ((1 << 64) - 1)], np.uint64))[0])
    return (z >> 1) | 1


@dataclass(frozen=True)
class MachineHash:
    """A perfect hash of the machine ids (each id its own slot, found in one probe): a
    multiplicative hash ``h = id * mult`` (mod 2^64); its top ``gbits`` bits pick a group, whose
    displacement ``disp[group]`` is XORed into the next ``sbits`` bits to give the slot; the slot
    holds ``(id, code)``.  Built on the host (hash and displace); looked up on any backend in a
    few elementwise passes and two gathers (a third of the probing hash table's time here: no
    probe loop, the tables stay in cache).  A query is found iff its slot holds its own id (empty
    slots hold the first id, which lives in its own slot, so they match nothing that lands there).

    >>> import numpy as np
    >>> from gpuclust.backends import get_backend
    >>> t = MachineHash.build(np.array([3, 8, 20, -5]))
    >>> code, found = t.find(get_backend("cpu"), np.array([20, 5, 3, -5]))
    >>> found.tolist(), code[found].tolist()
    ([True, False, True, True], [2, 0, 3])
    """

    mult: int
    gbits: int
    sbits: int
    disp: np.ndarray
    slots: np.ndarray
    #: machine ids
    size: int = 0

    @classmethod
    def build(cls, ids: np.ndarray) -> MachineHash:
        """The table of unique int64 ``ids`` (code = position in ``ids``)."""
        ids = np.ascontiguousarray(ids, dtype=np.int64)
        n = int(ids.shape[0])
        sbits = max(4, int(2 * n - 1).bit_length())  # load factor <= 1/2
        gbits = max(1, int(max(n // 2, 1) - 1).bit_length())  # about 2 ids per group
        m = 1 << sbits
        u = ids.view(np.uint64)
        cand = np.arange(m, dtype=np.int64)
        for attempt in range(64):
            mult = _odd_multiplier(attempt)
            with np.errstate(over="ignore"):
                h = u * np.uint64(mult)
            g = (h >> np.uint64(64 - gbits)).astype(np.int64)
            sl = ((h << np.uint64(gbits)) >> np.uint64(64 - sbits)).astype(np.int64)
            if distinct_sorted(np, np.sort(g * m + sl)) < n:  # two ids of a group share their slot bits
                continue
            order = np.argsort(g, kind="stable")
            gs = g[order]
            starts = np.flatnonzero(np.r_[True, gs[1:] != gs[:-1]]) if n else np.zeros(0, np.int64)
            ends = np.r_[starts[1:], n].astype(np.int64)
            occupied = np.zeros(m, dtype=bool)
            disp = np.zeros(1 << gbits, dtype=np.int64)
            slot = np.zeros(n, dtype=np.int64)
            for j in np.argsort(starts - ends, kind="stable"):  # largest groups first
                members = order[starts[j] : ends[j]]
                s = sl[members]
                d = -1
                for lo in range(0, m, 256):  # the first displacement whose slots are all free
                    free = np.flatnonzero(~occupied[s[:, None] ^ cand[None, lo : lo + 256]].any(axis=0))
                    if free.shape[0]:
                        d = lo + int(free[0])
                        break
                if d < 0:
                    break
                occupied[s ^ d] = True
                disp[gs[starts[j]]] = d
                slot[members] = s ^ d
            else:
                slots = np.zeros((m, 2), dtype=np.int64)
                slots[:, 0] = ids[0] if n else 0
                slots[slot, 0] = ids
                slots[slot, 1] = np.arange(n, dtype=np.int64)
                return cls(mult, gbits, sbits, disp, slots, n)
        raise RuntimeError("no perfect hash of the machine ids found (please report)")

    def find(self, backend: Any, q: Any) -> tuple[Any, Any]:
        """Per int64 query: its code (meaningless where not found) and whether it is a machine id."""
        xp = backend.xp
        n = int(q.shape[0])
        if n == 0 or self.n == 0:
            return xp.zeros(n, dtype=xp.int64), xp.zeros(n, dtype=bool)
        q = xp.ascontiguousarray(q.astype(xp.int64, copy=False))
        h = q.view(xp.uint64) * xp.uint64(self.mult)
        g = (h >> xp.uint64(64 - self.gbits)).view(xp.int64)
        h <<= xp.uint64(self.gbits)
        h >>= xp.uint64(64 - self.sbits)
        sl = h.view(xp.int64)
        sl ^= xp.take(backend.stage(self.disp), g)
        e = xp.take(backend.stage(self.slots), sl, axis=0)  # (id, code) side by side: one cache line
        return e[:, 1], e[:, 0] == q

    @property
    def n(self) -> int:
        return int(self.size)


def id_index(backend: Any, ids: np.ndarray, queries: Any) -> tuple[Any, Any]:
    """Per query: its position in ``ids`` (a sorted, unique int64 host array; 0 where absent) and
    whether it is there.

    By a :class:`MachineHash` of ``ids``, built once per ids array (kept while it lives): one
    multiply and two gathers per query on either backend, no probe loop.

    Examples
    --------
    >>> import numpy as np
    >>> from gpuclust.backends import get_backend
    >>> pos, found = id_index(get_backend("cpu"), np.array([3, 8, 20]), np.array([20, 5, 3]))
    >>> pos.tolist(), found.tolist()
    ([2, 0, 0], [True, False, True])
    """
    xp = backend.xp
    n = int(queries.shape[0])
    if ids.shape[0] == 0 or n == 0:
        return xp.zeros(n, dtype=xp.int64), xp.zeros(n, dtype=bool)
    code, found = _id_hashes.get(ids, MachineHash.build).find(backend, queries)
    return xp.where(found, code, 0), found


_id_hashes = PerArrayCache()


def machine_capacities(me: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Sorted machine ids of a machine_events table and, per machine, ``MAX(cap_cpu)`` and
    ``MAX(cap_mem)`` over its events (NULLs ignored; NaN when every value is NULL): Google's
    notebook's capacity of a machine, as cell-usage, cpi and machine-utilization's notebook mode use
    it (its default time-weighted mode follows each machine's capacity over time instead)."""
    from gpuclust.analyses._extent import to_f64, to_i64

    m = to_i64(me.column("machine_id"))
    cpu, mem = to_f64(me.column("cap_cpu")), to_f64(me.column("cap_mem"))
    if m.size == 0:
        return np.zeros(0, np.int64), np.zeros(0, np.float64), np.zeros(0, np.float64)
    o = np.argsort(m, kind="stable")
    ms = m[o]
    first = np.flatnonzero(np.r_[True, ms[1:] != ms[:-1]])
    # fmax ignores NaN (a NULL capacity) unless every value of the machine is NaN
    return ms[first], np.fmax.reduceat(cpu[o], first), np.fmax.reduceat(mem[o], first)
