"""The scheduling simulation behind ``gpuclust synth``.

A small discrete-event model of a Borg cell (see ``docs/synth.md``):

* machines of several platforms and capacity shapes, ADDed (mostly at time 0), some REMOVEd and
  re-ADDed, a few UPDATEd (UPDATEs never shrink capacity and happen on the 300 s grid);
* collections (jobs and alloc sets) in every priority tier with heavy-tailed sizes and durations;
  jobs of some prod users run inside alloc sets;
* instances go SUBMIT -> (QUEUE -> ENABLE) -> SCHEDULE -> (UPDATE_RUNNING) -> terminal event,
  with resubmission after EVICT and FAIL; some are still running at the trace end;
* placement by request: on every ADDed machine the sum of the requests of the top-level
  instances (tasks not in allocs, and alloc instances) stays <= overcommit x capacity, per
  resource; inside an alloc instance the sum of its tasks' requests stays <= the alloc's request.
  Production instances that do not fit preempt (EVICT) lower-priority (< 120) top-level
  instances.

Resources are kept as integer micro-units (1e-6 normalised units) so the capacity invariant is
exact; requests and capacities are written with 6 decimals, i.e. exactly.

The simulation produces event lists and an interval table (one row per running interval of an
instance attempt) that :mod:`gpuclust.synth.usage` turns into usage windows.
"""

from __future__ import annotations

import base64
import functools
import heapq
import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from gpuclust.schema import (
    TIER_MAPS,
    TRACE_OFFSET_US,
    CollectionType,
    EventType,
    MachineEventType,
    MissingType,
    Relation,
)

US = 1_000_000
CELL_US = 300 * US
UNIT = 1_000_000  # resource micro-units per normalised unit

#: Capacity shapes (cpus, memory, weight): a few shapes with skew, like the real cells.
CAPACITY_SHAPES = (
    (0.5, 0.5, 0.46),
    (0.5, 0.25, 0.22),
    (0.5, 0.75, 0.08),
    (0.25, 0.25, 0.08),
    (1.0, 1.0, 0.06),
    (0.5, 0.125, 0.04),
    (1.0, 0.5, 0.04),
    (0.708, 0.958, 0.02),
)

#: Platforms: (weight, CPI base or None when the platform has no counters, MAI base).
PLATFORMS = (
    (0.40, 1.45, 0.0090),
    (0.25, 1.80, 0.0120),
    (0.15, None, None),
    (0.12, 1.20, 0.0070),
    (0.08, None, None),
)

#: Workload classes: name -> parameters.  ``share``: fraction of the requested CPU the class
#: contributes at steady state.  Sizes ~ 1 + Pareto(alpha) * size_scale (capped), durations
#: lognormal(median, sigma) in seconds, CPU/memory requests lognormal(median, sigma).
WORKLOAD: dict[str, dict[str, Any]] = {
    "prod_service": dict(share=0.36, priorities=(120, 200), pw=(0.85, 0.15), sclass=(2, 3), scw=(0.6, 0.4),
                         alpha=1.3, size_scale=2.0, service=True, dur_median=3 * 86400, dur_sigma=1.2,
                         cpu_median=0.012, cpu_sigma=0.8, mem_median=0.010, mem_sigma=0.8),
    "monitoring": dict(share=0.03, priorities=(360, 450), pw=(0.7, 0.3), sclass=(2, 3), scw=(0.5, 0.5),
                       alpha=1.6, size_scale=1.0, service=True, dur_median=5 * 86400, dur_sigma=1.0,
                       cpu_median=0.003, cpu_sigma=0.6, mem_median=0.003, mem_sigma=0.6),
    "mid_service": dict(share=0.08, priorities=(116, 117, 119), pw=(0.4, 0.4, 0.2), sclass=(1, 2), scw=(0.5, 0.5),
                        alpha=1.3, size_scale=2.0, service=True, dur_median=8 * 3600, dur_sigma=1.2,
                        cpu_median=0.008, cpu_sigma=0.8, mem_median=0.008, mem_sigma=0.8),
    "batch": dict(share=0.25, priorities=(100, 101, 103, 105, 107, 110, 115), pw=(0.3, 0.1, 0.15, 0.15, 0.1, 0.1, 0.1),
                  sclass=(0, 1), scw=(0.4, 0.6), alpha=1.1, size_scale=3.0, service=False,
                  dur_median=900, dur_sigma=1.4, cpu_median=0.010, cpu_sigma=0.9, mem_median=0.006, mem_sigma=0.9),
    "free": dict(share=0.10, priorities=(0, 25), pw=(0.7, 0.3), sclass=(0,), scw=(1.0,), alpha=1.2, size_scale=2.0,
                 service=False, dur_median=1800, dur_sigma=1.5, cpu_median=0.006, cpu_sigma=0.9,
                 mem_median=0.005, mem_sigma=0.9),
    # alloc sets (prod) and the jobs that run inside them
    "alloc_set": dict(share=0.18, priorities=(120, 200), pw=(0.8, 0.2), sclass=(2,), scw=(1.0,), alpha=1.5,
                      size_scale=2.0, service=True, dur_median=4 * 86400, dur_sigma=1.0,
                      cpu_median=0.06, cpu_sigma=0.5, mem_median=0.05, mem_sigma=0.5),
}

