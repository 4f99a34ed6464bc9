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

Design (engine fit).  Interval construction needs each instance's events in order, which row
partitions do not give, so ``context`` reads instance_events and machine_events once on the
client, builds the running and capacity intervals (one sort, NumPy) and computes every
interval-derived series with the ``bucket_overlap`` op (NumPy twin; the context has no backend).
Those dense arrays stay on the client: they are dropped when the context is pickled to dask
workers (:meth:`OvercommitContext.__getstate__`), which need only the machine and tier lookups.
The analysis *streams* instance_usage: each partial computes the usage series of its rows on the
chosen backend with ``bucket_overlap`` (the CUDA kernel on the GPU), as a keyed partial
(machine, tier, bucket) -> sums, merged by concatenate + group; ``finalize`` joins both.  Every
usage window is handled entirely by the partition that holds its row, so results do not depend
on the partitioning.  See ``docs/analysis-overcommit.md``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from gpuclust.analyses._intervals import (
    CapacityIntervals,
    RunningIntervals,
    capacity_intervals,
    distinct_running,
    running_intervals,
)
from gpuclust.analyses._lookup import InstanceLookup, id_index, max_priority
from gpuclust.analyses.base import Analysis, fmt, is_null_int, keyed_reduce, merge_keyed, resolve_tier_map
from gpuclust.analyses.options import option, tier_map_option
from gpuclust.schema import TIME_AFTER_TRACE, TierMap, tier_map

__all__ = ["Overcommit", "OvercommitContext", "TRACE_START_US"]

#: Trace window start: times are microseconds since 600 s before the trace start.
TRACE_START_US = 600_000_000
#: Largest dense (groups x buckets) block one bucket_overlap call of a partial may allocate.
CELL_LIMIT = 1 << 24
#: A ratio counts as "over capacity" when it exceeds 1 by more than this (float rounding).
OVER_EPS = 1e-9
QUANTILES = (0.5, 0.9, 0.99, 1.0)
#: Counters kept in every usage partial, in this order.
STATS = ("usage_rows", "usage_alloc_rows", "usage_unbounded", "usage_unknown_machine",
         "usage_no_overlap", "usage_used", "usage_unknown_tier")
_USAGE_FIELDS = ("use_cpu", "use_mem", "max_cpu", "max_mem", "windows")
#: per usage field: how many overlapping windows carry a non-NULL value (0 with windows > 0: unknown)
_KNOWN_FIELDS = ("n_use_cpu", "n_use_mem", "n_max_cpu", "n_max_mem")
_PARTIAL_FIELDS = _USAGE_FIELDS + _KNOWN_FIELDS
_EVENT_COLUMNS = ["time", "type", "collection_id", "instance_index", "machine_id", "alloc_collection_id",
                  "priority", "req_cpu", "req_mem"]


def _f64(arr: Any) -> np.ndarray:
    return np.asarray(pc.cast(arr, "float64").to_numpy(zero_copy_only=False), dtype=np.float64)


def _i64(arr: Any) -> np.ndarray:
    """int64 NumPy array, NULL -> int64 minimum."""
    a = pc.cast(arr, "int64")
    if a.null_count:
        a = pc.fill_null(a, pa.scalar(np.iinfo(np.int64).min, pa.int64()))
    return np.ascontiguousarray(a.to_numpy(zero_copy_only=False), dtype=np.int64)


def _max_finite_end(source: Any) -> int | None:
    """Largest instance_usage end_time below 2^63-1, from Parquet statistics where possible."""
    best: int | None = None
    files = source.files("instance_usage") if hasattr(source, "files") else None
    if files:
        for f in files:
            pf = pq.ParquetFile(f)
            md = pf.metadata
            j = md.schema.to_arrow_schema().get_field_index("end_time")
            for g in range(md.num_row_groups):
                if md.row_group(g).num_rows == 0:
                    continue
                st = md.row_group(g).column(j).statistics
                v: int | None
                if st is not None and st.has_min_max and int(st.max) < TIME_AFTER_TRACE:
                    v = int(st.max)
                else:
                    v = _max_below(_i64(pf.read_row_group(g, columns=["end_time"]).column(0)))
                if v is not None:
                    best = v if best is None else max(best, v)
        return best
    return _max_below(_i64(source.read("instance_usage", ["end_time"]).column(0)))


def _max_below(a: np.ndarray) -> int | None:
    a = a[(a < TIME_AFTER_TRACE) & (a != np.iinfo(np.int64).min)]
    return int(a.max()) if a.size else None


