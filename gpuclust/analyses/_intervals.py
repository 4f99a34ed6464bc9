"""Interval construction for ``overcommit``: running intervals of instances and capacity intervals
of machines (vectorised array code, no per-instance Python loop), and their sparse reduction to
(group, bucket) sums.

The running intervals and their sums are written against a backend (``backend.xp`` and
``backend.ops``), so ``overcommit``'s partial builds them on the GPU under ``backend="gpu"`` and
with NumPy on the cpu backend, with the same code; the capacity intervals (machine_events: small,
once per run, in the context) are NumPy.

Both constructions need each thing's events *in order*, which a row partition of the event
tables does not give.  ``running_intervals`` therefore runs over whole instances: in the
partial of each partition of a source bucketed by ``(collection_id, instance_index)`` (the
partition holds every event of its instances), or once over the whole table on a flat source.
No interval crosses instances, so per-partition results add up.  :func:`overlap_keyed` and
:func:`distinct_keyed` reduce pieces to keyed sums in O(pieces + cells touched) (never groups x
buckets), the value sums in fixed point (:func:`exact_prefix_sums`).  See
``docs/analyses/overcommit.md``.

Semantics (the slow replay in ``tests/analyses/overcommit_reference.py`` restates them with
plain loops):

* **Order.**  Events of one thing are ordered by ``time`` (raw, so 0 sorts first and 2^63-1
  last), ties by their row order in the source (real exports write EVICT, SUBMIT, SCHEDULE of
  the same microsecond in that order; sorting ties by type code would break them).
* **Clipping.**  Every event time is clipped to the trace window ``[start, end]`` (0 -> start,
  2^63-1 -> end); an interval is ``[clip(t_open), clip(t_close))``.
* **Instances** (rows with ``alloc_collection_id`` 0 or NULL only: tasks inside allocs are
  dropped row by row; their alloc instance carries their resources).  SCHEDULE opens a running
  piece on the row's machine (a SCHEDULE while running first closes the running piece);
  UPDATE_RUNNING while running closes the piece and opens a new one with the new request on the
  same machine; EVICT / FAIL / FINISH / KILL / LOST close it.  A piece still open after the last
  event runs to the window end.  A terminal event with nothing running (terminal without
  SCHEDULE) and an UPDATE_RUNNING with nothing running open nothing (counted).  The request of a
  piece is the opening row's ``req_cpu`` / ``req_mem``, each carried forward from the instance's
  previous rows (SUBMIT, UPDATE_PENDING, ...) when NULL; still unknown -> NaN (contributes
  nothing; counted).  The priority likewise (NULL / negative -> tier ``unknown``).
* **Machines.**  ADD -> available with the row's capacity; UPDATE -> capacity changes
  (availability unchanged); REMOVE -> unavailable (capacity 0) until the next ADD; before the
  first ADD a machine is unavailable.  A NULL capacity is *unknown* (NaN), never guessed.  Events
  of type 0 (UNKNOWN) are ignored.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from gpuclust.analyses.grouping import bucket_span, instance_order, isin_sorted, segmented_last
from gpuclust.keys import pack, unpack
from gpuclust.partials import keyed_reduce

__all__ = [
    "CapacityIntervals",
    "RunningIntervals",
    "capacity_intervals",
    "distinct_keyed",
    "exact_prefix_sums",
    "overlap_keyed",
    "running_intervals",
]

SCHEDULE = 3
TERMINALS = (4, 5, 6, 7, 8)  # EVICT FAIL FINISH KILL LOST (consecutive codes)
UPDATE_RUNNING = 10
M_ADD, M_REMOVE, M_UPDATE = 1, 2, 3


@dataclass(frozen=True)
class RunningIntervals:
    """Running pieces (one per SCHEDULE / UPDATE_RUNNING that opened one), times clipped; arrays
    on the backend the pieces were built on."""

    instance: Any  # int64 dense instance id (index into the sorted distinct instances)
    machine_id: Any  # int64 (0 / NULL-min = not placed, -1 = dedicated)
    start: Any  # int64 us, clipped
    end: Any  # int64 us, clipped
    req_cpu: Any  # float64, NaN = unknown
    req_mem: Any
    priority: Any  # float64, NaN = unknown
    stats: dict[str, int]


@dataclass(frozen=True)
class CapacityIntervals:
    """Pieces during which a machine is available, with its capacity (NaN = unknown)."""

    machine_id: np.ndarray
    start: np.ndarray
    end: np.ndarray
    cap_cpu: np.ndarray
    cap_mem: np.ndarray
    stats: dict[str, int]


def _group_starts(xp: Any, new_group: Any) -> Any:
    """Index of the first row of each row's group (rows sorted by group; ``new_group[0]`` set)."""
    return segmented_last(None, xp, new_group, xp.zeros(new_group.shape[0], dtype=xp.int64))


