"""``overcommit``: per machine x time bucket, capacity vs. requested resources vs. usage.

For each machine and bucket (default 5 minutes) of the trace window:

* **capacity** from machine_events (ADD / UPDATE / REMOVE; a REMOVEd machine has capacity 0
  until the next ADD; a NULL capacity is *unknown*: NaN plus ``cap_unknown``), time-weighted
  over the bucket;
* **requested** CPU and memory of the running top-level instances (tasks not in allocs, and
  alloc instances), by priority tier, time-weighted (running pieces from
  :mod:`gpuclust.analyses._intervals`);
* **usage** from instance_usage (top-level rows only), by tier: time-weighted mean CPU and
  memory (exact fractional overlap of each window with each bucket) and the sum of the window
  maxima of the windows overlapping the bucket;
* **instances**: time-weighted mean number of running pieces and distinct running instances.

Derived: allocation ratio (requested / capacity), usage ratio (usage / capacity) per
machine-bucket; a cell-level series (sums over machines, capacity-weighted ratios); a summary.

Design (engine fit; docs/analyses/overcommit.md "Design").

* ``context`` (client): the trace window and bucket grid, the machine list (machine_events ids
  plus the machines of top-level SCHEDULE rows) from a *first pass* that reads four columns of
  instance_events a row group at a time and keeps only a max and a set of machine ids, and the
  capacity intervals of machine_events (small: kept as intervals, client only).
* ``bind`` (per partition on a bucketed source, ``grain="instance"``: that partition's buckets of
  instance_events hold every event of its instances; once on the client on a flat source) builds
  the usage tier lookup and reads the events of the instances it is given.
* ``partial`` streams instance_usage: usage sums per (machine, tier, bucket) on the chosen
  backend (``bucket_overlap``), plus, on a bucketed source, the interval partial of the
  partition's instances, built on the same backend from the events ``bind`` read (the running
  intervals, then keyed sums: requests per (machine, tier, bucket), instance-seconds and distinct
  instances per (machine, bucket); an instance lives in one bucket, so distinct counts of
  different partitions add up exactly; plus counters).  All parts are keyed and merged by the
  engine's tree (:func:`merge_keyed`).  On a flat source ``bind`` builds the interval partial of
  every instance on the client, on the host; it stays there (dropped when the context is
  pickled) and ``finalize`` merges it in, so the result is the same either way.
* ``finalize`` builds the machine table a chunk of machines at a time (dense only over the chunk:
  keyed sums + capacity intervals swept for the chunk's machines) into one preallocated float
  block, and the cell series from per-bucket running sums
  (:mod:`gpuclust.analyses._overcommit_finalize`).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from gpuclust._xp import bincount
from gpuclust.analyses._extent import max_below, max_finite, to_f64, to_i64
from gpuclust.analyses._intervals import (
    SCHEDULE,
    RunningIntervals,
    capacity_intervals,
    distinct_keyed,
    overlap_keyed,
    running_intervals,
)
from gpuclust.analyses._lookup import InstanceLookup, id_index, tier_lookup
from gpuclust.analyses._overcommit_finalize import (
    _KNOWN_FIELDS,
    _PARTIAL_FIELDS,
    _USAGE_PREFIXES,
    OVER_EPS,  # noqa: F401 (re-exported)
    QUANTILES,  # noqa: F401 (re-exported)
    _CellSums,
    _grid,
    _machine_rows,
    _summary,
    _summary_text,
)
from gpuclust.analyses.base import Analysis, host_or_device, is_null_int, resolve_tier_map, to_host
from gpuclust.analyses.grouping import bucket_grid, bucket_span, isin_sorted, unique_sorted
from gpuclust.analyses.options import option, tier_map_option
from gpuclust.arrow_numpy import table, table_from_rows
from gpuclust.backends import finalize_backend, merged_backend
from gpuclust.parted import finalize_in_memory
from gpuclust.partials import keyed_reduce, merge_keyed
from gpuclust.schema import TIME_AFTER_TRACE, TierMap, tier_map

__all__ = ["Overcommit", "OvercommitContext", "TRACE_START_US"]

#: Trace window start: times are microseconds since 600 s before the trace start.
TRACE_START_US = 600_000_000
#: Largest dense (groups x buckets) block one bucket_overlap call of a partial may allocate; a
#: small partition's blocks are also held to 2 cells per row (2^16 at least), as its keyed rows.
CELL_LIMIT = 1 << 20
#: Machine-buckets of one shard of the machine table (one Parquet part; a shard task holds its
#: keyed partials, ~0.1-0.5 KB per machine-bucket, and one chunk of rows at a time); x
#: :data:`DEVICE_SHARD_FACTOR` where the partials were computed on a device.
SHARD_CELLS = 1 << 18
DEVICE_SHARD_FACTOR = 4
#: Machine-buckets finalize handles at a time, one row group of the machine table (its dense
#: temporaries and rows are ~2 KB per one of these), per backend: cache-sized on the host; on a
#: device a whole shard at once (2 GB of temporaries), a few large launches (~500 operations a
#: chunk whatever its size).
FINALIZE_CELLS = {"cpu": 1 << 15, "gpu": 1 << 20}
#: Counters kept in every usage partial, in this order.
STATS = (
    "usage_rows",
    "usage_alloc_rows",
    "usage_unbounded",
    "usage_unknown_machine",
    "usage_no_overlap",
    "usage_used",
    "usage_unknown_tier",
)
#: Counters of the running intervals (summed over partitions), in this order.
ISTATS = (
    "event_rows",
    "alloc_event_rows",
    "instances",
    "pieces",
    "schedules",
    "running_at_end",
    "terminal_without_schedule",
    "update_running_not_running",
    "schedule_while_running",
    "unknown_request_pieces",
    "pieces_unplaced",
    "pieces_dedicated",
    "pieces_unknown_tier",
)
_EVENT_COLUMNS = [
    "time",
    "type",
    "collection_id",
    "instance_index",
    "machine_id",
    "alloc_collection_id",
    "priority",
    "req_cpu",
    "req_mem",
]
#: what the first pass over instance_events reads
_PASS_COLUMNS = ["time", "type", "machine_id", "alloc_collection_id"]
_NULL = np.iinfo(np.int64).min
#: what a pickled context holds instead of the client's interval partial
_DROPPED = "dropped when pickled"


def _batches(source: Any, table: str, columns: list[str], rows: int = 1 << 20) -> Any:
    """``table``'s ``columns`` a row group (Parquet) or ``rows`` rows (in memory) at a time."""
    files = source.files(table) if hasattr(source, "files") else None
    if files:
        for f in files:
            pf = pq.ParquetFile(f)
            names = pf.schema_arrow.names
            if not all(c in names for c in columns):
                raise KeyError(f"{f}: no columns {[c for c in columns if c not in names]}")
            for g in range(pf.metadata.num_row_groups):
                if pf.metadata.row_group(g).num_rows:
                    yield pf.read_row_group(g, columns=columns)
        return
    t = source.read(table, columns)
    for off in range(0, t.num_rows, rows):
        yield t.slice(off, rows)


