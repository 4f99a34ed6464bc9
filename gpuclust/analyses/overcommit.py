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
  pickled) and ``finalize`` merges it in, so the result is the same either way.  The first pass,
  the usage sums and the interval partial are in :mod:`gpuclust.analyses._overcommit_partial`.
* ``finalize`` builds the machine table a chunk of machines at a time (dense only over the chunk:
  keyed sums + capacity intervals swept for the chunk's machines) into one preallocated float
  block, the cell series from per-bucket running sums
  (:mod:`gpuclust.analyses._overcommit_finalize`), and the figure tables from per-shard sums
  taken as the rows are built (:mod:`gpuclust.analyses._overcommit_figure`).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import pyarrow as pa

from gpuclust.analyses._extent import max_finite, to_f64, to_i64
from gpuclust.analyses._intervals import capacity_intervals, running_intervals
from gpuclust.analyses._lookup import InstanceLookup, id_index, tier_lookup
from gpuclust.analyses._overcommit_figure import figure_tables
from gpuclust.analyses._overcommit_finalize import _USAGE_PREFIXES, _CellSums, _grid, _machine_rows
from gpuclust.analyses._overcommit_partial import (
    _NULL,
    INST_FIELDS,
    ISTATS,
    REQ_FIELDS,
    USAGE_FIELDS,
    event_pass,
    interval_partial,
    interval_partials,
    usage_sums,
)
from gpuclust.analyses._overcommit_summary import (
    OVER_EPS,  # noqa: F401 (re-exported)
    QUANTILES,  # noqa: F401 (re-exported)
    _summary,
    _summary_text,
)
from gpuclust.analyses.base import Analysis, is_null_int, to_host
from gpuclust.analyses.grouping import bucket_grid, isin_sorted, unique_sorted
from gpuclust.analyses.kinds import Even, Fields, Keyed, Label, Sum
from gpuclust.analyses.options import Relation, option, tier_map_option
from gpuclust.arrow_numpy import table, table_from_rows
from gpuclust.backends import finalize_backend
from gpuclust.keys import pack
from gpuclust.parted import finalize_in_memory
from gpuclust.schema import TIME_AFTER_TRACE, TierMap
from gpuclust.tiers import TierNames, resolve_tier_map

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
#: Machine-buckets of a flat source's interval partial built at once (:meth:`Overcommit.client_partial`:
#: ~260 B each while built), x :data:`DEVICE_SHARD_FACTOR` on a device.
CLIENT_CELLS = 1 << 18
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
#: what a pickled context holds instead of the client's interval partial
_DROPPED = "dropped when pickled"


@dataclass
class OvercommitContext(TierNames):
    """What partials need (machine / tier lookups, bucket grid), what ``bind`` added, and the
    capacity intervals the shards of the machine table are finalized from.

    ``client_events`` (the instance events of a flat source, bound on the client) is dropped when
    the context is pickled to a worker; the engine merges their interval partial
    (:meth:`Overcommit.client_partial`) before the shards are reduced.
    """

    tier_map: TierMap
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


def _tier_buckets(ctx: OvercommitContext) -> int:
    """Keys per machine code of the usage and request sums: (tier, bucket)."""
    return ctx.n_tiers * ctx.n_buckets


def _buckets(ctx: OvercommitContext) -> int:
    """Keys per machine code of the instance sums: the buckets."""
    return ctx.n_buckets


def _tier_bucket_keys(ctx: OvercommitContext) -> int:
    """Keys of the usage and request sums: machines x tiers x buckets."""
    return int(ctx.machine_ids.shape[0]) * _tier_buckets(ctx)


def _machines(ctx: OvercommitContext) -> int:
    """Machine codes: the coordinate the keyed sums are sharded by."""
    return int(ctx.machine_ids.shape[0])


def _bucket_keys(ctx: OvercommitContext) -> int:
    """Keys of the instance sums: machines x buckets."""
    return int(ctx.machine_ids.shape[0]) * _buckets(ctx)


@dataclass(frozen=True)
class Overcommit(Analysis):
    """Capacity vs. requests vs. usage per machine and time bucket (overcommitment).

    The trace window is ``[window_start_us, window_end_us)`` in trace microseconds; event times 0
    and 2^63-1 are clipped to it.

    Examples
    --------
    >>> Overcommit(bucket_s=3600).label
    'overcommit[bucket_s=3600]'
    """

    bucket_s: int = option(300, "bucket width in seconds", gt=0)
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

    option_relations = (
        Relation(
            ("window_start_us", "window_end_us"),
            lambda start, end: end is None or end >= start,
            "window_end_us >= window_start_us",
        ),
    )

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
    def context(self, source: Any) -> OvercommitContext:
        tm = resolve_tier_map(self.tier_map, source)
        # ---- first pass over instance_events (4 columns, a row group at a time): max time, machines
        ev_max, placed = event_pass(source)
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
        return interval_partial(running_intervals(backend, ecols, ctx.window_start, ctx.window_end), ctx, backend)

    # ---------------------------------------------------------------- partial / merge
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
        usage = usage_sums(
            backend,
            s[use],
            e[use],
            pack(code[use].astype(xp.int64), tier[use], T),
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
            CELL_LIMIT,
        )
        # the running pieces of this partition's instances (bucketed source: bind gave their events;
        # else the empty partial's, host arrays)
        part = self.empty(backend)
        if ctx.events is not None:
            part.update(self._intervals(backend, {c: backend.asarray(v) for c, v in ctx.events.items()}, ctx))
        part["usage"] = usage
        part["stats"] = xp.asarray(np.array([st[k] for k in STATS], dtype=np.int64))
        return part

    @property
    def kinds(self) -> Fields:
        """The keyed usage sums and requests per (machine, tier, bucket) and instances per
        (machine, bucket), sharded by machine; the usage and interval counters; the backend (where
        the partials were computed, so that finalize builds the tables there too)."""
        return Fields(
            {
                "usage": Keyed(fields=USAGE_FIELDS, per=_tier_buckets, dense=_tier_bucket_keys, dense_host=False),
                "stats": Sum((len(STATS),), np.int64),
                "req": Keyed(fields=REQ_FIELDS, per=_tier_buckets, dense=_tier_bucket_keys, dense_host=False),
                "inst": Keyed(fields=INST_FIELDS, per=_buckets, dense=_bucket_keys, dense_host=False),
                "istats": Sum((len(ISTATS),), np.int64),
                "backend": Label(),
            },
            shard_by=Even(_machines, _buckets, SHARD_CELLS, device=DEVICE_SHARD_FACTOR),
        )

    # ---------------------------------------------------------------- finalize
    parted = ("machine",)

    def client_partial(self, ctx: OvercommitContext, backend: Any = None) -> Iterator[dict[str, Any]]:
        """The interval partial of a flat source's instances, built on ``backend`` (default: the
        host's; a gpu finalize's on the device, so that only the event columns are copied there,
        not the keyed sums they expand into), in chunks of :data:`CLIENT_CELLS` machine-buckets
        (ascending machine codes): the running pieces of every instance (a few per instance) are
        built at once, their expansion into machine-buckets a chunk at a time."""
        if ctx.client_events is None:  # bucketed source: the partitions carry the intervals
            return
        if isinstance(ctx.client_events, str):
            raise RuntimeError(
                "overcommit: this context was pickled without the events bound on the client; "
                "finalize with the client's context"
            )
        be = finalize_backend("cpu") if backend is None else backend
        ecols = {k: be.stage(v) for k, v in ctx.client_events.items()}
        run = running_intervals(be, ecols, ctx.window_start, ctx.window_end)
        del ecols
        cells = CLIENT_CELLS * (1 if be.name == "cpu" else DEVICE_SHARD_FACTOR)
        for chunk in interval_partials(run, ctx, be, cells // max(ctx.n_buckets, 1)):
            yield {**self.empty(be), **chunk}

    #: its keyed sums are ~24 B a window (240 MB at 10^7), which a gpu study would otherwise copy
    #: to the host and back to the device for the dense tables of :meth:`finalize_shard`
    device_partial = True

    def finalize(self, partial: dict[str, Any], ctx: OvercommitContext) -> dict[str, Any]:
        cp = None
        for chunk in self.client_partial(ctx, finalize_backend(partial["backend"])):  # (in memory: small data)
            cp = chunk if cp is None else self.kinds.merge(cp, chunk)
        if cp is not None:
            if any(int(partial[k]["key"].shape[0]) for k in ("req", "inst")):
                partial = self.kinds.merge(to_host(partial), to_host(cp))  # intervals on both sides: merged on the host
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
        acc = _CellSums(be, B, T, lo, hi)  # on a device: the summary's ratios stay there
        has_usage = int(rest["stats"][STATS.index("usage_rows")]) > 0
        # chunks sized by where the partials were computed, not where they are finalized: the cell
        # sums add chunk by chunk, so a gpu study's partials give the same bits on the host
        cells = FINALIZE_CELLS["cpu" if rest["backend"] == "cpu" else "gpu"]
        return {"machine": _machine_rows(be, keyed, ctx, lo, hi, acc, has_usage, cells)}, acc

    def finalize_parted(
        self, rest: dict[str, Any], ctx: OvercommitContext, tables: dict[str, Any], extras: list[_CellSums]
    ) -> dict[str, pa.Table]:
        """The cell series (the shards' cell sums, added in shard order), the summary, the figure
        tables (:func:`figure_tables`: the shards' sums) and the run's counters, as Arrow tables (a
        run without plots never imports pandas)."""
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
            finalize_backend(rest["backend"]),
            tables["machine"],
            tiers,
            has_usage=has_usage,
            ratios=acc.ratios,
            sums=(row for m in acc.full for row in m),  # the finalize's: the machine table is not read again
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
        figure = figure_tables(acc.figures, bucket, ctx.width)
        return {"cell": table(cell), "summary": summary, **figure, "info": info}

    def summary(self, result: dict[str, Any]) -> str:
        return _summary_text(self.label, result)
