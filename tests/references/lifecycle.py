"""A slow, obvious replay of instance life cycles, written from the v3 document's state diagram and
docs/analyses/lifecycle.md, as the reference the ``lifecycle`` analysis is tested against.

One Python loop per instance over its events in (time, row) order; no NumPy in the replay.
"""

from __future__ import annotations

import bisect
import math
from collections import Counter, defaultdict
from typing import Any

SUBMIT, QUEUE, ENABLE, SCHEDULE, EVICT, FAIL, FINISH, KILL, LOST, UPDATE_PENDING, UPDATE_RUNNING = range(11)
NAMES = [
    "SUBMIT",
    "QUEUE",
    "ENABLE",
    "SCHEDULE",
    "EVICT",
    "FAIL",
    "FINISH",
    "KILL",
    "LOST",
    "UPDATE_PENDING",
    "UPDATE_RUNNING",
]
AFTER_TRACE = 2**63 - 1
DEATHS = {EVICT: "evict", FAIL: "fail", FINISH: "finish", KILL: "kill", LOST: "lost"}


def state_after(e: int) -> str:
    if e in (SUBMIT, QUEUE, ENABLE, UPDATE_PENDING):
        return "pending"
    if e in (SCHEDULE, UPDATE_RUNNING):
        return "running"
    return "dead"


ALLOWED = {
    "pending": {QUEUE, ENABLE, SCHEDULE, UPDATE_PENDING, FAIL, KILL, LOST},
    "running": {UPDATE_RUNNING, EVICT, FAIL, FINISH, KILL, LOST},
    "dead": {SUBMIT},
}


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


def kind_of(types: list[Any], kinds: tuple[str, str, str]) -> str:
    known = [k for k in types if k in (0, 1)]
    return kinds[max(known)] if known else kinds[2]


