"""The peak-prediction simulation of one shard of machines, vectorised array code (no Python loop
per machine or step) that runs on either backend: ``peak-prediction``'s ``finalize_shard`` calls
:func:`simulate` on the backend its partials were computed on (the gpu under ``backend="gpu"``,
where this simulation is most of the analysis' work).  What differs by backend goes through
``backend.ops`` (``run_max``, ``repeat_index``, ``stable_argsort``) and :data:`CHUNK_CELLS`.

Input: one row per usage sample (machine code, 5-minute step, instance key, usage, limit),
in any order and with repeats.  Output: per *snapshot* (a machine at a step where it has a
sample) the limit, capped usage, the oracle and every predictor (docs/analyses/peak-prediction.md).

How it stays vectorised:

* **snapshots** are the distinct (machine, step) keys, numbered in key order; an instance's *run*
  on a machine is a stretch of consecutive snapshots of that machine (the machine's snapshot
  sequence, not its steps) in which it is present; a row's run position ``j`` (1, 2, ...) is its
  sample count in the simulator's state (the forget rule: a snapshot without the instance ends
  the run) and its k-th previous sample is the row ``k`` places earlier in (machine, instance,
  snapshot) order;
* the **ratio series** of N-sigma and the per-machine percentile, ``r_k = sum u(t-k) / sum L(t-k)``
  over warm instances, is one ``bincount`` per ``k``; the **per-instance percentile** sorts a
  (rows x history) matrix a chunk of rows at a time;
* the **oracle** ``S(t, s) = sum over instances present at t and s of min(u(s), L(t))`` for every
  future snapshot ``s`` of ``t`` is built without enumerating (t, s, instance) triples: an
  instance's presence splits into *pieces* (contiguous presence with one limit); a sample at
  ``s`` adds the same value to ``S(t, s)`` for every ``t`` of a piece within the horizon before
  ``s``, an interval of ``t``: a difference array over ``e = s - t`` per row ``s``.  Work is
  O(samples x pieces they reach + snapshots x horizon), memory a chunk of snapshots x horizon.
* the **walks** over bounded working matrices (the oracle's chunks of snapshots, the
  per-instance percentile's blocks of rows) are a fixed handful of operations a chunk and no
  host read: whatever is per row or per snapshot is computed once, before or after the walk, and
  the chunks' bounds are read in one sync (on a device, a chunk's cost is its launches).

The arithmetic is the same on both backends; only the order of floating-point additions in
``bincount`` differs (atomics on the GPU), so the backends agree to rounding.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from gpuclust._xp import bincount
from gpuclust.keys import pack, unpack

__all__ = ["CHUNK_CELLS", "SimParams", "percentile_rows", "simulate"]

#: Cells of a (rows x history) or (snapshots x horizon) matrix built at once, per backend: cache
#: sized on the host; on a device large enough that each step is a few big launches (a few
#: hundred MB of temporaries per shard).
CHUNK_CELLS = {"cpu": 1 << 20, "gpu": 1 << 23}


@dataclass(frozen=True)
class SimParams:
    """The simulation's parameters (the analysis' options, checked there)."""

    horizon_steps: int = 288
    oracle_percentile: float = 100.0
    cap_to_limit: bool = True
    min_samples: int = 24
    borg_fraction: float = 0.9
    n_sigma: float = 5.0
    n_sigma_history: int = 24
    instance_percentile: float = 99.0
    instance_history: int = 120
    machine_percentile: float = 100.0
    machine_history: int = 24
    combine: tuple[str, ...] = ("n_sigma", "instance_percentile")


def percentile_rows(xp: Any, sorted_rows: Any, n: Any, p: float) -> Any:
    """Per row, ``numpy.percentile(row[:n], p)`` (linear) of a row-sorted matrix whose first ``n``
    entries are the values (``n >= 1``); the same interpolation formula as NumPy's."""
    h = (n - 1) * (p / 100.0)
    lo = xp.floor(h).astype(xp.int64)
    hi = xp.minimum(lo + 1, n - 1)
    t = h - lo
    r = xp.arange(sorted_rows.shape[0])
    a, b = sorted_rows[r, lo], sorted_rows[r, hi]
    with np.errstate(invalid="ignore"):  # rows without values (all inf) are masked by the caller
        d = b - a
        out = a + d * t
        big = t >= 0.5
        out[big] = (b - d * (1 - t))[big]
        return xp.where(d == 0, a, out)


