"""``peak-prediction``: the overcommit simulator of "Take it to the Limit" (Bashir et al., EuroSys
2021) with the documented semantics of Google's public ``cluster-resource-forecast``.

Per machine and 5-minute step, the sum of the limits of the instances present, their usage
(capped at the limits), the **oracle** peak (a percentile of the future usage of the instances
present now, over a horizon) and the **predicted** peak of each predictor: ``borg-default`` (a
fraction of the limits), ``n-sigma``, the per-instance percentile (RC-like), the per-machine
percentile, and the max / mean of chosen predictors; then per predictor the violation rate and
severity against the oracle and the capacity saved relative to the limits
(docs/analyses/peak-prediction.md has the exact semantics and where they differ from Google's code).

Plan: the partial joins each top-level usage window as of its start to the latest event of its
instance with a positive CPU and memory request (the limit, :mod:`gpuclust.analyses._requests`)
and emits *keyed rows* (key = machine code x steps + step; the instance key, the metric, the
limit); the engine spills them per partition and hands each shard (a range of machines, sized by
the per-machine sample counts carried in the small ``rest``) every row of its machines;
``finalize_shard`` runs the simulation vectorised with NumPy
(:func:`gpuclust.analyses._peak_sim.simulate`) and writes the ``machine`` table part; the metrics
come from the shards' sums and a streamed pass over that table (severity quantiles;
:mod:`gpuclust.analyses._peak_metrics`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from gpuclust._xp import bincount
from gpuclust.analyses._extent import has_values, max_finite
from gpuclust.analyses._kept import KeptValues
from gpuclust.analyses._lookup import id_index
from gpuclust.analyses._peak_metrics import shard_sums, summary_table
from gpuclust.analyses._peak_sim import SimParams, simulate
from gpuclust.analyses._requests import REQUEST_COLUMNS, RequestTimeline, asof_events
from gpuclust.analyses.base import Analysis, fmt, is_null_int, to_host
from gpuclust.analyses.grouping import unique_codes
from gpuclust.analyses.kinds import Counted, Fields, Keyed, Label, Sum
from gpuclust.analyses.options import option
from gpuclust.arrow_numpy import table, table_from_rows
from gpuclust.backends import finalize_backend
from gpuclust.keys import hash64, pack, unpack
from gpuclust.parted import finalize_in_memory
from gpuclust.schema import CPU_PERCENTILES_SOURCE_ORDER, TIME_AFTER_TRACE
from gpuclust.tables import as_arrow

__all__ = [
    "BASE_PREDICTORS",
    "METRICS",
    "PREDICTORS",
    "STEP_US",
    "PeakPrediction",
    "PeakPredictionContext",
    "horizon_note",
]

#: The simulator's step: 5 minutes, µs.
STEP_US = 300_000_000
#: metric option -> (usage column, resource: 0 = CPU, 1 = memory); the paper's default first.
#: ``metric="auto"`` (the default) takes the paper's ``cpu_p90`` where the usage has it (the 2019
#: trace) and :data:`AUTO_FALLBACK` otherwise (the 2011 trace has no CPU percentiles).
METRICS: dict[str, tuple[str, int]] = {
    "cpu_p90": ("cpu_p90", 0),
    "avg_cpu": ("avg_cpu", 0),
    "max_cpu": ("max_cpu", 0),
    "avg_mem": ("avg_mem", 1),
    "max_mem": ("max_mem", 1),
    **{f"cpu_p{p}": (f"cpu_p{p}", 0) for p in sorted(CPU_PERCENTILES_SOURCE_ORDER) if p != 90},
}
#: ``metric="auto"`` on usage without ``cpu_p90``: the window's maximum CPU rate (v2's "maximum
#: CPU rate", the closest to a peak the 2011 trace measures).
AUTO_FALLBACK = "max_cpu"
#: Predictors the max / avg combinations may use.
BASE_PREDICTORS = ("borg_default", "n_sigma", "instance_percentile", "machine_percentile")
#: Every predictor column of the machine table, in this order.
PREDICTORS = (*BASE_PREDICTORS, "max_of", "avg_of")
#: Longest horizon (7 days): the oracle's working matrix is a chunk of snapshots x horizon steps.
MAX_HORIZON_S = 7 * 86400
#: Samples (instance-steps) per shard of the machine table; on a device 16x as many (fewer, larger
#: launches: a shard's simulation is a fixed number of operations, ~1,000, whatever its size; its
#: rows are 32 B a sample on the device, 0.5 GB for 2^24, a few times that with the simulation's
#: temporaries).
SHARD_ROWS = 1 << 20
DEVICE_SHARD_FACTOR = 16
#: Counters of the usage rows, in this order.
STATS = (
    "rows",
    "alloc_rows",
    "unplaced_rows",
    "unknown_machine_rows",
    "null_metric_rows",
    "no_limit_rows",
    "filtered_rows",
    "used_rows",
)
_MACHINE_COLUMNS = [
    "machine_id",
    "bucket",
    "bucket_start_us",
    "instances",
    "limit",
    "total_usage",
    "oracle",
    *PREDICTORS,
]
_EXTRA_EVENT_COLUMNS = ("priority", "scheduling_class")


@dataclass(frozen=True)
class PeakPredictionContext:
    """The machines (codes = positions), the step span of the keys, the data's last step (the
    oracle's censoring bound) and the request timelines ``bind`` builds."""

    machine_ids: np.ndarray
    span: int
    last_step: int
    requests: RequestTimeline = field(default_factory=RequestTimeline)
    #: the metric used (``metric="auto"`` resolved against the data)
    metric: str = "cpu_p90"


