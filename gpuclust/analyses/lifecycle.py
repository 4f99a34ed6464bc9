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
from gpuclust.analyses._lifecycle_replay import (
    EPISODE_KINDS,
    I64_MAX,
    duration_sums,
    event_counts,
    instance_counters,
    instance_rows,
    instance_slots,
    pending_substates,
    queued_stretches,
    series_counts,
    state_episodes,
)
from gpuclust.analyses._lifecycle_survival import max_priority_by_collection
from gpuclust.analyses._lifecycle_tables import (
    _B,
    _COUNTERS,
    _D,
    _NE,
    _NS,
    DELAY_EDGES_US,
    DISTRIBUTIONS,
    EVENT_NAMES,
    EXPECTED,
    SERIES_FIELDS,
    STATE_AFTER,
    delay_bins,
)
from gpuclust.analyses.base import Analysis
from gpuclust.analyses.kinds import Fields, Keyed, Max, Min, Sum
from gpuclust.analyses.options import option, tier_map_option
from gpuclust.keys import hash64
from gpuclust.schema import TierMap
from gpuclust.tiers import TierNames, check_tier_slots, resolve_tier_map

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

#: Rows of a partition from which the cpu path replays it as two halves (see ``Lifecycle.partial``).
SPLIT_ROWS = 1 << 19
#: The series' kind: per (bucket, tier) key, the :data:`SERIES_FIELDS` counts and level changes.
_SERIES = Keyed(fields=dict.fromkeys(SERIES_FIELDS, np.int64))


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
    thing_kinds: ClassVar[tuple[str, str, str]] = ("task", "alloc_instance", "unknown")

    @property
    def columns(self) -> tuple[str, ...]:
        return ("time", "type", *self.key_columns, "priority", "missing_type", "collection_type")

    @property
    def width_us(self) -> int:
        return int(self.bucket_s) * 1_000_000

    def context(self, source: Any) -> LifecycleContext:
        tm = check_tier_slots("lifecycle", resolve_tier_map(self.tier_map, source))
        return LifecycleContext(tm, max_finite(source, self.table, "time"))

    # ---------------------------------------------------------------- partial / kinds
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
        return self.kinds.merge(parts[0], parts[1])

    def _replay(self, cols: dict[str, Any], ctx: LifecycleContext, backend: Any) -> dict[str, Any]:
        """The partial of one set of whole instances' events: each step a few whole-array
        operations (:mod:`gpuclust.analyses._lifecycle_replay`), no loop over events."""
        xp, ops = backend.xp, backend.ops
        # the empty partial's dense arrays made in the backend's memory (nothing is copied to a device), its
        # series on the host (series_counts replaces it once there are events)
        out: dict[str, Any] = self.kinds.empty(backend, on_backend=True)
        out["series"] = _SERIES.identity(np, backend.name)
        counters = dict.fromkeys(_COUNTERS, 0)
        got = instance_rows(xp, cols, self.key_columns, counters)
        if got is None:
            out["counters"] = xp.asarray(np.array([counters[c] for c in _COUNTERS], np.int64))
            return out
        r, c, p, ct = got
        del got
        out["hist"] = None  # (tier x distribution x bin) ints, made by duration_sums: the empty one need not wait
        tier_s, slot_s = instance_slots(backend, ctx, r, c, p, ct, counters)
        del c, p, ct
        tier, slot = tier_s[r.seg], slot_s[r.seg]
        out["instances"] = bincount(xp, slot_s, minlength=_NS).astype(xp.int64)
        pas_row, after = instance_counters(xp, r, counters)
        state, prev_state = event_counts(xp, r, slot, out)
        queued, eligible = pending_substates(ops, xp, r, state)
        live = slice(None) if counters["after_trace_events"] == 0 else xp.nonzero(~after)[0]  # (a slice: no gathers)
        del after
        out["series"] = series_counts(
            backend, r, (state, prev_state, queued, eligible), tier, pas_row, live, self.width_us
        )
        del eligible, pas_row, live, tier
        recs: list[tuple[Any, Any, Any, Any]] = []  # (slot, distribution, duration, duration known)
        n_synth = sum(
            state_episodes(ops, xp, r, kind, (state, prev_state), (slot, slot_s), ctx.data_end_us, recs)
            for kind in EPISODE_KINDS
        )
        n_synth += queued_stretches(ops, xp, r, queued, (slot, slot_s), ctx.data_end_us, recs)
        del queued
        counters["synthesized_duration_episodes"] = n_synth
        duration_sums(backend, recs, out)
        out["counters"] = xp.asarray(np.array([counters[c] for c in _COUNTERS], np.int64))
        return out

    @property
    def kinds(self) -> Fields:
        """Dense counts and duration sums (summed), the durations' minima and maxima, and the
        series, a keyed partial (summed)."""
        t = _NS  # kind x tier slots, trimmed to the context's tiers at finalize
        return Fields(
            {
                "events": Sum((t, _NE), np.int64),
                "transitions": Sum((t, _NE, _NE), np.int64),
                "episodes": Sum((t, _D), np.int64),
                "hist": Sum((t, _D, _B), np.int64),
                "dur_sum": Sum((t, _D), np.float64),
                "dur_min": Min((t, _D), np.int64, fill=I64_MAX),
                "dur_max": Max((t, _D), np.int64, fill=-1),
                "instances": Sum((t,), np.int64),
                "series": _SERIES,
                "counters": Sum((len(_COUNTERS),), np.int64),
            }
        )

    # ---------------------------------------------------------------- finalize
    def finalize(self, partial: dict[str, Any], ctx: LifecycleContext) -> dict[str, pa.Table]:
        """Arrow tables, built without pandas (see :mod:`gpuclust.tables`)."""
        return result_tables(
            partial, ctx, name=self.name, kinds=self.thing_kinds, thing=self.thing, bucket_s=int(self.bucket_s)
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
    optional_tables = ("instance_events",)
    table_uses = {"instance_events": "priorities of collections without their own"}
    key_columns = ("collection_id",)
    thing = "collection"
    thing_kinds = ("job", "alloc_set", "unknown")

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
