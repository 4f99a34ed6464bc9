"""``job-usage``: how resource consumption is spread over jobs (Borg: the Next Generation, EuroSys
2020: "the top 1% of jobs use about 99% of CPU-hours and memory-hours").

Per collection, its **NCU-hours** and **NMU-hours**: the sum over its usage windows of the average
CPU (memory) usage times the window's length, in hours (NULL averages left out and counted;
windows with ``end <= start`` or ending at 2^63-1 left out and counted).  Which rows count
avoids double counting allocs either way (``rows``):

``jobs`` (default)
    Rows of collections of type JOB (``collection_type = 0``): every job's own tasks, those
    running inside alloc instances included; alloc sets are not jobs and are left out (their
    instances' usage includes their tasks').
``top-level``
    Google's notebook: rows with ``alloc_collection_id`` NULL or 0 (jobs outside allocs, and
    alloc sets with their whole usage).

A collection's **tier** is the tier of the highest priority of the events of its
``(collection_id, instance_index, machine_id)`` keys that have usage rows (so every layout gives
the same); none known: ``unknown``.

Over the collections with positive usage of a resource, per tier and over all (``"all"``):
count, total, mean, variance (population), median, p90, p99, p99.9 and max, the share of the
total used by the top 1% and 0.1% of collections (``ceil(share x n)``, at least one), the
squared coefficient of variation (variance / mean²), and a Pareto fit of the CCDF tail: over the
largest ``ceil(tail x n)`` collections (at least 2) ranked ``j = 1, 2, ...``, least squares of
``log10(j / n)`` on ``log10(x_j)``; ``alpha`` = minus the slope, with the fit's R².  The NCU-NMU
correlation: Pearson r of the two, and of their logarithms (collections with both positive).

The per-collection partial is keyed by ``collection_id`` (sums; the priority merged by maximum):
memory grows with the number of collections (about 56 bytes each), not with the windows.  On the
cpu backend (``backend.ops.lookup_slot_tables``) a partition's windows are grouped by
:mod:`gpuclust.analyses._job_groups` (one probe of a key table per window gives its key and its
collection's code) into arrays over every collection of the lookup (zero windows where the
partition has none), which partials over the same lookup add elementwise; collections without
events are kept apart (``x*`` fields, keyed).  Either path gives the same sums bit for bit.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import pyarrow as pa

from gpuclust._xp import bincount
from gpuclust.analyses._job_groups import group_windows, key_table
from gpuclust.analyses._job_stats import STAT_COLUMNS, by_usage, job_stats, pearson
from gpuclust.analyses._lookup import EVENT_COLUMNS, TierLookupContext, priority_lookup
from gpuclust.analyses.base import Analysis, colocated, fmt, is_null_int, to_host
from gpuclust.analyses.grouping import unique_codes
from gpuclust.analyses.kinds import Fields, Flat, Keyed, Merged, Sum
from gpuclust.analyses.options import option, tier_map_option
from gpuclust.arrow_numpy import labels, rows_table, table, table_from_rows
from gpuclust.backends import backend_of
from gpuclust.partials import merge_keyed
from gpuclust.schema import TIME_AFTER_TRACE, CollectionType
from gpuclust.tables import as_arrow
from gpuclust.tiers import resolve_tier_map, tier_codes

__all__ = ["JobUsage", "ROWS", "STAT_COLUMNS", "job_stats"]

ROWS = ("jobs", "top-level")
_HOUR_US = 3.6e9
_STATS = ("rows", "used_rows", "unknown_cpu_rows", "unknown_mem_rows", "bad_duration_rows")


_FIELDS = ("key", "cpu", "mem", "windows", "prio")
#: Largest lookup the cpu path's key table takes (its codes are int32).
_MAX_TABLE_KEYS = (1 << 31) - 1


#: The per-collection fields' dtypes (``key``, int64, implied).
_DTYPES = {"cpu": np.float64, "mem": np.float64, "windows": np.int64, "prio": np.int64}


def _empty_keyed(xp: Any = np) -> dict[str, Any]:
    """No collections: the per-collection partial's merge identity, made by ``xp``."""
    return {"key": xp.zeros(0, np.int64), **{f: xp.zeros(0, dt) for f, dt in _DTYPES.items()}}


@dataclass(frozen=True)
class JobUsageContext(TierLookupContext):
    """The priority lookup and, per row of its table, the dense code of the row's collection
    among the table's sorted unique ``collections``: a partial groups its windows by these codes
    (one ``bincount`` per sum, no sort)."""

    collections: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    key_collection: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))