#: Fixed machine attribute names (hashed-looking) used by constraints.
PRODUCTION_PRIORITY = 120
#: The tier map the planted per-tier truths use (Google's notebook: free, beb, mid, prod).
PLANT_TIERS = TIER_MAPS["notebook"]
#: Workload classes whose job sizes follow the planted Pareto law (``job_size_alpha``).
SIZED_KINDS = ("batch", "free")
#: Mean of the lognormal(0, 0.4) factor of a batch task's work around its job's duration.
WORK_SIGMA = 0.4
WORK_MEAN = math.exp(WORK_SIGMA**2 / 2)
#: Planted job sizes are capped at this many times their scale (keeps the class mean finite for any alpha).
SIZE_CAP = 1e4
#: CPU requests of sized jobs stay in this range (larger jobs get more instances, not bigger ones).
SIZED_REQUEST_RANGE = (0.0005, 0.1)


@functools.cache
def tier_of(prio: int) -> str:
    """The notebook tier (free, beb, mid, prod) of a priority."""
    return PLANT_TIERS.names[int(PLANT_TIERS.tier_codes(np.array([prio]))[0])]


def pareto_capped_mean(alpha: float, cap: float) -> float:
    """E[min(X, cap)] for a Pareto X with scale 1 and tail index alpha (P(X > x) = x^-alpha, x >= 1)."""
    if abs(alpha - 1.0) < 1e-9:
        return 1.0 + math.log(cap)
    return (alpha - cap ** (1.0 - alpha)) / (alpha - 1.0)


def b64id(rng: np.random.Generator, nbytes: int = 32) -> str:
    """A random base64 string shaped like the trace's hashed names."""
    return base64.b64encode(rng.bytes(nbytes)).decode("ascii")


@dataclass
class Coll:
    idx: int
    cid: int
    ctype: int
    kind: str
    prio: int
    sclass: int
    n: int
    req_c: int
    req_m: int
    submit: int
    dur: float  # seconds (service: lifetime of the collection; batch: median task duration)
    user: str
    name: str
    lname: str
    scheduler: int = 0
    vscale: int = 1
    max_pm: int = 0
    max_ps: int = 0
    parent: int = -1  # collection index
    start_after: list[int] = field(default_factory=list)  # collection indices
    alloc_set: int = -1  # collection index of the hosting alloc set (jobs only)
    constraint: int = -1  # index into Model.constraint_kinds
    live: int = 0  # instances not yet finally terminated
    any_kill: bool = False
    any_fail: bool = False
    scheduled: bool = False
    ended: bool = False
    end_time: int = -1
    children: list[int] = field(default_factory=list)
    submitted: bool = False
    pm_counts: dict[int, int] | None = None  # machine -> running instances (when max_pm)


class Inst:
    __slots__ = ("c", "index", "state", "machine", "req_c", "req_m", "attempt", "fails", "work",
                 "iv", "alloc", "tasks", "used_c", "used_m", "key", "pending_since", "upd_pending")

    def __init__(self, c: Coll, index: int):
        self.c = c
        self.index = index
        self.state = "new"  # new, pending, running, done
        self.machine = -1
        self.req_c = c.req_c
        self.req_m = c.req_m
        self.attempt = 0
        self.fails = 0
        self.work = 0.0  # seconds of work for a batch task
        self.iv = -1  # current interval id
        self.alloc: Inst | None = None  # hosting alloc instance (tasks in allocs)
        self.tasks: dict[tuple[int, int], Inst] | None = None  # running tasks (alloc instances)
        self.used_c = 0
        self.used_m = 0
        self.key = (c.idx, index)
        self.pending_since = 0
        self.upd_pending = False


