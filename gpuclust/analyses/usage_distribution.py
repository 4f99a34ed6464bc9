"""``usage-distribution``: the exact CPU usage distribution of groups of usage windows.

A window's 20 CPU percentiles define a piecewise-linear CDF (a flat step is a point mass); a
group's distribution is the mixture of its windows' CDFs weighted by sample count
(``duration_s x sample_rate``, or ``duration_s`` when the rate is missing or 0).  See
``docs/analyses/usage-distribution.md`` (meaning, options, columns, strategies, error bound) and
``docs/analyses/mixture.md`` (the ops and the mergeable summaries this analysis is built on).

Groups: any combination (option ``by``) of ``instance`` (collection_id, instance_index),
``collection``, ``machine``, ``tier`` (MAX(priority) per (collection_id, instance_index,
machine_id) from instance_events, mapped by a tier map; no event row / NULL or negative priority
= ``unknown``), ``cell`` and ``time`` (buckets of ``bucket_s`` seconds; a window crossing buckets
gives each bucket its overlap fraction of the weight, with its whole percentile shape).

Rows (option ``rows``): ``auto`` keeps every row when ``by`` contains ``instance`` or
``collection`` (a group never holds a task and the alloc instance it runs in) and otherwise only
top-level rows (alloc_collection_id NULL or 0): machine / tier / cell / time groups would
otherwise count a task's usage twice, once in its own rows and once in its alloc instance's.

Strategies (option ``strategy``): ``exact`` (partials carry every window), ``exact-two-pass``
(passes that bracket every quantile, then one that carries only what lies inside:
:mod:`gpuclust.analyses._usage_distribution_two_pass`), ``bounded`` (a fixed-size summary per
group, with a tracked bound), ``auto`` (exact up to ``exact_max_windows`` rows, by default 2e6 by
tier / cell and 5e6 otherwise and none on a device, within the run's memory budget, or when groups
are whole in each partition; else exact-two-pass).

The group tables and the text summary: :mod:`gpuclust.analyses._usage_distribution_tables`; the
time pieces, group extras, merge and split of partials (their kinds, ``UsageFields``):
:mod:`gpuclust.analyses._usage_distribution_parts`.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import partial as bound
from typing import Any

import numpy as np

from gpuclust._lazy import pandas as pd
from gpuclust._memory import memory_budget, run_on_device
from gpuclust.analyses import _hybrid_summary as hs
from gpuclust.analyses import _usage_distribution_refine as rf
from gpuclust.analyses import _usage_distribution_slices as sl
from gpuclust.analyses import _usage_distribution_two_pass as tp
from gpuclust.analyses import mixture_summary as ms
from gpuclust.analyses._lookup import EVENT_COLUMNS, tier_lookup
from gpuclust.analyses._usage_distribution_context import UsageDistributionContext
from gpuclust.analyses._usage_distribution_parts import (
    _DONE_FIELDS,
    UsageFields,
    expand_pieces,
    finalize_mixture,
    group_components,
    group_extras,
    merge_partials,
    none_aware,
    used_windows,
)
from gpuclust.analyses._usage_distribution_tables import (
    _STD_LEVELS,
    _group_tables,
    _summary_text,
    heaviest_groups,  # noqa: F401 (re-exported)
    info_table,
    level_name,
)
from gpuclust.analyses.base import Analysis, to_host
from gpuclust.analyses.grouping import KEY_COLUMNS, group_key
from gpuclust.analyses.kinds import Concat, Keyed, Label, Merged, Sampled, Sum
from gpuclust.analyses.options import option, tier_map_option
from gpuclust.backends import finalize_backend
from gpuclust.layout import key_name
from gpuclust.parted import finalize_in_memory
from gpuclust.schema import CPU_PERCENTILE_COLUMNS_SORTED, US_PER_S
from gpuclust.tiers import resolve_tier_map

__all__ = [
    "BY",
    "ROWS",
    "STRATEGIES",
    "STATS",
    "UsageDistribution",
    "UsageDistributionBrackets",
    "UsageDistributionRefine",
    "level_name",
]

#: Grouping keys (option ``by``), in the order the registry lists them.
BY = ("tier", "time", "instance", "collection", "machine", "cell")
ROWS = ("auto", "top-level", "all")
STRATEGIES = ("auto", "exact", "exact-two-pass", "bounded")
#: Global counters kept in every partial (the ``info`` table), in this order.
STATS = (
    "windows_read",
    "alloc_task_windows",
    "bad_time_windows",
    "skipped_no_percentiles",
    "repaired",
    "used_windows",
    "zero_weight_windows",
    "pieces",
)
#: ``auto``'s defaults by grouping: few groups (``by`` within tier / cell, each group inverted at
#: once on one core), many (any other ``by``).  The exact strategy's row limit (option
#: ``exact_max_windows`` = -1; by tier, whole `analyze` on 2 cores at 1e6 / 2e6 / 4e6 rows: exact
#: 4.5 / 10 / 25 s, 1.4 / 2.9 / 5.5 GB; exact-two-pass 6.7 / 13.5 / 26 s, 1.3 / 2.3 / 2.6 GB); its
#: peak a row, which ``auto`` also keeps within the run's memory budget (:func:`memory_budget`;
#: measured at 4e6: by tier 1.4 kB, by machine 0.54 kB); the first-pass summary size of
#: exact-two-pass (option ``bracket_k`` = 0: few groups afford large ones, whose tight brackets keep
#: the second pass small; many keep small groups exact up to ``(k + 1) // 22`` windows).
EXACT_MAX_WINDOWS = (2_000_000, 5_000_000)
EXACT_BYTES_PER_ROW = (3000, 1000)
BRACKET_K = (32768, 4096)
#: Groups of one shard of the parted group tables (``instance`` in ``by``): one Parquet part.
SHARD_GROUPS = 1 << 18
#: Every SAMPLE_EVERY-th leading key of a partition's finished groups places the shard bounds.
SAMPLE_EVERY = 64


def _by_ok(by: tuple[str, ...]) -> bool:
    return len(set(by)) == len(by) and not {"instance", "collection"} <= set(by)


def _sorted_levels(levels: tuple[float, ...]) -> tuple[float, ...]:
    return tuple(sorted({float(x) for x in levels}))


@dataclass(frozen=True)
class UsageDistribution(Analysis):
    """Exact CPU usage distributions (mixtures of per-window percentile CDFs) per group.

    ``by`` is a sequence or a ``","``/``"+"``-separated string.  Time bucket ``k`` is
    ``[k*bucket_s, (k+1)*bucket_s)`` of trace time (origin 0, 600 s before the trace start),
    reported as ``bucket`` and ``bucket_start_us`` (see "Time buckets" in docs/user/dataset.md).
    ``levels`` are sorted, duplicates removed.

    Examples
    --------
    >>> UsageDistribution(by="tier,time", strategy="bounded").label
    'usage-distribution[by=tier+time,strategy=bounded]'
    """

    by: tuple[str, ...] = option(
        ("tier",),
        "one or more grouping keys, comma-separated (e.g. tier,time); time uses bucket_s",
        choices=BY,
        check=(_by_ok, "keys named once, not both instance and collection (an instance includes its collection)"),
        example="cell+time",
    )
    bucket_s: float = option(
        3600,
        "time bucket width in seconds (by=time)",
        gt=0,
        check=(lambda s: round(s * US_PER_S) >= 1, "at least one microsecond"),
        fmt="g",
    )
    levels: tuple[float, ...] | None = option(
        None,
        "quantile levels in [0, 1] (comma-separated); default: the 20 standard percentile levels",
        ge=0,
        le=1,
        normalize=_sorted_levels,
        check=(lambda v: len({level_name(x) for x in v}) == len(v), "levels at least 1e-12 apart (one column each)"),
        default_text="20 standard levels",
        fmt="g",
    )
    rows: str = option("auto", "auto = all rows for instance/collection groups, top-level rows otherwise", choices=ROWS)
    strategy: str = option(
        "auto",
        "exact = partials carry the windows; exact-two-pass = a bounded first pass brackets the quantiles, a "
        "second carries what lies inside; bounded = fixed-size summary with an error bound; auto = exact up "
        "to exact_max_windows usage rows (within the memory budget), else exact-two-pass",
        choices=STRATEGIES,
    )
    k: int = option(ms.DEFAULT_K, "bounded summary size (CDF error <= (1 + merge depth) / k)", ge=1)
    bracket_k: int = option(
        0, "first-pass summary size of exact-two-pass; 0 = 32768 when by is within tier/cell, else 4096", ge=0
    )
    refine: int = option(
        -1,
        "most refinement passes of exact-two-pass before its exact pass (each narrows the brackets to "
        "one of 8-1024 sub-bins while they leave over 4M pieces); -1 = by the rows",
        ge=-1,
    )
    slices: int = option(
        -1,
        "exact-two-pass by instance or collection: run its first pass once per slice of the collections "
        "(each holds that share of its state, each reads the data); -1 = by the rows",
        ge=-1,
    )
    exact_max_windows: int = option(
        -1, "row budget of strategy=auto for exact; -1 = 2e6 by tier/cell, else 5e6; none on a device", ge=-1
    )
    tier_map: str | None = tier_map_option("tier map for by=tier; default: the dataset's")

    name = "usage-distribution"
    table = "instance_usage"
    requires = ("instance_usage",)
    row_bytes = 448
    #: rows per partition for partitions="auto": one bucket of 1 Mi rows; larger partitions only
    #: raise the working set (the 20 percentile columns and their repaired copy per row)
    auto_partition_rows = 1 << 20
    optional_tables = ("instance_events",)
    table_uses = {"instance_events": "by=tier"}

    def needed_tables(self) -> tuple[dict[str, str], dict[str, str]]:
        """instance_events is read for ``by=tier`` only (the instances' priorities)."""
        return {"instance_usage": ""}, (
            {"instance_events": "by=tier: the instances' priorities"} if "tier" in self.by else {}
        )

    @property
    def bucket_us(self) -> int:
        return int(round(float(self.bucket_s) * US_PER_S))

    @property
    def level_values(self) -> np.ndarray:
        return _STD_LEVELS.copy() if self.levels is None else np.asarray(self.levels, dtype=np.float64)

    def resolved_rows(self) -> str:
        """``top-level`` or ``all`` (``auto``: all rows iff ``by`` has instance or collection)."""
        if self.rows != "auto":
            return self.rows
        return "all" if ("instance" in self.by or "collection" in self.by) else "top-level"

    def key_columns(self) -> list[str]:
        """Output key columns, in ``by`` order (``cell`` -> ``cell``; ``time`` -> ``bucket``,
        ``bucket_start_us``)."""
        out: list[str] = []
        for b in self.by:
            out.extend({"cell": ("cell",), "time": ("bucket", "bucket_start_us")}.get(b, KEY_COLUMNS[b]))
        return out

    @property
    def columns(self) -> tuple[str, ...]:
        return (
            "start_time",
            "end_time",
            "collection_id",
            "instance_index",
            "machine_id",
            "alloc_collection_id",
            "sample_rate",
            *CPU_PERCENTILE_COLUMNS_SORTED,
        )

    # ---------------------------------------------------------------- context (client side)
    def _total_rows(self, source: Any) -> int:
        if hasattr(source, "num_rows"):
            return int(source.num_rows(self.table))
        return int(source.read(self.table, ["start_time"]).num_rows)

    def resolved_strategy(self, source: Any, total: int | None = None) -> str:
        """``exact``, ``exact-two-pass`` or ``bounded`` on ``source`` (``auto``: exact up to the row
        budget, and at any size when groups are whole in each partition, else exact-two-pass);
        ``total``: the usage table's rows, when the caller has counted them."""
        if self.strategy != "auto":
            return self.strategy
        if total is None:
            total = self._total_rows(source)
        budget, limit = memory_budget(), self.exact_rows_limit
        fits = (limit < 0 or total <= limit) and (budget is None or total * self.exact_bytes_per_row <= budget)
        return "exact" if fits or self._groups_local(source) else "exact-two-pass"

    @property
    def _many(self) -> int:  # index of ``by``'s column in the per-grouping defaults: 0 few groups, 1 many
        return int(not set(self.by) <= {"tier", "cell"})

    @property
    def exact_rows_limit(self) -> int:
        """``auto``'s row limit of the exact strategy (option ``exact_max_windows``; -1: by ``by``,
        or none (-1) in a run on a device, where only the memory budget bounds it)."""
        if int(self.exact_max_windows) >= 0:
            return int(self.exact_max_windows)
        return -1 if run_on_device() else EXACT_MAX_WINDOWS[self._many]

    @property
    def exact_bytes_per_row(self) -> int:  # the exact strategy's peak a row that ``auto`` assumes
        return EXACT_BYTES_PER_ROW[self._many]

    @property
    def first_pass_k(self) -> int:  # the first pass's summary size (option ``bracket_k``; 0: by ``by``)
        return int(self.bracket_k) or BRACKET_K[self._many]

    def refine_passes(self, source: Any) -> int:
        """At most this many refinement passes (option ``refine``; -1: :func:`rf.rounds_for` the rows)."""
        if int(self.refine) >= 0:
            return int(self.refine)
        return rf.rounds_for(self._total_rows(source), int(self.level_values.shape[0]), self.first_pass_k)

    def prerequisites(self, source: Any) -> dict[str, Analysis]:
        """``exact-two-pass``: the pass whose result is each group's quantile brackets -- the
        bounded first pass (:class:`UsageDistributionBrackets`) or the last refinement pass
        (:class:`UsageDistributionRefine`, whose passes before it are its prerequisites)."""
        if self.resolved_strategy(source) != "exact-two-pass":
            return {}
        return {"brackets": self._pass_before(self.refine_passes(source), source)}

    def slices_of(self, source: Any) -> int:
        """The first pass's slices (:func:`sl.slices_for` option ``slices``, ``by`` and the rows)."""
        return sl.slices_for(self._total_rows(source) if int(self.slices) < 1 else 0, self.by, int(self.slices))

    def _pass_before(self, r: int, source: Any) -> Analysis:
        """The first pass (``r`` = 0: its last slice, whose slices before it are its prerequisites)
        or refinement pass ``r`` of this grouping."""
        same = dict(by=self.by, bucket_s=self.bucket_s, levels=self.levels, rows=self.rows, tier_map=self.tier_map)
        if r == 0:
            n = self.slices_of(source)
            cut = dict(slices=n, part=n - 1) if n > 1 else {}
            return UsageDistributionBrackets(**same, **cut, strategy="bounded", k=self.first_pass_k)  # type: ignore[arg-type]
        k, s = self.first_pass_k, self.slices
        return UsageDistributionRefine(**same, strategy="exact-two-pass", bracket_k=k, refine=r, slices=s)  # type: ignore[arg-type]

    def context(self, source: Any, prior: dict[str, dict[str, Any]] | None = None) -> UsageDistributionContext:
        total = self._total_rows(source)
        strategy = self.resolved_strategy(source, total)
        manifest = getattr(source, "manifest", None)
        cell = str(manifest.get("cell") or "all") if isinstance(manifest, dict) else "all"
        tm = resolve_tier_map(self.tier_map, source) if "tier" in self.by else None
        rows, limit = self.resolved_rows(), self.exact_rows_limit
        ctx = UsageDistributionContext(strategy, rows, total, self.level_values, cell, tm, row_limit=limit)
        if strategy != "exact-two-pass":
            return ctx
        if prior is None or "brackets" not in prior:
            raise RuntimeError(
                "usage-distribution: exact-two-pass needs its first pass (the engine runs prerequisites)"
            )
        kw = rf.bracket_fields(prior["brackets"]["brackets"], int(ctx.levels.shape[0]))
        return replace(ctx, bracket_k=self.first_pass_k, slices=self.slices_of(source), **kw)

    def _groups_local(self, source: Any) -> bool:
        """``by`` has ``instance`` and the source's usage table is bucketed by instance."""
        layout = getattr(source, "layout", None)
        lay = layout(self.table) if layout is not None else None
        if not lay:
            return False
        return "instance" in self.by and key_name(lay["key"]) == "instance"

    @property
    def side_inputs(self) -> dict[str, tuple[str, ...]]:
        return {"instance_events": EVENT_COLUMNS} if "tier" in self.by else {}

    def bind(self, ctx: UsageDistributionContext, side: dict[str, Any], grain: str | None) -> UsageDistributionContext:
        lk = ctx.lookup
        if "tier" in self.by:
            # All rows (allocs included), so that rows="all" can place tasks inside allocs.
            assert ctx.tier_map is not None  # context() resolves one when "tier" is in by
            n = len(ctx.tier_map.names)
            lk = tier_lookup(
                side["instance_events"],
                ctx.tier_map,
                top_level_only=False,
                unmatched=n,
                what="usage-distribution tier lookup",
            )
        local = grain == "instance" and "instance" in self.by and ctx.strategy == "exact"
        return replace(ctx, lookup=lk, local_groups=local)

    # ---------------------------------------------------------------- partial
    def _n_components(self) -> int:
        return sum(len(KEY_COLUMNS[b]) for b in self.by)

    def _tier(self, backend: Any, ctx: UsageDistributionContext, c: Any, i: Any, m: Any) -> Any:
        found, code = ctx.lookup.find(backend, c, i, m)
        return backend.xp.where(found, code, len(ctx.tier_names) - 1).astype(backend.xp.int64)

    def partial(self, cols: dict[str, Any], ctx: UsageDistributionContext, backend: Any) -> dict[str, Any]:
        xp, ops = backend.xp, backend.ops
        stats = dict.fromkeys(STATS, 0)
        idx, use, qr, w, s, e = used_windows(backend, cols, ctx.rows, ctx.slice_of, stats)  # counts into stats
        comps = group_components(cols, idx, self.by, bound(self._tier, backend, ctx))  # time: None, filled below
        src = use  # row of ``qr`` of each piece
        if "time" in self.by:
            row, bucket, frac = expand_pieces(xp, s, e, self.bucket_us)
            src = use[row]
            w = w[row] * frac
            comps = [bucket if c is None else c[row] for c in comps]
        else:
            frac = xp.ones(idx.shape[0], dtype=xp.float64)
        comps = [c.astype(xp.int64) for c in comps]
        m = int(src.shape[0])
        stats["pieces"] = m
        key = group_key(xp, comps, m)
        # sort the pieces by group once (stable: a group keeps its row order, so every per-group
        # sum below and downstream adds in the same order as before); the leaf, the group table
        # and the final inversion then see grouped rows (their sorts run on sorted input)
        order = ops.stable_argsort(key)
        key = key[order]
        w = w[order]
        frac = frac[order]
        comps = [c[order] for c in comps]
        qr = xp.take(qr, src[order], axis=0)  # row gather (faster than fancy indexing on the host)
        kc = xp.stack(comps, axis=1) if comps else xp.zeros((m, 0), dtype=xp.int64)
        out = {
            "backend": backend.name,
            "ms": None,
            "groups": group_extras(xp, ops, key, kc, frac, w, qr),
            "stats": xp.asarray(np.array([stats[s_] for s_ in STATS], dtype=np.int64)),
        }
        return {**out, **self._summaries(qr, w, key, ctx, backend)}

    def _summaries(self, qr: Any, w: Any, key: Any, ctx: UsageDistributionContext, backend: Any) -> dict[str, Any]:
        """The mixture part of a partial (grouped, repaired rows ``qr``, weights ``w``, sorted
        ``key``): the hybrid summary (``ms``), the finished groups (``done``) or the second pass
        of exact-two-pass (``tp``)."""
        if ctx.strategy == "exact-two-pass":
            return {"tp": tp.second_partial_of(backend, qr, w, key, ctx.br_key, ctx.br_lo, ctx.br_hi)}
        part = hs.leaf(qr, w, key, None if ctx.strategy == "exact" else int(self.k), repaired=True)
        if not ctx.local_groups:
            return {"ms": part}
        # every window of these groups is here: finalize them now (the partial is then a few
        # hundred bytes per group, whatever the groups' sizes)
        res = hs.finalize(part, ctx.levels)
        return {"ms": None, "done": {f: res[f] for f in _DONE_FIELDS}}

    # ---------------------------------------------------------------- merge
    @property
    def kinds(self) -> UsageFields:
        """Whole partials merge by :func:`merge_partials` (finished groups concatenated, open
        mixture states merged) and split by :func:`split_partial`; the rest of a split merges
        field by field, ``full`` (the whole merged partial, or None) by that merge; its keyed
        ``rows`` (finished groups, keyed by their leading key component) are sharded, one key
        per coordinate, when the group tables are parted.  The empty partial is an open one's
        identity (:func:`~gpuclust.analyses._usage_distribution_parts.open_fields`).  Two partials on
        a device merge there, but the one-pass exact strategy's, which hold every window."""
        return self._fields(merge_partials, device=self.strategy != "exact")

    def _fields(self, whole: Any, device: bool = True) -> UsageFields:
        kinds = {
            "backend": Label(),
            "stats": Sum(),
            "full": Merged(none_aware(whole)),
            "n": Sum(),
            "err_max": Merged(max),  # a Python float, as split_partial makes it (Max: a NumPy one)
            "sample": Concat(),
            "rows": Keyed(rows=True, per=(lambda ctx: 1) if self.parted else None),
        }
        return UsageFields(
            kinds,
            shard_by=Sampled(SHARD_GROUPS, whole="full") if self.parted else None,
            whole=whole,
            device=device,
            n_components=self._n_components(),
            n_levels=int(self.level_values.shape[0]),
            sample_every=SAMPLE_EVERY,
            n_stats=len(STATS),
        )

    # ---------------------------------------------------------------- finalize
    # With ``instance`` in ``by`` the group tables grow with the cell (a row per instance): they
    # are parted (gpuclust/parted.py).  On an instance-bucketed source each partition's finished
    # groups are spilled as rows and a shard is a range of the leading key (collection_id, ...);
    # otherwise (flat source, or not instance) the merged partial is finalized in one shard.
    @property
    def parted(self) -> tuple[str, ...]:  # type: ignore[override]
        return ("quantiles", "naive") if "instance" in self.by else ()

    #: its partial's mixture state is ~170 B a window (the exact strategy keeps every window's
    #: percentiles): 1.7 GB at 10^7 windows, which a gpu study would otherwise copy to the host
    #: and back to the device for the inversion
    device_partial = True

    def finalize(self, partial: dict[str, Any], ctx: UsageDistributionContext) -> dict[str, pd.DataFrame]:
        # a partial left on the device (device_partial): all but the mixture state or the second
        # pass's to the host (they stay for finalize_mixture / _finalize_two_pass, unless the
        # parted path merges and splits them)
        partial = {k: v if k in ("ms", "tp") and not self.parted else to_host(v) for k, v in partial.items()}
        if self.parted:
            return finalize_in_memory(self, partial, ctx)
        rest, keyed = self.kinds.split(partial)
        tables, extra = self.finalize_shard(keyed, rest, ctx, 0, 0)
        return {**tables, **self.finalize_parted(rest, ctx, {}, [extra])}

    def finalize_shard(
        self,
        keyed: dict[str, dict[str, np.ndarray]],
        rest: dict[str, Any],
        ctx: UsageDistributionContext,
        lo: int,
        hi: int,
    ) -> tuple[dict[str, pd.DataFrame], Any]:
        """The group tables of one shard: from the merged partial (``full``), or from the shard's
        finished rows; the extra is ``(groups, max CDF error bound)``."""
        full = rest["full"]
        if full is not None and "tp" in full:
            be = finalize_backend(full["backend"])  # where the partials were (a device, if here)
            res = tp.finalize_two_pass(full["tp"], ctx.br_key, ctx.br_lo, ctx.br_hi, ctx.levels, be)
            g = full["groups"]
            if not np.array_equal(np.asarray(res["key"]), np.asarray(g["key"])):
                raise RuntimeError("usage-distribution: second pass and group tables disagree (internal error)")
        elif full is not None:
            mp = full["ms"]
            if mp is None:
                mp = hs.empty(None if ctx.strategy == "exact" else int(self.k))
            res = finalize_mixture(mp, ctx.levels, full["backend"])
            g = full["groups"]
            if not np.array_equal(np.asarray(res["key"]), np.asarray(g["key"])):
                raise RuntimeError("usage-distribution: summary and group tables disagree (internal error)")
        else:
            r = keyed["rows"]
            res = {f: r[f] for f in _DONE_FIELDS if f != "key"}
            g = {k[2:]: v for k, v in r.items() if k.startswith("g_")}
        df, naive = self._group_tables(res, g, ctx)
        err = np.asarray(res["err_bound"], dtype=np.float64)
        return {"quantiles": df, "naive": naive}, (len(df), float(err.max()) if err.size else 0.0)

    def finalize_parted(
        self, rest: dict[str, Any], ctx: UsageDistributionContext, tables: dict[str, Any], extras: list[Any]
    ) -> dict[str, pd.DataFrame]:
        stats = dict(zip(STATS, (int(x) for x in np.asarray(rest["stats"])), strict=False))
        return {"info": info_table(self, ctx, stats, extras)}

    def _group_tables(
        self, res: dict[str, Any], g: dict[str, Any], ctx: UsageDistributionContext
    ) -> tuple[pd.DataFrame, pd.DataFrame]:
        """The ``quantiles`` and ``naive`` rows of groups ``res`` / ``g`` (aligned), sorted by key."""
        return _group_tables(self.by, self.bucket_us, self._n_components(), res, g, ctx)

    # ---------------------------------------------------------------- summary
    def summary(self, result: dict[str, pd.DataFrame], top: int = 12) -> str:
        return _summary_text(self.label, self.key_columns(), result, top)


@dataclass(frozen=True)
class _BracketsPass(UsageDistribution):
    """A pass of ``exact-two-pass`` before its exact one (not registered): its result is one
    table, ``brackets`` (:func:`~gpuclust.analyses._usage_distribution_two_pass.brackets_table`)."""

    @property
    def parted(self) -> tuple[str, ...]:  # type: ignore[override]
        return ()  # groups x levels x 2 numbers, whatever the grouping

    def summary(self, result: dict[str, pd.DataFrame], top: int = 12) -> str:
        return f"{self.label}: brackets of {len(result['brackets'])} groups"


@dataclass(frozen=True)
class UsageDistributionBrackets(_BracketsPass):
    """The first pass of ``exact-two-pass``: the ``bounded`` strategy of the same grouping (``k``:
    the first pass's summary size; summaries merged as a binary counter,
    :func:`~gpuclust.analyses._usage_distribution_two_pass.carry`); with ``slices`` > 1, its slice
    ``part`` of the collections (:mod:`~gpuclust.analyses._usage_distribution_slices`), the
    slices before it its prerequisites, their brackets added to its own."""

    name = "usage-distribution-brackets"
    part: int = option(0, "the slice of the collections this first pass reads (0 to slices - 1)", ge=0)

    def prerequisites(self, source: Any) -> dict[str, Analysis]:
        return {"brackets": replace(self, part=int(self.part) - 1)} if int(self.part) > 0 else {}

    def context(self, source: Any, prior: dict[str, dict[str, Any]] | None = None) -> UsageDistributionContext:
        ctx, n = super().context(source), sl.slices_for(0, self.by, int(self.slices))  # -1: not sliced
        if n <= 1:
            return ctx
        if not prior:  # the first slice
            return replace(ctx, slice_of=(0, n))
        kw = rf.bracket_fields(prior["brackets"]["brackets"], int(ctx.levels.shape[0]), cuts=False)
        return replace(ctx, slice_of=(int(self.part), n), **kw)

    def partial(self, cols: dict[str, Any], ctx: UsageDistributionContext, backend: Any) -> dict[str, Any]:
        out = super().partial(cols, ctx, backend)
        return {**out, "ms": None, "stack": [(1, out["ms"])]}  # a leaf: see tp.carry

    @property
    def kinds(self) -> UsageFields:
        """As :attr:`UsageDistribution.kinds`, whole partials merged by the first pass's merge
        (:func:`~gpuclust.analyses._usage_distribution_two_pass.first_pass_merge`)."""
        return self._fields(bound(tp.first_pass_merge, merge_rest=merge_partials))

    def finalize(self, partial: dict[str, Any], ctx: UsageDistributionContext) -> dict[str, pd.DataFrame]:
        own = tp.brackets_of_partial(partial, int(self.k), ctx.strategy, ctx.levels)
        before = None if ctx.br_key is None else dict(key=ctx.br_key, lo=ctx.br_lo, hi=ctx.br_hi, est=ctx.br_est)
        return {"brackets": tp.brackets_table(sl.joined(before, own))}


@dataclass(frozen=True)
class UsageDistributionRefine(_BracketsPass):
    """Refinement pass ``refine`` (>= 1) of ``exact-two-pass`` (:mod:`~gpuclust.analyses._usage_distribution_refine`)."""

    name = "usage-distribution-refine"

    def prerequisites(self, source: Any) -> dict[str, Analysis]:
        return {"brackets": self._pass_before(int(self.refine) - 1, source)}

    def partial(self, cols: dict[str, Any], ctx: UsageDistributionContext, backend: Any) -> dict[str, Any]:
        if not ctx.refine_bins:  # the brackets already promise few pieces: this pass does not cut
            return {**self.kinds.empty(backend), "rf": None}
        return super().partial(cols, ctx, backend)

    def _summaries(self, qr: Any, w: Any, key: Any, ctx: UsageDistributionContext, backend: Any) -> dict[str, Any]:
        return {"rf": rf.refine_partial_of(backend, qr, w, key, ctx.br_key, ctx.br_lo, ctx.br_hi, ctx.refine_bins)}

    @property
    def kinds(self) -> UsageFields:
        """As :attr:`UsageDistribution.kinds`, the refinement states merged by :func:`rf.merge_partials`."""
        return self._fields(bound(rf.merge_partials, merge_rest=merge_partials))

    def finalize(self, partial: dict[str, Any], ctx: UsageDistributionContext) -> dict[str, pd.DataFrame]:
        return {"brackets": rf.refined_table(partial.get("rf"), ctx)}
