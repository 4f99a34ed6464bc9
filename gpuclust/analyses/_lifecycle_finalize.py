"""``lifecycle``'s finalize side (:mod:`gpuclust.analyses.lifecycle`): the result tables built from
the merged partial (:func:`result_tables`; the ``series``, ``delays`` and ``delay_hist`` tables
from :mod:`gpuclust.analyses._lifecycle_tables`, ``survival`` from
:mod:`gpuclust.analyses._lifecycle_survival`) and the text summary (:func:`summary_text`)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

from gpuclust.analyses._lifecycle_survival import survival_table
from gpuclust.analyses._lifecycle_tables import (
    _COUNTERS,
    _DI,
    _K,
    _NE,
    _T,
    DELAY_EDGES_US,
    DELAYS_SCHEMA,
    DISTRIBUTIONS,
    EVENT_NAMES,
    EVENTS_BY_KIND_SCHEMA,
    EVENTS_SCHEMA,
    EXPECTED,
    STATE_AFTER,
    TRANSITIONS_SCHEMA,
    delays_tables,
    series_table,
    with_kind,
)
from gpuclust.analyses.base import fmt
from gpuclust.arrow_numpy import empty_table, rows_table, table_from_rows
from gpuclust.tables import as_arrow, column

if TYPE_CHECKING:
    from gpuclust.analyses.lifecycle import LifecycleContext

__all__ = ["result_tables", "summary_text", "unknown_duration_reason"]


def result_tables(
    partial: dict[str, Any],
    ctx: LifecycleContext,
    *,
    name: str,
    kinds: tuple[str, ...],
    thing: str,
    bucket_s: int,
) -> dict[str, pa.Table]:
    """The result tables of the merged ``partial``, as Arrow tables built without pandas (see
    :mod:`gpuclust.tables`): ``kinds`` names the kinds of ``thing`` by ``collection_type`` (the
    dense partials' first axis), ``name`` and ``bucket_s`` go to ``info``."""
    names = ctx.tier_names
    pk, p = _by_kind(partial, len(names))
    trows = _transition_rows(p["transitions"], names)
    delays, hist = delays_tables(p, names)
    present = [k for k in range(_K) if pk["instances"][k].sum()]
    by_kind = [(kinds[k], delays_tables({f: v[k] for f, v in pk.items()}, names)[0]) for k in present]
    delays_by_kind = (
        pa.concat_tables([with_kind(d, kn) for kn, d in by_kind])
        if by_kind
        else with_kind(empty_table(DELAYS_SCHEMA), "")
    )
    survival = survival_table(pk, p, names, [kinds[k] for k in range(_K)], present, _DI, DISTRIBUTIONS, DELAY_EDGES_US)
    counters = dict(zip(_COUNTERS, (int(v) for v in p["counters"]), strict=True))
    kind_counts = {
        f"{kinds[k]}_{thing}s" if kinds[k] == "unknown" else f"{kinds[k]}s": int(pk["instances"][k].sum())
        for k in range(_K)
    }
    info = table_from_rows(
        [
            {
                "analysis": name,
                "tier_map": ctx.tier_map.name,
                "tiers": ",".join(names),
                "bucket_s": bucket_s,
                "data_end_us": ctx.data_end_us,
                **counters,
                **kind_counts,
                "transitions": int(p["transitions"].sum()),
                "unexpected_transitions": sum(r["count"] for r in trows if not r["expected"]),
            }
        ]
    )
    return {
        "events": _events_table(p["events"], names),
        "transitions": rows_table(trows, TRANSITIONS_SCHEMA),
        "series": series_table(partial["series"], names, bucket_s),
        "delays": delays,
        "delay_hist": hist,
        "survival": survival,
        "delays_by_kind": delays_by_kind,
        "events_by_kind": _events_by_kind_table(pk["events"], names, kinds),
        "info": info,
    }


def _by_kind(partial: dict[str, Any], T: int) -> tuple[dict[str, Any], dict[str, Any]]:
    """The dense partials by kind, ``(kind, tier, ...)`` trimmed to the context's ``T`` tiers, and
    of all kinds together (summed; the shortest and longest durations over kinds; the counters)."""
    pk = {
        k: np.asarray(v).reshape(_K, _T, *np.shape(v)[1:])[:, :T]
        for k, v in partial.items()
        if k not in ("series", "counters")
    }
    p: dict[str, Any] = {k: v.sum(axis=0) for k, v in pk.items() if k not in ("dur_min", "dur_max")}
    p["dur_min"], p["dur_max"] = pk["dur_min"].min(axis=0), pk["dur_max"].max(axis=0)
    p["counters"] = np.asarray(partial["counters"])
    return pk, p


def _events_table(ev: np.ndarray, names: tuple[str, ...]) -> pa.Table:
    """The ``events`` table of the (tier, event type) counts ``ev``."""
    return rows_table(
        [
            {"tier": names[k], "event": EVENT_NAMES[j], "count": int(ev[k, j])}
            for k in range(len(names))
            for j in range(_NE)
            if ev[k, j]
        ],
        EVENTS_SCHEMA,
    )


def _transition_rows(tr: np.ndarray, names: tuple[str, ...]) -> list[dict[str, Any]]:
    """The ``transitions`` table's rows of the (tier, from, to) counts ``tr``."""
    return [
        {
            "tier": names[k],
            "from_event": EVENT_NAMES[a],
            "to_event": EVENT_NAMES[b],
            "count": int(tr[k, a, b]),
            "expected": bool(b in EXPECTED[int(STATE_AFTER[a])]),
        }
        for k in range(len(names))
        for a in range(_NE)
        for b in range(_NE)
        if tr[k, a, b]
    ]


def _events_by_kind_table(ev: np.ndarray, names: tuple[str, ...], kinds: tuple[str, ...]) -> pa.Table:
    """The ``events_by_kind`` table of the (kind, tier, event type) counts ``ev``."""
    erows = [
        {"kind": kinds[k], "tier": names[j], "event": EVENT_NAMES[v], "count": int(ev[k, j, v])}
        for k in range(_K)
        for j in range(len(names))
        for v in range(_NE)
        if ev[k, j, v]
    ]
    return rows_table(erows, EVENTS_BY_KIND_SCHEMA)


def summary_text(label: str, thing: str, result: dict[str, Any]) -> str:
    """The text summary of a result (``thing``: ``instance`` or ``collection``)."""
    info = as_arrow(result["info"]).to_pylist()[0]
    lines = [
        f"{label}: {info['instances']:,} {thing}s, {info['rows']:,} events, tier map "
        f"{info['tier_map']!r}; {info['unexpected_transitions']:,} of {info['transitions']:,} transitions not in "
        f"the v3 state diagram; {info['first_not_submit']:,} {thing}s first seen other than by SUBMIT"
    ]
    s = as_arrow(result["series"])
    if s.num_rows:
        bucket = column(s, "bucket")
        ub, inv = np.unique(bucket, return_inverse=True)
        tot = {
            f: np.bincount(inv, weights=column(s, f).astype(np.float64), minlength=ub.shape[0])
            for f in ("new_submissions", "resubmissions", "finishes", "pending", "running")
        }
        lines.append(
            f"  buckets of {int(info['bucket_s'])} s {int(ub[0])}..{int(ub[-1])}: "
            f"{int(tot['new_submissions'].sum()):,} new submissions ({int(info['present_at_start']):,} "
            f"{thing}s present at the start apart), {int(tot['resubmissions'].sum()):,} "
            f"resubmissions, {int(tot['finishes'].sum()):,} finishes; at the end {int(tot['pending'][-1]):,} "
            f"pending, {int(tot['running'][-1]):,} running"
        )
    d = as_arrow(result["delays"]).to_pylist()
    for measure, outcome in (("scheduling", "scheduled"), ("execution", "finish")):
        for r in d:
            if r["measure"] == measure and r["outcome"] == outcome:
                head = f"  {measure} ({outcome}) {r['tier']:>8}: {r['episodes']:,} episodes"
                if not r["with_duration"]:
                    lines.append(f"{head}, median unknown: {unknown_duration_reason(measure)}")
                    continue
                timed = f" ({r['with_duration']:,} with a known duration)" if r["with_duration"] < r["episodes"] else ""
                lines.append(
                    f"{head}{timed}, median {fmt(r['p50_s'], '.3g')} s, p90 {fmt(r['p90_s'], '.3g')} s, "
                    f"mean {fmt(r['mean_s'], '.3g')} s"
                )
    for r in as_arrow(result["survival"]).to_pylist() if "survival" in result else ():
        if r["kind"] == "all":
            lines.append(
                f"  {r['measure']} Kaplan-Meier {r['tier']:>8}: {r['events']:,} ended, {r['censored']:,} "
                f"censored; median {fmt(r['km_p50_s'], '.3g', unit=' s')} (95% "
                f"{fmt(r['km_p50_lo_s'], '.3g')}-{fmt(r['km_p50_hi_s'], '.3g')}), "
                f"p90 {fmt(r['km_p90_s'], '.3g', unit=' s')}"
            )
    if info.get("synthesized_events"):
        lines.append(
            f"  {info['synthesized_events']:,} events synthesised by the trace (missing_type): "
            f"{info['synthesized_duration_episodes']:,} episodes left without a duration by them"
        )
    return "\n".join(lines)


def unknown_duration_reason(measure: str) -> str:
    """Why no episode of ``measure`` (a ``delays`` row with ``with_duration`` 0) has a duration, so
    that its quantiles are unknown."""
    entry = "SCHEDULE" if measure == "execution" else "SUBMIT"
    return (
        f"none of its episodes has a known duration (each began before the trace: its {entry} at time 0 or "
        "not in the data; or ended at 2^63-1, after the trace)"
    )