def _auto_note(info: Mapping[str, Any]) -> str:
    """Why ``metric="auto"`` took the metric it did, for the summary line."""
    if info.get("metric_option") != "auto":
        return ""
    if info.get("metric") == "cpu_p90":
        return ", auto"
    return ", auto: the usage has no cpu_p90 (2011 traces); -O metric=... for another"


def _duration(s: int) -> str:
    """Seconds as the largest whole unit: ``86400`` -> ``24 h``, ``5400`` -> ``90 min``."""
    return f"{s // 3600} h" if s % 3600 == 0 else f"{s // 60} min" if s % 60 == 0 else f"{s} s"


def horizon_note(info: Mapping[str, Any]) -> str | None:
    """Why no predictor has a number, when every machine-step is censored: the usage spans no
    more than the oracle's horizon.  One line naming the span and the ``-O horizon_s=`` to pass
    (half the span), or ``None`` when some machine-step has an oracle (or there is none at all).
    The summary and the report's section say it (:func:`gpuclust.report.sections.empty_reason`).

    >>> print(horizon_note({"machine_rows": 72, "censored_rows": 72, "horizon_s": 86400,
    ...                     "first_bucket": 0, "last_bucket": 71}))
    every machine-step is censored: the usage spans 6 h (5-minute steps 0 to 71), no more than the 24 h horizon the oracle looks ahead; pass -O horizon_s=10800 (half the span) or less to score the predictors
    """
    rows, censored = int(info.get("machine_rows") or 0), int(info.get("censored_rows") or 0)
    first, last = info.get("first_bucket"), info.get("last_bucket")
    if not rows or censored < rows or first is None or last is None or int(first) < 0:
        return None
    steps = int(last) - int(first) + 1
    return (
        f"every machine-step is censored: the usage spans {_duration(steps * 300)} (5-minute steps {int(first)} "
        f"to {int(last)}), no more than the {_duration(int(info['horizon_s']))} horizon the oracle looks ahead; "
        f"pass -O horizon_s={300 * max(1, steps // 2)} (half the span) or less to score the predictors"
    )


def _steps(ctx: PeakPredictionContext) -> int:
    """Keys per machine code of the rows (the step span)."""
    return ctx.span


def _machines(ctx: PeakPredictionContext) -> int:
    """Machine codes: the coordinate the rows are sharded by."""
    return int(ctx.machine_ids.shape[0])


#: The check of a ``LO,HI`` option.
_RANGE = (lambda r: len(r) == 2 and r[0] <= r[1], "two integers LO,HI with LO <= HI")


