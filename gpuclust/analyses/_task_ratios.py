"""``usage-vs-request``'s per-task ratios: Borg (EuroSys 2015) Figure 11's quantity, a CDF *over
tasks* of usage / limit (and of the memory reservation / limit), prod against non-prod.

A task is an instance (``collection_id``, ``instance_index``).  Each of its usage windows is joined
to its limits as of the window's start (the analysis' join); per task and resource:

* ``cpu_mean`` / ``mem_mean``: the time-weighted mean of the windows' ``avg_cpu`` / limit
  (``avg_mem`` / limit), each window weighted by its length (``end_time - start_time``; 0 where
  ``end_time <= start_time`` or ``end_time`` is 2^63-1), over its windows with that limit and a
  non-NULL usage: ``sum(w * u / limit) / sum(w)``;
* ``cpu_peak`` / ``mem_peak``: the largest ``max_cpu`` / limit (``max_mem`` / limit) of those
  windows;
* ``mem_reservation``: as ``mem_mean`` with ``assigned_mem`` (the memory the trace says was
  assigned to the instance) in place of ``avg_mem``.

A task's band: ``prod`` where the highest tier of its windows (each window's tier as the analysis
looks it up) is the tier map's production tier or above (Borg §2.5: "prod jobs are the ones in the
monitoring and production bands"), ``non-prod`` where it is a lower one, ``unknown`` where no window
has a known tier.

The partial is keyed by the instance's 64-bit hash (``_requests._key``): per task sums and counts
(summed by :func:`gpuclust.partials.merge_keyed`) and maxima (the peaks, the tier, and the
instance's ``collection_id`` / ``instance_index`` and their negations: a hash shared by two
instances leaves the maximum and minus the negation apart, which :func:`task_tables` refuses).
Memory: one row per task of a partition, not per window.  Everything in :class:`TaskAccumulator`
runs on ``backend.xp`` / ``backend.ops``, and so does :func:`task_tables`' reduction of the merged
partial, on the backend the partials were computed on: a gpu study's per-task partial stays on the
device (``Analysis.device_partial``), and the host receives its counts per band, measure and bin and
the sums of its values, not a row per task.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa

from gpuclust._xp import bincount
from gpuclust.analyses._requests import _key
from gpuclust.analyses.base import to_host
from gpuclust.analyses.kinds import Flat, Keyed
from gpuclust.analyses.usage_change import RATIO_EDGES
from gpuclust.arrow_numpy import bin_table, rows_table
from gpuclust.partials import bin_quantile_edges
from gpuclust.schema import TIME_AFTER_TRACE

__all__ = ["BANDS", "TASK_COLUMNS", "TASK_MEASURES", "TaskAccumulator", "TASKS", "task_tables"]

#: (measure, usage column, limit: 0 CPU / 1 memory, kind): ``mean`` time-weighted, ``peak`` the maximum.
TASK_MEASURES = (
    ("cpu_mean", "avg_cpu", 0, "mean"),
    ("cpu_peak", "max_cpu", 0, "peak"),
    ("mem_mean", "avg_mem", 1, "mean"),
    ("mem_peak", "max_mem", 1, "peak"),
    ("mem_reservation", "assigned_mem", 1, "mean"),
)
#: The instance_usage columns the per-task ratios read beyond the analysis' own.
TASK_COLUMNS = ("end_time", "assigned_mem")
BANDS = ("prod", "non-prod", "unknown", "all")
_US = 1e6
#: The partial's fields (prefixed ``task_``): float sums, int sums, maxima.
_SUMS = tuple(f"{p}_{m}" for m, _, _, k in TASK_MEASURES if k == "mean" for p in ("w", "s"))
_COUNTS = ("windows", "lim_cpu", "lim_mem", *(f"n_{m}" for m, *_ in TASK_MEASURES))
_PEAKS = tuple(f"pk_{m}" for m, _, _, k in TASK_MEASURES if k == "peak")
_IDS = ("tier", "cid", "ncid", "idx", "nidx")
_MAXIMA = (*_PEAKS, *_IDS)
_FIELDS = ("key", *_SUMS, *_PEAKS, *_COUNTS, *_IDS)

#: How per-task partials merge (:mod:`gpuclust.analyses.kinds`): by key, sums and counts added,
#: maxima kept; its identity has float sums and peaks, int64 counts and ids.
TASKS = Flat(
    Keyed({f: np.float64 if f in (*_SUMS, *_PEAKS) else np.int64 for f in _FIELDS[1:]}, maxima=_MAXIMA),
    "task_",
    _FIELDS,
)


class TaskAccumulator:
    """One partition's per-task sums, counts and maxima, filled a block of windows at a time
    (:meth:`add`: their tiers and limits) on ``backend.xp``, then reduced per task at once
    (:meth:`result`): the windows grouped by their instance's hash (one ``unique``), sums by
    ``bincount`` in row order, maxima by the backend's ``scatter_max``."""

    def __init__(self, backend: Any, cols: dict[str, Any]):
        xp = backend.xp
        self.backend = backend
        cid, idx = cols["collection_id"], cols["instance_index"]
        key = _key(xp, cid, idx).view(xp.int64)
        # group by the hash: one sort (no ``unique``: NumPy's imports numpy.ma)
        n = int(key.shape[0])
        order = xp.argsort(key)
        sk = key[order]
        new = xp.ones(n, dtype=bool)
        new[1:] = sk[1:] != sk[:-1]
        self.inv = xp.empty(n, dtype=xp.int64)
        self.inv[order] = xp.cumsum(new) - 1
        self.key = sk[new]
        G = self.G = int(self.key.shape[0])
        # one instance per hash in this partition (across partitions: the maxima and negations)
        sc, si = cid[order].astype(xp.int64), idx[order].astype(xp.int64)
        if bool((~new[1:] & ((sc[1:] != sc[:-1]) | (si[1:] != si[:-1]))).any()):
            raise RuntimeError("usage-vs-request: 64-bit hash collision between two instance keys (please report)")
        rep_c, rep_i = sc[new], si[new]
        s, e = cols["start_time"], cols["end_time"]
        ok = (e > s) & (e != TIME_AFTER_TRACE)
        self.weight = xp.where(ok, (e - s).astype(xp.float64) / _US, 0.0)
        self.f: dict[str, Any] = {}
        self.f.update({f: xp.full(G, -np.inf) for f in _PEAKS})
        self.f["windows"] = bincount(xp, self.inv, minlength=G).astype(xp.int64)
        self.f["tier"] = xp.full(G, -1, dtype=xp.int64)
        self.f.update({"cid": rep_c, "ncid": -rep_c, "idx": rep_i, "nidx": -rep_i})
        self.cols = cols
        self.tier = xp.full(n, -1, dtype=xp.int64)
        self.lim = (xp.full(n, np.nan), xp.full(n, np.nan))

    def add(self, sl: slice, tier: Any, n_tiers: int, lim0: Any, lim1: Any) -> None:
        """Windows ``sl``: ``tier`` their tier codes (``n_tiers``: unknown), ``lim0`` / ``lim1``
        their CPU and memory limits as of their start (NaN or <= 0: none); kept until
        :meth:`result`, which sums every window of the partition in row order (the same bits
        whatever the blocks)."""
        xp = self.backend.xp
        self.tier[sl] = xp.where(tier < n_tiers, tier, -1)
        self.lim[0][sl] = lim0
        self.lim[1][sl] = lim1

    def _reduce(self) -> None:
        xp, G, f, g = self.backend.xp, self.G, self.f, self.inv
        self.backend.ops.scatter_max(f["tier"], g, self.tier)
        w = self.weight

        def count(flag: Any) -> Any:
            return bincount(xp, xp.where(flag, g, G), minlength=G + 1)[:G].astype(xp.int64)

        for r, lim in enumerate(self.lim):
            f[("lim_cpu", "lim_mem")[r]] = count(lim > 0)  # NaN: no limit
        for m, col, r, kind in TASK_MEASURES:
            # the limits are positive or NaN: the ratio is finite where the window has the limit
            # and a finite usage
            ratio = self.cols[col].astype(xp.float64) / self.lim[r]
            d = xp.isfinite(ratio)
            f[f"n_{m}"] = count(d)
            if kind == "mean":
                wd = xp.where(d, w, 0.0)
                f[f"w_{m}"] = bincount(xp, g, weights=wd, minlength=G)
                f[f"s_{m}"] = bincount(xp, g, weights=xp.where(d, wd * ratio, 0.0), minlength=G)
            else:
                self.backend.ops.scatter_max(f[f"pk_{m}"], g, xp.where(d, ratio, -np.inf))

    def result(self) -> dict[str, Any]:
        """The partition's per-task partial (``task_``-prefixed fields, sorted unique keys)."""
        self._reduce()
        return {"task_key": self.key, **{"task_" + k: v for k, v in self.f.items()}}


