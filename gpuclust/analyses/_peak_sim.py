"""The peak-prediction simulation of one shard of machines, vectorised with NumPy (no Python loop
per machine or step): ``peak-prediction``'s ``finalize_shard`` calls :func:`simulate`.

Input: one row per usage sample (machine code, 5-minute step, instance key, usage, limit),
in any order and with repeats.  Output: per *snapshot* (a machine at a step where it has a
sample) the limit, capped usage, the oracle and every predictor (docs/analysis-peak-prediction.md).

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
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = ["SimParams", "percentile_rows", "simulate"]

#: Cells of a (rows x history) or (snapshots x horizon) matrix built at once.
CHUNK_CELLS = 1 << 20


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


def percentile_rows(sorted_rows: np.ndarray, n: np.ndarray, p: float) -> np.ndarray:
    """Per row, ``numpy.percentile(row[:n], p)`` (linear) of a row-sorted matrix whose first ``n``
    entries are the values (``n >= 1``); the same interpolation formula as NumPy's."""
    h = (n - 1) * (p / 100.0)
    lo = np.floor(h).astype(np.int64)
    hi = np.minimum(lo + 1, n - 1)
    t = h - lo
    r = np.arange(sorted_rows.shape[0])
    a, b = sorted_rows[r, lo], sorted_rows[r, hi]
    with np.errstate(invalid="ignore"):  # rows without values (all inf) are masked by the caller
        d = b - a
        out = a + d * t
        big = t >= 0.5
        out[big] = (b - d * (1 - t))[big]
        return np.where(d == 0, a, out)


