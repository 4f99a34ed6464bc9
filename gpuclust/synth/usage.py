"""Usage windows from simulated 1 Hz samples, vectorised over (windows x samples).

For every running interval of an instance, the interval is cut on the global 300 s grid (grid
cell ``g`` = ``[g*300 s, (g+1)*300 s)``; the trace start, 600 s, is a grid boundary) and clipped
to the trace window ``[600 s, 600 s + hours)`` and to whole seconds inside the interval.  Each
piece is one usage window with ``n = max(1, round(sample_rate * duration))`` CPU samples:

* ``average_usage.cpus`` = mean of the samples; ``maximum_usage.cpus`` = max of the samples;
  ``random_sample_usage.cpus`` = one of the samples;
* the 20 percentiles by linear interpolation between order statistics (numpy's default
  ``method="linear"``), :func:`window_stats`;
* memory: ``average_usage.memory`` ~ request x a per-instance fraction x small noise,
  ``maximum_usage.memory`` >= it, ``assigned_memory`` = the memory request at the start of the
  interval, ``page_cache_memory`` a per-instance fraction of the average.

Alloc instances report the sum of their tasks: their CPU sample at second ``s`` is the sum of the
samples of the tasks running in them at ``s`` (0 when none), so an alloc window's average x
duration equals the sum over its tasks' windows of average x duration in that cell.  Tasks in
allocs and alloc instances always have ``sample_rate`` 1.

CPI and MAI (only on platforms with counters and machines with a known capacity): see
:func:`plant_cpi` and ``docs/user/synth.md``.
"""

from __future__ import annotations

import numpy as np

from gpuclust.schema import TRACE_OFFSET_US
from gpuclust.synth.export import quantize

US = 1_000_000
CELL_S = 300
CELL_US = CELL_S * US
UNIT = 1_000_000

#: Decimals written for each kind of float (the truth is computed on the written values).
DEC_USAGE = 7
DEC_CPI = 5
DEC_RATE = 6
#: Range of the planted implausible CPI values.
CPI_OUTLIER_RANGE = (150.0, 1000.0)

#: Percentile levels in source order (11 coarse, then 9 tail), as fractions.
LEVELS = np.array([0, 10, 20, 30, 40, 50, 60, 70, 80, 90, 100, 91, 92, 93, 94, 95, 96, 97, 98, 99]) / 100.0


def window_stats(samples: np.ndarray, n: np.ndarray, pick: np.ndarray | None = None) -> dict[str, np.ndarray]:
    """Mean, max, percentiles (and a picked sample) of the first ``n[w]`` samples of each row.

    ``samples`` is ``(W, S)``; row ``w`` holds its samples in columns ``[0, n[w])`` (the rest is
    ignored).  Percentiles use numpy's ``linear`` method, including its two-sided lerp, so they
    equal ``np.percentile(samples[w, :n[w]].astype(float64), 100 * LEVELS)``.

    Examples
    --------
    >>> s = np.array([[3.0, 1.0, 2.0, 9.0]], np.float32)
    >>> st = window_stats(s, np.array([3]))
    >>> float(st["mean"][0]), float(st["max"][0]), float(st["pct"][0, 5])
    (2.0, 3.0, 2.0)
    """
    W, S = samples.shape
    n = np.asarray(n, dtype=np.int64)
    col = np.arange(S)[None, :]
    valid = col < n[:, None]
    srt = np.where(valid, samples, np.float32(np.inf))
    srt.sort(axis=1)  # in place: the array is this function's own
    s64 = np.where(valid, samples.astype(np.float64), 0.0)  # the same values as casting after the where, one pass fewer
    mean = s64.sum(axis=1) / n
    rows = np.arange(W)[:, None]
    idx = (n[:, None] - 1) * LEVELS[None, :]
    lo = np.floor(idx).astype(np.int64)
    hi = np.minimum(lo + 1, n[:, None] - 1)
    g = idx - lo
    a = srt[rows, lo].astype(np.float64)
    b = srt[rows, hi].astype(np.float64)
    d = b - a
    pct = np.where(g >= 0.5, b - d * (1 - g), a + d * g)
    out = {"mean": mean, "max": srt[np.arange(W), n - 1].astype(np.float64), "pct": pct}
    if pick is not None:
        out["pick"] = samples[np.arange(W), pick].astype(np.float64)
    return out


