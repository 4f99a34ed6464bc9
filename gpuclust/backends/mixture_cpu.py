"""NumPy ops for merging per-window CPU distributions exactly (the oracle of ``mixture_gpu.py``).

A usage window's CPU percentiles ``q_0 <= ... <= q_19`` at the sorted levels ``l_k``
(:data:`gpuclust.schema.CPU_PERCENTILE_LEVELS_SORTED`) define a piecewise-linear CDF through the
points ``(q_k, l_k)``; a flat step ``q_k == q_{k+1}`` is a point mass ``l_{k+1} - l_k`` at
``q_k``.  A group's distribution is the mixture ``F(x) = sum_i w_i F_i(x)`` (``W = sum_i w_i``).
See ``docs/analyses/mixture.md`` for the algorithm and its numerical envelope.

Three ops, same names and signatures as in ``backends/mixture_gpu.py``:

* :func:`repair_percentiles` -- running-max repair of non-monotone vectors, NULL detection;
* :func:`window_means` -- the mean of each window's piecewise-linear distribution;
* :func:`mixture_quantiles` -- exact quantiles of every group's mixture, O(N log N), vectorised
  over groups (padded per-group rows, sorted and scanned along ``axis=1``); its independent chunks
  of groups run on a thread pool (:data:`THREADS`) when the call is large.
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from gpuclust._parallel import usable_cores
from gpuclust.backends import ENGINE_THREAD_PREFIX
from gpuclust.backends.cpu import check_1d
from gpuclust.keys import pack_bits
from gpuclust.schema import CPU_PERCENTILE_LEVELS_SORTED

__all__ = [
    "NARROW_REL",
    "SNAP_REL",
    "SOURCE_LEVELS",
    "check_levels_values",
    "check_mixture_quantiles",
    "check_percentile_matrix",
    "mixture_quantiles",
    "order_key",
    "packed_event_keys",
    "repair_percentiles",
    "source_levels",
    "window_means",
]

#: The 20 percentile levels of a usage window, ascending (the columns of ``q``).
SOURCE_LEVELS: np.ndarray = np.asarray(CPU_PERCENTILE_LEVELS_SORTED, dtype=np.float64)
SOURCE_LEVELS.setflags(write=False)
#: A segment narrower than ``NARROW_REL * max(|q_k|, |q_{k+1}|)`` is treated as a point mass at
#: ``q_k`` (moves any quantile by less than 1e-12 relative; keeps densities below ~1e12/|x| so
#: the compensated slope scan stays accurate).  Identical in the CUDA kernels.
NARROW_REL = 2.0**-40
#: Quantile search tolerance, relative to the group total: the returned ``x`` is the first event
#: where ``F >= p*W - SNAP_REL*W`` (or the linear inversion of ``F = p*W`` just before it), so a
#: target that equals ``F`` at a breakpoint up to rounding lands on that breakpoint.
SNAP_REL = 2.0**-44

_FLOATS = (np.dtype(np.float32), np.dtype(np.float64))
_F64 = (np.dtype(np.float64),)
_CODES = (np.dtype(np.int32), np.dtype(np.int64))
#: Elements per padded chunk (rows x width) processed at once (bounds memory, keeps it in cache).
_CHUNK = 1 << 16
#: Rows per block of the row-wise ops (a (block, 20) float64 slab is 640 kB).
_ROW_BLOCK = 1 << 12
#: Events per block of :func:`_event_table` and of the scans' compensation (temporaries stay in cache).
_PAYLOAD_BLOCK = 1 << 14
#: An unpadded row (one group wider than a chunk) with at least this many events is sorted by
#: :func:`_radix_argsort` (on float32-valued data 10-20x faster than ``argsort``) instead of ``argsort``.
_RADIX_MIN_EVENTS = 1 << 16
#: Threads of :func:`mixture_quantiles` over its independent chunks of groups (``None``: the usable
#: CPU cores); calls with fewer than :data:`_PARALLEL_MIN_EVENTS` events stay on one thread.
THREADS: int | None = None
_PARALLEL_MIN_EVENTS = 1 << 18
#: NumPy releases the GIL in an ``accumulate`` along one axis only when the other axes hold more
#: than 500 elements (``NPY_BEGIN_THREADS_THRESHOLDED`` over the iterator's outer size), so a scan
#: of a few long rows would hold it throughout; :func:`_scan_rows` scans up to this many rows one
#: at a time (1-D scans of more than 500 elements release it).
_ROW_SCAN_MAX_ROWS = 500


# --------------------------------------------------------------------------------------------
# argument checks (shared with the GPU wrappers: they only read .ndim/.shape/.dtype/.flags)
# --------------------------------------------------------------------------------------------
def source_levels(q_levels: Any = None) -> np.ndarray:
    """The levels of ``q``'s columns as a host float64 array (default :data:`SOURCE_LEVELS`).

    ``q_levels`` must be strictly increasing, start at 0 and end at 1.
    """
    if q_levels is None:
        return SOURCE_LEVELS
    get = getattr(q_levels, "get", None)
    lv = np.asarray(get() if callable(get) else q_levels, dtype=np.float64).reshape(-1)
    if lv.shape[0] < 2 or lv[0] != 0.0 or lv[-1] != 1.0 or not np.all(np.diff(lv) > 0):
        raise ValueError("q_levels must be strictly increasing from 0 to 1 (at least 2 levels)")
    return lv


def check_percentile_matrix(name: str, q: Any, dtypes: tuple[np.dtype, ...], n_cols: int) -> int:
    """Validate a C-contiguous ``(n, n_cols)`` matrix; returns ``n``."""
    if getattr(q, "ndim", None) != 2 or q.shape[1] != n_cols:
        raise ValueError(f"{name} must have shape (n, {n_cols}), got {getattr(q, 'shape', type(q).__name__)}")
    if q.dtype not in dtypes:
        raise TypeError(f"{name} must have dtype {' or '.join(map(str, dtypes))}, got {q.dtype}")
    if not q.flags.c_contiguous:
        raise ValueError(f"{name} must be C-contiguous")
    return int(q.shape[0])


def check_mixture_quantiles(q: Any, w: Any, group: Any, n_groups: int, levels: Any, q_levels: Any) -> np.ndarray:
    """Validate :func:`mixture_quantiles` arguments (both backends); returns the source levels."""
    src = source_levels(q_levels)
    n = check_percentile_matrix("q", q, _F64, src.shape[0])
    check_1d("w", w, _F64, n)
    check_1d("group", group, _CODES, n)
    check_1d("levels", levels, _F64, None)
    if int(n_groups) != n_groups or n_groups < 0:
        raise ValueError(f"n_groups must be a non-negative integer, got {n_groups}")
    return src


def check_levels_values(levels: np.ndarray) -> None:
    if levels.size and not (np.all(levels >= 0.0) and np.all(levels <= 1.0)):
        raise ValueError("levels must lie in [0, 1] (and not be NaN)")


# --------------------------------------------------------------------------------------------
# ops
# --------------------------------------------------------------------------------------------
def repair_percentiles(q: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Repair non-monotone percentile vectors by a running maximum; flag NULL rows.

    Parameters
    ----------
    q
        float32 or float64 array of shape ``(n, 20)``, columns in sorted-level order
        (:data:`gpuclust.schema.CPU_PERCENTILE_COLUMNS_SORTED`), C-contiguous.  NULL is NaN.

    Returns
    -------
    q_repaired : numpy.ndarray
        float64 ``(n, 20)``: ``q_repaired[:, k] = max(q[:, :k+1])``; rows with any NaN or
        infinite value are all NaN.
    repaired_mask : numpy.ndarray
        bool ``(n,)``: the row was not monotone (and not NULL).
    null_mask : numpy.ndarray
        bool ``(n,)``: the row has a NaN (NULL) or infinite percentile.

    Examples
    --------
    >>> import numpy as np
    >>> q = np.tile(np.linspace(0.0, 1.0, 20), (3, 1))
    >>> q[1, 5] = 0.0
    >>> q[2, 3] = np.nan
    >>> r, rep, null = repair_percentiles(q)
    >>> rep.tolist(), null.tolist(), bool(r[1, 5] == r[1, 4])
    ([False, True, False], [False, False, True], True)
    """
    check_percentile_matrix("q", q, _FLOATS, SOURCE_LEVELS.shape[0])
    n, nl = q.shape
    rep = np.empty((n, nl), dtype=np.float64)
    null = np.empty(n, dtype=bool)
    changed = np.empty(n, dtype=bool)
    # row blocks that stay in cache, column by column (a running max along the short axis=1 of the
    # whole matrix is an inner loop of 20 per row); the same values as np.maximum.accumulate
    step = _ROW_BLOCK
    for r0 in range(0, n, step):
        r1 = min(n, r0 + step)
        qb = q[r0:r1]
        rb = rep[r0:r1]
        nb = null[r0:r1]
        cb = changed[r0:r1]
        rb[:, 0] = qb[:, 0]
        fin = np.isfinite(rb[:, 0])
        cb[:] = False
        for k in range(1, nl):
            np.maximum(rb[:, k - 1], qb[:, k], out=rb[:, k])
            fin &= np.isfinite(qb[:, k])
            cb |= rb[:, k] != qb[:, k]
        np.logical_not(fin, out=nb)
        rb[nb] = np.nan
    repaired: np.ndarray = changed & ~null
    return rep, repaired, null


