"""``machine-utilization``: per machine and 5-minute bucket, the sum of the usage of the instances
on it over its capacity, CPU and memory, and the distribution of that ratio over the cell
(Google's notebook, "Per machine resource usage distribution").

Two named modes (docs/analysis-machine-utilization.md):

``notebook`` (default): the notebook's query.  Usage rows of top-level instances
    (``alloc_collection_id`` NULL or 0) whose window lasts at least 300 s; each row's bucket is
    ``floor(start_time / 300 s)``; per (machine, bucket) ``usage = SUM(avg_cpu)`` (``avg_mem``);
    ``capacity = MAX(cap_cpu)`` (``cap_mem``) of the machine over all of machine_events;
    ``util = 1.0 if usage > capacity else usage / capacity``.  Machines absent from
    machine_events drop out (the notebook's inner join); a NULL usage sum or capacity, or a
    capacity that is not positive, makes ``util`` unknown (NULL).
``time-weighted``: usage rows of top-level instances of any length with a known end; each
    window's average usage counts in every bucket it overlaps, weighted by the overlap's share of
    the bucket (``SUM(avg_cpu x overlap / 300 s)``: the bucket's time-weighted mean usage);
    the same capacity; ``util = usage / capacity``, **not** capped.

The distribution's quantiles (0, 1, ..., 100%, linear interpolation as ``numpy.quantile``) are
exact: the machine table is a parted table (a row per machine-bucket, written part by part) and
:func:`gpuclust.stream_quantiles.stream_quantiles` reads it a few times, so memory does not grow
with the cell.  A per-bucket series gives the mean over machines.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from gpuclust.analyses._extent import max_finite
from gpuclust.analyses._lookup import id_index, machine_capacities
from gpuclust.analyses.base import Analysis, fmt, is_null_int
from gpuclust.analyses.grouping import bucket_index, bucket_pieces
from gpuclust.analyses.options import option
from gpuclust.parted import finalize_in_memory, frames
from gpuclust.partials import keyed_reduce, merge_keyed
from gpuclust.schema import TIME_AFTER_TRACE

__all__ = ["BUCKET_US", "MODES", "QUANTILES", "MachineUtilization", "MachineUtilizationContext"]

#: The notebook's bucket: 5 minutes, µs.
BUCKET_US = 300_000_000
MODES = ("notebook", "time-weighted")
#: The quantiles of the distribution table: 0, 0.01, ..., 1 (the notebook's APPROX_QUANTILES(x, 100)).
QUANTILES = tuple(np.round(np.arange(101) / 100, 2).tolist())
#: Machine-buckets per shard of the machine table (one Parquet part).
SHARD_CELLS = 1 << 18
RESOURCES = (("cpu", "avg_cpu", "cap_cpu"), ("mem", "avg_mem", "cap_mem"))
#: Counters of the usage rows, in this order.
STATS = ("rows", "alloc_rows", "short_rows", "unbounded_rows", "unplaced_rows", "unknown_machine_rows", "used_rows")
_COUNTS = ("n_cpu", "n_mem", "windows")
_FIELDS = ("cpu", "mem", *_COUNTS)
_MACHINE_COLUMNS = ["machine_id", "bucket", "bucket_start_us", "windows", "cpu_usage", "mem_usage", "cap_cpu",
                    "cap_mem", "cpu_util", "mem_util"]


@dataclass(frozen=True)
class MachineUtilizationContext:
    """Host arrays every partition gets: the machines and their capacities, the bucket span."""

    machine_ids: np.ndarray
    cap_cpu: np.ndarray
    cap_mem: np.ndarray
    #: buckets per machine in the keys (buckets ``[0, span)``)
    span: int


@dataclass(frozen=True)
class MachineUtilization(Analysis):
    """Per machine x 5 minutes: usage / capacity (CPU, memory) and its distribution over the cell.

    Parameters
    ----------
    mode
        ``notebook`` (Google's query: windows of at least 300 s by start bucket, capped at 1) or
        ``time-weighted`` (every window by its overlap with each bucket, uncapped).

    Examples
    --------
    >>> MachineUtilization(mode="time-weighted").label
    'machine-utilization[mode=time-weighted]'
    """

    mode: str = option("notebook", "notebook: Google's query (windows >= 300 s by start bucket, capped at 1); "
                       "time-weighted: every window by its overlap with each bucket, uncapped", choices=MODES)

    name = "machine-utilization"
    table = "instance_usage"
    requires = ("instance_usage", "machine_events")
    parted = ("machine",)
    #: tracemalloc peak of partial: 102 B/row (notebook), 134 (time-weighted); 1 Mi-row partitions
    row_bytes = 160
    #: rows per partition for partitions="auto": 1 Mi rows.  Larger partitions reduce the spilled
    #: keyed sums more (2 Mi: about half) but let keyed_reduce's dense path allocate up to 4x the
    #: partition's rows in accumulators: peak RSS then grew 1.6x from 4e6 to 6.4e7 windows
    #: against 1.3x with 1 Mi (bench/results/scale_machine_utilization.md).
    auto_partition_rows = 1 << 20

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"machine-utilization: mode must be one of {list(MODES)}, got {self.mode!r}")

    @property
    def columns(self) -> tuple[str, ...]:
        return ("start_time", "end_time", "machine_id", "alloc_collection_id", "avg_cpu", "avg_mem")

    def context(self, source: Any) -> MachineUtilizationContext:
        ids, cpu, mem = machine_capacities(source.read("machine_events", ["machine_id", "cap_cpu", "cap_mem"]))
        last = max(max_finite(source, "instance_usage", "start_time") or 0,
                   max_finite(source, "instance_usage", "end_time") or 0)
        span = int(last // BUCKET_US + 1)
        if ids.shape[0] * span >= 1 << 62:
            raise ValueError("machine-utilization: machines x buckets do not fit an int64 key")
        return MachineUtilizationContext(ids, cpu, mem, span)

    # ---------------------------------------------------------------- partial / merge
    def empty(self, backend: Any = None) -> dict[str, Any]:
        return {"u": {"key": np.zeros(0, np.int64),
                      **{f: np.zeros(0, np.int32 if f in _COUNTS else np.float64) for f in _FIELDS}},
                "stats": np.zeros(len(STATS), np.int64)}

    def partial(self, cols: dict[str, Any], ctx: MachineUtilizationContext, backend: Any) -> dict[str, Any]:
        xp = backend.xp
        s, e, mid = cols["start_time"], cols["end_time"], cols["machine_id"]
        n = int(s.shape[0])
        stats = dict.fromkeys(STATS, 0)
        stats["rows"] = n
        out = self.empty()
        alloc = cols["alloc_collection_id"]
        top = (alloc == 0) | is_null_int(xp, alloc)
        stats["alloc_rows"] = n - int(xp.count_nonzero(top))
        if self.mode == "notebook":
            long = (e - s) >= BUCKET_US
            stats["short_rows"] = int(xp.count_nonzero(top & ~long))
            keep = top & long
        else:
            bounded = (e > s) & (e != TIME_AFTER_TRACE)
            stats["unbounded_rows"] = int(xp.count_nonzero(top & ~bounded))
            keep = top & bounded
        # a start at the "after the trace" sentinel (or NULL) has no bucket
        placed = (s >= 0) & (s < TIME_AFTER_TRACE)
        stats["unplaced_rows"] = int(xp.count_nonzero(keep & ~placed))
        keep &= placed
        pos, known = id_index(backend, ctx.machine_ids, mid)
        stats["unknown_machine_rows"] = int(xp.count_nonzero(keep & ~known))
        idx = xp.nonzero(keep & known)[0]
        stats["used_rows"] = int(idx.shape[0])
        out["stats"] = xp.asarray(np.array([stats[k] for k in STATS], np.int64))
        if not int(idx.shape[0]):
            return out
        code = pos[idx].astype(xp.int64)
        cpu = cols["avg_cpu"][idx].astype(xp.float64)
        mem = cols["avg_mem"][idx].astype(xp.float64)
        if self.mode == "notebook":
            bucket = bucket_index(s[idx], BUCKET_US)
        else:  # each window's pieces: usage weighted by the piece's share of its bucket
            row, bucket, overlap = bucket_pieces(xp, s[idx], e[idx], BUCKET_US)
            w = overlap.astype(xp.float64) / BUCKET_US
            code, cpu, mem = code[row], cpu[row] * w, mem[row] * w  # "windows": those overlapping the bucket
        key = code * ctx.span + bucket
        # known values per key (SQL's SUM of only NULLs is NULL); a column without NULLs: the row count
        known = {f"n_{r}": (None if bool(xp.isfinite(v).all()) else xp.isfinite(v).astype(xp.int64))
                 for r, v in (("cpu", cpu), ("mem", mem))}
        u = keyed_reduce(backend, key, {"cpu": cpu, "mem": mem}, {**known, "windows": None})
        # counts as int32 (a machine-bucket holds far fewer than 2^31 windows): a smaller spill
        out["u"] = {f: (v.astype(xp.int32) if f in _COUNTS else v) for f, v in u.items()}
        return out

    def merge(self, a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
        return {"u": merge_keyed(a["u"], b["u"]), "stats": a["stats"] + b["stats"]}

    # ---------------------------------------------------------------- shards
    def split(self, partial: dict[str, Any]) -> tuple[dict[str, Any], dict[str, dict[str, np.ndarray]]]:
        return {"stats": partial["stats"]}, {"u": {f: np.asarray(v) for f, v in partial["u"].items()}}

    def merge_rest(self, a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
        return {"stats": a["stats"] + b["stats"]}

    def shards(self, ctx: MachineUtilizationContext, rest: dict[str, Any]) -> list[tuple[int, int]]:
        """Ranges of machine codes of about :data:`SHARD_CELLS` machine-buckets each."""
        M = int(ctx.machine_ids.shape[0])
        step = max(1, SHARD_CELLS // max(ctx.span, 1))
        return [(lo, min(M, lo + step)) for lo in range(0, M, step)] or [(0, 0)]

    def key_range(self, ctx: MachineUtilizationContext, name: str, lo: int, hi: int) -> tuple[int, int]:
        return lo * ctx.span, hi * ctx.span

    def finalize(self, partial: dict[str, Any], ctx: MachineUtilizationContext) -> dict[str, pd.DataFrame]:
        return finalize_in_memory(self, partial, ctx)

    def finalize_shard(self, keyed: dict[str, dict[str, np.ndarray]], rest: dict[str, Any],
                       ctx: MachineUtilizationContext, lo: int, hi: int) -> tuple[dict[str, Any], dict[str, Any]]:
        """The machine-buckets of machine codes ``[lo, hi)`` (only those with a used window) and
        the shard's per-bucket sums for the series."""
        u = keyed["u"]
        key = np.asarray(u["key"], np.int64)
        code, bucket = key // ctx.span, key % ctx.span
        df = pd.DataFrame({"machine_id": ctx.machine_ids[code], "bucket": bucket, "bucket_start_us": bucket * BUCKET_US,
                           "windows": np.asarray(u["windows"], np.int64)})
        extra: dict[str, Any] = {}
        for r, _, cap_name in RESOURCES:
            use = np.where(np.asarray(u[f"n_{r}"]) > 0, np.asarray(u[r], np.float64), np.nan)
            cap = getattr(ctx, cap_name)[code]
            with np.errstate(invalid="ignore", divide="ignore"):
                ratio = np.where(cap > 0, use / np.where(cap > 0, cap, 1.0), np.nan)
            util = np.where(ratio > 1.0, 1.0, ratio) if self.mode == "notebook" else ratio
            df[f"{r}_usage"], df[f"cap_{r}"], df[f"{r}_util"] = use, cap, util
            kn = np.isfinite(util)
            extra[r] = {"known": np.bincount(bucket[kn], minlength=ctx.span),
                        "sum": np.bincount(bucket[kn], weights=util[kn], minlength=ctx.span),
                        "over": int(np.count_nonzero(ratio > 1.0)), "unknown": int(np.count_nonzero(~kn))}
        return {"machine": df[_MACHINE_COLUMNS]}, extra

    def finalize_parted(self, rest: dict[str, Any], ctx: MachineUtilizationContext, tables: dict[str, Any],
                        extras: list[dict[str, Any]]) -> dict[str, pd.DataFrame]:
        from gpuclust.stream_quantiles import stream_quantiles

        machine = tables["machine"]
        rows, qrows = [], []
        series: dict[str, Any] = {"bucket": np.arange(ctx.span, dtype=np.int64)}
        series["bucket_start_us"] = series["bucket"] * BUCKET_US
        for r, _, _ in RESOURCES:
            known = sum((e[r]["known"] for e in extras), np.zeros(ctx.span, np.int64))
            total = sum((e[r]["sum"] for e in extras), np.zeros(ctx.span))
            n = int(known.sum())

            def values(r: str = r) -> Any:
                for b in frames(machine, [f"{r}_util"]):
                    v = b[f"{r}_util"].to_numpy(np.float64)
                    yield v[np.isfinite(v)]

            series[f"{r}_machines"] = known
            unknown = sum(e[r]["unknown"] for e in extras)
            if n + unknown:  # no rows for a resource without machine-buckets (an empty input)
                qs = stream_quantiles(values, QUANTILES) if n else np.full(len(QUANTILES), np.nan)
                qrows += [{"resource": r, "quantile": q, "util": float(v)} for q, v in zip(QUANTILES, qs, strict=True)]
                over = sum(e[r]["over"] for e in extras)
                rows.append({"resource": r, "machine_buckets": n + unknown, "known": n, "unknown": unknown,
                             "mean_util": float(total.sum()) / n if n else np.nan, "over_capacity": over,
                             "share_over_capacity": over / n if n else np.nan,
                             **{f"p{round(q * 100)}": float(qs[round(q * 100)]) for q in (0.5, 0.9, 0.99)},
                             "max": float(qs[-1])})
            with np.errstate(invalid="ignore", divide="ignore"):
                series[f"{r}_mean_util"] = np.where(known > 0, total / np.maximum(known, 1), np.nan)
        ser = pd.DataFrame(series)
        ser = ser[(ser["cpu_machines"] > 0) | (ser["mem_machines"] > 0)].reset_index(drop=True)
        stats = dict(zip(STATS, (int(v) for v in rest["stats"]), strict=True))
        info = pd.DataFrame([{"analysis": self.name, "mode": self.mode, "machines": int(ctx.machine_ids.shape[0]),
                              "machines_known_cpu_capacity": int(np.count_nonzero(ctx.cap_cpu > 0)),
                              "machine_rows": int(machine.num_rows),
                              **stats}])
        summary = pd.DataFrame(rows, columns=["resource", "machine_buckets", "known", "unknown", "mean_util",
                                              "over_capacity", "share_over_capacity", "p50", "p90", "p99", "max"])
        summary = summary.astype({c: np.int64 for c in ("machine_buckets", "known", "unknown", "over_capacity")})
        quantiles = pd.DataFrame(qrows, columns=["resource", "quantile", "util"]).astype({"quantile": np.float64,
                                                                                          "util": np.float64})
        return {"summary": summary, "quantiles": quantiles, "series": ser, "info": info}

    def summary(self, result: dict[str, pd.DataFrame]) -> str:
        info = result["info"].iloc[0]
        lines = [f"{self.label}: {info['machine_rows']:,} machine-buckets of {info['machines']:,} machines from "
                 f"{info['used_rows']:,} of {info['rows']:,} usage windows (mode {info['mode']})"]
        for r in result["summary"].itertuples(index=False):
            lines.append(f"  {r.resource}: mean {fmt(r.mean_util, '.3f')}, p50 {fmt(r.p50, '.3f')}, "
                         f"p90 {fmt(r.p90, '.3f')}, p99 {fmt(r.p99, '.3f')}, max {fmt(r.max, '.3f')}; "
                         f"{r.over_capacity:,} machine-buckets over capacity ({fmt(r.share_over_capacity, '.2%')}), "
                         f"{r.unknown:,} unknown")
        return "\n".join(lines)
