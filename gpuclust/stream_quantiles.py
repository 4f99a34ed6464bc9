"""Exact quantiles over a stream of float64 batches, in memory bounded independently of the count.

Radix select on the order-preserving ``uint64`` image of the float64 bits: the first pass counts
the values and histograms the top ``bins_bits`` bits; each later pass refines the bins holding the
needed order statistics on the next ``bins_bits`` bits, or collects a bin's values once it holds at
most ``max_candidates`` of them.  The two order statistics of NumPy's default ("linear") method are
then combined with NumPy's own arithmetic, so the result is ``np.quantile`` of the concatenation.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

import numpy as np

from gpuclust.keys import pack_bits

__all__ = [
    "backend_quantiles",
    "backend_quantiles_many",
    "device_quantiles_many",
    "ranked_quantiles",
    "sorted_quantiles",
    "stream_quantiles",
    "stream_quantiles_many",
]

_SIGN = np.uint64(1 << 63)


def _keys(x: np.ndarray) -> np.ndarray:
    """Order-preserving ``uint64`` image of float64 values (IEEE total order: -0.0 < 0.0)."""
    u = x.view(np.uint64)
    return np.where(u & _SIGN, ~u, u | _SIGN)


def _floats(k: np.ndarray) -> np.ndarray:
    """Inverse of :func:`_keys`."""
    return np.where(k & _SIGN, k ^ _SIGN, ~k).view(np.float64)


def _groups(batches: Callable[[], Iterable[Sequence[np.ndarray]]], k: int) -> Iterable[list[np.ndarray]]:
    """One pass: each batch's ``k`` arrays as contiguous 1-D float64 arrays."""
    for group in batches():
        if len(group) != k:
            raise ValueError(f"stream_quantiles_many: a batch has {len(group)} arrays, not {k}")
        yield [np.ascontiguousarray(b, dtype=np.float64).ravel() for b in group]


def _split(groups: dict, prefix: int, hist: np.ndarray, members: list, step: int) -> None:
    """Send each ``(rank, rank in bin)`` of bin ``prefix`` to its sub-bin, given the sub-bins' histogram."""
    cum = np.cumsum(hist)
    for rank, local in members:
        j = int(np.searchsorted(cum, local, side="right"))
        sub = groups.setdefault(pack_bits(prefix, j, step), (int(hist[j]), []))
        sub[1].append((rank, local - (int(cum[j - 1]) if j else 0)))