def _ffill_idx(xp: Any, valid: Any, gstart: Any) -> Any:
    """Index of the last ``valid`` row at or before each row within its group, else -1."""
    return segmented_last(None, xp, valid, gstart)


def _take(xp: Any, a: Any, idx: Any, fill: Any) -> Any:
    out = a[xp.maximum(idx, 0)] if a.shape[0] else xp.zeros(idx.shape, a.dtype)
    return xp.where(idx >= 0, out, fill)


def running_intervals(backend: Any, cols: dict[str, Any], start: int, end: int) -> RunningIntervals:
    """Running pieces from instance_events columns on ``backend`` (NULL ints = dtype min, floats
    NaN): one sort of the rows by (collection, instance, time, row) and O(n) scans; no loop.

    ``cols``: time, type, collection_id, instance_index, machine_id, alloc_collection_id,
    priority (float64), req_cpu, req_mem (float64).
    """
    xp = backend.xp
    alloc = cols["alloc_collection_id"]
    nullmin = np.iinfo(np.int64).min
    keep = xp.nonzero((alloc == 0) | (alloc == nullmin))[0]
    stats = {"event_rows": int(alloc.shape[0]), "alloc_event_rows": int(alloc.shape[0] - keep.shape[0])}
    c = cols["collection_id"][keep].astype(xp.int64)
    i = cols["instance_index"][keep].astype(xp.int64)
    t_raw = cols["time"][keep].astype(xp.int64)
    perm = instance_order(xp, c, i, t_raw)  # lexsort((row, time, instance, collection))
    order = keep[perm]  # the rows of ``cols`` in that order
    c, i, t_raw = c[perm], i[perm], t_raw[perm]
    typ = cols["type"][order].astype(xp.int64)
    n = int(c.shape[0])
    t = xp.clip(t_raw, start, end)
    new = xp.ones(n, dtype=bool)
    if n:
        new[1:] = (c[1:] != c[:-1]) | (i[1:] != i[:-1])
    del c, i, t_raw
    inst = xp.cumsum(new) - 1
    gs = _group_starts(xp, new)
    is_sched = typ == SCHEDULE
    is_term = (typ >= TERMINALS[0]) & (typ <= TERMINALS[-1])
    is_upd = typ == UPDATE_RUNNING
    k = _ffill_idx(xp, is_sched | is_term, gs)
    run_after = _take(xp, is_sched, k, False).astype(bool)
    run_before = xp.zeros(n, dtype=bool)
    if n:
        run_before[1:] = run_after[:-1] & ~new[1:]
    cut = run_before & (is_sched | is_term | is_upd)
    opened = is_sched | (is_upd & run_before)
    op = xp.nonzero(opened)[0]
    cut_pos = xp.nonzero(cut)[0]
    j = xp.searchsorted(cut_pos, op, side="right")
    if cut_pos.shape[0]:
        nxt = cut_pos[xp.minimum(j, cut_pos.shape[0] - 1)]
        has = (j < cut_pos.shape[0]) & (inst[nxt] == inst[op])
    else:
        nxt = xp.zeros(op.shape[0], dtype=xp.int64)
        has = xp.zeros(op.shape[0], dtype=bool)
    p_start = t[op]
    p_end = xp.where(has, t[nxt], end) if op.shape[0] else xp.zeros(0, xp.int64)
    p_mach = _take(xp, cols["machine_id"][order].astype(xp.int64), _ffill_idx(xp, is_sched, gs)[op], 0)

    def carried(name: str) -> Any:  # the value at the piece's opening row, carried forward from earlier rows
        v = cols[name][order].astype(xp.float64)
        return _take(xp, v, _ffill_idx(xp, ~xp.isnan(v), gs)[op], xp.nan)

    p_cpu, p_mem, p_pri = carried("req_cpu"), carried("req_mem"), carried("priority")
    stats.update(
        {
            "instances": int(new.sum()),
            "pieces": int(op.shape[0]),
            "schedules": int(is_sched.sum()),
            "running_at_end": int((~has).sum()),
            "terminal_without_schedule": int((is_term & ~run_before).sum()),
            "update_running_not_running": int((is_upd & ~run_before).sum()),
            "schedule_while_running": int((is_sched & run_before).sum()),
            "unknown_request_pieces": int((xp.isnan(p_cpu) | xp.isnan(p_mem)).sum()),
        }
    )
    return RunningIntervals(
        inst[op].astype(xp.int64),
        p_mach.astype(xp.int64),
        p_start.astype(xp.int64),
        p_end.astype(xp.int64),
        p_cpu,
        p_mem,
        p_pri,
        stats,
    )