def task_values(xp: Any, p: dict[str, Any]) -> dict[str, tuple[Any, Any]]:
    """Per measure, per task of the merged partial ``p`` (``xp`` arrays): (its value, NaN where not
    defined; its state: 0 no limit, 1 a limit but no defined value, 2 defined)."""
    out = {}
    for m, _, r, kind in TASK_MEASURES:
        lim = p["task_" + ("lim_cpu", "lim_mem")[r]] > 0
        if kind == "mean":
            wsum = p[f"task_w_{m}"]
            ok = lim & (wsum > 0)
            v = xp.where(ok, p[f"task_s_{m}"] / xp.where(ok, wsum, 1.0), np.nan)
        else:
            ok = lim & (p[f"task_n_{m}"] > 0)
            v = xp.where(ok, p[f"task_pk_{m}"], np.nan)
        out[m] = (v, xp.where(ok, 2, xp.where(lim, 1, 0)))
    return out


#: Per-task counts, a slot of one ``bincount`` each (:func:`_task_counts`): per measure and band
#: (prod, non-prod, unknown) _CODES codes (0 no limit, 1 a limit but no value, 2 + the value's bin
#: of RATIO_EDGES), then per measure and band 3 flags (0, 1 at most half the limit, 2 above it),
#: then the tasks per band.
_NM, _NB3 = len(TASK_MEASURES), len(BANDS) - 1
_CODES = 2 + int(RATIO_EDGES.shape[0]) + 1
_FLAGS_AT = _NM * _NB3 * _CODES
_TASKS_AT = _FLAGS_AT + _NM * _NB3 * 3
_SLOTS = _TASKS_AT + _NB3
#: :func:`_task_sums`' sort keys: measure x 3 + band, then measure + 15 (all bands), then this (no value)
_NONE = _NM * _NB3 + _NM


