"""A slow, obvious, pure-Python ``data-quality``, written from docs/analyses/data-quality.md (never
from the code under test): one Python dict per row (``pyarrow.Table.to_pylist``), plain loops.

:func:`reference` returns ``{"checks": {(table, check): (count, unit, of)}, "nulls": {(table,
column): nulls}, "codes": {(table, column, code): rows}, "ratio": [max_cpu / cpu_p100 ...]}``.
"""

from __future__ import annotations

import math
from collections import defaultdict
from typing import Any

import pyarrow as pa

AFTER = 2**63 - 1
TERMINAL = {4, 5, 6, 7, 8}  # EVICT, FAIL, FINISH, KILL, LOST (v3 codes)
LEVELS = (0, 10, 20, 30, 40, 50, 60, 70, 80, 90, 91, 92, 93, 94, 95, 96, 97, 98, 99, 100)
THING = {"instance_events": "instances", "collection_events": "collections", "machine_events": "machines"}
KEY = {
    "instance_events": ("collection_id", "instance_index"),
    "collection_events": ("collection_id",),
    "machine_events": ("machine_id",),
}
#: The v3 document's state diagram: the state each event type leaves an instance (or collection)
#: in, and the event types that may follow each state.
PENDING, RUNNING, DEAD = "pending", "running", "dead"
STATE = {
    0: PENDING,
    1: PENDING,
    2: PENDING,
    9: PENDING,
    3: RUNNING,
    10: RUNNING,
    4: DEAD,
    5: DEAD,
    6: DEAD,
    7: DEAD,
    8: DEAD,
}
MAY_FOLLOW = {PENDING: {1, 2, 3, 9, 5, 7, 8}, RUNNING: {10, 4, 5, 6, 7, 8}, DEAD: {0}}
#: Machines: after ADD (1) or UPDATE (3) the machine is there (REMOVE or UPDATE may follow); after
#: REMOVE (2) only ADD; UNKNOWN (0) is never flagged.
MACHINE_MAY_FOLLOW = {1: {2, 3}, 3: {2, 3}, 2: {1}}


def _unexpected(name: str, prev: int, cur: int) -> bool:
    if name == "machine_events":
        return prev in MACHINE_MAY_FOLLOW and cur != 0 and cur not in MACHINE_MAY_FOLLOW[prev]
    return prev in STATE and cur in STATE and cur not in MAY_FOLLOW[STATE[prev]]


CODE_COLUMNS = {
    "instance_events": ("type", "missing_type"),
    "collection_events": ("type", "missing_type"),
    "machine_events": ("type", "missing_data_reason"),
}


#: The usage checks of the documentation's table, in its order.
USAGE_FLAGS = (
    "start_zero",
    "start_after_trace",
    "end_zero",
    "end_after_trace",
    "machine_zero",
    "machine_dedicated",
    "end_before_start",
    "zero_length",
    "short_windows",
    "long_windows",
    "percentiles_null",
    "percentiles_partly_null",
    "percentiles_non_monotone",
    "p100_and_max",
    "p100_below_max",
    "p100_above_max",
    "cpi_mai_present",
    "cpi_mai_low_cpu_time",
    "cpi_out_of_range",
    "mai_out_of_range",
    "no_events_rows",
    "no_events_instances",
    "after_end_rows",
    "after_end_300s_rows",
    "after_end_instances",
    "past_end_rows",
)


def _null(v: Any) -> bool:
    return v is None or (isinstance(v, float) and math.isnan(v))


def _known(v: Any) -> bool:
    return not _null(v)


