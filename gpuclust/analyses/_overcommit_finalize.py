"""``overcommit``'s finalize side (:mod:`gpuclust.analyses.overcommit`): the machine table built a
chunk of machines at a time (dense only over the chunk, :func:`_chunk`), the per-bucket sums the
``cell`` table is built from (:class:`_CellSums`), the ``summary`` table streamed from the machine
table (:func:`_summary`) and the text summary.

The tunables the finalize reads (``FINALIZE_CELLS``, ``SHARD_CELLS``) stay in
:mod:`gpuclust.analyses.overcommit`, which passes them in.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

from gpuclust.analyses._kept import KeptValues
from gpuclust.analyses._overcommit_figure import FigureSums
from gpuclust.analyses._overcommit_summary import _full, chunk_sums, req_columns
from gpuclust.analyses.base import to_host
from gpuclust.arrow_numpy import table
from gpuclust.keys import pack
from gpuclust.parted import key_bounds

if TYPE_CHECKING:
    from gpuclust.analyses.overcommit import OvercommitContext

_USAGE_FIELDS = ("use_cpu", "use_mem", "max_cpu", "max_mem", "windows")
#: per usage field: how many overlapping windows carry a non-NULL value (0 with windows > 0: unknown)
_KNOWN_FIELDS = ("n_use_cpu", "n_use_mem", "n_max_cpu", "n_max_mem")
_PARTIAL_FIELDS = _USAGE_FIELDS + _KNOWN_FIELDS
#: float columns of the machine table before the per-tier ones
_MACHINE_FLOATS = (
    "covered_s",
    "up_s",
    "cap_cpu",
    "cap_mem",
    "req_cpu",
    "req_mem",
    "use_cpu",
    "use_mem",
    "max_cpu_sum",
    "max_mem_sum",
    "instances",
    *[f"{k}_ratio_{r}" for r in ("cpu", "mem") for k in ("alloc", "usage", "peak")],
)
_TIER_COLS = ("req_cpu", "req_mem", "use_cpu", "use_mem", "max_cpu_sum", "max_mem_sum")


_INT_COLUMNS = ("machine_id", "bucket", "bucket_start_us", "instances_distinct", "windows")


def _machine_columns(tiers: list[str]) -> list[str]:
    """The machine table's columns, in order."""
    out = ["machine_id", "bucket", "bucket_start_us"]
    for c in _MACHINE_FLOATS:
        out.append(c)
        if c == "cap_mem":
            out.append("cap_unknown")
        elif c == "instances":
            out += ["instances_distinct", "windows"]
    return out + [f"{c}_{t}" for t in tiers for c in _TIER_COLS]


#: columns that are NaN (unknown) when the dataset has no instance_usage rows
_USAGE_PREFIXES = ("use_", "max_cpu_sum", "max_mem_sum", "usage_ratio_", "peak_ratio_")


def _grid(ctx: OvercommitContext, xp: Any = np) -> tuple[Any, Any, Any]:
    """Absolute bucket numbers, bucket starts, and the seconds of each bucket in the window
    (made in ``xp``'s memory: nothing copied to a device)."""
    bucket = ctx.origin // ctx.width + xp.arange(ctx.n_buckets, dtype=np.int64)
    bstart = bucket * ctx.width
    L = (xp.minimum(bstart + ctx.width, ctx.window_end) - xp.maximum(bstart, ctx.window_start)).astype(np.float64) / 1e6
    return bucket, bstart, L


