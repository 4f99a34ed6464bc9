"""The ``exact-two-pass`` strategy of ``usage-distribution``: exact quantiles in two streamed
passes, with memory that grows with the window knots inside small brackets, not with the windows.
(The first pass is :class:`gpuclust.analyses.usage_distribution.UsageDistributionBrackets`.)

Pass 1 is the ``bounded`` strategy of the same grouping (a first-pass summary size
``bracket_k``).  Its tracked bound ``e`` (Kolmogorov distance, in probability) brackets every
quantile: ``Q(p) ∈ [Q̂(p - e), Q̂(p + e)]``, and since the summary's quantile function runs through
its knots ``y_j = Q̂(j/K)``, ``Q(p) ∈ [y_jlo, y_jhi]`` with ``jlo = ⌊(p - e - δ) K⌋`` and
``jhi = ⌈(p + e + δ) K⌉`` (clipped to ``[0, K]``; ``δ`` = :data:`BRACKET_MARGIN` covers the
rounding of the bound).  Groups the first pass kept exact (few windows) get their exact quantile as
a closed bracket ``lo = hi``; so do groups without weight (NaN).  :func:`brackets` computes them.

Pass 2 (:func:`second_partial`) computes, per *open* (group, level) pair (``lo < hi``), from the
windows with weight:

``f_lo``, ``f_lo_left``, ``f_hi``
    ``Σ w_i F_i(lo)``, ``Σ w_i F_i(lo-)`` and ``Σ w_i F_i(hi)`` (additive; the last two only check
    that the bracket holds the quantile);
``s``
    the summed density of the window segments that span the whole bracket (additive);
``a_hi``
    ``Σ w_i (1 - F_i(hi-))``, the mass at or above ``hi`` (additive);
pieces
    every other window segment inside ``(lo, hi)``, clipped to it: ``(a, b, mass)``, or a point
    mass ``(a, a, mass)`` with ``lo < a < hi`` -- only windows with a knot strictly inside the
    bracket have any; identical pieces of a pair are summed (concatenate, then sort and sum).

A pair's mixture restricted to ``[lo, hi]`` is then exactly the mixture of a point mass ``f_lo``
at ``lo``, a uniform of mass ``s (hi - lo)`` on ``[lo, hi]``, the pieces, and a point mass
``a_hi`` at ``hi``: it agrees with the group's mixture on ``[lo, hi)`` and has the same total, so
(as ``Q(p) ∈ [lo, hi]``) its quantile at ``p`` is the group's.  :func:`resolve` inverts it with the
same op, ``mixture_quantiles`` (rows of two knots at levels 0 and 1), so the conventions at point
masses, plateaus and the support ends are the one-pass exact strategy's.

Memory of pass 2: per open pair 6 numbers, plus 4 per distinct piece; pieces number at most twice
the window knots strictly inside the pair's bracket.  Refinement passes between the two
(:mod:`gpuclust.analyses._usage_distribution_refine`) narrow the brackets while pass 1's estimate
of the pieces (``est`` of :func:`brackets`) is large.  See docs/analyses/usage-distribution.md.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from gpuclust._xp import bincount
from gpuclust.analyses import mixture_summary as ms
from gpuclust.analyses.base import to_host
from gpuclust.backends import backend_of, device_free_bytes
from gpuclust.schema import CPU_PERCENTILE_LEVELS_SORTED

__all__ = [
    "BLOCK_ROWS",
    "BRACKET_MARGIN",
    "SUMS",
    "SUM_PIECES_AT",
    "brackets",
    "brackets_of_partial",
    "brackets_of_table",
    "brackets_table",
    "carry",
    "check_brackets_hold",
    "first_pass_merge",
    "level_steps",
    "empty_state",
    "estimate_of_table",
    "cuts_of_table",
    "finalize_two_pass",
    "merge_state",
    "merge_two_pass",
    "resolve",
    "second_partial",
    "second_partial_of",
    "step_rows",
]

#: Added to the first pass's bound when its knots bracket a quantile (in probability).
BRACKET_MARGIN = 1e-9
#: The additive per-pair sums of a second-pass state, in this order.
SUMS = ("f_lo", "f_lo_left", "f_hi", "s", "a_hi")
_PIECES = ("p_pid", "p_a", "p_b", "p_m")
_LV = np.asarray(CPU_PERCENTILE_LEVELS_SORTED, dtype=np.float64)
#: Windows a second-pass step handles at once on the host (bounds its temporaries: about 1.2 kB a
#: window, cache-sized).
BLOCK_ROWS = 1 << 16
#: Device bytes a step's temporaries take per window (twice the peak on the device-shaped backend, ~625 B;
#: a sort's scratch is not seen there) and the share of the device's free memory they may take:
#: a device step takes all of a level's windows that fit, so its launches and syncs do not grow
#: with the partition (:func:`step_rows`).
STEP_BYTES = 1280
DEVICE_STEP_SHARE = 0.5
#: Fewest pieces a merge sums identical ones at (:func:`merge_state`).
SUM_PIECES_AT = 1 << 16
#: Relative slack of the check that a bracket holds its quantile (rounding of the sums).
_CHECK_REL = 1e-9
#: The first pass's estimate of a pair's pieces in the exact pass: this many per window knot the
#: group's summary puts inside the bracket (``n_windows x 20 x (jhi - jlo) / K``); the pieces
#: measured on the canonical 10^6-window cell were 2.5-3.4 times that estimate's knots, by
#: machine, tier, collection and machine x time.
EST_PIECES_PER_KNOT = 4.0
#: Windows of the first pass's exact groups inverted at once (:func:`brackets`): the inversion's
#: temporaries (about 0.5 kB a window) stay this size, not the size of every small group's windows.
EXACT_ROWS = 1 << 20


def brackets(h: dict[str, Any], levels: Any, margin: float = BRACKET_MARGIN) -> dict[str, np.ndarray]:
    """Per group of a merged first-pass (hybrid, host) partial ``h``: ``key`` (sorted), the
    brackets ``lo``, ``hi`` (``(G, L)``) of its quantiles at ``levels`` and ``est``, the pieces
    the exact pass is estimated to keep per bracket (:data:`EST_PIECES_PER_KNOT`; 0 if closed)."""
    lv = np.asarray(levels, dtype=np.float64).reshape(-1)
    L = int(lv.shape[0])
    e = h["exact"]
    qe = _exact_quantiles(e, lv).reshape(-1, L)
    b = h["bounded"]
    kn = np.asarray(b["knots"], dtype=np.float64)
    err = np.asarray(b["err"], dtype=np.float64)[:, None]
    K = int(kn.shape[1]) - 1
    jlo = np.clip(np.floor((lv[None, :] - err - margin) * K), 0, K).astype(np.int64)
    jhi = np.clip(np.ceil((lv[None, :] + err + margin) * K), 0, K).astype(np.int64)
    key = np.concatenate([np.asarray(e["key"], np.int64), np.asarray(b["key"], np.int64)])
    order = np.argsort(key, kind="stable")
    lo = np.concatenate([qe, np.take_along_axis(kn, jlo, axis=1)])[order]
    hi = np.concatenate([qe, np.take_along_axis(kn, jhi, axis=1)])[order]
    n = np.asarray(b["n_windows"], dtype=np.float64)[:, None]
    est = np.concatenate([np.zeros_like(qe), EST_PIECES_PER_KNOT * n * 20.0 * (jhi - jlo) / max(K, 1)])[order]
    est = np.where(lo < hi, est, 0.0)
    return {"key": key[order], "lo": np.ascontiguousarray(lo), "hi": np.ascontiguousarray(hi), "est": est}


def _exact_quantiles(e: dict[str, Any], lv: np.ndarray) -> np.ndarray:
    """``mixture_summary.finalize(e, lv)["quantiles"]`` of a host exact partial ``e``, a range of
    groups at a time (at most :data:`EXACT_ROWS` windows, or one group): the same values, as
    groups are inverted independently (a group's windows keep their order)."""
    G, n = int(e["key"].shape[0]), int(e["row_key"].shape[0])
    if n <= EXACT_ROWS:
        return np.asarray(ms.finalize(e, lv)["quantiles"], dtype=np.float64)
    order = np.argsort(e["row_key"], kind="stable")
    ends = np.searchsorted(e["row_key"][order], e["key"], side="right")  # rows of the groups up to each
    out = np.empty((G, int(lv.shape[0])))
    g0 = 0
    while g0 < G:
        start = int(ends[g0 - 1]) if g0 else 0
        g1 = max(g0 + 1, int(np.searchsorted(ends, start + EXACT_ROWS, side="right")))
        rows = order[start : int(ends[g1 - 1])]
        sub = {f: v[g0:g1] if f != "kind" else v for f, v in e.items() if f not in ("row_key", "q", "w")}
        sub.update(row_key=e["row_key"][rows], q=e["q"][rows], w=e["w"][rows])
        out[g0:g1] = np.asarray(ms.finalize(sub, lv)["quantiles"]).reshape(g1 - g0, -1)
        g0 = g1
    return out


def empty_state(xp: Any = np) -> dict[str, Any]:
    """The merge identity of a second-pass state."""
    out: dict[str, Any] = {"pid": xp.zeros(0, dtype=xp.int64), "p_pid": xp.zeros(0, dtype=xp.int64), "p_summed": 0}
    out.update({f: xp.zeros(0, dtype=xp.float64) for f in (*SUMS, "p_a", "p_b", "p_m")})
    return out


def _pair_sums(xp: Any, ops: Any, pid: Any, sums: list[Any], rows: dict[str, Any] | None = None) -> dict[str, Any]:
    """Sums per pair id (sorted unique ``pid``): :data:`SUMS`, and ``rows`` (``{name: (n, S)}``,
    a refinement pass's sub-bins) summed row by row."""
    rows = rows or {}
    if int(pid.shape[0]) == 0:
        out = {f: v for f, v in empty_state(xp).items() if f == "pid" or f in SUMS}
        return {**out, **{f: xp.zeros((0, int(v.shape[1])), dtype=xp.float64) for f, v in rows.items()}}
    uniq, inv = _unique_inverse(xp, ops, pid)
    P = int(uniq.shape[0])
    out = {"pid": uniq, **{s: bincount(xp, inv, v, P, bounded=True) for s, v in zip(SUMS, sums, strict=True)}}
    for f, v in rows.items():
        S = int(v.shape[1])
        cells = (inv[:, None] * S + xp.arange(S, dtype=xp.int64)[None, :]).reshape(-1)
        out[f] = bincount(xp, cells, v.reshape(-1), P * S, bounded=True).reshape(P, S)
    return out


def check_brackets_hold(xp: Any, f_lo_left: Any, f_hi: Any, t: Any, total: Any) -> None:
    """Raise unless every bracket holds its quantile: ``F(lo-) <= t <= F(hi)`` up to the rounding
    of the sums (:data:`_CHECK_REL` of the group's weight ``total``)."""
    slack = _CHECK_REL * total
    if bool(xp.any((f_lo_left > t + slack) | (f_hi < t - slack))):
        raise RuntimeError("usage-distribution: a bracket misses its quantile (internal error)")


def _summed_pieces(xp: Any, pieces: list[Any]) -> dict[str, Any]:
    """Identical pieces summed (sorted by pair, a, b); ``p_summed`` = their number."""
    p_pid, p_a, p_b, p_m = pieces
    n = int(p_pid.shape[0])
    if n == 0:
        return {f: v for f, v in empty_state(xp).items() if f in (*_PIECES, "p_summed")}
    order = xp.lexsort(xp.stack([p_b, p_a, p_pid.astype(xp.float64)]))  # pair ids < 2^53: exact
    p_pid, p_a, p_b, p_m = p_pid[order], p_a[order], p_b[order], p_m[order]
    first = xp.ones(n, dtype=bool)
    first[1:] = (p_pid[1:] != p_pid[:-1]) | (p_a[1:] != p_a[:-1]) | (p_b[1:] != p_b[:-1])
    inv = xp.cumsum(first.astype(xp.int64)) - 1
    k = int(inv[-1]) + 1
    m = bincount(xp, inv, weights=p_m, minlength=k, bounded=True)
    return {"p_pid": p_pid[first], "p_a": p_a[first], "p_b": p_b[first], "p_m": m, "p_summed": k}


def _unique_inverse(xp: Any, ops: Any, a: Any) -> tuple[Any, Any]:
    """``unique(a, return_inverse=True)`` by one stable sort."""
    order = ops.stable_argsort(a)
    s = a[order]
    first = xp.ones(s.shape[0], dtype=bool)
    first[1:] = s[1:] != s[:-1]
    run = xp.cumsum(first.astype(xp.int64)) - 1
    inv = xp.empty_like(run)
    inv[order] = run
    return s[first], inv


def _segment(xp: Any, yf: Any, base: Any, c: Any) -> tuple[Any, Any, Any, Any]:
    """Per row (flat rows ``yf``, row starts ``base``), the segment after its ``c``-th knot:
    ``k = c - 1`` (the knot it starts at), its ends and its level step."""
    lvx = xp.asarray(_LV)
    k = c - 1
    kc = xp.clip(k, 0, 18)
    return k, yf[base + kc], yf[base + kc + 1], (lvx[kc], lvx[kc + 1])


def _cdf_on(xp: Any, x: Any, k: Any, ya: Any, yb: Any, la: Any, lb: Any) -> Any:
    """``F_i(x)`` from the segment :func:`_segment` gives: the formula of
    :func:`mixture_summary._cdf_at_sorted_points`."""
    inner = la + (lb - la) * (x - ya) / xp.where(yb > ya, yb - ya, 1.0)
    return xp.where(k < 0, 0.0, xp.where(k >= 19, 1.0, inner))


def _cdf(xp: Any, yf: Any, base: Any, x: Any, c: Any) -> Any:
    """``F_i(x)`` of each row given ``c``, its knots ``<= x`` (or ``< x`` for the left limit), by
    flat gathers."""
    k, ya, yb, (la, lb) = _segment(xp, yf, base, c)
    return _cdf_on(xp, x, k, ya, yb, la, lb)


def _count(xp: Any, m: Any) -> Any:
    """Each row's true values of the ``(n, 20)`` mask ``m`` (summed as bytes: two launches on a device)."""
    return m.sum(axis=1, dtype=xp.uint8).astype(xp.int64)


def _count_words(xp: Any, m: Any) -> Any:
    """:func:`_count` on the host, 1.9x faster: a row's 20 bytes as five 32-bit words added (bytes
    at most 5: no carries), the sum's 4 bytes added by a multiply (top byte of ``s x 0x01010101``)."""
    u = m.view(xp.uint32)
    s = u[:, 0] + u[:, 1] + u[:, 2] + u[:, 3] + u[:, 4]
    return ((s * xp.uint32(0x01010101)) >> xp.uint32(24)).astype(xp.int64)


def _recount(xp: Any, y: Any, x: Any, c: Any, again: Any, strict: bool, count: Any) -> Any:
    """Counts ``c``, where rows ``again`` have their knots ``< x`` (``strict``) or ``<= x``
    counted instead (``x``: a column) by ``count`` (:func:`_count` or :func:`_count_words`)."""
    r = xp.flatnonzero(again)
    yr, xr = y[r], x[r]
    out = c.copy()
    out[r] = count(xp, yr < xr if strict else yr <= xr)
    return out


def _level_rows(xp: Any, qr: Any, sel: Any, ww: Any, lo: Any, hi: Any, edges: Any) -> tuple[list[Any], Any, Any]:
    """One level's sums per window (rows ``sel`` of ``qr``, all of them for None, with weights
    ``ww`` and their brackets ``lo``, ``hi``), the windows with a knot strictly inside their
    bracket (their positions in ``sel``) and their rows (None: there are none).

    With ``edges`` (the host: the first and last knots of every row of ``qr``, contiguous copies
    made once a partition, gathered faster than ``qr``'s columns), a window wholly below its
    bracket (its last knot ``< lo``) has ``F = 1`` on it and one wholly above (its first knot
    ``> hi``) ``F = 0``: their sums are ``ww`` or 0, the values :func:`_level_rows_of` gives them,
    and only the other windows' rows are gathered and compared (on the canonical cells about 38%
    of a level's windows by machine or tier).  Without (a device) every row is gathered and
    compared (one step, no data-sized filter)."""
    if edges is None:
        y = qr if sel is None else qr[sel]
        vals, inside = _level_rows_of(xp, y, ww, lo, hi)
        r = xp.flatnonzero(inside)
        return vals, r, y[r] if int(r.shape[0]) else None
    first, last = edges if sel is None else (edges[0][sel], edges[1][sel])
    below, above = last < lo, first > hi
    r = xp.flatnonzero(~(below | above))
    y = xp.take(qr, r if sel is None else sel[r], axis=0)  # a row gather (faster than fancy indexing)
    got, inside = _level_rows_of(xp, y, ww[r], lo[r], hi[r], _count_words)
    one = xp.where(below, ww, 0.0)
    vals = [one, one.copy(), one.copy(), xp.zeros_like(ww), xp.where(above, ww, 0.0)]
    for v, g in zip(vals, got, strict=True):
        v[r] = g
    k = xp.flatnonzero(inside)
    return vals, r[k], y[k] if int(k.shape[0]) else None


def _level_rows_of(xp: Any, y: Any, ww: Any, lo: Any, hi: Any, count: Any = _count) -> tuple[list[Any], Any]:
    """:func:`_level_rows` comparing every row's knots with its bracket (counted by ``count``).

    ``F_i`` is continuous at ``x`` unless knots equal ``x``; where they do, ``F_i(lo-)`` is the
    level of the first knot equal to ``lo`` and ``F_i(hi)`` that of the last equal to ``hi``
    (what the segment formula gives there), so two segments are evaluated, not four."""
    a, b = lo[:, None], hi[:, None]
    c_lo, c_hi = count(xp, y <= a), count(xp, y < b)
    yf = y.reshape(-1)
    base = xp.arange(y.shape[0], dtype=xp.int64) * 20
    # the knots < lo (<= hi) are those <= lo (< hi) but where a knot equals lo (hi): the one before
    # c_lo (at c_hi), as the rows are sorted; only those rows are counted again
    c_lo_left = _recount(xp, y, a, c_lo, (c_lo > 0) & (yf[base + xp.maximum(c_lo - 1, 0)] == lo), True, count)
    c_hi_right = _recount(xp, y, b, c_hi, (c_hi < 20) & (yf[base + xp.minimum(c_hi, 19)] == hi), False, count)
    lvx = xp.asarray(_LV)
    # the segment after the last knot <= lo: F(lo), and the one spanning the bracket if no knot is inside
    k, ya, yb, (la, lb) = _segment(xp, yf, base, c_lo)
    f_lo = _cdf_on(xp, lo, k, ya, yb, la, lb)
    f_hi_left = _cdf(xp, yf, base, hi, c_hi)
    f_lo_left = xp.where(c_lo_left < c_lo, lvx[xp.minimum(c_lo_left, 19)], f_lo)
    f_hi = xp.where(c_hi_right > c_hi, lvx[xp.maximum(c_hi_right - 1, 0)], f_hi_left)
    inside = c_hi > c_lo
    span = ~inside & (k >= 0) & (k <= 18) & (yb > ya)
    s = xp.where(span, ww * (lb - la) / xp.where(span, yb - ya, 1.0), 0.0)
    return [ww * f_lo, ww * f_lo_left, ww * f_hi, s, ww * (1.0 - f_hi_left)], inside


def _level_pieces(xp: Any, y: Any, ww: Any, lo: Any, hi: Any) -> tuple[Any, Any, Any, Any]:
    """The pieces of windows ``y`` (each with a knot strictly inside its bracket): the row of each,
    its clipped ends and mass."""
    lvx = xp.asarray(_LV)
    a, b = lo[:, None], hi[:, None]
    ya, yb = y[:, :-1], y[:, 1:]
    flat = yb == ya
    pa = xp.maximum(ya, a)
    pb = xp.minimum(yb, b)
    mass = ww[:, None] * (lvx[1:] - lvx[:-1])[None, :]
    part = xp.where(flat, mass, mass * (pb - pa) / xp.where(flat, 1.0, yb - ya))
    keep = xp.where(flat, (ya > a) & (ya < b), pa < pb)
    idx = xp.flatnonzero(keep.reshape(-1))
    return idx // 19, pa.reshape(-1)[idx], pb.reshape(-1)[idx], part.reshape(-1)[idx]


def step_rows(be: Any) -> int:
    """Windows a second-pass step takes at once on backend ``be``: :data:`BLOCK_ROWS` on the host
    (where the backend looks rows up a block at a time, ``ops.lookup_block_rows``), else as many
    as :data:`DEVICE_STEP_SHARE` of the device's free memory holds at :data:`STEP_BYTES` a window
    (at least :data:`BLOCK_ROWS`)."""
    if be.ops.lookup_block_rows is not None:
        return BLOCK_ROWS
    return max(BLOCK_ROWS, int(DEVICE_STEP_SHARE * device_free_bytes(be)) // STEP_BYTES)


def _blocks(xp: Any, is_open: Any, code: Any, w: Any, rows: int) -> Any:
    """``(level index, windows)``: per level, its windows with weight in an open bracket, at most
    ``rows`` at a time (the temporaries of a step stay that size)."""
    for j in range(int(is_open.shape[1])):
        sel = xp.flatnonzero(is_open[code, j] & (w > 0))
        n = int(sel.shape[0])
        for i in range(0, n, rows):
            yield j, sel if n <= rows else sel[i : i + rows]


def level_steps(xp: Any, qr: Any, w: Any, key: Any, br: dict[str, Any], rows: int, beside: bool = False) -> Any:
    """The per-window work both later passes share: per step of :func:`_blocks` (a level's
    windows in an open bracket, at most ``rows`` at a time), ``(pid, run, vals, pieces)``: the
    step's pair ids (``code * L + level index``, ``code`` the group's row in ``br``; one a run of
    its windows, ascending), each window's run, its sums (:func:`_level_rows`, in :data:`SUMS`
    order) and the pieces of its windows with a knot inside the bracket (pair id, ``a``, ``b``,
    mass; None when none).  ``qr``, ``w``, ``key``: repaired rows, weights (float64) and sorted
    group keys of the partition's windows; ``br``: the brackets on the backend; ``beside``: sum
    the windows wholly beside their bracket without their knots (:func:`_level_rows`; the host)."""
    bkey, lo, hi = br["key"], br["lo"], br["hi"]
    L = int(lo.shape[1])
    G = int(bkey.shape[0])
    code = xp.clip(xp.searchsorted(bkey, key), 0, max(G - 1, 0))
    if int(key.shape[0]) and (G == 0 or bool((bkey[code] != key).any())):
        raise RuntimeError("usage-distribution: a group the first pass did not see (internal error)")
    edges = (xp.ascontiguousarray(qr[:, 0]), xp.ascontiguousarray(qr[:, 19])) if beside and G else None
    for j, sel in _blocks(xp, lo < hi, code, w, rows) if G else ():
        c = code[sel]  # sorted, as ``key``
        every = int(sel.shape[0]) == int(w.shape[0])
        ww, a, b = w if every else w[sel], lo[c, j], hi[c, j]
        vals, r, y = _level_rows(xp, qr, None if every else sel, ww, a, b, edges)
        pid = c * L + j
        first = xp.ones(pid.shape[0], dtype=bool)
        first[1:] = c[1:] != c[:-1]
        run = xp.cumsum(first.astype(xp.int64)) - 1
        pieces = None
        if int(r.shape[0]):
            row, pa, pb, pm = _level_pieces(xp, y, ww[r], a[r], b[r])
            pieces = (pid[r][row], pa, pb, pm)
        yield pid[first], run, vals, pieces


def second_partial(
    xp: Any, ops: Any, qr: Any, w: Any, key: Any, br: dict[str, Any], rows: int | None = None
) -> dict[str, Any]:
    """The second-pass state of one partition: repaired rows ``qr`` (``(n, 20)``), weights ``w``
    and group keys ``key`` of its windows; ``br`` the brackets (:func:`brackets`, arrays on the
    backend); ``rows``: windows a step takes at once (:func:`step_rows`; default
    :data:`BLOCK_ROWS`).  Pair id = ``code * L + level index``, ``code`` the group's row in
    ``br``."""
    pids: list[Any] = []
    sums: list[list[Any]] = [[] for _ in SUMS]
    pieces: list[list[Any]] = [[] for _ in _PIECES]
    on_host = ops.lookup_block_rows is not None
    for pid, run, vals, pcs in level_steps(xp, qr, w, key, br, rows or BLOCK_ROWS, beside=on_host):
        pids.append(pid)
        for acc, v in zip(sums, vals, strict=True):
            acc.append(bincount(xp, run, weights=v, minlength=int(pid.shape[0]), bounded=True))
        for acc, v in zip(pieces, pcs or (), strict=False):
            acc.append(v)
    e = empty_state(xp)
    cat = [xp.concatenate(v) if v else e[f] for f, v in zip(SUMS, sums, strict=True)]
    pcat = [xp.concatenate(v) if v else e[f] for f, v in zip(_PIECES, pieces, strict=True)]
    return {**_pair_sums(xp, ops, xp.concatenate(pids) if pids else e["pid"], cat), **_summed_pieces(xp, pcat)}


def merge_state(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    """Two second-pass states merged: sums added per pair; pieces concatenated, and identical ones
    summed once they are more than twice as many as at the last summing (at least
    :data:`SUM_PIECES_AT`), so that a fold over many partitions sorts each piece a few times, not
    once per merge."""
    be = backend_of(a["pid"])
    xp = be.xp
    cat = {f: xp.concatenate([a[f], b[f]]) for f in (*SUMS, "pid", *_PIECES)}
    out = _pair_sums(xp, be.ops, cat["pid"], [cat[s] for s in SUMS])
    base = max(int(a["p_summed"]), int(b["p_summed"]), SUM_PIECES_AT)
    if int(cat["p_pid"].shape[0]) > 2 * base:
        return {**out, **_summed_pieces(xp, [cat[p] for p in _PIECES])}
    return {**out, **{p: cat[p] for p in _PIECES}, "p_summed": base}


def resolve(state: dict[str, Any], br: dict[str, np.ndarray], levels: Any, be: Any) -> np.ndarray:
    """The exact quantiles ``(G, L)`` (host) of the groups of ``br`` (host brackets) from a merged
    second-pass state, computed on backend ``be`` (the state is copied there if it is not;
    only the pair ids and the quantiles cross): closed brackets are their value; an open pair's
    is its restricted mixture's quantile."""
    xp, ops = be.xp, be.ops
    lv = np.asarray(levels, dtype=np.float64).reshape(-1)
    lo, hi = np.asarray(br["lo"]), np.asarray(br["hi"])
    L = int(lv.shape[0])
    out = np.array(lo, dtype=np.float64, copy=True)
    is_open = lo < hi
    pid = np.asarray(to_host(state["pid"]), dtype=np.int64)
    want = np.flatnonzero(is_open.reshape(-1))
    if not np.array_equal(pid, want):
        raise RuntimeError("usage-distribution: second-pass pairs differ from the open brackets (internal error)")
    if not pid.shape[0]:
        return out
    g, j = pid // L, pid % L
    plo, phi = be.asarray(np.ascontiguousarray(lo[g, j])), be.asarray(np.ascontiguousarray(hi[g, j]))
    f_lo, f_lo_left, f_hi, s, a_hi = (xp.asarray(state[f], dtype=xp.float64) for f in SUMS)
    p_a, p_b, p_m = (xp.asarray(state[f], dtype=xp.float64) for f in ("p_a", "p_b", "p_m"))
    p_row = xp.searchsorted(be.asarray(pid), xp.asarray(state["p_pid"]))
    unit = be.asarray(np.asarray([0.0, 1.0]))
    for jj in range(L):
        sel_h = np.flatnonzero(j == jj)
        n = int(sel_h.shape[0])
        if not n:
            continue
        sel = be.asarray(sel_h)
        rank = xp.full(pid.shape[0], -1, dtype=xp.int64)
        rank[sel] = xp.arange(n, dtype=xp.int64)
        p_rank = rank[p_row]
        pr = xp.flatnonzero(p_rank >= 0)
        a, b = plo[sel], phi[sel]
        q = xp.concatenate(
            [
                xp.stack([a, a], axis=1),
                xp.stack([a, b], axis=1),
                xp.stack([b, b], axis=1),
                xp.stack([p_a[pr], p_b[pr]], axis=1),
            ]
        )
        wt = xp.concatenate([f_lo[sel], s[sel] * (b - a), a_hi[sel], p_m[pr]])
        rows = xp.arange(n, dtype=xp.int64)
        codes = xp.concatenate([rows, rows, rows, p_rank[pr]])
        total = bincount(xp, codes, weights=wt, minlength=n, bounded=True)
        t = float(lv[jj]) * total
        check_brackets_hold(xp, f_lo_left[sel], f_hi[sel], t, total)
        res = ops.mixture_quantiles(
            xp.ascontiguousarray(q), xp.ascontiguousarray(wt), codes, n, be.asarray(lv[jj : jj + 1]), q_levels=unit
        )
        out[g[sel_h], jj] = to_host(res[:, 0])
    return out


# ------------------------------------------------------------------ the analysis' side (usage_distribution.py)
def brackets_table(br: dict[str, np.ndarray], cuts: int = 0) -> Any:
    """The first pass's (and a refinement pass's) result table: ``key``, then ``lo<j>``,
    ``hi<j>`` and ``est<j>`` (the exact pass's estimated pieces, :func:`brackets`) per level
    ``j``, and ``cuts``: the refinement passes that narrowed them."""
    from gpuclust._lazy import pandas as pd

    L = int(br["lo"].shape[1])
    cols: dict[str, np.ndarray] = {"key": br["key"], "cuts": np.full(br["key"].shape[0], cuts, np.int64)}
    for s in ("lo", "hi", "est"):
        cols.update({f"{s}{j}": br[s][:, j] for j in range(L)})
    return pd.DataFrame(cols)


def carry(stack: list[tuple[int, Any]]) -> list[tuple[int, Any]]:
    """First-pass summaries ``(leaves, hybrid partial)`` merged like a binary counter: a summary
    only merges with one of the same rank (``floor(log2(leaves))``), so whatever order the engine
    merges partials in (the local engine folds them left), a summary of ``n`` leaves has been
    through at most ``log2(n)`` merges and its bound grows with ``log2`` of the partitions, not
    with their number (docs/analyses/mixture.md, "The bound")."""
    from gpuclust.analyses import _hybrid_summary as hs

    ranks: dict[int, tuple[int, Any]] = {}
    for n, h in sorted(stack, key=lambda e: e[0]):
        r = int(n).bit_length() - 1
        while r in ranks:
            m, g = ranks.pop(r)
            n, h = n + m, hs.merge(g, h)
            r = int(n).bit_length() - 1
        ranks[r] = (n, h)
    return [ranks[r] for r in sorted(ranks)]


def first_pass_merge(a: dict[str, Any], b: dict[str, Any], merge_rest: Any) -> dict[str, Any]:
    """Two first-pass partials merged: group extras and counters by ``merge_rest`` (the analysis'
    merge), the summaries by :func:`carry` (a partial's ``stack``; none in the empty partial)."""
    out = merge_rest({**a, "ms": None}, {**b, "ms": None})
    out["stack"] = carry([*a.get("stack", []), *b.get("stack", [])])
    return out


def brackets_of_partial(p: dict[str, Any], k: int, strategy: str, levels: Any) -> dict[str, np.ndarray]:
    """The first pass's brackets (:func:`brackets`, on the host) from its merged partial (the bounded
    strategy): its summaries merged where they are, smallest first (depth <= ``log2(partitions) + 1``)."""
    from gpuclust.analyses import _hybrid_summary as hs

    if strategy != "bounded" or "done" in p:
        raise RuntimeError("usage-distribution-brackets: not a bounded first pass (internal error)")
    h = None
    for _, g in carry(list(p.get("stack", []))):
        h = g if h is None else hs.merge(h, g)
    return brackets(hs.empty(int(k)) if h is None else to_host(h), levels)


def _block(t: Any, name: str, n_levels: int) -> np.ndarray:
    """The ``(G, L)`` block ``name<j>`` of :func:`brackets_table`'s table (a DataFrame or an Arrow table)."""
    from gpuclust.tables import column

    G = len(t)
    if n_levels == 0 or G == 0:
        return np.zeros((G, n_levels))
    return np.ascontiguousarray(np.stack([column(t, f"{name}{j}") for j in range(n_levels)], axis=1), np.float64)


def brackets_of_table(t: Any, n_levels: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(key, lo, hi)`` from :func:`brackets_table`'s table."""
    from gpuclust.tables import column

    key = np.ascontiguousarray(column(t, "key"), dtype=np.int64)
    return key, _block(t, "lo", n_levels), _block(t, "hi", n_levels)


def estimate_of_table(t: Any, n_levels: int) -> np.ndarray:
    """The exact pass's pieces per bracket, estimated in :func:`brackets_table`'s table (``est``)."""
    return _block(t, "est", n_levels)


def cuts_of_table(t: Any) -> int:
    """The refinement passes that narrowed :func:`brackets_table`'s table."""
    from gpuclust.tables import column

    return int(np.max(column(t, "cuts"), initial=0)) if len(t) else 0


def second_partial_of(be: Any, qr: Any, w: Any, key: Any, bkey: Any, lo: Any, hi: Any) -> dict[str, Any]:
    """A partition's two-pass partial on backend ``be``: the group stats of its windows (those of
    :func:`mixture_summary.exact_partial`; ``key`` sorted) and its second-pass state."""
    xp, ops = be.xp, be.ops
    stats, _, _, _ = ms._group_stats(xp, ops, qr, w, key, True)
    br = {"key": be.stage(bkey), "lo": be.stage(lo), "hi": be.stage(hi)}
    return {"stats": stats, "state": second_partial(xp, ops, qr, w.astype(xp.float64), key, br, step_rows(be))}


def merge_two_pass(a: dict[str, Any] | None, b: dict[str, Any] | None) -> dict[str, Any] | None:
    """Two two-pass partials merged where they are (``None``: a partial without one, the identity)."""
    if a is None or b is None:
        return b if a is None else a
    stats, _, _ = ms._merge_stats(backend_of(a["stats"]["weight"]).xp, a["stats"], b["stats"])
    return {"stats": stats, "state": merge_state(a["state"], b["state"])}


def finalize_two_pass(part: dict[str, Any], bkey: Any, lo: Any, hi: Any, levels: Any, be: Any) -> dict[str, Any]:
    """Per group of a merged two-pass partial: ``key``, ``n_windows``, ``weight``, ``mean``, exact
    ``quantiles`` and ``err_bound`` (0), as :func:`mixture_summary.finalize` gives them (host
    arrays); the quantiles resolved on backend ``be`` (:func:`resolve`)."""
    st = to_host(part["stats"])
    key = np.asarray(st["key"], dtype=np.int64)
    bkey = np.asarray(bkey)
    q = resolve(part["state"], {"key": bkey, "lo": np.asarray(lo), "hi": np.asarray(hi)}, levels, be)
    rows = np.clip(np.searchsorted(bkey, key), 0, max(bkey.shape[0] - 1, 0))
    if key.shape[0] and (bkey.shape[0] == 0 or not np.array_equal(bkey[rows], key)):
        raise RuntimeError("usage-distribution: a group the first pass did not see (internal error)")
    weight = np.asarray(st["weight"], dtype=np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):
        mean = np.where(weight > 0, np.asarray(st["wmean"]) / np.where(weight > 0, weight, 1.0), np.nan)
    return {
        "key": key,
        "n_windows": np.asarray(st["n_windows"]),
        "weight": weight,
        "mean": mean,
        "quantiles": q[rows] if key.shape[0] else np.zeros((0, q.shape[1])),
        "err_bound": np.zeros(key.shape[0]),
    }
