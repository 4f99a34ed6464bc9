"""``lifecycle``'s constants (the v3 state machine, the partials' slots), series partial and
finalize tables (see :mod:`gpuclust.analyses.lifecycle` and docs/analyses/lifecycle.md): kept apart
so that each module stays short."""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa

from gpuclust.analyses.grouping import FloatBins
from gpuclust.arrow_numpy import bin_table, empty_table, labels, rows_table, table
from gpuclust.keys import unpack
from gpuclust.partials import bin_quantile_edges, keyed_reduce
from gpuclust.schema import EventType
from gpuclust.tiers import TIER_SLOTS

__all__ = [
    "DELAY_EDGES_US",
    "DISTRIBUTIONS",
    "EVENT_NAMES",
    "EXPECTED",
    "STATE_AFTER",
    "SERIES_FIELDS",
    "delay_bins",
    "delays_tables",
    "series_partial",
    "series_table",
]

_NE = len(EventType)
#: Event type names, by v3 code.
EVENT_NAMES: tuple[str, ...] = tuple(e.name for e in EventType)
_NONE, _PENDING, _RUNNING, _DEAD = 0, 1, 2, 3
#: The state (1 pending, 2 running, 3 dead) an instance is in after each event type (v3 code).
STATE_AFTER = np.array(
    [_PENDING, _PENDING, _PENDING, _RUNNING, _DEAD, _DEAD, _DEAD, _DEAD, _DEAD, _PENDING, _RUNNING], dtype=np.int64
)
#: Events that may follow each state in the v3 document's state diagram.
EXPECTED: dict[int, frozenset[int]] = {
    _PENDING: frozenset(
        {
            EventType.QUEUE,
            EventType.ENABLE,
            EventType.SCHEDULE,
            EventType.UPDATE_PENDING,
            EventType.FAIL,
            EventType.KILL,
            EventType.LOST,
        }
    ),
    _RUNNING: frozenset(
        {EventType.UPDATE_RUNNING, EventType.EVICT, EventType.FAIL, EventType.FINISH, EventType.KILL, EventType.LOST}
    ),
    _DEAD: frozenset({EventType.SUBMIT}),
}
_COUNTERS = (
    "rows",
    "invalid_type_rows",
    "instances",
    "first_not_submit",
    "unknown_priority_instances",
    "time_zero_events",
    "after_trace_events",
    "present_at_start",
    "synthesized_events",
    "synthesized_duration_episodes",
    "priority_from_instances",
)

#: The ``series`` counters, in order (the last four: changes of the pending, running, queued and
#: eligible levels, summed into levels at finalize).
SERIES_FIELDS = (
    "submissions",
    "new_submissions",
    "resubmissions",
    "present_at_start",
    "schedules",
    "evictions",
    "failures",
    "finishes",
    "kills",
    "losses",
    "d_pending",
    "d_running",
    "d_queued",
    "d_eligible",
)
_LEVELS = ("pending", "running", "queued", "eligible")
#: An event's class in the series: SUBMIT 0 (1 when the instance was submitted before), SCHEDULE 2,
#: EVICT 3, FAIL 4, FINISH 5, KILL 6, LOST 7, any other type 8; 9 (set in the replay): the first
#: SUBMIT, at time 0, of an instance present at the trace start.
_SERIES_CLASS = np.full(_NE, 8, np.int64)
for _k, _ev in enumerate(
    (EventType.SCHEDULE, EventType.EVICT, EventType.FAIL, EventType.FINISH, EventType.KILL, EventType.LOST)
):
    _SERIES_CLASS[int(_ev)] = 2 + _k