def _task_counts(be: Any, p: dict[str, Any], prod_tier: int | None) -> tuple[Any, Any, Any]:
    """On ``be``, from the merged per-task partial ``p``: the counts of :data:`_SLOTS` followed by
    a hash collision flag, the reservation windows and the windows with a memory limit (int64, one
    array: one copy to the host), the defined values (``(measures, tasks)``, 0 elsewhere) and
    their groups (int8: measure x 3 + band where defined, else :data:`_NONE`)."""
    xp = be.xp
    tier = p["task_tier"]
    known = tier >= 0
    prod = known & (tier >= (prod_tier if prod_tier is not None else np.iinfo(np.int64).max))
    band = xp.where(prod, 0, xp.where(known, 1, 2)).astype(xp.int64)
    vals = task_values(xp, p)
    state = xp.stack([vals[m][1] for m, *_ in TASK_MEASURES])
    defined = state == 2
    x = xp.where(defined, xp.stack([vals[m][0] for m, *_ in TASK_MEASURES]), 0.0)
    bins = xp.searchsorted(be.stage(RATIO_EDGES), x.ravel(), side="right").reshape(x.shape)
    group = band + _NB3 * xp.arange(_NM, dtype=xp.int64)[:, None]  # measure x 3 + band
    code = xp.where(defined, bins + 2, state)
    flag = xp.where(defined & (x > 1), 2, xp.where(defined & (x <= 0.5), 1, 0))
    keys = xp.concatenate([(group * _CODES + code).ravel(), (_FLAGS_AT + group * 3 + flag).ravel(), _TASKS_AT + band])
    clash = (p["task_cid"] != -p["task_ncid"]).any() | (p["task_idx"] != -p["task_nidx"]).any()
    extra = xp.stack([clash.astype(xp.int64), p["task_n_mem_reservation"].sum(), p["task_lim_mem"].sum()])
    counts = xp.concatenate([bincount(xp, keys, minlength=_SLOTS).astype(xp.int64), extra.astype(xp.int64)])
    return counts, x, xp.where(defined, group, _NONE).astype(xp.int8)