def _machine_rows(
    be: Any,
    keyed: dict[str, dict[str, np.ndarray]],
    ctx: OvercommitContext,
    lo: int,
    hi: int,
    acc: _CellSums,
    has_usage: bool,
    cells: int,
) -> Iterator[pa.Table]:
    """The machine table of machine codes ``[lo, hi)``, a chunk of ``cells`` machine-buckets at a
    time, each chunk one Arrow table (a row group); the cell sums go to ``acc``
    (:meth:`Overcommit.finalize_shard`)."""
    xp = be.xp
    tiers = list(ctx.tier_names)
    bucket, _, L = _grid(ctx, xp)
    step = max(1, cells // max(ctx.n_buckets, 1))
    req_col = req_columns(tiers)
    if hi <= lo:  # no machines: one empty frame (the columns)
        yield table(
            {
                c: np.zeros(0, bool if c == "cap_unknown" else np.int64 if c in _INT_COLUMNS else np.float64)
                for c in _machine_columns(tiers)
            }
        )
        acc.to_host()
        return
    machine_ids = be.stage(ctx.machine_ids)
    for m0 in range(lo, hi, step):
        m1 = min(hi, m0 + step)
        d = _chunk(be, ctx, keyed, m0, m1, L)
        pres = d["present"]
        mi, bi = xp.nonzero(pres)
        cols: dict[str, Any] = {
            "machine_id": machine_ids[m0 + mi],
            "bucket": bucket[bi],
            "bucket_start_us": bucket[bi] * ctx.width,
            "covered_s": L[bi],
        }
        for c, src in (
            ("up_s", "up_s"),
            ("cap_cpu", "cap_c"),
            ("cap_mem", "cap_m"),
            ("req_cpu", "req_c"),
            ("req_mem", "req_m"),
            ("use_cpu", "use_c"),
            ("use_mem", "use_m"),
            ("max_cpu_sum", "max_c"),
            ("max_mem_sum", "max_m"),
            ("instances", "inst"),
        ):
            cols[c] = d[src][mi, bi]
        cols["cap_unknown"] = (d["unk_c"] | d["unk_m"])[mi, bi]
        cols["instances_distinct"] = d["distinct"][mi, bi]
        cols["windows"] = d["windows"][mi, bi]
        for r in ("cpu", "mem"):
            for kind, col in (("alloc", f"req_{r}"), ("usage", f"use_{r}"), ("peak", f"max_{r}_sum")):
                cols[f"{kind}_ratio_{r}"] = _ratio(xp, cols[col], cols[f"cap_{r}"])
        for k, t in enumerate(tiers):
            for col in _TIER_COLS:
                cols[f"{col}_{t}"] = d[col][mi, k, bi]
        acc.add(d, pres)
        acc.add_ratios(cols, tiers)
        acc.figures[0].add(cols, m0 + mi, bi)
        acc.full.append(chunk_sums(xp, cols, req_col, has_usage))  # the summary's, where the chunk is
        del d
        n_rows = int(mi.shape[0])
        host = {c: be.to_host(cols[c]) for c in _machine_columns(tiers)}
        del cols, mi, bi
        if not has_usage:
            # No instance_usage rows at all: usage was not measured, so it is unknown (NaN), not 0.
            for c in host:
                if c.startswith(_USAGE_PREFIXES):
                    host[c] = np.full(n_rows, np.nan)
        yield table(host)  # a row group, built without pandas
    acc.to_host()


def _chunk(
    be: Any, ctx: OvercommitContext, parts: dict[str, dict[str, np.ndarray]], m0: int, m1: int, L: Any
) -> dict[str, Any]:
    """Dense (machine, [tier,] bucket) arrays of machines ``[m0, m1)`` on backend ``be``:
    capacity swept from the chunk's capacity intervals, requests / instances / usage scattered
    from the keyed sums (host arrays: the chunk's rows are copied over; or already on the
    device, :attr:`Overcommit.device_partial`), and ``present``, the
    (machine, bucket) mask of rows."""
    xp = be.xp
    S = ctx.series
    assert S is not None
    T, B = ctx.n_tiers, ctx.n_buckets
    cs = _capacity_sums(be, ctx, m0, m1)
    u = _usage_rates(xp, _dense(be, parts["usage"], _PARTIAL_FIELDS, T, m0, m1, B), L)
    R = _dense(be, parts["req"], ("req_cpu", "req_mem"), T, m0, m1, B)
    I = _dense(be, parts["inst"], ("inst", "distinct"), 1, m0, m1, B)  # noqa: E741
    present = (
        (cs[0] > 0)
        | (R["req_cpu"].sum(axis=1) > 0)
        | (R["req_mem"].sum(axis=1) > 0)
        | (I["inst"] > 0)
        | (u["windows"] > 0)
        | (u["use_c"] != 0)
        | (u["use_m"] != 0)
        | (u["max_c"] != 0)
        | (u["max_m"] != 0)
    )
    no_me = ~be.asarray(S["has_me"][m0:m1, None])
    unk_c = (cs[3] > 0) | no_me
    unk_m = (cs[4] > 0) | no_me
    with np.errstate(invalid="ignore", divide="ignore"):
        req_ct, req_mt = R["req_cpu"] / L, R["req_mem"] / L
        return {
            "present": present,
            "up_s": cs[0],
            "unk_c": unk_c,
            "unk_m": unk_m,
            "cap_c": xp.where(unk_c, np.nan, cs[1] / L),
            "cap_m": xp.where(unk_m, np.nan, cs[2] / L),
            "req_cpu": req_ct,
            "req_mem": req_mt,
            "req_c": req_ct.sum(axis=1),
            "req_m": req_mt.sum(axis=1),
            **u,
            "inst": I["inst"] / L,
            "distinct": I["distinct"],
        }


def _dense(
    be: Any, part: dict[str, np.ndarray], fields: tuple[str, ...], per: int, m0: int, m1: int, B: int
) -> dict[str, Any]:
    """The ``fields`` of keyed sums ``part`` (key: machine code, ``per`` slots, ``B`` buckets
    packed) of machines ``[m0, m1)``, dense on backend ``be``: (machine, slot, bucket), or
    (machine, bucket) where ``per`` is 1."""
    xp, cm = be.xp, m1 - m0
    key = part["key"]
    first = pack(m0, 0, per * B)
    lo, hi = key_bounds(key, first, pack(m1, 0, per * B))
    at = be.asarray(key[lo:hi] - first)
    out = {}
    for f in fields:
        a = xp.zeros(cm * per * B, dtype=part[f].dtype)
        a[at] = be.asarray(part[f][lo:hi])
        out[f] = a.reshape((cm, per, B) if per > 1 else (cm, B))
    return out


def _capacity_sums(be: Any, ctx: OvercommitContext, m0: int, m1: int) -> Any:
    """Per (machine, bucket) of machines ``[m0, m1)``, swept from their capacity intervals: the
    seconds up, CPU and memory capacity x seconds, and the seconds of unknown CPU and memory
    capacity (a (5, machines, buckets) array on backend ``be``)."""
    S = ctx.series
    assert S is not None
    lo, hi = np.searchsorted(S["code"], [m0, m1])
    cc, cmem = S["cap_cpu"][lo:hi], S["cap_mem"][lo:hi]
    capv = np.stack([np.ones(hi - lo), cc, cmem, np.isnan(cc).astype(np.float64), np.isnan(cmem).astype(np.float64)])
    return be.ops.bucket_overlap(
        be.asarray(S["start"][lo:hi]),
        be.asarray(S["end"][lo:hi]),
        be.asarray(capv),
        be.asarray((S["code"][lo:hi] - m0).astype(np.int32)),
        n_groups=m1 - m0,
        n_buckets=ctx.n_buckets,
        origin=ctx.origin,
        width=ctx.width,
    )


def _usage_rates(xp: Any, U: dict[str, Any], L: Any) -> dict[str, Any]:
    """Usage of the dense (machine, tier, bucket) usage sums ``U`` (``L``: each bucket's seconds):
    per tier the mean usage (``use_cpu``, ``use_mem``) and sums of window maxima
    (``max_cpu_sum``, ``max_mem_sum``), and per (machine, bucket) their sums over tiers and the
    windows; a (machine, tier, bucket) with windows whose values are all NULL was not measured:
    NaN."""
    wt = xp.rint(U["windows"])
    for f, n in (
        ("use_cpu", "n_use_cpu"),
        ("use_mem", "n_use_mem"),
        ("max_cpu", "n_max_cpu"),
        ("max_mem", "n_max_mem"),
    ):
        U[f] = xp.where((wt > 0) & (xp.rint(U[n]) == 0), np.nan, U[f])
        del U[n]
    windows = wt.sum(axis=1).astype(xp.int64)
    del wt
    with np.errstate(invalid="ignore", divide="ignore"):
        use_ct, use_mt = U["use_cpu"] / L, U["use_mem"] / L
        return {
            "use_cpu": use_ct,
            "use_mem": use_mt,
            "max_cpu_sum": U["max_cpu"],
            "max_mem_sum": U["max_mem"],
            "use_c": use_ct.sum(axis=1),
            "use_m": use_mt.sum(axis=1),
            "max_c": U["max_cpu"].sum(axis=1),
            "max_m": U["max_mem"].sum(axis=1),
            "windows": windows,
        }


def _ratio(xp: Any, num: Any, den: Any) -> Any:
    """num / den; 0/0 and anything / NaN -> NaN, x/0 (x > 0) -> inf."""
    with np.errstate(invalid="ignore", divide="ignore"):
        return xp.where((den == 0) & (num == 0), np.nan, num.astype(xp.float64) / den)


class _CellSums:
    """Per-bucket running sums over machine chunks: what the ``cell`` table is built from.  Summed
    on the backend of the chunks (``xp``), then moved to the host (:meth:`to_host`) once the
    shard's chunks are done."""

    COLS = ("req_cpu", "req_mem", "use_cpu", "use_mem", "max_cpu_sum", "max_mem_sum")

    def __init__(self, be: Any, B: int, T: int, lo: int, hi: int) -> None:
        xp = self.xp = be.xp
        z = lambda *s: xp.zeros(s, xp.float64)  # noqa: E731
        self.machines = xp.zeros(B, xp.int64)
        self.machines_up = xp.zeros(B, xp.int64)
        self.machines_cap_unknown = xp.zeros(B, xp.int64)
        self.present_any = xp.zeros(B, bool)
        self.known_any = {r: xp.zeros(B, bool) for r in ("cpu", "mem")}
        self.cap = {r: z(B) for r in ("cpu", "mem")}
        self.tier = {c: z(T, B) for c in self.COLS}
        #: per tier, Σ over machines with known capacity (ratio numerators)
        self.known = {(k, r): z(T, B) for k in ("alloc", "usage") for r in ("cpu", "mem")}
        self.instances = z(B)
        self.windows = xp.zeros(B, xp.int64)
        #: on a device: per (resource, tier), the request / capacity ratios of the full
        #: machine-buckets of each chunk, kept there for the summary's quantiles (which would
        #: otherwise read the written machine table back and copy the ratios over again)
        self.ratios = KeptValues(be)
        #: the summary's sums of each chunk of the machine table (:func:`chunk_sums`), in order;
        #: after :meth:`to_host`, one host matrix a shard (a row a chunk)
        self.full: list[Any] = []
        #: the sums of the figure tables of the shard's machines ``[lo, hi)``; after
        #: :meth:`add_sums`, every shard's
        self.figures = [FigureSums(be, B, lo, hi)]

    def to_host(self) -> None:
        """Every sum as a NumPy array (in place; the chunks' summary sums in one copy); the ratios
        stay where they are."""
        self.full = [to_host(self.xp.stack(self.full))] if self.full else []
        for k, v in list(vars(self).items()):
            if k not in ("ratios", "full", "figures"):
                setattr(self, k, to_host(v))
        for f in self.figures:
            f.to_host()
        self.xp = np

    def add_ratios(self, cols: dict[str, Any], tiers: list[str]) -> None:
        """Keep the chunk's ratios of full machine-buckets (:func:`_full`), on a device only."""
        if not self.ratios.kept:
            return
        for r in ("cpu", "mem"):
            full = _full(cols["up_s"], cols["covered_s"], cols[f"cap_{r}"])
            cap = cols[f"cap_{r}"][full]
            for t in ("all", *tiers):
                req = cols[f"req_{r}" if t == "all" else f"req_{r}_{t}"]
                self.ratios.add((r, t), req[full].astype(self.xp.float64) / cap)

    def add(self, d: dict[str, Any], present: Any) -> None:
        xp = self.xp
        self.machines += present.sum(axis=0)
        self.machines_up += (d["up_s"] > 0).sum(axis=0)
        self.machines_cap_unknown += (present & (d["unk_c"] | d["unk_m"])).sum(axis=0)
        self.present_any |= present.any(axis=0)
        for r, unk, cap in (("cpu", d["unk_c"], d["cap_c"]), ("mem", d["unk_m"], d["cap_m"])):
            kn = present & ~unk
            self.known_any[r] |= kn.any(axis=0)
            self.cap[r] += xp.where(kn, cap, 0.0).sum(axis=0)
            for kind, src in (("alloc", f"req_{r}"), ("usage", f"use_{r}")):
                self.known[(kind, r)] += xp.where(kn[:, None, :], d[src], 0.0).sum(axis=0)
        for c in self.COLS:
            self.tier[c] += d[c].sum(axis=0)
        self.instances += d["inst"].sum(axis=0)
        self.windows += d["windows"].sum(axis=0)

    def add_sums(self, o: _CellSums) -> None:
        """Add another shard's sums (the next shard's: its chunks' summary sums follow these)."""
        self.full = self.full + o.full
        self.figures = self.figures + o.figures
        self.machines += o.machines
        self.machines_up += o.machines_up
        self.machines_cap_unknown += o.machines_cap_unknown
        self.present_any |= o.present_any
        for r in ("cpu", "mem"):
            self.known_any[r] |= o.known_any[r]
            self.cap[r] += o.cap[r]
        for c in self.COLS:
            self.tier[c] += o.tier[c]
        for k in self.known:
            self.known[k] += o.known[k]
        self.instances += o.instances
        self.windows += o.windows
        self.ratios.extend(o.ratios)

    def columns(self, bucket: np.ndarray, bstart: np.ndarray, L: np.ndarray, tiers: list[str]) -> dict[str, np.ndarray]:
        """The ``cell`` table's columns, in order."""
        # Capacity of the machines with a known capacity; when machines are present but none has a
        # known capacity the cell's capacity is unknown (NaN), not 0.
        caps = {r: np.where(self.known_any[r] | ~self.present_any, self.cap[r], np.nan) for r in ("cpu", "mem")}
        cell = {
            "bucket": bucket,
            "bucket_start_us": bstart,
            "covered_s": L,
            "machines": self.machines,
            "machines_up": self.machines_up,
            "machines_cap_unknown": self.machines_cap_unknown,
            "cap_cpu": caps["cpu"],
            "cap_mem": caps["mem"],
        }
        for col in self.COLS:
            cell[col] = self.tier[col].sum(axis=0)
        cell["instances"] = self.instances
        cell["windows"] = self.windows
        for r in ("cpu", "mem"):
            for kind in ("alloc", "usage"):
                cell[f"{kind}_ratio_{r}"] = _ratio(np, self.known[(kind, r)].sum(axis=0), caps[r])
        for k, t in enumerate(tiers):
            for col in ("req_cpu", "req_mem", "use_cpu", "use_mem"):
                cell[f"{col}_{t}"] = self.tier[col][k]
            for r in ("cpu", "mem"):
                for kind in ("alloc", "usage"):
                    cell[f"{kind}_ratio_{r}_{t}"] = _ratio(np, self.known[(kind, r)][k], caps[r])
        return cell