#: Bounds of the per-interval usage / request factor f.
F_CPU_CLIP = (0.01, 2.5)


def ratio_by_tier(cfg) -> dict[str, float]:
    """The planted mean CPU usage / request per notebook tier (``usage_ratio_<tier>``)."""
    return {t: float(getattr(cfg, f"usage_ratio_{t}")) for t in ("free", "beb", "mid", "prod")}


def clipped_lognormal_mean(mean: float, sigma: float, lo: float, hi: float) -> float:
    """E[clip(X, lo, hi)] for a lognormal X with the given mean and log-sd.

    Examples
    --------
    >>> round(clipped_lognormal_mean(0.5, 0.6, 0.0, float("inf")), 12)
    0.5
    """
    from math import erf, inf, log, sqrt

    if sigma == 0:
        return float(min(max(mean, lo), hi))
    mu = log(mean) - sigma * sigma / 2

    def phi(x: float) -> float:
        return 0.5 * (1 + erf(x / sqrt(2)))

    def partial(c: float) -> float:  # E[X; X < c]
        if c <= 0:
            return 0.0
        if c == inf:
            return mean
        return mean * phi((log(c) - mu - sigma * sigma) / sigma)

    p_lo = phi((log(lo) - mu) / sigma) if lo > 0 else 0.0
    p_hi = phi((log(hi) - mu) / sigma) if hi < inf else 1.0
    return lo * p_lo + (partial(hi) - partial(lo)) + (hi * (1 - p_hi) if hi < inf else 0.0)


def interval_params(
    iv: dict[str, np.ndarray], is_alloc: np.ndarray, rng: np.random.Generator, cfg, ratio: np.ndarray | None = None
) -> dict:
    """Per-interval usage parameters (drawn once, after the simulation).

    ``is_alloc`` marks the intervals of alloc instances; they and the tasks inside them keep
    ``sample_rate`` 1 so the alloc's samples are exact per-second sums of its tasks' samples.
    ``ratio`` is the planted mean usage / request of each interval's tier: the interval's factor
    ``f = clip(ratio x exp(sigma z - sigma^2/2), 0.01, 2.5)``, sigma = ``usage_ratio_sigma``.
    """
    k = iv["coll"].size
    if ratio is None:
        ratio = np.full(k, ratio_by_tier(cfg)["prod"])
    s_f = cfg.usage_ratio_sigma
    f_cpu = np.clip(ratio * np.exp(s_f * rng.standard_normal(k) - 0.5 * s_f * s_f), *F_CPU_CLIP)
    sig = rng.uniform(0.1, 0.7, k)
    f_mem = rng.uniform(0.3, 0.95, k)
    pc = rng.uniform(0.0, 0.3, k)
    rate = np.ones(k)
    lowr = (rng.random(k) < cfg.low_sample_rate_fraction) & (iv["alloc_iv"] < 0) & ~is_alloc
    rate[lowr] = rng.choice([0.5, 1 / 3, 0.25], size=int(lowr.sum()))
    f_mean = np.array([clipped_lognormal_mean(r, s_f, *F_CPU_CLIP) for r in np.unique(ratio)])
    f_mean = f_mean[np.searchsorted(np.unique(ratio), ratio)]
    return {"f_cpu": f_cpu, "f_mean": f_mean, "sig": sig, "f_mem": f_mem, "pc": pc, "rate": rate}