def replay(
    rows: list[dict[str, Any]],
    bounds: tuple[int, ...],
    names: tuple[str, ...],
    bucket_us: int,
    data_end: int | None,
    kinds: tuple[str, str, str] = ("task", "alloc_instance", "unknown"),
    fallback_priority: dict[int, int] | None = None,
) -> dict[str, Any]:
    """``rows``: dicts with time, type, collection_id, instance_index, priority (None = NULL) and
    optionally missing_type and collection_type (absent = NULL), in the dataset's order.
    ``fallback_priority``: a collection's priority where none of its own events has one (the
    highest over its instances' events).  Returns counters and the exact episode durations, by
    tier (``episodes``) and by (kind, tier) (``kind_episodes``)."""
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
    kind_episodes: dict[tuple[str, str, str, str], list[int | None]] = defaultdict(list)
    kind_events: Counter = Counter()
    instances: Counter = Counter()
    kind_count: Counter = Counter()
    first_not_submit = present_at_start = synthesized = synth_excluded = from_instances = 0
    for (cid, _), evs in by_inst.items():
        evs.sort(key=lambda x: (x[0], x[1]))
        prios = [r["priority"] for _, _, r in evs]
        if all(p is None for p in prios) and fallback_priority and fallback_priority.get(cid, -1) >= 0:
            prios = [fallback_priority[cid]]
            from_instances += 1
        tier = tier_of(prios, bounds, names)
        kind = kind_of([r.get("collection_type") for _, _, r in evs], kinds)
        instances[tier] += 1
        kind_count[kind] += 1
        if evs[0][2]["type"] != SUBMIT:
            first_not_submit += 1
        present = evs[0][0] == 0  # present at the trace start: the first event at time 0
        present_at_start += present
        if present:
            series[(0, tier)]["present_at_start"] += 1
        state = None
        sub = None  # the pending sub-state: the last SUBMIT, QUEUE or ENABLE while pending
        submits = 0
        pend_start = None  # (time, type of the entering event, synthesised)
        last_enable = None
        run_start = None
        q_start = None  # (time, synthesised) of the QUEUE that began the current queued stretch
        prev = None

        def episode(measure: str, outcome: str, d: int | None, tier: str = tier, kind: str = kind) -> None:
            episodes[(tier, measure, outcome)].append(d)
            kind_episodes[(kind, tier, measure, outcome)].append(d)

        for t, _, r in evs:
            e = r["type"]
            syn = (r.get("missing_type") or 0) > 0
            synthesized += syn
            events[(tier, NAMES[e])] += 1
            kind_events[(kind, tier, NAMES[e])] += 1
            if prev is not None:
                transitions[(tier, NAMES[prev], NAMES[e], e in ALLOWED[state_after(prev)])] += 1
            new = state_after(e)
            new_sub = (e if e in (SUBMIT, QUEUE, ENABLE) else sub) if new == "pending" else None
            if t != AFTER_TRACE:
                s = series[(t // bucket_us, tier)]
                if e == SUBMIT:
                    submits_now = submits + 1
                    s["submissions"] += 1
                    if submits_now == 1 and not present:
                        s["new_submissions"] += 1
                    elif not (submits_now == 1 and present and t == 0):
                        s["resubmissions"] += 1
                for code, field in (
                    (SCHEDULE, "schedules"),
                    (EVICT, "evictions"),
                    (FAIL, "failures"),
                    (FINISH, "finishes"),
                    (KILL, "kills"),
                    (LOST, "losses"),
                ):
                    if e == code:
                        s[field] += 1
                s["pending"] += (new == "pending") - (state == "pending")
                s["running"] += (new == "running") - (state == "running")
                s["queued"] += (new_sub == QUEUE) - (sub == QUEUE)
                s["eligible"] += (new_sub == ENABLE) - (sub == ENABLE)
            # a queued stretch: from the QUEUE that defers the instance to the event that ends the deferral
            if sub == QUEUE and new_sub != QUEUE:
                st, syn0 = q_start
                timed = st != 0 and t != AFTER_TRACE
                ok = timed and not syn0 and not syn
                synth_excluded += timed and not ok
                outcome = {ENABLE: "enabled", SCHEDULE: "scheduled", SUBMIT: "resubmitted"}.get(
                    e, "died" if e in DEATHS else "other"
                )
                episode("queued", outcome, t - st if ok else None)
            if new_sub == QUEUE and sub != QUEUE:
                q_start = (t, syn)
            sub = new_sub
            if e == SUBMIT:
                submits += 1
            # pending episode ends: leaving pending, or a SUBMIT while pending
            # a duration is timed when it starts with its SUBMIT (SCHEDULE) after time 0 and ends
            # before 2^63-1; known when, besides, neither end was synthesised by the trace
            if state == "pending" and (new != "pending" or e == SUBMIT):
                st, how, syn0 = pend_start
                timed = how == SUBMIT and st != 0 and t != AFTER_TRACE
                ok = timed and not syn0 and not syn
                synth_excluded += timed and not ok
                outcome = "scheduled" if e == SCHEDULE else "resubmitted" if e == SUBMIT else DEATHS.get(e, "other")
                episode("scheduling", outcome, t - st if ok else None)
                if e == SCHEDULE and ok and last_enable is not None and not last_enable[1]:
                    episode("enable_to_schedule", "scheduled", t - last_enable[0])
            if state == "running" and (new != "running" or e == SCHEDULE):
                st, how, syn0 = run_start
                timed = how == SCHEDULE and st != 0 and t != AFTER_TRACE
                ok = timed and not syn0 and not syn
                synth_excluded += timed and not ok
                episode("execution", DEATHS.get(e, "interrupted"), t - st if ok else None)
            if new == "pending" and (state != "pending" or e == SUBMIT):
                pend_start, last_enable = (t, e, syn), None
            if new == "pending" and e == ENABLE:
                last_enable = (t, syn)
            if new == "running" and (state != "running" or e == SCHEDULE):
                run_start = (t, e, syn)
            state, prev = new, e
        for st_name, start, entry, measure in (
            ("pending", pend_start, SUBMIT, "scheduling"),
            ("running", run_start, SCHEDULE, "execution"),
        ):
            if state == st_name:
                st, how, syn0 = start
                timed = data_end is not None and how == entry and st != 0 and st <= data_end
                ok = timed and not syn0
                synth_excluded += timed and not ok
                episode(measure, "censored", data_end - st if ok else None)
        if sub == QUEUE:
            st, syn0 = q_start
            timed = data_end is not None and st != 0 and st <= data_end
            ok = timed and not syn0
            synth_excluded += timed and not ok
            episode("queued", "censored", data_end - st if ok else None)
    levels: dict[tuple[int, str], dict[str, int]] = {}  # (pending and running only; the check sums the rest)
    for tier in {k[1] for k in series}:
        buckets = sorted(b for b, tr in series if tr == tier)
        pend = run = 0
        for b in range(buckets[0], buckets[-1] + 1) if buckets else ():
            c = series.get((b, tier), Counter())
            pend += c["pending"]
            run += c["running"]
            levels[(b, tier)] = {"pending": pend, "running": run}
    return {
        "events": events,
        "transitions": transitions,
        "series": series,
        "levels": levels,
        "episodes": episodes,
        "instances": instances,
        "first_not_submit": first_not_submit,
        "invalid": invalid,
        "kind_episodes": kind_episodes,
        "kind_events": kind_events,
        "kinds": kind_count,
        "present_at_start": present_at_start,
        "synthesized_events": synthesized,
        "synthesized_duration_episodes": synth_excluded,
        "priority_from_instances": from_instances,
    }


def bin_of(d: int, edges: list[int]) -> int:
    """The delay bin of ``d`` µs: 0 for 0, else 1 + the number of edges at or below it, minus one."""
    return bisect.bisect_right(edges, d)


def max_priorities(rows: list[dict[str, Any]]) -> dict[int, int]:
    """Per collection_id, the highest priority over instance event rows (-1: none known)."""
    out: dict[int, int] = {}
    for r in rows:
        p = r["priority"]
        out[r["collection_id"]] = max(out.get(r["collection_id"], -1), -1 if p is None else p)
    return out


def kaplan_meier(pairs: list[tuple[int, bool]], z: float = 1.959963984540054) -> list[tuple[int, float, float, float]]:
    """The product-limit estimate over ``(duration, ended)`` pairs (``ended`` False: censored), at
    each distinct duration with an event: ``(t, S(t), lower, upper)``, the band by Greenwood's
    variance on the log-log scale.  At a tie, events come before censorings."""
    out = []
    s, v = 1.0, 0.0
    at: dict[int, list[int]] = defaultdict(lambda: [0, 0])  # duration: [events, censorings]
    for d, ended in pairs:
        at[d][0 if ended else 1] += 1
    n = len(pairs)  # at risk: durations not below t
    for t in sorted(at):
        k, c = at[t]
        if not k:
            n -= c
            continue
        s *= 1 - k / n
        v = v + k / (n * (n - k)) if n > k else math.inf
        if 0 < s < 1:
            th = z * math.sqrt(v) / abs(math.log(s))
            out.append((t, s, s ** math.exp(th), s ** math.exp(-th)))
        else:
            out.append((t, s, s, s))
        n -= k + c
    return out


def km_quantile(curve: list[tuple[int, float, float, float]], q: float, which: int = 1) -> int | None:
    """The first duration where column ``which`` of the curve (1: S, 2: lower, 3: upper) is at or
    below ``1 - q``; None where it never is."""
    for row in curve:
        if row[which] <= 1 - q + 1e-12:
            return row[0]
    return None
