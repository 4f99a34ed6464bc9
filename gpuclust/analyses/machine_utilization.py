"""``machine-utilization``: per machine and 5-minute bucket, the usage of the instances on it over
its capacity, CPU and memory, and the distribution of that ratio over the cell.

Two named modes (docs/analyses/machine-utilization.md):

``time-weighted`` (default): every machine-bucket in which the machine is up.  The window is
    ``[w0, w1]``, from the earliest ``start_time`` of instance_usage to its latest known
    ``start_time`` / ``end_time``; a machine is up from an ADD to the next REMOVE and its capacity
    is that of its latest ADD / UPDATE (:func:`gpuclust.analyses._intervals.capacity_intervals`,
    clipped to the window).  Per (machine, bucket): ``up_s``, the seconds it is up in the bucket;
    ``cap_s = SUM(capacity x seconds)`` over those up pieces; ``usage_s = SUM(avg_cpu x overlap
    seconds)`` over the top-level usage windows of any length with a known end;
    ``util = usage_s / cap_s``, **not** capped (an idle machine-bucket: 0).  A machine-bucket
    counts when ``up_s > 0``; its capacity is unknown when any up piece in it has a NULL
    capacity (``util`` NULL, not 0).
``notebook``: Google's notebook query ("Per machine resource usage distribution").  Usage rows
    of top-level instances (``alloc_collection_id`` NULL or 0) whose window lasts at least 300 s;
    each row's bucket is ``floor(start_time / 300 s)``; per (machine, bucket)
    ``usage = SUM(avg_cpu)`` (``avg_mem``); ``capacity = MAX(cap_cpu)`` (``cap_mem``) of the
    machine over all of machine_events; ``util = 1.0 if usage > capacity else usage / capacity``.
    Only machine-buckets holding a used window.  Machines absent from machine_events drop out (the
    notebook's inner join); a NULL usage sum or capacity, or a capacity that is not positive,
    makes ``util`` unknown (NULL).

The distribution's quantiles (0, 1, ..., 100%, linear interpolation as ``numpy.quantile``, each
machine-bucket once) are exact: the machine table is a parted table (a row per machine-bucket,
written part by part); on the host :func:`gpuclust.stream_quantiles.stream_quantiles_many` reads
its two util columns a few times, so memory does not grow with the cell; on a device each shard
keeps its utilizations there (:class:`gpuclust.analyses._kept.KeptValues`, within a share of
the device's memory) and the quantiles are one sort a resource, without reading the table back.  A per-bucket series gives the mean over machines.  The
partials are keyed usage sums per machine-bucket in both modes; the time-weighted mode's up time is
not a partial: each shard of machines sweeps its machines' up pieces
(:func:`gpuclust.analyses._machine_up.up_grid`), so no machine x bucket grid of the whole cell is
built.  The keyed sums are :func:`gpuclust.analyses._machine_sums.keyed_sums`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from gpuclust._xp import bincount
from gpuclust.analyses._extent import max_finite, to_f64, to_i64
from gpuclust.analyses._intervals import capacity_intervals
from gpuclust.analyses._kept import KeptValues, kept_quantiles
from gpuclust.analyses._lookup import MachineHash, machine_capacities
from gpuclust.analyses._machine_sums import COUNTS, NULL_BITS, keyed_sums
from gpuclust.analyses._machine_up import min_start, up_grid
from gpuclust.analyses.base import Analysis, fmt, null_int, to_host
from gpuclust.analyses.grouping import bucket_pieces
from gpuclust.analyses.kinds import Even, Fields, Keyed, Label, Sum
from gpuclust.analyses.options import option
from gpuclust.arrow_numpy import schema_table, table, table_from_rows
from gpuclust.backends import finalize_backend
from gpuclust.keys import pack, unpack, unpack_bits
from gpuclust.parted import array_batches, finalize_in_memory
from gpuclust.schema import TIME_AFTER_TRACE
from gpuclust.tables import as_arrow

__all__ = ["BUCKET_US", "DENSE_CELLS", "MODES", "QUANTILES", "MachineUtilization", "MachineUtilizationContext"]

#: The notebook's bucket: 5 minutes, µs.
BUCKET_US = 300_000_000
MODES = ("time-weighted", "notebook")
#: The quantiles of the distribution table: 0, 0.01, ..., 1 (the notebook's APPROX_QUANTILES(x, 100)).
QUANTILES = tuple(np.round(np.arange(101) / 100, 2).tolist())
#: Machine-buckets per shard of the machine table (one Parquet part); shards of a device's
#: partials take this many times more (fewer launches).
SHARD_CELLS = 1 << 18
DEVICE_SHARD_FACTOR = 4
#: Most machine-buckets merged in memory by the local engine (:func:`_dense_cells`):
#: 8 Mi, 240 MiB of accumulators (a 2019 cell, ~12,000 machines x 8,928 buckets, spills).
DENSE_CELLS = 1 << 23
RESOURCES = (("cpu", "avg_cpu", "cap_cpu"), ("mem", "avg_mem", "cap_mem"))
#: Counters of the usage rows, in this order.
STATS = ("rows", "alloc_rows", "short_rows", "unbounded_rows", "unplaced_rows", "unknown_machine_rows", "used_rows")
#: The keyed sums' fields and their dtypes (:data:`gpuclust.analyses._machine_sums.COUNTS`: the
#: integer ones).
_FIELDS = {"cpu": np.float64, "mem": np.float64, **COUNTS}
_MACHINE_COLUMNS = [
    "machine_id",
    "bucket",
    "bucket_start_us",
    "windows",
    "cpu_usage",
    "mem_usage",
    "cap_cpu",
    "cap_mem",
    "cpu_util",
    "mem_util",
]
#: The time-weighted mode's machine table: ``up_s`` after ``bucket_start_us``.
_UP_COLUMNS = [*_MACHINE_COLUMNS[:3], "up_s", *_MACHINE_COLUMNS[3:]]
#: Counters of the time-weighted mode's machine-buckets (info), in this order.
UP_STATS = ("idle_machine_buckets", "partial_machine_buckets", "usage_buckets_not_up")
_NULL_ID = np.iinfo(np.int64).min


@dataclass(frozen=True)
class MachineUtilizationContext:
    """Host arrays every partition gets: the machines and their capacities, the bucket span."""

    machine_ids: np.ndarray
    cap_cpu: np.ndarray
    cap_mem: np.ndarray
    #: buckets per machine in the keys (buckets ``[0, span)``)
    span: int
    #: machine id -> code (:class:`MachineHash`)
    machines: MachineHash | None = None
    #: time-weighted mode: the up pieces of the machines (code, start, end, cap_cpu, cap_mem: host
    #: arrays sorted by code; from :func:`capacity_intervals`) and the window ``(w0, w1)``
    up: dict[str, np.ndarray] | None = None
    window: tuple[int, int] = (0, 0)


def _span(ctx: MachineUtilizationContext) -> int:
    """Keys per machine code in the keyed sums: the bucket span."""
    return ctx.span


def _machines(ctx: MachineUtilizationContext) -> int:
    """Machine codes: the coordinate the keyed sums are sharded by."""
    return int(ctx.machine_ids.shape[0])


def _dense_cells(ctx: MachineUtilizationContext) -> int | None:
    """The keys of the keyed sums, every machine-bucket, when there are at most
    :data:`DENSE_CELLS`: the local engine then merges each partition's sums in memory, in
    partition order, into dense accumulators (29 B a machine-bucket) instead of spilling them
    (:mod:`gpuclust.engine.shards`; at 6.4e7 windows a partition of 1 Mi rows touches 0.9 M
    of the 5.3 M machine-buckets: 1.5 GB of spill files, 2-3 s of system time)."""
    cells = int(ctx.machine_ids.shape[0]) * ctx.span
    return cells if cells <= DENSE_CELLS else None


@dataclass(frozen=True)
class MachineUtilization(Analysis):
    """Per machine x 5 minutes: usage / capacity (CPU, memory) and its distribution over the cell.

    Examples
    --------
    >>> MachineUtilization(mode="notebook").label
    'machine-utilization[mode=notebook]'
    """

    mode: str = option(
        "time-weighted",
        "time-weighted: every machine-bucket the machine is up (machine_events), "
        "usage-seconds / capacity-seconds, idle = 0, uncapped; notebook: Google's query (windows "
        ">= 300 s by start bucket, capped at 1)",
        choices=MODES,
    )

    name = "machine-utilization"
    table = "instance_usage"
    requires = ("instance_usage", "machine_events")
    parted = ("machine",)
    #: tracemalloc peak of partial, 1 Mi-row partitions of the canonical sets 4e6 -> 6.4e7: 33 -> 69
    #: B/row (notebook; the dense sums allocate up to 4 cells per row, about 100 B/row at most),
    #: 116 (time-weighted)
    row_bytes = 160
    #: rows per partition for partitions="auto": 1 Mi rows.  Larger partitions spill fewer keyed
    #: sums (2 Mi: 10-20% less CPU on 1.6e7 and 6.4e7 windows) but the engine then holds twice
    #: the rows per partition: peak RSS 0.43 -> 0.63 GiB (1.6e7) and 0.49 -> 0.83 GiB (6.4e7).
    auto_partition_rows = 1 << 20

    @property
    def columns(self) -> tuple[str, ...]:
        return ("start_time", "end_time", "machine_id", "alloc_collection_id", "avg_cpu", "avg_mem")

    def context(self, source: Any) -> MachineUtilizationContext:
        ids, cpu, mem = machine_capacities(source.read("machine_events", ["machine_id", "cap_cpu", "cap_mem"]))
        last = max(
            max_finite(source, "instance_usage", "start_time") or 0,
            max_finite(source, "instance_usage", "end_time") or 0,
        )
        span = int(last // BUCKET_US + 1)
        if ids.shape[0] * span >= 1 << 62:
            raise ValueError("machine-utilization: machines x buckets do not fit an int64 key")
        if self.mode == "notebook":
            return MachineUtilizationContext(ids, cpu, mem, span, MachineHash.build(ids))
        w0 = min_start(source)
        window = (0, 0) if w0 is None else (w0, max(w0, last))
        me = source.read("machine_events", ["time", "machine_id", "type", "cap_cpu", "cap_mem"])
        mcols = {c: to_i64(me.column(c)) for c in ("time", "machine_id", "type")}
        mcols.update({c: to_f64(me.column(c)) for c in ("cap_cpu", "cap_mem")})
        cap = capacity_intervals(mcols, *window)
        ok = np.flatnonzero((cap.machine_id != _NULL_ID) & (cap.end > cap.start))
        code = np.searchsorted(ids, cap.machine_id[ok])
        order = np.argsort(code, kind="stable")
        up = {
            "code": code[order].astype(np.int64),
            "start": cap.start[ok][order],
            "end": cap.end[ok][order],
            "cap_cpu": cap.cap_cpu[ok][order],
            "cap_mem": cap.cap_mem[ok][order],
        }
        return MachineUtilizationContext(ids, cpu, mem, span, MachineHash.build(ids), up, window)

    # ---------------------------------------------------------------- partial / merge
    def partial(self, cols: dict[str, Any], ctx: MachineUtilizationContext, backend: Any) -> dict[str, Any]:
        """Per (machine, bucket) key ``code * span + bucket``: the sums, known counts and windows.

        Notebook mode, one block of rows at a time (``backend.ops.lookup_block_rows``, else all at
        once): select, look up and key each block while it is in cache, no column gathered; a
        row that is not used gets the key one past the cells, so each sum is one ``bincount`` over
        the partition, in row order (see :func:`gpuclust.analyses._machine_sums.keyed_sums`)."""
        xp = backend.xp
        s, e, mid = cols["start_time"], cols["end_time"], cols["machine_id"]
        n = int(s.shape[0])
        stats = dict.fromkeys(STATS, 0)
        stats["rows"] = n
        out = self.empty(backend)
        table = ctx.machines if ctx.machines is not None else MachineHash.build(ctx.machine_ids)
        cells = int(ctx.machine_ids.shape[0]) * ctx.span
        block = backend.ops.lookup_block_rows or max(n, 1)
        alloc = cols["alloc_collection_id"]
        null = xp.asarray(null_int(alloc.dtype), dtype=alloc.dtype)
        notebook = self.mode == "notebook"
        keys = xp.empty(n, dtype=xp.int64) if notebook else None
        used = None if notebook else xp.empty(n, dtype=bool)
        codes = None if notebook else xp.empty(n, dtype=xp.int64)
        n_top = n_len = n_placed = n_used = 0
        for lo in range(0, n, block):
            hi = min(n, lo + block)
            a, st, en = alloc[lo:hi], s[lo:hi], e[lo:hi]
            keep = (a == 0) | (a == null)
            n_top += int(xp.count_nonzero(keep))
            if notebook:
                keep &= (en - st) >= BUCKET_US
            else:
                keep &= (en > st) & (en != TIME_AFTER_TRACE)
            n_len += int(xp.count_nonzero(keep))
            # a start at the "after the trace" sentinel (or NULL) has no bucket
            keep &= (st >= 0) & (st < TIME_AFTER_TRACE)
            n_placed += int(xp.count_nonzero(keep))
            code, found = table.find(backend, mid[lo:hi])
            keep &= found
            n_used += int(xp.count_nonzero(keep))
            if notebook:
                assert keys is not None
                k = keys[lo:hi]
                xp.floor_divide(st, BUCKET_US, out=k)
                k[...] = pack(code, k, ctx.span, inplace=True)  # (code: a fresh gather)
                k[~keep] = cells
            else:
                assert used is not None and codes is not None
                used[lo:hi] = keep
                codes[lo:hi] = code
        stats["alloc_rows"] = n - n_top
        stats["short_rows" if notebook else "unbounded_rows"] = n_top - n_len
        stats["unplaced_rows"] = n_len - n_placed
        stats["unknown_machine_rows"] = n_placed - n_used
        stats["used_rows"] = n_used
        out["stats"] = xp.asarray(np.array([stats[k] for k in STATS], np.int64))
        if not n_used:
            return out
        if notebook:
            out["u"] = keyed_sums(backend, keys, cells, cols["avg_cpu"], cols["avg_mem"])
            return out
        # time-weighted: each window's pieces, usage weighted by the piece's share of its bucket
        assert codes is not None
        idx = xp.nonzero(used)[0]
        del used
        row, bucket, overlap = bucket_pieces(xp, s[idx], e[idx], BUCKET_US)
        rows = idx[row]  # "windows": those overlapping the bucket
        del idx, row
        key = pack(codes[rows], bucket, ctx.span)
        del codes, bucket
        w = overlap.astype(xp.float64) / BUCKET_US
        del overlap
        cpu = cols["avg_cpu"][rows].astype(xp.float64) * w
        mem = cols["avg_mem"][rows].astype(xp.float64) * w
        del rows, w
        out["u"] = keyed_sums(backend, key, cells, cpu, mem)
        return out

    @property
    def kinds(self) -> Fields:
        """The keyed sums ``u`` per machine-bucket (counts widened to :data:`COUNTS` before they
        add; sharded by machine, :attr:`MachineUtilizationContext.span` keys a machine; merged in
        memory when there are few, :func:`_dense_cells`), the counters and the backend."""
        return Fields(
            {
                "u": Keyed(fields=_FIELDS, cast=COUNTS, per=_span, dense=_dense_cells),
                "stats": Sum((len(STATS),), np.int64),
                "backend": Label(),
            },
            shard_by=Even(_machines, _span, SHARD_CELLS, device=DEVICE_SHARD_FACTOR),
        )

    #: its keyed sums (~33 B a machine-bucket) stay on the device for :meth:`finalize_shard`
    device_partial = True

    def finalize(self, partial: dict[str, Any], ctx: MachineUtilizationContext) -> dict[str, Any]:
        return finalize_in_memory(self, partial, ctx)

    def finalize_shard(
        self,
        keyed: dict[str, dict[str, np.ndarray]],
        rest: dict[str, Any],
        ctx: MachineUtilizationContext,
        lo: int,
        hi: int,
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        """The machine-buckets of machine codes ``[lo, hi)`` and the shard's per-bucket sums for the
        series: notebook, those with a used window; time-weighted, those in which the machine is
        up (:func:`gpuclust.analyses._machine_up.up_grid`, swept for the shard's machines only).
        Computed on the backend the partials were computed on (:func:`finalize_backend`: the
        device under ``backend="gpu"``); the table's columns and the sums come back to the host."""
        be = finalize_backend(rest["backend"])
        xp = be.xp
        u = {f: be.asarray(v) for f, v in keyed["u"].items()}
        key = u["key"].astype(xp.int64, copy=False)
        windows = u["windows"].astype(xp.int64, copy=False)
        mem_nulls, cpu_nulls = unpack_bits(u["nulls"].astype(xp.int64, copy=False), NULL_BITS)
        known = {"cpu": windows - cpu_nulls, "mem": windows - mem_nulls}
        use = {r: xp.where(known[r] > 0, u[r].astype(xp.float64, copy=False), np.nan) for r, _, _ in RESOURCES}
        notebook = self.mode == "notebook"
        extra: dict[str, Any] = {"kept": KeptValues(be)}
        counts: list[Any] = []  # the shard's counters, read on the host at once
        if notebook:
            code, bucket = unpack(key, ctx.span)
            cap = {r: be.stage(getattr(ctx, cap_name))[code] for r, _, cap_name in RESOURCES}
            cols: dict[str, Any] = {"bucket": bucket, "bucket_start_us": bucket * BUCKET_US, "windows": windows}
            use_s = use
            cap_s = cap
        else:
            up, cs = up_grid(ctx.up, lo, hi, ctx.span, BUCKET_US, be)  # dense over the shard: (hi - lo) x span
            local = key - pack(lo, 0, ctx.span)
            cells = xp.flatnonzero(up > 0)
            at = xp.searchsorted(local, cells)  # the keyed sums of each up machine-bucket, if any
            has = at < local.shape[0]
            has[has] = local[at[has]] == cells[has]
            code, bucket = unpack(cells, ctx.span)
            code += lo
            up_s = up[cells]
            w = xp.zeros(cells.shape[0], xp.int64)
            w[has] = windows[at[has]]
            cols = {"bucket": bucket, "bucket_start_us": bucket * BUCKET_US, "up_s": up_s, "windows": w}
            use_s, cap_s, cap = {}, {}, {}
            for r, _, _ in RESOURCES:
                v = xp.zeros(cells.shape[0])
                v[has] = use[r][at[has]] * (BUCKET_US / 1e6)  # the keyed sums are usage x overlap / 300 s
                use_s[r] = v
                cap_s[r] = cs[r][cells]
                cap[r] = cap_s[r] / up_s
                use[r] = v / up_s
            counts += [
                xp.count_nonzero(w == 0),
                xp.count_nonzero(up_s < BUCKET_US / 1e6),
                local.shape[0] - xp.count_nonzero(has),
            ]
        for r, _, _ in RESOURCES:
            c = cap_s[r]
            with np.errstate(invalid="ignore", divide="ignore"):
                ratio = xp.where(c > 0, use_s[r] / xp.where(c > 0, c, 1.0), np.nan)
            util = xp.where(ratio > 1.0, 1.0, ratio) if notebook else ratio
            cols[f"{r}_usage"], cols[f"cap_{r}"], cols[f"{r}_util"] = use[r], cap[r], util
            kn = xp.isfinite(util)
            known_util, known_bucket = util[kn], bucket[kn]
            extra["kept"].add(r, known_util)  # on a device: for the summary's quantiles
            extra[r] = {
                "known": bincount(xp, known_bucket, minlength=ctx.span),
                "sum": bincount(xp, known_bucket, weights=known_util, minlength=ctx.span),
            }
            counts += [xp.count_nonzero(ratio > 1.0), xp.count_nonzero(~kn)]
        n = [int(x) for x in to_host(xp.stack([xp.asarray(c, xp.int64) for c in counts]))]
        if not notebook:
            extra["up"] = dict(zip(UP_STATS, n[:3], strict=True))
        for r, _, _ in RESOURCES:
            extra[r] = {k: to_host(v) for k, v in extra[r].items()}
            extra[r]["over"], extra[r]["unknown"] = n[-4:-2] if r == "cpu" else n[-2:]
        cols = {c: to_host(v) for c, v in cols.items()}
        cols["machine_id"] = ctx.machine_ids[to_host(code)]
        # one Arrow table in the table's column order, built from the arrays without pandas
        return {"machine": table({c: cols[c] for c in (_MACHINE_COLUMNS if notebook else _UP_COLUMNS)})}, extra

    def finalize_parted(
        self, rest: dict[str, Any], ctx: MachineUtilizationContext, tables: dict[str, Any], extras: list[dict[str, Any]]
    ) -> dict[str, pa.Table]:
        """The summary, quantile, series and info tables, as Arrow tables (see
        :mod:`gpuclust.tables`): the quantiles of the utilizations the shards kept on a device,
        else read from the machine table a batch at a time (:func:`gpuclust.parted.array_batches`),
        so a run without plots never imports pandas."""
        be = finalize_backend(rest["backend"])  # the exact quantiles: a sort on the device, where there is one
        machine = tables["machine"]
        names = [r for r, _, _ in RESOURCES]

        def batches() -> Any:
            for b in array_batches(machine, [f"{r}_util" for r in names]):
                yield [v[np.isfinite(v)] for v in (np.asarray(b[f"{r}_util"], np.float64) for r in names)]

        quantiles = kept_quantiles(be, [e["kept"] for e in extras], names, batches, QUANTILES)
        rows, qrows = [], []
        series: dict[str, Any] = {"bucket": np.arange(ctx.span, dtype=np.int64)}
        series["bucket_start_us"] = series["bucket"] * BUCKET_US
        for r, qs in zip(names, quantiles, strict=True):
            known = sum((e[r]["known"] for e in extras), np.zeros(ctx.span, np.int64))
            total = sum((e[r]["sum"] for e in extras), np.zeros(ctx.span))
            n = int(known.sum())
            series[f"{r}_machines"] = known
            unknown = sum(e[r]["unknown"] for e in extras)
            if n + unknown:  # no rows for a resource without machine-buckets (an empty input)
                qrows += [{"resource": r, "quantile": q, "util": float(v)} for q, v in zip(QUANTILES, qs, strict=True)]
                over = sum(e[r]["over"] for e in extras)
                rows.append(
                    {
                        "resource": r,
                        "machine_buckets": n + unknown,
                        "known": n,
                        "unknown": unknown,
                        "mean_util": float(total.sum()) / n if n else np.nan,
                        "over_capacity": over,
                        "share_over_capacity": over / n if n else np.nan,
                        **{f"p{round(q * 100)}": float(qs[round(q * 100)]) for q in (0.5, 0.9, 0.99)},
                        "max": float(qs[-1]),
                    }
                )
            with np.errstate(invalid="ignore", divide="ignore"):
                series[f"{r}_mean_util"] = np.where(known > 0, total / np.maximum(known, 1), np.nan)
        keep = np.flatnonzero((series["cpu_machines"] > 0) | (series["mem_machines"] > 0))
        ser = table({c: np.asarray(v)[keep] for c, v in series.items()})
        stats = dict(zip(STATS, (int(v) for v in rest["stats"]), strict=True))
        if self.mode != "notebook":
            stats.update(
                {
                    "window_start_us": ctx.window[0],
                    "window_end_us": ctx.window[1],
                    **{k: sum(e["up"][k] for e in extras) for k in UP_STATS},
                }
            )
        info = table_from_rows(
            [
                {
                    "analysis": self.name,
                    "mode": self.mode,
                    "machines": int(ctx.machine_ids.shape[0]),
                    "machines_known_cpu_capacity": int(np.count_nonzero(ctx.cap_cpu > 0)),
                    "machine_rows": int(machine.num_rows),
                    **stats,
                }
            ]
        )
        return {
            "summary": schema_table(rows, _SUMMARY_SCHEMA),
            "quantiles": schema_table(qrows, _QUANTILES_SCHEMA),
            "series": ser,
            "info": info,
        }

    def summary(self, result: dict[str, Any]) -> str:
        info = as_arrow(result["info"]).to_pylist()[0]
        lines = [
            f"{self.label}: {info['machine_rows']:,} machine-buckets of {info['machines']:,} machines from "
            f"{info['used_rows']:,} of {info['rows']:,} usage windows (mode {info['mode']})"
        ]
        if "idle_machine_buckets" in info:
            lines[0] += (
                f"; machines up: {info['idle_machine_buckets']:,} idle machine-buckets, "
                f"{info['partial_machine_buckets']:,} up part of the bucket, "
                f"{info['usage_buckets_not_up']:,} with usage while down (left out)"
            )
        for r in as_arrow(result["summary"]).to_pylist():
            lines.append(
                f"  {r['resource']}: mean {fmt(r['mean_util'], '.3f')}, p50 {fmt(r['p50'], '.3f')}, "
                f"p90 {fmt(r['p90'], '.3f')}, p99 {fmt(r['p99'], '.3f')}, max {fmt(r['max'], '.3f')}; "
                f"{r['over_capacity']:,} machine-buckets over capacity "
                f"({fmt(r['share_over_capacity'], '.2%')}), {r['unknown']:,} unknown"
            )
        return "\n".join(lines)


#: The ``summary`` and ``quantiles`` tables' columns and types (an empty table keeps them).
_SUMMARY_SCHEMA = pa.schema(
    [
        ("resource", pa.string()),
        *((c, pa.int64()) for c in ("machine_buckets", "known", "unknown")),
        ("mean_util", pa.float64()),
        ("over_capacity", pa.int64()),
        *((c, pa.float64()) for c in ("share_over_capacity", "p50", "p90", "p99", "max")),
    ]
)
_QUANTILES_SCHEMA = pa.schema([("resource", pa.string()), ("quantile", pa.float64()), ("util", pa.float64())])