def capacity_intervals(cols: dict[str, np.ndarray], start: int, end: int) -> CapacityIntervals:
    """Available-capacity pieces from machine_events columns: time, machine_id, type,
    cap_cpu, cap_mem (float64, NaN = NULL)."""
    typ = cols["type"].astype(np.int64)
    keep = isin_sorted(typ, (M_ADD, M_REMOVE, M_UPDATE))
    stats = {"machine_event_rows": int(typ.shape[0]), "machine_events_ignored": int((~keep).sum())}
    m = cols["machine_id"][keep].astype(np.int64)
    t_raw = cols["time"][keep].astype(np.int64)
    order = np.lexsort((np.arange(m.shape[0]), t_raw, m))
    m, t_raw, typ = m[order], t_raw[order], typ[keep][order]
    cc = cols["cap_cpu"][keep][order].astype(np.float64)
    cm = cols["cap_mem"][keep][order].astype(np.float64)
    n = m.shape[0]
    t = np.clip(t_raw, start, end)
    new = np.ones(n, dtype=bool)
    if n:
        new[1:] = m[1:] != m[:-1]
    gs = _group_starts(np, new)
    ku = _ffill_idx(np, (typ == M_ADD) | (typ == M_REMOVE), gs)
    up = _take(np, typ == M_ADD, ku, False).astype(bool)
    kc = _ffill_idx(np, (typ == M_ADD) | (typ == M_UPDATE), gs)
    cap_c = _take(np, cc, kc, np.nan)
    cap_m = _take(np, cm, kc, np.nan)
    nxt_t = np.full(n, np.int64(end))
    if n:
        same = ~new[1:]
        nxt_t[:-1] = np.where(same, t[1:], np.int64(end))
    sel = up & (nxt_t > t)
    stats["machines"] = int(new.sum())
    return CapacityIntervals(m[sel], t[sel], nxt_t[sel], cap_c[sel], cap_m[sel], stats)


#: Bits of the fixed-point words of :func:`exact_prefix_sums` (two signed words per value).
_WORD_BITS = 31