def _table_profile(name: str, t: pa.Table, row_order: bool) -> tuple[dict, dict, dict]:
    rows = t.to_pylist()
    n = len(rows)
    checks: dict[tuple[str, str], tuple[int, str, int]] = {}
    nulls = {(name, c): sum(_null(r[c]) for r in rows) for c in t.column_names} if n else {}
    codes: dict[tuple[str, str, int], int] = defaultdict(int)
    if not n:
        return checks, nulls, codes
    for c in CODE_COLUMNS[name]:
        for r in rows:
            v = r[c]
            codes[(name, c, -1 if v is None else (v if 0 <= v <= 10 else -2))] += 1
    thing = THING[name]
    key = KEY[name]
    by: dict[tuple, list[dict]] = defaultdict(list)  # rows of each thing, in row order
    for r in rows:
        by[tuple(r[k] for k in key)].append(r)
    things = len(by)

    def add(check: str, count: int, unit: str = "rows") -> None:
        checks[(name, check)] = (count, unit, things if unit == thing else n)

    add("rows", n)
    add(thing, things, thing)
    add("time_zero", sum(r["time"] == 0 for r in rows))
    add("time_after_trace", sum(r["time"] == AFTER for r in rows))
    if "machine_id" in t.column_names:
        add("machine_zero", sum(r["machine_id"] == 0 for r in rows))
        add("machine_dedicated", sum(r["machine_id"] == -1 for r in rows))
    # ties: rows of a thing sharing their time with an earlier row of it
    add("time_ties", sum(len(rs) - len({r["time"] for r in rs}) for rs in by.values()))
    # out of order: in time order (ties: row order), an event that may not follow the previous one
    ooo = {}
    for k, rs in by.items():
        ts = sorted(rs, key=lambda r: r["time"])  # stable
        ooo[k] = sum(_unexpected(name, ts[j - 1]["type"], ts[j]["type"]) for j in range(1, len(ts)))
    add("out_of_order", sum(ooo.values()))
    add(f"out_of_order_{thing}", sum(v > 0 for v in ooo.values()), thing)
    if row_order:
        back = {k: sum(rs[j]["time"] < rs[j - 1]["time"] for j in range(1, len(rs))) for k, rs in by.items()}
        add("time_backwards", sum(back.values()))
        add(f"time_backwards_{thing}", sum(v > 0 for v in back.values()), thing)
    if name == "machine_events":
        nocap = [_null(r["cap_cpu"]) or _null(r["cap_mem"]) for r in rows]
        add("null_capacity_rows", sum(nocap))
        add(
            "null_capacity_machines",
            sum(any(_null(r["cap_cpu"]) or _null(r["cap_mem"]) for r in rs) for rs in by.values()),
            thing,
        )
        add(
            "never_capacity_machines",
            sum(all(_null(r["cap_cpu"]) or _null(r["cap_mem"]) for r in rs) for rs in by.values()),
            thing,
        )
    return checks, nulls, codes


def final_ends(events: list[dict]) -> dict[tuple[int, int], int | None]:
    """Each instance's final terminal time: its last event in time order (ties: the later row) when
    that event is terminal and not at 2^63-1; else None."""
    last: dict[tuple[int, int], dict] = {}
    for r in sorted(events, key=lambda r: r["time"]):  # stable: ties keep row order
        last[(r["collection_id"], r["instance_index"])] = r
    return {k: (r["time"] if r["type"] in TERMINAL and r["time"] != AFTER else None) for k, r in last.items()}


