"""Grouping, shared by every analysis: group keys, and the one time-bucket convention.

* :data:`KEY_COLUMNS`: the result columns of each grouping name;
* :func:`group_key`: one int64 key per row from the key components (the value itself for one
  component, a splitmix64 chain of several, :func:`gpuclust.keys.hash64`);
* :func:`instance_order`: rows by instance, then time (a stable three-key sort, as one sort);
* :class:`FloatBins`: ``searchsorted(edges, x, side="right")`` from a table of the floats' top
  bits (lifecycle's delay bins, usage-vs-request's ratio bins);
* time buckets (docs/user/dataset.md, "Time buckets"): origin trace time 0, bucket ``k`` of width ``W``
  is ``[k W, (k + 1) W)`` µs -- :func:`bucket_index`, :func:`bucket_span` (the buckets a window
  ``[s, e)`` touches), :func:`bucket_grid` (the buckets covering a trace window).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from gpuclust.keys import hash64, pack_bits, unpack_bits

__all__ = [
    "HOUR_US",
    "KEY_COLUMNS",
    "FloatBins",
    "bucket_grid",
    "bucket_index",
    "bucket_pieces",
    "bucket_span",
    "group_key",
    "dense_rank",
    "distinct_sorted",
    "instance_order",
    "isin_sorted",
    "segmented_last",
    "unique_codes",
    "unique_counts",
    "unique_sorted",
]


def distinct_sorted(xp: Any, a: Any) -> int:
    """The number of distinct values of a sorted (non-decreasing) array: ``xp.unique(a).shape[0]``
    without a sort, and without the import of ``numpy.ma`` that ``np.unique`` brings (~15-40 ms of
    a run's start-up).

    >>> distinct_sorted(np, np.array([1, 1, 2, 5, 5])), distinct_sorted(np, np.zeros(0))
    (3, 0)
    """
    n = int(a.shape[0])
    return 0 if n == 0 else 1 + int(xp.count_nonzero(a[1:] != a[:-1]))


def unique_codes(ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``np.unique(ids, return_inverse=True)`` as int64 arrays, by one unstable sort (and without
    the import of ``numpy.ma`` that ``np.unique`` brings).

    >>> [a.tolist() for a in unique_codes(np.array([7, 3, 7, 5]))]
    [[3, 5, 7], [2, 0, 2, 1]]
    """
    ids = np.asarray(ids, dtype=np.int64)
    order = np.argsort(ids)
    s = ids[order]
    first = np.ones(s.shape[0], dtype=bool)
    first[1:] = s[1:] != s[:-1]
    code = np.empty(s.shape[0], np.int64)
    code[order] = np.cumsum(first) - 1
    return s[first], code


def unique_counts(a: Any) -> tuple[np.ndarray, np.ndarray]:
    """``np.unique(a, return_counts=True)`` (the sorted distinct values and how often each
    occurs, int64) by one sort, without the import of ``numpy.ma`` that ``np.unique`` brings.

    >>> [v.tolist() for v in unique_counts(np.array([7, 3, 7, 5]))]
    [[3, 5, 7], [1, 1, 2]]
    """
    s = np.sort(np.asarray(a))
    first = np.ones(s.shape[0], dtype=bool)
    first[1:] = s[1:] != s[:-1]
    at = np.flatnonzero(first)
    return s[at], np.diff(np.append(at, s.shape[0])).astype(np.int64)


def unique_sorted(a: Any) -> np.ndarray:
    """``np.unique(a)``: the sorted distinct values (:func:`unique_counts`).

    >>> unique_sorted(np.array([7, 3, 7, 5])).tolist(), unique_sorted(np.zeros(0, np.int64)).tolist()
    ([3, 5, 7], [])
    """
    return unique_counts(a)[0]


def isin_sorted(a: Any, values: Any) -> np.ndarray:
    """``np.isin(a, values)`` for sorted distinct ``values`` (a sequence or an array) by a binary
    search, without the import of ``numpy.ma`` that ``np.isin`` brings.

    >>> isin_sorted(np.array([1, 4, 9, 4]), (4, 5, 6)).tolist(), isin_sorted(np.array([1]), ()).tolist()
    ([False, True, False, True], [False])
    """
    a = np.asarray(a)
    v = np.asarray(values, dtype=a.dtype)
    if v.shape[0] == 0:
        return np.zeros(a.shape, dtype=bool)
    pos = np.minimum(np.searchsorted(v, a), v.shape[0] - 1)
    return v[pos] == a


#: One hour in µs (cell-usage's bucket).
HOUR_US = 3_600_000_000
#: Result key columns of each grouping name (``cell``: none, one group; ``time``: the bucket).
KEY_COLUMNS: dict[str, tuple[str, ...]] = {
    "instance": ("collection_id", "instance_index"),
    "collection": ("collection_id",),
    "machine": ("machine_id",),
    "tier": ("tier",),
    "cell": (),
    "time": ("bucket",),
}


@dataclass(frozen=True)
class FloatBins:
    """``searchsorted(edges, x, side="right")`` (int64) of float64 values without a search: the
    float's exponent and top ``bits`` mantissa bits pick a cell (``2**bits`` per octave from ``lo``
    to ``hi``; below ``lo``: the first cell, from ``hi`` on: the last), a table gives the bin of
    the cell's lower end, and one is added where the cell's edge lies at or below the value.
    Exact for any value but NaN (``-0.0`` and below: bin 0) as long as each cell holds at most
    one edge and every edge lies in ``[lo, hi)``, which the constructor checks.

    >>> fb = FloatBins(np.array([1.0, 3.0, 10.0]), bits=2, lo=1.0, hi=16.0)
    >>> x = np.array([-1.0, 0.0, 1.0, 2.9, 3.0, 9.99, 10.0, 1e9, np.inf])
    >>> fb.bins(np, x).tolist() == np.searchsorted(fb.edges[:-1], x, side="right").tolist()
    True
    """

    edges: np.ndarray
    bits: int
    lo: float
    hi: float
    what: str = "bins"
    cells: np.ndarray = field(init=False, repr=False)

    def __post_init__(self) -> None:
        edges = np.asarray(self.edges, dtype=np.float64)
        c_lo, c_hi = self._cell(self.lo), self._cell(self.hi)
        lower = (np.arange(c_lo, c_hi, dtype=np.int64) << self.shift).view(np.float64)
        upper = (np.arange(c_lo + 1, c_hi + 1, dtype=np.int64) << self.shift).view(np.float64)
        first = np.searchsorted(edges, lower, side="right")
        ext = np.concatenate([edges, [np.inf, np.inf]])
        # at most one edge inside each cell: the second edge after its lower end is at or above its upper end
        if not bool((ext[first + 1] >= upper).all()) or not (edges[0] >= lower[0] and edges[-1] < upper[-1]):
            raise AssertionError(f"{self.what}: cells too wide for the edges")
        object.__setattr__(self, "cells", np.concatenate([[0], first, [edges.shape[0]]]).astype(np.int16))
        object.__setattr__(self, "edges", np.concatenate([edges, [np.nan]]))  # NaN after the last: never passed

    @property
    def shift(self) -> int:
        return 52 - self.bits

    def _cell(self, v: float) -> int:
        return int(np.float64(v).view(np.int64)) >> self.shift

    def bins(self, xp: Any, x: Any, cells: Any = None, edges: Any = None) -> Any:
        """The bins of float64 ``x`` (``cells`` / ``edges``: :attr:`cells` and :attr:`edges` on
        the backend, e.g. ``backend.stage(fb.cells)``; default the host arrays)."""
        cells = self.cells if cells is None else cells
        edges = self.edges if edges is None else edges
        c_lo, c_hi = self._cell(self.lo), self._cell(self.hi)
        k = xp.right_shift(x.view(xp.int64), self.shift)
        k -= c_lo - 1
        xp.clip(k, 0, c_hi - c_lo + 1, out=k)
        b = xp.take(cells, k).astype(xp.int64)
        b += x >= xp.take(edges, b)
        return b


def group_key(xp: Any, comps: list[Any], n: int) -> Any:
    """int64 group key of ``n`` rows from their key components: 0 for none, the value itself for
    one, a splitmix64 chain for several (callers verify the components: a collision raises)."""
    if not comps:
        return xp.zeros(n, dtype=xp.int64)
    if len(comps) == 1:
        return comps[0].astype(xp.int64)
    return hash64(xp, comps).view(xp.int64)


def bucket_index(t: Any, width_us: int) -> Any:
    """Bucket of trace time ``t`` (µs; scalar or array): ``floor(t / width_us)``."""
    return t // width_us


def bucket_span(xp: Any, start: Any, end: Any, width_us: int, origin: int = 0) -> tuple[Any, Any]:
    """First and last bucket (counted from ``origin``) that windows ``[start, end)`` touch; a
    window with ``end <= start`` touches the bucket of its start only."""
    b0 = (start - origin) // width_us
    return b0, xp.where(end > start, (end - 1 - origin) // width_us, b0)


def bucket_pieces(xp: Any, start: Any, end: Any, width_us: int) -> tuple[Any, Any, Any]:
    """The pieces of windows ``[start, end)`` (``end > start``) cut at bucket edges: per piece its
    window's row, its bucket and its overlap in µs (pieces of one row in bucket order; every
    array on ``xp``).  Memory O(pieces): a window of ``k`` buckets gives ``k`` pieces.

    >>> import numpy as np
    >>> [a.tolist() for a in bucket_pieces(np, np.array([50, 0]), np.array([250, 100]), 100)]
    [[0, 0, 0, 1], [0, 1, 2, 0], [50, 100, 50, 100]]
    """
    b0, b1 = bucket_span(xp, start, end, width_us)
    k = (b1 - b0 + 1).astype(xp.int64)
    ends = xp.cumsum(k)
    total = int(ends[-1]) if int(k.shape[0]) else 0
    piece = xp.arange(total, dtype=xp.int64)
    # each piece's row (CuPy's repeat takes no array of counts: a search over the running ends)
    row = xp.searchsorted(ends, piece, side="right")
    bucket = b0[row] + (piece - (ends - k)[row])
    lo = xp.maximum(start[row], bucket * width_us)
    hi = xp.minimum(end[row], (bucket + 1) * width_us)
    return row, bucket, hi - lo


def bucket_grid(w0: int, w1: int, width_us: int) -> tuple[int, int]:
    """``(origin, n_buckets)``: the whole buckets covering the trace window ``[w0, w1)``
    (``origin``: the first one's start).

    >>> bucket_grid(600_000_000, 7_200_000_000, 3_600_000_000)
    (0, 2)
    """
    origin = (w0 // width_us) * width_us
    return origin, (-(-w1 // width_us) - w0 // width_us) if w1 > w0 else 0


def segmented_last(ops: Any, xp: Any, flag: Any, seg_start: Any) -> Any:
    """Per row of rows grouped in runs (``seg_start``: each row's run's first index): the index of
    the last row at or before it in its run with ``flag`` set, else -1.

    One prefix count of the flags and a gather of the flagged rows' indices (O(n) on either
    backend: CuPy's ``cumsum`` is one device scan, where a running maximum of indices,
    ``ops.cummax_rows``, takes log2(n) passes on the GPU).  ``ops`` is kept for the callers'
    signature.

    >>> import numpy as np
    >>> from gpuclust.backends import get_backend
    >>> segmented_last(get_backend("cpu").ops, np, np.array([1, 0, 0, 1, 0], bool), np.array([0, 0, 2, 2, 2])).tolist()
    [0, 0, -1, 3, 3]
    """
    n = int(flag.shape[0])
    flagged = xp.nonzero(flag)[0].astype(xp.int64)
    if n == 0 or int(flagged.shape[0]) == 0:
        return xp.full(n, -1, dtype=xp.int64)
    count = xp.cumsum(flag, dtype=xp.int64)  # flags at or before each row
    last = xp.where(count > 0, flagged[xp.maximum(count - 1, 0)], -1)
    return xp.where(last >= seg_start, last, -1)


def packed_order(xp: Any, key: Any, span: int) -> Any | None:
    """The stable argsort of ``key`` (int64 values in ``[0, span)``) by one sort of values:
    ``key << b | row`` (``b`` the bits of a row number) is unique, so an unstable sort of the
    packed values orders the rows stably and ``& (2^b - 1)`` reads each one's row back.  A sort of
    values moves half the bytes of an argsort and vectorises (NumPy's SIMD sort: about 4x faster
    than ``argsort`` on the benchmark's event partitions; CuPy's radix sort of keys alone);
    ``None`` where the packed value would not fit in 63 bits.

    >>> import numpy as np
    >>> packed_order(np, np.array([2, 0, 2, 1]), 3).tolist()
    [1, 3, 0, 2]
    >>> packed_order(np, np.array([2, 0, 1, 3]), 1 << 62) is None
    True
    """
    n = int(key.shape[0])
    bits = max(n - 1, 1).bit_length()
    if span <= 0 or (span - 1) >> (63 - bits):
        return None
    return unpack_bits(xp.sort(pack_bits(key, xp.arange(n, dtype=xp.int64), bits)), bits, inplace=True)[1]


def hash_order(h: np.ndarray) -> np.ndarray:
    """An order of the uint64 hashes ``h`` by value (equal values in any order), on the host:
    :func:`packed_order` of their top bits, then, only where two distinct hashes share those bits
    out of order (rare), a stable sort of the nearly sorted result (timsort: a pass over its runs).
    About 2x faster than ``argsort`` of the full values.

    >>> h = np.array([7, 2**63 + 1, 3, 2**63], np.uint64)
    >>> h[hash_order(h)].tolist() == sorted(h.tolist())
    True
    """
    n = int(h.shape[0])
    bits = max(n - 1, 1).bit_length()
    order = packed_order(np, (h >> np.uint64(bits + 1)).view(np.int64), 1 << (63 - bits))
    if order is None:
        return np.argsort(h)
    hs = h[order]
    if not bool((hs[1:] >= hs[:-1]).all()):
        order = order[np.argsort(hs, kind="stable")]
    return order


def dense_rank(xp: Any, a: Any) -> tuple[Any, int]:
    """Each value's rank among the distinct values of ``a`` (0, 1, ...), and how many there are:
    one sort (:func:`packed_order` where the values' range allows, else an unstable argsort; equal
    values get equal ranks, so stability does not matter).

    >>> import numpy as np
    >>> r, k = dense_rank(np, np.array([30, 10, 30, 20]))
    >>> r.tolist(), k
    ([2, 0, 2, 1], 3)
    >>> dense_rank(np, np.array([2**62, -2**63, 2**62, 5]))[0].tolist()  # wider than packing allows
    [2, 0, 2, 1]
    """
    n = int(a.shape[0])
    if n == 0:
        return xp.zeros(0, dtype=xp.int64), 0
    a = a.astype(xp.int64, copy=False)
    lo, hi = int(a.min()), int(a.max())
    o = packed_order(xp, a - lo, hi - lo + 1) if hi - lo < 1 << 62 else None
    if o is None:
        o = xp.argsort(a)
    s = a[o]
    new = xp.zeros(n, dtype=xp.int64)
    new[1:] = s[1:] != s[:-1]
    r = xp.empty(n, dtype=xp.int64)
    r[o] = xp.cumsum(new)
    return r, int(r.max()) + 1


def instance_order(xp: Any, collection: Any, instance: Any, time: Any) -> Any:
    """The permutation ``xp.lexsort((time, instance, collection))`` gives: rows by collection,
    instance and time, ties in row order.

    One sort of a unique int64 key, ``((dense (collection, instance) code) x times + time rank)
    x n + row`` (:func:`packed_order`); on time-ordered rows (a bucketed dataset's) the row alone
    orders by time, so no time rank is needed.  Where the key fits in 62 bits but not beside the
    row (a large flat table: 1.6e7 rows leave 39 bits), the key's dense rank takes its place (one
    more sort); ``lexsort`` only where the key itself could overflow.

    >>> import numpy as np
    >>> c, i, t = np.array([5, 3, 5, 3, 5]), np.array([0, 1, 0, 0, 0]), np.array([9, 1, 2, 4, 2])
    >>> instance_order(np, c, i, t).tolist() == np.lexsort((t, i, c)).tolist() == [3, 1, 2, 4, 0]
    True
    """
    n = int(time.shape[0])
    if n < 2:
        return xp.arange(n, dtype=xp.int64)
    c = collection.astype(xp.int64)
    i = instance.astype(xp.int64)
    rank, times = (None, 1) if bool((time[1:] >= time[:-1]).all()) else dense_rank(xp, time)
    code, nc = dense_rank(xp, c)
    lo = int(i.min())
    width = int(i.max()) - lo + 1
    if nc * width * times >= 1 << 62:
        return xp.lexsort(xp.stack([xp.arange(n, dtype=xp.int64), time.astype(xp.int64), i, c]))
    key = code * width + (i - lo)
    if rank is not None:
        key = key * times + rank
    order = packed_order(xp, key, nc * width * times)
    if order is None:  # the key fits, the row beside it does not: pack its dense rank instead
        key, k = dense_rank(xp, key)
        order = packed_order(xp, key, k)
    return order