def _runs(code: np.ndarray, inst: np.ndarray, g: np.ndarray, lim: np.ndarray,
          cap: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Order of the rows by (machine, instance, snapshot); in that order each row's run position
    (1-based), its group (machine, instance) id and its piece id (a run with one limit)."""
    order = np.lexsort((g, inst, code))
    c, i, gg, L = code[order], inst[order], g[order], lim[order]
    n = order.shape[0]
    new_grp = np.ones(n, dtype=bool)
    new_grp[1:] = (c[1:] != c[:-1]) | (i[1:] != i[:-1])
    new_run = new_grp.copy()
    new_run[1:] |= gg[1:] != gg[:-1] + 1
    new_piece = new_run.copy()
    if cap:
        new_piece[1:] |= L[1:] != L[:-1]
    idx = np.arange(n)
    run_first = np.maximum.accumulate(np.where(new_run, idx, 0))
    j = idx - run_first + 1
    return order, j, np.cumsum(new_grp) - 1, np.cumsum(new_piece) - 1


def _ratio_series(gI: np.ndarray, warm: np.ndarray, j: np.ndarray, uc: np.ndarray, L: np.ndarray, H: int,
                  NS: int) -> tuple[np.ndarray, np.ndarray]:
    """``(r, nk)``: per snapshot the ratio ``r_k`` for k < H (valid for ``k < nk``) over its warm
    instances' k-th previous samples."""
    r = np.zeros((NS, H))
    nk = np.zeros(NS, np.int64)
    w = np.flatnonzero(warm)
    for k in range(H):
        w = w[j[w] > k]
        if not w.shape[0]:
            break
        gw = gI[w]
        su = np.bincount(gw, weights=uc[w - k], minlength=NS)
        sl = np.bincount(gw, weights=L[w - k], minlength=NS)
        has = np.bincount(gw, minlength=NS) > 0
        nk += has
        with np.errstate(invalid="ignore", divide="ignore"):
            r[:, k] = np.where(sl > 0, su / np.where(sl > 0, sl, 1.0), 0.0)
    return r, nk


def _instance_percentile(gI: np.ndarray, warm: np.ndarray, j: np.ndarray, ratio: np.ndarray, L: np.ndarray,
                         H: int, p: float, NS: int) -> np.ndarray:
    """Per snapshot the sum over warm instances of percentile p of their last H ratios x limit."""
    out = np.zeros(NS)
    w = np.flatnonzero(warm)
    step = max(1, CHUNK_CELLS // H)
    ks = np.arange(H)
    for a in range(0, w.shape[0], step):
        ww = w[a:a + step]
        n = np.minimum(j[ww], H)
        idx = ww[:, None] - ks[None, :]
        mat = np.where(ks[None, :] < n[:, None], ratio[np.maximum(idx, 0)], np.inf)
        mat.sort(axis=1)
        v = percentile_rows(mat, n, p) * L[ww]
        out += np.bincount(gI[ww], weights=v, minlength=NS)
    return out


def _oracle(snap_key: np.ndarray, mfirst: np.ndarray, mend: np.ndarray, gI: np.ndarray, uI: np.ndarray,
            LI: np.ndarray, grp: np.ndarray, piece: np.ndarray, limit: np.ndarray, todo: np.ndarray,
            E: int, p: float, cap: bool) -> np.ndarray:
    """Per snapshot the oracle peak (NaN where ``todo`` is false)."""
    NS = snap_key.shape[0]
    out = np.full(NS, np.nan)
    if not todo.any():
        return out
    # pieces: first / last snapshot and limit
    starts = np.flatnonzero(np.r_[True, piece[1:] != piece[:-1]])
    ends = np.r_[starts[1:], piece.shape[0]] - 1
    pa, pb, pL, pgrp = gI[starts], gI[ends], LI[starts], grp[starts]
    pkey = pgrp * NS + pb
    # each sample s reaches the pieces of its (machine, instance) ending at or after lo(s)
    lo = np.maximum(mfirst[gI], np.searchsorted(snap_key, snap_key[gI] - E, side="left"))
    q = np.searchsorted(pkey, grp * NS + lo, side="left")
    cnt = piece - q + 1
    row = np.repeat(np.arange(gI.shape[0]), cnt)
    pp = np.repeat(q - np.cumsum(cnt) + cnt, cnt) + np.arange(row.shape[0])
    s = gI[row]
    t0 = np.maximum(pa[pp], lo[row])
    t1 = np.minimum(pb[pp], s - 1)
    ok = t0 <= t1
    row, pp, s, t0, t1 = row[ok], pp[ok], s[ok], t0[ok], t1[ok]
    val = np.minimum(uI[row], pL[pp]) if cap else uI[row]
    order = np.argsort(s, kind="stable")
    s, t0, t1, val = s[order], t0[order], t1[order], val[order]
    del row, pp, order
    hi = np.minimum(mend, np.searchsorted(snap_key, snap_key + E, side="right")) - 1
    nf = hi - np.arange(NS)
    C = max(E, CHUNK_CELLS // (E + 2))
    es = np.arange(1, E + 1)
    tids = np.flatnonzero(todo)
    a = 0
    while a < tids.shape[0]:
        c0 = int(tids[a])
        c1 = min(NS, c0 + C)
        b = int(np.searchsorted(tids, c1))
        R = c1 - c0 + E
        x, y = (int(v) for v in np.searchsorted(s, [c0, c0 + R]))
        base = (s[x:y] - c0) * (E + 2) + s[x:y]
        M = np.bincount(base - t1[x:y], weights=val[x:y], minlength=R * (E + 2))
        M -= np.bincount(base - t0[x:y] + 1, weights=val[x:y], minlength=R * (E + 2))
        M = np.cumsum(M.reshape(R, E + 2), axis=1)
        tt = tids[a:b]
        rel = tt - c0
        vals = M[rel[:, None] + es[None, :], es[None, :]]
        n = nf[tt]
        valid = es[None, :] <= n[:, None]
        if p >= 100.0:
            v = np.where(valid, vals, -np.inf).max(axis=1)
        else:
            mat = np.where(valid, vals, np.inf)
            mat.sort(axis=1)
            v = percentile_rows(mat, np.maximum(n, 1), p)
        out[tt] = np.where(n > 0, v, limit[tt])
        a = b
    return out


def simulate(code: np.ndarray, step: np.ndarray, inst: np.ndarray, usage: np.ndarray, lim: np.ndarray, span: int,
             last_step: int, prm: SimParams) -> dict[str, Any]:
    """The per-snapshot table of one shard (arrays, in (machine code, step) order): ``code``,
    ``step``, ``instances``, ``limit``, ``total_usage``, ``oracle`` (NaN: censored) and one
    array per predictor (``borg_default``, ``n_sigma``, ``instance_percentile``,
    ``machine_percentile``, ``max_of``, ``avg_of``)."""
    if not code.shape[0]:
        z = np.zeros(0)
        return {"code": np.zeros(0, np.int64), "step": np.zeros(0, np.int64), "instances": np.zeros(0, np.int64),
                "limit": z, "total_usage": z, "oracle": z,
                **{p: z for p in ("borg_default", "n_sigma", "instance_percentile", "machine_percentile", "max_of",
                                  "avg_of")}}
    key = code.astype(np.int64) * span + step
    # one row per (machine, step, instance): the max of usage and of limit over its windows
    o = np.lexsort((inst, key))
    key, inst, usage, lim = key[o], inst[o], usage[o], lim[o]
    n = key.shape[0]
    first = np.ones(n, dtype=bool)
    first[1:] = (key[1:] != key[:-1]) | (inst[1:] != inst[:-1])
    at = np.flatnonzero(first)
    usage, lim = np.maximum.reduceat(usage, at), np.maximum.reduceat(lim, at)
    key, inst = key[at], inst[at]
    nr = key.shape[0]
    snap_first = np.ones(nr, dtype=bool)
    snap_first[1:] = key[1:] != key[:-1]
    g = np.cumsum(snap_first) - 1
    snap_key = key[snap_first]
    NS = snap_key.shape[0]
    scode, sstep = snap_key // span, snap_key % span
    mnew = np.ones(NS, dtype=bool)
    mnew[1:] = scode[1:] != scode[:-1]
    mfirst = np.maximum.accumulate(np.where(mnew, np.arange(NS), 0))
    mstarts = np.flatnonzero(mnew)
    mend = np.repeat(np.r_[mstarts[1:], NS], np.diff(np.r_[mstarts, NS]))
    out: dict[str, Any] = {"code": scode, "step": sstep, "instances": np.bincount(g, minlength=NS),
                           "limit": np.bincount(g, weights=lim, minlength=NS),
                           "total_usage": np.bincount(g, weights=np.minimum(usage, lim), minlength=NS)}
    rcode = key // span
    order, j, grp, piece = _runs(rcode, inst, g, lim, prm.cap_to_limit)
    gI, uI, LI = g[order], usage[order], lim[order]
    warm = j >= max(prm.min_samples, 2)
    cold = np.bincount(gI[~warm], weights=LI[~warm], minlength=NS)
    warm_limit = np.bincount(gI[warm], weights=LI[warm], minlength=NS)
    uc = np.minimum(uI, LI) if prm.cap_to_limit else uI
    preds: dict[str, np.ndarray] = {"borg_default": prm.borg_fraction * out["limit"]}
    r, nk = _ratio_series(gI, warm, j, uc, LI, prm.n_sigma_history, NS)
    ks = np.arange(prm.n_sigma_history)[None, :]
    valid = ks < nk[:, None]
    cnt = np.maximum(nk, 1)
    mean = np.where(valid, r, 0.0).sum(1) / cnt
    dev = np.where(valid, r - mean[:, None], 0.0)
    sd = np.sqrt((dev * dev).sum(1) / np.maximum(nk - 1, 1))
    ns = np.where(nk > 0, np.minimum(1.0, mean + prm.n_sigma * sd) * warm_limit, 0.0)
    preds["n_sigma"] = ns + cold
    if prm.machine_history != prm.n_sigma_history:
        r, nk = _ratio_series(gI, warm, j, uc, LI, prm.machine_history, NS)
    ks = np.arange(r.shape[1])[None, :]
    mat = np.where(ks < nk[:, None], r, np.inf)
    mat.sort(axis=1)
    mp = np.minimum(1.0, percentile_rows(mat, np.maximum(nk, 1), prm.machine_percentile)) if NS else np.zeros(0)
    preds["machine_percentile"] = np.where(nk > 0, mp * warm_limit, 0.0) + cold
    del r, mat, dev, valid
    with np.errstate(invalid="ignore", divide="ignore"):
        ratio = uI / LI
    if prm.cap_to_limit:
        ratio = np.minimum(ratio, 1.0)
    preds["instance_percentile"] = _instance_percentile(gI, warm, j, ratio, LI, prm.instance_history,
                                                        prm.instance_percentile, NS) + cold
    sub = np.stack([preds[c] for c in prm.combine]) if prm.combine else np.zeros((1, NS))
    preds["max_of"], preds["avg_of"] = sub.max(0), sub.mean(0)
    todo = sstep + prm.horizon_steps <= last_step
    out["oracle"] = _oracle(snap_key, mfirst, mend, gI, uI, LI, grp, piece, out["limit"], todo, prm.horizon_steps,
                            prm.oracle_percentile, prm.cap_to_limit)
    out.update(preds)
    return out