def exact_prefix_sums(xp: Any, values: Any, at: Any) -> Any:
    """``cumsum(values, axis=1)[:, at]`` of float64 ``values`` (shape ``(k, n)``), in fixed point.

    Each row's values become two int64 fixed-point words scaled to the row's largest magnitude
    (below ``2**E``): the high word holds the bits from ``2**(E-1)`` down to ``2**(E-31)``, the
    low word the next 31, so a value loses only what lies below ``2**(E-62)`` (about 2e-19 of the
    largest).  Integer prefix sums are exact in any order and on any backend (no extended
    precision, which CuPy lacks), and each result joins the high and the low sum with one
    rounding.  So a sweep's long run of +v / -v events never drifts: where everything opened has
    closed, the sum is exactly 0.  Holds while the values not yet cancelled at a point are fewer
    than 2**22 (sums of words below 2**53).

    >>> import numpy as np
    >>> v = np.array([[0.1, 0.2, -0.1, -0.2, 0.5]])
    >>> exact_prefix_sums(np, v, np.array([1, 3, 4])).tolist()
    [[0.30000000000000004, 0.0, 0.5]]
    """
    k = int(values.shape[0])
    out = xp.zeros((k, int(at.shape[0])), dtype=xp.float64)
    for r in range(k):
        v = values[r]
        m = float(xp.abs(v).max()) if v.shape[0] else 0.0
        if m == 0.0:
            continue
        e = int(np.frexp(m)[1])  # m < 2**e
        # |x| < 2**31; scaling by a power of two is exact (ldexp: no power of two that overflows
        # or underflows on its own, as 2.0 ** 1093 would for a subnormal row)
        x = xp.ldexp(v, _WORD_BITS - e)
        hi = xp.trunc(x)
        lo = xp.trunc(xp.ldexp(x - hi, _WORD_BITS))  # x - hi is exact; its next 31 bits
        sh = xp.cumsum(hi.astype(xp.int64))[at].astype(xp.float64)
        sl = xp.cumsum(lo.astype(xp.int64))[at].astype(xp.float64)
        out[r] = xp.ldexp(sh, e - _WORD_BITS) + xp.ldexp(sl, e - 2 * _WORD_BITS)
    return out


def _expand_runs(
    backend: Any, group: Any, lo: Any, hi: Any, n_buckets: int, values: Any = None
) -> tuple[Any, Any, Any]:
    """Sparse sweep of bucket runs ``[lo, hi)`` per group: for every (group, bucket) covered by at
    least one run, its key ``group * n_buckets + bucket`` (sorted, unique), the number of runs
    covering it, and (``values`` of shape ``(k, n)`` given) the sum of the covering runs' values.

    Runs become +/- events at their ends, sorted once; prefix sums give the count and the value
    sums (:func:`exact_prefix_sums`) of each stretch between events, and the covered stretches are
    expanded bucket by bucket.  O(runs log runs + output cells): never groups x buckets.
    """
    xp = backend.xp
    B1 = n_buckets + 1
    k = 0 if values is None else int(values.shape[0])
    ok = xp.nonzero(hi > lo)[0]
    group, lo, hi = group[ok].astype(xp.int64), lo[ok].astype(xp.int64), hi[ok].astype(xp.int64)
    m = int(group.shape[0])
    if m == 0:
        empty = xp.zeros(0, xp.int64)
        return empty, empty, None if values is None else xp.zeros((k, 0))
    ek = xp.concatenate([pack(group, lo, B1), pack(group, hi, B1)])
    order = backend.ops.stable_argsort(ek)
    ek = ek[order]
    ec = xp.where(order < m, 1, -1).astype(xp.int64)
    last = xp.ones(2 * m, dtype=bool)  # the last event of each distinct point
    last[:-1] = ek[1:] != ek[:-1]
    at = xp.nonzero(last)[0]
    uk = ek[at]
    cnt = xp.cumsum(ec)[at]  # runs open after each event point
    seg = xp.nonzero(cnt > 0)[0]  # an open stretch always ends at a later point of its own group
    length = uk[seg + 1] - uk[seg]
    ends = xp.cumsum(length)
    total = int(ends[-1]) if seg.shape[0] else 0
    rep = xp.zeros(total, dtype=xp.int64)  # each output cell's stretch
    if seg.shape[0] > 1:
        rep[ends[:-1]] = 1
    rep = xp.cumsum(rep)
    kk = uk[seg][rep] + (xp.arange(total, dtype=xp.int64) - (ends - length)[rep])
    key = pack(*unpack(kk, B1), n_buckets)
    count = cnt[seg][rep]
    if values is None:
        return key, count, None
    v = xp.nan_to_num(values[:, ok].astype(xp.float64), nan=0.0)
    ev = xp.concatenate([v, -v], axis=1)[:, order]
    return key, count, exact_prefix_sums(xp, ev, at[seg])[:, rep]


