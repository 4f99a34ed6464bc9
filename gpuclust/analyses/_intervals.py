"""Interval construction for ``overcommit``: running intervals of instances and capacity intervals
of machines (NumPy, vectorised; no per-instance Python loop), and their sparse reduction to
(group, bucket) sums.

Both constructions need each thing's events *in order*, which a row partition of the event
tables does not give.  ``running_intervals`` therefore runs over whole instances: in ``bind`` of
each partition of a source bucketed by ``(collection_id, instance_index)`` (the partition holds
every event of its instances), or once over the whole table on a flat source.  No interval
crosses instances, so per-partition results add up.  :func:`overlap_keyed` and
:func:`distinct_keyed` reduce pieces to keyed sums in O(pieces + cells touched) (never groups x
buckets).  See ``docs/analysis-overcommit.md``.

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

from gpuclust.analyses.grouping import isin_sorted

__all__ = ["CapacityIntervals", "RunningIntervals", "capacity_intervals", "distinct_keyed", "distinct_running",
           "overlap_keyed", "running_intervals"]

SCHEDULE = 3
TERMINALS = (4, 5, 6, 7, 8)  # EVICT FAIL FINISH KILL LOST
UPDATE_RUNNING = 10
M_ADD, M_REMOVE, M_UPDATE = 1, 2, 3


@dataclass(frozen=True)
class RunningIntervals:
    """Running pieces (one per SCHEDULE / UPDATE_RUNNING that opened one), times clipped."""

    instance: np.ndarray        # int64 dense instance id (index into the sorted distinct instances)
    machine_id: np.ndarray      # int64 (0 / NULL-min = not placed, -1 = dedicated)
    start: np.ndarray           # int64 us, clipped
    end: np.ndarray             # int64 us, clipped
    req_cpu: np.ndarray         # float64, NaN = unknown
    req_mem: np.ndarray
    priority: np.ndarray        # float64, NaN = unknown
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


def _group_starts(new_group: np.ndarray) -> np.ndarray:
    """Index of the first row of each row's group (rows sorted by group)."""
    idx = np.where(new_group, np.arange(new_group.shape[0]), 0)
    return np.maximum.accumulate(idx) if idx.size else idx


def _ffill_idx(valid: np.ndarray, gstart: np.ndarray) -> np.ndarray:
    """Index of the last ``valid`` row at or before each row within its group, else -1."""
    n = valid.shape[0]
    idx = np.where(valid, np.arange(n), -1)
    acc = np.maximum.accumulate(idx) if n else idx
    return np.where(acc >= gstart, acc, -1)


def _take(a: np.ndarray, idx: np.ndarray, fill: Any) -> np.ndarray:
    out = a[np.maximum(idx, 0)] if a.size else np.zeros(idx.shape, a.dtype)
    return np.where(idx >= 0, out, fill)


