"""``cell-usage``: hourly CPU and memory usage by priority tier, normalised by cell capacity.

Two named modes:

``notebook``
    Exactly Google's published analysis notebook (cluster-data, ``clusterdata_analysis_colab``):
    capacity = sum over machines of MAX(capacity.cpus) / MAX(capacity.memory) from
    machine_events; priority per (collection_id, instance_index, machine_id) = MAX(priority)
    over instance_events rows with alloc_collection_id NULL or 0; usage rows with
    alloc_collection_id NULL or 0 and ``end_time - start_time >= 5 min``, inner-joined on that
    triple; ``hour = floor(start_time / 3.6e9)``; tier by ``CASE ... ELSE <last tier>`` (a NULL or
    unmatched-by-range priority lands in the last tier, as the notebook's ELSE does);
    value = SUM(avg) / (12 x capacity).
``exact``
    Every top-level usage window (alloc_collection_id NULL or 0, any length) contributes
    ``avg x overlap_seconds(window, hour) / 3600``, normalised by the same capacity.  Windows
    whose instance has no event row (or a NULL / negative priority) go to tier ``unknown``
    instead of being dropped; windows ending at the 2^63-1 "after the trace" sentinel cannot be
    placed in time and are excluded (both counted in the ``info`` table).

Output tables: ``usage`` (hour, tier, cpu, mem, windows; ``windows`` = windows *starting* in
that hour that contributed) and ``info`` (one row: mode, tier map, capacities, row counts).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import pyarrow as pa

from gpuclust._xp import bincount
from gpuclust.analyses._lookup import EVENT_COLUMNS, InstanceLookup, machine_capacities, tier_lookup, triple_hash
from gpuclust.analyses.base import Analysis, fmt, is_null_int, nan_sum, null_int
from gpuclust.analyses.grouping import HOUR_US, bucket_span
from gpuclust.analyses.kinds import Fields, Flat, Keyed, Sum
from gpuclust.analyses.options import CELL_USAGE_MODE, CELL_USAGE_MODES, tier_map_option
from gpuclust.arrow_numpy import table, table_from_rows
from gpuclust.keys import pack, pack_bits, unpack, unpack_bits
from gpuclust.partials import keyed_reduce
from gpuclust.schema import TIME_AFTER_TRACE, TierMap
from gpuclust.tables import as_arrow, column
from gpuclust.tiers import TierNames, check_tier_slots, resolve_tier_map

__all__ = ["CellUsage", "HOUR_US", "MODES", "triple_hash"]

FIVE_MIN_US = 300_000_000
MODES = CELL_USAGE_MODES
#: Keys pack (hour, tier) as hour << 4 | tier (:func:`gpuclust.keys.pack_bits`); tier codes are < 16.
_TIER_BITS = 4
#: Most hours one partition's windows may span in exact mode (guards against garbage times).
MAX_EXACT_HOURS = 1 << 20
#: Largest dense (hour, tier) accumulator of the blocked notebook partial (else rows are gathered).
_DENSE_MAX = 1 << 20
#: Counters kept in every partial, in this order.
STATS = (
    "rows",
    "alloc_rows",
    "short_windows",
    "unmatched_windows",
    "unknown_windows",
    "unbounded_windows",
    "used_windows",
)
#: The fields of the keyed (hour, tier) partial, ``key`` first.
_KEYED = ("key", "cpu", "mem", "cpu_n", "mem_n", "windows")
#: The keyed (hour, tier) partial's kind: the sums and known-coverage (float64), the windows (int64).
_USAGE = Keyed(
    fields={"cpu": np.float64, "mem": np.float64, "cpu_n": np.float64, "mem_n": np.float64, "windows": np.int64}
)


@dataclass(frozen=True)
class CellUsageContext(TierNames):
    mode: str
    tier_map: TierMap
    cpu_capacity: float
    mem_capacity: float
    #: (collection_id, instance_index, machine_id) -> tier code (set by ``bind``)
    lookup: InstanceLookup = InstanceLookup.empty()

    def has_unknown_tier(self) -> bool:
        return self.mode == "exact"  # the notebook mode joins no priorities: no unknown tier


def _notebook_sums(backend: Any, key: Any, cpu: Any, mem: Any) -> dict[str, Any]:
    """``keyed_reduce(key, {cpu, mem, cpu_n, mem_n}, {"windows": None})`` (``*_n``: how many finite
    values each group sums), bit for bit, with fewer passes over the rows: the key range of one
    partition is small (hours x tiers), so every sum is one ``bincount`` of the float32 values
    (bincount adds them as float64, in row order, as ``keyed_reduce`` does)."""
    xp = backend.xp
    n = int(key.shape[0])
    if n == 0:
        return keyed_reduce(
            backend,
            key,
            {
                "cpu": cpu,
                "mem": mem,
                "cpu_n": xp.isfinite(cpu).astype(xp.float64),
                "mem_n": xp.isfinite(mem).astype(xp.float64),
            },
            {"windows": None},
        )
    kmin = int(key.min())
    span = int(key.max()) - kmin + 1
    if span > max(4 * n, 1 << 16):  # not compact: keyed_reduce's sorted path
        return keyed_reduce(
            backend,
            key,
            {
                "cpu": cpu,
                "mem": mem,
                "cpu_n": xp.isfinite(cpu).astype(xp.float64),
                "mem_n": xp.isfinite(mem).astype(xp.float64),
            },
            {"windows": None},
        )
    off = key - kmin if kmin else key
    del key
    cnt = bincount(xp, off, minlength=span)
    present = xp.nonzero(cnt > 0)[0]
    out = {"key": (present + kmin).astype(xp.int64)}
    for name, v in (("cpu", cpu), ("mem", mem)):
        bad = ~xp.isfinite(v)
        if not bool(bad.any()):
            out[name] = bincount(xp, off, weights=v, minlength=span)[present]
            out[name + "_n"] = cnt[present].astype(xp.float64)
            continue
        nan = xp.isnan(v)  # SUM ignores NULL (NaN); an infinite value is summed but not counted as known
        # (astype: bincount of no rows returns int64 even with weights)
        out[name] = bincount(xp, off[~nan], weights=v[~nan], minlength=span).astype(xp.float64)[present]
        out[name + "_n"] = (cnt - bincount(xp, off[bad], minlength=span))[present].astype(xp.float64)
    out["windows"] = cnt[present].astype(xp.int64)
    return {k: out[k] for k in ("key", "cpu", "mem", "cpu_n", "mem_n", "windows")}


@dataclass(frozen=True)
class CellUsage(Analysis):
    """Hourly CPU and memory usage by priority tier, normalised by cell capacity.

    Examples
    --------
    >>> CellUsage(mode="exact").label
    'cell-usage[mode=exact]'
    """

    mode: str = CELL_USAGE_MODE.field()
    tier_map: str | None = tier_map_option()

    name = "cell-usage"
    table = "instance_usage"
    requires = ("instance_usage", "instance_events", "machine_events")
    row_bytes = 96
    #: rows per partition for partitions="auto" (gpuclust.engine.memory.preferred_rows)
    auto_partition_rows = 1 << 20

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
        )

    # ---------------------------------------------------------------- context (client side)
    def context(self, source: Any) -> CellUsageContext:
        tm = check_tier_slots("cell-usage", resolve_tier_map(self.tier_map, source), 1 << _TIER_BITS)
        # Capacity: SUM over machines of MAX(capacity); NULLs ignored, all-NULL -> NaN (SQL NULL).
        _, cpu, mem = machine_capacities(source.read("machine_events", ["machine_id", "cap_cpu", "cap_mem"]))
        cpu_cap, mem_cap = nan_sum(cpu), nan_sum(mem)
        return CellUsageContext(self.mode, tm, cpu_cap, mem_cap)

    @property
    def side_inputs(self) -> dict[str, tuple[str, ...]]:
        return {"instance_events": EVENT_COLUMNS}

    def bind(self, ctx: CellUsageContext, side: dict[str, Any], grain: str | None) -> CellUsageContext:
        # Priority: MAX(priority) per (collection_id, instance_index, machine_id) over events with
        # alloc_collection_id NULL or 0.  A NULL machine_id never joins (SQL NULL semantics); a
        # NULL or unmatched priority: the notebook's CASE ... ELSE puts it in the last tier, exact
        # mode in "unknown".
        n = len(ctx.tier_map.names)
        lk = tier_lookup(
            side["instance_events"],
            ctx.tier_map,
            top_level_only=True,
            unmatched=n - 1 if self.mode == "notebook" else n,
            what="cell-usage priority lookup",
        )
        return replace(ctx, lookup=lk)

    # ---------------------------------------------------------------- partial / kinds
    def partial(self, cols: dict[str, Any], ctx: CellUsageContext, backend: Any) -> dict[str, Any]:
        xp = backend.xp
        start, end = cols["start_time"], cols["end_time"]
        alloc = cols["alloc_collection_id"]
        n = int(start.shape[0])
        stats = dict.fromkeys(STATS, 0)
        stats["rows"] = n
        if self.mode == "notebook":
            part = self._notebook_partial(backend, cols, ctx, stats)
            part["stats"] = xp.asarray(np.array([stats[s] for s in STATS], dtype=np.int64))
            return part
        top = (alloc == 0) | is_null_int(xp, alloc)
        stats["alloc_rows"] = n - int(top.sum())
        unbounded = top & (end == TIME_AFTER_TRACE)
        stats["unbounded_windows"] = int(unbounded.sum())
        sel = top & ~unbounded
        # only the selected rows are looked up (same rows, same order: same sums)
        rows = None if bool(sel.all()) else xp.nonzero(sel)[0]
        del sel

        def pick(a: Any) -> Any:
            return a if rows is None else a[rows]

        found, tier = ctx.lookup.find(
            backend, cols["collection_id"], cols["instance_index"], cols["machine_id"], rows=rows
        )
        t_all = xp.where(found, tier, xp.int32(len(ctx.tier_map.names)))
        stats["unknown_windows"] = int((t_all == len(ctx.tier_map.names)).sum())
        stats["used_windows"] = int(found.shape[0])
        part = self._exact_partial(
            backend,
            pick(start),
            pick(end),
            t_all.astype(xp.int32),
            pick(cols["avg_cpu"]),
            pick(cols["avg_mem"]),
            len(ctx.tier_names),
        )
        part["stats"] = xp.asarray(np.array([stats[s] for s in STATS], dtype=np.int64))
        return part

    @staticmethod
    def _notebook_partial(
        backend: Any, cols: dict[str, Any], ctx: CellUsageContext, stats: dict[str, int]
    ) -> dict[str, Any]:
        """Notebook mode, one block of rows at a time (``backend.ops.lookup_block_rows``, else all
        at once): select, look up and key each block of contiguous rows while it is in cache (no
        column is gathered); a row that is not used gets the key ``span``, one past the dense
        (hour, tier) range, so every sum is one ``bincount`` over the partition, in row order (the
        same float64 sums as adding the used rows one by one)."""
        xp = backend.xp
        start, end, alloc = cols["start_time"], cols["end_time"], cols["alloc_collection_id"]
        c, i, m = cols["collection_id"], cols["instance_index"], cols["machine_id"]
        n = int(start.shape[0])
        if n == 0:
            stats.update(alloc_rows=0, short_windows=0, unmatched_windows=0, used_windows=0)
            return _notebook_sums(backend, xp.zeros(0, xp.int64), cols["avg_cpu"], cols["avg_mem"])
        block = backend.ops.lookup_block_rows or n
        null = xp.asarray(null_int(alloc.dtype), dtype=alloc.dtype)
        h0 = int(start.min()) // HOUR_US
        span = pack_bits(int(start.max()) // HOUR_US - h0 + 1, 0, _TIER_BITS)
        dense = span <= _DENSE_MAX
        keys = xp.empty(n, dtype=xp.int64)
        used = None if dense else xp.empty(n, dtype=bool)
        n_top = n_sel = n_used = 0
        for lo in range(0, n, block):
            hi = min(n, lo + block)
            a, s = alloc[lo:hi], start[lo:hi]
            top = (a == 0) | (a == null)
            sel = top & ((end[lo:hi] - s) >= FIVE_MIN_US)
            found, tier = ctx.lookup.find(backend, c[lo:hi], i[lo:hi], m[lo:hi])
            use = sel & found
            n_top += int(xp.count_nonzero(top))
            n_sel += int(xp.count_nonzero(sel))
            n_used += int(xp.count_nonzero(use))
            k = keys[lo:hi]
            xp.floor_divide(s, HOUR_US, out=k)
            if dense:
                k -= h0
            pack_bits(k, tier.astype(xp.int64), _TIER_BITS, inplace=True)
            if dense:
                k[~use] = span
            else:
                assert used is not None
                used[lo:hi] = use
        stats["alloc_rows"] = n - n_top
        stats["short_windows"] = n_top - n_sel
        stats["unmatched_windows"] = n_sel - n_used
        stats["used_windows"] = n_used
        if not dense:  # garbage times: gather the used rows, keyed_reduce's sorted path
            rows = xp.nonzero(used)[0]
            return _notebook_sums(backend, keys[rows], cols["avg_cpu"][rows], cols["avg_mem"][rows])
        cnt = bincount(xp, keys, minlength=span + 1)[:span]
        present = xp.nonzero(cnt > 0)[0]
        out = {"key": (present + pack_bits(h0, 0, _TIER_BITS)).astype(xp.int64)}
        for name in ("cpu", "mem"):
            v = cols["avg_" + name]
            bad = ~xp.isfinite(v)
            total = bincount(xp, keys, weights=v, minlength=span + 1)[:span]  # unused rows add to bin span
            known = cnt
            if bool(bad.any()):
                # SUM ignores NULL (NaN); an infinite value is summed but not counted as known
                nan = xp.isnan(v)
                if bool(nan.any()):
                    total = bincount(xp, xp.where(nan, span, keys), weights=v, minlength=span + 1)[:span]
                known = cnt - bincount(xp, keys[bad], minlength=span + 1)[:span]
            out[name] = total[present].astype(xp.float64)
            out[name + "_n"] = known[present].astype(xp.float64)
        out["windows"] = cnt[present].astype(xp.int64)
        return {k: out[k] for k in ("key", "cpu", "mem", "cpu_n", "mem_n", "windows")}

    def _exact_partial(
        self, backend: Any, start: Any, end: Any, tier: Any, cpu: Any, mem: Any, n_tiers: int
    ) -> dict[str, Any]:
        xp, ops = backend.xp, backend.ops
        if start.shape[0] == 0:
            return _USAGE.identity(xp, backend.name)
        hs, he = bucket_span(xp, start, end, HOUR_US)
        h0 = int(hs.min())
        h1 = int(xp.maximum(he, hs).max()) + 1
        nb = h1 - h0
        if nb > MAX_EXACT_HOURS:
            raise ValueError(
                f"cell-usage (exact): the windows of one partition span {nb} hours "
                f"(> {MAX_EXACT_HOURS}); the start/end times look corrupt"
            )
        kw = dict(n_groups=n_tiers, n_buckets=nb, origin=h0 * HOUR_US, width=HOUR_US)
        start = xp.ascontiguousarray(start)
        end = xp.ascontiguousarray(end)
        # one sweep of four series: usage, and the overlap of windows with a non-NULL value
        fin = [xp.isfinite(v).astype(xp.float64) for v in (cpu, mem)]
        swept = ops.bucket_overlap(
            start, end, xp.stack([cpu.astype(xp.float64), mem.astype(xp.float64), *fin]), tier, **kw
        ).reshape(4, -1)
        dcpu, dmem = swept[0], swept[1]
        cell = pack(tier.astype(xp.int64), hs - h0, nb)
        dwin = bincount(xp, cell, minlength=n_tiers * nb).astype(xp.int64)
        # cpu_n / mem_n > 0 iff some window with a non-NULL value touches the hour (positive overlap,
        # or starts in it): otherwise the hour's usage is unknown (NaN), not 0
        known = {
            name: swept[2 + j] + bincount(xp, cell, weights=fin[j], minlength=n_tiers * nb)
            for j, name in enumerate(("cpu_n", "mem_n"))
        }
        # keep the known-coverage of cells this partition does not otherwise touch: another partition
        # may hold the cell's only NULL-valued windows (finalize drops cells without contribution)
        idx = xp.nonzero((dcpu != 0) | (dmem != 0) | (dwin != 0) | (known["cpu_n"] != 0) | (known["mem_n"] != 0))[0]
        tier_of, hour = unpack(idx, nb)
        key = pack_bits(hour + h0, tier_of, _TIER_BITS)
        order = xp.argsort(key)
        return {
            "key": key[order].astype(xp.int64),
            "cpu": dcpu[idx][order],
            "mem": dmem[idx][order],
            "cpu_n": known["cpu_n"][idx][order],
            "mem_n": known["mem_n"][idx][order],
            "windows": dwin[idx][order],
        }

    @property
    def kinds(self) -> Fields:
        """The (hour, tier) sums, a keyed partial at the partial's top level, and the counters."""
        return Fields({"usage": Flat(_USAGE, "", _KEYED), "stats": Sum((len(STATS),), np.int64)})

    # ---------------------------------------------------------------- finalize
    def finalize(self, partial: dict[str, np.ndarray], ctx: CellUsageContext) -> dict[str, pa.Table]:
        # cells with no contribution (all sums 0, no window starting there) are absent
        keep = (
            (np.asarray(partial["cpu"]) != 0)
            | (np.asarray(partial["mem"]) != 0)
            | (np.asarray(partial["windows"]) != 0)
        )
        if not keep.all():
            partial = {k: (v if k == "stats" else np.asarray(v)[keep]) for k, v in partial.items()}
        key = np.asarray(partial["key"], dtype=np.int64)
        hour, code = unpack_bits(key, _TIER_BITS)
        per = 12.0 if self.mode == "notebook" else 3600.0

        def norm(v: np.ndarray, n: np.ndarray, cap: float) -> np.ndarray:
            if not (cap > 0) or not np.isfinite(cap):
                return np.full(v.shape, np.nan)
            # a group without any non-NULL value was not measured: NaN (unknown), never 0
            return np.where(np.asarray(n) > 0, np.asarray(v, dtype=np.float64) / (per * cap), np.nan)

        # Time buckets (docs/user/dataset.md): hour k = [k h, (k+1) h) of trace time (origin 0)
        o = np.lexsort((code, hour))  # by hour, then the tier map's order
        hour, code = hour[o], code[o]
        names = np.array(ctx.tier_names, dtype=object)
        # Arrow tables: a run without plots never needs pandas (gpuclust.tables)
        usage = table(
            {
                "bucket": hour,
                "bucket_start_us": hour * HOUR_US,
                "tier": names[code],
                "cpu": norm(partial["cpu"], partial["cpu_n"], ctx.cpu_capacity)[o],
                "mem": norm(partial["mem"], partial["mem_n"], ctx.mem_capacity)[o],
                "windows": np.asarray(partial["windows"], dtype=np.int64)[o],
            }
        )
        stats = dict(zip(STATS, (int(x) for x in partial["stats"]), strict=False))
        info = table_from_rows(
            [
                {
                    "analysis": self.name,
                    "mode": self.mode,
                    "bucket_s": HOUR_US // 1_000_000,
                    "tier_map": ctx.tier_map.name,
                    "tiers": ",".join(ctx.tier_names),
                    "cpu_capacity": ctx.cpu_capacity,
                    "mem_capacity": ctx.mem_capacity,
                    **stats,
                }
            ]
        )
        return {"usage": usage, "info": info}

    def summary(self, result: dict[str, Any]) -> str:
        info = as_arrow(result["info"]).to_pylist()[0]
        u = as_arrow(result["usage"])
        lines = [
            f"{self.label}: tier map {info['tier_map']!r}, capacity cpu={fmt(info['cpu_capacity'], '.6g')} "
            f"mem={fmt(info['mem_capacity'], '.6g')}",
            f"  rows={info['rows']} used={info['used_windows']} alloc={info['alloc_rows']} "
            f"short={info['short_windows']} unmatched={info['unmatched_windows']} "
            f"unknown-tier={info['unknown_windows']} unbounded={info['unbounded_windows']}",
        ]
        if u.num_rows:
            bucket = column(u, "bucket")
            hours = np.sort(bucket)
            nh = int(np.count_nonzero(hours[1:] != hours[:-1])) + 1  # distinct hours (np.unique imports numpy.ma)
            lines.append(
                f"  hours (buckets of 3600 s from trace time 0) {int(bucket.min())}.."
                f"{int(bucket.max())} ({nh} with data)"
            )
            tier = np.asarray(u.column("tier").to_pylist(), dtype=object)
            cpu, mem = column(u, "cpu").astype(np.float64), column(u, "mem").astype(np.float64)
            _, first = np.unique(tier, return_index=True)
            for t in tier[np.sort(first)]:  # in order of first appearance
                sel = tier == t
                # a tier with no measured hour: NaN, shown as unknown
                c, m = fmt(nan_sum(cpu[sel]) / max(nh, 1), ".4f"), fmt(nan_sum(mem[sel]) / max(nh, 1), ".4f")
                unk = int(np.isnan(cpu[sel]).sum())
                lines.append(
                    f"  {t:>8}: mean cpu {c}  mean mem {m} (fraction of capacity)"
                    + (f"; {unk} hour(s) with unknown cpu usage left out" if unk else "")
                )
        return "\n".join(lines)