def _usage_profile(usage: pa.Table, events: pa.Table, short_s: int) -> tuple[dict, dict, list[float]]:
    rows = usage.to_pylist()
    n = len(rows)
    checks: dict[tuple[str, str], tuple[int, str, int]] = {}
    if not n:
        return checks, {}, []
    nulls = {("instance_usage", c): sum(_null(r[c]) for r in rows) for c in usage.column_names}
    ends = final_ends(events.to_pylist())
    keys = {(r["collection_id"], r["instance_index"]) for r in rows}
    inst = len(keys)
    flags: dict[str, int] = dict.fromkeys(USAGE_FLAGS, 0)
    after_inst: set = set()
    ratios = []
    for r in rows:
        s, e = r["start_time"], r["end_time"]
        flags["start_zero"] += s == 0
        flags["start_after_trace"] += s == AFTER
        flags["end_zero"] += e == 0
        flags["end_after_trace"] += e == AFTER
        flags["machine_zero"] += r["machine_id"] == 0
        flags["machine_dedicated"] += r["machine_id"] == -1
        finite = s != AFTER and e != AFTER
        if finite:
            d = e - s
            flags["end_before_start"] += d < 0
            flags["zero_length"] += d == 0
            flags["short_windows"] += 0 <= d < short_s * 1_000_000
            flags["long_windows"] += d > short_s * 1_000_000
        vals = [r[f"cpu_p{q}"] for q in LEVELS]
        known = [v for v in vals if _known(v)]
        flags["percentiles_null"] += not known
        flags["percentiles_partly_null"] += 0 < len(known) < len(LEVELS)
        flags["percentiles_non_monotone"] += any(known[k] < known[j] for k in range(len(known)) for j in range(k))
        p100, mx = r["cpu_p100"], r["max_cpu"]
        if _known(p100) and _known(mx):
            flags["p100_and_max"] += 1
            flags["p100_below_max"] += p100 < mx
            flags["p100_above_max"] += p100 > mx
            if p100 > 0:
                ratios.append(mx / p100)
        # CPI / MAI: cpi's plausibility rule, first failing reason
        cpi, mai, avg = r["cpi"], r["mai"], r["avg_cpu"]
        if _known(cpi) and _known(mai) and math.isfinite(cpi) and math.isfinite(mai):
            flags["cpi_mai_present"] += 1
            secs = (e - s) / 1e6 if finite else -1e-6
            cs = avg * secs if _known(avg) else float("nan")
            if not (cs > 0 and math.isfinite(cs) and cs >= 0.01):
                flags["cpi_mai_low_cpu_time"] += 1
            elif not (0 < cpi <= 100):
                flags["cpi_out_of_range"] += 1
            elif not (0 <= mai <= 1):
                flags["mai_out_of_range"] += 1
        k = (r["collection_id"], r["instance_index"])
        if k not in ends:
            flags["no_events_rows"] += 1
        end = ends.get(k)
        if end is not None:
            if s >= end:
                flags["after_end_rows"] += 1
                flags["after_end_300s_rows"] += s - end >= 300_000_000
                after_inst.add(k)
            elif e > end:
                flags["past_end_rows"] += 1
    flags["no_events_instances"] = len(keys - set(ends))
    flags["after_end_instances"] = len(after_inst)
    for c, v in flags.items():
        unit = "instances" if c.endswith("instances") else "rows"
        of = (
            inst if unit == "instances" else (flags["p100_and_max"] if c in ("p100_below_max", "p100_above_max") else n)
        )
        checks[("instance_usage", c)] = (v, unit, of)
    checks[("instance_usage", "rows")] = (n, "rows", n)
    checks[("instance_usage", "instances")] = (inst, "instances", inst)
    ev_keys = set(ends)
    if events.num_rows:  # instances with an event on a dedicated machine (-1) apart: no usage there
        ded = {(r["collection_id"], r["instance_index"]) for r in events.to_pylist() if r["machine_id"] == -1}
        other = ev_keys - ded
        checks[("instance_events", "instances_without_usage")] = (len(other - keys), "instances", len(other))
        checks[("instance_events", "dedicated_instances_without_usage")] = (
            len((ev_keys & ded) - keys),
            "instances",
            len(ev_keys & ded),
        )
    return checks, nulls, ratios


def reference(tables: dict[str, pa.Table], short_s: int = 300, row_order: bool = False) -> dict[str, Any]:
    from gpuclust.schema import SCHEMAS

    def get(t: str) -> pa.Table:
        return tables.get(t, SCHEMAS[t].empty_table())

    checks, nulls, codes = {}, {}, {}
    for name in THING:
        c, nu, co = _table_profile(name, get(name), row_order)
        checks.update(c)
        nulls.update(nu)
        codes.update(co)
    c, nu, ratios = _usage_profile(get("instance_usage"), get("instance_events"), short_s)
    checks.update(c)
    nulls.update(nu)
    return {"checks": checks, "nulls": nulls, "codes": dict(codes), "ratio": ratios}