@dataclass
class OvercommitContext:
    """What partials need (machine / tier lookups, bucket grid) plus client-only dense series.

    ``series`` (the interval-derived arrays) is dropped when the context is pickled to a worker;
    ``finalize`` runs on the client, where it is present.
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
    #: sorted machine ids (machine_events and placed pieces); a row's machine code is its index
    machine_ids: np.ndarray
    #: usage tier lookup, sorted by hash: hash, the three key columns, tier code
    #: (collection_id, instance_index, machine_id) -> tier code
    lookup: InstanceLookup
    series: dict[str, np.ndarray] | None
    stats: dict[str, int]

    def __getstate__(self) -> dict[str, Any]:
        d = dict(self.__dict__)
        d["series"] = None  # client only: finalize runs on the client
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
    row_bytes = 320
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
        from gpuclust.backends import get_backend

        tm = self.resolve_tier_map(source)
        tier_names = (*tm.names, "unknown")
        T = len(tier_names)
        ev = source.read("instance_events", _EVENT_COLUMNS)
        ecols = {c: _i64(ev.column(c)) for c in ("time", "type", "collection_id", "instance_index", "machine_id",
                                                  "alloc_collection_id")}
        ecols.update({c: _f64(ev.column(c)) for c in ("priority", "req_cpu", "req_mem")})
        # ---- the trace window
        w0 = int(self.window_start_us)
        if self.window_end_us is not None:
            w1 = int(self.window_end_us)
        else:
            cands = [v for v in (_max_below(ecols["time"]), _max_finite_end(source)) if v is not None]
            w1 = max([w0, *cands])
        width = self.width_us
        # Time buckets (docs/dataset.md): aligned to trace time 0, bucket k = [k*width, (k+1)*width);
        # the window clips the first and last bucket (column covered_s).
        origin = (w0 // width) * width
        B = (-(-w1 // width) - w0 // width) if w1 > w0 else 0
        # ---- intervals
        run: RunningIntervals = running_intervals(ecols, w0, w1)
        me = source.read("machine_events", ["time", "machine_id", "type", "cap_cpu", "cap_mem"])
        mcols = {c: _i64(me.column(c)) for c in ("time", "machine_id", "type")}
        mcols.update({c: _f64(me.column(c)) for c in ("cap_cpu", "cap_mem")})
        cap: CapacityIntervals = capacity_intervals(mcols, w0, w1)
        me_ids = np.unique(mcols["machine_id"])
        placed = run.machine_id > 0
        mids = np.unique(np.concatenate([me_ids[me_ids != np.iinfo(np.int64).min], run.machine_id[placed]]))
        M = int(mids.shape[0])
        # ---- usage tier lookup: MAX(priority) per (collection, instance, machine), as cell-usage
        lk = max_priority(ev.select(["collection_id", "instance_index", "machine_id", "priority",
                                      "alloc_collection_id"]))
        lp = lk["p"].to_numpy(np.float64)
        codes = np.full(lp.shape[0], T - 1, dtype=np.int32)
        ok = ~np.isnan(lp)
        tc = tm.tier_codes(lp[ok].astype(np.int64)).astype(np.int32)
        codes[ok] = np.where(tc >= 0, tc, T - 1)
        lookup = InstanceLookup.build(lk["c"].to_numpy(np.int64), lk["i"].to_numpy(np.int32), lk["m"].to_numpy(np.int64),
                                      codes, what="overcommit priority lookup")
        # ---- interval-derived dense series (client only), with the bucket_overlap op
        bo = get_backend("cpu").ops.bucket_overlap
        kw = dict(n_buckets=B, origin=origin, width=width)
        ccode = np.searchsorted(mids, cap.machine_id).astype(np.int32)
        capv = np.stack([np.ones(cap.start.shape[0]), cap.cap_cpu, cap.cap_mem,
                         np.isnan(cap.cap_cpu).astype(np.float64), np.isnan(cap.cap_mem).astype(np.float64)])
        cs = bo(cap.start, cap.end, capv, ccode, n_groups=M, **kw)  # one sweep for the 5 capacity series
        series: dict[str, np.ndarray] = {"up_s": cs[0], "capc_s": cs[1], "capm_s": cs[2], "unkc_s": cs[3], "unkm_s": cs[4]}
        ps, pe = run.start[placed], run.end[placed]
        pcode = np.searchsorted(mids, run.machine_id[placed]).astype(np.int64)
        pri = run.priority[placed]
        ptier = np.full(pri.shape[0], T - 1, dtype=np.int64)
        okp = ~np.isnan(pri)
        tcp = tm.tier_codes(pri[okp].astype(np.int64)).astype(np.int64)
        ptier[okp] = np.where(tcp >= 0, tcp, T - 1)
        g = (pcode * T + ptier).astype(np.int32)
        rs = bo(ps, pe, np.stack([run.req_cpu[placed], run.req_mem[placed]]), g, n_groups=M * T, **kw)
        series["reqc_s"] = rs[0].reshape(M, T, B)
        series["reqm_s"] = rs[1].reshape(M, T, B)
        series["inst_s"] = bo(ps, pe, np.ones(ps.shape[0]), pcode.astype(np.int32), n_groups=M, **kw)
        series["distinct"] = distinct_running(pcode, run.instance[placed], ps, pe, M, origin, width, B)
        series["has_me"] = np.isin(mids, me_ids)
        stats = {**run.stats, **cap.stats,
                 "pieces_unplaced": int(((run.machine_id == 0) | (run.machine_id == np.iinfo(np.int64).min)).sum()),
                 "pieces_dedicated": int((run.machine_id == -1).sum()),
                 "pieces_unknown_tier": int((ptier == T - 1).sum())}
        return OvercommitContext(
            tier_map=tm, tier_names=tier_names, window_start=w0, window_end=w1, width=width, n_buckets=B, origin=origin,
            machine_ids=mids, lookup=lookup, series=series, stats=stats)

    # ---------------------------------------------------------------- partial / merge
    def empty(self, backend: Any = None) -> dict[str, np.ndarray]:
        out = {"key": np.zeros(0, np.int64)}
        out.update({f: np.zeros(0, np.float64) for f in _PARTIAL_FIELDS})
        out["stats"] = np.zeros(len(STATS), np.int64)
        return out

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
        part = self._usage(backend, s[use], e[use], (code[use].astype(xp.int64) * T + tier[use]), max(M, 1) * T,
                           {k: cols[c][use] for k, c in (("use_cpu", "avg_cpu"), ("use_mem", "avg_mem"),
                                                        ("max_cpu", "max_cpu"), ("max_mem", "max_mem"))},
                           ctx.origin, width, B)
        part["stats"] = xp.asarray(np.array([st[k] for k in STATS], dtype=np.int64))
        return part

    def _usage(self, backend: Any, s: Any, e: Any, g: Any, n_codes: int, vals: dict[str, Any], w0: int,
               width: int, B: int) -> dict[str, Any]:
        """Keyed usage sums: key = (machine code * T + tier) * B + bucket; ``g`` in ``[0, n_codes)``;
        ``w0`` is the grid origin (the first bucket's start), buckets counted from it."""
        xp, ops = backend.xp, backend.ops
        if s.shape[0] == 0:
            return {k: xp.asarray(v) for k, v in self.empty().items() if k != "stats"}
        ws = width / 1e6
        b0 = (s - w0) // width
        b1 = (e - 1 - w0) // width
        a_s = xp.ascontiguousarray(w0 + b0 * width)      # bucket-aligned: every overlapped bucket whole,
        a_e = xp.ascontiguousarray(w0 + (b1 + 1) * width)  # so value / width_s adds the value once per bucket
        # dense codes of the (machine, tier) pairs present: a bincount, not a sort
        present = xp.bincount(g, minlength=n_codes) > 0
        ug = xp.nonzero(present)[0].astype(xp.int64)
        ginv = (xp.cumsum(present) - 1).astype(xp.int32)[g]
        G = int(ug.shape[0])
        lo, hi = int(b0.min()), int(b1.max()) + 1
        step = max(1, CELL_LIMIT // max(G, 1))
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
        for c0 in range(lo, hi, step):
            sel = (b0 >= c0) & (b0 < c0 + step) if hi - lo > step else None
            if sel is not None and not bool(sel.any()):
                continue
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
        if len(keys) == 1:  # g-major dense layout: keys already sorted and unique
            return {"key": keys[0], **{k: v[0] for k, v in outs.items()}}
        return keyed_reduce(backend, xp.concatenate(keys), {k: xp.concatenate(v) for k, v in outs.items()})

    def merge(self, a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        out = merge_keyed({k: v for k, v in a.items() if k != "stats"}, {k: v for k, v in b.items() if k != "stats"})
        out["stats"] = a["stats"] + b["stats"]
        return out

    # ---------------------------------------------------------------- finalize
    def finalize(self, partial: dict[str, np.ndarray], ctx: OvercommitContext) -> dict[str, pd.DataFrame]:
        if ctx.series is None:
            raise RuntimeError("overcommit: finalize needs the client-side context (its interval series "
                               "are dropped when the context is pickled)")
        S = ctx.series
        M, T, B = int(ctx.machine_ids.shape[0]), ctx.n_tiers, ctx.n_buckets
        tiers = list(ctx.tier_names)
        bucket = ctx.origin // ctx.width + np.arange(B, dtype=np.int64)  # absolute bucket numbers
        bstart = bucket * ctx.width
        L = (np.minimum(bstart + ctx.width, ctx.window_end) - np.maximum(bstart, ctx.window_start)).astype(np.float64) / 1e6
        key = np.asarray(partial["key"], dtype=np.int64)
        if key.size and (int(key.max()) >= M * T * B or int(key.min()) < 0):
            raise ValueError("overcommit: usage partial does not match the context (key out of range)")
        U = {f: (np.bincount(key, weights=np.asarray(partial[f], np.float64), minlength=M * T * B)
                 .reshape(M, T, B)) for f in _PARTIAL_FIELDS}
        # a (machine, tier, bucket) with windows whose values are all NULL was not measured: NaN
        wt = np.rint(U["windows"])
        for f, n in (("use_cpu", "n_use_cpu"), ("use_mem", "n_use_mem"), ("max_cpu", "n_max_cpu"),
                     ("max_mem", "n_max_mem")):
            U[f] = np.where((wt > 0) & (np.rint(U[n]) == 0), np.nan, U[f])
        windows = wt.sum(axis=1).astype(np.int64)
        with np.errstate(invalid="ignore", divide="ignore"):
            no_me = ~S["has_me"][:, None]
            unk_c = (S["unkc_s"] > 0) | no_me
            unk_m = (S["unkm_s"] > 0) | no_me
            cap_c = np.where(unk_c, np.nan, S["capc_s"] / L)
            cap_m = np.where(unk_m, np.nan, S["capm_s"] / L)
            req_ct, req_mt = S["reqc_s"] / L, S["reqm_s"] / L
            use_ct, use_mt = U["use_cpu"] / L, U["use_mem"] / L
            req_c, req_m = req_ct.sum(axis=1), req_mt.sum(axis=1)
            use_c, use_m = use_ct.sum(axis=1), use_mt.sum(axis=1)
            max_c, max_m = U["max_cpu"].sum(axis=1), U["max_mem"].sum(axis=1)
            inst = S["inst_s"] / L
        present = ((S["up_s"] > 0) | (S["reqc_s"].sum(axis=1) > 0) | (S["reqm_s"].sum(axis=1) > 0)
                   | (S["inst_s"] > 0) | (windows > 0) | (use_c != 0) | (use_m != 0) | (max_c != 0) | (max_m != 0))
        stats = dict(ctx.stats)
        stats.update(zip(STATS, (int(x) for x in partial["stats"]), strict=False))
        has_usage = stats["usage_rows"] > 0
        if not has_usage:
            # No instance_usage rows at all: usage was not measured, so it is unknown (NaN), not 0.
            use_ct, use_mt, use_c, use_m, max_c, max_m, U["max_cpu"], U["max_mem"] = (
                np.full(np.shape(a), np.nan) for a in (use_ct, use_mt, use_c, use_m, max_c, max_m, U["max_cpu"],
                                                         U["max_mem"]))
        mi, bi = np.nonzero(present)
        machine = pd.DataFrame({
            "machine_id": ctx.machine_ids[mi], "bucket": bucket[bi], "bucket_start_us": bstart[bi],
            "covered_s": L[bi],
            "up_s": S["up_s"][mi, bi], "cap_cpu": cap_c[mi, bi], "cap_mem": cap_m[mi, bi],
            "cap_unknown": (unk_c | unk_m)[mi, bi],
            "req_cpu": req_c[mi, bi], "req_mem": req_m[mi, bi], "use_cpu": use_c[mi, bi], "use_mem": use_m[mi, bi],
            "max_cpu_sum": max_c[mi, bi], "max_mem_sum": max_m[mi, bi], "instances": inst[mi, bi],
            "instances_distinct": S["distinct"][mi, bi].astype(np.int64), "windows": windows[mi, bi],
        })
        for r in ("cpu", "mem"):
            machine[f"alloc_ratio_{r}"] = _ratio(machine[f"req_{r}"].to_numpy(), machine[f"cap_{r}"].to_numpy())
            machine[f"usage_ratio_{r}"] = _ratio(machine[f"use_{r}"].to_numpy(), machine[f"cap_{r}"].to_numpy())
            machine[f"peak_ratio_{r}"] = _ratio(machine[f"max_{r}_sum"].to_numpy(), machine[f"cap_{r}"].to_numpy())
        per_tier = {"req_cpu": req_ct, "req_mem": req_mt, "use_cpu": use_ct, "use_mem": use_mt,
                    "max_cpu_sum": U["max_cpu"], "max_mem_sum": U["max_mem"]}
        for k, t in enumerate(tiers):
            for col, arr in per_tier.items():
                machine[f"{col}_{t}"] = arr[mi, k, bi]
        cell = self._cell(bucket, bstart, L, present, S, unk_c, unk_m, cap_c, cap_m, per_tier, windows, inst, tiers)
        if not has_usage:
            for df in (machine, cell):
                for c in df.columns:
                    if c.startswith(("use_", "max_cpu_sum", "max_mem_sum", "usage_ratio_", "peak_ratio_")):
                        df[c] = np.nan
        summary = self._summary(machine, tiers, has_usage=has_usage)
        info = pd.DataFrame([{
            "analysis": self.name, "tier_map": ctx.tier_map.name, "tiers": ",".join(tiers),
            "bucket_s": int(self.bucket_s), "window_start_us": ctx.window_start, "window_end_us": ctx.window_end,
            "machines": M, "buckets": B, **stats}])
        return {"machine": machine, "cell": cell, "summary": summary, "info": info}

    @staticmethod
    def _cell(bucket: np.ndarray, bstart: np.ndarray, L: np.ndarray, present: np.ndarray, S: dict[str, np.ndarray], unk_c: np.ndarray,
              unk_m: np.ndarray, cap_c: np.ndarray, cap_m: np.ndarray, per_tier: dict[str, np.ndarray],
              windows: np.ndarray, inst: np.ndarray, tiers: list[str]) -> pd.DataFrame:
        known = {"cpu": present & ~unk_c, "mem": present & ~unk_m}
        # Capacity of the machines with a known capacity; when machines are present but none has a
        # known capacity the cell's capacity is unknown (NaN), not 0.
        caps = {r: np.where(known[r].any(axis=0) | ~present.any(axis=0),
                            np.where(known[r], c, 0.0).sum(axis=0), np.nan)
                for r, c in (("cpu", cap_c), ("mem", cap_m))}
        cell = pd.DataFrame({
            "bucket": bucket, "bucket_start_us": bstart, "covered_s": L,
            "machines": present.sum(axis=0).astype(np.int64), "machines_up": (S["up_s"] > 0).sum(axis=0).astype(np.int64),
            "machines_cap_unknown": (present & (unk_c | unk_m)).sum(axis=0).astype(np.int64),
            "cap_cpu": caps["cpu"], "cap_mem": caps["mem"]})
        for col in ("req_cpu", "req_mem", "use_cpu", "use_mem", "max_cpu_sum", "max_mem_sum"):
            cell[col] = per_tier[col].sum(axis=(0, 1))
        cell["instances"] = inst.sum(axis=0)
        cell["windows"] = windows.sum(axis=0)
        for r in ("cpu", "mem"):
            kn = known[r][:, None, :]
            for kind, src in (("alloc", f"req_{r}"), ("usage", f"use_{r}")):
                cell[f"{kind}_ratio_{r}"] = _ratio(np.where(kn, per_tier[src], 0.0).sum(axis=(0, 1)), caps[r])
        for k, t in enumerate(tiers):
            for col in ("req_cpu", "req_mem", "use_cpu", "use_mem"):
                cell[f"{col}_{t}"] = per_tier[col][:, k, :].sum(axis=0)
            for r in ("cpu", "mem"):
                kn = known[r]
                for kind, src in (("alloc", f"req_{r}"), ("usage", f"use_{r}")):
                    cell[f"{kind}_ratio_{r}_{t}"] = _ratio(np.where(kn, per_tier[src][:, k, :], 0.0).sum(axis=0), caps[r])
        return cell

    @staticmethod
    def _summary(machine: pd.DataFrame, tiers: list[str], has_usage: bool) -> pd.DataFrame:
        """Statistics over *full* machine-buckets: available the whole bucket, known capacity > 0.
        Usage statistics are NaN when the dataset has no instance_usage rows (e.g. 2011 events only)."""
        rows: list[tuple[str, str, str, float]] = []
        L = machine["covered_s"].to_numpy()
        up = machine["up_s"].to_numpy()
        avail = float(up.sum())
        for r in ("cpu", "mem"):
            cap = machine[f"cap_{r}"].to_numpy()
            full = (up >= L * (1 - 1e-12)) & np.isfinite(cap) & (cap > 0)
            if not full.any():
                continue
            w = L[full]
            tw = float(w.sum())
            c = cap[full]
            rows.append(("machine_buckets", r, "all", float(full.sum())))
            rows.append(("machine_time_share", r, "all", tw / avail if avail > 0 else np.nan))
            for kind, col in (("request", f"req_{r}"), ("usage", f"use_{r}"), ("peak", f"max_{r}_sum")):
                v = machine[col].to_numpy()[full]
                kn = np.isfinite(v)  # usage statistics over the machine-buckets whose usage is known
                tk = float(w[kn].sum())
                share = float(w[kn & (v > c * (1 + OVER_EPS))].sum()) / tk if tk > 0 else np.nan
                rows.append((f"share_over_capacity_{kind}", r, "all", share if has_usage or kind == "request" else np.nan))
            u = machine[f"use_{r}"].to_numpy()[full]
            kn = np.isfinite(u)
            den = float((c[kn] * w[kn]).sum())
            mean_use = float((u[kn] * w[kn]).sum()) / den if den > 0 else np.nan
            rows.append(("usage_ratio_mean", r, "all", mean_use if has_usage else np.nan))
            for t in ("all", *tiers):
                req = machine[f"req_{r}" if t == "all" else f"req_{r}_{t}"].to_numpy()[full]
                ratio = req / c
                rows.append(("alloc_ratio_mean", r, t, float((req * w).sum() / (c * w).sum())))
                qs = np.quantile(ratio, QUANTILES)  # one selection pass for all levels (same values)
                for q, v in zip(QUANTILES, qs, strict=True):
                    name = "alloc_ratio_max" if q == 1.0 else f"alloc_ratio_p{round(q * 100)}"
                    rows.append((name, r, t, float(v)))
        return pd.DataFrame(rows, columns=["metric", "resource", "tier", "value"]).astype(
            {"metric": object, "resource": object, "tier": object, "value": np.float64})

    def summary(self, result: dict[str, pd.DataFrame]) -> str:
        info = result["info"].iloc[0]
        s = result["summary"]
        lines = [f"{self.label}: tier map {info['tier_map']!r}, {info['machines']} machines x {info['buckets']} "
                 f"buckets of {info['bucket_s']} s, window [{info['window_start_us']}, {info['window_end_us']}) us",
                 f"  instances {info['instances']}, running pieces {info['pieces']} (unplaced {info['pieces_unplaced']},"
                 f" dedicated {info['pieces_dedicated']}, running at end {info['running_at_end']}, terminal without"
                 f" SCHEDULE {info['terminal_without_schedule']}); usage rows used {info['usage_used']} of"
                 f" {info['usage_rows']}"]

        def get(metric: str, r: str, t: str = "all") -> float:
            v = s[(s["metric"] == metric) & (s["resource"] == r) & (s["tier"] == t)]["value"]
            return float(v.iloc[0]) if len(v) else float("nan")

        for r in ("cpu", "mem"):
            if not ((s["resource"] == r).any()):
                continue
            lines.append(
                f"  {r}: {int(get('machine_buckets', r))} full machine-buckets; requested/capacity mean "
                f"{fmt(get('alloc_ratio_mean', r), '.3f')}, p50 {fmt(get('alloc_ratio_p50', r), '.3f')}, "
                f"p99 {fmt(get('alloc_ratio_p99', r), '.3f')}, max {fmt(get('alloc_ratio_max', r), '.3f')}; "
                f"over capacity by request {fmt(get('share_over_capacity_request', r), '.2f', 100, '%')}"
                f" of machine-time, by usage {fmt(get('share_over_capacity_usage', r), '.2f', 100, '%')}; "
                f"usage/capacity mean {fmt(get('usage_ratio_mean', r), '.3f')}")
        return "\n".join(lines)


def _ratio(num: np.ndarray, den: np.ndarray) -> np.ndarray:
    """num / den; 0/0 and anything / NaN -> NaN, x/0 (x > 0) -> inf."""
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where((den == 0) & (num == 0), np.nan, np.asarray(num, np.float64) / den)