def overlap_keyed(
    backend: Any, group: Any, start: Any, end: Any, values: Any, origin: int, width: int, n_buckets: int
) -> tuple[Any, Any]:
    """Sparse twin of the ``bucket_overlap`` op: ``value * overlap_seconds(piece, bucket)`` summed
    per (group, bucket), as sorted unique keys ``group * n_buckets + bucket`` of the cells with a
    positive overlap and a ``(k, n_keys)`` array of sums (NaN values add nothing).

    Each piece adds its first and last bucket directly; the full buckets in between are a run of
    constant rate, summed by :func:`_expand_runs`.  Memory and time O(pieces + output cells).
    ``start`` / ``end`` must lie in ``[origin, origin + n_buckets * width]``.
    """
    xp = backend.xp
    values = values.reshape(1, -1) if values.ndim == 1 else values
    ok = xp.nonzero(end > start)[0]
    g, s, e = group[ok].astype(xp.int64), start[ok].astype(xp.int64), end[ok].astype(xp.int64)
    v = xp.nan_to_num(values[:, ok].astype(xp.float64), nan=0.0)
    B = n_buckets
    b0, b1 = bucket_span(xp, s, e, width, origin)
    ends = xp.minimum(e, origin + (b0 + 1) * width)
    keys = [pack(g, b0, B)]
    vals = [v * ((ends - s) / 1e6)]
    multi = xp.nonzero(b1 > b0)[0]
    keys.append(pack(g[multi], b1[multi], B))
    vals.append(v[:, multi] * ((e[multi] - (origin + b1[multi] * width)) / 1e6))
    inner = xp.nonzero((b1 - b0) >= 2)[0]
    if inner.shape[0]:
        ik, _, iv = _expand_runs(backend, g[inner], b0[inner] + 1, b1[inner], n_buckets, v[:, inner])
        keys.append(ik)
        vals.append(iv * (width / 1e6))
    val = xp.concatenate(vals, axis=1)
    red = keyed_reduce(backend, xp.concatenate(keys), {str(r): val[r] for r in range(int(val.shape[0]))})
    return red["key"], xp.stack([red[str(r)] for r in range(int(val.shape[0]))]) if val.shape[0] else val[:, :0]


def distinct_keyed(
    backend: Any, code: Any, instance: Any, start: Any, end: Any, origin: int, width: int, n_buckets: int
) -> tuple[Any, Any]:
    """Sorted unique keys ``code * n_buckets + bucket`` of the (machine, bucket) cells with a
    running piece of positive overlap, and the number of distinct instances there.  Per
    (machine, instance) the pieces' bucket ranges are merged first (an instance counts once per
    bucket): one sort by (machine, instance, first bucket), a running maximum of the last bucket
    within each pair, and the merged ranges swept by :func:`_expand_runs`."""
    xp = backend.xp
    ok = xp.nonzero((end > start) & (code >= 0))[0]
    code, instance, start, end = code[ok], instance[ok], start[ok], end[ok]
    n = int(code.shape[0])
    if n == 0 or n_buckets == 0:
        return xp.zeros(0, xp.int64), xp.zeros(0, xp.int64)
    b0, b1 = bucket_span(xp, start, end, width, origin)
    order = instance_order(xp, code, instance, b0)  # lexsort((b0, instance, code))
    code, instance, b0, b1 = code[order], instance[order], b0[order], b1[order]
    new = xp.ones(n, dtype=bool)
    new[1:] = (code[1:] != code[:-1]) | (instance[1:] != instance[:-1])
    # running max of b1 within each pair: offset pairs so one running maximum never crosses them
    off = (xp.cumsum(new) - 1).astype(xp.int64) * (n_buckets + 2)
    runmax = backend.ops.cummax_rows((b1 + off).reshape(1, -1))[0] - off
    prev = xp.full(n, -2, dtype=xp.int64)
    prev[1:] = xp.where(new[1:], -2, runmax[:-1])
    run_start = b0 > prev
    last = xp.ones(n, dtype=bool)  # the last piece of each merged range
    last[:-1] = run_start[1:]
    key, count, _ = _expand_runs(backend, code[run_start], b0[run_start], runmax[last] + 1, n_buckets)
    return key, count
