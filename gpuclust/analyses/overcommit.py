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

Design (engine fit; docs/analysis-overcommit.md "Design").

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
  block, and the cell series from per-bucket running sums.
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
from gpuclust.analyses.base import Analysis, fmt, host_or_device, is_null_int, resolve_tier_map, to_host
from gpuclust.analyses.grouping import bucket_grid, bucket_span, isin_sorted, unique_sorted
from gpuclust.analyses.options import option, tier_map_option
from gpuclust.arrow_numpy import schema_table, table, table_from_rows
from gpuclust.backends import finalize_backend, merged_backend
from gpuclust.parted import array_batches, finalize_in_memory, key_bounds
from gpuclust.partials import keyed_reduce, merge_keyed
from gpuclust.schema import TIME_AFTER_TRACE, TierMap, tier_map
from gpuclust.tables import as_arrow

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
#: A ratio counts as "over capacity" when it exceeds 1 by more than this (float rounding).
OVER_EPS = 1e-9
QUANTILES = (0.5, 0.9, 0.99, 1.0)
#: Counters kept in every usage partial, in this order.
STATS = ("usage_rows", "usage_alloc_rows", "usage_unbounded", "usage_unknown_machine",
         "usage_no_overlap", "usage_used", "usage_unknown_tier")
#: Counters of the running intervals (summed over partitions), in this order.
ISTATS = ("event_rows", "alloc_event_rows", "instances", "pieces", "schedules", "running_at_end",
          "terminal_without_schedule", "update_running_not_running", "schedule_while_running",
          "unknown_request_pieces", "pieces_unplaced", "pieces_dedicated", "pieces_unknown_tier")
_USAGE_FIELDS = ("use_cpu", "use_mem", "max_cpu", "max_mem", "windows")
#: per usage field: how many overlapping windows carry a non-NULL value (0 with windows > 0: unknown)
_KNOWN_FIELDS = ("n_use_cpu", "n_use_mem", "n_max_cpu", "n_max_mem")
_PARTIAL_FIELDS = _USAGE_FIELDS + _KNOWN_FIELDS
_EVENT_COLUMNS = ["time", "type", "collection_id", "instance_index", "machine_id", "alloc_collection_id",
                  "priority", "req_cpu", "req_mem"]
#: what the first pass over instance_events reads
_PASS_COLUMNS = ["time", "type", "machine_id", "alloc_collection_id"]
_NULL = np.iinfo(np.int64).min
#: what a pickled context holds instead of the client's interval partial
_DROPPED = "dropped when pickled"
#: float columns of the machine table before the per-tier ones
_MACHINE_FLOATS = ("covered_s", "up_s", "cap_cpu", "cap_mem", "req_cpu", "req_mem", "use_cpu", "use_mem", "max_cpu_sum",
                   "max_mem_sum", "instances", *[f"{k}_ratio_{r}" for r in ("cpu", "mem") for k in ("alloc", "usage", "peak")])
_TIER_COLS = ("req_cpu", "req_mem", "use_cpu", "use_mem", "max_cpu_sum", "max_mem_sum")


_INT_COLUMNS = ("machine_id", "bucket", "bucket_start_us", "instances_distinct", "windows")


def _machine_columns(tiers: list[str]) -> list[str]:
    """The machine table's columns, in order."""
    out = ["machine_id", "bucket", "bucket_start_us"]
    for c in _MACHINE_FLOATS:
        out.append(c)
        if c == "cap_mem":
            out.append("cap_unknown")
        elif c == "instances":
            out += ["instances_distinct", "windows"]
    return out + [f"{c}_{t}" for t in tiers for c in _TIER_COLS]
