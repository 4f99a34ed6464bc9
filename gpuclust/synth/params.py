"""Parameters and records of the scheduling simulation behind ``gpuclust synth``.

The units (``US``, ``CELL_US``, ``UNIT``), the machine shapes and platforms, the workload classes,
the planted-law constants, small helpers, and the per-collection (:class:`Coll`) and per-instance
(:class:`Inst`) records that :class:`gpuclust.synth.model.Model` works on.
"""

from __future__ import annotations

import base64
import functools
import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from gpuclust.schema import TIER_MAPS
from gpuclust.tiers import tier_codes

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
    "prod_service": dict(
        share=0.36,
        priorities=(120, 200),
        pw=(0.85, 0.15),
        sclass=(2, 3),
        scw=(0.6, 0.4),
        alpha=1.3,
        size_scale=2.0,
        service=True,
        dur_median=3 * 86400,
        dur_sigma=1.2,
        cpu_median=0.012,
        cpu_sigma=0.8,
        mem_median=0.010,
        mem_sigma=0.8,
    ),
    "monitoring": dict(
        share=0.03,
        priorities=(360, 450),
        pw=(0.7, 0.3),
        sclass=(2, 3),
        scw=(0.5, 0.5),
        alpha=1.6,
        size_scale=1.0,
        service=True,
        dur_median=5 * 86400,
        dur_sigma=1.0,
        cpu_median=0.003,
        cpu_sigma=0.6,
        mem_median=0.003,
        mem_sigma=0.6,
    ),
    "mid_service": dict(
        share=0.08,
        priorities=(116, 117, 119),
        pw=(0.4, 0.4, 0.2),
        sclass=(1, 2),
        scw=(0.5, 0.5),
        alpha=1.3,
        size_scale=2.0,
        service=True,
        dur_median=8 * 3600,
        dur_sigma=1.2,
        cpu_median=0.008,
        cpu_sigma=0.8,
        mem_median=0.008,
        mem_sigma=0.8,
    ),
    "batch": dict(
        share=0.25,
        priorities=(100, 101, 103, 105, 107, 110, 115),
        pw=(0.3, 0.1, 0.15, 0.15, 0.1, 0.1, 0.1),
        sclass=(0, 1),
        scw=(0.4, 0.6),
        alpha=1.1,
        size_scale=3.0,
        service=False,
        dur_median=900,
        dur_sigma=1.4,
        cpu_median=0.010,
        cpu_sigma=0.9,
        mem_median=0.006,
        mem_sigma=0.9,
    ),
    "free": dict(
        share=0.10,
        priorities=(0, 25),
        pw=(0.7, 0.3),
        sclass=(0,),
        scw=(1.0,),
        alpha=1.2,
        size_scale=2.0,
        service=False,
        dur_median=1800,
        dur_sigma=1.5,
        cpu_median=0.006,
        cpu_sigma=0.9,
        mem_median=0.005,
        mem_sigma=0.9,
    ),
    # alloc sets (prod) and the jobs that run inside them
    "alloc_set": dict(
        share=0.18,
        priorities=(120, 200),
        pw=(0.8, 0.2),
        sclass=(2,),
        scw=(1.0,),
        alpha=1.5,
        size_scale=2.0,
        service=True,
        dur_median=4 * 86400,
        dur_sigma=1.0,
        cpu_median=0.06,
        cpu_sigma=0.5,
        mem_median=0.05,
        mem_sigma=0.5,
    ),
}

#: The tier map the planted per-tier truths use (Google's notebook: free, beb, mid, prod).
PLANT_TIERS = TIER_MAPS["notebook"]
#: The lowest production priority (the planted map's ``prod`` tier, 120): production instances
#: that do not fit preempt lower-priority ones.
PRODUCTION_PRIORITY = PLANT_TIERS.bounds[PLANT_TIERS.names.index("prod")]
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
    return PLANT_TIERS.names[int(tier_codes(np, PLANT_TIERS, np.array([prio]))[0])]


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
    __slots__ = (
        "c",
        "index",
        "state",
        "machine",
        "req_c",
        "req_m",
        "attempt",
        "fails",
        "work",
        "iv",
        "alloc",
        "tasks",
        "used_c",
        "used_m",
        "key",
        "pending_since",
        "upd_pending",
    )

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
