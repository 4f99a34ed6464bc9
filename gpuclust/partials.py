"""Partials and their merges, backend-neutral (the analysis kit's one partials module; see
../shared/DESIGN.md "The analysis kit" and gpuclust/analyses/base.py for the protocol).

* **keyed** partials: sorted unique int64 ``key`` plus value arrays; built by
  :func:`keyed_reduce` on any backend, merged by :func:`merge_keyed` where their arrays are (float
  fields summed with NULL/NaN ignored, integer fields exactly);
* **moments**: ``(n, mean, M2)`` triples merged by :func:`merge_moments` (Chan et al.), and
  per-group weighted co-moments :class:`Moments` (``(n, W, mean, C)``), whose grouped builds and
  merges are the backends' ops (``gpuclust.backends.moments_cpu`` / ``moments_gpu``);
* mixture / hybrid summaries: :mod:`gpuclust.analyses.mixture_summary` and
  :mod:`gpuclust.analyses._hybrid_summary` (their own modules: they carry the bound's proof).

Dense partials (fixed-shape arrays) merge elementwise and need nothing here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from gpuclust._xp import bincount

__all__ = ["Moments", "bin_quantile_edges", "bin_rows", "keyed_reduce", "log_bins", "merge_keyed", "merge_moments"]


def keyed_reduce(backend: Any, key: Any, sums: dict[str, Any], counts: dict[str, Any] | None = None) -> dict[str, Any]:
    """Group by ``key``: sorted unique keys, float64 sums of ``sums`` and int64 sums of ``counts``.

    ``sums`` values are float arrays (NaN ignored, as SQL's SUM ignores NULL); ``counts`` values
    are integer arrays (a weight per row).  Returns ``{"key": ..., **sums, **counts}``.
    """
    xp, ops = backend.xp, backend.ops
    n_rows = int(key.shape[0])
    if n_rows:
        kmin, kmax = int(key.min()), int(key.max())
        span = kmax - kmin + 1
        if span <= max(4 * n_rows, 1 << 16):
            # Compact key range (e.g. hour x tier): dense sums by bincount, O(n), no sort.
            # Same per-bin summation order as the sorted path below, so results are identical.
            off = xp.ascontiguousarray((key - kmin).astype(xp.int64))
            cnt = bincount(xp, off, minlength=span)
            present = xp.nonzero(cnt > 0)[0]
            out = {"key": (present + kmin).astype(xp.int64)}
            for name, v in sums.items():
                out[name] = ops.grouped_sum(off, xp.ascontiguousarray(v), n_groups=span)[present]
            for name, c in (counts or {}).items():
                dense = cnt if c is None else bincount(xp, off, weights=c.astype(xp.float64), minlength=span).round()
                out[name] = dense[present].astype(xp.int64)
            return out
    uniq, inv = xp.unique(key, return_inverse=True)
    inv = xp.ascontiguousarray(inv.reshape(-1).astype(xp.int64))
    n = int(uniq.shape[0])
    out = {"key": uniq.astype(xp.int64)}
    for name, v in sums.items():
        out[name] = ops.grouped_sum(inv, xp.ascontiguousarray(v), n_groups=n)
    for name, c in (counts or {}).items():
        out[name] = (
            bincount(xp, inv, weights=None, minlength=n).astype(xp.int64)
            if c is None
            else (bincount(xp, inv, weights=c.astype(xp.float64), minlength=n).round().astype(xp.int64))
        )
    return out


def _sorted_unique(k: np.ndarray) -> bool:
    return bool(k.shape[0] < 2 or (k[1:] > k[:-1]).all())


def merge_keyed(
    a: dict[str, np.ndarray], b: dict[str, np.ndarray], maxima: tuple[str, ...] = (), xp: Any = None
) -> dict[str, np.ndarray]:
    """Merge two keyed partials (same fields): one row per key, float fields summed (NaN ignored,
    as SQL's SUM), integer fields summed exactly, the fields named in ``maxima`` merged by maximum
    instead; keys sorted.

    Partials from :func:`keyed_reduce` (and merges of them) have sorted unique keys; two such are
    merged elementwise when their keys are the same, else in O(n + m log n) by placing every row
    once in the union of the keys (no sort; :func:`_merge_sorted`); anything else is grouped by
    concatenate + unique.  Every path gives the same sums (``a + b`` per shared key).

    The arrays' own module does the work: NumPy arrays on the host, device arrays on the device
    (:func:`_merge_device`: nothing leaves it but one scalar, the size of the union), the same
    values bit for bit on the sorted paths.  ``xp`` is that module, needed for device arrays
    (``gpuclust.backends.backend_of(key).xp``: the backends are a layer above this module);
    an empty side is dropped whatever its module, and two non-empty sides of different modules
    are refused.
    """

    if a["key"].shape[0] == 0:
        return {k: v.copy() for k, v in b.items()}
    if b["key"].shape[0] == 0:
        return {k: v.copy() for k, v in a.items()}
    host = isinstance(a["key"], np.ndarray), isinstance(b["key"], np.ndarray)
    if host[0] != host[1]:
        raise TypeError("merge_keyed: one partial on the host, the other on a device (move one first)")
    if not host[0]:
        if xp is None or xp is np:
            raise TypeError("merge_keyed of device arrays: pass their module (xp=backend_of(key).xp)")
        return _merge_device(xp, a, b, maxima)
    ka, kb = a["key"].astype(np.int64, copy=False), b["key"].astype(np.int64, copy=False)
    if _sorted_unique(ka) and _sorted_unique(kb):
        if ka.shape == kb.shape and (ka is kb or np.array_equal(ka, kb)):
            return _elementwise(np, a, b, ka, maxima)  # the same keys (e.g. dense partials over one lookup)
        return _merge_sorted(a, b, ka, kb, maxima)
    return _group_keyed({k: np.concatenate([a[k], b[k]]) for k in a}, maxima)


def _elementwise(xp: Any, a: dict[str, Any], b: dict[str, Any], key: Any, maxima: tuple[str, ...]) -> dict[str, Any]:
    """:func:`merge_keyed` of two partials with the same keys ``key``: field by field."""
    same = {"key": key.copy()}
    for k in a:
        if k != "key":
            va, vb = _summable(a[k], xp), _summable(b[k], xp)
            same[k] = (xp.maximum(va, vb) if k in maxima else va + vb).astype(va.dtype, copy=False)
    return same


def _merge_device(xp: Any, a: dict[str, Any], b: dict[str, Any], maxima: tuple[str, ...]) -> dict[str, Any]:
    """:func:`merge_keyed` of two non-empty partials of device arrays, on the device (their
    module's functions: CuPy's).  One value is read on the host: the number of shared keys, or -1
    when a side's keys are not sorted unique, which sizes the union (and tells the paths apart:
    the same keys when every key is shared); the test of the keys' order and the search for b's
    keys in a's run before it, whichever path it then takes.  The sorted paths give the host's
    values bit for bit (sums of the same two numbers); the grouped one sums floats by ``bincount``
    as the host does, the same values on NumPy (up to float rounding on a device, whose
    ``bincount`` adds in any order)."""
    ka, kb = a["key"].astype(xp.int64, copy=False), b["key"].astype(xp.int64, copy=False)
    na, nb = int(ka.shape[0]), int(kb.shape[0])
    pos = xp.searchsorted(ka, kb)  # where b's keys go in a's (left: a shared key's own row)
    hit = (pos < na) & (ka[xp.minimum(pos, na - 1)] == kb)
    ordered = xp.all(ka[1:] > ka[:-1]) & xp.all(kb[1:] > kb[:-1])
    n_hit = int(xp.where(ordered, hit.sum(), -1))  # the merge's one sync
    if n_hit < 0:
        return _group_device(xp, {k: xp.concatenate([a[k], b[k]]) for k in a}, maxima)
    if n_hit == na == nb:
        return _elementwise(xp, a, b, ka, maxima)
    return _merge_sorted_device(xp, a, b, ka, kb, pos, hit, na + nb - n_hit, maxima)


def _merge_sorted_device(
    xp: Any,
    a: dict[str, Any],
    b: dict[str, Any],
    ka: Any,
    kb: Any,
    pos: Any,
    hit: Any,
    n_out: int,
    maxima: tuple[str, ...],
) -> dict[str, Any]:
    """:func:`_merge_sorted` without compressing b's rows into new and shared ones (whose count
    a device reads on the host): every b row has its place in the union, ``pos`` plus the new
    keys before it (a shared key's is its a row's), and every a row its index plus the new keys
    below it.  A field starts as its merge's identity (``-0.0``, 0, or the smallest value for a
    maximum: ``x`` merged with it is ``x`` bit for bit), a's rows are put in place and b's rows
    merged into theirs; floats made summable first (:func:`_summable`), as on the host."""
    new = ~hit
    cnew = xp.cumsum(new, dtype=xp.int64)  # new keys among b[: j + 1]
    to_b = pos + (cnew - new)
    before = xp.concatenate([xp.zeros(1, dtype=xp.int64), cnew])  # new keys among b[:m]
    to_a = xp.arange(ka.shape[0], dtype=xp.int64) + before[xp.searchsorted(kb, ka)]
    key = xp.empty(n_out, dtype=xp.int64)
    key[to_a] = ka
    key[to_b] = kb
    out = {"key": key}
    for k in a:
        if k == "key":
            continue
        va, vb = a[k], b[k]
        if "f" in (va.dtype.kind, vb.dtype.kind):
            va, vb = _summable(va, xp), _summable(vb, xp)
        dtype = np.dtype(np.float64) if va.dtype.kind == "f" else np.dtype(va.dtype)
        top = k in maxima
        if dtype.kind == "f":
            fill = -np.inf if top else -0.0
        else:
            fill = np.iinfo(dtype).min if top else 0
        v = xp.full((n_out, *va.shape[1:]), fill, dtype=dtype)
        v[to_a] = va
        at = v[to_b]
        v[to_b] = xp.maximum(at, vb) if top else at + vb
        out[k] = v
    return out


def _group_device(xp: Any, cat: dict[str, Any], maxima: tuple[str, ...]) -> dict[str, Any]:
    """:func:`_group_keyed` on the device, without scatters (CuPy's ``add.at`` lacks int64):
    float fields summed by ``bincount`` as on the host (:func:`_summable`: the same sums), integer ones
    exactly by ``add.reduceat`` over the rows ordered by key, and maxima by the last row of each
    key in a sort by key then value (NaN: the maximum's NaN, as ``maximum.at``)."""
    uniq, inv, counts = xp.unique(cat["key"], return_inverse=True, return_counts=True)
    inv = inv.reshape(-1).astype(xp.int64)
    order = xp.argsort(inv)
    ends = xp.cumsum(counts)
    starts = ends - counts
    out = {"key": uniq.astype(xp.int64)}
    for k, v in cat.items():
        if k == "key" or (k not in maxima and v.dtype.kind not in "fiu"):
            continue
        if k in maxima:
            out[k] = _group_max(xp, v, inv, starts, ends)
        elif v.dtype.kind == "f":
            out[k] = _column_sums(xp, _summable(v, xp), inv, int(uniq.shape[0]))
        else:
            out[k] = xp.add.reduceat(v[order], starts, dtype=v.dtype)
    return out


def _column_sums(xp: Any, v: Any, inv: Any, n: int) -> Any:
    """Per group ``inv`` (of ``n``): the sums of float64 field ``v``, each column of a 2-D field
    by its own ``bincount``."""
    if v.ndim == 1:
        return bincount(xp, inv, weights=v, minlength=n)
    flat = v.reshape(v.shape[0], -1)
    cols = [bincount(xp, inv, weights=xp.ascontiguousarray(flat[:, j]), minlength=n) for j in range(flat.shape[1])]
    return xp.stack(cols, axis=1).reshape((n, *v.shape[1:]))


def _group_max(xp: Any, v: Any, inv: Any, starts: Any, ends: Any) -> Any:
    """Per run of a key (``starts``, ``ends`` of the rows sorted by ``inv``): the maximum of ``v``
    (NaN when the run has one), as the host's ``maximum.at``."""
    if v.dtype.kind != "f":
        wide = v.astype(xp.int64) if v.dtype != np.uint64 else v
        order = xp.lexsort(xp.stack([wide, inv.astype(wide.dtype)]))
        return v[order][ends - 1]
    nan = xp.isnan(v)
    clean = xp.where(nan, -np.inf, v).astype(xp.float64)
    order = xp.lexsort(xp.stack([clean, inv.astype(xp.float64)]))
    has_nan = xp.add.reduceat(nan[order].astype(xp.int64), starts) > 0
    return xp.where(has_nan, np.nan, clean[order][ends - 1]).astype(v.dtype)


def _merge_sorted(
    a: dict[str, np.ndarray], b: dict[str, np.ndarray], ka: np.ndarray, kb: np.ndarray, maxima: tuple[str, ...]
) -> dict[str, np.ndarray]:
    """:func:`merge_keyed` of two partials with sorted unique keys ``ka``, ``kb``: every row placed
    once at its index in the union (a's rows shifted by the new keys of b before them, b's new
    rows after the a rows before them), floats made summable on the output, then b's shared keys
    added (or maxed) in place.  The same values as inserting b's new rows and adding, without
    copying every field twice (``np.insert``) or searching the union again: two partials of 1.8 M
    keys and nine fields in 0.29 s instead of 1.05 s on the 2-core VM."""
    na = ka.shape[0]
    pos = np.searchsorted(ka, kb)
    hit = (pos < na) & (ka[np.minimum(pos, na - 1)] == kb)
    i_new, i_hit = np.flatnonzero(~hit), np.flatnonzero(hit)  # b's rows: new keys, shared keys
    new_pos = pos[i_new]  # b's new keys go before a[new_pos] (non-decreasing)
    to_b = new_pos + np.arange(new_pos.shape[0])
    to_a = np.arange(na) + np.cumsum(np.bincount(new_pos, minlength=na + 1))[:na]
    at = to_a[pos[i_hit]]  # where b's shared keys are (a's rows with the same key)
    n_out = na + new_pos.shape[0]
    key = np.empty(n_out, dtype=np.int64)
    key[to_a] = ka
    key[to_b] = kb.take(i_new)
    out: dict[str, np.ndarray] = {"key": key}
    for k in a:
        if k == "key":
            continue
        va, vb = a[k], b[k]
        if "f" in (va.dtype.kind, vb.dtype.kind) and (va.dtype, vb.dtype) != (np.float64, np.float64):
            va, vb = _summable(va), _summable(vb)  # other floats: infinities clipped in their own type first
        dtype = np.dtype(np.float64) if va.dtype.kind == "f" else va.dtype
        v = np.empty((n_out, *va.shape[1:]), dtype=dtype)
        v[to_a] = va
        v[to_b] = vb.take(i_new, axis=0)
        if dtype.kind == "f":
            bad = ~np.isfinite(v)
            if bad.any():  # _summable on the few rows that need it
                v[bad] = _summable(v[bad])
        shared = _summable(vb.take(i_hit, axis=0))
        if k in maxima:
            v[at] = np.maximum(v[at], shared)
        else:
            v[at] += shared
        out[k] = v
    return out


def _summable(v: np.ndarray, xp: Any = np) -> np.ndarray:
    """A keyed field as merged: floats as float64 with NaN as 0 (SQL's SUM ignores NULL) and
    infinities clipped to the largest finite values of their own type; ``xp``: the arrays' module."""
    if v.dtype.kind == "f":
        return xp.nan_to_num(v, nan=0.0).astype(xp.float64, copy=False)
    return v


def _group_keyed(cat: dict[str, np.ndarray], maxima: tuple[str, ...] = ()) -> dict[str, np.ndarray]:
    """Group concatenated keyed rows by key: float fields summed as the sorted paths sum them
    (:func:`_summable`: NaN as 0, as SQL's SUM ignores NULL, infinities clipped), integers
    exactly, ``maxima`` by maximum (on the host, as the cpu backend's ``grouped_sum``: one
    ``bincount`` a column)."""
    fsum = {k: v for k, v in cat.items() if k != "key" and k not in maxima and v.dtype.kind == "f"}
    isum = {k: v for k, v in cat.items() if k != "key" and k not in maxima and v.dtype.kind in "iu"}
    uniq, inv = np.unique(cat["key"], return_inverse=True)
    inv = inv.reshape(-1).astype(np.int64)
    n = uniq.shape[0]
    out = {"key": uniq.astype(np.int64)}
    for k, v in fsum.items():
        out[k] = _column_sums(np, _summable(v), inv, n)
    for k, v in isum.items():
        acc = np.zeros((n, *v.shape[1:]), dtype=v.dtype)
        np.add.at(acc, inv, v)
        out[k] = acc
    for k in maxima:
        v = cat[k]
        low = np.iinfo(v.dtype).min if v.dtype.kind in "iu" else -np.inf
        acc = np.full((n, *v.shape[1:]), low, dtype=v.dtype)
        np.maximum.at(acc, inv, v)
        out[k] = acc
    return out


def merge_moments(a: tuple[Any, Any, Any], b: tuple[Any, Any, Any]) -> tuple[Any, Any, Any]:
    """Merge ``(n, mean, M2)`` moment triples (Chan et al.); works elementwise on arrays.

    Examples
    --------
    >>> n, mean, m2 = merge_moments((2, 1.5, 0.5), (1, 3.0, 0.0))
    >>> (n, mean, round(m2 / n, 6))
    (3, 2.0, 0.666667)
    """
    na, ma, m2a = a
    nb, mb, m2b = b
    n = na + nb
    with np.errstate(invalid="ignore", divide="ignore"):
        delta = mb - ma
        wb = np.where(n > 0, nb / np.where(n > 0, n, 1), 0.0)
        mean = ma + delta * wb
        m2 = m2a + m2b + delta * delta * na * wb
    if np.ndim(mean) == 0:
        return n, float(mean), float(m2)
    return n, mean, m2


@dataclass(frozen=True)
class Moments:
    """Per-group weighted co-moments ``(n, W, mean, C)``; arrays of one array module.

    Attributes
    ----------
    n : int64 array ``(G,)``
        Rows used per group.
    W : float64 array ``(G,)``
        Weight sums.
    mean : float64 array ``(G, d)``
        Weighted means (0 for empty groups).
    C : float64 array ``(G, d, d)``
        Weighted co-moment matrices ``sum w (x - mean)(x - mean)^T`` (symmetric; 0 for empty groups).

    Examples
    --------
    >>> import numpy as np
    >>> from gpuclust.backends.moments_cpu import grouped_comoments
    >>> m = grouped_comoments(np.array([[1.0], [3.0]]), np.array([1.0, 1.0]), np.array([0, 0]), 1)
    >>> m.n.tolist(), m.W.tolist(), m.mean.tolist(), m.C.tolist()
    ([2], [2.0], [[2.0]], [[[2.0]]])
    """

    n: Any
    W: Any
    mean: Any
    C: Any

    @property
    def n_groups(self) -> int:
        """Number of groups ``G``."""
        return int(self.W.shape[0])

    @property
    def d(self) -> int:
        """Number of variables ``d``."""
        return int(self.mean.shape[1])

    @staticmethod
    def empty(n_groups: int, d: int, xp: Any = np) -> Moments:
        """The merge identity for ``n_groups`` groups of ``d`` variables."""
        return Moments(
            xp.zeros(n_groups, dtype=xp.int64),
            xp.zeros(n_groups, dtype=xp.float64),
            xp.zeros((n_groups, d), dtype=xp.float64),
            xp.zeros((n_groups, d, d), dtype=xp.float64),
        )

    def select(self, indices: Any) -> Moments:
        """The moments of a subset (or reordering) of the variables; exact (marginalisation)."""
        idx = list(indices)
        return Moments(self.n, self.W, self.mean[:, idx], self.C[:, idx][:, :, idx])

    def take(self, groups: Any) -> Moments:
        """The moments of a subset of the groups (integer or boolean index)."""
        return Moments(self.n[groups], self.W[groups], self.mean[groups], self.C[groups])

    def to_host(self) -> Moments:
        """A copy with NumPy arrays (device arrays are copied from the device)."""

        def h(a: Any) -> np.ndarray:
            return a if isinstance(a, np.ndarray) else a.get()

        return Moments(h(self.n), h(self.W), h(self.mean), h(self.C))

    def concat(self, other: Moments) -> Moments:
        """Stack the groups of ``self`` then ``other`` (host NumPy arrays)."""
        return Moments(*(np.concatenate([a, b]) for a, b in zip(self.astuple(), other.astuple(), strict=True)))

    def astuple(self) -> tuple[Any, Any, Any, Any]:
        """``(n, W, mean, C)``."""
        return (self.n, self.W, self.mean, self.C)


# ------------------------------------------------------------------------------ binned counts


def bin_quantile_edges(counts: np.ndarray, lower: np.ndarray, percents: tuple[int, ...]) -> dict[int, float]:
    """For a histogram of exact counts (``counts[b]`` values in bin ``b``, ``lower[b]`` its lower
    edge), the lower edge of the bin holding each inverted-CDF percentile (the smallest value with
    at least ``ceil(p * n / 100)`` of the ``n`` values at or below it): the exact percentile lies
    in that bin.  NaN for every percentile when there are no values.

    >>> bin_quantile_edges(np.array([0, 3, 1]), np.array([0.0, 1.0, 2.0]), (50, 99))
    {50: 1.0, 99: 2.0}
    """
    cum = np.cumsum(counts)
    n = int(cum[-1]) if cum.shape[0] else 0
    if n == 0:
        return dict.fromkeys(percents, float("nan"))
    return {q: float(lower[int(np.searchsorted(cum, -(-q * n // 100), side="left"))]) for q in percents}


def bin_rows(
    counts: np.ndarray, lower: np.ndarray, upper: np.ndarray, value: str, count: str, **keys: Any
) -> list[dict[str, Any]]:
    """One row per non-empty bin of a histogram: ``keys``, ``bin``, ``lo_<value>`` and
    ``hi_<value>`` (the bin's edges) and ``<count>`` (its count).

    >>> bin_rows(np.array([0, 2]), np.array([0.0, 1.0]), np.array([1.0, 2.0]), "s", "episodes", tier="all")
    [{'tier': 'all', 'bin': 1, 'lo_s': 1.0, 'hi_s': 2.0, 'episodes': 2}]
    """
    return [
        {**keys, "bin": int(b), f"lo_{value}": float(lower[b]), f"hi_{value}": float(upper[b]), count: int(counts[b])}
        for b in np.nonzero(counts)[0]
    ]


def log_bins(xp: Any, edges: Any, v: Any) -> Any:
    """``searchsorted(edges, v, side="right")`` (int64) for log-spaced ``edges`` (cpi's fine
    histograms, the ratio bins of usage-change, usage-vs-request and data-quality), on any backend.

    A binary search over thousands of edges mispredicts a branch per level; here the bin is guessed from
    ``log(v)`` (one pass) and then checked against the edges themselves: rows with
    ``edges[b - 1] <= v < edges[b]`` are exact by definition; the few others (rounding at a bin
    boundary) are moved by one bin, and any still wrong fall back to ``searchsorted``.  So the
    result is exactly the binary search's, for any ``v`` (NaN: the last bin, as the binary search
    sorts it; ``v <= 0``: bin 0).  Edges that do not start above 0 use ``searchsorted`` itself.
    About 6x faster than the binary search over usage-change's 1,201 ratio edges.

    >>> edges = 10.0 ** np.arange(-2, 3)
    >>> log_bins(np, edges, np.array([0.0, 0.01, 0.5, 1.0, 99.0, 1e9])).tolist()
    [0, 1, 2, 3, 4, 5]
    """
    E = int(edges.shape[0])
    v = xp.asarray(v, dtype=xp.float64)
    if E < 2 or not float(edges[0]) > 0:
        return xp.searchsorted(edges, v, side="right").astype(xp.int64)
    lo = float(np.log(float(edges[0])))
    step = (float(np.log(float(edges[E - 1]))) - lo) / (E - 1)
    with np.errstate(divide="ignore", invalid="ignore"):
        q = xp.log(v)
        q -= lo
        q /= step
        q = xp.where(v > 0, q, -1.0)
    q = xp.floor(q, out=q)
    q += 1.0
    b = xp.clip(q, 0, E, out=q).astype(xp.int64)
    b[xp.isnan(v)] = E
    # row ok iff ext[b] <= v < ext[b + 1] (the NaN sentinel: v >= NaN is never true, so b = E
    # is right for +inf; NaN rows have b = E and are never flagged)
    ext = xp.concatenate([xp.asarray([-np.inf]), xp.asarray(edges, dtype=xp.float64), xp.asarray([np.nan])])
    bad = xp.nonzero((v < ext[b]) | (v >= ext[b + 1]))[0]
    if int(bad.shape[0]):
        vb, bb = v[bad], b[bad]
        bb = xp.clip(bb - (vb < ext[bb]).astype(xp.int64) + (vb >= ext[bb + 1]).astype(xp.int64), 0, E)
        still = (vb < ext[bb]) | (vb >= ext[bb + 1])
        if bool(still.any()):
            bb[still] = xp.searchsorted(edges, vb[still], side="right")
        b[bad] = bb
    return b