_SERIES_CLASS[int(EventType.SUBMIT)] = 0
#: Codes per event: the classes above x 3 changes (-1, 0, +1) of each of the four levels x 2 (the
#: first event of an instance present at the trace start).
_SERIES_CLASSES = 10
_SERIES_CODES = _SERIES_CLASSES * 3 * 3 * 3 * 3 * 2
#: (measure, outcome) of every delay distribution, in order.
DISTRIBUTIONS: tuple[tuple[str, str], ...] = (
    *(
        ("scheduling", o)
        for o in ("scheduled", "evict", "fail", "finish", "kill", "lost", "resubmitted", "other", "censored")
    ),
    ("enable_to_schedule", "scheduled"),
    *(("execution", o) for o in ("evict", "fail", "finish", "kill", "lost", "interrupted", "censored")),
    *(("queued", o) for o in ("enabled", "scheduled", "resubmitted", "died", "other", "censored")),
)
_D = len(DISTRIBUTIONS)
_DI = {d: k for k, d in enumerate(DISTRIBUTIONS)}
#: Outcome of a pending episode by the v3 code of the event that ends it.
_PENDING_EXIT = np.array(
    [
        _DI["scheduling", o]
        for o in (
            "resubmitted",
            "other",
            "other",
            "scheduled",
            "evict",
            "fail",
            "finish",
            "kill",
            "lost",
            "other",
            "other",
        )
    ],
    np.int64,
)
#: Outcome of a run by the v3 code of the event that ends it.
_RUNNING_EXIT = np.array(
    [
        _DI["execution", o]
        for o in (
            "interrupted",
            "interrupted",
            "interrupted",
            "interrupted",
            "evict",
            "fail",
            "finish",
            "kill",
            "lost",
            "interrupted",
            "interrupted",
        )
    ],
    np.int64,
)
#: Outcome of a queued stretch (QUEUE to the event that ends the deferral) by the v3 code of that
#: event (QUEUE and UPDATE_PENDING never end one).
_QUEUED_EXIT = np.array(
    [
        _DI["queued", o]
        for o in (
            "resubmitted",
            "other",
            "enabled",
            "scheduled",
            "died",
            "died",
            "died",
            "died",
            "died",
            "other",
            "other",
        )
    ],
    np.int64,
)
#: Lower edges (µs) of the delay bins 1, 2, ...: the distinct ``ceil(10^(k/50))``, k = 0..650 (1 µs to
#: 10^13 µs, about 116 days); bin 0 holds zero delays, the last bin everything from 10^13 µs on.
#: (``np.ceil`` of an increasing sequence is non-decreasing: the distinct ones are those unlike their
#: predecessor; ``np.unique`` would import ``numpy.ma``, ~15 ms of every run's start-up)
_EDGES = np.ceil(10.0 ** (np.arange(651) / 50.0)).astype(np.int64)
DELAY_EDGES_US = _EDGES[np.concatenate([[True], _EDGES[1:] != _EDGES[:-1]])]
_B = int(DELAY_EDGES_US.shape[0]) + 1
#: :func:`delay_bins`' table: each octave of durations from 1 µs to 2^44 µs in 64 cells, each
#: holding at most one edge.
_DELAY_BINS = FloatBins(DELAY_EDGES_US.astype(np.float64), bits=6, lo=1.0, hi=2.0**44, what="lifecycle delay bins")


def delay_bins(xp: Any, dur: Any, cells: Any = None, edges: Any = None) -> Any:
    """``searchsorted(DELAY_EDGES_US, dur, side="right")`` (int64) for int64 durations: the bin of
    the duration's cell (its float64 exponent and top mantissa bits: exact below 2^53, and every
    edge lies below), plus one where the cell's edge lies at or below it.

    >>> d = np.array([-5, 0, 1, 2, 99, 100, 101, 10**13 - 1, 10**13, 2**62])
    >>> (delay_bins(np, d) == np.searchsorted(DELAY_EDGES_US, d, side="right")).all()
    np.True_
    """
    return _DELAY_BINS.bins(xp, dur.astype(xp.float64), cells, edges)


