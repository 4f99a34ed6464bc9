"""A slow, obvious computation of ``usage-change`` (docs/analyses/usage-change.md), the reference
its tests compare with: Python loops over each instance's windows, no NumPy."""

from __future__ import annotations

import bisect
from collections import defaultdict
from typing import Any

AFTER_TRACE = 2**63 - 1
THRESHOLDS = (0.05, 0.10, 0.20, 0.50)


def tiers_of(events: list[dict[str, Any]], bounds: tuple[int, ...], names: tuple[str, ...]) -> dict[tuple, str]:
    """(collection_id, instance_index, machine_id) -> tier of the highest non-NULL priority over all
    its event rows (a NULL machine_id never matches); keys without a usable priority: unknown."""
    top: dict[tuple, int | None] = {}
    for r in events:
        if r["machine_id"] is None:
            continue
        k = (r["collection_id"], r["instance_index"], r["machine_id"])
        p = r["priority"]
        cur = top.get(k)
        top[k] = p if cur is None else (cur if p is None else max(cur, p))
    out = {}
    for k, p in top.items():
        tier = "unknown"
        if p is not None and p >= 0:
            for name, lo in zip(names, bounds, strict=True):
                if p >= lo:
                    tier = name
        out[k] = tier
    return out


def pairs(usage: list[dict[str, Any]], tiers: dict[tuple, str], max_gap_us: int) -> dict[str, Any]:
    """Per (tier, resource): every pair's (a, b); plus the counts of instances, gaps, unplaced ends."""
    by_inst: dict[tuple, list[tuple[int, int, dict[str, Any]]]] = defaultdict(list)
    for k, r in enumerate(usage):
        by_inst[(r["collection_id"], r["instance_index"])].append((r["start_time"], k, r))
    out: dict[tuple[str, str], list[tuple[Any, Any]]] = defaultdict(list)
    gaps = unplaced = n_pairs = 0
    for ws in by_inst.values():
        ws.sort(key=lambda x: (x[0], x[1]))
        for (_, _, w1), (_, _, w2) in zip(ws, ws[1:], strict=False):
            if w1["end_time"] == AFTER_TRACE:
                unplaced += 1
                continue
            if w2["start_time"] - w1["end_time"] > max_gap_us:
                gaps += 1
                continue
            n_pairs += 1
            tier = tiers.get((w1["collection_id"], w1["instance_index"], w1["machine_id"]), "unknown")
            for res, col in (("cpu", "avg_cpu"), ("mem", "avg_mem")):
                out[(tier, res)].append((w1[col], w2[col]))
    return {"pairs": out, "instances": len(by_inst), "gaps": gaps, "unplaced": unplaced, "n_pairs": n_pairs}


def describe(ab: list[tuple[Any, Any]], edges: list[float]) -> dict[str, Any]:
    """Counts, exact shares, the changes ``b / a - 1`` and their ratio bins, of one group's pairs."""
    unknown = sum(1 for a, b in ab if a is None or b is None)
    known = [(a, b) for a, b in ab if a is not None and b is not None]
    zz = sum(1 for a, b in known if a == 0 and b == 0)
    zp = sum(1 for a, b in known if a == 0 and b != 0)
    ratios = [b / a for a, b in known if a != 0]
    changes = [q - 1.0 for q in ratios]
    within = {h: sum(1 for r in changes if abs(r) <= h) for h in THRESHOLDS}
    bins: dict[int, int] = defaultdict(int)
    for q in ratios:
        bins[bisect.bisect_right(edges, q)] += 1
    return {
        "pairs": len(ab),
        "unknown": unknown,
        "zero_to_zero": zz,
        "zero_to_positive": zp,
        "defined": len(changes),
        "within": within,
        "ratios": ratios,
        "changes": changes,
        "bins": dict(bins),
    }


PERIOD_US = 300_000_000


def period_usage(usage: list[dict[str, Any]], machines: set[int] | None) -> dict[tuple, list[Any]]:
    """The machine level's (``machines``: the ids in machine_events) or, with ``machines=None``, the
    cluster level's usage per 300 s period, window by window: every window of a top-level instance
    (alloc_collection_id NULL or 0) with ``start >= 0`` and ``start < end < 2^63 - 1`` adds
    ``avg x overlap / 300 s`` to each period it overlaps (a NULL value adds nothing).  Returns
    ``{(machine or None, period): [cpu, mem, windows, cpu_known, mem_known]}``."""
    out: dict[tuple, list[Any]] = defaultdict(lambda: [0.0, 0.0, 0, 0, 0])
    for r in usage:
        if r["alloc_collection_id"] not in (None, 0):
            continue
        s, e = r["start_time"], r["end_time"]
        if s is None or e is None or not (0 <= s < e < AFTER_TRACE):
            continue
        if machines is not None and r["machine_id"] not in machines:
            continue
        m = r["machine_id"] if machines is not None else None
        for k in range(s // PERIOD_US, (e - 1) // PERIOD_US + 1):
            overlap = min(e, (k + 1) * PERIOD_US) - max(s, k * PERIOD_US)
            acc = out[(m, k)]
            acc[2] += 1
            for j, col in ((0, "avg_cpu"), (1, "avg_mem")):
                v = r[col]
                if v is not None and v == v:
                    acc[j] += v * (overlap / PERIOD_US)
                    acc[3 + j] += 1
    return out


def period_pairs(sums: dict[tuple, list[Any]]) -> dict[str, Any]:
    """Per resource, the (a, b) usage of every two consecutive periods (of one machine) that both
    hold a window (a period without a known value: None); the periods, pairs and gaps."""
    by: dict[Any, list[int]] = defaultdict(list)
    for m, k in sums:
        by[m].append(k)
    ab: dict[str, list[tuple[Any, Any]]] = {"cpu": [], "mem": []}
    n_pairs = gaps = 0
    for m, ks in by.items():
        ks.sort()
        for k1, k2 in zip(ks, ks[1:], strict=False):
            if k2 != k1 + 1:
                gaps += 1
                continue
            n_pairs += 1
            a, b = sums[(m, k1)], sums[(m, k2)]
            for j, res in enumerate(("cpu", "mem")):
                ab[res].append((a[j] if a[3 + j] else None, b[j] if b[3 + j] else None))
    return {"pairs": ab, "periods": len(sums), "machines": len(by), "n_pairs": n_pairs, "gaps": gaps}
