"""``usage-vs-request``: usage against the limit the scheduler was given (Borg, EuroSys 2015,
§5.5), per usage window (``summary``, ``hist``) and per task (``task_summary``, ``task_hist``:
Figure 11's quantity, a CDF over tasks, prod against non-prod; :mod:`._task_ratios`).

Each usage window is joined *as of* its start to its instance's request: per resource, the
``req_cpu`` (``req_mem``) of the latest event of the same (``collection_id``,
``instance_index``) at or before the window's ``start_time`` whose request is positive (the
instance's limit then; events at the same microsecond as the start count).  Then per window and
resource, the ratios of the average and of the maximum usage to that limit:

* a window whose instance has no such event is counted as ``no_limit`` (and left out of the
  ratios); a NULL usage as ``unknown``;
* the share of windows above their limit (ratio > 1) and at most half of it (<= 0.5) are exact
  counts; the distribution is kept in the fixed log bins of ``usage-change``
  (:data:`gpuclust.analyses.usage_change.RATIO_EDGES`, 100 per decade from 10^-6 to 10^6), its
  quantiles resolved to a bin (the exact one lies in ``[q, the bin's upper edge)``, under 2.4%
  above ``q``); the mean is exact up to float rounding.

By tier (the instance's highest priority, as ``usage-distribution`` and ``usage-change`` look it
up) and over all (``"all"``).  The join needs the instance's events, not all its windows: on an
instance-bucketed dataset each partition's events are bound in the partition; on a flat one,
once on the client (as ``overcommit``).  On the cpu backend a window's tier and limits come from
one slot of :class:`~gpuclust.analyses._requests.KeyedSlots` (one random read per window), its
ratio's bin from a table of the float's exponent and top mantissa bits (:func:`refined_bins`).
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import pyarrow as pa

from gpuclust._cache import PerArrayCache
from gpuclust._parallel import threads
from gpuclust._xp import bincount
from gpuclust.analyses._lookup import EVENT_COLUMNS, TierLookupContext, tier_lookup
from gpuclust.analyses._requests import (
    REQUEST_COLUMNS,
    KeyedRuns,
    KeyedSlots,
    ReadOnce,
    RequestTimeline,
    asof_keyed,
    asof_keyed_slots,
)
from gpuclust.analyses._task_ratios import (
    TASK_COLUMNS,
    TASKS,
    TaskAccumulator,
    ratio_schemas,
    task_tables,
)
from gpuclust.analyses.base import Analysis, fmt, to_host
from gpuclust.analyses.grouping import FloatBins
from gpuclust.analyses.kinds import Fields, Label, Sum
from gpuclust.analyses.options import tier_map_option
from gpuclust.analyses.usage_change import RATIO_EDGES
from gpuclust.arrow_numpy import bin_table, rows_table, table_from_rows
from gpuclust.backends import finalize_backend
from gpuclust.partials import bin_quantile_edges
from gpuclust.tables import as_arrow
from gpuclust.tiers import TIER_SLOTS, check_tier_slots, resolve_tier_map

__all__ = ["MEASURES", "UsageVsRequest", "refined_bins"]

_runs_cache = PerArrayCache()

#: (measure name, usage column, request index): 0 = CPU, 1 = memory.
MEASURES = (("cpu_avg", "avg_cpu", 0), ("cpu_max", "max_cpu", 0), ("mem_avg", "avg_mem", 1), ("mem_max", "max_mem", 1))
_M = len(MEASURES)
_B = int(RATIO_EDGES.shape[0]) + 1
_T = TIER_SLOTS  # tier slots: the most tiers a tier map may have, plus "unknown"
_COUNTS = ("windows", "no_limit", "unknown", "defined", "above_limit", "at_most_half")
#: The bins of 0.5 and of 1.0: a ratio <= 0.5 is in a bin <= _B05, one in (0.5, 1] in [_B05, _B1], one > 1 in a bin >= _B1.
_B05 = int(np.searchsorted(RATIO_EDGES, 0.5, side="right"))
_B1 = int(np.searchsorted(RATIO_EDGES, 1.0, side="right"))
#: Codes per tier: no limit, unknown usage, then the refined bins (x = bin + [ratio > 0.5] + [ratio > 1]).
_K = 2 + _B + 2
#: The refined bins' edges: ``x = searchsorted(_REFINED, ratio, side="right")`` (a ratio > 0.5 is one
#: >= the next float after 0.5).
_REFINED = np.sort(np.concatenate([RATIO_EDGES, np.nextafter([0.5, 1.0], np.inf)]))
#: :func:`refined_bins`' table: each octave of ratios from 2^-20 (< 1e-6) to 2^20 (> 1e6) in 2^9 cells,
#: each holding at most one edge of _REFINED.
_RATIO_BINS = FloatBins(_REFINED, bits=9, lo=2.0**-20, hi=2.0**20, what="usage-vs-request ratio bins")


def refined_bins(xp: Any, ratio: Any, cells: Any = None, edges: Any = None) -> Any:
    """``searchsorted(_REFINED, ratio, side="right")`` (int64) for any ``ratio`` but NaN (``-0.0``
    and below: 0; ``inf``: the last), i.e. the ratio's bin of :data:`RATIO_EDGES` plus
    ``[ratio > 0.5] + [ratio > 1]``: its cell's bin from a table (the float's exponent and top
    mantissa bits), plus one where the cell's edge lies at or below the ratio.

    >>> r = np.array([-1.0, 0.0, 1e-7, 0.5, np.nextafter(0.5, 1), 1.0, np.nextafter(1.0, 2), 1e7, np.inf])
    >>> (refined_bins(np, r) == np.searchsorted(_REFINED, r, side="right")).all()
    np.True_
    """
    return _RATIO_BINS.bins(xp, ratio, cells, edges)


def _split(xp: Any, x: Any) -> tuple[Any, Any, Any]:
    """Counts by refined bin ``x = bin + [ratio > 0.5] + [ratio > 1]`` (the last axis, ``_B + 2``)
    -> counts by bin, of ratios <= 0.5 and of ratios > 1: a ratio <= 0.5 has ``x = bin <= _B05``,
    one in (0.5, 1] ``x = bin + 1`` in ``[_B05 + 1, _B1 + 1]``, one > 1 ``x = bin + 2 >= _B1 + 2``."""
    hist = xp.zeros((*x.shape[:-1], _B), dtype=x.dtype)
    hist[..., : _B05 + 1] += x[..., : _B05 + 1]
    hist[..., _B05 : _B1 + 1] += x[..., _B05 + 1 : _B1 + 2]
    hist[..., _B1:] += x[..., _B1 + 2 :]
    return hist, x[..., : _B05 + 1].sum(-1), x[..., _B1 + 2 :].sum(-1)


@dataclass(frozen=True)
class UsageVsRequestContext(TierLookupContext):
    """:class:`TierLookupContext` plus the request timelines ``bind`` builds."""

    requests: RequestTimeline = field(default_factory=RequestTimeline)
    #: per event of ``requests`` (and a last row for no event, index -1), the CPU and memory limit as
    #: of it: the request of the instance's latest event at or before it with that request positive
    #: (NaN: none)
    limits: np.ndarray = field(default_factory=lambda: np.full((1, 2), np.nan))
    #: ``lookup`` (the tier codes) with each key's instance run in ``requests``: one probe per window
    #: (None: built when first needed, see :meth:`UsageVsRequest.keyed_runs`)
    runs: KeyedRuns | None = field(default_factory=KeyedRuns)
    #: ``lookup``, ``requests`` and ``limits`` in the cpu backend's one-gather table (None: the
    #: limits are not all float32 values; ``runs`` then)
    slots: KeyedSlots | None = None


@dataclass(frozen=True)
class UsageVsRequest(Analysis):
    """Usage / limit per window (average and maximum, CPU and memory), by tier.

    Examples
    --------
    >>> UsageVsRequest(tier_map="v3-doc").label
    'usage-vs-request[tier_map=v3-doc]'
    """

    tier_map: str | None = tier_map_option()

    name = "usage-vs-request"
    table = "instance_usage"
    requires = ("instance_usage", "instance_events")
    #: tracemalloc peak of partial per row: the per-window tables' 240, plus about 110 for the
    #: per-task grouping (the hashes, their sort, each window's task, weight, tier and limits)
    row_bytes = 350
    auto_partition_rows = 1 << 20

    @property
    def columns(self) -> tuple[str, ...]:
        return (
            "start_time",
            "collection_id",
            "instance_index",
            "machine_id",
            "avg_cpu",
            "max_cpu",
            "avg_mem",
            "max_mem",
            *TASK_COLUMNS,
        )

    def context(self, source: Any) -> UsageVsRequestContext:
        tm = check_tier_slots("usage-vs-request", resolve_tier_map(self.tier_map, source))
        return UsageVsRequestContext(tm)

    @property
    def side_inputs(self) -> dict[str, tuple[str, ...]]:
        return {"instance_events": tuple(dict.fromkeys((*EVENT_COLUMNS, *REQUEST_COLUMNS)))}

    def bind(self, ctx: UsageVsRequestContext, side: dict[str, Any], grain: str | None) -> UsageVsRequestContext:
        # the events read once for both (the columns of both)
        ev = ReadOnce(side["instance_events"], self.side_inputs["instance_events"])

        def lookup(ev: Any) -> tuple[Any, KeyedSlots | None]:
            lk = tier_lookup(
                ev,
                ctx.tier_map,
                top_level_only=False,
                unmatched=len(ctx.tier_map.names),
                what="usage-vs-request tier lookup",
            )
            return lk, KeyedSlots.start(lk)  # the cpu backend's table: its keys (no timeline needed)

        # the tier lookup (with the slot table's keys) and the request timeline from the same
        # events: on two threads where the client may use them (NumPy's sorts hold no GIL)
        if threads() > 1:
            with ThreadPoolExecutor(max_workers=1, thread_name_prefix="gpuclust-bind") as pool:
                fut = pool.submit(lookup, ev)
                rq, limits = self._timeline(ev)
                lk, slots = fut.result()
        else:
            lk, slots = lookup(ev)
            rq, limits = self._timeline(ev)
        # the table's timeline part (None where the limits are not float32 values: the records of
        # ``runs`` then, as on the gpu backend, which builds them when it first needs them)
        del ev  # the events' memory, reused by what follows
        slots = None if slots is None else slots.fill(rq, limits)
        runs = KeyedRuns.build(lk, rq) if slots is None else None
        return replace(ctx, lookup=lk, requests=rq, limits=limits, runs=runs, slots=slots)

    @staticmethod
    def _timeline(ev: Any) -> tuple[RequestTimeline, np.ndarray]:
        rq = RequestTimeline.build(ev)
        limits = np.full((int(rq.key.shape[0]) + 1, 2), np.nan)
        for r in (0, 1):
            at = np.append(rq.latest(rq.req[:, r] > 0), -1)
            limits[:, r] = np.where(at >= 0, np.append(rq.req[:, r], 0.0)[at], np.nan)
        return rq, limits

    # ---------------------------------------------------------------- partial / merge
    def partial(self, cols: dict[str, Any], ctx: UsageVsRequestContext, backend: Any) -> dict[str, Any]:
        xp = backend.xp
        s = cols["start_time"]
        n = int(s.shape[0])
        if n == 0:
            return self.kinds.empty(backend, on_backend=True)
        # a block of rows at a time where the backend asks for it (the cpu backend: every
        # intermediate stays in cache)
        block = backend.ops.lookup_block_rows or n
        counts = xp.zeros((_M, _T * _K), dtype=xp.int64)
        rsum = xp.zeros((_M, _T))
        acc = TaskAccumulator(backend, cols)
        slots = ctx.slots if backend.ops.lookup_slot_tables else None
        if slots is not None:
            # host arrays (the cpu backend): one gather per window in the key's slot (see KeyedSlots);
            # blocks of lookup_block_rows (a quarter, the gathered slots in L2, handed the GIL between
            # the engine's threads five times as often: 25k context switches at 1.6e7 windows, not 5k,
            # and more system time than the cache saved)
            for lo in range(0, n, block):
                self._block_slots(cols, slice(lo, min(n, lo + block)), ctx, slots, backend, counts, rsum, acc)
        else:
            runs = self.keyed_runs(ctx)
            for lo in range(0, n, block):
                self._block(cols, slice(lo, min(n, lo + block)), ctx, runs, backend, counts, rsum, acc)
        c = counts.reshape(_M, _T, _K).transpose(1, 0, 2)
        hist, half, above = _split(xp, c[:, :, 2:])
        out = {
            "counts": xp.stack([c.sum(2), c[:, :, 0], c[:, :, 1], hist.sum(2), above, half], 2).astype(xp.int64),
            "hist": hist.astype(xp.int64),
            "rsum": rsum.T.copy(),
            **acc.result(),
            "backend": backend.name,
        }
        return out

    @staticmethod
    def keyed_runs(ctx: UsageVsRequestContext) -> KeyedRuns:
        """``ctx.runs``, built once per lookup where ``bind`` left it out (thread-safe)."""
        if ctx.runs is not None:
            return ctx.runs
        return _runs_cache.get(
            ctx.lookup.hash, lambda _h: KeyedRuns.build(ctx.lookup, ctx.requests), (id(ctx.requests),)
        )

    @staticmethod
    def _block(
        cols: dict[str, Any],
        sl: slice,
        ctx: UsageVsRequestContext,
        runs: KeyedRuns,
        backend: Any,
        counts: Any,
        rsum: Any,
        acc: TaskAccumulator,
    ) -> None:
        """Rows ``sl`` joined by :func:`~gpuclust.analyses._requests.asof_keyed` (per window its
        tier and the latest event of its instance at or before its start), then counted
        (:meth:`_count`)."""
        xp = backend.xp
        found, code, j = asof_keyed(
            backend,
            ctx.requests,
            runs,
            cols["collection_id"][sl],
            cols["instance_index"][sl],
            cols["machine_id"][sl],
            cols["start_time"][sl],
        )
        limit = xp.take(backend.stage(ctx.limits), j, axis=0)  # j = -1 (none): the last row, NaN
        nt = len(ctx.tier_map.names)
        tier = xp.where(found, code, nt)
        UsageVsRequest._count(
            xp,
            cols,
            sl,
            tier,
            (limit[:, 0], limit[:, 1]),
            backend.stage(_RATIO_BINS.cells),
            backend.stage(_RATIO_BINS.edges),
            counts,
            rsum,
        )
        acc.add(sl, tier, nt, limit[:, 0], limit[:, 1])

    @staticmethod
    def _block_slots(
        cols: dict[str, Any],
        sl: slice,
        ctx: UsageVsRequestContext,
        slots: Any,
        backend: Any,
        counts: Any,
        rsum: Any,
        acc: TaskAccumulator,
    ) -> None:
        """:meth:`_block` on the cpu backend: each window's tier and limits from its key's slot
        (:func:`~gpuclust.analyses._requests.asof_keyed_slots`), the same codes and sums."""
        found, code, lim0, lim1 = asof_keyed_slots(
            backend,
            ctx.requests,
            slots,
            ctx.limits,
            cols["collection_id"][sl],
            cols["instance_index"][sl],
            cols["machine_id"][sl],
            cols["start_time"][sl],
        )
        nt = len(ctx.tier_map.names)
        tier = np.where(found, code, nt)
        UsageVsRequest._count(np, cols, sl, tier, (lim0, lim1), _RATIO_BINS.cells, _RATIO_BINS.edges, counts, rsum)
        acc.add(sl, tier, nt, lim0, lim1)

    @staticmethod
    def _count(
        xp: Any,
        cols: dict[str, Any],
        sl: slice,
        tier: Any,
        limits: tuple[Any, Any],
        cells: Any,
        cell_edges: Any,
        counts: Any,
        rsum: Any,
    ) -> None:
        """Rows ``sl`` (``tier``: each row's tier code, ``limits``: its CPU and memory limit, NaN
        for none): their codes counted into ``counts`` and their ratios (0 where not defined)
        summed per tier into ``rsum``, in row order after the sums so far: each ``bincount`` starts
        with one row per tier weighted by its sum so far, so the sums are the same bits whatever
        the blocks (on a device, :func:`gpuclust._xp.bincount` sums a thread block's rows in
        shared memory where the bins fit, as the ``_T`` ratio sums do)."""
        m = int(tier.shape[0])

        def tally(codes: Any, n: int, w: Any = None) -> Any:
            return bincount(xp, codes, weights=w, minlength=n, bounded=True)

        tiers = xp.empty(_T + m, dtype=xp.int64)  # the tier slots, then the rows' tiers
        tiers[:_T] = xp.arange(_T)
        tiers[_T:] = tier
        weights = xp.empty(_T + m)  # the sums so far, then the rows' ratios
        # one code per window and measure, counted per tier by one bincount: 0 no limit, 1 unknown
        # usage, else 2 + the ratio's bin refined at 0.5 and 1 (see _split)
        base = tiers[_T:] * _K
        defined = base + 2
        res: dict[int, tuple[Any, Any, Any]] = {}
        for k, (_, col, r) in enumerate(MEASURES):
            if r not in res:
                lim = limits[r]
                has_lim = lim > 0  # NaN: no limit
                res[r] = lim, has_lim, base + has_lim
            lim, has_lim, other = res[r]
            u = cols[col][sl]
            d = has_lim & xp.isfinite(u)
            ratio = weights[_T:]
            xp.divide(u, lim, out=ratio)  # float64, as u.astype(float64) / limit
            ratio[~d] = 0.0
            x = refined_bins(xp, ratio, cells, cell_edges)
            x += defined
            counts[k] += tally(xp.where(d, x, other), _T * _K)
            weights[:_T] = rsum[k]
            rsum[k] = tally(tiers, _T, weights)  # + 0.0 per other window

    @property
    def kinds(self) -> Fields:
        """The per-window counts, bins and ratio sums (dense: tier slots x measures) and the
        per-task partial (:data:`~gpuclust.analyses._task_ratios.TASKS`, keyed by task)."""
        return Fields(
            {
                "counts": Sum((_T, _M, len(_COUNTS)), np.int64),
                "hist": Sum((_T, _M, _B), np.int64),
                "rsum": Sum((_T, _M)),
                "task": TASKS,
                "backend": Label(),
            }
        )

    #: its per-task partial is a row per task (~140 B each: 17 MiB at 4x10^6 windows), which a gpu
    #: study would otherwise copy to the host to reduce to tables of a few hundred rows
    device_partial = True

    # ---------------------------------------------------------------- finalize
    def finalize(self, partial: dict[str, Any], ctx: UsageVsRequestContext) -> dict[str, pa.Table]:
        """Arrow tables, built without pandas (see :mod:`gpuclust.tables`).  The per-task partial
        is reduced on the backend the partials were computed on (:func:`finalize_backend`: on the
        device, where a gpu study leaves it), so only its counts and sums come to the host, with
        the per-window counts of the named tiers."""
        names = ctx.tier_names
        T = len(names)
        p = {k: to_host(partial[k][:T]) for k in ("counts", "hist", "rsum")}
        prod = ctx.tier_map.names.index("prod") if "prod" in ctx.tier_map.names else None
        tasks, task_info = task_tables(partial, prod, finalize_backend(partial["backend"]))
        lo = np.concatenate([[0.0], RATIO_EDGES])
        hi = np.concatenate([RATIO_EDGES, [np.inf]])
        groups = [(names[t], p["counts"][t], p["hist"][t], p["rsum"][t]) for t in range(T)]
        groups.append(("all", p["counts"][:T].sum(0), p["hist"][:T].sum(0), p["rsum"][:T].sum(0)))
        rows: list[dict[str, Any]] = []
        hists: dict[str, list[Any]] = {"hist": [], "tier": [], "measure": []}
        for tier, cnt, hist, rs in groups:
            for j, (measure, _, _) in enumerate(MEASURES):
                if not cnt[j, 0]:
                    continue
                nd = int(cnt[j, 3])
                row: dict[str, Any] = {
                    "tier": tier,
                    "measure": measure,
                    **{f: int(cnt[j, q]) for q, f in enumerate(_COUNTS)},
                    "above_limit_share": int(cnt[j, 4]) / nd if nd else np.nan,
                    "at_most_half_share": int(cnt[j, 5]) / nd if nd else np.nan,
                    "mean_ratio": float(rs[j]) / nd if nd else np.nan,
                }
                row.update(
                    {f"p{q}_ratio": float(v) for q, v in bin_quantile_edges(hist[j], lo, (10, 50, 90, 99)).items()}
                )
                rows.append(row)
                for hk, hv in (("hist", hist[j]), ("tier", tier), ("measure", measure)):
                    hists[hk].append(hv)
        info = table_from_rows(
            [
                {
                    "analysis": self.name,
                    "tier_map": ctx.tier_map.name,
                    "tiers": ",".join(names),
                    "windows": int(p["counts"][:T, 0, 0].sum()),
                    **task_info,
                }
            ]
        )
        return {
            "summary": rows_table(rows, _SUMMARY_SCHEMA),
            "info": info,
            "hist": bin_table(
                hists["hist"], lo, hi, "ratio", "windows", _HIST_SCHEMA, tier=hists["tier"], measure=hists["measure"]
            ),
            **tasks,
        }

    def summary(self, result: dict[str, Any]) -> str:
        info = as_arrow(result["info"]).to_pylist()[0]
        lines = [f"{self.label}: {info['windows']:,} windows, tier map {info['tier_map']!r}"]
        for r in as_arrow(result["summary"]).to_pylist():
            lines.append(
                f"  {r['tier']:>8} {r['measure']}: {r['defined']:,} windows with a limit, median usage/limit "
                f"{fmt(r['p50_ratio'], '.3g')}, above the limit {fmt(r['above_limit_share'], '.1%')}, "
                f"no limit {r['no_limit']:,}"
            )
        lines.append(f"  per task (Borg Fig. 11), {info['tasks']:,} tasks, memory reservation: {info['reservation']}")
        for r in as_arrow(result["task_summary"]).to_pylist():
            lines.append(
                f"  {r['band']:>8} {r['measure']}: {r['defined']:,} tasks, median {fmt(r['p50_ratio'], '.3g')}, "
                f"above the limit {fmt(r['above_limit_share'], '.1%')}"
            )
        return "\n".join(lines)


#: The result tables' columns and types (an empty table keeps them).
_SUMMARY_SCHEMA, _HIST_SCHEMA = ratio_schemas("tier", "windows")
