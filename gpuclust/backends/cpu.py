"""NumPy twins of every custom-kernel op: the oracle the GPU kernels are tested against.

Each function has the same name, signature, argument checks and semantics as its typed wrapper in
``backends/gpu.py``.  Accumulation is in float64.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from gpuclust._cache import PerArrayCache
from gpuclust.keys import GOLDEN, pack

__all__ = [
    "bucket_overlap",
    "check_1d",
    "check_bucket_overlap",
    "check_grouped_sum",
    "check_hash_index",
    "grouped_sum",
    "hash_index",
    "lookup_block_rows",
    "lookup_slot_tables",
]

_INT64_MAX = 2**63 - 1
_VALUE_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))
_CODE_DTYPES = (np.dtype(np.int32), np.dtype(np.int64))


def check_1d(name: str, a: Any, dtypes: tuple[np.dtype, ...], n: int | None) -> int:
    if getattr(a, "ndim", None) != 1:
        raise ValueError(f"{name} must be a 1-D array, got {getattr(a, 'shape', type(a).__name__)}")
    if a.dtype not in dtypes:
        raise TypeError(f"{name} must have dtype {' or '.join(map(str, dtypes))}, got {a.dtype}")
    if not a.flags.c_contiguous:
        raise ValueError(f"{name} must be C-contiguous")
    if n is not None and a.shape[0] != n:
        raise ValueError(f"{name} has length {a.shape[0]}, expected {n}")
    return int(a.shape[0])


def check_bucket_overlap(
    start: Any, end: Any, value: Any, group: Any, n_groups: int, n_buckets: int, origin: int, width: int
) -> int:
    """Validate :func:`bucket_overlap` arguments (shared by both backends); returns the length."""
    n = check_1d("start", start, (np.dtype(np.int64),), None)
    check_1d("end", end, (np.dtype(np.int64),), n)
    if getattr(value, "ndim", None) == 2:
        if value.dtype not in _VALUE_DTYPES:
            raise TypeError(f"value must have dtype float32 or float64, got {value.dtype}")
        if not value.flags.c_contiguous:
            raise ValueError("value must be C-contiguous")
        if value.shape[1] != n:
            raise ValueError(f"value has {value.shape[1]} columns, expected {n} (one per interval)")
    else:
        check_1d("value", value, _VALUE_DTYPES, n)
    check_1d("group", group, (np.dtype(np.int32),), n)
    if n_groups < 0 or n_buckets < 0 or n_groups > 2**31 - 1:
        raise ValueError("n_groups and n_buckets must be non-negative (n_groups < 2^31)")
    if width <= 0:
        raise ValueError(f"width must be positive, got {width}")
    if not -(2**63) <= origin <= _INT64_MAX or origin + n_buckets * width > _INT64_MAX:
        raise ValueError("origin + n_buckets * width must fit in int64")
    return n


def check_grouped_sum(codes: Any, values: Any, n_groups: int) -> int:
    """Validate :func:`grouped_sum` arguments (shared by both backends); returns the length."""
    n = check_1d("codes", codes, _CODE_DTYPES, None)
    check_1d("values", values, _VALUE_DTYPES, n)
    if n_groups < 0:
        raise ValueError(f"n_groups must be non-negative, got {n_groups}")
    return n


def bucket_overlap(
    start: np.ndarray,
    end: np.ndarray,
    value: np.ndarray,
    group: np.ndarray,
    *,
    n_groups: int,
    n_buckets: int,
    origin: int,
    width: int,
) -> np.ndarray:
    """Add ``value * overlap_seconds([start, end), bucket)`` into ``out[group, bucket]``.

    Parameters
    ----------
    start, end
        int64 interval bounds in microseconds, half-open ``[start, end)``.
    value
        float32 or float64 value per interval (a rate: it is multiplied by seconds), shape
        ``(n,)``; or ``(k, n)`` for ``k`` value series over the same intervals (one sweep).
    group
        int32 group code per interval; codes outside ``[0, n_groups)`` are ignored.
    n_groups, n_buckets
        Output shape.
    origin, width
        Bucket ``b`` covers ``[origin + b*width, origin + (b+1)*width)`` microseconds.

    Returns
    -------
    numpy.ndarray
        float64 array of shape ``(n_groups, n_buckets)``, or ``(k, n_groups, n_buckets)`` for a
        2-D ``value``.

    Notes
    -----
    Intervals are clipped to the bucket range, so sentinels such as 2^63-1 are safe.  Intervals
    with ``end <= start`` add nothing; a NaN value adds nothing (to its own series only).
    Overlaps are exact integers, converted to seconds as ``overlap_us / 1e6``.  Every interval
    contributes its first and last bucket directly; only the full-width buckets in between
    (intervals spanning three or more) are expanded piece by piece.

    Examples
    --------
    >>> import numpy as np
    >>> out = bucket_overlap(np.array([1_800_000_000]), np.array([5_400_000_000]), np.array([2.0]),
    ...                      np.array([0], dtype=np.int32), n_groups=1, n_buckets=2, origin=0,
    ...                      width=3_600_000_000)
    >>> out.tolist()
    [[3600.0, 3600.0]]
    """
    check_bucket_overlap(start, end, value, group, n_groups, n_buckets, origin, width)
    vals = value if value.ndim == 2 else value.reshape(1, -1)
    k = vals.shape[0]
    cells = n_groups * n_buckets
    out = np.zeros((k, cells), dtype=np.float64)
    shape = (k, n_groups, n_buckets) if value.ndim == 2 else (n_groups, n_buckets)
    if cells == 0 or start.shape[0] == 0:
        return out.reshape(shape)
    s, e, g, vals = _clip_intervals(start, end, vals, group, n_groups, origin, origin + n_buckets * width)
    if s.shape[0] == 0:
        return out.reshape(shape)
    v = vals.astype(np.float64, copy=False)
    nan = np.isnan(v)
    if nan.any():  # NaN adds nothing, to its own series only
        v = np.where(nan, 0.0, v)
    del nan
    b0 = s - origin
    b0 //= width
    b1 = e - (1 + origin)
    b1 //= width
    base = pack(g, 0, n_buckets, inplace=True)  # g is a fresh int64 array (astype or fancy index)
    _add_first_buckets(out, s, e, v, base, b0, origin, width)
    multi = np.flatnonzero(b1 > b0)
    if multi.shape[0]:
        _add_later_buckets(out, e, v, base, b0, b1, multi, origin, width)
    return out.reshape(shape)


def _clip_intervals(
    start: np.ndarray, end: np.ndarray, vals: np.ndarray, group: np.ndarray, n_groups: int, lo: int, hi: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Clip the intervals to ``[lo, hi]`` and keep the non-empty ones with a group in range (group as fresh int64)."""
    s = np.clip(start, lo, hi)
    e = np.clip(end, lo, hi)
    keep = (e > s) & (group >= 0) & (group < n_groups)
    if not keep.all():
        idx = np.flatnonzero(keep)
        return s[idx], e[idx], group[idx].astype(np.int64), vals[:, idx]
    return s, e, group.astype(np.int64), vals