def _event_pass(source: Any) -> tuple[int | None, np.ndarray]:
    """The first pass over instance_events, a batch at a time: the largest finite time, and the
    machines of top-level SCHEDULE rows (the machines running pieces can be on).  Holds one
    batch and the (small) set of machine ids."""
    best: int | None = None
    mids: list[np.ndarray] = [np.zeros(0, np.int64)]
    for t in _batches(source, "instance_events", _PASS_COLUMNS):
        v = max_below(to_i64(t.column("time")))
        if v is not None:
            best = v if best is None else max(best, v)
        alloc = to_i64(t.column("alloc_collection_id"))
        m = to_i64(t.column("machine_id"))
        sel = (to_i64(t.column("type")) == SCHEDULE) & ((alloc == 0) | (alloc == _NULL)) & (m > 0)
        mids.append(unique_sorted(m[sel]))
        if len(mids) > 64:
            mids = [unique_sorted(np.concatenate(mids))]
    return best, unique_sorted(np.concatenate(mids))


def _tier_codes(backend: Any, tm: TierMap, priority: Any, unknown: int) -> Any:
    """Tier code per (float) priority on ``backend`` (as :meth:`TierMap.tier_codes`); NaN or a
    priority no tier covers -> ``unknown``."""
    xp = backend.xp
    bounds = backend.stage(np.asarray(tm.bounds, dtype=np.int64))
    ok = ~xp.isnan(priority)
    tc = xp.searchsorted(bounds, xp.where(ok, priority, -1.0).astype(xp.int64), side="right") - 1
    return xp.where(ok & (tc >= 0), tc, unknown).astype(xp.int64)


def _keyed(xp: Any, key: Any, **fields: Any) -> dict[str, Any]:
    return {"key": key.astype(xp.int64), **fields}