#: Tier slots of the dense partials (:data:`gpuclust.tiers.TIER_SLOTS`).
_T = TIER_SLOTS
#: Kinds of thing (``collection_type`` 0, 1, NULL or other): the dense partials' first axis is
#: kind x tier, ``kind * _T + tier``.
_K = 3
_NS = _K * _T


def series_partial(backend: Any, key: Any, code: Any) -> dict[str, Any]:
    """The series partial: per (bucket, tier) ``key`` with at least one event, the event counts of
    :data:`SERIES_FIELDS` and the net level changes, from one count per (key, code) (``code``:
    class x pending, running, queued and eligible change x present-at-start flag, see
    :data:`_SERIES_CODES`)."""
    xp = backend.xp
    got = keyed_reduce(backend, key * _SERIES_CODES + code, {}, {"n": None})
    fused, n = got["key"], got["n"]
    k = fused // _SERIES_CODES
    first = xp.ones(k.shape[0], dtype=bool)
    first[1:] = k[1:] != k[:-1]
    row = xp.cumsum(first) - 1
    m = xp.zeros((int(first.sum()), _SERIES_CODES), dtype=xp.int64)
    m[row, fused % _SERIES_CODES] = n
    m = m.reshape(-1, _SERIES_CLASSES, 3, 3, 3, 3, 2)
    per = m.sum(axis=(2, 3, 4, 5, 6))
    out = {
        "key": k[first].astype(xp.int64),
        "submissions": per[:, 0] + per[:, 1] + per[:, 9],
        "new_submissions": per[:, 0],
        "resubmissions": per[:, 1],
        "present_at_start": m[:, :, :, :, :, :, 1].sum(axis=(1, 2, 3, 4, 5)),
    }
    for j, f in enumerate(("schedules", "evictions", "failures", "finishes", "kills", "losses")):
        out[f] = per[:, 2 + j]
    for j, f in enumerate(("d_pending", "d_running", "d_queued", "d_eligible")):
        ch = xp.moveaxis(m, 2 + j, 1).reshape(m.shape[0], 3, _SERIES_CODES // 3).sum(axis=2)
        out[f] = ch[:, 2] - ch[:, 0]
    return {f: xp.ascontiguousarray(out[f]) for f in ("key", *SERIES_FIELDS)}


#: The result tables' columns and types (an empty table keeps them).
EVENTS_SCHEMA = pa.schema([("tier", pa.string()), ("event", pa.string()), ("count", pa.int64())])
TRANSITIONS_SCHEMA = pa.schema(
    [
        ("tier", pa.string()),
        ("from_event", pa.string()),
        ("to_event", pa.string()),
        ("count", pa.int64()),
        ("expected", pa.bool_()),
    ]
)
DELAYS_SCHEMA = pa.schema(
    [
        ("tier", pa.string()),
        ("measure", pa.string()),
        ("outcome", pa.string()),
        ("episodes", pa.int64()),
        ("with_duration", pa.int64()),
        *((c, pa.float64()) for c in ("mean_s", "min_s", "p50_s", "p90_s", "p99_s", "max_s")),
    ]
)
EVENTS_BY_KIND_SCHEMA = pa.schema([("kind", pa.string()), *EVENTS_SCHEMA])


def with_kind(t: pa.Table, kind: str) -> pa.Table:
    return t.add_column(
        0, "kind", labels([kind], np.zeros(t.num_rows, np.int64))
    )  # (no pa.array of a list: it imports pandas)


HIST_SCHEMA = pa.schema(
    [
        ("tier", pa.string()),
        ("measure", pa.string()),
        ("outcome", pa.string()),
        ("bin", pa.int64()),
        ("lo_s", pa.float64()),
        ("hi_s", pa.float64()),
        ("episodes", pa.int64()),
    ]
)


def series_table(s: dict[str, np.ndarray], names: tuple[str, ...], bucket_s: int) -> pa.Table:
    """The ``series`` table from the merged keyed series: every bucket from the first to the last
    event for each tier with events, levels summed from their changes."""
    width_us = int(bucket_s) * 1_000_000
    cols = ["bucket", "bucket_start_us", "tier", *SERIES_FIELDS[:-4], *_LEVELS]
    key = np.asarray(s["key"], np.int64)
    if key.shape[0] == 0:
        return empty_table(pa.schema([(c, pa.string() if c == "tier" else pa.int64()) for c in cols]))
    T = len(names)
    bucket, code = unpack(key, _T)
    b0, b1 = int(bucket.min()), int(bucket.max())
    nb = b1 - b0 + 1
    if nb * T > 1 << 26:
        raise ValueError(f"lifecycle: event times span {nb} buckets of {bucket_s} s; choose a larger bucket_s")
    grid = {f: np.zeros((T, nb), np.int64) for f in SERIES_FIELDS}
    for f in SERIES_FIELDS:
        grid[f][code, bucket - b0] = np.asarray(s[f], np.int64)
    # every tier that has events gets every bucket (levels carry over buckets without events),
    # rows by bucket, then in the tier map's order
    present = np.flatnonzero(np.bincount(code, minlength=_T))  # the tiers with events, in order
    b = np.arange(b0, b1 + 1, dtype=np.int64)
    tcode = np.repeat(present, nb)
    bb = np.tile(b, present.shape[0])
    order = np.lexsort((tcode, bb))
    out: dict[str, Any] = {
        "bucket": bb[order],
        "bucket_start_us": (bb * width_us)[order],
        "tier": labels(names, tcode[order]),
    }
    for f in SERIES_FIELDS[:-4]:
        out[f] = grid[f][present].ravel()[order]
    for f in _LEVELS:
        out[f] = np.cumsum(grid["d_" + f][present], axis=1).ravel()[order]
    return table({c: out[c] for c in cols})


def delays_tables(p: dict[str, Any], names: tuple[str, ...]) -> tuple[pa.Table, pa.Table]:
    """The ``delays`` and ``delay_hist`` tables of per-tier partial arrays (tier first)."""
    T = len(names)
    edges_s = DELAY_EDGES_US / 1e6
    lo_s = np.concatenate([[0.0], edges_s])
    hi_s = np.concatenate([[0.0], edges_s[1:], [np.inf]])
    rows: list[dict[str, Any]] = []
    hists: dict[str, list[Any]] = {"hist": [], "tier": [], "measure": [], "outcome": []}
    for k in range(T):
        for d, (measure, outcome) in enumerate(DISTRIBUTIONS):
            n_ep = int(p["episodes"][k, d])
            if not n_ep:
                continue
            h = p["hist"][k, d]
            known = int(h.sum())
            row = {
                "tier": names[k],
                "measure": measure,
                "outcome": outcome,
                "episodes": n_ep,
                "with_duration": known,
                "mean_s": np.nan,
                "min_s": np.nan,
                "p50_s": np.nan,
                "p90_s": np.nan,
                "p99_s": np.nan,
                "max_s": np.nan,
            }
            if known:
                lo_min = int(p["dur_min"][k, d]) / 1e6
                row.update(
                    mean_s=float(p["dur_sum"][k, d]) / known / 1e6, min_s=lo_min, max_s=int(p["dur_max"][k, d]) / 1e6
                )
                # the bin of each inverted-CDF quantile: its lower edge (not below the minimum)
                for q, v in bin_quantile_edges(h, lo_s, (50, 90, 99)).items():
                    row[f"p{q}_s"] = float(max(v, lo_min))
                for hk, hv in (("hist", h), ("tier", names[k]), ("measure", measure), ("outcome", outcome)):
                    hists[hk].append(hv)
            rows.append(row)
    return rows_table(rows, DELAYS_SCHEMA), bin_table(
        hists["hist"],
        lo_s,
        hi_s,
        "s",
        "episodes",
        HIST_SCHEMA,
        tier=hists["tier"],
        measure=hists["measure"],
        outcome=hists["outcome"],
    )