def _task_sums(be: Any, x: Any, group: Any, defined: np.ndarray) -> np.ndarray:
    """The sum of the defined values of each band and measure (``(bands, measures)``, host), as
    NumPy's ``sum`` of them in task order: per measure, the values of each band (by ``group``)
    and of all, made contiguous by one stable sort, then each run summed (``defined``: the runs'
    lengths, ``(measures, bands)``, from :func:`_task_counts`)."""
    xp = be.xp
    n = _NM * _NB3
    every = xp.where(group < n, n + group // _NB3, _NONE).astype(xp.int8)  # all bands: measure m -> n + m
    order = be.ops.stable_argsort(xp.concatenate([group.ravel(), every.ravel()]))
    vals = xp.concatenate([x.ravel(), x.ravel()])[order]
    runs = np.concatenate([defined[:, :_NB3].ravel(), defined[:, _NB3]])
    ends = np.cumsum(runs)
    sums = [vals[int(e - k) : int(e)].sum() for e, k in zip(ends, runs, strict=True)]
    s = to_host(xp.stack(sums))
    return np.concatenate([s[:n].reshape(_NM, _NB3), s[n:, None]], axis=1).T


def task_tables(partial: dict[str, Any], prod_tier: int | None, be: Any) -> tuple[dict[str, pa.Table], dict[str, Any]]:
    """``task_summary`` and ``task_hist`` of a merged partial (``prod_tier``: the tier code of the
    tier map's production tier; None: the map has none, every task with a tier is ``non-prod``),
    and the ``info`` fields they add.  The per-task arrays are reduced on backend ``be`` (where a
    device partial is, or copied there): only the counts per band, measure and bin and the sums of
    the values (a copy each) come to the host, whatever the number of tasks."""
    p = {k: to_backend(be, v) for k, v in partial.items() if k.startswith("task_")}
    counts, x, group = _task_counts(be, p, prod_tier)
    c = to_host(counts)
    if int(c[_SLOTS]):
        raise RuntimeError("usage-vs-request: 64-bit hash collision between two instance keys (please report)")
    codes = c[:_FLAGS_AT].reshape(_NM, _NB3, _CODES)
    codes = np.concatenate([codes, codes.sum(1, keepdims=True)], axis=1)  # the bands, then all
    flags = c[_FLAGS_AT:_TASKS_AT].reshape(_NM, _NB3, 3)
    flags = np.concatenate([flags, flags.sum(1, keepdims=True)], axis=1)
    tasks = np.append(c[_TASKS_AT:_SLOTS], c[_TASKS_AT:_SLOTS].sum())
    sums = _task_sums(be, x, group, codes[:, :, 2:].sum(2))
    lo = np.concatenate([[0.0], RATIO_EDGES])
    hi = np.concatenate([RATIO_EDGES, [np.inf]])
    rows: list[dict[str, Any]] = []
    hists: dict[str, list[Any]] = {"hist": [], "band": [], "measure": []}
    for b, band in enumerate(BANDS):
        n = int(tasks[b])
        if not n:
            continue
        for j, (m, *_) in enumerate(TASK_MEASURES):
            hist = codes[j, b, 2:]
            nd = int(hist.sum())
            row: dict[str, Any] = {
                "band": band,
                "measure": m,
                "tasks": n,
                "no_limit": int(codes[j, b, 0]),
                "unknown": int(codes[j, b, 1]),
                "defined": nd,
                "above_limit": int(flags[j, b, 2]),
                "at_most_half": int(flags[j, b, 1]),
            }
            row.update(
                {
                    "above_limit_share": row["above_limit"] / nd if nd else np.nan,
                    "at_most_half_share": row["at_most_half"] / nd if nd else np.nan,
                    "mean_ratio": float(sums[b, j]) / nd if nd else np.nan,
                }
            )
            row.update({f"p{q}_ratio": e for q, e in bin_quantile_edges(hist, lo, (10, 50, 90, 99)).items()})
            rows.append(row)
            if nd:
                for hk, hv in (("hist", hist), ("band", band), ("measure", m)):
                    hists[hk].append(hv)
    res_windows = int(c[_SLOTS + 1])
    info = {
        "tasks": int(tasks[-1]),
        "reservation_windows": res_windows,
        "reservation": (
            "assigned_mem"
            if res_windows
            else "none: assigned_mem is NULL in every window with a memory limit"
            if int(c[_SLOTS + 2])
            else "none: no window has a memory limit"
        ),
    }
    return {
        "task_summary": rows_table(rows, TASK_SUMMARY_SCHEMA),
        "task_hist": bin_table(
            hists["hist"], lo, hi, "ratio", "tasks", TASK_HIST_SCHEMA, band=hists["band"], measure=hists["measure"]
        ),
    }, info


def to_backend(be: Any, v: Any) -> Any:
    """Array ``v`` on backend ``be``: left where it is when it is there already (a device partial
    finalized on the device), else copied (to the host for the cpu backend)."""
    return to_host(v) if be.name == "cpu" else be.xp.asarray(v)


def ratio_schemas(group: str, unit: str) -> tuple[pa.Schema, pa.Schema]:
    """The summary and histogram tables' columns and types of a usage/limit ratio over ``unit``
    rows (windows or tasks) grouped by ``group`` (tier or band); an empty table keeps them."""
    counts = (unit, "no_limit", "unknown", "defined", "above_limit", "at_most_half")
    shares = (
        "above_limit_share",
        "at_most_half_share",
        "mean_ratio",
        "p10_ratio",
        "p50_ratio",
        "p90_ratio",
        "p99_ratio",
    )
    head = [(group, pa.string()), ("measure", pa.string())]
    summary = pa.schema([*head, *((c, pa.int64()) for c in counts), *((c, pa.float64()) for c in shares)])
    hist = pa.schema(
        [*head, ("bin", pa.int64()), ("lo_ratio", pa.float64()), ("hi_ratio", pa.float64()), (unit, pa.int64())]
    )
    return summary, hist


TASK_SUMMARY_SCHEMA, TASK_HIST_SCHEMA = ratio_schemas("band", "tasks")