@dataclass
class OvercommitContext:
    """What partials need (machine / tier lookups, bucket grid), what ``bind`` added, and the
    capacity intervals the shards of the machine table are finalized from.

    ``client_events`` (the instance events of a flat source, bound on the client) is dropped when
    the context is pickled to a worker; the engine merges their interval partial
    (:meth:`Overcommit.client_partial`) before the shards are reduced.
    """

    tier_map: TierMap
    tier_names: tuple[str, ...]
    window_start: int
    window_end: int
    width: int
    n_buckets: int
    #: start of the first bucket: ``floor(window_start / width) * width`` (buckets are aligned to
    #: trace time 0, see "Time buckets" in docs/user/dataset.md); dense bucket ``j`` is absolute bucket
    #: ``origin // width + j``
    origin: int
    #: sorted machine ids (machine_events and machines of top-level SCHEDULE rows); a row's
    #: machine code is its index
    machine_ids: np.ndarray
    #: usage tier lookup (collection_id, instance_index, machine_id) -> tier code (set by ``bind``)
    lookup: InstanceLookup
    #: capacity intervals by machine code (``code``, ``start``, ``end``, ``cap_cpu``,
    #: ``cap_mem``, sorted by code) and ``has_me`` (machine has machine_events rows)
    series: dict[str, np.ndarray] | None
    stats: dict[str, int]
    #: the event columns of this partition's instances (``bind`` on a bucketed source, host
    #: arrays): the partial builds their running pieces on its backend and emits their sums
    events: dict[str, np.ndarray] | None = None
    #: client only: the event columns of all instances (``bind`` on a flat source, host arrays);
    #: their interval partial is merged before the shards (:meth:`Overcommit.client_partial`)
    client_events: dict[str, np.ndarray] | str | None = None

    def __getstate__(self) -> dict[str, Any]:
        d = dict(self.__dict__)
        if d["client_events"] is not None:  # client only (one per event): merged before the shards
            d["client_events"] = _DROPPED
        return d

    def __setstate__(self, d: dict[str, Any]) -> None:
        self.__dict__.update(d)

    @property
    def n_tiers(self) -> int:
        return len(self.tier_names)