def _add_first_buckets(
    out: np.ndarray,
    s: np.ndarray,
    e: np.ndarray,
    v: np.ndarray,
    base: np.ndarray,
    b0: np.ndarray,
    origin: int,
    width: int,
) -> None:
    """Set ``out`` to every interval's first-bucket share: ``min(e, bucket end) - s`` seconds."""
    cells = out.shape[1]
    sec = b0 + 1
    sec *= width
    sec += origin
    np.minimum(sec, e, out=sec)
    sec -= s
    sec = sec / 1e6
    key = base + b0
    wv = np.empty_like(sec)
    for j in range(out.shape[0]):
        np.multiply(v[j], sec, out=wv)
        out[j] = np.bincount(key, weights=wv, minlength=cells)


def _add_later_buckets(
    out: np.ndarray,
    e: np.ndarray,
    v: np.ndarray,
    base: np.ndarray,
    b0: np.ndarray,
    b1: np.ndarray,
    multi: np.ndarray,
    origin: int,
    width: int,
) -> None:
    """Add the last bucket, then the full buckets in between, of the intervals ``multi`` spanning two or more."""
    cells = out.shape[1]
    k = out.shape[0]
    lb = b1[multi]
    sec = (e[multi] - (origin + lb * width)) / 1e6
    key = base[multi] + lb
    for j in range(k):
        out[j] += np.bincount(key, weights=v[j, multi] * sec, minlength=cells)
    counts = lb - b0[multi] - 1
    mid = counts > 0
    if mid.any():
        rows, counts = multi[mid], counts[mid]
        rep = np.repeat(np.arange(rows.shape[0]), counts)
        first = np.cumsum(counts) - counts
        key = (base[rows] + b0[rows] + 1)[rep] + (np.arange(rep.shape[0], dtype=np.int64) - first[rep])
        wsec = width / 1e6
        for j in range(k):
            out[j] += np.bincount(key, weights=v[j, rows][rep] * wsec, minlength=cells)