class Model:
    """Runs the simulation; results are in the attributes after :meth:`run`."""

    def __init__(self, cfg, rng: np.random.Generator):
        self.cfg = cfg
        self.rng = rng
        self.t_end = TRACE_OFFSET_US + int(round(cfg.hours * 3600 * US))
        # outputs
        self.machine_events: list[tuple] = []  # (time, m, type)
        self.machine_attrs: list[tuple] = []  # (time, m, name, value or None, deleted)
        self.coll_events: list[tuple] = []  # (time, type, coll_idx, missing_type)
        self.inst_events: list[tuple] = []  # (time, type, coll_idx, index, machine, req_c, req_m, alloc_index, missing)
        self.iv: dict[str, list] = {k: [] for k in ("coll", "index", "machine", "start", "end", "alloc_iv", "alloc_index",
                                                     "req_c", "req_m", "top")}
        self.colls: list[Coll] = []
        self.stats = {"preemptions": 0, "machine_evictions": 0, "resubmissions": 0, "updates_running": 0,
                      "updates_pending": 0, "unplaced_at_end": 0}
        #: planted scheduling delay (SUBMIT -> first placement attempt) per notebook tier: mean seconds
        self.delay_mean_s = {t: float(getattr(cfg, f"sched_delay_{t}_s")) for t in PLANT_TIERS.names}
        #: per tier: [submissions during the trace, sum of planted delays (s), first attempts, placed at the first]
        self.delay_stats = {t: [0, 0.0, 0, 0] for t in PLANT_TIERS.names}
        #: planted job sizes (SIZED_KINDS): per kind the scale s_min (CPU-seconds), and per job the size drawn
        self.size_scale: dict[str, float] = {}
        self.job_size: dict[int, float] = {}  # collection index -> planted size (requested CPU-seconds in the trace)
        self.size_stats = {"jobs": 0, "request_clipped": 0}

    # ------------------------------------------------------------------------------- machines
    def make_machines(self) -> None:
        cfg, rng = self.cfg, self.rng
        n = cfg.machines
        # ids: mostly ~1e11 like the real cells; a few above 2**53 to catch float64 parsing
        ids = np.unique(rng.integers(10**10, 4 * 10**11, size=2 * n + 16))
        ids = rng.permutation(ids)[:n].astype(np.int64)
        big = rng.random(n) < cfg.big_id_fraction
        ids[big] = rng.integers(2**53 + 1, 2**62, size=int(big.sum()), dtype=np.int64)
        self.m_id = ids
        pw = np.array([p[0] for p in PLATFORMS])
        self.platform_ids = [b64id(rng) for _ in PLATFORMS]
        self.m_platform = rng.choice(len(PLATFORMS), size=n, p=pw / pw.sum())
        nsw = max(1, n // 16)
        self.switch_ids = [b64id(rng) for _ in range(nsw)]
        self.m_switch = np.sort(rng.integers(0, nsw, size=n))
        sw = np.array([s[2] for s in CAPACITY_SHAPES])
        shape = rng.choice(len(CAPACITY_SHAPES), size=n, p=sw / sw.sum())
        self.m_cap_c = np.array([int(round(CAPACITY_SHAPES[s][0] * UNIT)) for s in shape], dtype=np.int64)
        self.m_cap_m = np.array([int(round(CAPACITY_SHAPES[s][1] * UNIT)) for s in shape], dtype=np.int64)
        self.m_null_cap = rng.random(n) < cfg.null_capacity_fraction
        self.m_cap_c0 = self.m_cap_c.copy()  # capacities at the first ADD (UPDATEs may grow memory)
        self.m_cap_m0 = self.m_cap_m.copy()
        self.m_up = np.zeros(n, dtype=bool)
        self.m_used_c = np.zeros(n, dtype=np.int64)
        self.m_used_m = np.zeros(n, dtype=np.int64)
        self.m_low_c = np.zeros(n, dtype=np.int64)  # requests of preemptible (< 120) top-level instances
        self.m_low_m = np.zeros(n, dtype=np.int64)
        self.m_running: list[dict[tuple[int, int], Inst]] = [dict() for _ in range(n)]
        self._limits()
        # attributes: a small-integer one (1..6), an EQUAL-able one (1..3), a presence flag, a hash
        self.attr_names = [b64id(rng, 24) for _ in range(5)]
        self.m_attr_int = rng.integers(1, 7, size=n)
        self.m_attr_gen = rng.integers(1, 4, size=n)
        self.m_attr_flag = rng.random(n) < 0.3
        self.constraint_kinds: list[tuple[list[tuple[str, str | None, int]], np.ndarray]] = [
            ([(self.attr_names[0], "3", int(Relation.GREATER_THAN_EQUAL))], self.m_attr_int >= 3),
            ([(self.attr_names[1], "2", int(Relation.EQUAL))], self.m_attr_gen == 2),
            ([(self.attr_names[2], None, int(Relation.PRESENT))], self.m_attr_flag),
            ([(self.attr_names[1], "1", int(Relation.NOT_EQUAL)), (self.attr_names[0], "5", int(Relation.LESS_THAN))],
             (self.m_attr_gen != 1) & (self.m_attr_int < 5)),
        ]
        # machine event schedule: (time, seq, m, type)
        t0, t1 = TRACE_OFFSET_US, self.t_end
        add_t = np.zeros(n, dtype=np.int64)
        late = rng.random(n) < cfg.late_add_fraction
        add_t[late] = rng.integers(t0, t1, size=int(late.sum()))
        plan: list[tuple[int, int, int]] = []
        for m in range(n):
            plan.append((int(add_t[m]), m, int(MachineEventType.ADD)))
            rem = rng.random() < cfg.remove_fraction
            if rem:
                tr = int(rng.integers(min(max(int(add_t[m]), t0) + 1, t1 - 1), t1))
                plan.append((tr, m, int(MachineEventType.REMOVE)))
                if rng.random() < 0.8:
                    down = int(rng.lognormal(np.log(1200), 0.8) * US)
                    if tr + down < t1:
                        plan.append((tr + down, m, int(MachineEventType.ADD)))
            if rng.random() < cfg.update_fraction:
                cell = int(rng.integers(t0 // CELL_US + 1, max(t0 // CELL_US + 2, t1 // CELL_US)))
                plan.append((cell * CELL_US, m, int(MachineEventType.UPDATE)))
            # attributes at the first ADD, and a few changes of the free-form one
            self.machine_attrs.append((int(add_t[m]), m, self.attr_names[0], str(int(self.m_attr_int[m])), False))
            self.machine_attrs.append((int(add_t[m]), m, self.attr_names[1], str(int(self.m_attr_gen[m])), False))
            if self.m_attr_flag[m]:
                self.machine_attrs.append((int(add_t[m]), m, self.attr_names[2], "1", False))
            self.machine_attrs.append((int(add_t[m]), m, self.attr_names[3], b64id(rng, 12), False))
            if rng.random() < 0.05:
                self.machine_attrs.append((int(rng.integers(t0, t1)), m, self.attr_names[3], b64id(rng, 12), False))
            if rng.random() < 0.02:
                self.machine_attrs.append((int(rng.integers(t0, t1)), m, self.attr_names[4], None, True))
        self.machine_plan = plan

    def _limits(self) -> None:
        self.m_lim_c = np.floor(self.m_cap_c * self.cfg.overcommit_cpu).astype(np.int64)
        self.m_lim_m = np.floor(self.m_cap_m * self.cfg.overcommit_mem).astype(np.int64)

    # ------------------------------------------------------------------------------- workload
    def _new_coll(self, kind: str, t: int, ctype: int = int(CollectionType.JOB), alloc_set: int = -1) -> Coll:
        rng, p = self.rng, WORKLOAD[kind]
        n_cap = max(4, 3 * self.cfg.machines) if kind != "alloc_set" else max(2, self.cfg.machines // 2)
        n = int(min(n_cap, 1 + np.floor(rng.pareto(p["alpha"]) * p["size_scale"])))
        req_c = float(np.clip(rng.lognormal(np.log(p["cpu_median"]), p["cpu_sigma"]), 0.0005, 0.3))
        req_m = float(np.clip(rng.lognormal(np.log(p["mem_median"]), p["mem_sigma"]), 0.0002, 0.3))
        prio = int(rng.choice(p["priorities"], p=np.array(p["pw"]) / sum(p["pw"])))
        sclass = int(rng.choice(p["sclass"], p=np.array(p["scw"]) / sum(p["scw"])))
        dur = float(rng.lognormal(np.log(p["dur_median"]), p["dur_sigma"]))
        user = self.users[int(rng.integers(len(self.users)))]
        cid = int(rng.integers(10**10, 5 * 10**11))
        if rng.random() < self.cfg.big_id_fraction:
            cid = int(rng.integers(2**53 + 1, 2**62))
        while cid in self._cids:
            cid += 1
        self._cids.add(cid)
        lname = self.lnames[int(rng.integers(len(self.lnames)))]
        c = Coll(idx=len(self.colls), cid=cid, ctype=ctype, kind=kind, prio=prio, sclass=sclass, n=n,
                 req_c=int(round(req_c * UNIT)), req_m=int(round(req_m * UNIT)), submit=t, dur=dur, user=user,
                 name=b64id(rng), lname=lname, alloc_set=alloc_set)
        c.scheduler = 1 if (kind in ("batch", "free") and rng.random() < 0.4) else 0
        c.vscale = int(rng.choice([0, 1, 2, 3], p=[0.02, 0.6, 0.18, 0.2]))
        if p["service"] and kind != "alloc_set" and rng.random() < 0.15:
            c.max_pm = int(rng.integers(1, 3))
        if p["service"] and rng.random() < 0.05:
            c.max_ps = int(rng.integers(2, 10))
        if kind != "alloc_set" and alloc_set < 0 and rng.random() < self.cfg.constraint_fraction:
            c.constraint = int(rng.integers(len(self.constraint_kinds)))
        if alloc_set >= 0:
            a = self.colls[alloc_set]
            c.prio = a.prio if rng.random() < 0.7 else min(a.prio, prio)
            # tasks are a fraction of the alloc's size
            c.req_c = max(500, int(a.req_c * rng.uniform(0.1, 0.5)))
            c.req_m = max(200, int(a.req_m * rng.uniform(0.1, 0.5)))
            c.n = int(min(c.n, a.n * 2))
            a.children.append(c.idx)
        if c.max_pm:
            c.pm_counts = {}
        self.colls.append(c)
        return c

    def _expected_req_cpu_seconds(self, kind: str) -> tuple[float, float]:
        """E[instances x cpu request x duration] of one collection of ``kind`` (Monte Carlo, fixed seed)."""
        p = WORKLOAD[kind]
        r = np.random.default_rng(12345)
        k = 20000
        n_cap = max(4, 3 * self.cfg.machines) if kind != "alloc_set" else max(2, self.cfg.machines // 2)
        n = np.minimum(n_cap, 1 + np.floor(r.pareto(p["alpha"], k) * p["size_scale"]))
        c = np.clip(r.lognormal(np.log(p["cpu_median"]), p["cpu_sigma"], k), 0.0005, 0.3)
        d = r.lognormal(np.log(p["dur_median"]), p["dur_sigma"], k)
        return float(np.mean(n * c)), float(np.mean(n * c * d))

    # ------------------------------------------------------------------------------- events
    def _push(self, t: int, kind: str, payload: object) -> None:
        self._seq += 1
        heapq.heappush(self._heap, (t, self._seq, kind, payload))

    def _iev(self, t: int, typ: int, inst: Inst, machine: int = -1, missing: int = 0) -> None:
        ai = inst.alloc.index if inst.alloc is not None else -1
        self.inst_events.append((t, typ, inst.c.idx, inst.index, machine, inst.req_c, inst.req_m, ai, missing))

    def _cev(self, t: int, typ: int, c: Coll, missing: int = 0) -> None:
        self.coll_events.append((t, typ, c.idx, missing))

    def _delay(self, c: Coll) -> int:
        """A planted scheduling delay (µs): exponential with the tier's mean."""
        return int(self.rng.exponential(self.delay_mean_s[tier_of(c.prio)]) * US)

    def _submit_coll(self, c: Coll, t: int) -> None:
        rng = self.rng
        self._cev(t, EventType.SUBMIT, c)
        ready = t
        delays = [self._delay(c) for _ in range(c.n)] if t > 0 else [0] * c.n
        if c.scheduler == 1:
            # the batch scheduler admits the job (ENABLE) within its instances' planted delays
            self._cev(t, EventType.QUEUE, c)
            ready = t + int(rng.uniform(0.5, 1.0) * min(delays)) if t > 0 else 0
            self._cev(ready, EventType.ENABLE, c)
        c.live = c.n
        self._ninst += c.n
        insts = self._insts_of.setdefault(c.idx, {})
        if WORKLOAD[c.kind]["service"]:
            c.end_time = (t if t > 0 else TRACE_OFFSET_US) + int(c.dur * US)
            self._push(c.end_time, "cend", c)
        for i in range(c.n):
            inst = Inst(c, i)
            insts[inst.key] = inst
            if not WORKLOAD[c.kind]["service"]:
                inst.work = float(c.dur * rng.lognormal(0.0, 0.4))
            self._submit_inst(inst, t, ready, first=True, delay=delays[i])

    def _submit_inst(self, inst: Inst, t: int, ready: int, first: bool = False, delay: int | None = None) -> None:
        """SUBMIT ``inst`` at ``t``; its first placement attempt comes after the planted delay
        (none for the population submitted at time 0)."""
        rng = self.rng
        self._iev(t, EventType.SUBMIT, inst)
        inst.state = "pending"
        inst.pending_since = t
        if inst.c.scheduler == 1 and first:
            self._iev(t, EventType.QUEUE, inst)
            self._iev(ready, EventType.ENABLE, inst)
        if t == 0:
            go = 0
        else:
            d = self._delay(inst.c) if delay is None else delay
            go = t + d
            st = self.delay_stats[tier_of(inst.c.prio)]
            st[0] += 1
            st[1] += d / US
        self._push(go, "ready", (inst, inst.attempt))
        if t > 0 and rng.random() < self.cfg.update_pending_fraction:
            self._push(t + int(rng.uniform(0.1, 0.9) * (go - t)) + 1, "upd_pending", (inst, inst.attempt))

    # placement ------------------------------------------------------------------------------
    def _feasible(self, inst: Inst, preempt: bool = False) -> np.ndarray:
        c = inst.c
        if preempt:
            ok = (self.m_used_c - self.m_low_c + inst.req_c <= self.m_lim_c) & (
                self.m_used_m - self.m_low_m + inst.req_m <= self.m_lim_m)
        else:
            ok = (self.m_used_c + inst.req_c <= self.m_lim_c) & (self.m_used_m + inst.req_m <= self.m_lim_m)
        ok &= self.m_up
        if c.constraint >= 0:
            ok &= self.constraint_kinds[c.constraint][1]
        if c.pm_counts:
            full = [m for m, k in c.pm_counts.items() if k >= c.max_pm]
            if full:
                ok[full] = False
        return ok

    def _try_place(self, inst: Inst, t: int) -> bool:
        c = inst.c
        if c.alloc_set >= 0:
            return self._try_place_in_alloc(inst, t)
        ok = self._feasible(inst)
        cand = np.flatnonzero(ok)
        if cand.size == 0:
            if c.prio >= PRODUCTION_PRIORITY and self.cfg.preemption:
                ok = self._feasible(inst, preempt=True)
                cand = np.flatnonzero(ok)
                if cand.size == 0:
                    return False
                m = int(cand[self.rng.integers(cand.size)])
                self._preempt(m, inst, t)
            else:
                return False
        else:
            # power of two choices: the candidate with more free CPU (spreads load)
            a, b = cand[self.rng.integers(cand.size, size=2)]
            fa = self.m_lim_c[a] - self.m_used_c[a]
            fb = self.m_lim_c[b] - self.m_used_c[b]
            m = int(a if fa >= fb else b)
        self._start(inst, m, t)
        return True

    def _try_place_in_alloc(self, inst: Inst, t: int) -> bool:
        hosts = self._alloc_running.get(inst.c.alloc_set)
        if not hosts:
            return False
        best = None
        for a in hosts.values():
            if a.used_c + inst.req_c <= a.req_c and a.used_m + inst.req_m <= a.req_m:
                if best is None or a.req_c - a.used_c > best.req_c - best.used_c:
                    best = a
        if best is None:
            return False
        inst.alloc = best
        best.used_c += inst.req_c
        best.used_m += inst.req_m
        best.tasks[inst.key] = inst
        self._start(inst, best.machine, t)
        return True

    def _preempt(self, m: int, inst: Inst, t: int) -> None:
        victims = sorted((v for v in self.m_running[m].values() if v.c.prio < PRODUCTION_PRIORITY),
                         key=lambda v: (v.c.prio, -v.iv))
        for v in victims:
            if (self.m_used_c[m] + inst.req_c <= self.m_lim_c[m]) and (self.m_used_m[m] + inst.req_m <= self.m_lim_m[m]):
                break
            self.stats["preemptions"] += 1
            self._stop(v, t, EventType.EVICT)

    def _start(self, inst: Inst, m: int, t: int) -> None:
        c = inst.c
        inst.state = "running"
        inst.machine = m
        inst.attempt += 1
        top = inst.alloc is None
        if top:
            self.m_used_c[m] += inst.req_c
            self.m_used_m[m] += inst.req_m
            if c.prio < PRODUCTION_PRIORITY:
                self.m_low_c[m] += inst.req_c
                self.m_low_m[m] += inst.req_m
            self.m_running[m][inst.key] = inst
        if c.pm_counts is not None:
            c.pm_counts[m] = c.pm_counts.get(m, 0) + 1
        if c.ctype == CollectionType.ALLOC_SET:
            inst.tasks = {}
            inst.used_c = inst.used_m = 0
            self._alloc_running.setdefault(c.idx, {})[inst.key] = inst
        self._iev(t, EventType.SCHEDULE, inst, machine=m)
        if not c.scheduled:
            c.scheduled = True
            self._cev(t, EventType.SCHEDULE, c)
        iv = self.iv
        inst.iv = len(iv["coll"])
        iv["coll"].append(c.idx)
        iv["index"].append(inst.index)
        iv["machine"].append(m)
        iv["start"].append(t)
        iv["end"].append(self.t_end)
        iv["alloc_iv"].append(inst.alloc.iv if inst.alloc is not None else -1)
        iv["alloc_index"].append(inst.alloc.index if inst.alloc is not None else -1)
        iv["req_c"].append(inst.req_c)
        iv["req_m"].append(inst.req_m)
        iv["top"].append(top)
        # plan the end of this attempt
        rng = self.rng
        att = inst.attempt
        svc = WORKLOAD[c.kind]["service"]
        if svc:
            # services end with their collection ("cend"); their tasks fail now and then
            end, how = -1, EventType.FAIL
            tf = t + int(rng.exponential(3600 / max(self.cfg.service_fail_rate_per_hour, 1e-9)) * US)
            if tf < c.end_time and c.ctype == CollectionType.JOB:
                end = tf
        else:
            run = inst.work if t > 0 else inst.work * rng.uniform(0.05, 1.0)  # started before the trace
            end = t + max(US, int(run * US))
            u = rng.random()
            if u < self.cfg.batch_fail_fraction:
                end, how = t + max(US, int(run * rng.uniform(0.05, 1.0) * US)), EventType.FAIL
            elif u < self.cfg.batch_fail_fraction + self.cfg.kill_fraction:
                end, how = t + max(US, int(run * rng.uniform(0.05, 1.0) * US)), EventType.KILL
            elif u < self.cfg.batch_fail_fraction + self.cfg.kill_fraction + self.cfg.lost_fraction:
                how = EventType.LOST
            else:
                how = EventType.FINISH
        if end >= 0:
            self._push(end, "end", (inst, att, int(how)))
        if (inst.alloc is None and c.ctype == CollectionType.JOB and rng.random() < self.cfg.update_running_fraction):
            horizon = (end if end >= 0 else min(c.end_time, self.t_end)) - t
            if horizon > 2:
                self._push(t + int(rng.uniform(0.05, 0.8) * horizon) + 1, "upd_running", (inst, att))

    def _stop(self, inst: Inst, t: int, how: int, missing: int = 0) -> None:
        """End the running attempt of ``inst`` at ``t`` with event ``how``."""
        c = inst.c
        m = inst.machine
        # tasks inside an alloc instance go with it
        if inst.tasks:
            for task in list(inst.tasks.values()):
                self._stop(task, t, EventType.EVICT if how in (EventType.EVICT, EventType.LOST) else EventType.KILL)
            self._alloc_running.get(c.idx, {}).pop(inst.key, None)
        elif c.ctype == CollectionType.ALLOC_SET:
            self._alloc_running.get(c.idx, {}).pop(inst.key, None)
        if inst.alloc is None:
            self.m_used_c[m] -= inst.req_c
            self.m_used_m[m] -= inst.req_m
            if c.prio < PRODUCTION_PRIORITY:
                self.m_low_c[m] -= inst.req_c
                self.m_low_m[m] -= inst.req_m
            self.m_running[m].pop(inst.key, None)
        else:
            a = inst.alloc
            assert a.tasks is not None
            a.used_c -= inst.req_c
            a.used_m -= inst.req_m
            a.tasks.pop(inst.key, None)
        if c.pm_counts is not None:
            c.pm_counts[m] -= 1
        self.iv["end"][inst.iv] = t
        self._iev(t, how, inst, machine=m, missing=missing)
        inst.machine = -1
        inst.alloc = None
        inst.state = "stopped"
        resubmit = False
        if how == EventType.EVICT and not c.ended:
            resubmit = True
        elif how == EventType.FAIL:
            inst.fails += 1
            resubmit = (inst.fails <= self.cfg.max_retries or WORKLOAD[c.kind]["service"]) and not c.ended
        if resubmit:
            self.stats["resubmissions"] += 1
            self._submit_inst(inst, t, t)
        else:
            self._final(inst, t, how)

    def _final(self, inst: Inst, t: int, how: int) -> None:
        c = inst.c
        inst.state = "done"
        c.live -= 1
        c.any_kill |= bool(how == EventType.KILL)
        c.any_fail |= bool(how == EventType.FAIL)
        if c.live == 0 and not c.ended:
            self._end_coll(c, t)

    def _end_coll(self, c: Coll, t: int) -> None:
        c.ended = True
        c.end_time = t
        typ = EventType.FAIL if c.any_fail else EventType.KILL if c.any_kill else EventType.FINISH
        self._cev(t, typ, c)
        for ch in c.children:  # children die with their parent
            self._kill_coll(self.colls[ch], t)

    def _kill_coll(self, c: Coll, t: int, how: int = EventType.KILL) -> None:
        """End a whole collection: its running and pending instances get ``how`` (KILL or FINISH)."""
        if c.ended:
            return
        c.ended = True
        for inst in list(self._insts_of.get(c.idx, {}).values()):
            if inst.state == "running":
                self._stop(inst, t, how)
            elif inst.state in ("pending", "new"):
                self._iev(t, EventType.KILL, inst)
                inst.state = "done"
        c.end_time = t
        self._cev(t, how, c)
        for ch in c.children:
            self._kill_coll(self.colls[ch], t)

    # ------------------------------------------------------------------------------- main loop
    def run(self) -> None:
        cfg, rng = self.cfg, self.rng
        self._heap: list = []
        self._seq = 0
        self._cids: set[int] = set()
        self._ninst = 0
        self._alloc_running: dict[int, dict] = {}
        self._insts_of: dict[int, dict] = {}
        self._t_first = TRACE_OFFSET_US
        self.users = [b64id(rng) for _ in range(max(8, cfg.machines // 4))]
        self.lnames = [b64id(rng) for _ in range(max(20, cfg.machines))]
        self.make_machines()
        for t, m, typ in self.machine_plan:
            self._push(t, "machine", (m, typ))

        # steady-state targets: requested CPU of each class ~ share x fill x overcommitted capacity
        total_lim = float(self.m_lim_c.sum()) / UNIT
        fill = cfg.request_fill
        self.rates = {}
        for kind, p in WORKLOAD.items():
            e_req, e_reqdur = self._expected_req_cpu_seconds(kind)
            target = p["share"] * fill * total_lim  # requested NCUs in steady state
            self.rates[kind] = target / e_reqdur  # collections per second (Little's law)
            if cfg.job_size_alpha and kind in SIZED_KINDS:
                # planted sizes keep the kind's mean size (instances x request x work), so its arrival rate
                self.size_scale[kind] = e_reqdur * WORK_MEAN / pareto_capped_mean(cfg.job_size_alpha, SIZE_CAP)
            # initial population: running before the trace
            if kind == "alloc_set":
                continue
            acc = 0.0
            while acc < target * (0.9 if p["service"] else 0.6):
                c = self._make_job(kind, 0)
                acc += c.n * c.req_c / UNIT
        # alloc sets first, then the jobs inside them
        acc = 0.0
        target = WORKLOAD["alloc_set"]["share"] * fill * total_lim
        while acc < target * 0.9:
            a = self._new_coll("alloc_set", 0, ctype=int(CollectionType.ALLOC_SET))
            self._push(0, "csub", a)
            acc += a.n * a.req_c / UNIT
            for _ in range(int(rng.integers(1, 4))):
                self._push(0, "csub", self._new_coll("prod_service", 0, alloc_set=a.idx))
        # arrivals inside the trace window (Poisson per class)
        horizon = (self.t_end - TRACE_OFFSET_US) / US
        for kind, lam in self.rates.items():
            k = rng.poisson(lam * horizon)
            times = np.sort(rng.integers(TRACE_OFFSET_US, self.t_end, size=k))
            for t in times:
                if kind == "alloc_set":
                    a = self._new_coll("alloc_set", int(t), ctype=int(CollectionType.ALLOC_SET))
                    self._push(int(t), "csub", a)
                    for _ in range(int(rng.integers(1, 3))):
                        self._push(int(t) + int(rng.integers(1, 600)) * US,
                                   "csub", self._new_coll("batch" if rng.random() < 0.5 else "prod_service",
                                                          int(t), alloc_set=a.idx))
                else:
                    self._make_job(kind, int(t))
        self._push(TRACE_OFFSET_US, "pass", None)
        self._loop()

    def _make_job(self, kind: str, t: int) -> Coll:
        rng = self.rng
        c = self._new_coll(kind, t)
        if t > 0 and kind in ("batch", "free"):
            # pipelines and master/worker pairs
            if rng.random() < 0.05 and self.colls:
                prev = [x.idx for x in self.colls[-50:] if x.kind == kind and x.idx != c.idx]
                if prev:
                    c.start_after = [prev[int(rng.integers(len(prev)))]]
            if rng.random() < 0.1 and c.n > 1:
                master = self._new_coll(kind, t)
                master.n = 1
                master.dur = c.dur * 2
                master.user = c.user
                c.parent = master.idx
                c.user = master.user
                master.children.append(c.idx)
                self._size_job(master)
                self._push(t, "csub", master)
        self._size_job(c)
        self._push(t, "csub", c)
        return c

    def _size_job(self, c: Coll) -> None:
        """Plant the job's size (``job_size_alpha``): S = instances x CPU request x expected work of a
        task (duration x E[lognormal(0, 0.4)]) is drawn from Pareto(alpha) with the kind's scale; the
        instance count and the request follow (both scaled from the natural draws)."""
        alpha = self.cfg.job_size_alpha
        if not alpha or c.kind not in SIZED_KINDS or c.alloc_set >= 0:
            return
        size = self.size_scale[c.kind] * min(SIZE_CAP, float((1.0 - self.rng.random()) ** (-1.0 / alpha)))
        work = c.dur * WORK_MEAN
        n_cap = max(4, 3 * self.cfg.machines)
        lo, hi = SIZED_REQUEST_RANGE
        # the natural job (count n0, request r0) is scaled by k = S / (n0 r0 work): count and request by
        # sqrt(k) each (so neither runs away), then the count moves where the request would leave [lo, hi]
        k = size / (c.n * c.req_c / UNIT * work)
        n = min(n_cap, max(1, round(c.n * math.sqrt(k))))
        req = size / (n * work)
        if req > hi:
            n = min(n_cap, math.ceil(size / (hi * work)))
        elif req < lo:
            n = max(1, math.floor(size / (lo * work)))
        req = size / (n * work)
        if not lo <= req <= hi:
            self.size_stats["request_clipped"] += 1
        c.n = n
        c.req_c = int(round(min(hi, max(lo, req)) * UNIT))
        # memory in proportion to CPU (the kind's median ratio, lognormal sigma 0.5, mean kept), so a job
        # with many small instances does not multiply independent memory requests
        p = WORKLOAD[c.kind]
        ratio = p["mem_median"] / p["cpu_median"] * math.exp(0.5 * float(self.rng.standard_normal()) - 0.125)
        c.req_m = int(round(min(0.3, max(0.0002, c.req_c / UNIT * ratio)) * UNIT))
        self.size_stats["jobs"] += 1
        self.job_size[c.idx] = size

    def _loop(self) -> None:
        cfg = self.cfg
        pending: dict[tuple[int, int], Inst] = {}
        heap = self._heap
        t_end = self.t_end
        while heap:
            t, _, kind, payload = heapq.heappop(heap)
            if t >= t_end:
                break
            if kind == "csub":
                c = payload
                if c.parent >= 0 and self.colls[c.parent].ended:
                    c.ended = True  # parent already gone: never submitted
                    continue
                if c.alloc_set >= 0 and self.colls[c.alloc_set].ended:
                    c.ended = True
                    continue
                c.submitted = True
                self._submit_coll(c, t)
            elif kind == "cend":
                c = payload
                self._kill_coll(c, t, EventType.FINISH if self.rng.random() < 0.3 else EventType.KILL)
            elif kind == "ready":
                inst, att = payload
                if inst.state != "pending" or inst.attempt != att or inst.c.ended:
                    continue
                placed = self._try_place(inst, t)
                if t > 0:
                    st = self.delay_stats[tier_of(inst.c.prio)]
                    st[2] += 1
                    st[3] += int(placed)
                if not placed:
                    pending[inst.key] = inst
                else:
                    pending.pop(inst.key, None)
            elif kind == "end":
                inst, att, how = payload
                if inst.state != "running" or inst.attempt != att:
                    continue
                missing = int(MissingType.NO_SNAPSHOT_OR_TRANSITION) if how == EventType.LOST else 0
                self._stop(inst, t, how, missing)
            elif kind == "machine":
                m, typ = payload
                self._machine_event(t, m, typ)
            elif kind == "upd_running":
                inst, att = payload
                if inst.state != "running" or inst.attempt != att or inst.alloc is not None:
                    continue
                self._update_running(inst, t)
            elif kind == "upd_pending":
                inst, att = payload
                if inst.state != "pending" or inst.attempt != att:
                    continue
                self.stats["updates_pending"] += 1
                inst.req_c = max(500, int(inst.req_c * self.rng.uniform(0.7, 1.1)))
                inst.req_m = max(200, int(inst.req_m * self.rng.uniform(0.8, 1.1)))
                self._iev(t, EventType.UPDATE_PENDING, inst)
            elif kind == "pass":
                self._pass(pending, t)
                self._push(t + cfg.pass_interval_s * US, "pass", None)
        for inst in pending.values():
            if inst.state == "pending":
                self.stats["unplaced_at_end"] += 1

    def _pass(self, pending: dict, t: int) -> None:
        """A scheduling pass over the pending instances, highest priority first."""
        if not pending:
            return
        order = sorted(pending.values(), key=lambda i: (-i.c.prio, i.pending_since, i.key))
        failed: set[int] = set()
        tries = 0
        for inst in order:
            if inst.state != "pending" or inst.c.ended:
                pending.pop(inst.key, None)
                continue
            if inst.c.idx in failed:
                continue
            tries += 1
            if tries > self.cfg.pass_max_tries:
                break
            if self._try_place(inst, t + int(self.rng.integers(0, US))):
                pending.pop(inst.key, None)
            else:
                failed.add(inst.c.idx)

    def _update_running(self, inst: Inst, t: int) -> None:
        m = inst.machine
        new_c = max(500, int(inst.req_c * self.rng.uniform(0.6, 1.4)))
        new_m = max(200, int(inst.req_m * self.rng.uniform(0.8, 1.25)))
        dc, dm = new_c - inst.req_c, new_m - inst.req_m
        if self.m_used_c[m] + dc > self.m_lim_c[m] or self.m_used_m[m] + dm > self.m_lim_m[m]:
            new_c, new_m, dc, dm = min(new_c, inst.req_c), min(new_m, inst.req_m), min(dc, 0), min(dm, 0)
        self.m_used_c[m] += dc
        self.m_used_m[m] += dm
        if inst.c.prio < PRODUCTION_PRIORITY:
            self.m_low_c[m] += dc
            self.m_low_m[m] += dm
        inst.req_c, inst.req_m = new_c, new_m
        self.stats["updates_running"] += 1
        self._iev(t, EventType.UPDATE_RUNNING, inst, machine=m)

    def _machine_event(self, t: int, m: int, typ: int) -> None:
        if typ == MachineEventType.ADD:
            if self.m_up[m]:
                return
            self.m_up[m] = True
            self.machine_events.append((t, m, typ, int(self.m_cap_c[m]), int(self.m_cap_m[m])))
        elif typ == MachineEventType.REMOVE:
            if not self.m_up[m]:
                return
            self.m_up[m] = False
            self.machine_events.append((t, m, typ, int(self.m_cap_c[m]), int(self.m_cap_m[m])))
            for inst in list(self.m_running[m].values()):
                self.stats["machine_evictions"] += 1
                self._stop(inst, t, EventType.EVICT)
        else:
            if not self.m_up[m]:
                return
            # capacity never shrinks: half the updates repeat the capacity, half grow memory
            if self.rng.random() < 0.5:
                self.m_cap_m[m] = min(UNIT, int(self.m_cap_m[m] * 1.5))
                self._limits()
            self.machine_events.append((t, m, typ, int(self.m_cap_c[m]), int(self.m_cap_m[m])))

    # ------------------------------------------------------------------------------- results
    def intervals(self) -> dict[str, np.ndarray]:
        iv = self.iv
        out = {
            "coll": np.asarray(iv["coll"], dtype=np.int64),
            "index": np.asarray(iv["index"], dtype=np.int64),
            "machine": np.asarray(iv["machine"], dtype=np.int64),
            "start": np.asarray(iv["start"], dtype=np.int64),
            "end": np.asarray(iv["end"], dtype=np.int64),
            "alloc_iv": np.asarray(iv["alloc_iv"], dtype=np.int64),
            "alloc_index": np.asarray(iv["alloc_index"], dtype=np.int64),
            "req_c": np.asarray(iv["req_c"], dtype=np.int64),
            "req_m": np.asarray(iv["req_m"], dtype=np.int64),
            "top": np.asarray(iv["top"], dtype=bool),
        }
        return out