@dataclass(frozen=True)
class Overcommit(Analysis):
    """Capacity vs. requests vs. usage per machine and time bucket (overcommitment).

    Parameters
    ----------
    bucket_s
        Bucket width in seconds (buckets start at the window start).
    tier_map
        Name of a tier map in :data:`gpuclust.schema.TIER_MAPS`; ``None``: the dataset
        manifest's, else the trace version's default, else ``"notebook"``.
    window_start_us, window_end_us
        The trace window ``[start, end)`` in trace microseconds.  Default start: 600 s (the
        trace start); default end: the largest finite time observed in instance_events and in
        instance_usage end times.  Event times 0 and 2^63-1 are clipped to it.

    Examples
    --------
    >>> Overcommit(bucket_s=3600).label
    'overcommit[bucket_s=3600]'
    """

    bucket_s: int = option(300, "bucket width in seconds")
    tier_map: str | None = tier_map_option()
    window_start_us: int = option(TRACE_START_US, "trace window start (trace microseconds)")
    window_end_us: int | None = option(
        None, "trace window end; default: the largest finite time in instance_events / instance_usage"
    )

    name = "overcommit"
    table = "instance_usage"
    requires = ("instance_events", "machine_events")
    #: tracemalloc peak of bind + partial on one partition (CELL_LIMIT 2^20): 714 B/row (4e6 set,
    #: 240k-row partition), 486 (6.4e7, 1 Mi rows), 553 (long span: instances spanning more buckets)
    row_bytes = 640
    #: rows per partition for partitions="auto": a partition's working set (~490 MB per Mi rows)
    #: gains nothing from more rows (its keyed partial is spilled), so keep one bucket of 1 Mi
    auto_partition_rows = 1 << 20
    optional_tables = ("instance_usage",)

    def __post_init__(self) -> None:
        if int(self.bucket_s) <= 0:
            raise ValueError(f"overcommit: bucket_s must be positive, got {self.bucket_s}")
        if self.tier_map is not None:
            tier_map(self.tier_map)
        if self.window_end_us is not None and self.window_end_us < self.window_start_us:
            raise ValueError("overcommit: window_end_us < window_start_us")

    @property
    def columns(self) -> tuple[str, ...]:
        return (
            "start_time",
            "end_time",
            "collection_id",
            "instance_index",
            "machine_id",
            "alloc_collection_id",
            "avg_cpu",
            "avg_mem",
            "max_cpu",
            "max_mem",
        )

    @property
    def width_us(self) -> int:
        return int(self.bucket_s) * 1_000_000

    # ---------------------------------------------------------------- context (client side)
    def resolve_tier_map(self, source: Any) -> TierMap:
        return resolve_tier_map(self.tier_map, source)

    def context(self, source: Any) -> OvercommitContext:
        tm = self.resolve_tier_map(source)
        tier_names = (*tm.names, "unknown")
        # ---- first pass over instance_events (4 columns, a row group at a time): max time, machines
        ev_max, placed = _event_pass(source)
        # ---- the trace window
        w0 = int(self.window_start_us)
        if self.window_end_us is not None:
            w1 = int(self.window_end_us)
        else:
            cands = [v for v in (ev_max, max_finite(source, "instance_usage", "end_time")) if v is not None]
            w1 = max([w0, *cands])
        width = self.width_us
        # Time buckets (docs/user/dataset.md): aligned to trace time 0, bucket k = [k*width, (k+1)*width);
        # the window clips the first and last bucket (column covered_s).
        origin, B = bucket_grid(w0, w1, width)
        # ---- capacity intervals (machine_events: one row per machine event, small)
        me = source.read("machine_events", ["time", "machine_id", "type", "cap_cpu", "cap_mem"])
        mcols = {c: to_i64(me.column(c)) for c in ("time", "machine_id", "type")}
        mcols.update({c: to_f64(me.column(c)) for c in ("cap_cpu", "cap_mem")})
        cap = capacity_intervals(mcols, w0, w1)
        me_ids = unique_sorted(mcols["machine_id"])
        mids = unique_sorted(np.concatenate([me_ids[me_ids != _NULL], placed]))
        ccode = np.searchsorted(mids, cap.machine_id).astype(np.int64)
        order = np.argsort(ccode, kind="stable")
        series = {
            "code": ccode[order],
            "start": cap.start[order],
            "end": cap.end[order],
            "cap_cpu": cap.cap_cpu[order],
            "cap_mem": cap.cap_mem[order],
            "has_me": isin_sorted(mids, me_ids),
        }
        return OvercommitContext(
            tier_map=tm,
            tier_names=tier_names,
            window_start=w0,
            window_end=w1,
            width=width,
            n_buckets=B,
            origin=origin,
            machine_ids=mids,
            lookup=InstanceLookup.empty(),
            series=series,
            stats=dict(cap.stats),
        )

    @property
    def side_inputs(self) -> dict[str, tuple[str, ...]]:
        return {"instance_events": tuple(_EVENT_COLUMNS)}

    def bind(self, ctx: OvercommitContext, side: dict[str, Any], grain: str | None) -> OvercommitContext:
        """The usage tier lookup, and the instances in ``side``: this partition's event columns
        (``grain="instance"``: the partial builds their running pieces on its backend, the GPU's
        under ``backend="gpu"``, and emits their sums) or all of them (flat source, on the client:
        finalize merges their interval partial, built where the partials were)."""
        ev = side["instance_events"]
        T = ctx.n_tiers
        # usage tier lookup: MAX(priority) per (collection, instance, machine), as cell-usage
        lookup = tier_lookup(ev, ctx.tier_map, top_level_only=True, unmatched=T - 1, what="overcommit priority lookup")
        t = ev.read(_EVENT_COLUMNS)
        ecols = {
            c: to_i64(t.column(c))
            for c in ("time", "type", "collection_id", "instance_index", "machine_id", "alloc_collection_id")
        }
        ecols.update({c: to_f64(t.column(c)) for c in ("priority", "req_cpu", "req_mem")})
        del t
        if grain is None:
            return replace(ctx, lookup=lookup, client_events=ecols)
        return replace(ctx, lookup=lookup, events=ecols)

    def _intervals(self, backend: Any, ecols: dict[str, Any], ctx: OvercommitContext) -> dict[str, Any]:
        """The interval partial of the instances whose events are ``ecols`` (arrays on ``backend``)."""
        return self._interval_partial(running_intervals(backend, ecols, ctx.window_start, ctx.window_end), ctx, backend)

    def _interval_partial(self, run: RunningIntervals, ctx: OvercommitContext, backend: Any) -> dict[str, Any]:
        """Keyed sums of the running pieces (arrays on ``backend``): ``req`` (machine code * T +
        tier) * B + bucket -> request-seconds; ``inst`` machine code * B + bucket -> piece-seconds
        and distinct instances; ``istats`` counters (:data:`ISTATS`)."""
        xp = backend.xp
        T, B = ctx.n_tiers, ctx.n_buckets
        placed = xp.nonzero(run.machine_id > 0)[0]
        ps, pe = run.start[placed], run.end[placed]
        pcode, known = id_index(backend, ctx.machine_ids, run.machine_id[placed])
        if not bool(known.all()):
            raise RuntimeError("overcommit: a running piece's machine is not in the machine list (first pass)")
        pcode = pcode.astype(xp.int64)
        ptier = _tier_codes(backend, ctx.tier_map, run.priority[placed], T - 1)
        kw = dict(origin=ctx.origin, width=ctx.width, n_buckets=B)
        rk, rs = overlap_keyed(
            backend, pcode * T + ptier, ps, pe, xp.stack([run.req_cpu[placed], run.req_mem[placed]]), **kw
        )
        ik, iss = overlap_keyed(backend, pcode, ps, pe, xp.ones((1, ps.shape[0])), **kw)
        dk, dc = distinct_keyed(backend, pcode, run.instance[placed], ps, pe, **kw)
        # both keyed by machine code * B + bucket; a distinct count implies positive piece-seconds
        distinct = xp.zeros(ik.shape[0], xp.int64)
        distinct[xp.searchsorted(ik, dk)] = dc
        m = run.machine_id
        st = {
            **run.stats,
            "pieces_unplaced": int(((m == 0) | (m == _NULL)).sum()),
            "pieces_dedicated": int((m == -1).sum()),
            "pieces_unknown_tier": int((ptier == T - 1).sum()),
        }
        return {
            "req": _keyed(xp, rk, req_cpu=rs[0], req_mem=rs[1]),
            "inst": _keyed(xp, ik, inst=iss[0], distinct=distinct),
            "istats": xp.asarray(np.array([st[k] for k in ISTATS], dtype=np.int64)),
        }

    # ---------------------------------------------------------------- partial / merge
    def _empty_usage(self) -> dict[str, np.ndarray]:
        out = {"key": np.zeros(0, np.int64)}
        out.update({f: np.zeros(0, np.float64) for f in _PARTIAL_FIELDS})
        return out

    def empty(self, backend: Any = None) -> dict[str, Any]:
        # ``backend``: where the partials were computed, so finalize builds the tables there too
        return {
            "usage": self._empty_usage(),
            "stats": np.zeros(len(STATS), np.int64),
            **self._empty_intervals(),
            "backend": getattr(backend, "name", "cpu"),
        }

    @staticmethod
    def _empty_intervals() -> dict[str, Any]:
        return {
            "req": _keyed(np, np.zeros(0, np.int64), req_cpu=np.zeros(0), req_mem=np.zeros(0)),
            "inst": _keyed(np, np.zeros(0, np.int64), inst=np.zeros(0), distinct=np.zeros(0, np.int64)),
            "istats": np.zeros(len(ISTATS), np.int64),
        }

    def _tiers(self, backend: Any, c: Any, i: Any, m: Any, ctx: OvercommitContext) -> tuple[Any, Any]:
        found, code = ctx.lookup.find(backend, c, i, m)
        return found, backend.xp.where(found, code, ctx.n_tiers - 1).astype(backend.xp.int64)

    def partial(self, cols: dict[str, Any], ctx: OvercommitContext, backend: Any) -> dict[str, Any]:
        xp = backend.xp
        start, end = cols["start_time"], cols["end_time"]
        alloc, mach = cols["alloc_collection_id"], cols["machine_id"]
        n = int(start.shape[0])
        w0, w1, width, B, T = ctx.window_start, ctx.window_end, ctx.width, ctx.n_buckets, ctx.n_tiers
        top = (alloc == 0) | is_null_int(xp, alloc)
        bounded = end != TIME_AFTER_TRACE
        M = int(ctx.machine_ids.shape[0])
        code, known = id_index(backend, ctx.machine_ids, mach)
        s = xp.clip(start, w0, w1)
        e = xp.clip(end, w0, w1)
        found, tier = self._tiers(backend, cols["collection_id"], cols["instance_index"], mach, ctx)
        use = top & bounded & known & (e > s)
        st = {
            "usage_rows": n,
            "usage_alloc_rows": n - int(top.sum()),
            "usage_unbounded": int((top & ~bounded).sum()),
            "usage_unknown_machine": int((top & bounded & ~known).sum()),
            "usage_no_overlap": int((top & bounded & known & ~(e > s)).sum()),
            "usage_used": int(use.sum()),
            "usage_unknown_tier": int((use & ~found).sum()),
        }
        usage = self._usage(
            backend,
            s[use],
            e[use],
            (code[use].astype(xp.int64) * T + tier[use]),
            max(M, 1) * T,
            {
                k: cols[c][use]
                for k, c in (
                    ("use_cpu", "avg_cpu"),
                    ("use_mem", "avg_mem"),
                    ("max_cpu", "max_cpu"),
                    ("max_mem", "max_mem"),
                )
            },
            ctx.origin,
            width,
            B,
        )
        # the running pieces of this partition's instances (bucketed source: bind gave their events)
        if ctx.events is not None:
            intervals = self._intervals(backend, {c: backend.asarray(v) for c, v in ctx.events.items()}, ctx)
        else:
            intervals = self._empty_intervals()
        part = {"usage": usage, **intervals, "backend": backend.name}
        part["stats"] = xp.asarray(np.array([st[k] for k in STATS], dtype=np.int64))
        return part

    def _usage(
        self, backend: Any, s: Any, e: Any, g: Any, n_codes: int, vals: dict[str, Any], w0: int, width: int, B: int
    ) -> dict[str, Any]:
        """Keyed usage sums: key = (machine code * T + tier) * B + bucket; ``g`` in ``[0, n_codes)``;
        ``w0`` is the grid origin (the first bucket's start), buckets counted from it."""
        xp, ops = backend.xp, backend.ops
        if s.shape[0] == 0:
            return {k: xp.asarray(v) for k, v in self._empty_usage().items()}
        ws = width / 1e6
        b0, b1 = bucket_span(xp, s, e, width, w0)
        a_s = xp.ascontiguousarray(w0 + b0 * width)  # bucket-aligned: every overlapped bucket whole,
        a_e = xp.ascontiguousarray(w0 + (b1 + 1) * width)  # so value / width_s adds the value once per bucket
        # dense codes of the (machine, tier) pairs present: a bincount, not a sort
        present = bincount(xp, g, minlength=n_codes) > 0
        ug = xp.nonzero(present)[0].astype(xp.int64)
        ginv = (xp.cumsum(present) - 1).astype(xp.int32)[g]
        G = int(ug.shape[0])
        lo, hi = int(b0.min()), int(b1.max()) + 1
        step = max(1, min(CELL_LIMIT, max(2 * int(s.shape[0]), 1 << 16)) // max(G, 1))
        # two sweeps: exact overlap (mean usage) and whole buckets (window maxima, window counts)
        exact = xp.stack([vals["use_cpu"].astype(xp.float64), vals["use_mem"].astype(xp.float64)])
        whole = xp.stack(
            [
                vals["max_cpu"].astype(xp.float64) / ws,
                vals["max_mem"].astype(xp.float64) / ws,
                xp.full(s.shape[0], 1.0 / ws, dtype=xp.float64),
                *[xp.isfinite(vals[k]).astype(xp.float64) / ws for k in ("use_cpu", "use_mem", "max_cpu", "max_mem")],
            ]
        )
        keys: list[Any] = []
        outs: dict[str, list[Any]] = {k: [] for k in _PARTIAL_FIELDS}
        s = xp.ascontiguousarray(s)
        e = xp.ascontiguousarray(e)
        if hi - lo > step:  # rows by first bucket once, so a chunk's rows are a slice, not a scan of all rows
            order = xp.argsort(b0, kind="stable")
            bounds = xp.searchsorted(b0[order], xp.arange(lo, hi + step, step, dtype=b0.dtype)).tolist()
        for j, c0 in enumerate(range(lo, hi, step)):
            sel = None
            if hi - lo > step:
                if bounds[j + 1] == bounds[j]:
                    continue
                sel = xp.sort(order[bounds[j] : bounds[j + 1]])  # the chunk's rows, in row order
            cb1 = int(b1[sel].max()) + 1 if sel is not None else hi
            nb = cb1 - c0
            kw = dict(n_groups=G, n_buckets=nb, origin=w0 + c0 * width, width=width)
            if sel is None:
                d1 = ops.bucket_overlap(s, e, exact, ginv, **kw)
                d2 = ops.bucket_overlap(a_s, a_e, whole, ginv, **kw)
            else:
                gi = xp.ascontiguousarray(ginv[sel])
                d1 = ops.bucket_overlap(
                    xp.ascontiguousarray(s[sel]),
                    xp.ascontiguousarray(e[sel]),
                    xp.ascontiguousarray(exact[:, sel]),
                    gi,
                    **kw,
                )
                d2 = ops.bucket_overlap(
                    xp.ascontiguousarray(a_s[sel]),
                    xp.ascontiguousarray(a_e[sel]),
                    xp.ascontiguousarray(whole[:, sel]),
                    gi,
                    **kw,
                )
            dense = {
                "use_cpu": d1[0].reshape(-1),
                "use_mem": d1[1].reshape(-1),
                "max_cpu": d2[0].reshape(-1),
                "max_mem": d2[1].reshape(-1),
                "windows": d2[2].reshape(-1),
                **{k: d2[3 + j].reshape(-1) for j, k in enumerate(_KNOWN_FIELDS)},
            }
            nz = dense["windows"] != 0
            for k in ("use_cpu", "use_mem", "max_cpu", "max_mem"):
                nz |= dense[k] != 0
            idx = xp.nonzero(nz)[0]
            keys.append(ug[idx // nb] * B + (c0 + idx % nb))
            for k in _PARTIAL_FIELDS:
                outs[k].append(dense[k][idx])
            del d1, d2, dense, nz, idx  # before the next chunk's blocks are allocated
        if len(keys) == 1:  # g-major dense layout: keys already sorted and unique
            return {"key": keys[0], **{k: v[0] for k, v in outs.items()}}
        return keyed_reduce(backend, xp.concatenate(keys), {k: xp.concatenate(v) for k, v in outs.items()})

    def merge(self, a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
        return {
            "usage": merge_keyed(a["usage"], b["usage"]),
            "req": merge_keyed(a["req"], b["req"]),
            "inst": merge_keyed(a["inst"], b["inst"]),
            **self.merge_rest(a, b),
        }

    # ---------------------------------------------------------------- finalize
    parted = ("machine",)

    def split(self, partial: dict[str, Any]) -> tuple[dict[str, Any], dict[str, dict[str, np.ndarray]]]:
        rest = {"stats": to_host(partial["stats"]), "istats": to_host(partial["istats"]), "backend": partial["backend"]}
        return rest, {k: {f: host_or_device(v) for f, v in partial[k].items()} for k in ("usage", "req", "inst")}

    def merge_rest(self, a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
        return {
            "stats": a["stats"] + b["stats"],
            "istats": a["istats"] + b["istats"],
            "backend": merged_backend(a["backend"], b["backend"]),
        }

    def shards(self, ctx: OvercommitContext, rest: dict[str, Any]) -> list[tuple[int, int]]:
        """Ranges of machine codes of about :data:`SHARD_CELLS` machine-buckets each (x
        :data:`DEVICE_SHARD_FACTOR` where the partials were computed on a device)."""
        M, B = int(ctx.machine_ids.shape[0]), max(int(ctx.n_buckets), 1)
        step = max(1, SHARD_CELLS * (DEVICE_SHARD_FACTOR if rest.get("backend", "cpu") != "cpu" else 1) // B)
        return [(m0, min(M, m0 + step)) for m0 in range(0, M, step)] or [(0, 0)]

    def key_range(self, ctx: OvercommitContext, name: str, lo: int, hi: int) -> tuple[int, int]:
        per = (ctx.n_tiers if name in ("usage", "req") else 1) * ctx.n_buckets
        return lo * per, hi * per

    def client_partial(self, ctx: OvercommitContext, backend: Any = None) -> dict[str, Any] | None:
        """The interval partial of a flat source's instances, built on ``backend`` (default: the
        host's; a gpu finalize's on the device, so that only the event columns are copied there,
        not the keyed sums they expand into)."""
        if ctx.client_events is None:  # bucketed source: the partitions carry the intervals
            return None
        if isinstance(ctx.client_events, str):
            raise RuntimeError(
                "overcommit: this context was pickled without the events bound on the client; "
                "finalize with the client's context"
            )
        be = finalize_backend("cpu") if backend is None else backend
        return {**self.empty(be), **self._intervals(be, {k: be.stage(v) for k, v in ctx.client_events.items()}, ctx)}

    #: its keyed sums are ~24 B a window (240 MB at 10^7), which a gpu study would otherwise copy
    #: to the host and back to the device for the dense tables of :meth:`finalize_shard`
    device_partial = True

    def finalize(self, partial: dict[str, Any], ctx: OvercommitContext) -> dict[str, Any]:
        cp = self.client_partial(ctx, finalize_backend(partial["backend"]))
        if cp is not None:
            if any(int(partial[k]["key"].shape[0]) for k in ("req", "inst")):
                partial = self.merge(to_host(partial), to_host(cp))  # intervals on both sides: merged on the host
            else:
                # a flat source: its partitions carry no intervals, the client's take their place
                # (what the merge gives), and the sums stay where they were built (device_partial)
                partial = {
                    **partial,
                    "req": cp["req"],
                    "inst": cp["inst"],
                    "istats": to_host(partial["istats"]) + to_host(cp["istats"]),
                }
        return finalize_in_memory(self, partial, ctx, client=False)

    def finalize_shard(
        self, keyed: dict[str, dict[str, np.ndarray]], rest: dict[str, Any], ctx: OvercommitContext, lo: int, hi: int
    ) -> tuple[dict[str, Iterator[pa.Table]], _CellSums]:
        """The machine table of machine codes ``[lo, hi)``, a chunk of ~:data:`FINALIZE_CELLS`
        machine-buckets at a time (dense only over the chunk; each chunk one Arrow table, written as
        a row group), and the shard's cell sums (complete once the rows are consumed).  The dense
        tables are built on the backend the partials were computed on (:func:`finalize_backend`:
        the device under ``backend="gpu"``); each chunk's rows and the sums come back to the host."""
        if ctx.series is None:
            raise RuntimeError("overcommit: finalize needs the capacity intervals of the context")
        M, T, B = int(ctx.machine_ids.shape[0]), ctx.n_tiers, ctx.n_buckets
        for k, per in (("usage", T), ("req", T), ("inst", 1)):
            key = keyed[k]["key"]
            if int(key.shape[0]) and (int(key.max()) >= M * per * B or int(key.min()) < 0):
                raise ValueError(f"overcommit: {k} partial does not match the context (key out of range)")
        be = finalize_backend(rest["backend"])
        acc = _CellSums(be.xp, B, T, keep_ratios=be.name != "cpu")  # on a device: the summary's ratios stay there
        has_usage = int(rest["stats"][STATS.index("usage_rows")]) > 0
        return {"machine": _machine_rows(be, keyed, ctx, lo, hi, acc, has_usage, FINALIZE_CELLS[be.name])}, acc

    def finalize_parted(
        self, rest: dict[str, Any], ctx: OvercommitContext, tables: dict[str, Any], extras: list[_CellSums]
    ) -> dict[str, pa.Table]:
        """The cell series (the shards' cell sums, added in shard order), the summary (streamed
        from the machine table) and the run's counters, as Arrow tables (a run without plots never
        imports pandas)."""
        tiers = list(ctx.tier_names)
        stats = dict(ctx.stats)
        stats.update(zip(ISTATS, (int(x) for x in rest["istats"]), strict=True))
        stats.update(zip(STATS, (int(x) for x in rest["stats"]), strict=True))
        has_usage = stats["usage_rows"] > 0
        acc = extras[0]
        for e in extras[1:]:
            acc.add_sums(e)
        bucket, bstart, L = _grid(ctx)
        cell = acc.columns(bucket, bstart, L, tiers)
        if not has_usage:
            for c in cell:
                if c.startswith(_USAGE_PREFIXES):
                    cell[c] = np.full(ctx.n_buckets, np.nan)
        summary = _summary(
            finalize_backend(rest["backend"]), tables["machine"], tiers, has_usage=has_usage, ratios=acc.ratios
        )
        info = table_from_rows(
            [
                {
                    "analysis": self.name,
                    "tier_map": ctx.tier_map.name,
                    "tiers": ",".join(tiers),
                    "bucket_s": int(self.bucket_s),
                    "window_start_us": ctx.window_start,
                    "window_end_us": ctx.window_end,
                    "machines": int(ctx.machine_ids.shape[0]),
                    "buckets": ctx.n_buckets,
                    **stats,
                }
            ]
        )
        return {"cell": table(cell), "summary": summary, "info": info}

    def summary(self, result: dict[str, Any]) -> str:
        return _summary_text(self.label, result)