def grouped_sum(codes: np.ndarray, values: np.ndarray, *, n_groups: int) -> np.ndarray:
    """Sum ``values`` (as float64) by integer code into an array of length ``n_groups``.

    Codes outside ``[0, n_groups)`` and NaN values are ignored.

    Examples
    --------
    >>> import numpy as np
    >>> grouped_sum(np.array([2, 0, 2], dtype=np.int64), np.array([1.0, 2.0, 3.0]), n_groups=3).tolist()
    [2.0, 0.0, 4.0]
    """
    check_grouped_sum(codes, values, n_groups)
    v = values.astype(np.float64, copy=False)
    nan = np.isnan(v)
    if codes.shape[0] and not nan.any() and int(codes.min()) >= 0 and int(codes.max()) < n_groups:
        return np.bincount(codes, weights=v, minlength=n_groups)  # every row counts: no compaction
    keep = (codes >= 0) & (codes < n_groups) & ~nan
    return np.bincount(codes[keep], weights=v[keep], minlength=n_groups).astype(np.float64)


def check_hash_index(keys: Any, queries: Any) -> int:
    """Validate :func:`hash_index` arguments (shared by both backends); returns the query count."""
    check_1d("keys", keys, (np.dtype(np.uint64),), None)
    return check_1d("queries", queries, (np.dtype(np.uint64),), None)


_tables = PerArrayCache()
#: Fibonacci hashing multiplier (2^64 / golden ratio): spreads sorted / clustered ids over the slots.
_FIB = np.uint64(GOLDEN)
#: Rows a caller should look up at a time (``backend.ops.lookup_block_rows``): the hash, the probe
#: and the key checks of one block stay in cache.
lookup_block_rows: int | None = 1 << 16
#: ``backend.ops.lookup_slot_tables``: this backend's arrays are host NumPy arrays, which
#: :class:`gpuclust.analyses._lookup.InstanceLookup` probes through its slot table (the key and
#: code in one record: one gather per query); False on the gpu backend (``hash_index``).
lookup_slot_tables = True


class _OpenTable:
    """Linear-probing hash table over sorted unique uint64 ``keys`` (NumPy only, built vectorised).

    Slots are the top ``bits`` of ``key * _FIB``; entries are placed in slot order, each at the
    first free position at or after its slot, into ``2**bits + n`` positions (no wrap-around), so
    a key is found by scanning from its slot to the first empty position.  Each position holds
    (key, index) side by side: one probe touches one cache line."""

    _EMPTY = np.uint64(2**64 - 1)

    def __init__(self, keys: np.ndarray):
        n = int(keys.shape[0])
        self.bits = max(4, int(2 * n - 1).bit_length())  # load factor <= 1/2
        self.shift = np.uint64(64 - self.bits)
        slot = ((keys * _FIB) >> self.shift).astype(np.int64)
        order = np.argsort(slot, kind="stable")
        ar = np.arange(n, dtype=np.int64)
        pos = np.maximum.accumulate(slot[order] - ar) + ar
        self.tab = np.zeros(((1 << self.bits) + n, 2), np.uint64)
        self.tab[:, 1] = self._EMPTY
        self.tab[pos, 0] = keys[order]
        self.tab[pos, 1] = order.astype(np.uint64)

    def find(self, q: np.ndarray) -> np.ndarray:
        p = ((q * _FIB) >> self.shift).astype(np.int64)
        e = np.take(self.tab, p, axis=0)  # np.take: several times faster than self.tab[p]
        used = e[:, 1] != self._EMPTY
        hit = used & (e[:, 0] == q)
        res = np.where(hit, e[:, 1].view(np.int64), -1)
        more = np.flatnonzero(used & ~hit)  # occupied by another key: probe on
        while more.shape[0]:
            p_m = p[more] + 1
            p[more] = p_m
            e = np.take(self.tab, p_m, axis=0)
            used = e[:, 1] != self._EMPTY
            hit = used & (e[:, 0] == q[more])
            res[more[hit]] = e[hit, 1].view(np.int64)
            more = more[used & ~hit]
        return res


def _hash_table(keys: np.ndarray) -> Any:
    """The hash table over ``keys``, built once per keys array (kept while the array lives)."""
    return _tables.get(keys, _OpenTable)


def hash_index(keys: np.ndarray, queries: np.ndarray) -> np.ndarray:
    """Position of each query in ``keys`` (sorted, unique uint64 hashes), or -1 where absent.

    The cpu backend probes a hash table (built once per ``keys`` array and cached while it lives);
    the gpu twin binary-searches the sorted keys.  Both give the same positions.

    Examples
    --------
    >>> import numpy as np
    >>> hash_index(np.array([3, 9, 12], dtype=np.uint64), np.array([12, 4, 3], dtype=np.uint64)).tolist()
    [2, -1, 0]
    """
    check_hash_index(keys, queries)
    if keys.shape[0] == 0 or queries.shape[0] == 0:
        return np.full(queries.shape[0], -1, dtype=np.int64)
    return _hash_table(keys).find(queries)