def running_intervals(cols: dict[str, np.ndarray], start: int, end: int) -> RunningIntervals:
    """Running pieces from instance_events columns (NumPy; NULL ints = dtype min, floats NaN).

    ``cols``: time, type, collection_id, instance_index, machine_id, alloc_collection_id,
    priority (float64), req_cpu, req_mem (float64).
    """
    alloc = cols["alloc_collection_id"]
    nullmin = np.iinfo(np.int64).min
    keep = (alloc == 0) | (alloc == nullmin)
    stats = {"event_rows": int(alloc.shape[0]), "alloc_event_rows": int((~keep).sum())}
    c = cols["collection_id"][keep].astype(np.int64)
    i = cols["instance_index"][keep].astype(np.int64)
    t_raw = cols["time"][keep].astype(np.int64)
    order = np.lexsort((np.arange(c.shape[0]), t_raw, i, c))
    c, i, t_raw = c[order], i[order], t_raw[order]
    typ = cols["type"][keep][order].astype(np.int64)
    mach = cols["machine_id"][keep][order].astype(np.int64)
    prio = cols["priority"][keep][order].astype(np.float64)
    rc = cols["req_cpu"][keep][order].astype(np.float64)
    rm = cols["req_mem"][keep][order].astype(np.float64)
    n = c.shape[0]
    t = np.clip(t_raw, start, end)
    new = np.ones(n, dtype=bool)
    if n:
        new[1:] = (c[1:] != c[:-1]) | (i[1:] != i[:-1])
    inst = np.cumsum(new) - 1
    gs = _group_starts(new)
    is_sched = typ == SCHEDULE
    is_term = isin_sorted(typ, TERMINALS)
    is_upd = typ == UPDATE_RUNNING
    k = _ffill_idx(is_sched | is_term, gs)
    run_after = _take(is_sched, k, False).astype(bool)
    run_before = np.zeros(n, dtype=bool)
    if n:
        run_before[1:] = run_after[:-1] & ~new[1:]
    cut = run_before & (is_sched | is_term | is_upd)
    opened = is_sched | (is_upd & run_before)
    op = np.nonzero(opened)[0]
    cut_pos = np.nonzero(cut)[0]
    j = np.searchsorted(cut_pos, op, side="right")
    if cut_pos.size:
        nxt = cut_pos[np.minimum(j, cut_pos.size - 1)]
        has = (j < cut_pos.size) & (inst[nxt] == inst[op])
    else:
        nxt = np.zeros(op.size, dtype=np.int64)
        has = np.zeros(op.size, dtype=bool)
    p_start = t[op]
    p_end = np.where(has, t[nxt], np.int64(end)) if op.size else np.zeros(0, np.int64)
    ks = _ffill_idx(is_sched, gs)[op]
    p_mach = _take(mach, ks, np.int64(0))
    kc = _ffill_idx(~np.isnan(rc), gs)[op]
    km = _ffill_idx(~np.isnan(rm), gs)[op]
    kp = _ffill_idx(~np.isnan(prio), gs)[op]
    p_cpu = _take(rc, kc, np.nan)
    p_mem = _take(rm, km, np.nan)
    p_pri = _take(prio, kp, np.nan)
    stats.update({
        "instances": int(new.sum()),
        "pieces": int(op.shape[0]),
        "schedules": int(is_sched.sum()),
        "running_at_end": int((~has).sum()),
        "terminal_without_schedule": int((is_term & ~run_before).sum()),
        "update_running_not_running": int((is_upd & ~run_before).sum()),
        "schedule_while_running": int((is_sched & run_before).sum()),
        "unknown_request_pieces": int((np.isnan(p_cpu) | np.isnan(p_mem)).sum()),
    })
    return RunningIntervals(inst[op].astype(np.int64), p_mach.astype(np.int64), p_start.astype(np.int64),
                            p_end.astype(np.int64), p_cpu, p_mem, p_pri, stats)


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
    gs = _group_starts(new)
    ku = _ffill_idx((typ == M_ADD) | (typ == M_REMOVE), gs)
    up = _take(typ == M_ADD, ku, False).astype(bool)
    kc = _ffill_idx((typ == M_ADD) | (typ == M_UPDATE), gs)
    cap_c = _take(cc, kc, np.nan)
    cap_m = _take(cm, kc, np.nan)
    nxt_t = np.full(n, np.int64(end))
    if n:
        same = ~new[1:]
        nxt_t[:-1] = np.where(same, t[1:], np.int64(end))
    sel = up & (nxt_t > t)
    stats["machines"] = int(new.sum())
    return CapacityIntervals(m[sel], t[sel], nxt_t[sel], cap_c[sel], cap_m[sel], stats)


