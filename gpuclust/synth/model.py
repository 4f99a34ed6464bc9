"""The scheduling simulation behind ``gpuclust synth``.

A small discrete-event model of a Borg cell (see ``docs/user/synth.md``):

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

import heapq
import math

import numpy as np

from gpuclust.schema import TRACE_OFFSET_US, CollectionType, EventType, MissingType

# the parameters, records and state live in their own modules (issue 36); re-exported here
from gpuclust.synth.params import (
    CAPACITY_SHAPES,
    CELL_US,
    PLANT_TIERS,
    PLATFORMS,
    PRODUCTION_PRIORITY,
    SIZE_CAP,
    SIZED_KINDS,
    SIZED_REQUEST_RANGE,
    UNIT,
    US,
    WORK_MEAN,
    WORK_SIGMA,
    WORKLOAD,
    Coll,
    Inst,
    b64id,
    pareto_capped_mean,
    tier_of,
)
from gpuclust.synth.scheduler import Scheduler
from gpuclust.synth.state import ModelState

__all__ = [
    "CAPACITY_SHAPES",
    "CELL_US",
    "PLANT_TIERS",
    "PLATFORMS",
    "PRODUCTION_PRIORITY",
    "SIZE_CAP",
    "SIZED_KINDS",
    "SIZED_REQUEST_RANGE",
    "UNIT",
    "US",
    "WORK_MEAN",
    "WORK_SIGMA",
    "WORKLOAD",
    "Coll",
    "Inst",
    "Model",
    "ModelState",
    "Scheduler",
    "b64id",
    "pareto_capped_mean",
    "tier_of",
]


class Model(Scheduler):
    """Runs the simulation; results are in the attributes after :meth:`run`."""

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
                        self._push(
                            int(t) + int(rng.integers(1, 600)) * US,
                            "csub",
                            self._new_coll("batch" if rng.random() < 0.5 else "prod_service", int(t), alloc_set=a.idx),
                        )
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