def window_means(q: np.ndarray) -> np.ndarray:
    """Mean of each window's piecewise-linear distribution (trapezoid per segment).

    ``mean_i = sum_k (l_{k+1} - l_k) * (q_k + q_{k+1}) / 2``; a flat segment is a point mass at
    its value, which the same formula gives.  NaN rows give NaN.

    Parameters
    ----------
    q
        float32 or float64 ``(n, 20)`` in sorted-level order, C-contiguous, monotone (repaired).

    Returns
    -------
    numpy.ndarray
        float64 ``(n,)``.

    Examples
    --------
    >>> import numpy as np
    >>> q = np.asarray(SOURCE_LEVELS).reshape(1, -1)   # uniform on [0, 1]
    >>> window_means(np.vstack([q, 2 * q + 1])).round(12).tolist()
    [0.5, 2.0]
    """
    check_percentile_matrix("q", q, _FLOATS, SOURCE_LEVELS.shape[0])
    half_dl = np.diff(SOURCE_LEVELS) * 0.5
    acc = np.zeros(q.shape[0], dtype=np.float64)
    for r0 in range(0, q.shape[0], _ROW_BLOCK):  # row blocks that stay in cache
        qd = q[r0 : r0 + _ROW_BLOCK].astype(np.float64, copy=False)
        ab = acc[r0 : r0 + _ROW_BLOCK]
        for k in range(half_dl.shape[0]):  # sequential over the 19 segments, as the kernel does
            ab += half_dl[k] * (qd[:, k] + qd[:, k + 1])
    return acc


