"""The refinement passes of ``usage-distribution``'s ``exact-two-pass`` strategy: each narrows the
open brackets of the pass before it to one sub-bin, so that the exact pass after them keeps far
fewer window pieces (:mod:`gpuclust.analyses._usage_distribution_two_pass` describes the passes).

A refinement pass reads the data as the exact pass does and, per open (group, level) pair with
bracket ``[lo, hi]``, cuts the bracket into ``S`` equal sub-bins ``(x_{k-1}, x_k]``
(``x_k = lo + k (hi - lo) / S``, ``x_S = hi``) and sums, over the group's windows with weight:

``f_lo``, ``f_lo_left``, ``f_hi``, ``s``, ``a_hi``
    the sums of the exact pass (:data:`~gpuclust.analyses._usage_distribution_two_pass.SUMS`);
``m``
    ``(pairs, S)``: the mass of each sub-bin from the windows with a knot strictly inside the
    bracket -- each of their pieces (a segment clipped to the bracket, or a point mass) adds its
    overlap with each sub-bin: its end sub-bins directly, the sub-bins it covers whole its density
    times their width (through a difference array of densities, whose summed densities are at most
    a piece's mass over a sub-bin's width: no cancellation of large terms);
``e``
    ``(pairs, S)``: the window knots in each sub-bin (the ends of those pieces inside the bracket).

All are sums: partials merge by adding per pair, and their size is ``(2S + 5) x 8`` bytes per open
pair, whatever the windows.  Then ``F(x_k) = f_lo + s (x_k - lo) + Σ_{i<=k} m_i`` (``F(hi)`` =
``f_hi``) and, with ``t = p W`` (``W`` the group's weight) and a tolerance ``τ W`` for rounding
(:data:`TOL`), the new bracket is ``[x_a, x_b]``: ``a`` the last grid point with
``F(x_a) < t - τW`` (else ``lo``), ``b`` the first with ``F(x_b) > t + τW`` (else ``hi``).  As
``Q(p) = inf{x : F(x) >= t}``, ``F(x_a) < t`` gives ``Q(p) > x_a`` and ``F(x_b) > t`` gives
``Q(p) <= x_b``: the new bracket holds the quantile (the exact pass checks it again, and a miss
raises).  Where ``F`` crosses ``t`` steeply it is one sub-bin; where ``F`` stays within ``τW`` of
``t`` (a plateau at ``t``) it keeps the whole plateau, whose left end the exact pass returns.  A
bracket narrower than :data:`MIN_REL_WIDTH` of its ends is kept as it is (its sub-bins would be a
few floats wide), and so is one whose sub-bins would have no float width.  The knots in
``[x_a, x_b]`` bound the exact pass's pieces there (``est`` of the new brackets table).

A pass cuts only while the brackets it reads are estimated to leave the exact pass more than
:data:`PIECE_BUDGET` pieces (:func:`bins_for`); otherwise it passes them on unchanged.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from gpuclust._xp import bincount
from gpuclust.analyses import _usage_distribution_two_pass as tp
from gpuclust.analyses.base import to_host
from gpuclust.backends import backend_of

__all__ = [
    "MAX_BINS",
    "MIN_BINS",
    "MIN_REL_WIDTH",
    "PIECE_BUDGET",
    "STATE_BYTES",
    "TOL",
    "bins_for",
    "empty_state",
    "merge_partials",
    "merge_state",
    "refine",
    "refine_partial",
    "refine_partial_of",
    "refined_table",
    "rounds_for",
]

#: Sub-bins per open pair: as many as :data:`STATE_BYTES` holds for the open pairs (16 bytes a
#: sub-bin: its mass and its knots), at most :data:`MAX_BINS`; a pass that would get fewer than
#: :data:`MIN_BINS` does not cut (a cut that small would not pay for its read of the data).
MIN_BINS = 8
MAX_BINS = 1024
STATE_BYTES = 1 << 26
#: Pieces the exact pass may keep (about 32 bytes each merged, a few times that in a merge's
#: temporaries): ``refine`` = -1 plans passes until the estimate is within it, and a pass cuts
#: only while its brackets' estimate is above it.
PIECE_BUDGET = 1 << 22
#: Pieces the exact pass keeps per window and level times ``bracket_k`` (measured by machine on
#: the canonical cells: 0.9-1.14 a window at 20 levels and ``bracket_k`` 4,096), and the factor a
#: refinement pass is assumed to cut them by: half the least measured at 64
#: sub-bins (canonical 10^6 windows: 68x by machine, 55x by tier; about 850x at 1,024).
PIECES_PER_WINDOW_LEVEL_K = 200.0
ASSUMED_CUT = 32.0
#: The most refinement passes ``refine`` = -1 plans (five cut a cell's estimate below the budget
#: at the assumed cut, whatever the grouping).
MAX_ROUNDS = 5
#: Rounding tolerance of the new brackets, relative to the group's weight.
TOL = 1e-7
#: Brackets narrower than this (relative to their largest end) are not cut.
MIN_REL_WIDTH = 1e-9
_SUMS = tp.SUMS
#: The ``(pairs, S)`` fields of a state: sub-bin masses and window knots.
_MATS = ("m", "e")


def rounds_for(total_rows: int, n_levels: int, k: int) -> int:
    """Refinement passes ``refine`` = -1 (auto) runs: the fewest after which the pieces the
    exact pass is estimated to keep (``rows x levels x`` :data:`PIECES_PER_WINDOW_LEVEL_K` ``/ k``,
    cut by :data:`ASSUMED_CUT` a pass) are within :data:`PIECE_BUDGET`."""
    est = float(total_rows) * n_levels * PIECES_PER_WINDOW_LEVEL_K / max(int(k), 1)
    r = 0
    while est > PIECE_BUDGET and r < MAX_ROUNDS:
        est /= ASSUMED_CUT
        r += 1
    return r


def bins_for(open_pairs: int, est_pieces: float) -> int:
    """Sub-bins per open pair of a refinement pass: :data:`STATE_BYTES` over the open pairs' 16
    bytes a sub-bin, at most :data:`MAX_BINS`; 0 (the pass does not cut) where the exact pass is
    estimated to keep at most :data:`PIECE_BUDGET` pieces or where that is under :data:`MIN_BINS`."""
    S = min(MAX_BINS, STATE_BYTES // (16 * max(int(open_pairs), 1)))
    return 0 if est_pieces <= PIECE_BUDGET or S < MIN_BINS else int(S)


def bracket_fields(table: Any, n_levels: int, cuts: bool = True) -> dict[str, Any]:
    """A pass's context fields from the brackets table ``table`` of the pass before it: the groups'
    keys, brackets and estimated pieces; with ``cuts``, the passes that cut them and this pass's
    sub-bins (:func:`bins_for`)."""
    (key, lo, hi), est = tp.brackets_of_table(table, n_levels), tp.estimate_of_table(table, n_levels)
    out: dict[str, Any] = dict(br_key=key, br_lo=lo, br_hi=hi, br_est=est)
    if cuts:
        out.update(refine=tp.cuts_of_table(table), refine_bins=bins_for(int((lo < hi).sum()), float(est.sum())))
    return out


def empty_state(xp: Any, S: int) -> dict[str, Any]:
    """The merge identity of a refinement state of ``S`` sub-bins."""
    return {
        "pid": xp.zeros(0, dtype=xp.int64),
        **{f: xp.zeros(0, dtype=xp.float64) for f in _SUMS},
        **{f: xp.zeros((0, S), dtype=xp.float64) for f in _MATS},
    }


def _cuttable(xp: Any, lo: Any, hi: Any, S: int) -> Any:
    """Brackets whose ``S`` sub-bins are cut: wider than :data:`MIN_REL_WIDTH` of their ends, and
    with sub-bins of a nonzero float width."""
    return ((hi - lo) > MIN_REL_WIDTH * xp.maximum(xp.abs(lo), xp.abs(hi))) & ((hi - lo) / S > 0)


def _grid(xp: Any, lo: Any, hi: Any, k: Any, S: int) -> Any:
    """``x_k`` (``k`` in 0..S) of brackets ``lo``, ``hi``: monotone in ``k``, ``x_0 = lo``, ``x_S = hi``."""
    return xp.where(k >= S, hi, lo + k * ((hi - lo) / S))


def _bin(xp: Any, y: Any, lo: Any, hi: Any, S: int, right: bool) -> Any:
    """The sub-bin ``k`` in 1..S holding ``y``: ``x_{k-1} < y <= x_k`` (``right``) or
    ``x_{k-1} <= y < x_k``: computed, then set against the grid (the quotient is off by at most
    one sub-bin for brackets wider than :data:`MIN_REL_WIDTH`)."""
    u = (y - lo) / ((hi - lo) / S)
    k = xp.clip((xp.ceil(u) if right else xp.floor(u) + 1).astype(xp.int64), 1, S)
    for _ in range(2):
        x_hi, x_lo = _grid(xp, lo, hi, k, S), _grid(xp, lo, hi, k - 1, S)
        up = (y > x_hi) if right else (y >= x_hi)
        down = (y <= x_lo) if right else (y < x_lo)
        k = xp.clip(k + up.astype(xp.int64) - down.astype(xp.int64), 1, S)
    return k


def _bin_masses(xp: Any, prun: Any, pa: Any, pb: Any, pm: Any, rlo: Any, rhi: Any, S: int) -> tuple[Any, Any]:
    """``(n, S)`` twice: the masses in each run's sub-bins of pieces ``(pa, pb, pm)`` of runs
    ``prun`` (a run's bracket: ``rlo``, ``rhi``, ``n`` runs), and the piece ends inside the
    bracket in each (window knots: a start in the sub-bin it opens, an end in the one it closes)."""
    n = int(rlo.shape[0])
    lo, hi = rlo[prun], rhi[prun]
    point = pa == pb
    ib = _bin(xp, pb, lo, hi, S, True)
    ia = xp.where(point, ib, _bin(xp, pa, lo, hi, S, False))
    one = ia == ib
    d = pm / xp.where(one, 1.0, pb - pa)
    end_a = xp.where(one, pm, d * (_grid(xp, lo, hi, ia, S) - pa))
    end_b = xp.where(one, 0.0, d * (pb - _grid(xp, lo, hi, ib - 1, S)))
    base = prun * S - 1  # sub-bin k of run r: r * S + k - 1
    codes = xp.concatenate([base + ia, base + ib])
    m = bincount(xp, codes, weights=xp.concatenate([end_a, end_b]), minlength=n * S).reshape(n, S)
    knots = xp.concatenate([pa > lo, pb < hi]).astype(xp.float64)
    e = bincount(xp, codes, weights=knots, minlength=n * S).reshape(n, S)
    inner = xp.flatnonzero(ib > ia + 1)  # sub-bins ia+1 .. ib-1 covered whole: density d
    if int(inner.shape[0]):
        bi, di = base[inner], d[inner]
        codes = xp.concatenate([bi + ia[inner] + 1, bi + ib[inner]])
        dd = bincount(xp, codes, weights=xp.concatenate([di, -di]), minlength=n * S).reshape(n, S)
        width = xp.diff(_grid(xp, rlo[:, None], rhi[:, None], xp.arange(S + 1, dtype=xp.int64)[None, :], S), axis=1)
        m = m + xp.cumsum(dd, axis=1) * width
    return m, e


def refine_partial(
    xp: Any, ops: Any, qr: Any, w: Any, key: Any, br: dict[str, Any], S: int, rows: int | None = None
) -> dict[str, Any]:
    """The refinement state of one partition (the arguments of
    :func:`~gpuclust.analyses._usage_distribution_two_pass.second_partial`; ``S`` sub-bins)."""
    lo_f, hi_f = br["lo"].reshape(-1), br["hi"].reshape(-1)
    pids: list[Any] = []
    sums: list[list[Any]] = [[] for _ in _SUMS]
    mats: list[list[Any]] = [[] for _ in _MATS]
    on_host = ops.lookup_block_rows is not None
    for pid, run, vals, pcs in tp.level_steps(xp, qr, w, key, br, rows or tp.BLOCK_ROWS, beside=on_host):
        n = int(pid.shape[0])
        pids.append(pid)
        for acc, v in zip(sums, vals, strict=True):
            acc.append(bincount(xp, run, weights=v, minlength=n, bounded=True))
        if pcs is None:
            for acc in mats:
                acc.append(xp.zeros((n, S), dtype=xp.float64))
            continue
        rlo, rhi = lo_f[pid], hi_f[pid]
        wide = _cuttable(xp, rlo, rhi, S)
        prun = xp.searchsorted(pid, pcs[0])
        keep = xp.flatnonzero(wide[prun])
        pa, pb, pm = (v[keep] for v in pcs[1:])
        for acc, v in zip(mats, _bin_masses(xp, prun[keep], pa, pb, pm, rlo, rhi, S), strict=True):
            acc.append(v)
    if not pids:
        return empty_state(xp, S)
    cat = {f: xp.concatenate(v) for f, v in zip(_MATS, mats, strict=True)}
    return tp._pair_sums(xp, ops, xp.concatenate(pids), [xp.concatenate(v) for v in sums], cat)


def merge_state(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    """Two refinement states merged: every field added per pair."""
    be = backend_of(a["pid"])
    xp = be.xp
    if a["pid"].shape == b["pid"].shape and bool((a["pid"] == b["pid"]).all()):  # the same pairs (the usual case)
        return {"pid": a["pid"], **{f: a[f] + b[f] for f in (*_SUMS, *_MATS)}}
    cat = {f: xp.concatenate([a[f], b[f]]) for f in ("pid", *_SUMS, *_MATS)}
    return tp._pair_sums(xp, be.ops, cat["pid"], [cat[f] for f in _SUMS], {f: cat[f] for f in _MATS})


def refine(state: dict[str, Any], br: dict[str, np.ndarray], levels: Any) -> dict[str, np.ndarray]:
    """The narrowed brackets (host, ``key``, ``lo``, ``hi``, ``est``: ``(G, L)``) of the groups
    of ``br`` (host brackets, with their estimated pieces ``est``) from a merged refinement
    state: each open pair's ``[x_a, x_b]`` (module docstring), its estimate the window knots
    inside it (an upper bound of the exact pass's pieces); closed pairs, and brackets too narrow
    to cut, as they were."""
    st = {f: np.asarray(to_host(v)) for f, v in state.items()}
    lv = np.asarray(levels, dtype=np.float64).reshape(-1)
    lo, hi = np.array(br["lo"], dtype=np.float64), np.array(br["hi"], dtype=np.float64)
    est = np.array(br["est"], dtype=np.float64)
    L = int(lv.shape[0])
    pid = st["pid"].astype(np.int64)
    if not np.array_equal(pid, np.flatnonzero((lo < hi).reshape(-1))):
        raise RuntimeError("usage-distribution: refinement pairs differ from the open brackets (internal error)")
    if not pid.shape[0]:
        return {"key": br["key"], "lo": lo, "hi": hi, "est": est}
    S = int(st["m"].shape[1])
    g, j = pid // L, pid % L
    a, b = lo[g, j], hi[g, j]
    f_lo, f_lo_left, f_hi, s, a_hi = (st[f] for f in _SUMS)
    m = st["m"]
    total = f_lo + s * (b - a) + m.sum(axis=1) + a_hi
    t = lv[j] * total
    tp.check_brackets_hold(np, f_lo_left, f_hi, t, total)
    x = _grid(np, a[:, None], b[:, None], np.arange(S + 1)[None, :], S)
    F = np.empty((pid.shape[0], S + 1))
    F[:, 0] = f_lo
    F[:, 1:] = f_lo[:, None] + s[:, None] * (x[:, 1:] - a[:, None]) + np.cumsum(m, axis=1)
    F[:, S] = f_hi
    F = np.maximum.accumulate(F, axis=1)
    tol = TOL * total
    below = (F < (t - tol)[:, None]).sum(axis=1)  # a prefix of the grid (F is monotone)
    above = (F > (t + tol)[:, None]).sum(axis=1)  # a suffix
    ia = np.maximum(below - 1, 0)
    ib = np.where(above > 0, S + 1 - above, S)
    wide = _cuttable(np, a, b, S)
    rows = np.arange(pid.shape[0])
    lo[g, j] = np.where(wide, x[rows, ia], a)
    hi[g, j] = np.where(wide, x[rows, ib], b)
    # each knot strictly inside ends one piece and starts the next: ends >= 2 x knots >= pieces
    E = np.concatenate([np.zeros((pid.shape[0], 1)), np.cumsum(st["e"], axis=1)], axis=1)
    est[g, j] = np.where(wide, E[rows, ib] - E[rows, ia], est[g, j])
    return {"key": br["key"], "lo": lo, "hi": hi, "est": np.where(lo < hi, est, 0.0)}


def refine_partial_of(be: Any, qr: Any, w: Any, key: Any, bkey: Any, lo: Any, hi: Any, S: int) -> dict[str, Any]:
    """A partition's refinement state on backend ``be`` (brackets ``bkey``, ``lo``, ``hi`` from
    the context, staged once)."""
    br = {"key": be.stage(bkey), "lo": be.stage(lo), "hi": be.stage(hi)}
    return refine_partial(be.xp, be.ops, qr, w.astype(be.xp.float64), key, br, S, tp.step_rows(be))


def merge_partials(a: dict[str, Any], b: dict[str, Any], merge_rest: Any) -> dict[str, Any]:
    """Two refinement-pass partials merged: group extras and counters by ``merge_rest`` (the
    analysis' merge), the refinement states (``rf``; none in the empty partial) by :func:`merge_state`."""
    out = merge_rest({**a, "rf": None}, {**b, "rf": None})
    ra, rb = a.get("rf"), b.get("rf")
    out["rf"] = rb if ra is None else ra if rb is None else merge_state(ra, rb)
    return out


def refined_table(state: dict[str, Any] | None, ctx: Any) -> Any:
    """A refinement pass's result: the brackets of the pass before it (its context ``ctx``:
    ``br_key``, ``br_lo``, ``br_hi``, ``br_est``, after ``refine`` cutting passes) narrowed by the
    merged ``state`` (None: this pass did not cut, :func:`bins_for`; the brackets as they were)."""
    br = {"key": ctx.br_key, "lo": ctx.br_lo, "hi": ctx.br_hi, "est": ctx.br_est}
    if state is None:
        return tp.brackets_table(br, cuts=ctx.refine)
    return tp.brackets_table(refine(state, br, ctx.levels), cuts=ctx.refine + 1)
