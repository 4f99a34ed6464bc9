"""Exact quantiles over a stream of float64 batches, in memory bounded independently of the count.

Radix select on the order-preserving ``uint64`` image of the float64 bits: the first pass counts
the values and histograms the top ``bins_bits`` bits; each later pass refines the bins holding the
needed order statistics on the next ``bins_bits`` bits, or collects a bin's values once it holds at
most ``max_candidates`` of them.  The two order statistics of NumPy's default ("linear") method are
then combined with NumPy's own arithmetic, so the result is ``np.quantile`` of the concatenation.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

import numpy as np

__all__ = ["sorted_quantiles", "stream_quantiles"]

_SIGN = np.uint64(1 << 63)


def _keys(x: np.ndarray) -> np.ndarray:
    """Order-preserving ``uint64`` image of float64 values (IEEE total order: -0.0 < 0.0)."""
    u = x.view(np.uint64)
    return np.where(u & _SIGN, ~u, u | _SIGN)


def _floats(k: np.ndarray) -> np.ndarray:
    """Inverse of :func:`_keys`."""
    return np.where(k & _SIGN, k ^ _SIGN, ~k).view(np.float64)


def _batches(batches: Callable[[], Iterable[np.ndarray]]) -> Iterable[np.ndarray]:
    for b in batches():
        yield np.ascontiguousarray(b, dtype=np.float64).ravel()


def _split(groups: dict, prefix: int, hist: np.ndarray, members: list, step: int) -> None:
    """Send each ``(rank, rank in bin)`` of bin ``prefix`` to its sub-bin, given the sub-bins' histogram."""
    cum = np.cumsum(hist)
    for rank, local in members:
        j = int(np.searchsorted(cum, local, side="right"))
        sub = groups.setdefault((prefix << step) | j, (int(hist[j]), []))
        sub[1].append((rank, local - (int(cum[j - 1]) if j else 0)))


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
    q = np.asarray(qs)
    if q.ndim != 1 or q.dtype.kind not in "iuf" or not np.all((q >= 0) & (q <= 1)):
        raise ValueError(f"stream_quantiles: qs must be a sequence of numbers in [0, 1], got {qs!r}")
    if not 1 <= bins_bits <= 24 or max_candidates < 1:
        raise ValueError("stream_quantiles: bins_bits must be in 1..24 and max_candidates >= 1")
    n, hist = 0, np.zeros(1 << bins_bits, np.int64)
    held: list[np.ndarray] | None = []
    for b in _batches(batches):  # pass 1: count, histogram of the top bits, keep all while few
        if np.isnan(b).any():
            raise ValueError("stream_quantiles: NaN in the input")
        n += b.size
        if held is not None and n <= max_candidates:
            held.append(b.copy())
        else:
            held = None
        hist += np.bincount((_keys(b) >> np.uint64(64 - bins_bits)).astype(np.intp), minlength=hist.size)
    if n == 0:
        raise ValueError("stream_quantiles: no values")
    lo, hi, gamma = _linear_ranks(n, q)
    ranks = sorted({int(r) for r in np.concatenate([lo, hi]).tolist()})
    if held is not None:  # np.quantile's selection (np.quantile itself would import numpy.ma, ~20-40 ms)
        v = np.concatenate(held)
        v = np.partition(v, ranks) if ranks else v
        return np.asarray(_lerp(v[lo], v[hi], gamma), dtype=np.float64)

    found: dict[int, int] = {}  # rank -> key
    groups: dict[int, tuple[int, list]] = {}  # bin prefix -> (count, [(rank, rank in bin)])
    _split(groups, 0, hist, [(r, r) for r in ranks], bins_bits)
    depth = bins_bits
    while groups:
        if depth == 64:  # all bits fixed: every value of the bin is the key
            found.update((r, p) for p, (_, mem) in groups.items() for r, _ in mem)
            break
        budget = max_candidates
        collect: dict[int, tuple[int, list, list]] = {}  # bins whose values are gathered this pass
        refine: dict[int, tuple[int, list, np.ndarray, set]] = {}  # bins histogrammed on the next bits
        for p, (cnt, mem) in sorted(groups.items(), key=lambda g: g[1][0]):
            if cnt <= budget:
                collect[p], budget = (cnt, mem, []), budget - cnt
            else:
                refine[p] = (cnt, mem, np.zeros(1 << min(bins_bits, 64 - depth), np.int64), set())
        step, shift = min(bins_bits, 64 - depth), 64 - depth
        for b in _batches(batches):
            k = _keys(b)
            top = k >> np.uint64(shift)
            for p, (_, _, bufs) in collect.items():
                bufs.append(k[top == p])
            for p, (_, _, h, ends) in refine.items():
                sub = k[top == p]
                if sub.size and len(ends) < 2:  # the bin's distinct keys while there are at most 2
                    ends.update({int(sub.min()), int(sub.max())})
                sub = (sub >> np.uint64(shift - step)) & np.uint64((1 << step) - 1)
                h += np.bincount(sub.astype(np.intp), minlength=h.size)
        for cnt, mem, bufs in collect.values():
            keys = np.concatenate(bufs)
            if keys.size != cnt:
                raise RuntimeError("stream_quantiles: batches() gave other values on a later pass")
            part = np.partition(keys, [loc for _, loc in mem])
            found.update((r, int(part[loc])) for r, loc in mem)
        groups = {}
        for p, (cnt, mem, h, ends) in refine.items():
            if h.sum() != cnt:
                raise RuntimeError("stream_quantiles: batches() gave other values on a later pass")
            if len(ends) == 1:  # one value fills the bin (a big tie): done without fixing its other bits
                key = ends.pop()
                found.update((r, key) for r, _ in mem)
            else:
                _split(groups, p, h, mem, step)
        depth += step

    a = _floats(np.array([found[r] for r in lo.tolist()], np.uint64))
    b = _floats(np.array([found[r] for r in hi.tolist()], np.uint64))
    return _lerp(a, b, gamma)


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


def sorted_quantiles(asc: np.ndarray, qs: Sequence[float]) -> np.ndarray:
    """``np.quantile(asc, qs)`` (the linear method) of values already sorted ascending, without a
    selection pass and without the import of ``numpy.ma`` that ``np.quantile`` brings (~20 ms of a
    process' start-up).  Finite values; float64 results.

    >>> sorted_quantiles(np.array([1.0, 2.0, 4.0, 8.0]), [0.0, 0.5, 0.9, 1.0]).tolist()
    [1.0, 3.0, 6.800000000000001, 8.0]
    """
    asc = np.asarray(asc, dtype=np.float64)
    n = int(asc.shape[0])
    if n == 0:
        raise ValueError("sorted_quantiles: no values")
    lo, hi, gamma = _linear_ranks(n, np.asarray(qs, dtype=np.float64))
    return _lerp(asc[lo], asc[hi], gamma)
