"""CuPy twins of :mod:`gpuclust.backends.mixture_cpu` (same names, signatures and semantics).

``repair_percentiles`` and ``window_means`` are one thread per row; ``mixture_quantiles`` sorts
the events by (group, x) with one :func:`cupy.argsort` (a radix sort) of a packed ``uint64`` key
(:func:`~gpuclust.backends.mixture_cpu.packed_event_keys`; :func:`cupy.lexsort` of two float64
keys when a value is not a float32), then runs ``mixture_sweep`` (one block per
group, double-double block scans), or for few, large groups the tiled sweep (each group's tiles
over all blocks, the carries in separate passes: :func:`_tiled_sweep`), and ``mixture_invert``
(one thread per (group, level)) from ``kernels/mixture.cu``.  Wrappers check dtypes, shapes and
contiguity (raising, never converting) and launch with *named* arguments ordered by the declared
parameter lists below.

The instantiations are the loader's table entry ``gpuclust._kernels.INSTANTIATIONS["mixture.cu"]``
(:data:`INSTANTIATIONS`); kernels come from the loader (one module per file, template arguments and device).  CuPy is
imported lazily, inside functions.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from gpuclust import _kernels
from gpuclust._xp import bincount
from gpuclust.backends.gpu import require_device, sm_count
from gpuclust.backends.mixture_cpu import (
    NARROW_REL,
    SNAP_REL,
    SOURCE_LEVELS,
    check_levels_values,
    check_mixture_quantiles,
    check_percentile_matrix,
    packed_event_keys,
)

__all__ = [
    "INSTANTIATIONS",
    "KERNEL_FILE",
    "TILED_SWEEP",
    "mixture_quantiles",
    "name_expressions",
    "repair_percentiles",
    "tile_table",
    "window_means",
]

KERNEL_FILE = "mixture.cu"
#: Threads per block (a multiple of 32; the block scans work on whole warps).
BLOCK = 256

#: Kernel template -> template-argument tuples: this file's entry of the loader's table
#: (``gpuclust._kernels.INSTANTIATIONS["mixture.cu"]``, declared there).
INSTANTIATIONS: dict[str, list[tuple[str, ...]]] = _kernels.INSTANTIATIONS[KERNEL_FILE]

#: C parameter types per kernel (``{T}`` substituted); must match kernels/mixture.cu.  Used by the
#: nvcc test to write explicit instantiations.
C_SIGNATURES: dict[str, str] = {
    "gpuclust::mixture_repair": "const {T}*, long long, int, double*, bool*, bool*",
    "gpuclust::mixture_window_means": "const {T}*, const double*, long long, int, double*",
    "gpuclust::mixture_sweep": (
        "const {T}*, const double*, const double*, const long long*, const long long*, "
        "long long, int, double, double*, double*, double*"
    ),
    "gpuclust::mixture_tile_slope": (
        "const {T}*, const double*, const double*, const long long*, const long long*, "
        "const long long*, long long, int, double, double*, double*"
    ),
    "gpuclust::mixture_tile_carry": "const long long*, long long, const double*, double*",
    "gpuclust::mixture_tile_slopes": (
        "const {T}*, const double*, const double*, const long long*, const long long*, "
        "const long long*, const long long*, long long, int, double, const double*, "
        "const double*, double*, double*, double*, double*"
    ),
    "gpuclust::mixture_tile_cdf": "const long long*, const long long*, long long, const double*, {T}*, double*",
    "gpuclust::mixture_tile_max": "const long long*, const long long*, long long, const double*, {T}*",
    "gpuclust::mixture_invert": (
        "const {T}*, const {T}*, const {T}*, const long long*, long long, const double*, long long, double, {T}*"
    ),
}

_PTR = "ptr"
#: Declared kernel parameter lists: (name, NumPy scalar type or "ptr"), in CUDA signature order.
REPAIR_PARAMS: tuple[tuple[str, Any], ...] = (
    ("q", _PTR),
    ("n", np.int64),
    ("nl", np.int32),
    ("out", _PTR),
    ("repaired", _PTR),
    ("null_mask", _PTR),
)
MEANS_PARAMS: tuple[tuple[str, Any], ...] = (
    ("q", _PTR),
    ("half_dl", _PTR),
    ("n", np.int64),
    ("nl", np.int32),
    ("out", _PTR),
)
SWEEP_PARAMS: tuple[tuple[str, Any], ...] = (
    ("q", _PTR),
    ("src", _PTR),
    ("v", _PTR),
    ("ev", _PTR),
    ("row_start", _PTR),
    ("n_groups", np.int64),
    ("nl", np.int32),
    ("narrow_rel", np.float64),
    ("xs", _PTR),
    ("slope", _PTR),
    ("cdf", _PTR),
)
_TILES = (("tile_start", _PTR), ("tile_end", _PTR))
TILE_SLOPE_PARAMS: tuple[tuple[str, Any], ...] = (
    ("q", _PTR),
    ("src", _PTR),
    ("v", _PTR),
    ("ev", _PTR),
    *_TILES,
    ("n_tiles", np.int64),
    ("nl", np.int32),
    ("narrow_rel", np.float64),
    ("tile_sum", _PTR),
    ("tile_last", _PTR),
)
TILE_CARRY_PARAMS: tuple[tuple[str, Any], ...] = (
    ("tile_first", _PTR),
    ("n_groups", np.int64),
    ("vals", _PTR),
    ("carry", _PTR),
)
TILE_SLOPES_PARAMS: tuple[tuple[str, Any], ...] = (
    ("q", _PTR),
    ("src", _PTR),
    ("v", _PTR),
    ("ev", _PTR),
    *_TILES,
    ("tile_s0", _PTR),
    ("n_tiles", np.int64),
    ("nl", np.int32),
    ("narrow_rel", np.float64),
    ("slope_carry", _PTR),
    ("tile_last", _PTR),
    ("xs", _PTR),
    ("slope", _PTR),
    ("inc_out", _PTR),
    ("inc_sum", _PTR),
)
TILE_CDF_PARAMS: tuple[tuple[str, Any], ...] = (
    *_TILES,
    ("n_tiles", np.int64),
    ("cdf_carry", _PTR),
    ("cdf", _PTR),
    ("tile_max", _PTR),
)
TILE_MAX_PARAMS: tuple[tuple[str, Any], ...] = (
    *_TILES,
    ("n_tiles", np.int64),
    ("max_carry", _PTR),
    ("cdf", _PTR),
)
INVERT_PARAMS: tuple[tuple[str, Any], ...] = (
    ("xs", _PTR),
    ("slope", _PTR),
    ("cdf", _PTR),
    ("row_start", _PTR),
    ("n_groups", np.int64),
    ("levels", _PTR),
    ("n_levels", np.int64),
    ("snap_rel", np.float64),
    ("out", _PTR),
)

_CTYPE = {np.dtype(np.float32): "float", np.dtype(np.float64): "double"}
_FLOATS = (np.dtype(np.float32), np.dtype(np.float64))


def name_expressions() -> list[str]:
    """The NVRTC name expressions of :data:`INSTANTIATIONS`, e.g. ``gpuclust::mixture_invert<double>``."""
    return [f"{t}<{', '.join(a)}>" for t, args in INSTANTIATIONS.items() for a in args]


def _cupy() -> Any:
    from gpuclust.backends import gpu

    return gpu.require()


def _function(template: str, args: tuple[str, ...]) -> Any:
    return _kernels.get_function(KERNEL_FILE, template, args)


def _launch(kernel: Any, grid: int, params: tuple[tuple[str, Any], ...], **named: Any) -> None:
    missing = [p for p, _ in params if p not in named]
    extra = sorted(set(named) - {p for p, _ in params})
    if missing or extra:
        raise TypeError(f"kernel arguments: missing {missing}, unexpected {extra}")
    args = tuple(named[p] if t is _PTR else t(named[p]) for p, t in params)
    kernel((max(1, grid),), (BLOCK,), args)


def _grid(n_items: int, cp: Any) -> int:
    return max(1, min(-(-n_items // BLOCK), sm_count() * 16))


def repair_percentiles(q: Any) -> tuple[Any, Any, Any]:
    """GPU twin of :func:`gpuclust.backends.mixture_cpu.repair_percentiles`."""
    cp = _cupy()
    n = check_percentile_matrix("q", q, _FLOATS, SOURCE_LEVELS.shape[0])
    nl = SOURCE_LEVELS.shape[0]
    out = cp.empty((n, nl), dtype=cp.float64)
    repaired = cp.zeros(n, dtype=cp.bool_)
    null = cp.zeros(n, dtype=cp.bool_)
    if n:
        kern = _function("gpuclust::mixture_repair", (_CTYPE[q.dtype],))
        _launch(kern, _grid(n, cp), REPAIR_PARAMS, q=q, n=n, nl=nl, out=out, repaired=repaired, null_mask=null)
    return out, repaired, null


def window_means(q: Any) -> Any:
    """GPU twin of :func:`gpuclust.backends.mixture_cpu.window_means`."""
    cp = _cupy()
    n = check_percentile_matrix("q", q, _FLOATS, SOURCE_LEVELS.shape[0])
    nl = SOURCE_LEVELS.shape[0]
    out = cp.empty(n, dtype=cp.float64)
    if n:
        half_dl = cp.asarray(np.diff(SOURCE_LEVELS) * 0.5)
        kern = _function("gpuclust::mixture_window_means", (_CTYPE[q.dtype],))
        _launch(kern, _grid(n, cp), MEANS_PARAMS, q=q, half_dl=half_dl, n=n, nl=nl, out=out)
    return out


def mixture_quantiles(q: Any, w: Any, group: Any, n_groups: int, levels: Any, *, q_levels: Any = None) -> Any:
    """GPU twin of :func:`gpuclust.backends.mixture_cpu.mixture_quantiles` (same arguments and result)."""
    cp = _cupy()
    src = check_mixture_quantiles(q, w, group, n_groups, levels, q_levels)
    require_device(q=q, w=w, group=group, levels=levels)
    check_levels_values(levels.get())
    G, L = int(n_groups), int(levels.shape[0])
    out = cp.full((G, L), cp.nan, dtype=cp.float64)
    if G == 0 or L == 0 or q.shape[0] == 0:
        return out
    nl = src.shape[0]
    valid = (group >= 0) & (group < G) & cp.isfinite(w) & (w > 0) & cp.isfinite(q).all(axis=1)
    idx = cp.flatnonzero(valid)
    nv = int(idx.shape[0])
    if nv == 0:
        return out
    every = nv == int(q.shape[0])  # (no gathered copies of the rows when every one is valid)
    gv = (group if every else group[idx]).astype(cp.int64, copy=False)
    wv = w if every else w[idx]
    wsum = bincount(cp, gv, weights=wv, minlength=G)
    v = cp.ascontiguousarray(wv / wsum[gv])
    qv = cp.ascontiguousarray(q if every else q[idx])
    if bool(cp.any(qv[:, 1:] < qv[:, :-1])):
        raise ValueError("q rows must be non-decreasing; repair them with repair_percentiles first")
    # events sorted by (group, x); ids are i * nl + k into qv: one radix argsort of a packed uint64
    # key when the values are float32s (trace percentiles are), else a lexsort of two float64 keys
    eg = cp.repeat(gv, nl)
    packed = packed_event_keys(cp, qv.reshape(-1), eg, G)
    if packed is not None:
        ev = cp.argsort(packed)
    else:
        ev = cp.lexsort(cp.stack([qv.reshape(-1), eg.astype(cp.float64)]))
    del eg, packed
    ev = cp.ascontiguousarray(ev.astype(cp.int64, copy=False))
    row_start = cp.zeros(G + 1, dtype=cp.int64)
    row_start[1:] = cp.cumsum(bincount(cp, gv, minlength=G) * nl)
    E = nv * nl
    xs = cp.empty(E, dtype=cp.float64)
    slope = cp.empty(E, dtype=cp.float64)
    cdf = cp.empty(E, dtype=cp.float64)
    srcd = cp.asarray(src)
    if _tiled(row_start, E):
        _tiled_sweep(cp, qv, srcd, v, ev, row_start, G, nl, xs, slope, cdf)
    else:
        sweep = _function("gpuclust::mixture_sweep", ("double",))
        _launch(
            sweep,
            min(G, sm_count() * 32),
            SWEEP_PARAMS,
            q=qv,
            src=srcd,
            v=v,
            ev=ev,
            row_start=row_start,
            n_groups=G,
            nl=nl,
            narrow_rel=NARROW_REL,
            xs=xs,
            slope=slope,
            cdf=cdf,
        )
    invert = _function("gpuclust::mixture_invert", ("double",))
    _launch(
        invert,
        _grid(G * L, cp),
        INVERT_PARAMS,
        xs=xs,
        slope=slope,
        cdf=cdf,
        row_start=row_start,
        n_groups=G,
        levels=levels,
        n_levels=L,
        snap_rel=SNAP_REL,
        out=out,
    )
    return out


#: Which sweep :func:`mixture_quantiles` runs: ``None`` chooses (:func:`_tiled`), ``True`` /
#: ``False`` force the tiled / one-block-per-group sweep (tests and benchmarks compare the two).
TILED_SWEEP: bool | None = None


def _tiled(row_start: Any, events: int) -> bool:
    """Whether to spread each group's tiles over all blocks: when the largest group holds more
    than 1 / (2 x SMs) of the events, one block per group would make that group's block the whole
    sweep's critical path (by=tier, by=cell, or one dominant group)."""
    if TILED_SWEEP is not None:
        return TILED_SWEEP
    largest = int((row_start[1:] - row_start[:-1]).max())
    return largest * 2 * sm_count() > events


