"""A slow, obvious replay of instance life cycles, written from the v3 document's state diagram and
docs/analysis-lifecycle.md, as the reference the ``lifecycle`` analysis is tested against.

One Python loop per instance over its events in (time, row) order; no NumPy in the replay.
"""

from __future__ import annotations

import bisect
from collections import Counter, defaultdict
from typing import Any

SUBMIT, QUEUE, ENABLE, SCHEDULE, EVICT, FAIL, FINISH, KILL, LOST, UPDATE_PENDING, UPDATE_RUNNING = range(11)
NAMES = ["SUBMIT", "QUEUE", "ENABLE", "SCHEDULE", "EVICT", "FAIL", "FINISH", "KILL", "LOST", "UPDATE_PENDING",
         "UPDATE_RUNNING"]
AFTER_TRACE = 2**63 - 1
DEATHS = {EVICT: "evict", FAIL: "fail", FINISH: "finish", KILL: "kill", LOST: "lost"}


def state_after(e: int) -> str:
    if e in (SUBMIT, QUEUE, ENABLE, UPDATE_PENDING):
        return "pending"
    if e in (SCHEDULE, UPDATE_RUNNING):
        return "running"
    return "dead"


ALLOWED = {"pending": {QUEUE, ENABLE, SCHEDULE, UPDATE_PENDING, FAIL, KILL, LOST},
           "running": {UPDATE_RUNNING, EVICT, FAIL, FINISH, KILL, LOST},
           "dead": {SUBMIT}}


def tier_of(priorities: list[Any], bounds: tuple[int, ...], names: tuple[str, ...]) -> str:
    known = [p for p in priorities if p is not None]
    if not known:
        return "unknown"
    top = max(known)
    tier = "unknown"
    for name, lo in zip(names, bounds, strict=True):
        if top >= lo:
            tier = name
    return tier


def replay(rows: list[dict[str, Any]], bounds: tuple[int, ...], names: tuple[str, ...], bucket_us: int,
           data_end: int | None) -> dict[str, Any]:
    """``rows``: dicts with time, type, collection_id, instance_index, priority (None = NULL), in
    the dataset's order.  Returns counters and the exact episode durations."""
    by_inst: dict[tuple[int, int], list[tuple[int, int, dict[str, Any]]]] = defaultdict(list)
    invalid = 0
    for k, r in enumerate(rows):
        if not 0 <= r["type"] <= 10:
            invalid += 1
            continue
        by_inst[(r["collection_id"], r["instance_index"])].append((r["time"], k, r))
    events: Counter = Counter()
    transitions: Counter = Counter()
    series: dict[tuple[int, str], Counter] = defaultdict(Counter)
    episodes: dict[tuple[str, str, str], list[int | None]] = defaultdict(list)
    instances: Counter = Counter()
    first_not_submit = 0
    for evs in by_inst.values():
        evs.sort(key=lambda x: (x[0], x[1]))
        tier = tier_of([r["priority"] for _, _, r in evs], bounds, names)
        instances[tier] += 1
        if evs[0][2]["type"] != SUBMIT:
            first_not_submit += 1
        state = None
        submits = 0
        pend_start = None  # (time, type of the entering event)
        last_enable = None
        run_start = None
        prev = None
        for t, _, r in evs:
            e = r["type"]
            events[(tier, NAMES[e])] += 1
            if prev is not None:
                transitions[(tier, NAMES[prev], NAMES[e], e in ALLOWED[state_after(prev)])] += 1
            new = state_after(e)
            if t != AFTER_TRACE:
                s = series[(t // bucket_us, tier)]
                if e == SUBMIT:
                    submits_now = submits + 1
                    s["submissions"] += 1
                    s["new_submissions" if submits_now == 1 else "resubmissions"] += 1
                for code, field in ((SCHEDULE, "schedules"), (EVICT, "evictions"), (FAIL, "failures"),
                                    (FINISH, "finishes"), (KILL, "kills"), (LOST, "losses")):
                    if e == code:
                        s[field] += 1
                s["pending"] += (new == "pending") - (state == "pending")
                s["running"] += (new == "running") - (state == "running")
            if e == SUBMIT:
                submits += 1
            # pending episode ends: leaving pending, or a SUBMIT while pending
            if state == "pending" and (new != "pending" or e == SUBMIT):
                st, how = pend_start
                ok = how == SUBMIT and st != 0 and t != AFTER_TRACE
                outcome = ("scheduled" if e == SCHEDULE else "resubmitted" if e == SUBMIT
                           else DEATHS.get(e, "other"))
                episodes[(tier, "scheduling", outcome)].append(t - st if ok else None)
                if e == SCHEDULE and ok and last_enable is not None:
                    episodes[(tier, "enable_to_schedule", "scheduled")].append(t - last_enable)
            if state == "running" and (new != "running" or e == SCHEDULE):
                st, how = run_start
                ok = how == SCHEDULE and st != 0 and t != AFTER_TRACE
                episodes[(tier, "execution", DEATHS.get(e, "interrupted"))].append(t - st if ok else None)
            if new == "pending" and (state != "pending" or e == SUBMIT):
                pend_start, last_enable = (t, e), None
            if new == "pending" and e == ENABLE:
                last_enable = t
            if new == "running" and (state != "running" or e == SCHEDULE):
                run_start = (t, e)
            state, prev = new, e
        for st_name, start, entry, measure in (("pending", pend_start, SUBMIT, "scheduling"),
                                               ("running", run_start, SCHEDULE, "execution")):
            if state == st_name:
                st, how = start
                ok = data_end is not None and how == entry and st != 0 and st <= data_end
                episodes[(tier, measure, "censored")].append(data_end - st if ok else None)
    levels: dict[tuple[int, str], dict[str, int]] = {}
    for tier in {k[1] for k in series}:
        buckets = sorted(b for b, tr in series if tr == tier)
        pend = run = 0
        for b in range(buckets[0], buckets[-1] + 1) if buckets else ():
            c = series.get((b, tier), Counter())
            pend += c["pending"]
            run += c["running"]
            levels[(b, tier)] = {"pending": pend, "running": run}
    return {"events": events, "transitions": transitions, "series": series, "levels": levels,
            "episodes": episodes, "instances": instances, "first_not_submit": first_not_submit,
            "invalid": invalid}


def bin_of(d: int, edges: list[int]) -> int:
    """The delay bin of ``d`` µs: 0 for 0, else 1 + the number of edges at or below it, minus one."""
    return bisect.bisect_right(edges, d)