class _Select:
    """The radix selection of one stream's order statistics, fed a batch at a time, pass by pass
    (what :func:`stream_quantiles_many` runs for each of its streams over shared passes)."""

    def __init__(self, q: np.ndarray, bins_bits: int, max_candidates: int):
        self.q, self.bits, self.budget = q, bins_bits, max_candidates
        self.n, self.hist = 0, np.zeros(1 << bins_bits, np.int64)
        self.held: list[np.ndarray] | None = []
        self.found: dict[int, int] = {}  # rank -> key
        self.groups: dict[int, tuple[int, list]] = {}  # bin prefix -> (count, [(rank, rank in bin)])
        self.depth = bins_bits
        self.result: np.ndarray | None = None

    # ---- pass 1: count, histogram of the top bits, keep all while few
    def first(self, b: np.ndarray, keep: bool) -> None:
        if np.isnan(b).any():
            raise ValueError("stream_quantiles: NaN in the input")
        self.n += b.size
        if self.held is not None and keep:
            self.held.append(b.copy())
        else:
            self.held = None
        self.hist += np.bincount((_keys(b) >> np.uint64(64 - self.bits)).astype(np.intp), minlength=self.hist.size)

    def end_first(self, keep: bool) -> None:
        """After pass 1: select in memory (``keep``: the values were held) or plan pass 2."""
        if self.n == 0:
            self.result = np.full(self.q.shape[0], np.nan)
            return
        self.lo, self.hi, self.gamma = _linear_ranks(self.n, self.q)
        ranks = sorted({int(r) for r in np.concatenate([self.lo, self.hi]).tolist()})
        if keep and self.held is not None:  # np.quantile's selection (np.quantile itself would import numpy.ma)
            v = np.concatenate(self.held) if self.held else np.zeros(0)
            v = np.partition(v, ranks) if ranks else v
            self.result = np.asarray(_lerp(v[self.lo], v[self.hi], self.gamma), dtype=np.float64)
            return
        self.held = None
        _split(self.groups, 0, self.hist, [(r, r) for r in ranks], self.bits)
        self._plan()

    # ---- later passes: collect small bins, histogram the others on the next bits
    def _plan(self) -> None:
        if not self.groups:
            return self._finish()
        if self.depth == 64:  # all bits fixed: every value of the bin is the key
            self.found.update((r, p) for p, (_, mem) in self.groups.items() for r, _ in mem)
            return self._finish()
        budget = self.budget
        self.collect: dict[int, tuple[int, list, list]] = {}  # bins whose values are gathered this pass
        self.refine: dict[int, tuple[int, list, np.ndarray, set]] = {}  # bins histogrammed on the next bits
        for p, (cnt, mem) in sorted(self.groups.items(), key=lambda g: g[1][0]):
            if cnt <= budget:
                self.collect[p], budget = (cnt, mem, []), budget - cnt
            else:
                self.refine[p] = (cnt, mem, np.zeros(1 << min(self.bits, 64 - self.depth), np.int64), set())
        self.step, self.shift = min(self.bits, 64 - self.depth), 64 - self.depth

    def feed(self, b: np.ndarray) -> None:
        k = _keys(b)
        top = k >> np.uint64(self.shift)
        for p, (_, _, bufs) in self.collect.items():
            bufs.append(k[top == p])
        for p, (_, _, h, ends) in self.refine.items():
            sub = k[top == p]
            if sub.size and len(ends) < 2:  # the bin's distinct keys while there are at most 2
                ends.update({int(sub.min()), int(sub.max())})
            sub = (sub >> np.uint64(self.shift - self.step)) & np.uint64((1 << self.step) - 1)
            h += np.bincount(sub.astype(np.intp), minlength=h.size)

    def end_pass(self) -> None:
        for cnt, mem, bufs in self.collect.values():
            keys = np.concatenate(bufs)
            if keys.size != cnt:
                raise RuntimeError("stream_quantiles: batches() gave other values on a later pass")
            part = np.partition(keys, [loc for _, loc in mem])
            self.found.update((r, int(part[loc])) for r, loc in mem)
        self.groups = {}
        for p, (cnt, mem, h, ends) in self.refine.items():
            if h.sum() != cnt:
                raise RuntimeError("stream_quantiles: batches() gave other values on a later pass")
            if len(ends) == 1:  # one value fills the bin (a big tie): done without fixing its other bits
                key = ends.pop()
                self.found.update((r, key) for r, _ in mem)
            else:
                _split(self.groups, p, h, mem, self.step)
        self.depth += self.step
        self._plan()

    def _finish(self) -> None:
        a = _floats(np.array([self.found[r] for r in self.lo.tolist()], np.uint64))
        b = _floats(np.array([self.found[r] for r in self.hi.tolist()], np.uint64))
        self.result = _lerp(a, b, self.gamma)


def _check(qs: Sequence[float], bins_bits: int, max_candidates: int) -> np.ndarray:
    q = np.asarray(qs)
    if q.ndim != 1 or q.dtype.kind not in "iuf" or not np.all((q >= 0) & (q <= 1)):
        raise ValueError(f"stream_quantiles: qs must be a sequence of numbers in [0, 1], got {qs!r}")
    if not 1 <= bins_bits <= 24 or max_candidates < 1:
        raise ValueError("stream_quantiles: bins_bits must be in 1..24 and max_candidates >= 1")
    return q


def stream_quantiles(
    batches: Callable[[], Iterable[np.ndarray]],
    qs: Sequence[float],
    *,
    bins_bits: int = 16,
    max_candidates: int = 1 << 22,
) -> np.ndarray:
    """Exact quantiles of all values of a stream of batches, in bounded memory.

    Parameters
    ----------
    batches : callable
        Returns a new iterable of 1-D float64 arrays on each call, the same values each time; it is
        called once per pass.  Values are finite or +/-inf (drop NaN first).
    qs : sequence of float
        Quantiles in ``[0, 1]``.
    bins_bits : int
        Key bits fixed per pass (1..24); the histogram of a bin has ``2**bins_bits`` counts.
    max_candidates : int
        A bin holding at most this many values is collected and selected in memory; if the total
        count is at most this, the first pass keeps the values and selects the ranks as
        ``np.quantile`` does (``np.partition``).

    Returns
    -------
    numpy.ndarray
        float64, one per q, equal to ``np.quantile(np.concatenate(list(batches())), qs)`` bit for
        bit, with one exception: if the input holds both -0.0 and 0.0, a zero result may have the
        other sign than NumPy's (``np.partition`` treats the zeros as equal, so which one NumPy
        finds at a rank depends on its selection path; here ranks follow the IEEE total order,
        -0.0 before 0.0); it still compares equal.  As in NumPy, interpolating next to an infinity
        can give nan (with NumPy's RuntimeWarning).

    Notes
    -----
    Takes 1 pass if the count is at most ``max_candidates``, else at most ``ceil(64 / bins_bits) + 1``
    (typically 2 or 3 at the defaults).  Memory: ``O(len(qs) * 2**bins_bits + max_candidates)``
    values plus one batch, whatever the count.

    Examples
    --------
    >>> data = [np.array([3.0, 1.0, -np.inf]), np.array([4.0, 1.0, 5.0, 9.0])]
    >>> stream_quantiles(lambda: iter(data), [0.25, 0.5, 1.0], bins_bits=4, max_candidates=2)
    array([1., 3., 9.])
    """
    q = _check(qs, bins_bits, max_candidates)
    (sel,) = _run(lambda: ((b,) for b in batches()), 1, q, bins_bits, max_candidates)
    if sel.n == 0:
        raise ValueError("stream_quantiles: no values")
    assert sel.result is not None
    return sel.result


