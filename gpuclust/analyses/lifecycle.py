"""``lifecycle``: how instances flow through their life cycle (submission, queueing, scheduling,
running, death, resubmission), from ``instance_events``.

Every instance's events are replayed in time order (ties keep the dataset's row order) through
the state machine of the v3 document ("Collection and instance life cycles"): the state after an
event is determined by its type alone -- SUBMIT, QUEUE, ENABLE and UPDATE_PENDING leave the
instance **pending**, SCHEDULE and UPDATE_RUNNING **running**, EVICT, FAIL, FINISH, KILL and LOST
**dead**.  v2 (2011) datasets carry v3 codes after ingest, so both traces use one replay.

Result tables (docs/analysis-lifecycle.md):

``events``
    Events by type and tier (an instance's tier: its highest priority over its events).
``transitions``
    Consecutive event pairs of one instance, by tier, with ``expected``: whether the second
    event can follow the state the first one leaves in the v3 state diagram (pending: QUEUE,
    ENABLE, SCHEDULE, UPDATE_PENDING, FAIL, KILL, LOST; running: UPDATE_RUNNING and the five
    deaths; dead: SUBMIT).  Seed 003 reported such "unexpected" transitions in the 2011 trace
    (EVICT of a pending task, for one).
``series``
    Per time bucket and tier: submissions (new = an instance's first SUBMIT, and resubmissions),
    schedules, deaths by kind, and the instances pending (the queue) and running at the bucket's
    end.
``delays`` and ``delay_hist``
    Scheduling delay (from the SUBMIT that makes an instance pending to the event that ends the
    pending episode; ``enable_to_schedule`` from the last ENABLE before the SCHEDULE) and
    execution time (from SCHEDULE to the event that ends the run), by tier and outcome.
    Episodes still pending or running at the end of the data are **censored**: counted, with the
    time elapsed until the last finite event time of the dataset.  Durations are exact integers
    of microseconds, kept as counts in fixed log bins (50 per decade, :data:`DELAY_EDGES_US`),
    so any number of episodes merges in bounded memory; quantiles are resolved to a bin (the
    exact quantile lies in ``[q, the bin's upper edge)``, under 4.7% above ``q``); count, mean,
    min and max are exact.
``info``
    Row and instance counts, instances first seen other than by SUBMIT (present when the trace
    began), events at time 0 and 2^63-1, unexpected transitions.

Per-instance sequences need every event of an instance in one partition: the analysis declares
:attr:`whole_instances`, so the engine runs it on the buckets of an instance-bucketed dataset
(``gpuclust optimize``), or as one partition of a flat one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
import pyarrow as pa

from gpuclust._parallel import map_ordered, threads
from gpuclust._xp import bincount
from gpuclust.analyses._extent import max_finite
from gpuclust.analyses.base import Analysis, fmt, is_null_int, resolve_tier_map
from gpuclust.analyses.grouping import FloatBins, bucket_index, instance_order, segmented_last
from gpuclust.analyses.options import option, tier_map_option
from gpuclust.arrow_numpy import bin_table, empty_table, labels, rows_table, table, table_from_rows
from gpuclust.layout import key_hash
from gpuclust.partials import bin_quantile_edges, keyed_reduce, merge_keyed
from gpuclust.schema import TIME_AFTER_TRACE, EventType, TierMap, tier_map
from gpuclust.tables import as_arrow, column

__all__ = ["CollectionLifecycle", "DELAY_EDGES_US", "DISTRIBUTIONS", "EVENT_NAMES", "EXPECTED", "Lifecycle", "STATE_AFTER", "SERIES_FIELDS",
           "unknown_duration_reason"]

#: Event type names, by v3 code.
EVENT_NAMES: tuple[str, ...] = tuple(e.name for e in EventType)
_NE = len(EVENT_NAMES)
_NONE, _PENDING, _RUNNING, _DEAD = 0, 1, 2, 3
#: The state (1 pending, 2 running, 3 dead) an instance is in after each event type (v3 code).
STATE_AFTER = np.array([_PENDING, _PENDING, _PENDING, _RUNNING, _DEAD, _DEAD, _DEAD, _DEAD, _DEAD, _PENDING,
                        _RUNNING], dtype=np.int64)
#: Events that may follow each state in the v3 document's state diagram.
EXPECTED: dict[int, frozenset[int]] = {
    _PENDING: frozenset({EventType.QUEUE, EventType.ENABLE, EventType.SCHEDULE, EventType.UPDATE_PENDING,
                         EventType.FAIL, EventType.KILL, EventType.LOST}),
    _RUNNING: frozenset({EventType.UPDATE_RUNNING, EventType.EVICT, EventType.FAIL, EventType.FINISH,
                         EventType.KILL, EventType.LOST}),
    _DEAD: frozenset({EventType.SUBMIT}),
}
#: The ``series`` counters, in order (pending / running: changes, summed into levels at finalize).
SERIES_FIELDS = ("submissions", "new_submissions", "resubmissions", "schedules", "evictions", "failures",
                 "finishes", "kills", "losses", "d_pending", "d_running")
#: An event's class in the series: SUBMIT 0 (1 when the instance was submitted before), SCHEDULE 2,
#: EVICT 3, FAIL 4, FINISH 5, KILL 6, LOST 7, any other type 8.
_SERIES_CLASS = np.full(_NE, 8, np.int64)
for _k, _ev in enumerate((EventType.SCHEDULE, EventType.EVICT, EventType.FAIL, EventType.FINISH, EventType.KILL,
                          EventType.LOST)):
    _SERIES_CLASS[int(_ev)] = 2 + _k
_SERIES_CLASS[int(EventType.SUBMIT)] = 0
#: Codes per event: the classes above x 3 pending changes x 3 running changes.
_SERIES_CLASSES = 9
_SERIES_CODES = _SERIES_CLASSES * 3 * 3
#: (measure, outcome) of every delay distribution, in order.
DISTRIBUTIONS: tuple[tuple[str, str], ...] = (
    *(("scheduling", o) for o in ("scheduled", "evict", "fail", "finish", "kill", "lost", "resubmitted", "other",
                                   "censored")),
    ("enable_to_schedule", "scheduled"),
    *(("execution", o) for o in ("evict", "fail", "finish", "kill", "lost", "interrupted", "censored")),
)
_D = len(DISTRIBUTIONS)
_DI = {d: k for k, d in enumerate(DISTRIBUTIONS)}
#: Outcome of a pending episode by the v3 code of the event that ends it.
_PENDING_EXIT = np.array([_DI["scheduling", o] for o in ("resubmitted", "other", "other", "scheduled", "evict", "fail",
                                                         "finish", "kill", "lost", "other", "other")], np.int64)
#: Outcome of a run by the v3 code of the event that ends it.
_RUNNING_EXIT = np.array([_DI["execution", o] for o in ("interrupted", "interrupted", "interrupted", "interrupted",
                                                        "evict", "fail", "finish", "kill", "lost", "interrupted",
                                                        "interrupted")], np.int64)
#: Lower edges (µs) of the delay bins 1, 2, ...: the distinct ``ceil(10^(k/50))``, k = 0..650 (1 µs to
#: 10^13 µs, about 116 days); bin 0 holds zero delays, the last bin everything from 10^13 µs on.
#: (``np.ceil`` of an increasing sequence is non-decreasing: the distinct ones are those unlike their
#: predecessor; ``np.unique`` would import ``numpy.ma``, ~15 ms of every run's start-up)
_EDGES = np.ceil(10.0 ** (np.arange(651) / 50.0)).astype(np.int64)
DELAY_EDGES_US = _EDGES[np.concatenate([[True], _EDGES[1:] != _EDGES[:-1]])]
_B = int(DELAY_EDGES_US.shape[0]) + 1
#: :func:`delay_bins`' table: each octave of durations from 1 µs to 2^44 µs in 64 cells, each
#: holding at most one edge.
_DELAY_BINS = FloatBins(DELAY_EDGES_US.astype(np.float64), bits=6, lo=1.0, hi=2.0 ** 44, what="lifecycle delay bins")


def delay_bins(xp: Any, dur: Any, cells: Any = None, edges: Any = None) -> Any:
    """``searchsorted(DELAY_EDGES_US, dur, side="right")`` (int64) for int64 durations: the bin of
    the duration's cell (its float64 exponent and top mantissa bits: exact below 2^53, and every
    edge lies below), plus one where the cell's edge lies at or below it.

    >>> d = np.array([-5, 0, 1, 2, 99, 100, 101, 10**13 - 1, 10**13, 2**62])
    >>> (delay_bins(np, d) == np.searchsorted(DELAY_EDGES_US, d, side="right")).all()
    np.True_
    """
    return _DELAY_BINS.bins(xp, dur.astype(xp.float64), cells, edges)
_COUNTERS = ("rows", "invalid_type_rows", "instances", "first_not_submit", "unknown_priority_instances",
             "time_zero_events", "after_trace_events")
_I64_MAX = np.iinfo(np.int64).max
#: Rows of a partition from which the cpu path replays it as two halves (see ``Lifecycle.partial``).
SPLIT_ROWS = 1 << 19
#: Tier slots of the dense partials: the most tiers a tier map may have, plus "unknown".
_T = 17


def _series(backend: Any, key: Any, code: Any) -> dict[str, Any]:
    """The series partial: per (bucket, tier) ``key`` with at least one event, the event counts of
    :data:`SERIES_FIELDS` and the net pending / running changes, from one count per (key, code)
    (``code``: class x pending change x running change, see :data:`_SERIES_CLASS`)."""
    xp = backend.xp
    got = keyed_reduce(backend, key * _SERIES_CODES + code, {}, {"n": None})
    fused, n = got["key"], got["n"]
    k = fused // _SERIES_CODES
    first = xp.ones(k.shape[0], dtype=bool)
    first[1:] = k[1:] != k[:-1]
    row = xp.cumsum(first) - 1
    m = xp.zeros((int(first.sum()), _SERIES_CODES), dtype=xp.int64)
    m[row, fused % _SERIES_CODES] = n
    m = m.reshape(-1, _SERIES_CLASSES, 3, 3)
    per = m.sum(axis=(2, 3))
    out = {"key": k[first].astype(xp.int64), "submissions": per[:, 0] + per[:, 1], "new_submissions": per[:, 0],
           "resubmissions": per[:, 1]}
    for j, f in enumerate(("schedules", "evictions", "failures", "finishes", "kills", "losses")):
        out[f] = per[:, 2 + j]
    out["d_pending"] = m[:, :, 2, :].sum(axis=(1, 2)) - m[:, :, 0, :].sum(axis=(1, 2))
    out["d_running"] = m[:, :, :, 2].sum(axis=(1, 2)) - m[:, :, :, 0].sum(axis=(1, 2))
    return {f: xp.ascontiguousarray(out[f]) for f in ("key", *SERIES_FIELDS)}


@dataclass(frozen=True)
class LifecycleContext:
    tier_map: TierMap
    #: The last finite event time of the data (censored episodes are measured to it); None: no events.
    data_end_us: int | None

    @property
    def tier_names(self) -> tuple[str, ...]:
        return (*self.tier_map.names, "unknown")


@dataclass(frozen=True)
class Lifecycle(Analysis):
    """Instance life cycles: event counts, transitions, time series, scheduling and execution times.

    Parameters
    ----------
    bucket_s
        Width of the ``series`` time buckets, seconds (buckets of trace time from 0).
    tier_map
        Name of a tier map in :data:`gpuclust.schema.TIER_MAPS`; ``None``: the dataset manifest's,
        else the trace version's default.

    Examples
    --------
    >>> Lifecycle(bucket_s=300).label
    'lifecycle[bucket_s=300]'
    """

    bucket_s: int = option(3600, "width of the series' time buckets, seconds")
    tier_map: str | None = tier_map_option()

    name = "lifecycle"
    table = "instance_events"
    requires = ("instance_events",)
    #: tracemalloc peak of partial: 280 B/row (bench 1.6e7 set, 0.4M events), 272 (real 2011 task events)
    row_bytes = 320
    #: rows per partition for partitions="auto" (whole buckets): a replay holds ~300 B an event, so
    #: 128 Ki events keep a partition near 40 MB and the run's memory flat from a few 10^5 events on
    #: (docs/scale.md); the per-partition cost of a replay is small beside it
    auto_partition_rows = 1 << 17
    whole_instances: ClassVar[bool] = True

    def __post_init__(self) -> None:
        if int(self.bucket_s) <= 0:
            raise ValueError(f"lifecycle: bucket_s must be positive, got {self.bucket_s}")
        if self.tier_map is not None:
            tier_map(self.tier_map)

    #: The columns that name one thing whose events are replayed (an instance here), and its name
    #: in summaries (``info.instances`` counts them).
    key_columns: ClassVar[tuple[str, ...]] = ("collection_id", "instance_index")
    thing: ClassVar[str] = "instance"

    @property
    def columns(self) -> tuple[str, ...]:
        return ("time", "type", *self.key_columns, "priority")

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
        t = _T  # trimmed to the context's tiers at finalize
        xp = np if backend is None else backend.xp
        return {"events": xp.zeros((t, _NE), np.int64), "transitions": xp.zeros((t, _NE, _NE), np.int64),
                "episodes": xp.zeros((t, _D), np.int64), "hist": xp.zeros((t, _D, _B), np.int64),
                "dur_sum": xp.zeros((t, _D)), "dur_min": xp.full((t, _D), _I64_MAX, np.int64),
                "dur_max": xp.full((t, _D), -1, np.int64), "instances": xp.zeros(t, np.int64),
                "series": {"key": np.zeros(0, np.int64), **{f: np.zeros(0, np.int64) for f in SERIES_FIELDS}},
                "counters": xp.zeros(len(_COUNTERS), np.int64)}

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
        upper = (key_hash(np, [cols[k] for k in self.key_columns]) >> np.uint64(63)).astype(bool)
        halves = [np.flatnonzero(~upper), np.flatnonzero(upper)]
        del upper
        parts = list(map_ordered(lambda rows: self._replay({k: v[rows] for k, v in cols.items()}, ctx, backend),
                                 halves, threads=min(2, threads())))
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

        t, c, p = (pick(cols[k]) for k in ("time", "collection_id", "priority"))
        i = pick(cols["instance_index"]) if "instance_index" in self.key_columns else xp.zeros(n, dtype=xp.int32)
        e = pick(e)
        # ---- one instance's events together, in time order (ties keep row order)
        order = instance_order(xp, c, i, t)
        t, e, c, i, p = (xp.take(a, order) for a in (t, e, c, i, p))
        del order
        first = xp.ones(n, dtype=bool)
        first[1:] = (c[1:] != c[:-1]) | (i[1:] != i[:-1])
        del c, i  # (each array freed when done: the later ones reuse its memory, no fresh pages)
        starts = xp.nonzero(first)[0]
        S = int(starts.shape[0])
        seg = xp.cumsum(first) - 1
        seg_start = starts[seg]
        # ---- each instance's tier: the tier of its highest priority (NULL: none; all NULL: unknown)
        pr = xp.where(is_null_int(xp, p), -1, p.astype(xp.int64))
        if ops.lookup_slot_tables:  # host NumPy arrays: one pass over the runs
            maxp = np.maximum.reduceat(pr, starts)
        else:
            width = int(pr.max()) + 2
            ranked = xp.sort(seg * width + (pr + 1))
            top = ranked[xp.searchsorted(ranked, (xp.arange(S, dtype=xp.int64) + 1) * width, side="left") - 1]
            maxp = top - xp.arange(S, dtype=xp.int64) * width - 1
        code = xp.searchsorted(xp.asarray(np.asarray(ctx.tier_map.bounds, np.int64)), maxp, side="right") - 1
        tier_s = xp.where((maxp >= 0) & (code >= 0), code, unknown).astype(xp.int64)
        counters["unknown_priority_instances"] = int(xp.count_nonzero(maxp < 0))
        tier = tier_s[seg]
        del p, pr
        out["instances"] = bincount(xp, tier_s, minlength=T).astype(xp.int64)
        counters["instances"] = S
        counters["first_not_submit"] = int(xp.count_nonzero(e[starts] != int(EventType.SUBMIT)))
        counters["time_zero_events"] = int(xp.count_nonzero(t == 0))
        after = t == TIME_AFTER_TRACE
        counters["after_trace_events"] = int(xp.count_nonzero(after))
        # ---- events, transitions
        out["events"] = bincount(xp, tier * _NE + e, minlength=T * _NE).reshape(T, _NE).astype(xp.int64)
        state = xp.asarray(STATE_AFTER)[e]
        prev_e = xp.empty(n, dtype=xp.int64)
        prev_e[0] = 0
        prev_e[1:] = e[:-1]
        prev_state = xp.where(first, _NONE, xp.asarray(STATE_AFTER)[prev_e])
        # an instance's first event has no transition: counted in an extra last bin, dropped
        pair = (tier * _NE + prev_e) * _NE + e
        pair[first] = T * _NE * _NE
        out["transitions"] = bincount(xp, pair, minlength=T * _NE * _NE + 1)[:-1].reshape(T, _NE, _NE).astype(xp.int64)
        del pair
        # ---- series: counts and state changes per (bucket, tier); events after the trace are not placed
        is_sub = e == int(EventType.SUBMIT)
        csub = xp.cumsum(is_sub.astype(xp.int64))
        csub = csub - (csub[starts] - is_sub[starts].astype(xp.int64))[seg]  # SUBMITs so far in the instance
        n_after = counters["after_trace_events"]
        live = slice(None) if n_after == 0 else xp.nonzero(~after)[0]  # (a slice: no gathers)
        i64 = xp.int64
        # one code per event: its series class (SUBMIT first / again, SCHEDULE, ..., other) and
        # its pending and running changes (-1, 0, +1 each), counted per (bucket, tier) at once
        cls = xp.asarray(_SERIES_CLASS)[e] + (is_sub & (csub > 1))
        d_p = (state == _PENDING).astype(i64) - (prev_state == _PENDING).astype(i64)
        d_r = (state == _RUNNING).astype(i64) - (prev_state == _RUNNING).astype(i64)
        code = (cls * 3 + (d_p + 1)) * 3 + (d_r + 1)
        key = bucket_index(t[live], self.width_us) * T + tier[live]
        out["series"] = _series(backend, key, code[live])
        del is_sub, csub, cls, d_p, d_r, code, key, after
        # ---- episodes: pending ones end at the first event leaving the state (or a SUBMIT while pending),
        # runs likewise (or a SCHEDULE while running); those open at the end of the data are censored
        end = n - 1
        last_row = xp.concatenate([starts[1:] - 1, xp.asarray([end], dtype=starts.dtype)]).astype(xp.int64)
        recs: list[tuple[Any, Any, Any, Any]] = []  # (tier, distribution, duration, duration known)
        data_end = ctx.data_end_us
        for st_, restart, entry_ev, exits in ((_PENDING, int(EventType.SUBMIT), int(EventType.SUBMIT), _PENDING_EXIT),
                                              (_RUNNING, int(EventType.SCHEDULE), int(EventType.SCHEDULE), _RUNNING_EXIT)):
            entry = ((state == st_) & (prev_state != st_)) | ((state == st_) & (e == restart) & (prev_state == st_))
            last_entry = segmented_last(ops, xp, entry, seg_start)
            x = xp.nonzero((prev_state == st_) & ((state != st_) | (e == restart)))[0]
            s = last_entry[x - 1]  # x is never an instance's first row (prev_state is set)
            sc = xp.maximum(s, 0)
            known = (s >= 0) & (e[sc] == entry_ev) & (t[sc] != 0) & (t[x] != TIME_AFTER_TRACE)
            recs.append((tier[x], xp.asarray(exits)[e[x]], t[x] - t[sc], known))
            if st_ == _PENDING:  # from the last ENABLE of the episode to its SCHEDULE
                le = segmented_last(ops, xp, e == int(EventType.ENABLE), seg_start)[x - 1]
                en = xp.nonzero((e[x] == int(EventType.SCHEDULE)) & (le > s) & known)[0]
                recs.append((tier[x[en]], xp.full(int(en.shape[0]), _DI["enable_to_schedule", "scheduled"], xp.int64),
                             t[x[en]] - t[le[en]], xp.ones(int(en.shape[0]), dtype=bool)))
            # censored: the instance's last event leaves it in this state
            cz = xp.nonzero(state[last_row] == st_)[0]
            s = last_entry[last_row[cz]]
            sc = xp.maximum(s, 0)
            d_cens = _DI["scheduling" if st_ == _PENDING else "execution", "censored"]
            if data_end is None:
                known = xp.zeros(int(cz.shape[0]), dtype=bool)
                dur = xp.zeros(int(cz.shape[0]), dtype=xp.int64)
            else:
                known = (s >= 0) & (e[sc] == entry_ev) & (t[sc] != 0) & (t[sc] <= data_end)
                dur = data_end - t[sc]
            recs.append((tier_s[cz], xp.full(int(cz.shape[0]), d_cens, xp.int64), dur, known))
        rt, rd, rdur, rk = (xp.concatenate([r[j] for r in recs]) for j in range(4))
        td = rt * _D + rd
        out["episodes"] = bincount(xp, td, minlength=T * _D).reshape(T, _D).astype(xp.int64)
        kk = xp.nonzero(rk)[0]
        td, dur = td[kk], rdur[kk].astype(xp.int64)
        b = delay_bins(xp, dur, backend.stage(_DELAY_BINS.cells), backend.stage(_DELAY_BINS.edges))
        out["hist"] = bincount(xp, td * _B + b, minlength=T * _D * _B).reshape(T, _D, _B).astype(xp.int64)
        out["dur_sum"] = bincount(xp, td, weights=dur.astype(xp.float64), minlength=T * _D).reshape(T, _D)
        if int(td.shape[0]):  # per (tier, distribution) the shortest and longest known duration
            dmax = xp.full(T * _D, -1, dtype=xp.int64)
            ops.scatter_max(dmax, td, dur)
            nmin = xp.full(T * _D, -_I64_MAX, dtype=xp.int64)
            ops.scatter_max(nmin, td, -dur)
            out["dur_max"] = dmax.reshape(T, _D)
            out["dur_min"] = (-nmin).reshape(T, _D)
        out["counters"] = xp.asarray(np.array([counters[c] for c in _COUNTERS], np.int64))
        return out

    def merge(self, a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
        out = {k: a[k] + b[k] for k in ("events", "transitions", "episodes", "hist", "dur_sum", "instances", "counters")}
        out["dur_min"] = np.minimum(a["dur_min"], b["dur_min"])
        out["dur_max"] = np.maximum(a["dur_max"], b["dur_max"])
        out["series"] = merge_keyed(a["series"], b["series"])
        return out

    # ---------------------------------------------------------------- finalize
    def finalize(self, partial: dict[str, Any], ctx: LifecycleContext) -> dict[str, pa.Table]:
        """Arrow tables, built without pandas (see :mod:`gpuclust.tables`)."""
        names = ctx.tier_names
        T = len(names)
        p = {k: (v if k == "series" else np.asarray(v)) for k, v in partial.items()}
        ev = p["events"][:T]
        events = rows_table([{"tier": names[k], "event": EVENT_NAMES[j], "count": int(ev[k, j])}
                             for k in range(T) for j in range(_NE) if ev[k, j]], _EVENTS_SCHEMA)
        tr = p["transitions"][:T]
        trows = [{"tier": names[k], "from_event": EVENT_NAMES[a], "to_event": EVENT_NAMES[b], "count": int(tr[k, a, b]),
                  "expected": bool(b in EXPECTED[int(STATE_AFTER[a])])}
                 for k in range(T) for a in range(_NE) for b in range(_NE) if tr[k, a, b]]
        transitions = rows_table(trows, _TRANSITIONS_SCHEMA)
        series = self._series(partial["series"], names)
        delays, hist = self._delays(p, names)
        counters = dict(zip(_COUNTERS, (int(v) for v in p["counters"]), strict=True))
        info = table_from_rows([{"analysis": self.name, "tier_map": ctx.tier_map.name, "tiers": ",".join(names),
                                 "bucket_s": int(self.bucket_s), "data_end_us": ctx.data_end_us, **counters,
                                 "transitions": int(tr.sum()),
                                 "unexpected_transitions": sum(r["count"] for r in trows if not r["expected"])}])
        return {"events": events, "transitions": transitions, "series": series, "delays": delays,
                "delay_hist": hist, "info": info}

    def _series(self, s: dict[str, np.ndarray], names: tuple[str, ...]) -> pa.Table:
        cols = ["bucket", "bucket_start_us", "tier", *SERIES_FIELDS[:-2], "pending", "running"]
        key = np.asarray(s["key"], np.int64)
        if key.shape[0] == 0:
            return empty_table(pa.schema([(c, pa.string() if c == "tier" else pa.int64()) for c in cols]))
        T = len(names)
        bucket, code = np.divmod(key, _T)
        b0, b1 = int(bucket.min()), int(bucket.max())
        nb = b1 - b0 + 1
        if nb * T > 1 << 26:
            raise ValueError(f"lifecycle: event times span {nb} buckets of {self.bucket_s} s; choose a larger bucket_s")
        grid = {f: np.zeros((T, nb), np.int64) for f in SERIES_FIELDS}
        for f in SERIES_FIELDS:
            grid[f][code, bucket - b0] = np.asarray(s[f], np.int64)
        # every tier that has events gets every bucket (levels carry over buckets without events),
        # rows by bucket, then in the tier map's order
        present = np.flatnonzero(np.bincount(code, minlength=_T))  # the tiers with events, in order
        b = np.arange(b0, b1 + 1, dtype=np.int64)
        tcode = np.repeat(present, nb)
        bb = np.tile(b, present.shape[0])
        order = np.lexsort((tcode, bb))
        out: dict[str, Any] = {"bucket": bb[order], "bucket_start_us": (bb * self.width_us)[order],
                               "tier": labels(names, tcode[order])}
        for f in SERIES_FIELDS[:-2]:
            out[f] = grid[f][present].ravel()[order]
        out["pending"] = np.cumsum(grid["d_pending"][present], axis=1).ravel()[order]
        out["running"] = np.cumsum(grid["d_running"][present], axis=1).ravel()[order]
        return table({c: out[c] for c in cols})

    @staticmethod
    def _delays(p: dict[str, Any], names: tuple[str, ...]) -> tuple[pa.Table, pa.Table]:
        T = len(names)
        edges_s = DELAY_EDGES_US / 1e6
        lo_s = np.concatenate([[0.0], edges_s])
        hi_s = np.concatenate([[0.0], edges_s[1:], [np.inf]])
        rows: list[dict[str, Any]] = []
        hists: dict[str, list[Any]] = {"hist": [], "tier": [], "measure": [], "outcome": []}
        for k in range(T):
            for d, (measure, outcome) in enumerate(DISTRIBUTIONS):
                n_ep = int(p["episodes"][k, d])
                if not n_ep:
                    continue
                h = p["hist"][k, d]
                known = int(h.sum())
                row = {"tier": names[k], "measure": measure, "outcome": outcome, "episodes": n_ep,
                       "with_duration": known, "mean_s": np.nan, "min_s": np.nan, "p50_s": np.nan,
                       "p90_s": np.nan, "p99_s": np.nan, "max_s": np.nan}
                if known:
                    lo_min = int(p["dur_min"][k, d]) / 1e6
                    row.update(mean_s=float(p["dur_sum"][k, d]) / known / 1e6, min_s=lo_min,
                               max_s=int(p["dur_max"][k, d]) / 1e6)
                    # the bin of each inverted-CDF quantile: its lower edge (not below the minimum)
                    for q, v in bin_quantile_edges(h, lo_s, (50, 90, 99)).items():
                        row[f"p{q}_s"] = float(max(v, lo_min))
                    for hk, hv in (("hist", h), ("tier", names[k]), ("measure", measure), ("outcome", outcome)):
                        hists[hk].append(hv)
                rows.append(row)
        return rows_table(rows, _DELAYS_SCHEMA), bin_table(
            hists["hist"], lo_s, hi_s, "s", "episodes", _HIST_SCHEMA, tier=hists["tier"], measure=hists["measure"],
            outcome=hists["outcome"])

    def summary(self, result: dict[str, Any]) -> str:
        info = as_arrow(result["info"]).to_pylist()[0]
        lines = [f"{self.label}: {info['instances']:,} {self.thing}s, {info['rows']:,} events, tier map "
                 f"{info['tier_map']!r}; {info['unexpected_transitions']:,} of {info['transitions']:,} transitions not in "
                 f"the v3 state diagram; {info['first_not_submit']:,} {self.thing}s first seen other than by SUBMIT"]
        s = as_arrow(result["series"])
        if s.num_rows:
            bucket = column(s, "bucket")
            ub, inv = np.unique(bucket, return_inverse=True)
            tot = {f: np.bincount(inv, weights=column(s, f).astype(np.float64), minlength=ub.shape[0])
                   for f in ("new_submissions", "resubmissions", "finishes", "pending", "running")}
            lines.append(f"  buckets of {int(info['bucket_s'])} s {int(ub[0])}..{int(ub[-1])}: "
                         f"{int(tot['new_submissions'].sum()):,} new submissions, {int(tot['resubmissions'].sum()):,} "
                         f"resubmissions, {int(tot['finishes'].sum()):,} finishes; at the end {int(tot['pending'][-1]):,} "
                         f"pending, {int(tot['running'][-1]):,} running")
        d = as_arrow(result["delays"]).to_pylist()
        for measure, outcome in (("scheduling", "scheduled"), ("execution", "finish")):
            for r in d:
                if r["measure"] == measure and r["outcome"] == outcome:
                    head = f"  {measure} ({outcome}) {r['tier']:>8}: {r['episodes']:,} episodes"
                    if not r["with_duration"]:
                        lines.append(f"{head}, median unknown: {unknown_duration_reason(measure)}")
                        continue
                    timed = (f" ({r['with_duration']:,} with a known duration)"
                             if r["with_duration"] < r["episodes"] else "")
                    lines.append(f"{head}{timed}, median {fmt(r['p50_s'], '.3g')} s, p90 {fmt(r['p90_s'], '.3g')} s, "
                                 f"mean {fmt(r['mean_s'], '.3g')} s")
        return "\n".join(lines)


def unknown_duration_reason(measure: str) -> str:
    """Why no episode of ``measure`` (a ``delays`` row with ``with_duration`` 0) has a duration, so
    that its quantiles are unknown."""
    entry = "SCHEDULE" if measure == "execution" else "SUBMIT"
    return (f"none of its episodes has a known duration (each began before the trace: its {entry} at time 0 or "
            "not in the data; or ended at 2^63-1, after the trace)")


#: The result tables' columns and types (an empty table keeps them).
_EVENTS_SCHEMA = pa.schema([("tier", pa.string()), ("event", pa.string()), ("count", pa.int64())])
_TRANSITIONS_SCHEMA = pa.schema([("tier", pa.string()), ("from_event", pa.string()), ("to_event", pa.string()),
                                 ("count", pa.int64()), ("expected", pa.bool_())])
_DELAYS_SCHEMA = pa.schema([("tier", pa.string()), ("measure", pa.string()), ("outcome", pa.string()),
                            ("episodes", pa.int64()), ("with_duration", pa.int64()),
                            *((c, pa.float64()) for c in ("mean_s", "min_s", "p50_s", "p90_s", "p99_s", "max_s"))])
_HIST_SCHEMA = pa.schema([("tier", pa.string()), ("measure", pa.string()), ("outcome", pa.string()),
                          ("bin", pa.int64()), ("lo_s", pa.float64()), ("hi_s", pa.float64()), ("episodes", pa.int64())])


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
