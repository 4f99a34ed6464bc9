"""The simulation's state: machines, collections, the event queue and the recorded events.

:class:`ModelState` makes the machines (capacities, platforms, attributes, the machine event plan)
and the collections of the workload classes, and records the event lists and the interval table;
:class:`gpuclust.synth.scheduler.Scheduler` moves instances through their lifecycle on top of it and
:class:`gpuclust.synth.model.Model` runs the whole simulation.
"""

from __future__ import annotations

import heapq

import numpy as np

from gpuclust.schema import TRACE_OFFSET_US, CollectionType, MachineEventType, Relation
from gpuclust.synth.params import (
    CAPACITY_SHAPES,
    CELL_US,
    PLANT_TIERS,
    PLATFORMS,
    UNIT,
    US,
    WORKLOAD,
    Coll,
    Inst,
    b64id,
    tier_of,
)


class ModelState:
    """Machines, collections and the recorded events; the base of :class:`gpuclust.synth.model.Model`."""

    # set when the simulation runs (:meth:`gpuclust.synth.model.Model.run`)
    _heap: list
    _seq: int
    _cids: set[int]
    _ninst: int
    _alloc_running: dict[int, dict]
    _insts_of: dict[int, dict]
    _t_first: int
    users: list[str]
    lnames: list[str]

    def __init__(self, cfg, rng: np.random.Generator):
        self.cfg = cfg
        self.rng = rng
        self.t_end = TRACE_OFFSET_US + int(round(cfg.hours * 3600 * US))
        # outputs
        self.machine_events: list[tuple] = []  # (time, m, type)
        self.machine_attrs: list[tuple] = []  # (time, m, name, value or None, deleted)
        self.coll_events: list[tuple] = []  # (time, type, coll_idx, missing_type)
        self.inst_events: list[tuple] = []  # (time, type, coll_idx, index, machine, req_c, req_m, alloc_index, missing)
        self.iv: dict[str, list] = {
            k: []
            for k in ("coll", "index", "machine", "start", "end", "alloc_iv", "alloc_index", "req_c", "req_m", "top")
        }
        self.colls: list[Coll] = []
        self.stats = {
            "preemptions": 0,
            "machine_evictions": 0,
            "resubmissions": 0,
            "updates_running": 0,
            "updates_pending": 0,
            "unplaced_at_end": 0,
        }
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
            (
                [
                    (self.attr_names[1], "1", int(Relation.NOT_EQUAL)),
                    (self.attr_names[0], "5", int(Relation.LESS_THAN)),
                ],
                (self.m_attr_gen != 1) & (self.m_attr_int < 5),
            ),
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
        c = Coll(
            idx=len(self.colls),
            cid=cid,
            ctype=ctype,
            kind=kind,
            prio=prio,
            sclass=sclass,
            n=n,
            req_c=int(round(req_c * UNIT)),
            req_m=int(round(req_m * UNIT)),
            submit=t,
            dur=dur,
            user=user,
            name=b64id(rng),
            lname=lname,
            alloc_set=alloc_set,
        )
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
