"""``overcommit``'s partial side (:mod:`gpuclust.analyses.overcommit`): the first pass over
instance_events (:func:`event_pass`), the keyed usage sums of a partition's windows
(:func:`usage_sums`, ``bucket_overlap`` on the chosen backend) and the keyed sums of the running
pieces of its instances (:func:`interval_partial`), with their fields' dtypes and counters.

The tunable the usage sums read (``CELL_LIMIT``) stays in :mod:`gpuclust.analyses.overcommit`,
which passes it in.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow.parquet as pq

from gpuclust._xp import bincount
from gpuclust.analyses._extent import max_below, to_i64
from gpuclust.analyses._intervals import SCHEDULE, RunningIntervals, distinct_keyed, overlap_keyed
from gpuclust.analyses._lookup import id_index
from gpuclust.analyses._overcommit_finalize import _KNOWN_FIELDS, _PARTIAL_FIELDS
from gpuclust.analyses.base import to_host
from gpuclust.analyses.grouping import bucket_span, unique_sorted
from gpuclust.analyses.kinds import Keyed
from gpuclust.keys import pack, unpack
from gpuclust.partials import keyed_reduce
from gpuclust.tiers import tier_codes

if TYPE_CHECKING:
    from gpuclust.analyses.overcommit import OvercommitContext

#: Counters of the running intervals (summed over partitions), in this order.
ISTATS = (
    "event_rows",
    "alloc_event_rows",
    "instances",
    "pieces",
    "schedules",
    "running_at_end",
    "terminal_without_schedule",
    "update_running_not_running",
    "schedule_while_running",
    "unknown_request_pieces",
    "pieces_unplaced",
    "pieces_dedicated",
    "pieces_unknown_tier",
)
#: what the first pass over instance_events reads
_PASS_COLUMNS = ["time", "type", "machine_id", "alloc_collection_id"]
_NULL = np.iinfo(np.int64).min


def _batches(source: Any, table: str, columns: list[str], rows: int = 1 << 20) -> Any:
    """``table``'s ``columns`` a row group (Parquet) or ``rows`` rows (in memory) at a time."""
    files = source.files(table) if hasattr(source, "files") else None
    if files:
        for f in files:
            pf = pq.ParquetFile(f)
            names = pf.schema_arrow.names
            if not all(c in names for c in columns):
                raise KeyError(f"{f}: no columns {[c for c in columns if c not in names]}")
            for g in range(pf.metadata.num_row_groups):
                if pf.metadata.row_group(g).num_rows:
                    yield pf.read_row_group(g, columns=columns)
        return
    t = source.read(table, columns)
    for off in range(0, t.num_rows, rows):
        yield t.slice(off, rows)


def event_pass(source: Any) -> tuple[int | None, np.ndarray]:
    """The first pass over instance_events, a batch at a time: the largest finite time, and the
    machines of top-level SCHEDULE rows (the machines running pieces can be on).  Holds one
    batch and the (small) set of machine ids."""
    best: int | None = None
    mids: list[np.ndarray] = [np.zeros(0, np.int64)]
    for t in _batches(source, "instance_events", _PASS_COLUMNS):
        v = max_below(to_i64(t.column("time")))
        if v is not None:
            best = v if best is None else max(best, v)
        alloc = to_i64(t.column("alloc_collection_id"))
        m = to_i64(t.column("machine_id"))
        sel = (to_i64(t.column("type")) == SCHEDULE) & ((alloc == 0) | (alloc == _NULL)) & (m > 0)
        mids.append(unique_sorted(m[sel]))
        if len(mids) > 64:
            mids = [unique_sorted(np.concatenate(mids))]
    return best, unique_sorted(np.concatenate(mids))


def keyed(xp: Any, key: Any, **fields: Any) -> dict[str, Any]:
    """A keyed partial: int64 ``key`` and the ``fields`` aligned with it."""
    return {"key": key.astype(xp.int64), **fields}


#: The keyed partials' fields and their dtypes (each with an int64 ``key``): the usage sums per
#: (machine, tier, bucket), the request-seconds per (machine, tier, bucket), the piece-seconds
#: and distinct instances per (machine, bucket).
USAGE_FIELDS = dict.fromkeys(_PARTIAL_FIELDS, np.float64)
REQ_FIELDS = {"req_cpu": np.float64, "req_mem": np.float64}
INST_FIELDS = {"inst": np.float64, "distinct": np.int64}


