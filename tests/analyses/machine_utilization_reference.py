"""A slow, obvious replay of ``machine-utilization``'s default (time-weighted) mode, written from
docs/analyses/machine-utilization.md with plain Python loops and integers (microseconds): no
code of gpuclust is used.

* The window ``[w0, w1]``: the earliest ``start_time`` of instance_usage (at or above 0, below
  2^63-1) to the latest known ``start_time`` or ``end_time`` (not NULL, not 2^63-1).
* Machines: each machine's events (NULL machine ids and types other than ADD 1 / REMOVE 2 /
  UPDATE 3 ignored) in time order, ties by row order, each time clipped to the window.  ADD: up,
  with the row's capacity; UPDATE: the row's capacity (a NULL one is unknown); REMOVE: down.
* Per machine and 5-minute bucket ``[b x 300 s, (b + 1) x 300 s)``: up microseconds, and per
  resource capacity x up microseconds (unknown when any up piece there has an unknown capacity).
* Usage: top-level windows (``alloc_collection_id`` NULL or 0) with ``0 <= start < end < 2^63-1``
  on a machine of machine_events; ``avg x overlap`` added to each bucket they overlap (a NULL
  value adds nothing; every value NULL: the usage is unknown).
* A row per machine-bucket with up time; ``util = usage-seconds / capacity-seconds`` where the
  capacity-seconds are known and positive, else unknown.
"""

from __future__ import annotations

from typing import Any

AFTER = (1 << 63) - 1
W = 300_000_000
ADD, REMOVE, UPDATE = 1, 2, 3


def window(usage: list[dict[str, Any]]) -> tuple[int, int] | None:
    starts = [u["start_time"] for u in usage if u["start_time"] is not None and 0 <= u["start_time"] < AFTER]
    if not starts:
        return None
    known = [t for u in usage for t in (u["start_time"], u["end_time"]) if t is not None and t < AFTER]
    w0 = min(starts)
    return w0, max([w0, *known])


def up_pieces(events: list[dict[str, Any]], w0: int, w1: int) -> dict[int, list[tuple[int, int, Any, Any]]]:
    """machine -> [(start, end, cap_cpu, cap_mem)] while up (None: unknown capacity)."""
    per: dict[int, list[tuple[int, int, dict[str, Any]]]] = {}
    for row, e in enumerate(events):
        if e["machine_id"] is None or e["type"] not in (ADD, REMOVE, UPDATE):
            continue
        per.setdefault(e["machine_id"], []).append((e["time"], row, e))
    out: dict[int, list[tuple[int, int, Any, Any]]] = {}
    for m, evs in per.items():
        evs.sort(key=lambda x: (x[0], x[1]))
        up, cap, since = False, (None, None), 0
        pieces = out.setdefault(m, [])
        for t, _, e in evs:
            t = min(max(t, w0), w1)
            if up and t > since:
                pieces.append((since, t, *cap))
            if e["type"] in (ADD, UPDATE):
                cap = (e["cap_cpu"], e["cap_mem"])
            if e["type"] == ADD:
                up = True
            elif e["type"] == REMOVE:
                up = False
            since = t
        if up and w1 > since:
            pieces.append((since, w1, *cap))
    return out


def replay(tables: dict[str, Any]) -> dict[str, Any]:
    """``{"rows": {(machine, bucket): {...}}, "not_up": n}``: the machine table of the default mode
    and the machine-buckets holding a used window but no up time."""
    usage = tables["instance_usage"].to_pylist()
    events = tables["machine_events"].to_pylist()
    win = window(usage)
    if win is None:
        return {"rows": {}, "not_up": 0, "window": (0, 0)}
    w0, w1 = win
    grid: dict[tuple[int, int], dict[str, Any]] = {}
    for m, pieces in up_pieces(events, w0, w1).items():
        for s, e, cc, cm in pieces:
            for b in range(s // W, (e - 1) // W + 1):
                ov = min(e, (b + 1) * W) - max(s, b * W)
                g = grid.setdefault((m, b), {"up": 0, "cap_cpu": 0.0, "cap_mem": 0.0})
                g["up"] += ov
                for k, c in (("cap_cpu", cc), ("cap_mem", cm)):
                    g[k] = None if c is None or g[k] is None else g[k] + c * ov
    machines = {e["machine_id"] for e in events}
    use: dict[tuple[int, int], list[Any]] = {}
    for u in usage:
        s, e = u["start_time"], u["end_time"]
        if u["alloc_collection_id"] not in (None, 0) or s is None or e is None or not (0 <= s < e < AFTER):
            continue
        if u["machine_id"] not in machines:
            continue
        for b in range(s // W, (e - 1) // W + 1):
            ov = min(e, (b + 1) * W) - max(s, b * W)
            a = use.setdefault((u["machine_id"], b), [0, None, None])
            a[0] += 1
            for j, k in ((1, "avg_cpu"), (2, "avg_mem")):
                if u[k] is not None:
                    a[j] = (a[j] or 0.0) + u[k] * ov
    rows = {}
    for key, g in grid.items():
        if g["up"] <= 0:
            continue
        n, uc, um = use.get(key, [0, 0.0, 0.0])
        row: dict[str, Any] = {"up_s": g["up"] / 1e6, "windows": n}
        for r, us in (("cpu", uc), ("mem", um)):
            cap = g[f"cap_{r}"]
            row[f"{r}_usage"] = None if us is None else us / g["up"]
            row[f"cap_{r}"] = None if cap is None else cap / g["up"]
            row[f"{r}_util"] = us / cap if us is not None and cap is not None and cap > 0 else None
        rows[key] = row
    return {"rows": rows, "not_up": sum(1 for k in use if k not in rows), "window": (w0, w1)}