def _merge_same_keys(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any] | None:
    """:func:`merge_keyed` of two partials (:data:`_FIELDS`) in its cheapest case: the same
    ``key`` array object (the cpu path's dense partials over one lookup's collections, and their
    merges, which keep it), or one partial without keys; ``None`` otherwise.

    Sums add elementwise, the priority by maximum, nothing copied: no field of a partial is
    written after it is made.  ``merge_keyed`` counts a NaN sum as 0; a sum of two arrays without
    NaN is the same either way, so each float sum is checked by one reduction (NaN or an infinity
    in it: ``merge_keyed`` merges the field)."""
    if a["key"].shape[0] == 0 or b["key"].shape[0] == 0:
        return dict(b if a["key"].shape[0] == 0 else a)
    if a["key"] is not b["key"]:
        return None
    xp = backend_of(a["key"]).xp
    out = {"key": a["key"]}
    for f in _FIELDS[1:]:
        va, vb = a[f], b[f]
        if f == "prio":
            out[f] = va if va is vb else xp.maximum(va, vb)
            continue
        with np.errstate(invalid="ignore", over="ignore"):
            s = va + vb
            bad = s.dtype.kind == "f" and not bool(xp.isfinite(s.sum()))
        if bad:
            s = merge_keyed({"key": a["key"], f: va}, {"key": b["key"], f: vb}, xp=xp)[f]
        out[f] = s
    return out