def tile_table(xp: Any, row_start: Any, block: int) -> tuple[Any, Any, Any, Any]:
    """The tiles of the tiled sweep for groups owning sorted events ``[row_start[g],
    row_start[g+1])``: ``(tile_first, tile_start, tile_end, tile_s0)``, group g's tiles being
    ``[tile_first[g], tile_first[g+1])``, tile t its events ``[tile_start[t], tile_end[t])`` (at
    most ``block``, full but a group's last) and ``tile_s0[t]`` its group's first event.  ``xp``:
    NumPy or CuPy (int64 arrays, C-contiguous).

    >>> import numpy as np
    >>> [a.tolist() for a in tile_table(np, np.array([0, 5, 5, 7]), 2)]
    [[0, 3, 3, 4], [0, 2, 4, 5], [2, 4, 5, 7], [0, 0, 0, 5]]
    """
    lengths = row_start[1:] - row_start[:-1]
    G = int(lengths.shape[0])
    tile_first = xp.zeros(G + 1, dtype=xp.int64)
    tile_first[1:] = xp.cumsum((lengths + block - 1) // block)
    T = int(tile_first[-1])
    tg = xp.searchsorted(tile_first, xp.arange(T, dtype=xp.int64), side="right") - 1
    tile_s0 = xp.ascontiguousarray(row_start[tg].astype(xp.int64))
    tile_start = xp.ascontiguousarray(tile_s0 + (xp.arange(T, dtype=xp.int64) - tile_first[tg]) * block)
    tile_end = xp.ascontiguousarray(xp.minimum(tile_start + block, row_start[tg + 1]).astype(xp.int64))
    return tile_first, tile_start, tile_end, tile_s0


def _tiled_sweep(
    cp: Any, qv: Any, src: Any, v: Any, ev: Any, row_start: Any, G: int, nl: int, xs: Any, slope: Any, cdf: Any
) -> None:
    """x, slope and F of every sorted event by the tiled kernels (kernels/mixture.cu, "The tiled
    sweep"): tiles of :data:`BLOCK` events, a group's first tile at its first event."""
    tile_first, tile_start, tile_end, tile_s0 = tile_table(cp, row_start, BLOCK)
    T = int(tile_start.shape[0])
    if T == 0:
        return
    tiles = {"tile_start": tile_start, "tile_end": tile_end, "n_tiles": T}
    per_tile, per_group = min(T, sm_count() * 16), min(G, sm_count() * 32)
    pair = {
        name: cp.empty(2 * T, dtype=cp.float64)
        for name in ("tile_sum", "tile_last", "slope_carry", "inc_sum", "cdf_carry")
    }
    tile_max = cp.empty(T, dtype=cp.float64)
    max_carry = cp.empty(T, dtype=cp.float64)
    events = {"q": qv, "src": src, "v": v, "ev": ev, "nl": nl, "narrow_rel": NARROW_REL}

    def run(name: str, grid: int, params: tuple[tuple[str, Any], ...], arg: str = "double", **named: Any) -> None:
        _launch(_function(f"gpuclust::{name}", (arg,)), grid, params, **named)

    def carry(op: str, vals: Any, out: Any) -> None:  # per group: exclusive sums (TileSum) or maxima (TileMax)
        run(
            "mixture_tile_carry",
            per_group,
            TILE_CARRY_PARAMS,
            f"gpuclust::{op}",
            tile_first=tile_first,
            n_groups=G,
            vals=vals,
            carry=out,
        )

    run(
        "mixture_tile_slope",
        per_tile,
        TILE_SLOPE_PARAMS,
        **events,
        **tiles,
        tile_sum=pair["tile_sum"],
        tile_last=pair["tile_last"],
    )
    carry("TileSum", pair["tile_sum"], pair["slope_carry"])
    run(
        "mixture_tile_slopes",
        per_tile,
        TILE_SLOPES_PARAMS,
        **events,
        **tiles,
        tile_s0=tile_s0,
        slope_carry=pair["slope_carry"],
        tile_last=pair["tile_last"],
        xs=xs,
        slope=slope,
        inc_out=cdf,
        inc_sum=pair["inc_sum"],
    )
    carry("TileSum", pair["inc_sum"], pair["cdf_carry"])
    run("mixture_tile_cdf", per_tile, TILE_CDF_PARAMS, **tiles, cdf_carry=pair["cdf_carry"], cdf=cdf, tile_max=tile_max)
    carry("TileMax", tile_max, max_carry)
    run("mixture_tile_max", per_tile, TILE_MAX_PARAMS, **tiles, max_carry=max_carry, cdf=cdf)
