"""The ``cpi`` regression's shard reduction: a range of machines' (machine, cell) sums joined to
their kept windows' (machine, cell, platform) sums, turned into per-platform co-moments of
(CPI, util, ntasks) and the binned sums (:meth:`gpuclust.analyses.cpi.Cpi.finalize_shard`)."""

from __future__ import annotations

from typing import Any

import numpy as np

from gpuclust._xp import bincount
from gpuclust.analyses.cpi.context import _BIN_BITS, COUNTERS, K_BINS, UTIL_BIN, UTIL_BINS, CpiContext, _cell_seconds
from gpuclust.analyses.cpi.keyed import _dense_groups
from gpuclust.backends import finalize_backend
from gpuclust.keys import pack_bits, unpack

__all__ = ["cell_util", "shard_sums"]


def cell_util(c: dict[str, Any], ctx: CpiContext, be: Any) -> tuple[Any, Any, Any]:
    """Capacity-machine index, cell and utilisation of merged ``c`` sums (NaN when a row's CPU
    time is unknown or the cell lies outside the trace window), on backend ``be`` given ``c``
    there."""
    xp = be.xp
    key = c["key"].astype(xp.int64, copy=False)
    span = max(ctx.cell_span, 1)
    m, cell = unpack(key, span)
    denom = _cell_seconds(xp, cell, ctx.trace_window_us) * be.stage(ctx.cap_val)[m]
    with np.errstate(invalid="ignore", divide="ignore"):
        u = xp.where((c["bad"] == 0) & (denom > 0), c["cpu_seconds"] / xp.where(denom > 0, denom, 1.0), xp.nan)
    return m, cell, u


def shard_sums(
    keyed: dict[str, dict[str, np.ndarray]], rest: dict[str, Any], ctx: CpiContext, lo: int, hi: int
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Machines ``[lo, hi)``: their machine-cells' ``k`` and ``util``, joined to the kept
    windows' (machine, cell, platform) sums: per-platform co-moments of (CPI, util, ntasks)
    and the binned sums, with the regression counters (no parted tables).  The join and the
    sums run on the backend the partials were computed on (:func:`finalize_backend`: the
    device under ``backend="gpu"``); the extra comes back to the host."""
    be = finalize_backend(rest["backend"])
    xp = be.xp
    c = {f: be.asarray(v) for f, v in keyed["c"].items()}
    wk = {f: be.asarray(v) for f, v in keyed["w"].items()}
    ck, k = c["key"].astype(xp.int64, copy=False), c["k"].astype(xp.int64, copy=False)
    u = cell_util(c, ctx, be)[2]
    NP = ctx.n_platforms
    cell_key, pl = unpack(wk["key"], NP)
    nc = int(ck.shape[0])
    if nc:
        pos = xp.searchsorted(ck, cell_key)
        posc = xp.clip(pos, 0, nc - 1)
        found = (pos < nc) & (ck[posc] == cell_key)
        uu = xp.where(found, u[posc], xp.nan)
    else:
        posc = xp.zeros(int(cell_key.shape[0]), xp.int64)
        found = xp.zeros(int(cell_key.shape[0]), dtype=bool)
        uu = xp.full(int(cell_key.shape[0]), xp.nan)
    use = found & xp.isfinite(uu)
    n = wk["n"].astype(xp.int64, copy=False)
    counts = dict.fromkeys(COUNTERS, 0)
    counts.update(
        no_machine_cell=int(n[~found].sum()),
        unknown_util=int(n[found & ~use].sum()),
        regression_used=int(n[use].sum()),
        unknown_platform=int(n[use & (pl == ctx.unknown_platform)].sum()),
    )
    stats = np.array([0, nc, int(xp.isnan(u).sum())], np.int64)
    # a machine-cell's windows share util and k: each (cell, platform) is one point at its
    # weighted mean CPI, with the within-cell CPI spread added to the CPI variance
    pr, nu, W, S, Q = pl[use], n[use], wk["W"][use], wk["S"][use], wk["Q"][use]
    ur, kr = uu[use], k[posc[use]]
    ybar = S / W
    x = xp.empty((int(pr.shape[0]), 3))
    x[:, 0], x[:, 1], x[:, 2] = ybar, ur, kr - 1.0
    uniq, inv, G = _dense_groups(xp, pr, NP, xp.arange(NP))
    m = be.ops.grouped_comoments(x, xp.ascontiguousarray(W), inv, G)
    C = m.C.copy()
    C[:, 0, 0] += bincount(xp, inv, weights=xp.maximum(Q - S * ybar, 0.0), minlength=G)
    host = be.to_host
    r = {
        "r_key": host(uniq).astype(np.int64),
        "r_n": host(bincount(xp, inv, weights=nu, minlength=G)).round().astype(np.int64),
        "r_W": host(m.W),
        "r_mean": host(m.mean),
        "r_C": host(C),
    }
    # binned CPI vs util and vs k, per platform
    ub = xp.clip(xp.floor(ur / UTIL_BIN), 0, UTIL_BINS - 1).astype(xp.int64)
    kb = xp.clip(kr, 0, K_BINS - 1).astype(xp.int64)
    bkey = xp.concatenate([pack_bits(pr * 2, ub, _BIN_BITS), pack_bits(pr * 2 + 1, kb, _BIN_BITS)])
    bu, binv = xp.unique(bkey, return_inverse=True)
    binv = binv.reshape(-1)
    sums = {"cpu_seconds": xp.concatenate([W, W]), "wcpi": xp.concatenate([S, S]), "n": xp.concatenate([nu, nu])}
    b = {
        "key": host(bu).astype(np.int64),
        **{f: host(bincount(xp, binv, weights=v, minlength=int(bu.shape[0]))) for f, v in sums.items()},
    }
    b["n"] = b["n"].round().astype(np.int64)
    return {}, {"r": r, "b": b, "counts": np.array([counts[c] for c in COUNTERS], np.int64), "stats": stats}