#: columns that are NaN (unknown) when the dataset has no instance_usage rows
_USAGE_PREFIXES = ("use_", "max_cpu_sum", "max_mem_sum", "usage_ratio_", "peak_ratio_")


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
    #: trace time 0, see "Time buckets" in docs/dataset.md); dense bucket ``j`` is absolute bucket
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
    window_end_us: int | None = option(None, "trace window end; default: the largest finite time in instance_events / "
                                       "instance_usage")

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
        return ("start_time", "end_time", "collection_id", "instance_index", "machine_id",
                "alloc_collection_id", "avg_cpu", "avg_mem", "max_cpu", "max_mem")

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
        # Time buckets (docs/dataset.md): aligned to trace time 0, bucket k = [k*width, (k+1)*width);
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
        series = {"code": ccode[order], "start": cap.start[order], "end": cap.end[order],
                  "cap_cpu": cap.cap_cpu[order], "cap_mem": cap.cap_mem[order], "has_me": isin_sorted(mids, me_ids)}
        return OvercommitContext(
            tier_map=tm, tier_names=tier_names, window_start=w0, window_end=w1, width=width, n_buckets=B, origin=origin,
            machine_ids=mids, lookup=InstanceLookup.empty(), series=series, stats=dict(cap.stats))

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
        ecols = {c: to_i64(t.column(c)) for c in ("time", "type", "collection_id", "instance_index", "machine_id",
                                                 "alloc_collection_id")}
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
        rk, rs = overlap_keyed(backend, pcode * T + ptier, ps, pe, xp.stack([run.req_cpu[placed], run.req_mem[placed]]),
                               **kw)
        ik, iss = overlap_keyed(backend, pcode, ps, pe, xp.ones((1, ps.shape[0])), **kw)
        dk, dc = distinct_keyed(backend, pcode, run.instance[placed], ps, pe, **kw)
        # both keyed by machine code * B + bucket; a distinct count implies positive piece-seconds
        distinct = xp.zeros(ik.shape[0], xp.int64)
        distinct[xp.searchsorted(ik, dk)] = dc
        m = run.machine_id
        st = {**run.stats,
              "pieces_unplaced": int(((m == 0) | (m == _NULL)).sum()),
              "pieces_dedicated": int((m == -1).sum()),
              "pieces_unknown_tier": int((ptier == T - 1).sum())}
        return {"req": _keyed(xp, rk, req_cpu=rs[0], req_mem=rs[1]),
                "inst": _keyed(xp, ik, inst=iss[0], distinct=distinct),
                "istats": xp.asarray(np.array([st[k] for k in ISTATS], dtype=np.int64))}

    # ---------------------------------------------------------------- partial / merge
    def _empty_usage(self) -> dict[str, np.ndarray]:
        out = {"key": np.zeros(0, np.int64)}
        out.update({f: np.zeros(0, np.float64) for f in _PARTIAL_FIELDS})
        return out

    def empty(self, backend: Any = None) -> dict[str, Any]:
        # ``backend``: where the partials were computed, so finalize builds the tables there too
        return {"usage": self._empty_usage(), "stats": np.zeros(len(STATS), np.int64), **self._empty_intervals(),
                "backend": getattr(backend, "name", "cpu")}

    @staticmethod
    def _empty_intervals() -> dict[str, Any]:
        return {"req": _keyed(np, np.zeros(0, np.int64), req_cpu=np.zeros(0), req_mem=np.zeros(0)),
                "inst": _keyed(np, np.zeros(0, np.int64), inst=np.zeros(0), distinct=np.zeros(0, np.int64)),
                "istats": np.zeros(len(ISTATS), np.int64)}

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
        st = {"usage_rows": n, "usage_alloc_rows": n - int(top.sum()),
              "usage_unbounded": int((top & ~bounded).sum()),
              "usage_unknown_machine": int((top & bounded & ~known).sum()),
              "usage_no_overlap": int((top & bounded & known & ~(e > s)).sum()),
              "usage_used": int(use.sum()), "usage_unknown_tier": int((use & ~found).sum())}
        usage = self._usage(backend, s[use], e[use], (code[use].astype(xp.int64) * T + tier[use]), max(M, 1) * T,
                            {k: cols[c][use] for k, c in (("use_cpu", "avg_cpu"), ("use_mem", "avg_mem"),
                                                         ("max_cpu", "max_cpu"), ("max_mem", "max_mem"))},
                            ctx.origin, width, B)
        # the running pieces of this partition's instances (bucketed source: bind gave their events)
        if ctx.events is not None:
            intervals = self._intervals(backend, {c: backend.asarray(v) for c, v in ctx.events.items()}, ctx)
        else:
            intervals = self._empty_intervals()
        part = {"usage": usage, **intervals, "backend": backend.name}
        part["stats"] = xp.asarray(np.array([st[k] for k in STATS], dtype=np.int64))
        return part

    def _usage(self, backend: Any, s: Any, e: Any, g: Any, n_codes: int, vals: dict[str, Any], w0: int,
               width: int, B: int) -> dict[str, Any]:
        """Keyed usage sums: key = (machine code * T + tier) * B + bucket; ``g`` in ``[0, n_codes)``;
        ``w0`` is the grid origin (the first bucket's start), buckets counted from it."""
        xp, ops = backend.xp, backend.ops
        if s.shape[0] == 0:
            return {k: xp.asarray(v) for k, v in self._empty_usage().items()}
        ws = width / 1e6
        b0, b1 = bucket_span(xp, s, e, width, w0)
        a_s = xp.ascontiguousarray(w0 + b0 * width)      # bucket-aligned: every overlapped bucket whole,
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
        whole = xp.stack([vals["max_cpu"].astype(xp.float64) / ws, vals["max_mem"].astype(xp.float64) / ws,
                          xp.full(s.shape[0], 1.0 / ws, dtype=xp.float64),
                          *[xp.isfinite(vals[k]).astype(xp.float64) / ws
                            for k in ("use_cpu", "use_mem", "max_cpu", "max_mem")]])
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
                sel = xp.sort(order[bounds[j]:bounds[j + 1]])  # the chunk's rows, in row order
            cb1 = int(b1[sel].max()) + 1 if sel is not None else hi
            nb = cb1 - c0
            kw = dict(n_groups=G, n_buckets=nb, origin=w0 + c0 * width, width=width)
            if sel is None:
                d1 = ops.bucket_overlap(s, e, exact, ginv, **kw)
                d2 = ops.bucket_overlap(a_s, a_e, whole, ginv, **kw)
            else:
                gi = xp.ascontiguousarray(ginv[sel])
                d1 = ops.bucket_overlap(xp.ascontiguousarray(s[sel]), xp.ascontiguousarray(e[sel]),
                                        xp.ascontiguousarray(exact[:, sel]), gi, **kw)
                d2 = ops.bucket_overlap(xp.ascontiguousarray(a_s[sel]), xp.ascontiguousarray(a_e[sel]),
                                        xp.ascontiguousarray(whole[:, sel]), gi, **kw)
            dense = {"use_cpu": d1[0].reshape(-1), "use_mem": d1[1].reshape(-1), "max_cpu": d2[0].reshape(-1),
                     "max_mem": d2[1].reshape(-1), "windows": d2[2].reshape(-1),
                     **{k: d2[3 + j].reshape(-1) for j, k in enumerate(_KNOWN_FIELDS)}}
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
        return {"usage": merge_keyed(a["usage"], b["usage"]), "req": merge_keyed(a["req"], b["req"]),
                "inst": merge_keyed(a["inst"], b["inst"]), **self.merge_rest(a, b)}

    # ---------------------------------------------------------------- finalize
    parted = ("machine",)

    def split(self, partial: dict[str, Any]) -> tuple[dict[str, Any], dict[str, dict[str, np.ndarray]]]:
        rest = {"stats": to_host(partial["stats"]), "istats": to_host(partial["istats"]), "backend": partial["backend"]}
        return rest, {k: {f: host_or_device(v) for f, v in partial[k].items()} for k in ("usage", "req", "inst")}

    def merge_rest(self, a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
        return {"stats": a["stats"] + b["stats"], "istats": a["istats"] + b["istats"],
                "backend": merged_backend(a["backend"], b["backend"])}

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
            raise RuntimeError("overcommit: this context was pickled without the events bound on the client; "
                               "finalize with the client's context")
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
                partial = {**partial, "req": cp["req"], "inst": cp["inst"],
                           "istats": to_host(partial["istats"]) + to_host(cp["istats"])}
        return finalize_in_memory(self, partial, ctx, client=False)

    def _grid(self, ctx: OvercommitContext, xp: Any = np) -> tuple[Any, Any, Any]:
        """Absolute bucket numbers, bucket starts, and the seconds of each bucket in the window
        (made in ``xp``'s memory: nothing copied to a device)."""
        bucket = ctx.origin // ctx.width + xp.arange(ctx.n_buckets, dtype=np.int64)
        bstart = bucket * ctx.width
        L = (xp.minimum(bstart + ctx.width, ctx.window_end) - xp.maximum(bstart, ctx.window_start)).astype(np.float64) / 1e6
        return bucket, bstart, L

    def finalize_shard(self, keyed: dict[str, dict[str, np.ndarray]], rest: dict[str, Any], ctx: OvercommitContext,
                       lo: int, hi: int) -> tuple[dict[str, Iterator[pa.Table]], _CellSums]:
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
        return {"machine": self._machine_rows(be, keyed, rest, ctx, lo, hi, acc)}, acc

    def _machine_rows(self, be: Any, keyed: dict[str, dict[str, np.ndarray]], rest: dict[str, Any],
                      ctx: OvercommitContext, lo: int, hi: int, acc: _CellSums) -> Iterator[pa.Table]:
        xp = be.xp
        tiers = list(ctx.tier_names)
        bucket, _, L = self._grid(ctx, xp)
        has_usage = int(rest["stats"][STATS.index("usage_rows")]) > 0
        step = max(1, FINALIZE_CELLS[be.name] // max(ctx.n_buckets, 1))
        if hi <= lo:  # no machines: one empty frame (the columns)
            yield table({c: np.zeros(0, bool if c == "cap_unknown" else np.int64 if c in _INT_COLUMNS else np.float64)
                         for c in _machine_columns(tiers)})
            acc.to_host()
            return
        machine_ids = be.stage(ctx.machine_ids)
        for m0 in range(lo, hi, step):
            m1 = min(hi, m0 + step)
            d = self._chunk(be, ctx, keyed, m0, m1, L)
            pres = d["present"]
            mi, bi = xp.nonzero(pres)
            cols: dict[str, Any] = {
                "machine_id": machine_ids[m0 + mi], "bucket": bucket[bi], "bucket_start_us": bucket[bi] * ctx.width,
                "covered_s": L[bi]}
            for c, src in (("up_s", "up_s"), ("cap_cpu", "cap_c"), ("cap_mem", "cap_m"), ("req_cpu", "req_c"),
                           ("req_mem", "req_m"), ("use_cpu", "use_c"), ("use_mem", "use_m"), ("max_cpu_sum", "max_c"),
                           ("max_mem_sum", "max_m"), ("instances", "inst")):
                cols[c] = d[src][mi, bi]
            cols["cap_unknown"] = (d["unk_c"] | d["unk_m"])[mi, bi]
            cols["instances_distinct"] = d["distinct"][mi, bi]
            cols["windows"] = d["windows"][mi, bi]
            for r in ("cpu", "mem"):
                for kind, col in (("alloc", f"req_{r}"), ("usage", f"use_{r}"), ("peak", f"max_{r}_sum")):
                    cols[f"{kind}_ratio_{r}"] = _ratio(xp, cols[col], cols[f"cap_{r}"])
            for k, t in enumerate(tiers):
                for col in _TIER_COLS:
                    cols[f"{col}_{t}"] = d[col][mi, k, bi]
            acc.add(d, pres)
            acc.add_ratios(cols, tiers)
            del d
            n_rows = int(mi.shape[0])
            host = {c: be.to_host(cols[c]) for c in _machine_columns(tiers)}
            del cols, mi, bi
            if not has_usage:
                # No instance_usage rows at all: usage was not measured, so it is unknown (NaN), not 0.
                for c in host:
                    if c.startswith(_USAGE_PREFIXES):
                        host[c] = np.full(n_rows, np.nan)
            yield table(host)  # a row group, built without pandas
        acc.to_host()

    def finalize_parted(self, rest: dict[str, Any], ctx: OvercommitContext, tables: dict[str, Any],
                        extras: list[_CellSums]) -> dict[str, pa.Table]:
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
        bucket, bstart, L = self._grid(ctx)
        cell = acc.columns(bucket, bstart, L, tiers)
        if not has_usage:
            for c in cell:
                if c.startswith(_USAGE_PREFIXES):
                    cell[c] = np.full(ctx.n_buckets, np.nan)
        summary = _summary(finalize_backend(rest["backend"]), tables["machine"], tiers, has_usage=has_usage,
                           ratios=acc.ratios)
        info = table_from_rows([{
            "analysis": self.name, "tier_map": ctx.tier_map.name, "tiers": ",".join(tiers),
            "bucket_s": int(self.bucket_s), "window_start_us": ctx.window_start, "window_end_us": ctx.window_end,
            "machines": int(ctx.machine_ids.shape[0]), "buckets": ctx.n_buckets, **stats}])
        return {"cell": table(cell), "summary": summary, "info": info}

    @staticmethod
    def _chunk(be: Any, ctx: OvercommitContext, parts: dict[str, dict[str, np.ndarray]], m0: int, m1: int,
               L: Any) -> dict[str, Any]:
        """Dense (machine, [tier,] bucket) arrays of machines ``[m0, m1)`` on backend ``be``:
        capacity swept from the chunk's capacity intervals, requests / instances / usage scattered
        from the keyed sums (host arrays: the chunk's rows are copied over; or already on the
        device, :attr:`device_partial`), and ``present``, the
        (machine, bucket) mask of rows."""
        xp = be.xp
        S = ctx.series
        assert S is not None
        T, B, cm = ctx.n_tiers, ctx.n_buckets, m1 - m0

        def dense(part: dict[str, np.ndarray], fields: tuple[str, ...], per: int) -> dict[str, Any]:
            key = part["key"]
            lo, hi = key_bounds(key, m0 * per * B, m1 * per * B)
            at = be.asarray(key[lo:hi] - m0 * per * B)
            out = {}
            for f in fields:
                a = xp.zeros(cm * per * B, dtype=part[f].dtype)
                a[at] = be.asarray(part[f][lo:hi])
                out[f] = a.reshape((cm, per, B) if per > 1 else (cm, B))
            return out

        lo, hi = np.searchsorted(S["code"], [m0, m1])
        cc, cmem = S["cap_cpu"][lo:hi], S["cap_mem"][lo:hi]
        capv = np.stack([np.ones(hi - lo), cc, cmem, np.isnan(cc).astype(np.float64), np.isnan(cmem).astype(np.float64)])
        cs = be.ops.bucket_overlap(be.asarray(S["start"][lo:hi]), be.asarray(S["end"][lo:hi]), be.asarray(capv),
                                   be.asarray((S["code"][lo:hi] - m0).astype(np.int32)), n_groups=cm, n_buckets=B,
                                   origin=ctx.origin, width=ctx.width)
        U = dense(parts["usage"], _PARTIAL_FIELDS, T)
        R = dense(parts["req"], ("req_cpu", "req_mem"), T)
        I = dense(parts["inst"], ("inst", "distinct"), 1)  # noqa: E741
        # a (machine, tier, bucket) with windows whose values are all NULL was not measured: NaN
        wt = xp.rint(U["windows"])
        for f, n in (("use_cpu", "n_use_cpu"), ("use_mem", "n_use_mem"), ("max_cpu", "n_max_cpu"),
                     ("max_mem", "n_max_mem")):
            U[f] = xp.where((wt > 0) & (xp.rint(U[n]) == 0), np.nan, U[f])
            del U[n]
        windows = wt.sum(axis=1).astype(xp.int64)
        del wt
        with np.errstate(invalid="ignore", divide="ignore"):
            use_ct, use_mt = U["use_cpu"] / L, U["use_mem"] / L
            use_c, use_m = use_ct.sum(axis=1), use_mt.sum(axis=1)
            max_c, max_m = U["max_cpu"].sum(axis=1), U["max_mem"].sum(axis=1)
        present = ((cs[0] > 0) | (R["req_cpu"].sum(axis=1) > 0) | (R["req_mem"].sum(axis=1) > 0) | (I["inst"] > 0)
                   | (windows > 0) | (use_c != 0) | (use_m != 0) | (max_c != 0) | (max_m != 0))
        no_me = ~be.asarray(S["has_me"][m0:m1, None])
        unk_c = (cs[3] > 0) | no_me
        unk_m = (cs[4] > 0) | no_me
        with np.errstate(invalid="ignore", divide="ignore"):
            req_ct, req_mt = R["req_cpu"] / L, R["req_mem"] / L
            return {"present": present, "up_s": cs[0], "unk_c": unk_c, "unk_m": unk_m,
                    "cap_c": xp.where(unk_c, np.nan, cs[1] / L), "cap_m": xp.where(unk_m, np.nan, cs[2] / L),
                    "req_cpu": req_ct, "req_mem": req_mt, "use_cpu": use_ct, "use_mem": use_mt,
                    "max_cpu_sum": U["max_cpu"], "max_mem_sum": U["max_mem"],
                    "req_c": req_ct.sum(axis=1), "req_m": req_mt.sum(axis=1), "use_c": use_c, "use_m": use_m,
                    "max_c": max_c, "max_m": max_m, "inst": I["inst"] / L, "distinct": I["distinct"],
                    "windows": windows}

    def summary(self, result: dict[str, Any]) -> str:
        info = as_arrow(result["info"]).to_pylist()[0]
        values = {(r["metric"], r["resource"], r["tier"]): r["value"] for r in as_arrow(result["summary"]).to_pylist()}
        lines = [f"{self.label}: tier map {info['tier_map']!r}, {info['machines']} machines x {info['buckets']} "
                 f"buckets of {info['bucket_s']} s, window [{info['window_start_us']}, {info['window_end_us']}) us",
                 f"  instances {info['instances']}, running pieces {info['pieces']} (unplaced {info['pieces_unplaced']},"
                 f" dedicated {info['pieces_dedicated']}, running at end {info['running_at_end']}, terminal without"
                 f" SCHEDULE {info['terminal_without_schedule']}); usage rows used {info['usage_used']} of"
                 f" {info['usage_rows']}"]

        def get(metric: str, r: str, t: str = "all") -> float:
            v = values.get((metric, r, t))
            return float("nan") if v is None else float(v)

        for r in ("cpu", "mem"):
            if not any(k[1] == r for k in values):
                continue
            lines.append(
                f"  {r}: {int(get('machine_buckets', r))} full machine-buckets; requested/capacity mean "
                f"{fmt(get('alloc_ratio_mean', r), '.3f')}, p50 {fmt(get('alloc_ratio_p50', r), '.3f')}, "
                f"p99 {fmt(get('alloc_ratio_p99', r), '.3f')}, max {fmt(get('alloc_ratio_max', r), '.3f')}; "
                f"over capacity by request {fmt(get('share_over_capacity_request', r), '.2f', 100, '%')}"
                f" of machine-time, by usage {fmt(get('share_over_capacity_usage', r), '.2f', 100, '%')}; "
                f"usage/capacity mean {fmt(get('usage_ratio_mean', r), '.3f')}")
        return "\n".join(lines)


#: The ``summary`` table's columns and types (an empty table keeps them).
_SUMMARY_SCHEMA = pa.schema([("metric", pa.string()), ("resource", pa.string()), ("tier", pa.string()),
                             ("value", pa.float64())])


def _full(up_s: Any, covered_s: Any, cap: Any) -> Any:
    """The *full* machine-buckets: up the whole bucket, known capacity > 0 (any array module)."""
    return (up_s >= covered_s * (1 - 1e-12)) & (cap == cap) & (abs(cap) != np.inf) & (cap > 0)


def _summary(be: Any, machine: Any, tiers: list[str], has_usage: bool,
             ratios: dict[tuple[str, str], list[Any]] | None = None) -> pa.Table:
    """Statistics over *full* machine-buckets: available the whole bucket, known capacity > 0.
    Usage statistics are NaN when the dataset has no instance_usage rows (e.g. 2011 events only).

    ``machine`` is the machine table (a parted table, a DataFrame or an Arrow table), read a batch
    at a time without pandas (:func:`gpuclust.parted.array_batches`): the sums in one pass, and
    the exact ratio quantiles of every (resource, tier) together in a few more
    (:func:`gpuclust.stream_quantiles.stream_quantiles_many`), so nothing grows with the table.
    On a device backend ``be`` (the partials' backend) the quantiles take one sort a series of
    ``ratios``, the ratios the finalize left on the device (:meth:`_CellSums.add_ratios`), or
    else of the ratios copied there (:func:`gpuclust.stream_quantiles.backend_quantiles_many`)."""
    from gpuclust.stream_quantiles import backend_quantiles_many, device_quantiles_many

    def full_of(b: dict[str, np.ndarray], r: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        L, cap = b["covered_s"], b[f"cap_{r}"]
        full = _full(b["up_s"], L, cap)
        return full, L[full], cap[full]

    series = [(r, t) for r in ("cpu", "mem") for t in ("all", *tiers)]
    req_col = {(r, t): f"req_{r}" if t == "all" else f"req_{r}_{t}" for r, t in series}
    cols = sorted({"covered_s", "up_s", *{c for r in ("cpu", "mem") for c in (f"cap_{r}", f"use_{r}", f"max_{r}_sum")},
                   *req_col.values()})
    avail = 0.0
    z = {r: {k: 0.0 for k in ("n", "tw", "den", "num", *[f"tk_{x}" for x in ("request", "usage", "peak")],
                              *[f"over_{x}" for x in ("request", "usage", "peak")])} for r in ("cpu", "mem")}
    reqw = {k: [0.0, 0.0] for k in req_col}  # sum(req * w), sum(cap * w)
    for b in array_batches(machine, cols):
        b = {c: np.asarray(v, np.float64) for c, v in b.items()}
        avail += float(b["up_s"].sum())
        for r in ("cpu", "mem"):
            full, w, c = full_of(b, r)
            a = z[r]
            a["n"] += int(full.sum())
            a["tw"] += float(w.sum())
            for kind, col in (("request", f"req_{r}"), ("usage", f"use_{r}"), ("peak", f"max_{r}_sum")):
                v = b[col][full]
                kn = np.isfinite(v)  # usage statistics over the machine-buckets whose usage is known
                a[f"tk_{kind}"] += float(w[kn].sum())
                a[f"over_{kind}"] += float(w[kn & (v > c * (1 + OVER_EPS))].sum())
            u = b[f"use_{r}"][full]
            kn = np.isfinite(u)
            a["den"] += float((c[kn] * w[kn]).sum())
            a["num"] += float((u[kn] * w[kn]).sum())
            for t in ("all", *tiers):
                req = b[req_col[(r, t)]][full]
                reqw[(r, t)][0] += float((req * w).sum())
                reqw[(r, t)][1] += float((c * w).sum())
    # the ratios of the resources with full machine-buckets, every tier's in the same passes
    quantiled = [(r, t) for r, t in series if z[r]["n"] > 0]

    def batch_ratios() -> Any:
        for b in array_batches(machine, ["covered_s", "up_s", "cap_cpu", "cap_mem", *{req_col[k] for k in quantiled}]):
            b = {c: np.asarray(v, np.float64) for c, v in b.items()}
            full = {r: full_of(b, r) for r in {r for r, _ in quantiled}}
            yield [b[req_col[(r, t)]][full[r][0]] / full[r][2] for r, t in quantiled]

    if not quantiled:
        qs = np.zeros((0, len(QUANTILES)))
    elif ratios is not None:  # left on the device by the finalize
        qs = device_quantiles_many(be, [ratios.get(k, []) for k in quantiled], QUANTILES)
    else:
        qs = backend_quantiles_many(be, batch_ratios, len(quantiled), QUANTILES)
    qrow = dict(zip(quantiled, qs, strict=True))
    rows: list[dict[str, Any]] = []

    def add(metric: str, r: str, t: str, v: float) -> None:
        rows.append({"metric": metric, "resource": r, "tier": t, "value": float(v)})

    for r in ("cpu", "mem"):
        a = z[r]
        if a["n"] == 0:
            continue
        add("machine_buckets", r, "all", float(a["n"]))
        add("machine_time_share", r, "all", a["tw"] / avail if avail > 0 else np.nan)
        for kind in ("request", "usage", "peak"):
            tk = a[f"tk_{kind}"]
            share = a[f"over_{kind}"] / tk if tk > 0 else np.nan
            add(f"share_over_capacity_{kind}", r, "all", share if has_usage or kind == "request" else np.nan)
        mean_use = a["num"] / a["den"] if a["den"] > 0 else np.nan
        add("usage_ratio_mean", r, "all", mean_use if has_usage else np.nan)
        for t in ("all", *tiers):
            num, den = reqw[(r, t)]
            add("alloc_ratio_mean", r, t, num / den)
            for q, v in zip(QUANTILES, qrow[(r, t)], strict=True):
                add("alloc_ratio_max" if q == 1.0 else f"alloc_ratio_p{round(q * 100)}", r, t, v)
    return schema_table(rows, _SUMMARY_SCHEMA)


def _ratio(xp: Any, num: Any, den: Any) -> Any:
    """num / den; 0/0 and anything / NaN -> NaN, x/0 (x > 0) -> inf."""
    with np.errstate(invalid="ignore", divide="ignore"):
        return xp.where((den == 0) & (num == 0), np.nan, num.astype(xp.float64) / den)


class _CellSums:
    """Per-bucket running sums over machine chunks: what the ``cell`` table is built from.  Summed
    on the backend of the chunks (``xp``), then moved to the host (:meth:`to_host`) once the
    shard's chunks are done."""

    COLS = ("req_cpu", "req_mem", "use_cpu", "use_mem", "max_cpu_sum", "max_mem_sum")

    def __init__(self, xp: Any, B: int, T: int, keep_ratios: bool = False) -> None:
        self.xp = xp
        z = lambda *s: xp.zeros(s, xp.float64)  # noqa: E731
        self.machines = xp.zeros(B, xp.int64)
        self.machines_up = xp.zeros(B, xp.int64)
        self.machines_cap_unknown = xp.zeros(B, xp.int64)
        self.present_any = xp.zeros(B, bool)
        self.known_any = {r: xp.zeros(B, bool) for r in ("cpu", "mem")}
        self.cap = {r: z(B) for r in ("cpu", "mem")}
        self.tier = {c: z(T, B) for c in self.COLS}
        #: per tier, Σ over machines with known capacity (ratio numerators)
        self.known = {(k, r): z(T, B) for k in ("alloc", "usage") for r in ("cpu", "mem")}
        self.instances = z(B)
        self.windows = xp.zeros(B, xp.int64)
        #: on a device: per (resource, tier), the request / capacity ratios of the full
        #: machine-buckets of each chunk, left on the device for the summary's quantiles (which
        #: would otherwise read the written machine table back and copy the ratios over again)
        self.ratios: dict[tuple[str, str], list[Any]] | None = {} if keep_ratios else None

    def to_host(self) -> None:
        """Every sum as a NumPy array (in place); the ratios stay where they are."""
        for k, v in list(vars(self).items()):
            if k != "ratios":
                setattr(self, k, to_host(v))
        self.xp = np

    def add_ratios(self, cols: dict[str, Any], tiers: list[str]) -> None:
        """Keep the chunk's ratios of full machine-buckets (:func:`_full`), on a device only."""
        if self.ratios is None:
            return
        for r in ("cpu", "mem"):
            full = _full(cols["up_s"], cols["covered_s"], cols[f"cap_{r}"])
            cap = cols[f"cap_{r}"][full]
            for t in ("all", *tiers):
                req = cols[f"req_{r}" if t == "all" else f"req_{r}_{t}"]
                self.ratios.setdefault((r, t), []).append(req[full].astype(self.xp.float64) / cap)

    def add(self, d: dict[str, Any], present: Any) -> None:
        xp = self.xp
        self.machines += present.sum(axis=0)
        self.machines_up += (d["up_s"] > 0).sum(axis=0)
        self.machines_cap_unknown += (present & (d["unk_c"] | d["unk_m"])).sum(axis=0)
        self.present_any |= present.any(axis=0)
        for r, unk, cap in (("cpu", d["unk_c"], d["cap_c"]), ("mem", d["unk_m"], d["cap_m"])):
            kn = present & ~unk
            self.known_any[r] |= kn.any(axis=0)
            self.cap[r] += xp.where(kn, cap, 0.0).sum(axis=0)
            for kind, src in (("alloc", f"req_{r}"), ("usage", f"use_{r}")):
                self.known[(kind, r)] += xp.where(kn[:, None, :], d[src], 0.0).sum(axis=0)
        for c in self.COLS:
            self.tier[c] += d[c].sum(axis=0)
        self.instances += d["inst"].sum(axis=0)
        self.windows += d["windows"].sum(axis=0)

    def add_sums(self, o: _CellSums) -> None:
        """Add another shard's sums."""
        self.machines += o.machines
        self.machines_up += o.machines_up
        self.machines_cap_unknown += o.machines_cap_unknown
        self.present_any |= o.present_any
        for r in ("cpu", "mem"):
            self.known_any[r] |= o.known_any[r]
            self.cap[r] += o.cap[r]
        for c in self.COLS:
            self.tier[c] += o.tier[c]
        for k in self.known:
            self.known[k] += o.known[k]
        self.instances += o.instances
        self.windows += o.windows
        if self.ratios is not None and o.ratios is not None:
            for k, v in o.ratios.items():
                self.ratios.setdefault(k, []).extend(v)

    def columns(self, bucket: np.ndarray, bstart: np.ndarray, L: np.ndarray, tiers: list[str]) -> dict[str, np.ndarray]:
        """The ``cell`` table's columns, in order."""
        # Capacity of the machines with a known capacity; when machines are present but none has a
        # known capacity the cell's capacity is unknown (NaN), not 0.
        caps = {r: np.where(self.known_any[r] | ~self.present_any, self.cap[r], np.nan) for r in ("cpu", "mem")}
        cell = {"bucket": bucket, "bucket_start_us": bstart, "covered_s": L, "machines": self.machines,
                "machines_up": self.machines_up, "machines_cap_unknown": self.machines_cap_unknown,
                "cap_cpu": caps["cpu"], "cap_mem": caps["mem"]}
        for col in self.COLS:
            cell[col] = self.tier[col].sum(axis=0)
        cell["instances"] = self.instances
        cell["windows"] = self.windows
        for r in ("cpu", "mem"):
            for kind in ("alloc", "usage"):
                cell[f"{kind}_ratio_{r}"] = _ratio(np, self.known[(kind, r)].sum(axis=0), caps[r])
        for k, t in enumerate(tiers):
            for col in ("req_cpu", "req_mem", "use_cpu", "use_mem"):
                cell[f"{col}_{t}"] = self.tier[col][k]
            for r in ("cpu", "mem"):
                for kind in ("alloc", "usage"):
                    cell[f"{kind}_ratio_{r}_{t}"] = _ratio(np, self.known[(kind, r)][k], caps[r])
        return cell