@dataclass(frozen=True)
class PeakPrediction(Analysis):
    """Peak-prediction overcommit simulation: per machine x 5 minutes the limit, usage, oracle and
    predicted peaks; per predictor violation rate, severity and savings.

    Examples
    --------
    >>> PeakPrediction(metric="avg_cpu", n_sigma=3.0).label
    'peak-prediction[metric=avg_cpu,n_sigma=3.0]'
    """

    metric: str = option(
        "auto",
        "the usage of an instance in a step: max over its windows of this column "
        "(the paper: cpu_p90); auto: cpu_p90 where the usage has it, else max_cpu (2011 traces)",
        choices=("auto", *METRICS),
    )
    horizon_s: int = option(
        86400,
        "the oracle's horizon, seconds (future steps in (t, t + horizon]); at most 7 days",
        ge=300,
        le=MAX_HORIZON_S,
    )
    oracle_percentile: float = option(
        100.0, "the oracle: this percentile of the future total usage (100 = peak)", ge=0, le=100
    )
    cap_to_limit: bool = option(True, "cap each instance's usage at its limit in the predictors and the oracle")
    min_samples: int = option(
        24,
        "samples an instance needs on its machine before a predictor uses it (before: its whole limit counts)",
        ge=0,
    )
    borg_fraction: float = option(0.9, "borg-default: this fraction of the limits", ge=0)
    n_sigma: float = option(5.0, "n-sigma: mean + n x stdev of the machine's usage/limit history")
    n_sigma_history: int = option(24, "n-sigma: samples of history", ge=1, le=10_000)
    instance_percentile: float = option(
        99.0,
        "per-instance (RC-like): this percentile of each instance's usage/limit history x its limit",
        ge=0,
        le=100,
    )
    instance_history: int = option(120, "per-instance percentile: samples of history", ge=1, le=10_000)
    machine_percentile: float = option(
        100.0, "per-machine: this percentile of the machine's usage/limit history", ge=0, le=100
    )
    machine_history: int = option(24, "per-machine percentile: samples of history", ge=1, le=10_000)
    combine: tuple[str, ...] = option(
        ("n_sigma", "instance_percentile"),
        "the predictors max_of / avg_of combine (the paper's: n_sigma + instance_percentile)",
        choices=BASE_PREDICTORS,
    )
    priority_range: tuple[int, ...] = option(
        (0, 400),
        "LO,HI: keep instances whose joined event's priority is in [LO, HI] (the paper's filter; see apply_ranges)",
        check=_RANGE,
    )
    scheduling_class_range: tuple[int, ...] = option(
        (2, 3),
        "LO,HI: keep instances whose joined event's scheduling class is in [LO, HI] (the paper's filter)",
        check=_RANGE,
    )
    apply_ranges: bool = option(
        True,
        "apply priority_range and scheduling_class_range (false: keep every instance, NULL priority or class included)",
    )

    name = "peak-prediction"
    table = "instance_usage"
    requires = ("instance_usage", "instance_events", "machine_events")
    parted = ("machine",)
    row_bytes = 320
    auto_partition_rows = 1 << 20

    @property
    def params(self) -> SimParams:
        return SimParams(
            horizon_steps=self.horizon_s // 300,
            oracle_percentile=float(self.oracle_percentile),
            cap_to_limit=bool(self.cap_to_limit),
            min_samples=int(self.min_samples),
            borg_fraction=float(self.borg_fraction),
            n_sigma=float(self.n_sigma),
            n_sigma_history=int(self.n_sigma_history),
            instance_percentile=float(self.instance_percentile),
            instance_history=int(self.instance_history),
            machine_percentile=float(self.machine_percentile),
            machine_history=int(self.machine_history),
            combine=tuple(self.combine),
        )

    @property
    def columns(self) -> tuple[str, ...]:
        metrics = ("cpu_p90", AUTO_FALLBACK) if self.metric == "auto" else (self.metric,)
        return (
            "start_time",
            "collection_id",
            "instance_index",
            "machine_id",
            "alloc_collection_id",
            *dict.fromkeys(METRICS[m][0] for m in metrics),
        )

    def resolve_metric(self, source: Any) -> str:
        """The metric this run uses: the option, or for ``auto`` ``cpu_p90`` where the usage holds
        a value of it (Parquet statistics, see :func:`gpuclust.analyses._extent.has_values`), else
        :data:`AUTO_FALLBACK`."""
        if self.metric != "auto":
            return self.metric
        return "cpu_p90" if has_values(source, "instance_usage", "cpu_p90") else AUTO_FALLBACK

    def context(self, source: Any) -> PeakPredictionContext:
        me = source.read("machine_events", ["machine_id"])
        from gpuclust.analyses._extent import to_i64

        ids, _ = unique_codes(to_i64(me.column("machine_id")))
        last = max_finite(source, "instance_usage", "start_time")
        last_step = -1 if last is None or last < 0 else int(last // STEP_US)
        span = max(last_step + 1, 1)
        if ids.shape[0] * span >= 1 << 62:
            raise ValueError("peak-prediction: machines x steps do not fit an int64 key")
        return PeakPredictionContext(ids, span, last_step, metric=self.resolve_metric(source))

    @property
    def side_inputs(self) -> dict[str, tuple[str, ...]]:
        return {"instance_events": tuple(dict.fromkeys((*REQUEST_COLUMNS, *_EXTRA_EVENT_COLUMNS)))}

    def bind(self, ctx: PeakPredictionContext, side: dict[str, Any], grain: str | None) -> PeakPredictionContext:
        return replace(ctx, requests=RequestTimeline.build(side["instance_events"], _EXTRA_EVENT_COLUMNS))

    # ---------------------------------------------------------------- partial / merge
    def partial(self, cols: dict[str, Any], ctx: PeakPredictionContext, backend: Any) -> dict[str, Any]:
        xp = backend.xp
        s = cols["start_time"]
        n = int(s.shape[0])
        M = int(ctx.machine_ids.shape[0])
        stats = dict.fromkeys(STATS, 0)
        stats["rows"] = n
        out = self.kinds.empty(backend, on_backend=True)  # its arrays on the backend, as a partial with rows has them
        out["count"] = xp.zeros(M, xp.int64)
        alloc = cols["alloc_collection_id"]
        keep = (alloc == 0) | is_null_int(xp, alloc)
        stats["alloc_rows"] = n - int(xp.count_nonzero(keep))
        placed = (s >= 0) & (s < TIME_AFTER_TRACE)
        stats["unplaced_rows"] = int(xp.count_nonzero(keep & ~placed))
        keep &= placed
        pos, known = id_index(backend, ctx.machine_ids, cols["machine_id"])
        stats["unknown_machine_rows"] = int(xp.count_nonzero(keep & ~known))
        keep &= known
        col, res = METRICS[ctx.metric]
        u = cols[col].astype(xp.float64)
        fin = xp.isfinite(u)
        stats["null_metric_rows"] = int(xp.count_nonzero(keep & ~fin))
        idx = xp.nonzero(keep & fin)[0]
        rq = ctx.requests
        c, i, st = cols["collection_id"][idx], cols["instance_index"][idx], s[idx]
        both = np.asarray((rq.req > 0).all(1), dtype=bool)  # GI: cpus > 0 and memory > 0
        ((hit, ev),) = asof_events(backend, rq, c, i, st, [both], "peak-prediction")
        stats["no_limit_rows"] = int(idx.shape[0]) - int(xp.count_nonzero(hit))
        ok = hit
        if int(rq.key.shape[0]):
            for name, rng in (("priority", self.priority_range), ("scheduling_class", self.scheduling_class_range)):
                if self.apply_ranges:
                    v = backend.stage(rq.extra[name])[ev]
                    ok = ok & (v >= rng[0]) & (v <= rng[1])  # NULL (NaN) is out of every range
            lim = backend.stage(rq.derived(("req", res), lambda: np.ascontiguousarray(rq.req[:, res])))[ev]
        else:
            lim = xp.zeros(int(idx.shape[0]))
        stats["filtered_rows"] = int(xp.count_nonzero(hit & ~ok))
        sel = xp.nonzero(ok)[0]
        stats["used_rows"] = int(sel.shape[0])
        out["stats"] = xp.asarray(np.array([stats[k] for k in STATS], np.int64))
        if not int(sel.shape[0]):
            return out
        idx = idx[sel]
        code = pos[idx].astype(xp.int64)
        key = pack(code, s[idx] // STEP_US, ctx.span)
        inst = hash64(xp, [cols["collection_id"][idx], cols["instance_index"][idx]]).view(xp.int64)
        o = xp.argsort(key)
        # float32: the trace's usage and request columns are float32, so nothing is lost (24 bytes a row)
        out["rows"] = {
            "key": key[o],
            "inst": inst[o],
            "usage": u[idx][o].astype(xp.float32),
            "limit": lim[sel][o].astype(xp.float32),
        }
        out["count"] = bincount(xp, code, minlength=M).astype(xp.int64)
        return out

    @property
    def kinds(self) -> Fields:
        """The keyed rows (disjoint, sorted by key = machine code x steps + step: sharded by
        machine code), the per-machine sample counts (empty before a partition counts: ragged)
        and the counters."""
        # float32: the trace's usage and request columns are float32 (see :meth:`partial`)
        rows = {"inst": np.int64, "usage": np.float32, "limit": np.float32}
        return Fields(
            {
                "rows": Keyed(rows, rows=True, per=_steps),
                "count": Sum((0,), np.int64, ragged=True),
                "stats": Sum((len(STATS),), np.int64),
                "backend": Label(),
            },
            shard_by=Counted(_machines, "count", SHARD_ROWS, device=DEVICE_SHARD_FACTOR),
        )

    # ---------------------------------------------------------------- finalize
    #: its rows are ~11 B a window (110 MB at 10^7), which a gpu study would otherwise copy to the
    #: host and back to the device for the simulation
    device_partial = True

    def finalize(self, partial: dict[str, Any], ctx: PeakPredictionContext) -> dict[str, Any]:
        return finalize_in_memory(self, partial, ctx)

    def finalize_shard(
        self,
        keyed: dict[str, dict[str, np.ndarray]],
        rest: dict[str, Any],
        ctx: PeakPredictionContext,
        lo: int,
        hi: int,
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        """The machine-steps of machine codes ``[lo, hi)`` and the shard's metric sums.  The
        simulation runs on the backend the partials were computed on (:func:`finalize_backend`)."""
        r = keyed["rows"]
        be = finalize_backend(rest["backend"])
        xp = be.xp
        code, step = unpack(be.asarray(r["key"]).astype(xp.int64, copy=False), ctx.span)
        sim = to_host(
            simulate(
                be,
                code,
                step,
                be.asarray(r["inst"]).astype(xp.int64, copy=False),
                be.asarray(r["usage"]).astype(xp.float64, copy=False),
                be.asarray(r["limit"]).astype(xp.float64, copy=False),
                ctx.span,
                ctx.last_step,
                self.params,
            )
        )
        cols = {
            "machine_id": ctx.machine_ids[sim["code"]],
            "bucket": sim["step"].astype(np.int64),
            "bucket_start_us": sim["step"].astype(np.int64) * STEP_US,
            "instances": sim["instances"].astype(np.int64),
            **{c: np.asarray(sim[c], np.float64) for c in _MACHINE_COLUMNS[4:]},
        }
        extra = shard_sums(cols, sim["code"], PREDICTORS, KeptValues(be))
        return {"machine": table({c: cols[c] for c in _MACHINE_COLUMNS})}, extra

    def finalize_parted(
        self, rest: dict[str, Any], ctx: PeakPredictionContext, tables: dict[str, Any], extras: list[dict[str, Any]]
    ) -> dict[str, Any]:
        n_rows = sum(e["rows"] for e in extras)
        censored = sum(e["censored"] for e in extras)
        firsts = [e["first_step"] for e in extras if e.get("first_step") is not None]
        summary = summary_table(finalize_backend(rest["backend"]), tables["machine"], extras, PREDICTORS)
        stats = dict(zip(STATS, (int(x) for x in np.asarray(rest["stats"])), strict=True))
        prm = self.params

        def rng(r: tuple[int, ...]) -> str:
            return f"{r[0]}..{r[1]}" if self.apply_ranges else "all"

        info = table_from_rows(
            [
                {
                    "analysis": self.name,
                    "metric": ctx.metric,
                    "metric_option": self.metric,
                    "horizon_s": int(self.horizon_s),
                    "oracle_percentile": prm.oracle_percentile,
                    "cap_to_limit": prm.cap_to_limit,
                    "min_samples": prm.min_samples,
                    "combine": ",".join(prm.combine),
                    "priority_range": rng(self.priority_range),
                    "scheduling_class_range": rng(self.scheduling_class_range),
                    "machines": int(ctx.machine_ids.shape[0]),
                    "machine_rows": int(n_rows),
                    "censored_rows": int(censored),
                    "first_bucket": min(firsts, default=-1),
                    "last_bucket": int(ctx.last_step),
                    **stats,
                }
            ]
        )
        return {"summary": summary, "info": info}

    def summary(self, result: dict[str, Any]) -> str:
        info = as_arrow(result["info"]).to_pylist()[0]
        lines = [
            f"{self.label}: {info['machine_rows']:,} machine-steps ({info['censored_rows']:,} censored: the "
            f"horizon passes the data's end) from {info['used_rows']:,} of {info['rows']:,} usage windows "
            f"(metric {info['metric']}{_auto_note(info)}, horizon {info['horizon_s']} s)"
        ]
        note = horizon_note(info)
        if note is not None:
            lines.append(f"  {note}")
        for r in as_arrow(result["summary"]).to_pylist():
            lines.append(
                f"  {r['predictor']:>19}: violation rate {fmt(r['violation_rate'], '.3%')}, severity "
                f"mean {fmt(r['severity_mean'], '.3f')} p99 {fmt(r['severity_p99'], '.3f')}, "
                f"savings {fmt(r['savings'], '.1%')} of the limits"
            )
        return "\n".join(lines)
