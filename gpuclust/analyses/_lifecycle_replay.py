"""``lifecycle``'s replay of a partition's events (:meth:`gpuclust.analyses.lifecycle.Lifecycle._replay`),
step by step: each instance's events together in time order (:func:`instance_rows`), each
instance's tier and kind x tier slot (:func:`instance_slots`), the event and transition counts
(:func:`event_counts`), the pending sub-states (:func:`pending_substates`), the series partial
(:func:`series_counts`), the episodes (:func:`state_episodes`, :func:`queued_stretches`) and their
duration sums (:func:`duration_sums`).

Each step is a few whole-array operations on NumPy or CuPy arrays (no loop over events), so
splitting the replay costs a few calls a partition; each step's temporaries are freed when it
returns, as the replay freed them when done.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from gpuclust._xp import bincount
from gpuclust.analyses._lifecycle_tables import (
    _B,
    _D,
    _DELAY_BINS,
    _DI,
    _NE,
    _NONE,
    _NS,
    _PENDING,
    _PENDING_EXIT,
    _QUEUED_EXIT,
    _RUNNING,
    _RUNNING_EXIT,
    _SERIES_CLASS,
    _T,
    STATE_AFTER,
    delay_bins,
    series_partial,
)
from gpuclust.analyses.base import is_null_int
from gpuclust.analyses.grouping import bucket_index, instance_order, segmented_last
from gpuclust.keys import pack
from gpuclust.schema import TIME_AFTER_TRACE, EventType
from gpuclust.tiers import tier_codes

I64_MAX = np.iinfo(np.int64).max


@dataclass(frozen=True)
class Rows:
    """A partition's valid events (type known), each instance's together in time order (ties keep
    the row order)."""

    n: int
    t: Any  # time
    e: Any  # event type (int64)
    first: Any  # whether the row is its instance's first
    starts: Any  # each instance's first row
    seg: Any  # each row's instance number
    seg_start: Any  # each row's instance's first row
    last_row: Any  # each instance's last row (int64)
    synth: Any  # whether the trace synthesised the event (missing_type set)


def instance_rows(xp: Any, cols: dict[str, Any], key_columns: tuple[str, ...], counters: dict[str, int]) -> Any:
    """``(rows, collection_id, priority, collection_type)`` of the valid rows of ``cols`` (the
    last three in the rows' order), or None where no row is valid; counts rows, invalid rows and
    synthesised events into ``counters``."""
    e = cols["type"].astype(xp.int64)
    counters["rows"] = n_all = int(e.shape[0])
    ok = (e >= 0) & (e < _NE)
    n = int(xp.count_nonzero(ok))
    counters["invalid_type_rows"] = n_all - n
    if n == 0:
        return None
    rows = None if n == n_all else xp.nonzero(ok)[0]
    del ok

    def pick(a: Any) -> Any:
        return a if rows is None else a[rows]

    t, c, p, mt, ct = (pick(cols[k]) for k in ("time", "collection_id", "priority", "missing_type", "collection_type"))
    i = pick(cols["instance_index"]) if "instance_index" in key_columns else xp.zeros(n, dtype=xp.int32)
    e = pick(e)
    order = instance_order(xp, c, i, t)
    t, e, c, i, p, mt, ct = (xp.take(a, order) for a in (t, e, c, i, p, mt, ct))
    del order
    first = xp.ones(n, dtype=bool)
    first[1:] = (c[1:] != c[:-1]) | (i[1:] != i[:-1])
    del i  # (each array freed when done: the later ones reuse its memory, no fresh pages)
    starts = xp.nonzero(first)[0]
    seg = xp.cumsum(first) - 1
    # events the trace synthesised (missing_type set, not NONE; NULL is the int minimum)
    synth = mt.astype(xp.int64) > 0
    counters["synthesized_events"] = int(xp.count_nonzero(synth))
    last_row = xp.concatenate([starts[1:] - 1, xp.asarray([n - 1], dtype=starts.dtype)]).astype(xp.int64)
    return Rows(n, t, e, first, starts, seg, starts[seg], last_row, synth), c, p, ct


def instance_max(ops: Any, xp: Any, r: Rows, v: Any) -> Any:
    """Each instance's largest value of ``v`` (int64, -1: none known)."""
    if ops.lookup_slot_tables:  # host NumPy arrays: one pass over the runs
        return np.maximum.reduceat(v, r.starts)
    S = int(r.starts.shape[0])
    width = int(v.max()) + 2
    ranked = xp.sort(r.seg * width + (v + 1))
    hi = ranked[xp.searchsorted(ranked, (xp.arange(S, dtype=xp.int64) + 1) * width, side="left") - 1]
    return hi - xp.arange(S, dtype=xp.int64) * width - 1


def instance_slots(
    backend: Any, ctx: Any, r: Rows, c: Any, p: Any, ct: Any, counters: dict[str, int]
) -> tuple[Any, Any]:
    """Each instance's tier code and kind x tier slot: the tier of its highest priority (NULL:
    none; all NULL: unknown; a collection without one: its instances' highest, when the context
    has them), its kind its collection_type (0, 1; NULL or other: unknown)."""
    xp, ops = backend.xp, backend.ops
    maxp = instance_max(ops, xp, r, xp.where(is_null_int(xp, p), -1, p.astype(xp.int64)))
    unknown = int(xp.count_nonzero(maxp < 0))
    if ctx.job_ids is not None and int(ctx.job_ids.shape[0]):
        counters["priority_from_instances"] = 0
        if unknown:  # (a 2019 cell's collections carry their priority: the lookup is not copied in)
            ids, jp = backend.stage(ctx.job_ids), backend.stage(ctx.job_priority)  # (copied once a process)
            cs = c[r.starts]
            pos = xp.minimum(xp.searchsorted(ids, cs), int(ids.shape[0]) - 1)
            fill = (maxp < 0) & (ids[pos] == cs) & (jp[pos] >= 0)
            counters["priority_from_instances"] = filled = int(xp.count_nonzero(fill))
            maxp = xp.where(fill, jp[pos], maxp)
            unknown -= filled
    tier_s = tier_codes(xp, ctx.tier_map, maxp, len(ctx.tier_map.names))  # maxp -1 (none known): unknown
    counters["unknown_priority_instances"] = unknown
    kmax = instance_max(ops, xp, r, xp.where((ct >= 0) & (ct <= 1), ct.astype(xp.int64), -1))
    return tier_s, pack(xp.where(kmax >= 0, kmax, 2).astype(xp.int64), tier_s, _T)


def instance_counters(xp: Any, r: Rows, counters: dict[str, int]) -> tuple[Any, Any]:
    """Counts instances, those first seen other than by SUBMIT, those present at the trace start
    (first event at time 0, before the trace window) and events at time 0 and after the trace;
    returns per row whether its instance was present at the start and whether it is after the
    trace."""
    counters["instances"] = int(r.starts.shape[0])
    counters["first_not_submit"] = int(xp.count_nonzero(r.e[r.starts] != int(EventType.SUBMIT)))
    counters["time_zero_events"] = int(xp.count_nonzero(r.t == 0))
    pas = r.t[r.starts] == 0
    counters["present_at_start"] = int(xp.count_nonzero(pas))
    after = r.t == TIME_AFTER_TRACE
    counters["after_trace_events"] = int(xp.count_nonzero(after))
    return pas[r.seg], after


def event_counts(xp: Any, r: Rows, slot: Any, out: dict[str, Any]) -> tuple[Any, Any]:
    """``out``'s events and transitions per slot; returns each row's state after its event and
    before it (:data:`_NONE` at an instance's first)."""
    e, first = r.e, r.first
    out["events"] = bincount(xp, slot * _NE + e, minlength=_NS * _NE).reshape(_NS, _NE).astype(xp.int64)
    state = xp.asarray(STATE_AFTER)[e]
    prev_e = xp.empty(r.n, dtype=xp.int64)
    prev_e[0] = 0
    prev_e[1:] = e[:-1]
    prev_state = xp.where(first, _NONE, xp.asarray(STATE_AFTER)[prev_e])
    # an instance's first event has no transition: counted in an extra last bin, dropped
    pair = (slot * _NE + prev_e) * _NE + e
    pair[first] = _NS * _NE * _NE
    out["transitions"] = bincount(xp, pair, minlength=_NS * _NE * _NE + 1)[:-1].reshape(_NS, _NE, _NE).astype(xp.int64)
    return state, prev_state


def pending_substates(ops: Any, xp: Any, r: Rows, state: Any) -> tuple[Any, Any]:
    """Per row whether the instance is queued (deferred: after a QUEUE) and eligible (after an
    ENABLE), each until the next SUBMIT, QUEUE or ENABLE (UPDATE_PENDING keeps it) or the end of
    the pending stay."""
    e = r.e
    mark = (
        (e == int(EventType.SUBMIT)) | (e == int(EventType.QUEUE)) | (e == int(EventType.ENABLE)) | (state != _PENDING)
    )
    lm = segmented_last(ops, xp, mark, r.seg_start)
    sub_e = xp.where(lm >= 0, e[xp.maximum(lm, 0)], -1)
    pend = state == _PENDING
    return pend & (sub_e == int(EventType.QUEUE)), pend & (sub_e == int(EventType.ENABLE))


def series_counts(
    backend: Any,
    r: Rows,
    states: tuple[Any, Any, Any, Any],
    tier: Any,
    pas_row: Any,
    live: Any,
    width_us: int,
) -> dict[str, Any]:
    """The series partial: counts and state changes per (bucket, tier) of the events (``states``:
    each row's state, previous state, queued and eligible) at rows ``live`` (those not after the
    trace)."""
    xp = backend.xp
    e, t, first, n = r.e, r.t, r.first, r.n
    state, prev_state, queued, eligible = states
    is_sub = e == int(EventType.SUBMIT)
    csub = xp.cumsum(is_sub.astype(xp.int64))
    csub = csub - (csub[r.starts] - is_sub[r.starts].astype(xp.int64))[r.seg]  # SUBMITs so far in the instance
    i64 = xp.int64
    # one code per event: its series class (SUBMIT new / again / of an instance present at the start,
    # SCHEDULE, ..., other), its level changes (-1, 0, +1 each) and whether it is the first event of an
    # instance present at the start, counted per (bucket, tier) at once
    first_sub = is_sub & (csub == 1)
    cls = xp.asarray(_SERIES_CLASS)[e] + (is_sub & ~(first_sub & ~pas_row))
    cls = xp.where(first_sub & pas_row & (t == 0), 9, cls)

    def change(now: Any) -> Any:
        was = xp.zeros(n, dtype=bool)
        was[1:] = now[:-1]
        return now.astype(i64) - (was & ~first).astype(i64) + 1

    d_p = (state == _PENDING).astype(i64) - (prev_state == _PENDING).astype(i64) + 1
    d_r = (state == _RUNNING).astype(i64) - (prev_state == _RUNNING).astype(i64) + 1
    code = ((((cls * 3 + d_p) * 3 + d_r) * 3 + change(queued)) * 3 + change(eligible)) * 2 + (first & pas_row).astype(
        i64
    )
    key = pack(bucket_index(t[live], width_us), tier[live], _T)
    return series_partial(backend, key, code[live])


#: Per replayed state: (state, the event that restarts an episode of it, the event that enters it
#: with a known start, the outcome of an episode by the event that ends it).
EPISODE_KINDS = (
    (_PENDING, int(EventType.SUBMIT), int(EventType.SUBMIT), _PENDING_EXIT),
    (_RUNNING, int(EventType.SCHEDULE), int(EventType.SCHEDULE), _RUNNING_EXIT),
)


def state_episodes(
    ops: Any,
    xp: Any,
    r: Rows,
    kind: tuple[int, int, int, Any],
    states: tuple[Any, Any],
    slots: tuple[Any, Any],
    data_end: int | None,
    recs: list[tuple[Any, Any, Any, Any]],
) -> int:
    """Appends to ``recs`` (slot, distribution, duration, duration known) the episodes of one
    state (``kind``, of :data:`EPISODE_KINDS`; ``states``: each row's state and previous state;
    ``slots``: each row's and each instance's slot).  Pending episodes end at the first event
    leaving the state (or a SUBMIT while pending), runs likewise (or a SCHEDULE while running);
    those open at the end of the data are censored.  A duration is known when the episode began
    with its SUBMIT (SCHEDULE) after time 0, ended before 2^63-1, and neither end is an event the
    trace synthesised.  Returns the episodes left without a duration by synthesised events."""
    st_, restart, entry_ev, exits = kind
    state, prev_state = states
    slot, slot_s = slots
    e, t, synth, seg_start = r.e, r.t, r.synth, r.seg_start
    n_synth = 0
    entry = ((state == st_) & (prev_state != st_)) | ((state == st_) & (e == restart) & (prev_state == st_))
    last_entry = segmented_last(ops, xp, entry, seg_start)
    x = xp.nonzero((prev_state == st_) & ((state != st_) | (e == restart)))[0]
    s = last_entry[x - 1]  # x is never an instance's first row (prev_state is set)
    sc = xp.maximum(s, 0)
    timed = (s >= 0) & (e[sc] == entry_ev) & (t[sc] != 0) & (t[x] != TIME_AFTER_TRACE)
    known = timed & ~synth[sc] & ~synth[x]
    n_synth += int(xp.count_nonzero(timed & ~known))
    recs.append((slot[x], xp.asarray(exits)[e[x]], t[x] - t[sc], known))
    if st_ == _PENDING:  # from the last ENABLE of the episode to its SCHEDULE
        le = segmented_last(ops, xp, e == int(EventType.ENABLE), seg_start)[x - 1]
        en = xp.nonzero((e[x] == int(EventType.SCHEDULE)) & (le > s) & known & ~synth[xp.maximum(le, 0)])[0]
        recs.append(
            (
                slot[x[en]],
                xp.full(int(en.shape[0]), _DI["enable_to_schedule", "scheduled"], xp.int64),
                t[x[en]] - t[le[en]],
                xp.ones(int(en.shape[0]), dtype=bool),
            )
        )
    # censored: the instance's last event leaves it in this state
    last_row = r.last_row
    cz = xp.nonzero(state[last_row] == st_)[0]
    s = last_entry[last_row[cz]]
    sc = xp.maximum(s, 0)
    d_cens = _DI["scheduling" if st_ == _PENDING else "execution", "censored"]
    if data_end is None:
        known = xp.zeros(int(cz.shape[0]), dtype=bool)
        dur = xp.zeros(int(cz.shape[0]), dtype=xp.int64)
    else:
        timed = (s >= 0) & (e[sc] == entry_ev) & (t[sc] != 0) & (t[sc] <= data_end)
        known = timed & ~synth[sc]
        n_synth += int(xp.count_nonzero(timed & ~known))
        dur = data_end - t[sc]
    recs.append((slot_s[cz], xp.full(int(cz.shape[0]), d_cens, xp.int64), dur, known))
    return n_synth


def queued_stretches(
    ops: Any,
    xp: Any,
    r: Rows,
    queued: Any,
    slots: tuple[Any, Any],
    data_end: int | None,
    recs: list[tuple[Any, Any, Any, Any]],
) -> int:
    """Appends to ``recs`` the queued stretches: from the QUEUE that defers a pending instance to
    the event that ends the deferral (ENABLE, SCHEDULE, SUBMIT, a death, UPDATE_RUNNING), or
    censored.  Returns the stretches left without a duration by synthesised events."""
    e, t, synth, first, n = r.e, r.t, r.synth, r.first, r.n
    slot, slot_s = slots
    n_synth = 0
    was_q = xp.zeros(n, dtype=bool)
    was_q[1:] = queued[:-1]
    was_q &= ~first
    q_in = segmented_last(ops, xp, queued & ~was_q, r.seg_start)
    x = xp.nonzero(was_q & ~queued)[0]
    s = q_in[x - 1]
    timed = (t[s] != 0) & (t[x] != TIME_AFTER_TRACE)
    known = timed & ~synth[s] & ~synth[x]
    n_synth += int(xp.count_nonzero(timed & ~known))
    recs.append((slot[x], xp.asarray(_QUEUED_EXIT)[e[x]], t[x] - t[s], known))
    last_row = r.last_row
    cz = xp.nonzero(queued[last_row])[0]
    s = q_in[last_row[cz]]
    if data_end is None:
        known, dur = xp.zeros(int(cz.shape[0]), dtype=bool), xp.zeros(int(cz.shape[0]), dtype=xp.int64)
    else:
        timed = (t[s] != 0) & (t[s] <= data_end)
        known = timed & ~synth[s]
        n_synth += int(xp.count_nonzero(timed & ~known))
        dur = data_end - t[s]
    recs.append((slot_s[cz], xp.full(int(cz.shape[0]), _DI["queued", "censored"], xp.int64), dur, known))
    return n_synth


def duration_sums(backend: Any, recs: list[tuple[Any, Any, Any, Any]], out: dict[str, Any]) -> None:
    """``out``'s episodes per (slot, distribution) of the records ``recs`` and, of those with a
    known duration, the duration bins, sum, minimum and maximum."""
    xp, ops = backend.xp, backend.ops
    rt, rd, rdur, rk = (xp.concatenate([r[j] for r in recs]) for j in range(4))
    td = rt * _D + rd
    out["episodes"] = bincount(xp, td, minlength=_NS * _D).reshape(_NS, _D).astype(xp.int64)
    kk = xp.nonzero(rk)[0]
    td, dur = td[kk], rdur[kk].astype(xp.int64)
    b = delay_bins(xp, dur, backend.stage(_DELAY_BINS.cells), backend.stage(_DELAY_BINS.edges))
    out["hist"] = bincount(xp, td * _B + b, minlength=_NS * _D * _B).reshape(_NS, _D, _B).astype(xp.int64, copy=False)
    out["dur_sum"] = bincount(xp, td, weights=dur.astype(xp.float64), minlength=_NS * _D).reshape(_NS, _D)
    if int(td.shape[0]):  # per (slot, distribution) the shortest and longest known duration
        dmax = xp.full(_NS * _D, -1, dtype=xp.int64)
        ops.scatter_max(dmax, td, dur)
        nmin = xp.full(_NS * _D, -I64_MAX, dtype=xp.int64)
        ops.scatter_max(nmin, td, -dur)
        out["dur_max"] = dmax.reshape(_NS, _D)
        out["dur_min"] = (-nmin).reshape(_NS, _D)
