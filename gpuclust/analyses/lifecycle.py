"""``lifecycle``: how instances flow through their life cycle (submission, queueing, scheduling,
running, death, resubmission), from ``instance_events``.

Every instance's events are replayed in time order (ties keep the dataset's row order) through
the state machine of the v3 document ("Collection and instance life cycles"): the state after an
event is determined by its type alone -- SUBMIT, QUEUE, ENABLE and UPDATE_PENDING leave the
instance **pending**, SCHEDULE and UPDATE_RUNNING **running**, EVICT, FAIL, FINISH, KILL and LOST
**dead**.  v2 (2011) datasets carry v3 codes after ingest, so both traces use one replay.

Result tables (docs/analyses/lifecycle.md):

``events``
    Events by type and tier (an instance's tier: its highest priority over its events).
``transitions``
    Consecutive event pairs of one instance, by tier, with ``expected``: whether the second
    event can follow the state the first one leaves in the v3 state diagram (pending: QUEUE,
    ENABLE, SCHEDULE, UPDATE_PENDING, FAIL, KILL, LOST; running: UPDATE_RUNNING and the five
    deaths; dead: SUBMIT).  Seed 003 reported such "unexpected" transitions in the 2011 trace
    (EVICT of a pending task, for one).
``series``
    Per time bucket and tier: submissions (new: an instance's first, unless it was present at the
    trace start; resubmissions; instances present at the start), schedules, deaths by kind, and
    the instances pending (the queue; of them queued after QUEUE, eligible after ENABLE) and
    running at the bucket's end.
``delays`` and ``delay_hist``
    Scheduling delay (from the SUBMIT that makes an instance pending to the event that ends the
    pending episode; ``enable_to_schedule`` from the last ENABLE before the SCHEDULE) and
    execution time (from SCHEDULE to the event that ends the run), and ``queued`` time (from a
    QUEUE to the event that ends the deferral), by tier and outcome.
    Episodes still pending or running at the end of the data are **censored**: counted, with the
    time elapsed until the last finite event time of the dataset.  Durations are exact integers
    of microseconds, kept as counts in fixed log bins (50 per decade, :data:`DELAY_EDGES_US`),
    so any number of episodes merges in bounded memory; quantiles are resolved to a bin (the
    exact quantile lies in ``[q, the bin's upper edge)``, under 4.7% above ``q``); count, mean,
    min and max are exact.
``survival``
    Kaplan-Meier median and p90 of scheduling delay and execution time, with log-log Greenwood
    95% bands, by kind and tier, beside the completed-only ones (from the delay bins: exact up to
    the bin width; :mod:`gpuclust.analyses._lifecycle_survival`).
``events_by_kind``, ``delays_by_kind``
    ``events`` and ``delays`` per kind (``collection_type``: task / alloc instance, job / alloc
    set; the other tables count every kind together).
``info``
    Row and instance counts, instances first seen other than by SUBMIT, present at the trace
    start (first event at time 0), events at time 0 and 2^63-1, synthesised events (missing_type
    set: never timing a duration) and the episodes they leave without one, instances by kind,
    unexpected transitions.

Per-instance sequences need every event of an instance in one partition: the analysis declares
:attr:`whole_instances`, so the engine runs it on the buckets of an instance-bucketed dataset
(``gpuclust optimize``), or as one partition of a flat one.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, ClassVar

import numpy as np
import pyarrow as pa

from gpuclust._parallel import map_ordered, threads
from gpuclust._xp import bincount
from gpuclust.analyses._extent import max_finite
from gpuclust.analyses._lifecycle_finalize import result_tables, summary_text, unknown_duration_reason
from gpuclust.analyses._lifecycle_survival import max_priority_by_collection
from gpuclust.analyses._lifecycle_tables import (
    _B,
    _COUNTERS,
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
    DELAY_EDGES_US,
    DISTRIBUTIONS,
    EVENT_NAMES,
    EXPECTED,
    SERIES_FIELDS,
    STATE_AFTER,
    delay_bins,
    series_partial,
)
from gpuclust.analyses.base import Analysis, is_null_int
from gpuclust.analyses.grouping import bucket_index, instance_order, segmented_last
from gpuclust.analyses.options import option, tier_map_option
from gpuclust.keys import hash64, pack
from gpuclust.partials import merge_keyed
from gpuclust.schema import TIME_AFTER_TRACE, EventType, TierMap
from gpuclust.tiers import TierNames, resolve_tier_map, tier_codes

__all__ = [
    "CollectionLifecycle",
    "DELAY_EDGES_US",
    "DISTRIBUTIONS",
    "EVENT_NAMES",
    "EXPECTED",
    "Lifecycle",
    "STATE_AFTER",
    "SERIES_FIELDS",
    "delay_bins",
    "unknown_duration_reason",
]

_I64_MAX = np.iinfo(np.int64).max
#: Rows of a partition from which the cpu path replays it as two halves (see ``Lifecycle.partial``).
SPLIT_ROWS = 1 << 19


@dataclass(frozen=True)
class LifecycleContext(TierNames):
    tier_map: TierMap
    #: The last finite event time of the data (censored episodes are measured to it); None: no events.
    data_end_us: int | None
    #: collection-lifecycle: sorted collection ids and the highest priority over each one's instance
    #: events (-1: none known), the priority of a collection whose own events carry none.
    job_ids: Any = None
    job_priority: Any = None


@dataclass(frozen=True)
class Lifecycle(Analysis):
    """Instance life cycles: event counts, transitions, time series, scheduling and execution times.

    Examples
    --------
    >>> Lifecycle(bucket_s=300).label
    'lifecycle[bucket_s=300]'
    """

    bucket_s: int = option(3600, "width of the series' time buckets, seconds (buckets of trace time from 0)", gt=0)
    tier_map: str | None = tier_map_option()

    name = "lifecycle"
    table = "instance_events"
    requires = ("instance_events",)
    #: tracemalloc peak of partial: 280 B/row (bench 1.6e7 set, 0.4M events), 272 (real 2011 task events)
    row_bytes = 320
    #: rows per partition for partitions="auto" (whole buckets): a replay holds ~300 B an event, so
    #: 128 Ki events keep a partition near 40 MB and the run's memory flat from a few 10^5 events on
    #: (docs/user/scale.md); the per-partition cost of a replay is small beside it
    auto_partition_rows = 1 << 17
    whole_instances: ClassVar[bool] = True

    #: The columns that name one thing whose events are replayed (an instance here), and its name
    #: in summaries (``info.instances`` counts them).
    key_columns: ClassVar[tuple[str, ...]] = ("collection_id", "instance_index")
    thing: ClassVar[str] = "instance"
    #: The names of the kinds of thing, by ``collection_type`` (0, 1, NULL or other).
    kinds: ClassVar[tuple[str, str, str]] = ("task", "alloc_instance", "unknown")

    @property
    def columns(self) -> tuple[str, ...]:
        return ("time", "type", *self.key_columns, "priority", "missing_type", "collection_type")

    @property
    def width_us(self) -> int:
        return int(self.bucket_s) * 1_000_000

    def context(self, source: Any) -> LifecycleContext:
        tm = resolve_tier_map(self.tier_map, source)
        if len(tm.names) + 1 > _T:
            raise ValueError(f"lifecycle: tier map {tm.name!r} has more than {_T - 1} tiers")
        return LifecycleContext(tm, max_finite(source, self.table, "time"))

    # ---------------------------------------------------------------- partial / merge
    def empty(self, backend: Any = None) -> dict[str, Any]:
        """The empty partial, its dense arrays in ``backend``'s memory (made there: nothing is
        copied to a device); the keyed series stay host arrays."""
        t = _NS  # kind x tier slots, trimmed to the context's tiers at finalize
        xp = np if backend is None else backend.xp
        return {
            "events": xp.zeros((t, _NE), np.int64),
            "transitions": xp.zeros((t, _NE, _NE), np.int64),
            "episodes": xp.zeros((t, _D), np.int64),
            "hist": xp.zeros((t, _D, _B), np.int64),
            "dur_sum": xp.zeros((t, _D)),
            "dur_min": xp.full((t, _D), _I64_MAX, np.int64),
            "dur_max": xp.full((t, _D), -1, np.int64),
            "instances": xp.zeros(t, np.int64),
            "series": {"key": np.zeros(0, np.int64), **{f: np.zeros(0, np.int64) for f in SERIES_FIELDS}},
            "counters": xp.zeros(len(_COUNTERS), np.int64),
        }

    def partial(self, cols: dict[str, Any], ctx: LifecycleContext, backend: Any) -> dict[str, Any]:
        """The replay of a partition's events; on host arrays (the cpu backend) from
        :data:`SPLIT_ROWS` rows on, of its two halves by instance hash (each instance whole in one,
        its rows in order), merged: on two threads where the engine has one to spare
        (:func:`gpuclust._parallel.threads`; a flat table is one partition, which would leave the
        other core idle).  The halves depend on the rows alone, so any thread count gives the same
        result."""
        n = int(cols["type"].shape[0])
        if n < SPLIT_ROWS or not backend.ops.lookup_slot_tables:
            return self._replay(cols, ctx, backend)
        upper = (hash64(np, [cols[k] for k in self.key_columns]) >> np.uint64(63)).astype(bool)
        halves = [np.flatnonzero(~upper), np.flatnonzero(upper)]
        del upper
        parts = list(
            map_ordered(
                lambda rows: self._replay({k: v[rows] for k, v in cols.items()}, ctx, backend),
                halves,
                threads=min(2, threads()),
            )
        )
        return self.merge(parts[0], parts[1])

    def _replay(self, cols: dict[str, Any], ctx: LifecycleContext, backend: Any) -> dict[str, Any]:
        xp, ops = backend.xp, backend.ops
        out: dict[str, Any] = self.empty(backend)
        T = _T
        unknown = len(ctx.tier_map.names)
        counters = dict.fromkeys(_COUNTERS, 0)
        e = cols["type"].astype(xp.int64)
        counters["rows"] = n_all = int(e.shape[0])
        ok = (e >= 0) & (e < _NE)
        n = int(xp.count_nonzero(ok))
        counters["invalid_type_rows"] = n_all - n
        if n == 0:
            out["counters"] = xp.asarray(np.array([counters[c] for c in _COUNTERS], np.int64))
            return out
        rows = None if n == n_all else xp.nonzero(ok)[0]

        def pick(a: Any) -> Any:
            return a if rows is None else a[rows]

        t, c, p, mt, ct = (
            pick(cols[k]) for k in ("time", "collection_id", "priority", "missing_type", "collection_type")
        )
        i = pick(cols["instance_index"]) if "instance_index" in self.key_columns else xp.zeros(n, dtype=xp.int32)
        e = pick(e)
        # ---- one instance's events together, in time order (ties keep row order)
        order = instance_order(xp, c, i, t)
        t, e, c, i, p, mt, ct = (xp.take(a, order) for a in (t, e, c, i, p, mt, ct))
        del order
        first = xp.ones(n, dtype=bool)
        first[1:] = (c[1:] != c[:-1]) | (i[1:] != i[:-1])
        del i  # (each array freed when done: the later ones reuse its memory, no fresh pages)
        starts = xp.nonzero(first)[0]
        S = int(starts.shape[0])
        seg = xp.cumsum(first) - 1
        seg_start = starts[seg]
        # ---- events the trace synthesised (missing_type set, not NONE; NULL is the int minimum)
        synth = mt.astype(xp.int64) > 0
        counters["synthesized_events"] = int(xp.count_nonzero(synth))
        del mt

        def top(v: Any) -> Any:  # each instance's largest value of v (int64, -1: none known)
            if ops.lookup_slot_tables:  # host NumPy arrays: one pass over the runs
                return np.maximum.reduceat(v, starts)
            width = int(v.max()) + 2
            ranked = xp.sort(seg * width + (v + 1))
            hi = ranked[xp.searchsorted(ranked, (xp.arange(S, dtype=xp.int64) + 1) * width, side="left") - 1]
            return hi - xp.arange(S, dtype=xp.int64) * width - 1

        # ---- each instance's tier: the tier of its highest priority (NULL: none; all NULL: unknown;
        # a collection without one: its instances' highest, when the context has them)
        pr = xp.where(is_null_int(xp, p), -1, p.astype(xp.int64))
        maxp = top(pr)
        if ctx.job_ids is not None and int(ctx.job_ids.shape[0]):
            ids, jp = backend.stage(ctx.job_ids), backend.stage(ctx.job_priority)  # (copied once a process)
            cs = c[starts]
            pos = xp.minimum(xp.searchsorted(ids, cs), int(ids.shape[0]) - 1)
            fill = (maxp < 0) & (ids[pos] == cs) & (jp[pos] >= 0)
            counters["priority_from_instances"] = int(xp.count_nonzero(fill))
            maxp = xp.where(fill, jp[pos], maxp)
        del c
        tier_s = tier_codes(xp, ctx.tier_map, maxp, unknown)  # maxp -1 (none known): unknown
        counters["unknown_priority_instances"] = int(xp.count_nonzero(maxp < 0))
        # ---- each instance's kind: its collection_type (0, 1; NULL or other: unknown)
        kmax = top(xp.where((ct >= 0) & (ct <= 1), ct.astype(xp.int64), -1))
        slot_s = pack(xp.where(kmax >= 0, kmax, 2).astype(xp.int64), tier_s, T)
        tier = tier_s[seg]
        slot = slot_s[seg]
        del p, pr, ct
        out["instances"] = bincount(xp, slot_s, minlength=_NS).astype(xp.int64)
        counters["instances"] = S
        counters["first_not_submit"] = int(xp.count_nonzero(e[starts] != int(EventType.SUBMIT)))
        counters["time_zero_events"] = int(xp.count_nonzero(t == 0))
        # an instance present at the trace start: its first event at time 0 (before the trace window)
        pas = t[starts] == 0
        counters["present_at_start"] = int(xp.count_nonzero(pas))
        pas_row = pas[seg]
        after = t == TIME_AFTER_TRACE
        counters["after_trace_events"] = int(xp.count_nonzero(after))
        # ---- events, transitions
        out["events"] = bincount(xp, slot * _NE + e, minlength=_NS * _NE).reshape(_NS, _NE).astype(xp.int64)
        state = xp.asarray(STATE_AFTER)[e]
        prev_e = xp.empty(n, dtype=xp.int64)
        prev_e[0] = 0
        prev_e[1:] = e[:-1]
        prev_state = xp.where(first, _NONE, xp.asarray(STATE_AFTER)[prev_e])
        # an instance's first event has no transition: counted in an extra last bin, dropped
        pair = (slot * _NE + prev_e) * _NE + e
        pair[first] = _NS * _NE * _NE
        out["transitions"] = (
            bincount(xp, pair, minlength=_NS * _NE * _NE + 1)[:-1].reshape(_NS, _NE, _NE).astype(xp.int64)
        )
        del pair
        # ---- pending sub-states: queued (deferred) after a QUEUE, eligible after an ENABLE, each until
        # the next SUBMIT, QUEUE or ENABLE (UPDATE_PENDING keeps it) or the end of the pending stay
        mark = (
            (e == int(EventType.SUBMIT))
            | (e == int(EventType.QUEUE))
            | (e == int(EventType.ENABLE))
            | (state != _PENDING)
        )
        lm = segmented_last(ops, xp, mark, seg_start)
        sub_e = xp.where(lm >= 0, e[xp.maximum(lm, 0)], -1)
        pend = state == _PENDING
        queued = pend & (sub_e == int(EventType.QUEUE))
        eligible = pend & (sub_e == int(EventType.ENABLE))
        del mark, lm, sub_e, pend
        # ---- series: counts and state changes per (bucket, tier); events after the trace are not placed
        is_sub = e == int(EventType.SUBMIT)
        csub = xp.cumsum(is_sub.astype(xp.int64))
        csub = csub - (csub[starts] - is_sub[starts].astype(xp.int64))[seg]  # SUBMITs so far in the instance
        n_after = counters["after_trace_events"]
        live = slice(None) if n_after == 0 else xp.nonzero(~after)[0]  # (a slice: no gathers)
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
        code = ((((cls * 3 + d_p) * 3 + d_r) * 3 + change(queued)) * 3 + change(eligible)) * 2 + (
            first & pas_row
        ).astype(i64)
        key = pack(bucket_index(t[live], self.width_us), tier[live], T)
        out["series"] = series_partial(backend, key, code[live])
        del is_sub, csub, first_sub, cls, d_p, d_r, code, key, after, eligible, pas_row
        # ---- episodes: pending ones end at the first event leaving the state (or a SUBMIT while pending),
        # runs likewise (or a SCHEDULE while running); those open at the end of the data are censored.
        # A duration is known when the episode began with its SUBMIT (SCHEDULE) after time 0, ended before
        # 2^63-1, and neither end is an event the trace synthesised.
        end = n - 1
        last_row = xp.concatenate([starts[1:] - 1, xp.asarray([end], dtype=starts.dtype)]).astype(xp.int64)
        recs: list[tuple[Any, Any, Any, Any]] = []  # (slot, distribution, duration, duration known)
        data_end = ctx.data_end_us
        n_synth = 0
        for st_, restart, entry_ev, exits in (
            (_PENDING, int(EventType.SUBMIT), int(EventType.SUBMIT), _PENDING_EXIT),
            (_RUNNING, int(EventType.SCHEDULE), int(EventType.SCHEDULE), _RUNNING_EXIT),
        ):
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
        # queued stretches: from the QUEUE that defers a pending instance to the event that ends the
        # deferral (ENABLE, SCHEDULE, SUBMIT, a death, UPDATE_RUNNING), or censored
        was_q = xp.zeros(n, dtype=bool)
        was_q[1:] = queued[:-1]
        was_q &= ~first
        q_in = segmented_last(ops, xp, queued & ~was_q, seg_start)
        x = xp.nonzero(was_q & ~queued)[0]
        s = q_in[x - 1]
        timed = (t[s] != 0) & (t[x] != TIME_AFTER_TRACE)
        known = timed & ~synth[s] & ~synth[x]
        n_synth += int(xp.count_nonzero(timed & ~known))
        recs.append((slot[x], xp.asarray(_QUEUED_EXIT)[e[x]], t[x] - t[s], known))
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
        del queued, was_q, q_in
        counters["synthesized_duration_episodes"] = n_synth
        rt, rd, rdur, rk = (xp.concatenate([r[j] for r in recs]) for j in range(4))
        td = rt * _D + rd
        out["episodes"] = bincount(xp, td, minlength=_NS * _D).reshape(_NS, _D).astype(xp.int64)
        kk = xp.nonzero(rk)[0]
        td, dur = td[kk], rdur[kk].astype(xp.int64)
        b = delay_bins(xp, dur, backend.stage(_DELAY_BINS.cells), backend.stage(_DELAY_BINS.edges))
        out["hist"] = bincount(xp, td * _B + b, minlength=_NS * _D * _B).reshape(_NS, _D, _B).astype(xp.int64)
        out["dur_sum"] = bincount(xp, td, weights=dur.astype(xp.float64), minlength=_NS * _D).reshape(_NS, _D)
        if int(td.shape[0]):  # per (slot, distribution) the shortest and longest known duration
            dmax = xp.full(_NS * _D, -1, dtype=xp.int64)
            ops.scatter_max(dmax, td, dur)
            nmin = xp.full(_NS * _D, -_I64_MAX, dtype=xp.int64)
            ops.scatter_max(nmin, td, -dur)
            out["dur_max"] = dmax.reshape(_NS, _D)
            out["dur_min"] = (-nmin).reshape(_NS, _D)
        out["counters"] = xp.asarray(np.array([counters[c] for c in _COUNTERS], np.int64))
        return out

    def merge(self, a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
        out = {
            k: a[k] + b[k] for k in ("events", "transitions", "episodes", "hist", "dur_sum", "instances", "counters")
        }
        out["dur_min"] = np.minimum(a["dur_min"], b["dur_min"])
        out["dur_max"] = np.maximum(a["dur_max"], b["dur_max"])
        out["series"] = merge_keyed(a["series"], b["series"])
        return out

    # ---------------------------------------------------------------- finalize
    def finalize(self, partial: dict[str, Any], ctx: LifecycleContext) -> dict[str, pa.Table]:
        """Arrow tables, built without pandas (see :mod:`gpuclust.tables`)."""
        return result_tables(
            partial, ctx, name=self.name, kinds=self.kinds, thing=self.thing, bucket_s=int(self.bucket_s)
        )

    def summary(self, result: dict[str, Any]) -> str:
        return summary_text(self.label, self.thing, result)


@dataclass(frozen=True)
class CollectionLifecycle(Lifecycle):
    """Collection (job and alloc set) life cycles from ``collection_events``: the same replay,
    tables and options as :class:`Lifecycle`, one thing per ``collection_id`` (the 2011 trace's
    job_events after ingest).

    Examples
    --------
    >>> CollectionLifecycle().table
    'collection_events'
    """

    name = "collection-lifecycle"
    table = "collection_events"
    requires = ("collection_events",)
    key_columns = ("collection_id",)
    thing = "collection"
    kinds = ("job", "alloc_set", "unknown")

    @property
    def side_inputs(self) -> dict[str, tuple[str, ...]]:
        """The instance events, for the priority of collections whose own events carry none (the
        2011 job_events): the highest over their instances' events."""
        return {"instance_events": ("collection_id", "priority")}

    def bind(self, ctx: LifecycleContext, side: dict[str, Any], grain: str | None) -> LifecycleContext:
        ev = side.get("instance_events")
        if ev is None or not ev.num_rows:
            return ctx
        ids, top = max_priority_by_collection(ev)
        return replace(ctx, job_ids=ids, job_priority=top)
