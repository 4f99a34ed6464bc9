"""``lifecycle``'s Kaplan-Meier estimates from binned durations, and the per-collection priority a
``collection-lifecycle`` takes from instance events (docs/analyses/lifecycle.md).

The partials hold, per (kind, tier, measure, outcome), the episodes with a known duration as counts
in fixed log bins (``lifecycle.DELAY_EDGES_US``).  For a measure, the bins of the outcomes that end
it (the *events*) and of the ones that stop observing it (*censored*) give the product-limit
estimate over the durations coarsened to their bins: within a bin the events come first, then the
censorings (the usual rule for ties).  It equals Kaplan-Meier's on the exact durations at the bin
edges wherever no bin holds both an event and a censoring; otherwise the exact estimate can only be
lower, by a relative ``d c / ((n - c) (n - d))`` or less per such bin (docs/analyses/lifecycle.md).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa

from gpuclust.analyses._extent import to_i64

__all__ = [
    "SURVIVAL_MEASURES",
    "SURVIVAL_SCHEMA",
    "Z95",
    "kaplan_meier",
    "km_quantile",
    "max_priority_by_collection",
    "survival_row",
    "survival_table",
]

#: The standard normal quantile of a two-sided 95% band.
Z95 = 1.959963984540054


def kaplan_meier(events: np.ndarray, censored: np.ndarray, z: float = Z95) -> tuple[np.ndarray, ...]:
    """``(S, lo, hi)`` after each bin: the product-limit estimate ``S_j = prod_{i<=j} (1 - d_i / n_i)``
    (``n_i``: episodes still at risk at bin ``i``'s start, ``d_i`` the events in it) and its
    pointwise band by Greenwood's variance on the log-log scale (``S^exp(+-z sqrt(V) / log S)``,
    ``V = sum d_i / (n_i (n_i - d_i))``); where ``S`` is 1 the band is 1, where 0 it is 0.

    >>> s, lo, hi = kaplan_meier(np.array([0, 2, 0, 2]), np.array([0, 0, 1, 0]))
    >>> s.tolist()
    [1.0, 0.6, 0.6, 0.0]
    """
    d = np.asarray(events, np.float64)
    c = np.asarray(censored, np.float64)
    n = d.sum() + c.sum() - np.concatenate([[0.0], np.cumsum(d + c)[:-1]])
    with np.errstate(divide="ignore", invalid="ignore"):
        f = np.where(n > 0, 1.0 - d / np.where(n > 0, n, 1.0), 1.0)
        s = np.cumprod(f)
        g = np.where((d > 0) & (n > d), d / (n * (n - d)), 0.0)
        v = np.cumsum(g)
        v = np.where(np.cumsum((d > 0) & (n <= d)) > 0, np.inf, v)
        ls = np.log(s)
        theta = z * np.sqrt(v) / np.abs(ls)
        lo = np.where((s > 0) & (s < 1), s ** np.exp(theta), s)
        hi = np.where((s > 0) & (s < 1), s ** np.exp(-theta), s)
    s = np.where(f == 0, 0.0, s)  # an emptied risk set: exactly 0
    return s, np.minimum(lo, s), np.maximum(hi, s)


def km_quantile(s: np.ndarray, q: float) -> int | None:
    """The first bin where ``s`` falls to ``1 - q`` or below (a tolerance of 1e-12 for the
    product's rounding); ``None`` where it never does."""
    j = np.flatnonzero(s <= 1.0 - q + 1e-12)
    return int(j[0]) if j.size else None


def survival_row(events: np.ndarray, censored: np.ndarray, lo_s: np.ndarray, hi_s: np.ndarray) -> dict[str, Any]:
    """The ``survival`` columns of one (kind, tier, measure): counts, and for the median and p90
    the estimate (the lower edge of its bin) with its 95% band (the lower edge of the bin where the
    band's lower curve falls to the level, the upper edge of the bin where its upper curve does);
    NaN (NULL) where a curve never falls that far, or the bin is the last, open one."""
    s, lo, hi = kaplan_meier(events, censored)
    row: dict[str, Any] = {
        "episodes": int(events.sum() + censored.sum()),
        "events": int(events.sum()),
        "censored": int(censored.sum()),
    }
    for q, name in ((0.5, "p50"), (0.9, "p90")):
        j, jl, jh = km_quantile(s, q), km_quantile(lo, q), km_quantile(hi, q)
        row[f"km_{name}_s"] = np.nan if j is None else float(lo_s[j])
        row[f"km_{name}_lo_s"] = np.nan if jl is None else float(lo_s[jl])
        row[f"km_{name}_hi_s"] = np.nan if jh is None or not np.isfinite(hi_s[jh]) else float(hi_s[jh])
    return row


SURVIVAL_SCHEMA = pa.schema(
    [
        ("kind", pa.string()),
        ("tier", pa.string()),
        ("measure", pa.string()),
        ("episodes", pa.int64()),
        ("events", pa.int64()),
        ("censored", pa.int64()),
        *(
            (c, pa.float64())
            for c in ("km_p50_s", "km_p50_lo_s", "km_p50_hi_s", "km_p90_s", "km_p90_lo_s", "km_p90_hi_s")
        ),
        ("completed", pa.int64()),
        ("completed_p50_s", pa.float64()),
        ("completed_p90_s", pa.float64()),
    ]
)


def max_priority_by_collection(side: Any) -> tuple[np.ndarray, np.ndarray]:
    """Sorted collection ids of a side table of instance events and, per collection, the highest
    priority over its instances' events (NULLs ignored; -1 where every one is NULL), reduced batch
    by batch (a batch at a time in memory, then the per-batch maxima)."""
    ids: list[np.ndarray] = []
    top: list[np.ndarray] = []

    def reduce(c: np.ndarray, p: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        if c.size == 0:
            return c, p
        o = np.argsort(c, kind="stable")
        cs = c[o]
        st = np.flatnonzero(np.r_[True, cs[1:] != cs[:-1]])
        return cs[st], np.maximum.reduceat(p[o], st)

    for b in side.batches(["collection_id", "priority"]):
        p = to_i64(b.column("priority"))
        u, m = reduce(to_i64(b.column("collection_id")), np.where(p < 0, -1, p))
        ids.append(u)
        top.append(m)
    if not ids:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    return reduce(np.concatenate(ids), np.concatenate(top))


#: Per measure: the outcome whose episodes are the events (the rest are censored where they end),
#: and the outcome of the completed-only quantiles beside the estimate.
SURVIVAL_MEASURES: dict[str, tuple[tuple[str, ...], str]] = {
    "scheduling": (("scheduled",), "scheduled"),
    "execution": (("evict", "fail", "finish", "kill", "lost", "interrupted"), "finish"),
}


def survival_table(
    pk: dict[str, np.ndarray],
    p: dict[str, np.ndarray],
    names: tuple[str, ...],
    kinds: list[str],
    present: list[int],
    di: dict[tuple[str, str], int],
    distributions: Any,
    edges_us: np.ndarray,
) -> pa.Table:
    """The ``survival`` table: per kind ("all", then each kind with things), tier and measure with
    an episode of known duration, the Kaplan-Meier estimates (:func:`survival_row`) and the
    completed-only median and p90 (the lower edges of their bins)."""
    from gpuclust.arrow_numpy import rows_table
    from gpuclust.partials import bin_quantile_edges

    edges_s = np.asarray(edges_us) / 1e6
    lo_s = np.concatenate([[0.0], edges_s])
    hi_s = np.concatenate([[0.0], edges_s[1:], [np.inf]])
    rows: list[dict[str, Any]] = []
    for kind, hist in (("all", p["hist"]), *((kinds[k], pk["hist"][k]) for k in present)):
        for j, tier in enumerate(names):
            for measure, (ends, done) in SURVIVAL_MEASURES.items():
                ds = [di[d] for d in di if d[0] == measure and d in set(distributions)]
                ev = sum(hist[j, di[measure, o]] for o in ends)
                cz = sum(hist[j, k] for k in ds) - ev
                if not (ev.sum() + cz.sum()):
                    continue
                h = hist[j, di[measure, done]]
                row = {
                    "kind": kind,
                    "tier": tier,
                    "measure": measure,
                    **survival_row(ev, cz, lo_s, hi_s),
                    "completed": int(h.sum()),
                    "completed_p50_s": np.nan,
                    "completed_p90_s": np.nan,
                }
                if h.sum():
                    for q, v in bin_quantile_edges(h, lo_s, (50, 90)).items():
                        row[f"completed_p{q}_s"] = float(v)
                rows.append(row)
    return rows_table(rows, SURVIVAL_SCHEMA)