def _order_stats(xp: Any, n: Any, p: float) -> tuple[Any, Any, Any]:
    """:func:`percentile_rows`' interpolation for rows of ``n`` values, worked out before the rows
    are sorted: per row the positions ``(lo, hi)`` of the two order statistics it takes (an
    ``(rows, 2)`` array), whether it counts from ``hi`` (``t >= 0.5``) and the weight of their
    difference; :func:`_interpolate` finishes it."""
    h = (n - 1) * (p / 100.0)
    lo = xp.floor(h).astype(xp.int64)
    hi = xp.minimum(lo + 1, n - 1)
    t = h - lo
    big = t >= 0.5
    return xp.stack([lo, hi], axis=1), big, xp.where(big, -(1 - t), t)


def _interpolate(xp: Any, ab: Any, big: Any, coef: Any) -> Any:
    """:func:`percentile_rows`' result from the two order statistics ``ab`` of each row and
    :func:`_order_stats`' ``big`` and ``coef``: ``a + (b - a) t``, or ``b - (b - a)(1 - t)`` for
    ``t >= 0.5``, the same bits (``x - y`` is ``x + -y``); where ``a == b`` that is ``a`` again for
    finite values (up to the sign of a zero), as its ``d == 0`` case."""
    a, b = ab[:, 0], ab[:, 1]
    with np.errstate(invalid="ignore"):  # rows without values (all inf) are masked by the caller
        return xp.where(big, b, a) + (b - a) * coef


def _run_first(xp: Any, new: Any) -> Any:
    """Per row, the index of the first row of its run (``new``: where runs begin, ``new[0]``)."""
    return xp.flatnonzero(new)[xp.cumsum(new) - 1]


def _runs(xp: Any, code: Any, inst: Any, g: Any, lim: Any, cap: bool) -> tuple[Any, Any, Any, Any]:
    """Order of the rows by (machine, instance, snapshot); in that order each row's run position
    (1-based), its group (machine, instance) id and its piece id (a run with one limit)."""
    order = xp.lexsort(xp.stack([g, inst, code]))
    c, i, gg, L = code[order], inst[order], g[order], lim[order]
    n = order.shape[0]
    new_grp = xp.ones(n, dtype=bool)
    new_grp[1:] = (c[1:] != c[:-1]) | (i[1:] != i[:-1])
    new_run = new_grp.copy()
    new_run[1:] |= gg[1:] != gg[:-1] + 1
    new_piece = new_run.copy()
    if cap:
        new_piece[1:] |= L[1:] != L[:-1]
    idx = xp.arange(n)
    j = idx - _run_first(xp, new_run) + 1
    return order, j, xp.cumsum(new_grp) - 1, xp.cumsum(new_piece) - 1


def _ratio_series(xp: Any, gI: Any, warm: Any, j: Any, uc: Any, L: Any, H: int, NS: int) -> tuple[Any, Any]:
    """``(r, nk)``: per snapshot the ratio ``r_k`` for k < H (valid for ``k < nk``) over its warm
    instances' k-th previous samples."""
    r = xp.zeros((NS, H))
    nk = xp.zeros(NS, xp.int64)
    w = xp.flatnonzero(warm)
    for k in range(H):
        w = w[j[w] > k]
        if not w.shape[0]:
            break
        gw = gI[w]
        su = bincount(xp, gw, uc[w - k], NS)
        sl = bincount(xp, gw, L[w - k], NS)
        has = bincount(xp, gw, None, NS) > 0
        nk += has
        with np.errstate(invalid="ignore", divide="ignore"):
            r[:, k] = xp.where(sl > 0, su / xp.where(sl > 0, sl, 1.0), 0.0)
    return r, nk