def usage_sums(
    backend: Any,
    s: Any,
    e: Any,
    g: Any,
    n_codes: int,
    vals: dict[str, Any],
    w0: int,
    width: int,
    B: int,
    cell_limit: int,
) -> dict[str, Any]:
    """Keyed usage sums: key = (machine code * T + tier) * B + bucket; ``g`` in ``[0, n_codes)``;
    ``w0`` is the grid origin (the first bucket's start), buckets counted from it.  A dense
    (groups x buckets) block of one ``bucket_overlap`` call holds at most ``cell_limit`` cells (2
    per row, 2^16 at least, for a small partition), so wide bucket ranges are cut into chunks."""
    xp = backend.xp
    if s.shape[0] == 0:
        return Keyed(fields=USAGE_FIELDS).identity(xp, backend.name)
    b0, b1 = bucket_span(xp, s, e, width, w0)
    # dense codes of the (machine, tier) pairs present: a bincount, not a sort
    present = bincount(xp, g, minlength=n_codes) > 0
    ug = xp.nonzero(present)[0].astype(xp.int64)
    ginv = (xp.cumsum(present) - 1).astype(xp.int32)[g]
    G = int(ug.shape[0])
    lo, hi = int(b0.min()), int(b1.max()) + 1
    step = max(1, min(cell_limit, max(2 * int(s.shape[0]), 1 << 16)) // max(G, 1))
    sweeps = _sweeps(xp, s, e, b0, b1, vals, w0, width)
    keys: list[Any] = []
    outs: dict[str, list[Any]] = {k: [] for k in _PARTIAL_FIELDS}
    if hi - lo > step:  # rows by first bucket once, so a chunk's rows are a slice, not a scan of all rows
        order = xp.argsort(b0, kind="stable")
        bounds = xp.searchsorted(b0[order], xp.arange(lo, hi + step, step, dtype=b0.dtype)).tolist()
    for j, c0 in enumerate(range(lo, hi, step)):
        sel = None
        if hi - lo > step:
            if bounds[j + 1] == bounds[j]:
                continue
            sel = xp.sort(order[bounds[j] : bounds[j + 1]])  # the chunk's rows, in row order
        cb1 = int(b1[sel].max()) + 1 if sel is not None else hi
        nb = cb1 - c0
        dense = _block_sums(
            backend, sweeps, ginv, sel, dict(n_groups=G, n_buckets=nb, origin=w0 + c0 * width, width=width)
        )
        nz = dense["windows"] != 0
        for k in ("use_cpu", "use_mem", "max_cpu", "max_mem"):
            nz |= dense[k] != 0
        idx = xp.nonzero(nz)[0]
        gi_nz, b_nz = unpack(idx, nb)  # the dense block's (group, bucket) of each nonzero cell
        keys.append(pack(ug[gi_nz], c0 + b_nz, B))
        for k in _PARTIAL_FIELDS:
            outs[k].append(dense[k][idx])
        del dense, nz, idx  # before the next chunk's blocks are allocated
    if len(keys) == 1:  # g-major dense layout: keys already sorted and unique
        return {"key": keys[0], **{k: v[0] for k, v in outs.items()}}
    return keyed_reduce(backend, xp.concatenate(keys), {k: xp.concatenate(v) for k, v in outs.items()})


def _sweeps(xp: Any, s: Any, e: Any, b0: Any, b1: Any, vals: dict[str, Any], w0: int, width: int) -> tuple[Any, ...]:
    """The two sweeps of the usage windows ``[s, e)`` (buckets ``b0..b1``): exact overlap (mean
    usage: ``s``, ``e`` and the values) and whole buckets (window maxima and counts, each value /
    the bucket's seconds: the windows widened to whole buckets, so that it adds once per bucket)."""
    ws = width / 1e6
    a_s = xp.ascontiguousarray(w0 + b0 * width)
    a_e = xp.ascontiguousarray(w0 + (b1 + 1) * width)
    exact = xp.stack([vals["use_cpu"].astype(xp.float64), vals["use_mem"].astype(xp.float64)])
    whole = xp.stack(
        [
            vals["max_cpu"].astype(xp.float64) / ws,
            vals["max_mem"].astype(xp.float64) / ws,
            xp.full(s.shape[0], 1.0 / ws, dtype=xp.float64),
            *[xp.isfinite(vals[k]).astype(xp.float64) / ws for k in ("use_cpu", "use_mem", "max_cpu", "max_mem")],
        ]
    )
    return xp.ascontiguousarray(s), xp.ascontiguousarray(e), exact, a_s, a_e, whole


def _block_sums(backend: Any, sweeps: tuple[Any, ...], ginv: Any, sel: Any, kw: dict[str, Any]) -> dict[str, Any]:
    """The dense (group x bucket) block (``kw``: its groups, buckets, origin and width) of each
    usage field, from the two ``sweeps`` of the rows ``sel`` (None: every row)."""
    xp, ops = backend.xp, backend.ops
    s, e, exact, a_s, a_e, whole = sweeps
    if sel is None:
        d1 = ops.bucket_overlap(s, e, exact, ginv, **kw)
        d2 = ops.bucket_overlap(a_s, a_e, whole, ginv, **kw)
    else:
        gi = xp.ascontiguousarray(ginv[sel])
        d1 = ops.bucket_overlap(
            xp.ascontiguousarray(s[sel]), xp.ascontiguousarray(e[sel]), xp.ascontiguousarray(exact[:, sel]), gi, **kw
        )
        d2 = ops.bucket_overlap(
            xp.ascontiguousarray(a_s[sel]),
            xp.ascontiguousarray(a_e[sel]),
            xp.ascontiguousarray(whole[:, sel]),
            gi,
            **kw,
        )
    return {
        "use_cpu": d1[0].reshape(-1),
        "use_mem": d1[1].reshape(-1),
        "max_cpu": d2[0].reshape(-1),
        "max_mem": d2[1].reshape(-1),
        "windows": d2[2].reshape(-1),
        **{k: d2[3 + j].reshape(-1) for j, k in enumerate(_KNOWN_FIELDS)},
    }


def interval_partial(run: RunningIntervals, ctx: OvercommitContext, backend: Any) -> dict[str, Any]:
    """Keyed sums of the running pieces (arrays on ``backend``): ``req`` (machine code * T +
    tier) * B + bucket -> request-seconds; ``inst`` machine code * B + bucket -> piece-seconds
    and distinct instances; ``istats`` counters (:data:`ISTATS`)."""
    xp = backend.xp
    T, B = ctx.n_tiers, ctx.n_buckets
    placed = xp.nonzero(run.machine_id > 0)[0]
    ps, pe = run.start[placed], run.end[placed]
    pcode, known = id_index(backend, ctx.machine_ids, run.machine_id[placed])
    if not bool(known.all()):
        raise RuntimeError("overcommit: a running piece's machine is not in the machine list (first pass)")
    pcode = pcode.astype(xp.int64)
    ptier = tier_codes(xp, ctx.tier_map, run.priority[placed], T - 1)
    kw = dict(origin=ctx.origin, width=ctx.width, n_buckets=B)
    rk, rs = overlap_keyed(
        backend, pack(pcode, ptier, T), ps, pe, xp.stack([run.req_cpu[placed], run.req_mem[placed]]), **kw
    )
    ik, iss = overlap_keyed(backend, pcode, ps, pe, xp.ones((1, ps.shape[0])), **kw)
    dk, dc = distinct_keyed(backend, pcode, run.instance[placed], ps, pe, **kw)
    # both keyed by machine code * B + bucket; a distinct count implies positive piece-seconds
    distinct = xp.zeros(ik.shape[0], xp.int64)
    distinct[xp.searchsorted(ik, dk)] = dc
    m = run.machine_id
    st = {
        **run.stats,
        "pieces_unplaced": int(((m == 0) | (m == _NULL)).sum()),
        "pieces_dedicated": int((m == -1).sum()),
        "pieces_unknown_tier": int((ptier == T - 1).sum()),
    }
    return {
        "req": keyed(xp, rk, req_cpu=rs[0], req_mem=rs[1]),
        "inst": keyed(xp, ik, inst=iss[0], distinct=distinct),
        "istats": xp.asarray(np.array([st[k] for k in ISTATS], dtype=np.int64)),
    }


def interval_partials(
    run: RunningIntervals, ctx: OvercommitContext, backend: Any, machines: int
) -> Iterator[dict[str, Any]]:
    """:func:`interval_partial` of ``run``'s pieces, ``machines`` machine codes at a time, in
    ascending code order (so each keyed field's keys come in ascending, disjoint ranges; chunks
    without a piece are skipped): the expansion into machine-buckets of one chunk at a time, not
    of every piece at once.  The first
    chunk also takes the pieces on no machine (unplaced, dedicated), those on a machine missing
    from the list (which :func:`interval_partial` refuses) and the running intervals' counters;
    merged, the chunks are the partial of all the pieces, the same bits (each (machine, bucket)
    sum is one chunk's)."""
    xp = backend.xp
    placed = run.machine_id > 0
    on = xp.nonzero(placed)[0]
    code, known = id_index(backend, ctx.machine_ids, run.machine_id[on])
    code = xp.where(known, code, -1).astype(xp.int64)
    order = xp.argsort(code, kind="stable")
    on, code = on[order], code[order]
    step = max(1, int(machines))
    edges = np.arange(0, max(int(ctx.machine_ids.shape[0]), 1) + step, step, dtype=np.int64)
    # piece index bounds of each chunk's codes (one copy out: a few integers a chunk)
    cuts = to_host(xp.searchsorted(code, xp.asarray(edges))).tolist()
    fields = ("instance", "machine_id", "start", "end", "req_cpu", "req_mem", "priority")
    zeros = dict.fromkeys(run.stats, 0)
    for j in range(len(edges) - 1):
        if j == 0:  # + the pieces on no machine and on unknown ones (code -1, sorted first)
            idx = xp.concatenate([xp.nonzero(~placed)[0], on[: cuts[1]]])
        elif cuts[j] == cuts[j + 1]:  # no piece on these machines
            continue
        else:
            idx = on[cuts[j] : cuts[j + 1]]
        sub = dataclasses.replace(
            run, **{f: getattr(run, f)[idx] for f in fields}, stats=run.stats if j == 0 else zeros
        )
        yield interval_partial(sub, ctx, backend)
