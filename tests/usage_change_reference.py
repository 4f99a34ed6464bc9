"""A slow, obvious computation of ``usage-change`` (docs/analysis-usage-change.md), the reference
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
    return {"pairs": len(ab), "unknown": unknown, "zero_to_zero": zz, "zero_to_positive": zp,
            "defined": len(changes), "within": within, "ratios": ratios, "changes": changes, "bins": dict(bins)}