def enumerate_windows(iv: dict[str, np.ndarray], g0: int, g1: int, t_end: int) -> dict[str, np.ndarray]:
    """All windows of grid cells ``[g0, g1)``: interval id, cell, start and end seconds."""
    lo_us = max(g0 * CELL_US, TRACE_OFFSET_US)
    hi_us = min(g1 * CELL_US, t_end)
    sel = np.flatnonzero((iv["start"] < hi_us) & (iv["end"] > lo_us))
    s = np.maximum(iv["start"][sel], lo_us)
    e = np.minimum(iv["end"][sel], hi_us)
    s_sec = -((-s) // US)  # ceil to seconds
    e_sec = e // US
    c0 = s_sec // CELL_S
    c1 = (np.maximum(e_sec, s_sec + 1) - 1) // CELL_S
    cnt = np.maximum(c1 - c0 + 1, 0)
    rep = np.repeat(np.arange(sel.size), cnt)
    off = np.arange(rep.size) - np.repeat(np.cumsum(cnt) - cnt, cnt)
    cell = c0[rep] + off
    ws = np.maximum(s_sec[rep], cell * CELL_S)
    we = np.minimum(e_sec[rep], (cell + 1) * CELL_S)
    keep = we - ws >= 1
    return {"iv": sel[rep][keep], "cell": cell[keep], "ws": ws[keep], "we": we[keep]}


def diurnal_factor(amplitude: float, t_s: np.ndarray, span_s: float) -> np.ndarray:
    """``(1 + A sin(2 pi t / 1 d)) / (1 + A x mean of the sine over the trace)``: a daily cycle with
    mean one over the trace window ``[0, span_s)`` (t in seconds since the trace start), so it keeps
    the planted usage / request means."""
    w = 2 * np.pi / 86400.0
    mean_sin = (1 - np.cos(w * span_s)) / (w * span_s) if span_s > 0 else 0.0
    return (1.0 + amplitude * np.sin(w * t_s)) / (1.0 + amplitude * mean_sin)


def plant_cpi(
    k: np.ndarray, u: np.ndarray, base: np.ndarray, a: float, b: float, sigma: float, rng: np.random.Generator
) -> np.ndarray:
    """``CPI = base x (1 + a (k - 1) + b u) x LogNormal(-sigma^2/2, sigma)`` (the noise has mean 1)."""
    noise = np.exp(sigma * rng.standard_normal(k.size) - 0.5 * sigma * sigma)
    return base * (1.0 + a * (k - 1) + b * u) * noise


class UsageContext:
    """Everything the per-block usage generation needs, as flat arrays."""

    def __init__(
        self,
        cfg,
        iv: dict[str, np.ndarray],
        params: dict[str, np.ndarray],
        coll: dict[str, np.ndarray],
        mach: dict[str, np.ndarray],
        t_end: int,
    ):
        self.cfg = cfg
        self.iv = iv
        self.p = params
        self.coll = coll  # per collection index: cid, ctype, prio, alloc_cid
        self.mach = mach  # per machine index: mid, cap_c (NCU, nan if unknown), cpi_base, mai_base (nan = none)
        self.t_end = t_end
        self.t_end_s = t_end // US


def _block_windows(ctx: UsageContext, g0: int, g1: int) -> tuple[dict[str, np.ndarray], np.ndarray, np.ndarray]:
    """The block's windows with task rows first and alloc rows after, and which are / are inside allocs."""
    iv = ctx.iv
    w = enumerate_windows(iv, g0, g1, ctx.t_end)
    ivx = w["iv"]
    ctype = ctx.coll["ctype"][iv["coll"][ivx]]
    is_alloc = ctype == 1
    in_alloc = iv["alloc_iv"][ivx] >= 0
    # rows: non-alloc windows first, then alloc windows
    order = np.concatenate([np.flatnonzero(~is_alloc), np.flatnonzero(is_alloc)])
    for k in w:
        w[k] = w[k][order]
    return w, is_alloc[order], in_alloc[order]


def _cpu_level(
    ctx: UsageContext, w: dict[str, np.ndarray], req_c: np.ndarray, g0: int, g1: int, rng: np.random.Generator
) -> np.ndarray:
    """Each window's expected CPU: request x interval factor x window noise x diurnal x machine loads."""
    cfg, iv, p = ctx.cfg, ctx.iv, ctx.p
    ivx = w["iv"]
    tmid = (w["ws"] + w["we"]) / 2.0 - TRACE_OFFSET_US / US
    diurnal = diurnal_factor(cfg.diurnal_amplitude, tmid, (ctx.t_end - TRACE_OFFSET_US) / US)
    # machine-level load: a per-machine factor (drawn once) and a per-(machine, cell) factor shared by
    # everything on the machine in that cell, so machine utilisation varies apart from the task count
    nm = ctx.mach["mid"].size
    s_mc = cfg.machine_cell_load_sigma
    mc_fac = np.exp(s_mc * rng.standard_normal((nm, g1 - g0)) - 0.5 * s_mc * s_mc)
    mach_w = iv["machine"][ivx]
    s_w = cfg.usage_window_sigma
    return (
        req_c
        * p["f_cpu"][ivx]
        * np.exp(s_w * rng.standard_normal(ivx.size) - 0.5 * s_w * s_w)
        * diurnal
        * ctx.mach["load"][mach_w]
        * mc_fac[mach_w, w["cell"] - g0]
    )


def _throttle_levels(
    ctx: UsageContext,
    w: dict[str, np.ndarray],
    level: np.ndarray,
    dur: np.ndarray,
    is_alloc: np.ndarray,
    g0: int,
    g1: int,
) -> None:
    """Scale the task levels of machine-cells whose expected demand passes the utilisation cap (in place)."""
    # a machine cannot run more than its cores: where the expected CPU demand of the tasks on a
    # machine in a cell exceeds max_machine_utilisation x capacity, scale those tasks' levels down
    # (draws no random numbers, so everything else stays the same)
    mach_w = ctx.iv["machine"][w["iv"]]
    nm = ctx.mach["mid"].size
    tasks = np.flatnonzero(~is_alloc)
    cap_c = ctx.mach["cap_true"][mach_w[tasks]]
    ncell = g1 - g0
    mk = mach_w[tasks] * ncell + (w["cell"][tasks] - g0)
    demand = np.bincount(mk, weights=level[tasks] * dur[tasks], minlength=nm * ncell)
    cl = w["cell"][tasks]
    cell_len = np.minimum((cl + 1) * CELL_S, ctx.t_end_s) - np.maximum(cl * CELL_S, TRACE_OFFSET_US // US)
    limit = ctx.cfg.max_machine_utilisation * cap_c * cell_len
    with np.errstate(invalid="ignore", divide="ignore"):
        f = np.where((demand[mk] > limit) & (limit > 0), limit / demand[mk], 1.0)
    level[tasks] *= f


def _alloc_links(
    w: dict[str, np.ndarray], in_alloc: np.ndarray, alloc_iv: np.ndarray, nT: int, g0: int, g1: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Task rows inside allocs, their alloc window (counted from row nT), second offset in it, and row -> position."""
    ivx = w["iv"]
    # alloc windows: map (alloc interval, cell) -> row
    a_rows = np.arange(nT, ivx.size)
    a_key = ivx[a_rows] * (g1 - g0 + 1) + (w["cell"][a_rows] - g0)
    srt = np.argsort(a_key, kind="stable")
    a_key_sorted = a_key[srt]
    tia = np.flatnonzero(in_alloc[:nT])  # task-in-alloc rows
    if tia.size:
        key = alloc_iv[ivx[tia]] * (g1 - g0 + 1) + (w["cell"][tia] - g0)
        pos = np.searchsorted(a_key_sorted, key)
        if np.any(pos >= a_key_sorted.size) or np.any(a_key_sorted[np.minimum(pos, a_key_sorted.size - 1)] != key):
            raise AssertionError("a task in an alloc has no alloc window in the same cell")
        tia_alloc = srt[pos]  # index into alloc windows
        tia_delta = w["ws"][tia] - w["ws"][nT + tia_alloc]
    else:
        tia_alloc = tia_delta = np.zeros(0, np.int64)
    tia_pos = np.full(nT, -1, np.int64)
    tia_pos[tia] = np.arange(tia.size)
    return tia, tia_alloc, tia_delta, tia_pos


def _task_memory(
    p: dict[str, np.ndarray], ivx: np.ndarray, req_m: np.ndarray, rng: np.random.Generator
) -> dict[str, np.ndarray]:
    """Average, maximum, assigned and page-cache memory of every window (alloc rows are redone from their tasks)."""
    W = ivx.size
    f_mem = p["f_mem"][ivx]
    avg_mem = np.minimum(req_m * f_mem * (1.0 + 0.03 * rng.standard_normal(W)), req_m)
    max_mem = np.minimum(avg_mem * (1.0 + 0.05 * np.abs(rng.standard_normal(W))), req_m)
    max_mem = np.maximum(max_mem, avg_mem)
    page = avg_mem * p["pc"][ivx]
    return {"avg": avg_mem, "max": max_mem, "page": page, "assigned": req_m.copy()}


def _put_stats(stats: dict[str, np.ndarray], rows: slice, st: dict[str, np.ndarray]) -> None:
    """Store one batch's window statistics (mean, max, percentiles, picked sample) at ``rows``."""
    for k in ("mean", "max", "pct", "pick"):
        stats[k][rows] = st[k]


def _task_cpu_stats(
    level: np.ndarray,
    sig: np.ndarray,
    n: np.ndarray,
    u_pick: np.ndarray,
    links: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray],
    alloc_S: np.ndarray,
    stats: dict[str, np.ndarray],
    rng: np.random.Generator,
    batch: int,
) -> None:
    """Draw the task rows' 1 Hz samples in batches, store their statistics, and add them to their allocs' samples."""
    _, tia_alloc, tia_delta, tia_pos = links
    nT = tia_pos.size
    for b0 in range(0, nT, batch):
        b1 = min(nT, b0 + batch)
        nb = b1 - b0
        z = rng.standard_normal((nb, CELL_S), dtype=np.float32)
        sg = sig[b0:b1, None].astype(np.float32)
        S = (level[b0:b1, None].astype(np.float32) * np.exp(sg * z - 0.5 * sg * sg)).astype(np.float32)
        nn = n[b0:b1]
        pk = np.minimum((u_pick[b0:b1] * nn).astype(np.int64), nn - 1)
        _put_stats(stats, slice(b0, b1), window_stats(S, nn, pk))
        tp = tia_pos[b0:b1]
        sel = np.flatnonzero(tp >= 0)
        if sel.size:
            valid = np.arange(CELL_S)[None, :] < nn[sel, None]
            r, cidx = np.nonzero(valid)
            np.add.at(alloc_S, (tia_alloc[tp[sel]][r], tia_delta[tp[sel]][r] + cidx), S[sel[r], cidx])


def _alloc_cpu_stats(
    alloc_S: np.ndarray, n: np.ndarray, u_pick: np.ndarray, nT: int, stats: dict[str, np.ndarray], batch: int
) -> None:
    """Store the alloc rows' statistics of their summed samples."""
    na = n[nT:]
    pk = np.minimum((u_pick[nT:] * na).astype(np.int64), na - 1)
    for b0 in range(0, na.size, batch):
        b1 = min(na.size, b0 + batch)
        _put_stats(stats, slice(nT + b0, nT + b1), window_stats(alloc_S[b0:b1], na[b0:b1], pk[b0:b1]))


def _alloc_memory(
    mem: dict[str, np.ndarray],
    exp_ratio: np.ndarray,
    links: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray],
    dur: np.ndarray,
    req_c: np.ndarray,
    req_m: np.ndarray,
    f_mean: np.ndarray,
) -> None:
    """Alloc rows' memory and expected usage / request from their tasks' (in place)."""
    tia, tia_alloc, _, tia_pos = links
    nT = tia_pos.size
    avg_mem, max_mem, page = mem["avg"], mem["max"], mem["page"]
    # alloc memory: sums of its tasks (time-weighted average; max as sum of the tasks' max)
    am = np.zeros(dur.size - nT)
    ax = np.zeros(dur.size - nT)
    ap = np.zeros(dur.size - nT)
    if tia.size:
        np.add.at(am, tia_alloc, avg_mem[tia] * dur[tia])
        np.add.at(ax, tia_alloc, max_mem[tia])
        np.add.at(ap, tia_alloc, page[tia] * dur[tia])
    dA = dur[nT:]
    avg_mem[nT:] = am / dA
    if tia.size:  # planted expectation of an alloc window's usage / request: its tasks' expected usage
        np.add.at(exp_ratio[nT:], tia_alloc, f_mean[tia] * req_c[tia] * dur[tia])
    exp_ratio[nT:] /= req_c[nT:] * dA
    max_mem[nT:] = np.maximum(np.minimum(ax, req_m[nT:]), avg_mem[nT:])
    page[nT:] = ap / dA


def _cap_realised(
    ctx: UsageContext,
    w: dict[str, np.ndarray],
    stats: dict[str, np.ndarray],
    dur: np.ndarray,
    in_alloc: np.ndarray,
    is_alloc: np.ndarray,
    g0: int,
    g1: int,
) -> None:
    """Scale down the CPU statistics of top-level tasks on machine-cells whose realised demand passes the cores."""
    # sampling noise may still lift a throttled machine-cell's realised demand above its cores:
    # scale the statistics (linear in the samples) of its tasks outside allocs down to the capacity
    mach_w = ctx.iv["machine"][w["iv"]]
    nm = ctx.mach["mid"].size
    ncell = g1 - g0
    mk = mach_w * ncell + (w["cell"] - g0)
    top_task = ~in_alloc & ~is_alloc
    cs = stats["mean"] * dur
    d_all = np.bincount(mk[~in_alloc], weights=cs[~in_alloc], minlength=nm * ncell)
    d_task = np.bincount(mk[top_task], weights=cs[top_task], minlength=nm * ncell)
    cl = np.arange(g0, g1)
    c_len = np.minimum((cl + 1) * CELL_S, ctx.t_end_s) - np.maximum(cl * CELL_S, TRACE_OFFSET_US // US)
    hard = 0.9999 * ctx.mach["cap_true"][:, None] * c_len[None, :]
    over = (d_all > hard.ravel()) & (d_task > 0)
    if over.any():
        fac = np.ones(nm * ncell)
        fac[over] = np.maximum(0.0, 1.0 - (d_all[over] - hard.ravel()[over]) / d_task[over])
        rows = np.flatnonzero(top_task & over[mk])
        f_r = fac[mk[rows]]
        stats["mean"][rows] *= f_r
        stats["max"][rows] *= f_r
        stats["pick"][rows] *= f_r
        stats["pct"][rows] *= f_r[:, None]


def _machine_cpi(
    ctx: UsageContext,
    w: dict[str, np.ndarray],
    mean: np.ndarray,
    dur: np.ndarray,
    top: np.ndarray,
    g0: int,
    g1: int,
    rng: np.random.Generator,
) -> dict[str, np.ndarray]:
    """Co-location count k and utilisation u of each row's machine-cell, and the CPI and MAI planted on them."""
    cfg = ctx.cfg
    # machine-level co-location count k and utilisation u per (machine, cell), top-level rows only
    machine = ctx.iv["machine"][w["iv"]]
    W = machine.size
    ncell = g1 - g0
    mkey = machine * ncell + (w["cell"] - g0)
    size = int(ctx.mach["mid"].size * ncell)
    k_mc = np.bincount(mkey[top], minlength=size)
    cs_mc = np.bincount(mkey[top], weights=(mean * dur)[top], minlength=size)
    cell = w["cell"]
    cell_len = np.minimum((cell + 1) * CELL_S, ctx.t_end_s) - np.maximum(cell * CELL_S, TRACE_OFFSET_US // US)
    cap = ctx.mach["cap_c"][machine]
    kk = k_mc[mkey]
    with np.errstate(invalid="ignore", divide="ignore"):
        uu = cs_mc[mkey] / (cell_len * cap)
    base = ctx.mach["cpi_base"][machine]
    has_cpi = np.isfinite(base) & np.isfinite(cap)
    cpi = np.full(W, np.nan)
    mai = np.full(W, np.nan)
    hc = np.flatnonzero(has_cpi)
    if hc.size:
        clean = plant_cpi(
            kk[hc].astype(np.float64), uu[hc], base[hc], cfg.cpi_per_task, cfg.cpi_per_util, cfg.cpi_noise, rng
        )
        m_noise = np.exp(cfg.mai_noise * rng.standard_normal(hc.size) - 0.5 * cfg.mai_noise**2)
        mai[hc] = quantize(ctx.mach["mai_base"][machine[hc]] * (clean / base[hc]) * m_noise, DEC_USAGE)
        out = rng.random(hc.size) < cfg.cpi_outlier_fraction
        # implausible values (> 100: beyond the cpi analysis' default plausibility filter)
        clean[out] = rng.uniform(CPI_OUTLIER_RANGE[0], CPI_OUTLIER_RANGE[1], int(out.sum()))
        cpi[hc] = quantize(clean, DEC_CPI)
    cpi_outlier = np.zeros(W, bool)
    if hc.size:
        cpi_outlier[hc[out]] = True
    return {"cpi": cpi, "mai": mai, "has_cpi": has_cpi, "cpi_outlier": cpi_outlier, "k": kk, "u": uu, "cpi_base": base}


def _usage_columns(
    ctx: UsageContext,
    w: dict[str, np.ndarray],
    dur: np.ndarray,
    in_alloc: np.ndarray,
    top: np.ndarray,
) -> dict[str, np.ndarray]:
    """The identifying columns of the block's rows: times, cell, collection, instance, machine, alloc, priority."""
    iv, ivx = ctx.iv, w["iv"]
    machine = iv["machine"][ivx]
    c = iv["coll"][ivx]
    return {
        "start_time": w["ws"] * US,
        "end_time": w["we"] * US,
        "dur": dur,
        "cell": w["cell"],
        "collection_id": ctx.coll["cid"][c],
        "instance_index": iv["index"][ivx],
        "machine_id": ctx.mach["mid"][machine],
        "machine": machine,
        "coll": c,
        "alloc_collection_id": np.where(in_alloc, ctx.coll["alloc_cid"][c], 0),
        "alloc_instance_index": iv["alloc_index"][ivx],
        "in_alloc": in_alloc,
        "top": top,
        "collection_type": ctx.coll["ctype"][c],
        "priority": ctx.coll["prio"][c],
    }


def generate_block(
    ctx: UsageContext, g0: int, g1: int, rng: np.random.Generator, batch: int = 8192
) -> dict[str, np.ndarray]:
    """Usage rows of grid cells ``[g0, g1)`` (every machine), as columns.

    The random draws happen in a fixed order (the output is a function of the seed): machine-cell
    loads and window noise (:func:`_cpu_level`), the picked samples, memory noise
    (:func:`_task_memory`), the task samples batch by batch (:func:`_task_cpu_stats`), CPI and MAI
    (:func:`_machine_cpi`), then which maxima go missing.
    """
    cfg, iv, p = ctx.cfg, ctx.iv, ctx.p
    w, is_alloc, in_alloc = _block_windows(ctx, g0, g1)
    ivx = w["iv"]
    W = ivx.size
    nT = int((~is_alloc).sum())
    dur = (w["we"] - w["ws"]).astype(np.int64)
    n = np.maximum(1, np.rint(p["rate"][ivx] * dur)).astype(np.int64)
    n = np.minimum(n, CELL_S)
    req_c = iv["req_c"][ivx] / UNIT
    req_m = iv["req_m"][ivx] / UNIT
    level = _cpu_level(ctx, w, req_c, g0, g1, rng)
    u_pick = rng.random(W)
    if np.isfinite(cfg.max_machine_utilisation):
        _throttle_levels(ctx, w, level, dur, is_alloc, g0, g1)
    links = _alloc_links(w, in_alloc, iv["alloc_iv"], nT, g0, g1)
    alloc_S = np.zeros((W - nT, CELL_S), dtype=np.float32)
    stats = {"mean": np.empty(W), "max": np.empty(W), "pick": np.empty(W), "pct": np.empty((W, LEVELS.size))}
    # memory of tasks (alloc memory = sums over tasks below)
    mem = _task_memory(p, ivx, req_m, rng)
    # E[usage / request] of each window under the planted law (tasks: their tier's mean factor)
    exp_ratio = np.where(is_alloc, 0.0, p["f_mean"][ivx])
    _task_cpu_stats(level, p["sig"][ivx], n, u_pick, links, alloc_S, stats, rng, batch)
    if W > nT:
        _alloc_cpu_stats(alloc_S, n, u_pick, nT, stats, batch)
        _alloc_memory(mem, exp_ratio, links, dur, req_c, req_m, p["f_mean"][ivx])
    if np.isfinite(cfg.max_machine_utilisation) and cfg.max_machine_utilisation <= 1:
        _cap_realised(ctx, w, stats, dur, in_alloc, is_alloc, g0, g1)
    stats = {k: quantize(v, DEC_USAGE) for k, v in stats.items()}
    mem = {k: quantize(v, DEC_USAGE) for k, v in mem.items()}
    top = ~in_alloc
    cpi = _machine_cpi(ctx, w, stats["mean"], dur, top, g0, g1, rng)
    max_missing = rng.random(W) < cfg.max_usage_missing_fraction
    return {
        **_usage_columns(ctx, w, dur, in_alloc, top),
        "avg_cpu": stats["mean"],
        "max_cpu": stats["max"],
        "sample_cpu": stats["pick"],
        "pct": stats["pct"],
        "n": n,
        "avg_mem": mem["avg"],
        "max_mem": mem["max"],
        "assigned_mem": mem["assigned"],
        "page_cache_mem": mem["page"],
        "max_missing": max_missing,
        "sample_rate": quantize(n / dur, DEC_RATE),
        **cpi,
        "req_cpu": req_c,
        "exp_ratio": exp_ratio,
        "iv": ivx,
    }