def stream_quantiles_many(
    batches: Callable[[], Iterable[Sequence[np.ndarray]]],
    k: int,
    qs: Sequence[float],
    *,
    bins_bits: int = 16,
    max_candidates: int = 1 << 22,
) -> np.ndarray:
    """:func:`stream_quantiles` of ``k`` streams at once, over shared passes: ``batches()`` yields
    a sequence of ``k`` arrays per batch (stream ``j``'s values in its element ``j``), so a caller
    that computes several streams from the same table reads it once per pass, not once per stream
    and pass.

    Returns float64 ``(k, len(qs))``: row ``j`` is ``stream_quantiles`` of stream ``j`` bit for bit
    (NaN where stream ``j`` has no values).  ``max_candidates`` bounds the values held for all
    streams together (the first pass keeps them all while their total count is at most this;
    later passes collect at most ``max_candidates // k`` per stream).  Passes: the most any stream
    needs.

    >>> data = [(np.array([3.0, 1.0]), np.array([])), (np.array([2.0]), np.array([-1.0, 5.0]))]
    >>> stream_quantiles_many(lambda: iter(data), 2, [0.0, 0.5, 1.0]).tolist()
    [[1.0, 2.0, 3.0], [-1.0, 2.0, 5.0]]
    """
    if k < 1:
        raise ValueError(f"stream_quantiles_many: k must be at least 1, got {k}")
    q = _check(qs, bins_bits, max_candidates)
    sels = _run(batches, k, q, bins_bits, max_candidates)
    out = np.zeros((k, q.size))
    for j, s in enumerate(sels):
        assert s.result is not None  # _run drives every selection to its result
        out[j] = s.result
    return out