def distinct_running(code: np.ndarray, instance: np.ndarray, start: np.ndarray, end: np.ndarray,
                     n_machines: int, origin: int, width: int, n_buckets: int) -> np.ndarray:
    """Distinct instances with a running piece of positive overlap in each (machine, bucket).

    Per (machine, instance) the pieces' bucket ranges are merged (overlapping ranges once), then
    counted with a difference array: O(pieces + machines x buckets), never pieces x buckets.
    """
    out = np.zeros((n_machines, n_buckets + 1), dtype=np.int64)
    ok = (end > start) & (code >= 0)
    code, instance, start, end = code[ok], instance[ok], start[ok], end[ok]
    if code.shape[0] == 0 or n_buckets == 0:
        return out[:, :n_buckets]
    b0 = (start - origin) // width
    b1 = (end - 1 - origin) // width
    order = np.lexsort((b0, instance, code))
    code, instance, b0, b1 = code[order], instance[order], b0[order], b1[order]
    new = np.ones(code.shape[0], dtype=bool)
    new[1:] = (code[1:] != code[:-1]) | (instance[1:] != instance[:-1])
    grp = np.cumsum(new) - 1
    # running max of b1 within each group: offset groups so a global accumulate never crosses them
    off = grp.astype(np.int64) * (np.int64(n_buckets) + 2)
    runmax = np.maximum.accumulate(b1 + off) - off
    prev = np.empty_like(runmax)
    prev[0] = -2
    prev[1:] = np.where(new[1:], -2, runmax[:-1])
    run_start = b0 > prev
    rid = np.cumsum(run_start) - 1
    r_code = code[run_start]
    r_b0 = b0[run_start]
    last = np.ones(code.shape[0], dtype=bool)
    last[:-1] = rid[1:] != rid[:-1]
    r_b1 = runmax[last]
    np.add.at(out, (r_code, r_b0), 1)
    np.add.at(out, (r_code, r_b1 + 1), -1)
    return np.cumsum(out, axis=1)[:, :n_buckets]