def _merge_collections(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    """Two per-collection partials (:data:`_FIELDS`) merged where they are (host or device):
    sums by :func:`merge_keyed`, the priority by maximum; partials over the same lookup's
    collections (the cpu path's dense arrays, one per code) add elementwise
    (:func:`_merge_same_keys`: the same values, without merge_keyed's NaN passes)."""
    fa, fb = colocated(*({f: p[f] for f in _FIELDS} for p in (a, b)))
    out = _merge_same_keys(fa, fb)
    return merge_keyed(fa, fb, maxima=("prio",), xp=backend_of(fa["key"]).xp) if out is None else out


@dataclass(frozen=True)
class JobUsage(Analysis):
    """Per-collection NCU-hours and NMU-hours and how heavy their tail is, by tier.

    Examples
    --------
    >>> JobUsage(rows="top-level").label
    'job-usage[rows=top-level]'
    """

    rows: str = option(
        "jobs",
        "jobs = rows of JOB collections (allocs' tasks included, alloc sets out); top-level = "
        "rows with alloc_collection_id NULL or 0 (Google's notebook)",
        choices=ROWS,
    )
    tail: float = option(0.1, "share of the largest collections the Pareto tail fit uses", gt=0, le=1)
    tier_map: str | None = tier_map_option()

    name = "job-usage"
    table = "instance_usage"
    requires = ("instance_usage",)
    optional_tables = ("instance_events",)
    #: tracemalloc peak of partial: 116 B/row on the generic (gpu) path (bench 1.6e7 set, 4M-row partition);
    #: the cpu path takes 32 B/row there
    row_bytes = 160
    #: rows per partition for partitions="auto" where the events are many (:meth:`auto_rows`)
    auto_partition_rows = 1 << 21
    #: ... and where they are at most this many: one Parquet row group
    few_events_rows = 1 << 20

    def auto_rows(self, source: Any) -> int | None:
        """Rows per partition for ``partitions="auto"`` (:func:`gpuclust.engine.memory.preferred_rows`):
        the cpu path's partials are dense over the lookup's collections, O(collections) each, so
        partitions of 2 Mi rows where the events (a bound on the collections) are more than
        :attr:`few_events_rows` (6.4e7 windows, 3.2M events: 1 Mi cost ~2-4 s more CPU); 1 Mi
        rows where they are fewer (a row group, read without a copy: at 1.6e7 windows, 0.8M events,
        peak RSS 710 -> 460 MiB, system time 0.8-1.3 -> 0.4 s, wall 2.3-2.5 -> 2.0 s)."""
        if source is None:
            return self.auto_partition_rows
        return (
            self.few_events_rows
            if source.num_rows("instance_events") <= self.few_events_rows
            else self.auto_partition_rows
        )

    @property
    def columns(self) -> tuple[str, ...]:
        rule = ("collection_type",) if self.rows == "jobs" else ("alloc_collection_id",)  # what picks the rows
        return ("start_time", "end_time", "collection_id", "instance_index", "machine_id", *rule, "avg_cpu", "avg_mem")

    def context(self, source: Any) -> JobUsageContext:
        return JobUsageContext(resolve_tier_map(self.tier_map, source))

    @property
    def side_inputs(self) -> dict[str, tuple[str, ...]]:
        return {"instance_events": EVENT_COLUMNS}

    def bind(self, ctx: JobUsageContext, side: dict[str, Any], grain: str | None) -> JobUsageContext:
        lookup = priority_lookup(side["instance_events"], top_level_only=False, what="job-usage priority lookup")
        collections, key_collection = unique_codes(lookup.collection)
        return replace(ctx, lookup=lookup, collections=collections, key_collection=key_collection)

    # ---------------------------------------------------------------- partial / kinds
    def partial(self, cols: dict[str, Any], ctx: JobUsageContext, backend: Any) -> dict[str, Any]:
        xp = backend.xp
        s, e = cols["start_time"], cols["end_time"]
        n = int(s.shape[0])
        stats = dict.fromkeys(_STATS, 0)
        stats["rows"] = n
        if self.rows == "jobs":
            use = cols["collection_type"] == int(CollectionType.JOB)
        else:
            a = cols["alloc_collection_id"]
            use = (a == 0) | is_null_int(xp, a)
        ok = (e > s) & (e != TIME_AFTER_TRACE)
        keep = use & ok
        used = int(xp.count_nonzero(keep))
        stats["bad_duration_rows"] = int(xp.count_nonzero(use)) - used
        stats["used_rows"] = used
        if used == 0:
            out = self.kinds.empty(backend, on_backend=True)
            out["stats"] = xp.asarray(np.array([stats[k] for k in _STATS], np.int64))
            return out
        # every row counts: no gathers (the lookup probes the columns as they are)
        r = None if used == n else xp.nonzero(keep)[0]
        n_coll = int(ctx.collections.shape[0])
        if (
            backend.ops.lookup_slot_tables
            and 0 < len(ctx.lookup) <= 4 * used + (1 << 16)
            and len(ctx.lookup) < _MAX_TABLE_KEYS
        ):
            # host arrays (the cpu backend): one pass of blocks through the lookup's key table
            table = key_table(ctx.lookup, ctx.key_collection, n_coll)
            dense, extra, unknown = group_windows(table, ctx.collections, cols, r, used)
            for res in ("cpu", "mem"):
                stats[f"unknown_{res}_rows"] = unknown[res]
            out = {**dense, **{"x" + k: v for k, v in extra.items()}}
            out["stats"] = np.array([stats[k] for k in _STATS], np.int64)
            return out

        def pick(a: Any) -> Any:
            return a if r is None else a[r]

        hours = (pick(e) - pick(s)).astype(xp.float64) / _HOUR_US
        c = pick(cols["collection_id"]).astype(xp.int64)
        vals = {}
        for res in ("cpu", "mem"):
            v = pick(cols["avg_" + res]).astype(xp.float64)
            known = xp.isfinite(v)
            stats[f"unknown_{res}_rows"] = used - int(xp.count_nonzero(known))
            vals[res] = xp.where(known, v * hours, 0.0)
        if n_coll <= 4 * used + (1 << 16):
            out = self._by_code(backend, ctx, cols, r, c, vals)
        else:  # the lookup's collections far outnumber this partition's rows: group by a sort
            found, p = ctx.lookup.find(
                backend, cols["collection_id"], cols["instance_index"], cols["machine_id"], rows=r
            )
            out = self._by_sort(backend, c, xp.where(found, p, -1).astype(xp.int64), vals)
        out.update({"x" + k: v for k, v in _empty_keyed(xp).items()})
        out["stats"] = xp.asarray(np.array([stats[k] for k in _STATS], np.int64))
        return out

    @staticmethod
    def _by_code(
        backend: Any, ctx: JobUsageContext, cols: dict[str, Any], r: Any, c: Any, vals: dict[str, Any]
    ) -> dict[str, Any]:
        """Per collection sums by dense code: a window's code is its key's collection in the
        lookup's table; the collections of windows whose key has no events get codes after
        those.  ``bincount`` adds each code's windows in row order (as the sort path does).
        ``r``: the rows that count (``None``: all), ``c`` and ``vals`` already theirs."""
        xp = backend.xp
        at = ctx.lookup.index(backend, cols["collection_id"], cols["instance_index"], cols["machine_id"], rows=r)
        coll = backend.stage(ctx.collections)
        found = at >= 0
        at = xp.maximum(at, 0)
        key_coll = backend.stage(ctx.key_collection)
        code = xp.where(found, key_coll[at], -1) if int(key_coll.shape[0]) else xp.full(at.shape[0], -1, dtype=xp.int64)
        n_coll = int(coll.shape[0])
        miss = xp.nonzero(~found)[0]
        ids = coll
        if int(miss.shape[0]):
            u = xp.unique(c[miss])
            pos = xp.searchsorted(coll, u)
            known = (
                (pos < n_coll) & (coll[xp.minimum(pos, max(n_coll - 1, 0))] == u)
                if n_coll
                else xp.zeros(u.shape[0], dtype=bool)
            )
            code[miss] = xp.where(known, pos, n_coll + xp.cumsum(~known) - 1)[xp.searchsorted(u, c[miss])]
            ids = xp.concatenate([coll, u[~known]])
        total = int(ids.shape[0])
        windows = bincount(xp, code, minlength=total)
        present = xp.nonzero(windows > 0)[0]
        prio = xp.full(total, -1, dtype=xp.int32)
        backend.ops.scatter_max(prio, code[found], backend.stage(ctx.lookup.code)[at[found]])
        out = {
            "key": ids[present],
            "cpu": bincount(xp, code, weights=vals["cpu"], minlength=total)[present],
            "mem": bincount(xp, code, weights=vals["mem"], minlength=total)[present],
            "windows": windows[present].astype(xp.int64),
            "prio": prio[present].astype(xp.int64),
        }
        if total > n_coll:  # codes past the table's collections: keys no longer in order
            order = xp.argsort(out["key"])
            out = {k: v[order] for k, v in out.items()}
        return out

    @staticmethod
    def _by_sort(backend: Any, c: Any, prio: Any, vals: dict[str, Any]) -> dict[str, Any]:
        """Per collection sums by one stable sort of the collection ids (sums by run, in row
        order within a run) and MAX(priority) by a running maximum."""
        xp = backend.xp
        order = backend.ops.stable_argsort(c)
        cs = c[order]
        first = xp.ones(cs.shape[0], dtype=bool)
        first[1:] = cs[1:] != cs[:-1]
        g = xp.cumsum(first) - 1
        G = int(g[-1]) + 1
        out = {"key": cs[first]}
        for res in ("cpu", "mem"):
            out[res] = bincount(xp, g, weights=vals[res][order], minlength=G)
        out["windows"] = bincount(xp, g, minlength=G).astype(xp.int64)
        # MAX(priority) per collection: a running maximum of run * W + priority (the run number
        # dominates, so it restarts at each run) read at each run's last row
        width = int(prio.max()) + 2
        run_max = backend.ops.cummax_rows((g * width + prio[order] + 1).reshape(1, -1)).reshape(-1)
        last = xp.concatenate([xp.nonzero(first)[0][1:] - 1, xp.asarray([cs.shape[0] - 1])])
        out["prio"] = run_max[last] - xp.arange(G, dtype=xp.int64) * width - 1
        return out

    @property
    def kinds(self) -> Fields:
        """The per-collection partial at the top level (:func:`_merge_collections`: merge_keyed's
        sums, the priority by maximum, with the same-keys fast path), the collections without
        events beside it (``x*``, keyed), and the counters."""
        return Fields(
            {
                "collections": Flat(Merged(_merge_collections, empty=_empty_keyed, device=True), "", _FIELDS),
                "extra": Flat(Keyed(fields=_DTYPES, maxima=("prio",)), "x", _FIELDS),
                "stats": Sum((len(_STATS),), np.int64),
            }
        )

    # ---------------------------------------------------------------- finalize
    #: its finalize sorts the collections (a row each, ~40 B) and their tiers' totals, which a gpu
    #: run does on the device, where a partial of one partition stays (only the tables come back)
    device_partial = True

    def finalize(self, partial: dict[str, Any], ctx: JobUsageContext) -> dict[str, pa.Table]:
        """Arrow tables, built from the arrays without pandas (see :mod:`gpuclust.tables`); the
        sorts, sums and fits on the partial's backend (:mod:`~gpuclust.analyses._job_stats`)."""
        p = dict(partial)
        xp = backend_of(p["key"]).xp
        # the collections with windows (the cpu path's dense partials hold every code of the
        # lookup), and those of windows whose collection has no events
        keep = p["windows"] > 0
        main = {f: p[f][keep] for f in _FIELDS}
        if int(p["xkey"].shape[0]):
            main = merge_keyed(main, {f: p["x" + f] for f in _FIELDS}, maxima=("prio",), xp=xp)
        p.update(main)
        names = ctx.tier_names
        prio = p["prio"].astype(xp.int64)
        code = tier_codes(xp, ctx.tier_map, prio, len(names) - 1)  # -1 (no priority known): unknown
        key, cpu = p["key"].astype(xp.int64), p["cpu"].astype(xp.float64)
        order = by_usage(cpu, key)  # NCU-hours descending, then collection_id
        key, cpu, code = key[order], cpu[order], code[order]
        mem, windows = p["mem"].astype(xp.float64)[order], p["windows"].astype(xp.int64)[order]
        host_code = to_host(code)
        jobs = table(
            {
                "collection_id": to_host(key),
                "tier": labels(names, host_code),
                "ncu_hours": to_host(cpu),
                "nmu_hours": to_host(mem),
                "windows": to_host(windows),
            }
        )
        rows, corr = [], []
        counts = np.bincount(host_code, minlength=len(names))
        for i, t in enumerate((*names, "all")):
            sel = None if t == "all" else code == i  # the rows of tier t
            if (key.shape[0] if sel is None else int(counts[i])) == 0:
                continue
            xs = {res: x if sel is None else x[sel] for res, x in (("cpu", cpu), ("mem", mem))}
            for res, x in xs.items():
                pos = x[x > 0]
                got = {**job_stats(pos, float(self.tail)), "zero_jobs": int(x.shape[0] - pos.shape[0])}
                rows.append({"tier": t, "resource": res, **{c: got[c] for c in STAT_COLUMNS}})
            both = (xs["cpu"] > 0) & (xs["mem"] > 0)
            a, b = xs["cpu"][both], xs["mem"][both]
            corr.append(
                {
                    "tier": t,
                    "jobs": int(a.shape[0]),
                    "pearson_r": pearson(a, b),
                    "log_pearson_r": pearson(xp.log10(a), xp.log10(b)) if a.size else np.nan,
                }
            )
        st = dict(zip(_STATS, (int(v) for v in to_host(p["stats"])), strict=True))
        info = table_from_rows(
            [
                {
                    "analysis": self.name,
                    "rows_rule": self.rows,
                    "tail": float(self.tail),
                    "tier_map": ctx.tier_map.name,
                    "tiers": ",".join(names),
                    "collections": int(key.shape[0]),
                    **st,
                }
            ]
        )
        return {
            "jobs": jobs,
            "stats": rows_table(rows, _STATS_SCHEMA),
            "correlation": rows_table(corr, _CORR_SCHEMA),
            "info": info,
        }

    def summary(self, result: dict[str, Any]) -> str:
        info = as_arrow(result["info"]).to_pylist()[0]
        lines = [
            f"{self.label}: {info['collections']:,} collections from {info['used_rows']:,} windows "
            f"(rows: {info['rows_rule']}), tier map {info['tier_map']!r}"
        ]
        for r in as_arrow(result["stats"]).to_pylist():
            lines.append(
                f"  {r['tier']:>8} {r['resource']}: {r['jobs']:,} jobs, {fmt(r['total_hours'], '.4g')} h; top 1% "
                f"{fmt(r['top1pct_share'], '.1%')}, top 0.1% {fmt(r['top01pct_share'], '.1%')}; median "
                f"{fmt(r['median'], '.3g')} h, p99 {fmt(r['p99'], '.3g')} h; C² {fmt(r['scv'], '.3g')}; "
                f"Pareto alpha {fmt(r['pareto_alpha'], '.3g')} (R² {fmt(r['pareto_r2'], '.3f')})"
            )
        return "\n".join(lines)


#: The ``stats`` and ``correlation`` tables' columns (an empty table keeps them).
_STATS_SCHEMA = pa.schema(
    [
        ("tier", pa.string()),
        ("resource", pa.string()),
        ("jobs", pa.int64()),
        ("zero_jobs", pa.int64()),
        *((c, pa.float64()) for c in STAT_COLUMNS[2:]),
    ]
)
_CORR_SCHEMA = pa.schema(
    [("tier", pa.string()), ("jobs", pa.int64()), ("pearson_r", pa.float64()), ("log_pearson_r", pa.float64())]
)