def _run(
    batches: Callable[[], Iterable[Sequence[np.ndarray]]], k: int, q: np.ndarray, bins_bits: int, max_candidates: int
) -> list[_Select]:
    """The selections of ``k`` streams, driven over shared passes until every one has its result."""
    sels = [_Select(q, bins_bits, max(1, max_candidates // k)) for _ in range(k)]
    total, keep = 0, True
    for group in _groups(batches, k):  # pass 1
        total += sum(b.size for b in group)
        keep = keep and total <= max_candidates
        for s, b in zip(sels, group, strict=True):
            s.first(b, keep)
    for s in sels:
        s.end_first(keep)
    while any(s.result is None for s in sels):
        todo = [j for j, s in enumerate(sels) if s.result is None]
        for group in _groups(batches, k):
            for j in todo:
                sels[j].feed(group[j])
        for j in todo:
            sels[j].end_pass()
    return sels


def _linear_ranks(n: int, q: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """The two order statistics (ranks ``lo``, ``hi``) and the weight ``gamma`` of each quantile
    ``q`` of ``n`` values in NumPy's default ("linear") method (its ``_get_indexes`` and
    ``_get_gamma``); ``gamma`` None for integer ``q``."""
    vi = (n - 1) * q  # numpy's `linear` virtual index
    if vi.dtype.kind in "iu":
        lo = vi.astype(np.intp)
        return lo, lo, None
    prev = np.floor(vi)
    above = vi >= n - 1
    prev[above] = -1
    prev = prev.astype(np.intp)
    gamma = np.asarray(vi - prev, dtype=vi.dtype)
    return np.where(above, n - 1, prev), np.where(above, n - 1, prev + 1), gamma


def _lerp(a: np.ndarray, b: np.ndarray, gamma: np.ndarray | None) -> np.ndarray:
    """NumPy's ``_lerp`` of the order statistics ``a`` and ``b`` (``a`` where ``gamma`` is None)."""
    if gamma is None:
        return a
    diff = b - a
    res = np.add(a, diff * gamma)
    np.subtract(b, diff * (1 - gamma), out=res, where=gamma >= 0.5, casting="unsafe")
    return res


def backend_quantiles(be: Any, batches: Callable[[], Iterable[np.ndarray]], qs: Sequence[float]) -> np.ndarray:
    """:func:`stream_quantiles` computed where backend ``be`` computes: in bounded host memory on
    the cpu; on a device, by one sort of all the values copied there (a device holds a whole
    cell's column: 10^8 values are 0.8 GB), only the order statistics coming back.  The same
    result either way (``np.quantile``'s linear method; a zero's sign may differ, as documented
    there); finite or infinite values, no NaN.

    >>> from gpuclust.backends import get_backend
    >>> backend_quantiles(get_backend("cpu"), lambda: iter([np.array([3.0, 1.0]), np.array([4.0])]), [0.5]).tolist()
    [3.0]
    """
    if be.xp is np:
        return stream_quantiles(batches, qs)
    out = _device_quantiles(be, [be.asarray(np.ascontiguousarray(b, dtype=np.float64).ravel()) for b in batches()], qs)
    if out is None:
        raise ValueError("stream_quantiles: no values")
    return out


def backend_quantiles_many(
    be: Any, batches: Callable[[], Iterable[Sequence[np.ndarray]]], k: int, qs: Sequence[float]
) -> np.ndarray:
    """:func:`stream_quantiles_many` computed where backend ``be`` computes: that function on the
    cpu (bounded host memory, a few passes over ``batches()``); on a device one pass, each
    stream's values copied there as they come and sorted once, only the order statistics coming
    back.  The same result either way (NaN rows for streams without values).

    >>> from gpuclust.backends import get_backend
    >>> data = [(np.array([3.0, 1.0]), np.array([])), (np.array([2.0]), np.array([5.0]))]
    >>> backend_quantiles_many(get_backend("cpu"), lambda: iter(data), 2, [0.5]).tolist()
    [[2.0], [5.0]]
    """
    if be.xp is np:
        return stream_quantiles_many(batches, k, qs)
    parts: list[list[Any]] = [[] for _ in range(k)]
    for group in _groups(batches, k):
        for j, b in enumerate(group):
            if b.size:
                parts[j].append(be.asarray(b))
    return device_quantiles_many(be, parts, qs)


def device_quantiles_many(be: Any, parts: Sequence[Sequence[Any]], qs: Sequence[float]) -> np.ndarray:
    """The linear-method quantiles of each stream, ``parts[j]`` its values as device arrays of
    backend ``be``: one sort a stream there, only the order statistics coming back (NaN rows for
    streams without values)."""
    out = np.full((len(parts), len(qs)), np.nan)
    for j, p in enumerate(parts):
        r = _device_quantiles(be, [a for a in p if int(a.shape[0])], qs)
        if r is not None:
            out[j] = r
    return out


def _device_quantiles(be: Any, parts: list[Any], qs: Sequence[float]) -> np.ndarray | None:
    """The linear-method quantiles of the values in device arrays ``parts``, by one sort there
    (None without values); NaN refused, as by the host selection."""
    xp = be.xp
    v = xp.sort(xp.concatenate(parts)) if parts else xp.zeros(0)
    n = int(v.shape[0])
    if n == 0:
        return None
    if bool(xp.isnan(v[-1])):  # NaN sorts last
        raise ValueError("stream_quantiles: NaN in the input")
    lo, hi, gamma = _linear_ranks(n, np.asarray(qs, dtype=np.float64))
    return _lerp(be.to_host(v[be.asarray(lo)]), be.to_host(v[be.asarray(hi)]), gamma)


def sorted_quantiles(asc: np.ndarray, qs: Sequence[float]) -> np.ndarray:
    """``np.quantile(asc, qs)`` (the linear method) of values already sorted ascending, without a
    selection pass and without the import of ``numpy.ma`` that ``np.quantile`` brings (~20 ms of a
    process' start-up).  Finite values; float64 results.

    >>> sorted_quantiles(np.array([1.0, 2.0, 4.0, 8.0]), [0.0, 0.5, 0.9, 1.0]).tolist()
    [1.0, 3.0, 6.800000000000001, 8.0]
    """
    asc = np.asarray(asc, dtype=np.float64)
    return ranked_quantiles(lambda ranks: asc[ranks], int(asc.shape[0]), qs)


def ranked_quantiles(take: Callable[[np.ndarray], Any], n: int, qs: Sequence[float]) -> np.ndarray:
    """:func:`sorted_quantiles` of ``n`` values sorted ascending, reading only the order
    statistics it needs: ``take(ranks)`` gives the values at those ranks (on the host; a device's
    sorted values are gathered there and only these copied back).  Float64 results.

    >>> ranked_quantiles(lambda r: np.array([1.0, 2.0, 4.0, 8.0])[r], 4, [0.5, 0.9]).tolist()
    [3.0, 6.800000000000001]
    """
    if n == 0:
        raise ValueError("sorted_quantiles: no values")
    lo, hi, gamma = _linear_ranks(n, np.asarray(qs, dtype=np.float64))
    a, b = (np.asarray(take(r), dtype=np.float64) for r in (lo, hi))
    return _lerp(a, b, gamma)
