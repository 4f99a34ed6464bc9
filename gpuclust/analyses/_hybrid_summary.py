"""The ``bounded`` strategy of ``usage-distribution``: exact per group until a group is big, then a
bounded summary (built from :mod:`gpuclust.analyses.mixture_summary`).

A pure bounded summary costs ``K + 1`` knots per group whatever the group's size, and every merge
re-tabulates it: for high-cardinality groupings (instances, machines x hours), where most groups
hold a handful of windows, that is more memory than the windows themselves and about 70x slower
(measured: 10^6 windows in 2.4 10^5 groups, K = 512: 262 s against 7 s exact).  So a partial holds
two disjoint parts:

``exact``
    groups with at most ``T = max(1, (K + 1) // 22)`` usable windows in the partial (a window costs
    22 float64 in an exact partial, so ``T`` windows cost no more than the ``K + 1`` knots): their
    windows, exactly (error 0);
``bounded``
    every other group: its bounded summary with the tracked error bound.

A group moves ("spills") from ``exact`` to ``bounded`` when its usable windows exceed ``T`` or
when it is already bounded on the other side of a merge: its windows are tabulated as a leaf
(what ``mixture_summary.bounded_partial`` computes, error ``1/K``; more than
:data:`TABULATE_ROWS` rows as a leaf a slice, merged pairwise; the stats are kept from the
exact part) and merged into the bounded part with the
proven bound (``docs/analyses/mixture.md``): tabulating any subset of a group's windows is a leaf of the
same theorem, so every group's tracked bound stays valid.  Memory per group is at most about
``8 (K + 8)`` bytes in either part.  Counts, weights and means stay exact.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

import numpy as np

from gpuclust._xp import bincount
from gpuclust.analyses import mixture_summary as ms
from gpuclust.backends import backend_of

__all__ = ["MERGE_CHUNK_GROUPS", "TABULATE_ROWS", "empty", "finalize", "leaf", "merge", "spill_threshold", "to_backend"]

_STATS = ("n_windows", "n_repaired", "n_null", "weight", "wmean")
#: Groups per :func:`mixture_summary.merge` call when merging bounded summaries (bounds the
#: merge's temporaries -- about 40 arrays of ``(groups, 3 (K + 1))`` -- to a few hundred MB).
MERGE_CHUNK_GROUPS = 1024
#: Most rows a spill tabulates at once (:func:`_tabulate`): the mixture's sort and sweep take about
#: 1.1-1.4 kB a window on a device (72 B an event on the host), so a 10^6-window partition of a few
#: large groups (usage-distribution by tier's first pass) took ~1.3 GB at once, which ran a device
#: capped at a quarter of the data out of memory (bench/results/h200-2026-11-30).
TABULATE_ROWS = 1 << 18


def _xp_of(a: Any) -> ModuleType:
    return backend_of(a).xp


def spill_threshold(k: int | None) -> float:
    """Most usable windows a group keeps exactly (``inf`` for the exact strategy, ``k=None``)."""
    return float("inf") if k is None else float(max(1, (int(k) + 1) // 22))


def empty(k: int | None, xp: ModuleType = np) -> dict[str, Any]:
    """The identity: no groups (``k=None``: the exact strategy, which never spills)."""
    return {
        "kind": "hybrid",
        "k": k,
        "exact": ms.empty("exact", xp=xp),
        "bounded": ms.empty("bounded", ms.DEFAULT_K if k is None else int(k), xp=xp),
    }


def leaf(q: Any, w: Any, keys: Any, k: int | None, *, repaired: bool = False) -> dict[str, Any]:
    """The partial of one partition (inputs as :func:`mixture_summary.exact_partial`)."""
    xp = _xp_of(q)
    h = empty(k, xp)
    h["exact"] = ms.exact_partial(q, w, keys, repaired=repaired)
    return _spill(h)


def _take_exact(xp: ModuleType, e: dict[str, Any], gmask: Any) -> dict[str, Any]:
    codes = xp.searchsorted(e["key"], e["row_key"])
    rmask = gmask[codes] if codes.shape[0] else xp.zeros(0, dtype=bool)
    out = {"kind": "exact", "key": e["key"][gmask], **{s: e[s][gmask] for s in _STATS}}
    out.update(row_key=e["row_key"][rmask], q=xp.ascontiguousarray(e["q"][rmask]), w=e["w"][rmask])
    return out


def _spill(h: dict[str, Any]) -> dict[str, Any]:
    e, b, k = h["exact"], h["bounded"], h["k"]
    G = int(e["key"].shape[0])
    if k is None or G == 0:
        return h
    xp = _xp_of(e["weight"])
    codes = xp.searchsorted(e["key"], e["row_key"])
    counts = bincount(xp, codes, minlength=G) if codes.shape[0] else xp.zeros(G, dtype=xp.int64)
    move = counts > spill_threshold(k)
    Gb = int(b["key"].shape[0])
    if Gb:
        pos = xp.clip(xp.searchsorted(b["key"], e["key"]), 0, Gb - 1)
        move |= b["key"][pos] == e["key"]
    if not bool(move.any()):
        return h
    em = e if bool(move.all()) else _take_exact(xp, e, move)  # no copy when every group moves
    # the moved groups tabulated (:func:`_tabulate`: the mixture's quantiles at j / K and their
    # bounds), their stats -- zero-weight windows included -- kept from ``em``; the exact part
    # holds repaired, usable rows only: no second repair
    knots, err = _tabulate(xp, em, int(k))
    bm = {"kind": "bounded", "k": int(k), "key": em["key"], **{s: em[s] for s in _STATS}, "knots": knots, "err": err}
    return {
        "kind": "hybrid",
        "k": k,
        "exact": _take_exact(xp, e, ~move),
        "bounded": bm if Gb == 0 else _merge_bounded(b, bm),
    }


def _tabulate(xp: ModuleType, em: dict[str, Any], k: int) -> tuple[Any, Any]:
    """The knots and bounds of the groups of the exact part ``em`` (sorted, usable rows): one leaf
    (bound ``1/K``) when it holds at most :data:`TABULATE_ROWS` rows, else a leaf per slice of that
    many rows (cutting across groups: any subset of a group's windows tabulates as a leaf) merged
    pairwise, a balanced tree (bound ``(1 + ceil(log2 slices)) / K``); a group without weight gets
    NaN knots and bound 0."""
    lv = xp.asarray(ms.summary_levels(k))
    n, keys = int(em["q"].shape[0]), em["key"]
    if n <= TABULATE_ROWS:
        codes = xp.searchsorted(keys, em["row_key"]).astype(xp.int64)
        knots = backend_of(em["q"]).ops.mixture_quantiles(
            xp.ascontiguousarray(em["q"]), xp.ascontiguousarray(em["w"]), codes, int(keys.shape[0]), lv
        )
        return knots, xp.where(em["weight"] > 0, 1.0 / float(k), 0.0)
    parts = [
        ms.bounded_partial(em["q"][lo : lo + TABULATE_ROWS], em["w"][lo : lo + TABULATE_ROWS],
                           em["row_key"][lo : lo + TABULATE_ROWS], k, repaired=True)
        for lo in range(0, n, TABULATE_ROWS)
    ]  # fmt: skip
    while len(parts) > 1:
        parts = [ms.merge(*parts[i : i + 2]) if i + 1 < len(parts) else parts[i] for i in range(0, len(parts), 2)]
    p = parts[0]
    at = xp.searchsorted(p["key"], keys)
    has = at < int(p["key"].shape[0])
    has[has] = p["key"][at[has]] == keys[has]
    knots = xp.full((int(keys.shape[0]), k + 1), xp.nan)
    err = xp.zeros(int(keys.shape[0]))
    knots[has], err[has] = p["knots"][at[has]], p["err"][at[has]]
    return knots, xp.where(em["weight"] > 0, err, 0.0)


def _merge_bounded(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    """:func:`mixture_summary.merge` of bounded summaries, in chunks of key ranges (the same result:
    the merge is independent per group)."""
    xp = _xp_of(a["weight"])
    keys = xp.unique(xp.concatenate([a["key"], b["key"]]))  # = np.union1d
    if int(keys.shape[0]) <= MERGE_CHUNK_GROUPS:
        return ms.merge(a, b)
    cuts = keys[MERGE_CHUNK_GROUPS::MERGE_CHUNK_GROUPS]

    def pieces(p: dict[str, Any]) -> list[dict[str, Any]]:
        G = int(p["key"].shape[0])
        edges = [0, *[int(x) for x in xp.searchsorted(p["key"], cuts).tolist()], G]
        return [
            {f: (v[lo:hi] if hasattr(v, "shape") and v.ndim and v.shape[0] == G else v) for f, v in p.items()}
            for lo, hi in zip(edges[:-1], edges[1:], strict=True)
        ]

    parts = [ms.merge(x, y) for x, y in zip(pieces(a), pieces(b), strict=True)]
    return {
        f: (xp.concatenate([p[f] for p in parts]) if hasattr(v, "shape") and v.ndim else v) for f, v in parts[0].items()
    }


def merge(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    """Merge two partials (associative and commutative up to rounding, like their parts)."""
    if a["k"] != b["k"]:
        raise ValueError(f"cannot merge partials with k={a['k']} and k={b['k']}")
    h = {
        "kind": "hybrid",
        "k": a["k"],
        "exact": ms.merge(a["exact"], b["exact"]),
        "bounded": _merge_bounded(a["bounded"], b["bounded"]),
    }
    return _spill(h)


def to_backend(h: dict[str, Any], be: Any) -> dict[str, Any]:
    """A host partial moved onto backend ``be``."""
    return {
        f: (
            {g: (be.asarray(v) if isinstance(v, np.ndarray) else v) for g, v in p.items()} if isinstance(p, dict) else p
        )
        for f, p in h.items()
    }


def finalize(h: dict[str, Any], levels: Any) -> dict[str, Any]:
    """:func:`mixture_summary.finalize` of both parts, as one result sorted by key (exact groups
    have ``err_bound`` 0)."""
    re_ = ms.finalize(h["exact"], levels)
    rb = ms.finalize(h["bounded"], levels)
    xp = _xp_of(re_["weight"])
    key = xp.concatenate([re_["key"], rb["key"]])
    order = xp.argsort(key)
    out: dict[str, Any] = {"levels": re_["levels"]}
    for f in ("key", "n_windows", "n_repaired", "n_null", "weight", "mean", "quantiles", "err_bound"):
        out[f] = xp.concatenate([re_[f], rb[f]])[order]
    return out