def _instance_percentile(
    be: Any, cells: int, gI: Any, warm: Any, j: Any, ratio: Any, L: Any, H: int, p: float, NS: int
) -> Any:
    """Per snapshot the sum over warm instances of percentile p of their last H ratios x limit.

    A block of warm rows at a time (``cells`` matrix cells), each block a fixed handful of
    operations (gather, mask, sort, gather of the two order statistics): a row's ratios are the H
    ending at it (those before its run: +inf), and everything else per row (:func:`_order_stats`,
    :func:`_interpolate`, the limit) is computed once, over every row, before or after the walk.
    The sums per snapshot: on the cpu a ``bincount`` per block, added in turn; on a device, whose
    ``bincount`` adds in no set order anyway, one ``bincount`` over every row."""
    xp = be.xp
    out = xp.zeros(NS)
    w = xp.flatnonzero(warm)
    nw = w.shape[0]
    if not nw:
        return out
    n = xp.minimum(j[w], H)
    take, big, coef = _order_stats(xp, n, p)
    first = H - n  # window positions before the run
    pad = xp.concatenate([xp.zeros(H - 1), ratio])  # row i's ratios i-H+1..i: pad[i : i + H]
    pos = xp.arange(H)[None, :]
    step = max(1, cells // H)
    rows = xp.arange(min(step, nw))[:, None]
    ab = xp.empty((nw, 2))  # per row its two order statistics
    for a in range(0, nw, step):
        b = min(nw, a + step)
        mat = xp.where(pos >= first[a:b, None], pad[w[a:b, None] + pos], np.inf)
        mat.sort(axis=1)
        ab[a:b] = mat[rows[: b - a], take[a:b]]
        del mat  # before the next block's is made
    v = _interpolate(xp, ab, big, coef) * L[w]
    if be.name != "cpu":
        return bincount(xp, gI[w], v, NS)
    for a in range(0, nw, step):  # the reference's order of additions
        out += bincount(xp, gI[w[a : a + step]], v[a : a + step], NS)
    return out


def _oracle(
    be: Any,
    snap_key: Any,
    mfirst: Any,
    mend: Any,
    gI: Any,
    uI: Any,
    LI: Any,
    grp: Any,
    piece: Any,
    limit: Any,
    todo: Any,
    E: int,
    p: float,
    cap: bool,
) -> Any:
    """Per snapshot the oracle peak (NaN where ``todo`` is false)."""
    xp = be.xp
    NS = snap_key.shape[0]
    out = xp.full(NS, np.nan)
    tids = xp.flatnonzero(todo)
    if not tids.shape[0]:
        return out
    s, kk, ww = _difference_rows(be, snap_key, mfirst, gI, uI, LI, grp, piece, E, cap)
    hi = xp.minimum(mend, xp.searchsorted(snap_key, snap_key + E, side="right")) - 1
    nf = (hi - xp.arange(NS))[tids]
    out[tids] = xp.where(nf > 0, _future_peaks(be, NS, s, kk, ww, tids, nf, E, p), limit[tids])
    return out


def _chunk(be: Any, E: int) -> tuple[int, int]:
    """The oracle's chunk: its snapshots ``C`` and half its bins, ``(C + E) x (E + 2)``."""
    C = max(E, CHUNK_CELLS[be.name] // (E + 2))
    return C, (C + E) * (E + 2)


def _difference_rows(
    be: Any, snap_key: Any, mfirst: Any, gI: Any, uI: Any, LI: Any, grp: Any, piece: Any, E: int, cap: bool
) -> tuple[Any, Any, Any]:
    """The oracle's difference entries, a pair per (sample s, piece it reaches), in ``s`` order:
    ``s``, and interleaved the two entries' bins (``s (E + 3) - t1`` and, in the second half of a
    chunk's bins, ``s (E + 3) - t0 + 1``: less the chunk's first snapshot x ``(E + 2)``, a cell of
    the chunk's matrix of rows ``s`` and columns ``e = s - t``) and values (``val`` twice: the
    first added, the second subtracted)."""
    xp = be.xp
    NS = snap_key.shape[0]
    # pieces: first / last snapshot and limit
    n_rows = piece.shape[0]
    starts = xp.flatnonzero(xp.concatenate([xp.ones(1, dtype=bool), piece[1:] != piece[:-1]]))
    ends = xp.concatenate([starts[1:], xp.full(1, n_rows, dtype=starts.dtype)]) - 1
    pa, pb, pL, pgrp = gI[starts], gI[ends], LI[starts], grp[starts]
    pkey = pgrp * NS + pb
    # each sample s reaches the pieces of its (machine, instance) ending at or after lo(s)
    lo = xp.maximum(mfirst[gI], xp.searchsorted(snap_key, snap_key[gI] - E, side="left"))
    q = xp.searchsorted(pkey, grp * NS + lo, side="left")
    cnt = piece - q + 1
    row = be.ops.repeat_index(cnt)
    pp = (q - xp.cumsum(cnt) + cnt)[row] + xp.arange(row.shape[0])
    s = gI[row]
    t0 = xp.maximum(pa[pp], lo[row])
    t1 = xp.minimum(pb[pp], s - 1)
    ok = t0 <= t1
    row, pp, s, t0, t1 = row[ok], pp[ok], s[ok], t0[ok], t1[ok]
    val = xp.minimum(uI[row], pL[pp]) if cap else uI[row]
    order = be.ops.stable_argsort(s)
    s, t0, t1, val = s[order], t0[order], t1[order], val[order]
    del row, pp, order
    sk = s * (E + 3)
    half = _chunk(be, E)[1]
    return s, xp.stack([sk - t1, sk - t0 + 1 + half], axis=1).reshape(-1), xp.stack([val, val], axis=1).reshape(-1)


def _future_peaks(be: Any, NS: int, s: Any, kk: Any, ww: Any, tids: Any, nf: Any, E: int, p: float) -> Any:
    """Per snapshot ``t`` of ``tids`` the oracle over its ``nf`` future snapshots (``nf >= 1``;
    else any value): the maximum or percentile ``p`` of ``S(t, s)`` from the difference entries
    of :func:`_difference_rows`."""
    xp = be.xp
    # Chunks of C snapshots t (the matrix of a chunk: its rows s from its first t to E past its
    # last), their bounds in ``tids`` and in the rows read in one sync.  A chunk is a fixed handful
    # of operations, whatever is per row computed once before: one bincount of the rows' +val and
    # -val entries (interleaved; the -val ones to the second half of the bins), the halves'
    # difference and its cumsum over e = s - t, a gather of each t's future sums, their maximum
    # (or the two order statistics of the percentile, interpolated after the walk).
    C, half = _chunk(be, E)
    K = -(-NS // C)
    cb = xp.arange(0, (K + 1) * C, C)
    bounds = be.to_host(xp.concatenate([xp.searchsorted(tids, cb), xp.searchsorted(s, cb), xp.searchsorted(s, cb + E)]))
    tb, xb, yb = (bounds[i * (K + 1) : (i + 1) * (K + 1)].tolist() for i in range(3))
    # a t's sum at e, M[t - c0 + e, e], at t's row base + e (E + 3) of the flattened matrix
    base = (tids % C) * (E + 2)
    es = xp.arange(1, E + 1)[None, :]
    es3 = es * (E + 3)
    if p >= 100.0:
        res = xp.empty(tids.shape[0])
        nf3 = nf * (E + 3)
    else:  # per t the two order statistics of its future sums
        take, big, coef = _order_stats(xp, xp.maximum(nf, 1), p)
        res = xp.empty((tids.shape[0], 2))
        rows = xp.arange(C)[:, None]
    for k in range(K):
        a, b = tb[k], tb[k + 1]
        if a == b:
            continue
        x, y = 2 * xb[k], 2 * yb[k + 1]
        # (each temporary freed as soon as done with, so that the next one reuses its memory)
        B = bincount(xp, kk[x:y] - k * C * (E + 2), ww[x:y], 2 * half).reshape(2, C + E, E + 2)
        M = xp.cumsum(xp.subtract(B[0], B[1], out=B[0]), axis=1)
        del B
        if p >= 100.0:
            # the max over e <= n of the future sums: past n, the n-th again (no mask needed)
            at = base[a:b, None] + xp.minimum(es3, nf3[a:b, None])
            xp.take(M, at).max(axis=1, out=res[a:b])
            del at, M
        else:
            mat = xp.where(es <= nf[a:b, None], xp.take(M, base[a:b, None] + es3), np.inf)
            del M
            mat.sort(axis=1)
            res[a:b] = mat[rows[: b - a], take[a:b]]
            del mat
    return _interpolate(xp, res, big, coef) if p < 100.0 else res


def _empty(xp: Any) -> dict[str, Any]:
    z = xp.zeros(0)
    return {
        "code": xp.zeros(0, xp.int64),
        "step": xp.zeros(0, xp.int64),
        "instances": xp.zeros(0, xp.int64),
        "limit": z,
        "total_usage": z,
        "oracle": z,
        **{p: z for p in ("borg_default", "n_sigma", "instance_percentile", "machine_percentile", "max_of", "avg_of")},
    }


def _instance_rows(be: Any, code: Any, step: Any, inst: Any, usage: Any, lim: Any, span: int) -> tuple[Any, ...]:
    """One row per (machine, step, instance), in (key, instance) order: its key (machine code and
    step packed), instance, and the max of usage and of limit over its windows."""
    xp, ops = be.xp, be.ops
    key = pack(code.astype(xp.int64), step, span)
    o = xp.lexsort(xp.stack([inst, key]))
    key, inst, usage, lim = key[o], inst[o], usage[o], lim[o]
    n = key.shape[0]
    first = xp.ones(n, dtype=bool)
    first[1:] = (key[1:] != key[:-1]) | (inst[1:] != inst[:-1])
    at = xp.flatnonzero(first)
    usage, lim = ops.run_max(usage, at), ops.run_max(lim, at)
    return key[at], inst[at], usage, lim


def _snapshots(xp: Any, key: Any, span: int) -> tuple[Any, ...]:
    """The snapshots of rows in ``key`` order: each row's snapshot number, the snapshots' keys,
    machine codes and steps, and per snapshot its machine's first snapshot and the end of its
    machine's snapshots."""
    nr = key.shape[0]
    snap_first = xp.ones(nr, dtype=bool)
    snap_first[1:] = key[1:] != key[:-1]
    g = xp.cumsum(snap_first) - 1
    snap_key = key[snap_first]
    NS = snap_key.shape[0]
    scode, sstep = unpack(snap_key, span)
    mnew = xp.ones(NS, dtype=bool)
    mnew[1:] = scode[1:] != scode[:-1]
    mfirst = _run_first(xp, mnew)
    mstarts = xp.flatnonzero(mnew)
    mend = xp.concatenate([mstarts[1:], xp.full(1, NS, dtype=mstarts.dtype)])[xp.cumsum(mnew) - 1]
    return g, snap_key, scode, sstep, mfirst, mend


def _ratio_predictions(
    xp: Any, gI: Any, warm: Any, j: Any, uc: Any, LI: Any, warm_limit: Any, cold: Any, prm: SimParams, NS: int
) -> dict[str, Any]:
    """The ``n_sigma`` and ``machine_percentile`` predictions, from the series of the warm
    instances' usage over their limits (``cold``: the cold instances' limits, added)."""
    r, nk = _ratio_series(xp, gI, warm, j, uc, LI, prm.n_sigma_history, NS)
    ks = xp.arange(prm.n_sigma_history)[None, :]
    valid = ks < nk[:, None]
    cnt = xp.maximum(nk, 1)
    mean = xp.where(valid, r, 0.0).sum(1) / cnt
    dev = xp.where(valid, r - mean[:, None], 0.0)
    sd = xp.sqrt((dev * dev).sum(1) / xp.maximum(nk - 1, 1))
    ns = xp.where(nk > 0, xp.minimum(1.0, mean + prm.n_sigma * sd) * warm_limit, 0.0)
    out = {"n_sigma": ns + cold}
    if prm.machine_history != prm.n_sigma_history:
        r, nk = _ratio_series(xp, gI, warm, j, uc, LI, prm.machine_history, NS)
    ks = xp.arange(r.shape[1])[None, :]
    mat = xp.where(ks < nk[:, None], r, np.inf)
    mat.sort(axis=1)
    mp = xp.minimum(1.0, percentile_rows(xp, mat, xp.maximum(nk, 1), prm.machine_percentile))
    out["machine_percentile"] = xp.where(nk > 0, mp * warm_limit, 0.0) + cold
    return out


def _predictions(be: Any, gI: Any, uI: Any, LI: Any, j: Any, limit: Any, prm: SimParams, NS: int) -> dict[str, Any]:
    """Every predictor's limit per snapshot, of the rows in run order (``gI`` snapshot, ``uI``
    usage, ``LI`` limit, ``j`` run position; ``limit`` per snapshot)."""
    xp = be.xp
    warm = j >= max(prm.min_samples, 2)
    cold = bincount(xp, gI[~warm], LI[~warm], NS)
    warm_limit = bincount(xp, gI[warm], LI[warm], NS)
    uc = xp.minimum(uI, LI) if prm.cap_to_limit else uI
    preds: dict[str, Any] = {
        "borg_default": prm.borg_fraction * limit,
        **_ratio_predictions(xp, gI, warm, j, uc, LI, warm_limit, cold, prm, NS),
    }
    with np.errstate(invalid="ignore", divide="ignore"):
        ratio = uI / LI
    if prm.cap_to_limit:
        ratio = xp.minimum(ratio, 1.0)
    preds["instance_percentile"] = (
        _instance_percentile(
            be, CHUNK_CELLS[be.name], gI, warm, j, ratio, LI, prm.instance_history, prm.instance_percentile, NS
        )
        + cold
    )
    sub = xp.stack([preds[c] for c in prm.combine]) if prm.combine else xp.zeros((1, NS))
    preds["max_of"], preds["avg_of"] = sub.max(0), sub.mean(0)
    return preds


def simulate(
    be: Any, code: Any, step: Any, inst: Any, usage: Any, lim: Any, span: int, last_step: int, prm: SimParams
) -> dict[str, Any]:
    """The per-snapshot table of one shard (arrays on backend ``be``, as the inputs; in (machine
    code, step) order): ``code``, ``step``, ``instances``, ``limit``, ``total_usage``, ``oracle``
    (NaN: censored) and one array per predictor (``borg_default``, ``n_sigma``,
    ``instance_percentile``, ``machine_percentile``, ``max_of``, ``avg_of``)."""
    xp = be.xp
    if not code.shape[0]:
        return _empty(xp)
    key, inst, usage, lim = _instance_rows(be, code, step, inst, usage, lim, span)
    g, snap_key, scode, sstep, mfirst, mend = _snapshots(xp, key, span)
    NS = snap_key.shape[0]
    out: dict[str, Any] = {
        "code": scode,
        "step": sstep,
        "instances": bincount(xp, g, None, NS),
        "limit": bincount(xp, g, lim, NS),
        "total_usage": bincount(xp, g, xp.minimum(usage, lim), NS),
    }
    rcode = unpack(key, span)[0]
    order, j, grp, piece = _runs(xp, rcode, inst, g, lim, prm.cap_to_limit)
    gI, uI, LI = g[order], usage[order], lim[order]
    preds = _predictions(be, gI, uI, LI, j, out["limit"], prm, NS)
    todo = sstep + prm.horizon_steps <= last_step
    out["oracle"] = _oracle(
        be,
        snap_key,
        mfirst,
        mend,
        gI,
        uI,
        LI,
        grp,
        piece,
        out["limit"],
        todo,
        prm.horizon_steps,
        prm.oracle_percentile,
        prm.cap_to_limit,
    )
    out.update(preds)
    return out
