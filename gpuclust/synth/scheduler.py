"""Instance lifecycle of the scheduling simulation: submission, placement, preemption, stops.

:class:`Scheduler` SUBMITs instances (with the planted scheduling delays), places them by request
under the overcommit limits (power of two choices; production instances preempt lower-priority
ones; tasks of alloc sets go inside alloc instances), starts and stops running attempts, ends
collections, runs the scheduling passes and applies machine events.  See ``docs/user/synth.md``.
"""

from __future__ import annotations

import numpy as np

from gpuclust.schema import TRACE_OFFSET_US, CollectionType, EventType, MachineEventType
from gpuclust.synth.params import PRODUCTION_PRIORITY, UNIT, US, WORKLOAD, Coll, Inst, tier_of
from gpuclust.synth.state import ModelState


class Scheduler(ModelState):
    """The lifecycle of instances and collections; :class:`gpuclust.synth.model.Model` drives it."""

    # ------------------------------------------------------------------------------- submission
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
                self.m_used_m - self.m_low_m + inst.req_m <= self.m_lim_m
            )
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
        victims = sorted(
            (v for v in self.m_running[m].values() if v.c.prio < PRODUCTION_PRIORITY), key=lambda v: (v.c.prio, -v.iv)
        )
        for v in victims:
            if (self.m_used_c[m] + inst.req_c <= self.m_lim_c[m]) and (
                self.m_used_m[m] + inst.req_m <= self.m_lim_m[m]
            ):
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
        if inst.alloc is None and c.ctype == CollectionType.JOB and rng.random() < self.cfg.update_running_fraction:
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