def _two_sum_err(a: np.ndarray, b: np.ndarray, s: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """Exact rounding error of ``s = fl(a + b)`` (Knuth's TwoSum): ``(a - (s - bb)) + (b - bb)``
    with ``bb = s - a``, with two temporaries (written to ``out`` when given)."""
    bb = np.subtract(s, a)
    t = np.subtract(s, bb, out=out)
    np.subtract(a, t, out=t)
    np.subtract(b, bb, out=bb)
    return np.add(t, bb, out=t)


def _dd_cumsum_rows(hi: np.ndarray, lo: np.ndarray | None) -> np.ndarray:
    """Compensated inclusive prefix sums of ``hi + lo`` along ``axis=1`` (error ~eps^2 * max|prefix|).

    ``np.cumsum`` (``add.accumulate``) is sequential, so ``s_j == fl(s_{j-1} + hi_j)`` and the
    TwoSum error of every step can be recomputed exactly afterwards, then summed in a second pass.
    """
    s = _scan_rows(np.add, hi)
    err = np.empty_like(s)
    err[:, 0] = 0.0
    W = s.shape[1]
    step = max(1, _PAYLOAD_BLOCK // max(1, s.shape[0]))  # column blocks: temporaries stay in cache
    for c0 in range(1, W, step):
        c1 = min(W, c0 + step)
        _two_sum_err(s[:, c0 - 1 : c1 - 1], hi[:, c0:c1], s[:, c0:c1], out=err[:, c0:c1])
    if lo is not None:
        err += lo
    s += _scan_rows(np.add, err, out=err)
    return s


def _scan_rows(ufunc: np.ufunc, a: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """``ufunc.accumulate(a, axis=1, out=out)`` of a 2-D ``a``, with the same additions in the same
    order (a scan is sequential), but row by row when there are at most
    :data:`_ROW_SCAN_MAX_ROWS` rows, so that each long row's scan runs without the GIL and the
    engine's other partition threads run meanwhile.

    >>> a = np.arange(6.0).reshape(2, 3)
    >>> _scan_rows(np.add, a).tolist(), _scan_rows(np.maximum, a[:, ::-1]).tolist()
    ([[0.0, 1.0, 3.0], [3.0, 7.0, 12.0]], [[2.0, 2.0, 2.0], [5.0, 5.0, 5.0]])
    """
    if a.shape[0] > _ROW_SCAN_MAX_ROWS:
        return ufunc.accumulate(a, axis=1, out=out)
    if out is None:
        out = np.empty(a.shape, dtype=np.result_type(a))
    # (a scan in place keeps the GIL too: such a row is scanned into a scratch row, then copied)
    row = np.empty(a.shape[1], dtype=out.dtype) if np.may_share_memory(a, out) else None
    for r in range(a.shape[0]):
        if row is None:
            ufunc.accumulate(a[r], out=out[r])
        else:
            ufunc.accumulate(a[r], out=row)
            out[r] = row
    return out


def _event_table(q: np.ndarray, v: np.ndarray, src: np.ndarray) -> np.ndarray:
    """Per (window, breakpoint) event, flattened in (window, k) order with one trailing slot
    (``x = inf``, zero payload): a record ``(x, hi, lo, jump)`` -- the position ``q_k``, the slope
    change as a TwoSum pair (hi, lo) and the jump (point mass) at ``q_k`` -- so that the sorted
    order gathers each event with one ``take``.

    Computed on the flat (window, k) order, in blocks of windows that stay in cache: slot ``(i, k)``
    holds segment ``k`` of window ``i``, from ``q_k`` to the next value; the last slot of a window
    has no segment (mass 0, so density and jump 0), which makes the differences across windows and
    blocks exact."""
    n, nl = q.shape
    N = n * nl
    table = np.empty((N + 1, 4))
    table[-1] = (np.inf, 0.0, 0.0, 0.0)
    table[:-1, 0] = q.reshape(-1)
    hi, lo, jump = table[:, 1], table[:, 2], table[:, 3]
    dlp = np.append(np.diff(src), 0.0)[None, :]
    step = max(1, _PAYLOAD_BLOCK // nl)
    for w0 in range(0, n, step):
        w1 = min(n, w0 + step)
        e0, e1 = w0 * nl, w1 * nl
        x = q[w0:w1].reshape(-1)
        m = (v[w0:w1, None] * dlp).reshape(-1)  # segment masses (normalised weights)
        dq = np.empty(e1 - e0)
        dq[-1] = 0.0
        np.subtract(x[1:], x[:-1], out=dq[:-1])
        scale = np.empty(e1 - e0)
        scale[-1] = 0.0
        np.maximum(np.abs(x[:-1]), np.abs(x[1:]), out=scale[:-1])
        scale *= NARROW_REL
        narrow = dq <= scale
        np.copyto(dq, 1.0, where=narrow)
        d = np.divide(m, dq, out=dq)  # density; 0 for a narrow segment (a point mass)
        np.copyto(d, 0.0, where=narrow)
        # hi = d_k - d_{k-1} (d_{-1} = d_{nl-1} = 0): a window's end breakpoints subtract a zero,
        # exactly (TwoSum error 0)
        hb = hi[e0:e1]
        hb[0] = d[0]
        np.subtract(d[1:], d[:-1], out=hb[1:])
        lb = lo[e0:e1]
        lb[0] = 0.0
        _two_sum_err(d[1:], -d[:-1], hb[1:], out=lb[1:])
        np.copyto(jump[e0:e1], np.where(narrow, m, 0.0))
    return table


def _width_class(e: np.ndarray) -> np.ndarray:
    """Padded row width for ``e`` events: rounded up on a 2^(1/4) geometric grid (<= 19% padding)."""
    e = np.maximum(e, 1)
    k = np.ceil(4.0 * np.log2(e.astype(np.float64)) - 1e-9)
    return np.maximum(np.ceil(2.0 ** (k / 4.0)).astype(np.int64), e)


def mixture_quantiles(
    q: np.ndarray,
    w: np.ndarray,
    group: np.ndarray,
    n_groups: int,
    levels: np.ndarray,
    *,
    q_levels: Any = None,
) -> np.ndarray:
    """Exact quantiles of each group's mixture of piecewise-linear window CDFs.

    ``quantile(p) = inf{x : F(x) >= p * W}`` with ``F(x) = sum_i w_i F_i(x)`` over the group's
    windows; ``p = 0`` gives the minimum and ``p = 1`` the maximum of the support.

    Parameters
    ----------
    q
        float64 ``(n, 20)`` percentile vectors in sorted-level order, monotone (see
        :func:`repair_percentiles`), C-contiguous.  With ``q_levels`` the columns are at those
        levels instead (used by the bounded summary, ``K + 1`` equally spaced levels).
    w
        float64 ``(n,)`` weights (sample counts).  Rows with ``w <= 0``, NaN ``w`` or a non-finite
        percentile contribute nothing.
    group
        int64 (or int32) ``(n,)`` group codes; codes outside ``[0, n_groups)`` are ignored.
    n_groups
        Number of groups ``G``.
    levels
        float64 ``(L,)`` probability levels in ``[0, 1]``.
    q_levels
        Optional levels of ``q``'s columns (strictly increasing from 0 to 1).

    Returns
    -------
    numpy.ndarray
        float64 ``(G, L)``; rows of groups with no positive weight are NaN.

    Raises
    ------
    ValueError
        Bad shapes, levels outside ``[0, 1]``, or a row of ``q`` that is not non-decreasing.
    TypeError
        Wrong dtypes.

    Notes
    -----
    Each window's breakpoint ``k`` is an event carrying the change of the density
    (``+d_k - d_{k-1}``, ``d_k = w (l_{k+1} - l_k) / (q_{k+1} - q_k)``) and a jump (point masses
    of flat segments).  Events are sorted by ``x`` within each group (groups padded to rows of
    similar width and sorted along ``axis=1``), then the slope and ``F`` at every event are
    prefix sums with TwoSum compensation, and each (group, level) is a binary search over ``F``
    followed by one linear inversion.  Weights are normalised per group first.

    Examples
    --------
    >>> import numpy as np
    >>> lv = np.asarray(SOURCE_LEVELS)
    >>> q = np.stack([lv, lv + 1.0])        # uniform on [0, 1] and on [1, 2]
    >>> out = mixture_quantiles(q, np.array([1.0, 1.0]), np.array([0, 0]), 1, np.array([0.25, 0.5, 1.0]))
    >>> out.round(12).tolist()
    [[0.5, 1.0, 2.0]]
    """
    src = check_mixture_quantiles(q, w, group, n_groups, levels, q_levels)
    check_levels_values(levels)
    G, L = int(n_groups), int(levels.shape[0])
    out = np.full((G, L), np.nan)
    if G == 0 or L == 0 or q.shape[0] == 0:
        return out
    valid = (group >= 0) & (group < G) & np.isfinite(w) & (w > 0) & _rows_finite(q)
    idx = np.flatnonzero(valid)
    if idx.shape[0] == 0:
        return out
    gv = group[idx].astype(np.int64)
    wsum = np.bincount(gv, weights=w[idx], minlength=G)
    v = np.zeros(q.shape[0])
    v[idx] = w[idx] / wsum[gv]  # weights normalised per group
    nl = src.shape[0]

    order = idx[np.argsort(gv, kind="stable")]  # valid windows, grouped
    counts = np.bincount(gv, minlength=G)
    gstart = np.concatenate(([0], np.cumsum(counts)[:-1]))
    present = np.flatnonzero(counts)
    widths = _width_class(counts[present] * nl)
    big = widths > _CHUNK  # one group per chunk anyway: an unpadded row of exactly its events
    # the chunks, independent of each other (each writes its own rows of ``out``)
    chunks = [(present[big][i : i + 1], int(widths[big][i])) for i in range(int(big.sum()))]
    widths = widths[~big]
    present = present[~big]
    for width in np.unique(widths):
        gs = present[widths == width]
        rows_per_chunk = max(1, _CHUNK // int(width))
        chunks += [(gs[c0 : c0 + rows_per_chunk], int(width)) for c0 in range(0, gs.shape[0], rows_per_chunk)]

    def run(chunk: tuple[np.ndarray, int]) -> None:
        g_chunk, width = chunk
        if g_chunk.shape[0] == 1 and width > _CHUNK:
            width = int(counts[g_chunk[0]]) * nl  # an unpadded row
        out[g_chunk] = _chunk_quantiles(q, v, src, order, gstart[g_chunk], counts[g_chunk], width, levels)

    threads = _threads() if idx.shape[0] * nl >= _PARALLEL_MIN_EVENTS else 1
    if threads <= 1 or len(chunks) <= 1:
        for c in chunks:
            run(c)
    else:  # NumPy releases the GIL in the heavy steps (sorts, gathers, prefix sums: _scan_rows)
        with ThreadPoolExecutor(max_workers=min(threads, len(chunks))) as pool:
            list(pool.map(run, chunks))
    return out


def _threads() -> int:
    """Threads for :func:`mixture_quantiles` (:data:`THREADS`, else the usable CPU cores; 1 inside
    the local engine's partition threads, which already keep the cores busy)."""
    if THREADS is not None:
        return max(1, int(THREADS))
    if threading.current_thread().name.startswith(ENGINE_THREAD_PREFIX):
        return 1
    return usable_cores()


def order_key(xp: Any, bits: Any) -> Any:
    """The order-preserving unsigned image of IEEE float bits (a ``uint32`` view of float32 values
    or a ``uint64`` view of float64 ones): every bit of a negative value flipped, only the sign
    bit of the others set, so unsigned order is the floats' order (``-0.0`` just before ``0.0``).

    >>> x = np.array([2.0, -1.0, 0.0, -0.0, -3.5, 1.0], np.float32)
    >>> np.argsort(order_key(np, x.view(np.uint32)), kind="stable").tolist()
    [4, 1, 3, 2, 5, 0]
    """
    t = bits.dtype.type
    width = bits.dtype.itemsize * 8
    return bits ^ (xp.negative(bits >> t(width - 1)) | t(1 << (width - 1)))


def packed_event_keys(xp: Any, x: Any, group: Any, n_groups: int) -> Any:
    """One ``uint64`` sort key per event, ordering events by ``(group, x)``: the group in the high
    32 bits, :func:`order_key` of the float32 value in the low 32.  A stable ``argsort`` of these
    keys (a radix sort on the GPU) is the order of ``lexsort((x, group))`` of two float64 keys,
    except that ``-0.0`` sorts before an equal ``0.0`` (either is a sorted order).  ``None`` when
    that is not exact: a value that is not a float32 (trace percentiles are), or more than 2^32
    groups.  ``x`` float64 without NaN, ``group`` integers in ``[0, n_groups)``.

    >>> x, g = np.array([0.5, -1.0, 0.25, 3.0]), np.array([1, 1, 0, 0])
    >>> np.argsort(packed_event_keys(np, x, g, 2), kind="stable").tolist(), np.lexsort((x, g)).tolist()
    ([2, 3, 1, 0], [2, 3, 1, 0])
    >>> packed_event_keys(np, np.array([0.1]), np.array([0]), 1) is None  # 0.1 is not a float32
    True
    """
    if n_groups > 1 << 32:
        return None
    with np.errstate(over="ignore"):  # beyond float32's range: inf, which is not x
        x32 = x.astype(xp.float32)
    if not bool(xp.all(x32.astype(xp.float64) == x)):
        return None
    return pack_bits(group.astype(xp.uint64), order_key(xp, x32.view(xp.uint32)).astype(xp.uint64), 32)


def _radix_argsort(x: np.ndarray) -> np.ndarray:
    """Stable ``argsort`` of a 1-D float64 array without NaN, by its order-preserving integer
    keys.  When every value is a float32 (trace percentiles are): one sort of ``key << 32 |
    index`` as uint64 (the index makes the keys unique, so their order is the stable one; NumPy
    sorts uint64 with SIMD, 3-5x faster than two radix passes on 2·10^7 keys); else an LSD radix
    sort, 16 bits per pass (NumPy's stable sort of uint16 is a radix sort), 4 passes.  ``-0.0``
    sorts before ``0.0`` (equal values: either order is a valid sort)."""
    with np.errstate(over="ignore"):  # values beyond the float32 range: not float32 (inf != x)
        x32 = x.astype(np.float32)
    if np.array_equal(x32, x) and x.shape[0] < 1 << 32:
        packed = order_key(np, x32.view(np.uint32)).astype(np.uint64)
        del x32
        packed <<= np.uint64(32)
        packed |= np.arange(x.shape[0], dtype=np.uint64)
        packed.sort()
        packed &= np.uint64(0xFFFFFFFF)  # the indices, in place: < 2**32, the same bits as int64
        return packed.view(np.int64)
    key = order_key(np, x.view(np.uint64))
    passes = key.itemsize // 2
    digits = key.view(np.uint16).reshape(-1, passes)  # the 16-bit digits of each key, in memory order
    cols = list(range(passes)) if np.little_endian else list(range(passes - 1, -1, -1))  # least significant first
    order = np.argsort(digits[:, cols[0]], kind="stable")
    for c in cols[1:]:
        order = order[np.argsort(digits[order, c], kind="stable")]
    return order


def _rows_finite(q: np.ndarray) -> np.ndarray:
    """``np.isfinite(q).all(axis=1)`` in row blocks (no full-size temporary)."""
    out = np.empty(q.shape[0], dtype=bool)
    step = max(1, _CHUNK // max(1, q.shape[1]))
    for r0 in range(0, q.shape[0], step):
        out[r0 : r0 + step] = np.isfinite(q[r0 : r0 + step]).all(axis=1)
    return out


def _chunk_quantiles(
    q: np.ndarray,
    v: np.ndarray,
    src: np.ndarray,
    order: np.ndarray,
    gstart: np.ndarray,
    counts: np.ndarray,
    width: int,
    levels: np.ndarray,
) -> np.ndarray:
    """Quantiles for ``R`` groups laid out as padded rows of ``width`` events (events sorted per row)."""
    R, nl = counts.shape[0], src.shape[0]
    n_events = counts * nl
    # the chunk's windows, grouped by row; their events are contiguous in a flat (window, k) order
    row_of_win = np.repeat(np.arange(R), counts)
    first_win = np.cumsum(counts) - counts
    local = np.arange(row_of_win.shape[0]) - first_win[row_of_win]
    win = order[np.repeat(gstart, counts) + local]
    if win[-1] - win[0] + 1 == win.shape[0] and bool(np.all(win[1:] > win[:-1])):
        qc = q[win[0] : win[-1] + 1]  # consecutive rows (grouped input): a view, no copy
    else:
        qc = np.take(q, win, axis=0)  # row gather (faster than q[win])
    if np.any(qc[:, 1:] < qc[:, :-1]):
        raise ValueError("q rows must be non-decreasing; repair them with repair_percentiles first")
    table = _event_table(qc, v[win], src)  # (x, hi, lo, jump) per event, one zero slot at the end

    total = row_of_win.shape[0] * nl  # index of the zero slot
    if R == 1 and width == total:
        # one unpadded row: the flat (window, k) event order is the row itself
        if total >= _RADIX_MIN_EVENTS:
            fidx = _radix_argsort(qc.reshape(-1)).reshape(1, -1)
        else:
            fidx = np.argsort(qc.reshape(1, -1), axis=1)
        real = None
    else:
        X = np.full((R, width), np.inf)
        X.reshape(-1)[(row_of_win * width + local * nl)[:, None] + np.arange(nl)[None, :]] = qc
        perm = np.argsort(X, axis=1)
        real = np.arange(width)[None, :] < n_events[:, None]
        fidx = np.where(real, perm + (first_win * nl)[:, None], total)
    ev = np.take(table, fidx, axis=0)  # one gather of the events' records, in sorted order
    del table, fidx, qc  # freed before the prefix sums (2.5e6 events: peak 179 MiB, was 255)
    Xs = ev[..., 0]

    S = _dd_cumsum_rows(ev[..., 1], ev[..., 2])
    np.maximum(S, 0.0, out=S)
    inc = ev[..., 3]
    with np.errstate(invalid="ignore"):
        dx = Xs[:, 1:] - Xs[:, :-1]
    if real is not None:
        dx[~real[:, 1:]] = 0.0
    dx *= S[:, :-1]
    inc[:, 1:] += dx
    F = _dd_cumsum_rows(inc, None)
    _scan_rows(np.maximum, F, out=F)

    rows = np.arange(R)[:, None]
    last = (n_events - 1)[:, None]
    T = F[rows, last]  # (R, 1)
    t = levels[None, :] * T
    thr = t - SNAP_REL * T
    lo_i = np.zeros((R, levels.shape[0]), dtype=np.int64)
    hi_i = np.broadcast_to(last, lo_i.shape).copy()
    while True:
        open_ = lo_i < hi_i
        if not open_.any():
            break
        mid = (lo_i + hi_i) >> 1
        ok = F[rows, mid] >= thr
        hi_i = np.where(open_ & ok, mid, hi_i)
        lo_i = np.where(open_ & ~ok, mid + 1, lo_i)
    j = lo_i
    jm = np.maximum(j - 1, 0)
    xa, xb = Xs[rows, jm], Xs[rows, j]
    Fa, Sa = F[rows, jm], S[rows, jm]
    with np.errstate(divide="ignore", invalid="ignore"):
        x = np.where(Sa > 0, xa + (t - Fa) / np.where(Sa > 0, Sa, 1.0), xb)
    x = np.minimum(np.maximum(x, xa), xb)
    x = np.where(j == 0, xb, x)
    x = np.where(levels[None, :] >= 1.0, Xs[rows, last], x)
    return x