def _expand_runs(group: np.ndarray, lo: np.ndarray, hi: np.ndarray, n_buckets: int,
                 values: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """Sparse sweep of bucket runs ``[lo, hi)`` per group: for every (group, bucket) covered by at
    least one run, its key ``group * n_buckets + bucket`` (sorted, unique), the number of runs
    covering it, and (``values`` of shape ``(k, n)`` given) the sum of the covering runs' values.

    Runs become +/- events at their ends, sorted once; a cumulative sum gives the count (exact,
    integers) and the value (in extended precision, restarted wherever the count returns to 0 so
    rounding never carries from one busy stretch to the next) of each stretch between events, and
    the covered stretches are expanded bucket by bucket.  O(runs log runs + output cells): never
    groups x buckets.
    """
    B1 = np.int64(n_buckets) + 1
    k = 0 if values is None else values.shape[0]
    ok = hi > lo
    group, lo, hi = group[ok].astype(np.int64), lo[ok].astype(np.int64), hi[ok].astype(np.int64)
    if group.shape[0] == 0:
        return np.zeros(0, np.int64), np.zeros(0, np.int64), None if values is None else np.zeros((k, 0))
    ek = np.concatenate([group * B1 + lo, group * B1 + hi])
    order = np.argsort(ek, kind="stable")
    ek = ek[order]
    ec = np.concatenate([np.ones(lo.shape[0], np.int64), -np.ones(lo.shape[0], np.int64)])[order]
    first = np.ones(ek.shape[0], dtype=bool)
    first[1:] = ek[1:] != ek[:-1]
    at = np.nonzero(first)[0]
    uk = ek[at]
    cnt = np.cumsum(np.add.reduceat(ec, at))  # runs open after each event point
    seg = np.nonzero(cnt > 0)[0]  # an open stretch always ends at a later point of its own group
    length = uk[seg + 1] - uk[seg]
    rep = np.repeat(np.arange(seg.shape[0]), length)
    step = np.arange(rep.shape[0], dtype=np.int64) - np.repeat(np.cumsum(length) - length, length)
    kk = uk[seg][rep] + step
    key = (kk // B1) * np.int64(n_buckets) + kk % B1
    count = cnt[seg][rep]
    if values is None:
        return key, count, None
    v = np.nan_to_num(values[:, ok].astype(np.float64), nan=0.0)
    ev = np.concatenate([v, -v], axis=1)[:, order].astype(np.longdouble)
    vc = np.cumsum(np.add.reduceat(ev, at, axis=1), axis=1)
    zero = np.nonzero(cnt == 0)[0]
    if zero.size:  # subtract what is left where nothing is open (pure rounding)
        last = np.maximum.accumulate(np.where(cnt == 0, np.arange(cnt.shape[0]), -1))
        vc = vc - np.where(last >= 0, vc[:, np.maximum(last, 0)], 0)
    return key, count, vc[:, seg].astype(np.float64)[:, rep]


def _group_sum(key: np.ndarray, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Sorted unique keys and the per-key sums of ``values`` (shape ``(k, n)``)."""
    order = np.argsort(key, kind="stable")
    key = key[order]
    first = np.ones(key.shape[0], dtype=bool)
    first[1:] = key[1:] != key[:-1]
    at = np.nonzero(first)[0]
    if key.shape[0] == 0:
        return key, values[:, :0]
    return key[at], np.add.reduceat(values[:, order], at, axis=1)


def overlap_keyed(group: np.ndarray, start: np.ndarray, end: np.ndarray, values: np.ndarray, origin: int,
                  width: int, n_buckets: int) -> tuple[np.ndarray, np.ndarray]:
    """Sparse twin of the ``bucket_overlap`` op: ``value * overlap_seconds(piece, bucket)`` summed
    per (group, bucket), as sorted unique keys ``group * n_buckets + bucket`` of the cells with a
    positive overlap and a ``(k, n_keys)`` array of sums (NaN values add nothing).

    Each piece adds its first and last bucket directly; the full buckets in between are a run of
    constant rate, summed by :func:`_expand_runs`.  Memory and time O(pieces + output cells).
    ``start`` / ``end`` must lie in ``[origin, origin + n_buckets * width]``.
    """
    values = np.atleast_2d(values)
    ok = end > start
    g, s, e = group[ok].astype(np.int64), start[ok].astype(np.int64), end[ok].astype(np.int64)
    v = np.nan_to_num(values[:, ok].astype(np.float64), nan=0.0)
    B = np.int64(n_buckets)
    b0 = (s - origin) // width
    b1 = (e - 1 - origin) // width
    ends = np.minimum(e, origin + (b0 + 1) * width)
    keys = [g * B + b0]
    vals = [v * ((ends - s) / 1e6)]
    multi = b1 > b0
    keys.append(g[multi] * B + b1[multi])
    vals.append(v[:, multi] * ((e[multi] - (origin + b1[multi] * width)) / 1e6))
    inner = (b1 - b0) >= 2
    if inner.any():
        ik, _, iv = _expand_runs(g[inner], b0[inner] + 1, b1[inner], n_buckets, v[:, inner])
        assert iv is not None  # values were given
        keys.append(ik)
        vals.append(iv * (width / 1e6))
    return _group_sum(np.concatenate(keys), np.concatenate(vals, axis=1))


def distinct_keyed(code: np.ndarray, instance: np.ndarray, start: np.ndarray, end: np.ndarray, origin: int,
                   width: int, n_buckets: int) -> tuple[np.ndarray, np.ndarray]:
    """Sparse :func:`distinct_running`: sorted unique keys ``code * n_buckets + bucket`` and the
    number of distinct instances with a running piece of positive overlap there.  Per (machine,
    instance) the pieces' bucket ranges are merged first (an instance counts once per bucket)."""
    ok = (end > start) & (code >= 0)
    code, instance, start, end = code[ok], instance[ok], start[ok], end[ok]
    if code.shape[0] == 0 or n_buckets == 0:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    b0 = (start - origin) // width
    b1 = (end - 1 - origin) // width
    order = np.lexsort((b0, instance, code))
    code, instance, b0, b1 = code[order], instance[order], b0[order], b1[order]
    new = np.ones(code.shape[0], dtype=bool)
    new[1:] = (code[1:] != code[:-1]) | (instance[1:] != instance[:-1])
    grp = np.cumsum(new) - 1
    off = grp.astype(np.int64) * (np.int64(n_buckets) + 2)
    runmax = np.maximum.accumulate(b1 + off) - off
    prev = np.empty_like(runmax)
    prev[0] = -2
    prev[1:] = np.where(new[1:], -2, runmax[:-1])
    run_start = b0 > prev
    rid = np.cumsum(run_start) - 1
    last = np.ones(code.shape[0], dtype=bool)
    last[:-1] = rid[1:] != rid[:-1]
    key, count, _ = _expand_runs(code[run_start], b0[run_start], runmax[last] + 1, n_buckets)
    return key, count
