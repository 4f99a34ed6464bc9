"""Where a run's wall time goes: the phases ``_run.json`` records (``phases``).

:func:`gpuclust.report.analyze.analyze` (the ``gpuclust analyze`` command) opens one clock for the
run (:func:`clock`); the engine and the results writer mark what they do with ``with phase(name):``
(``name`` one of :data:`PHASES`).  Phases are exclusive: one entered inside another pauses the outer
one (a prerequisite pass's reads are ``read``, not ``contexts``), so the phases of the thread that
opened the clock add up to at most the run's wall time; what no phase covers is not recorded.
Phases run on other threads (the engine threads of a cpu run with several workers, the read-ahead)
are summed over those threads apart (``phases_other_threads``), and the main thread meanwhile waits
in ``stream``.  ``phase(name, label)`` also counts the seconds for the analysis ``label``
(``phases_by_analysis``, any thread).  Without a clock, :func:`phase` does nothing.  One run at a
time records its phases: a run started on another thread meanwhile records none (its phases count
in the first run's ``phases_other_threads``).
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from datetime import datetime, timezone
from typing import Any

__all__ = ["PHASES", "Clock", "clock", "phase"]

#: The phases, in run order, and what each covers (docs/analyses/README.md lists them).
PHASES: dict[str, str] = {
    "prepare": "resolve the analyses, open and check the dataset, resolve the backend, open the results folder",
    "plan": "plan the partitions of each table (row-group statistics of a time selection)",
    "contexts": "the analyses' contexts (capacities, instance lookups), their prerequisite passes' own phases apart",
    "read": "read and decode partitions (Parquet to host arrays; on gpu, copied to the device)",
    "partials": "the analyses' partials over each partition, copied back to the host",
    "merge": "merge the partials in partition order",
    "stream": "the rest of streaming partitions: waiting for the engine threads, progress",
    "finalize": "the analyses' finalize (a parted table's shards reduced and written)",
    "tables": "write the result tables (Parquet)",
    "plots": "draw the plots (PNG)",
    "summary": "the analyses' summary paragraphs and summary.txt",
}

_CURRENT: Clock | None = None


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


class Clock:
    """Exclusive wall seconds per phase (see the module docstring)."""

    def __init__(self) -> None:
        self.started = _now()
        self.t0 = time.perf_counter()
        self.owner = threading.get_ident()
        self.seconds: dict[str, float] = {}
        self.other_threads: dict[str, float] = {}
        self.by_analysis: dict[str, dict[str, float]] = {}
        self._lock = threading.Lock()
        self._stacks = threading.local()  # per thread: [[name, label, start of its current stretch], ...]

    def _add(self, name: str, label: str | None, dt: float) -> None:
        with self._lock:
            into = self.seconds if threading.get_ident() == self.owner else self.other_threads
            into[name] = into.get(name, 0.0) + dt
            if label is not None:
                per = self.by_analysis.setdefault(label, {})
                per[name] = per.get(name, 0.0) + dt

    @contextlib.contextmanager
    def phase(self, name: str, label: str | None = None) -> Iterator[None]:
        if name not in PHASES:
            raise ValueError(f"unknown phase {name!r}")
        stack = self._stacks.__dict__.setdefault("stack", [])
        now = time.perf_counter()
        if stack:  # the outer phase pauses
            outer = stack[-1]
            self._add(outer[0], outer[1], now - outer[2])
        stack.append([name, label, now])
        try:
            yield
        finally:
            end = time.perf_counter()
            inner = stack.pop()
            self._add(inner[0], inner[1], end - inner[2])
            if stack:
                stack[-1][2] = end  # the outer phase resumes

    def elapsed(self) -> float:
        return time.perf_counter() - self.t0

    def record(self) -> dict[str, Any]:
        """What ``_run.json`` records: ``started``, ``finished``, ``seconds`` (this clock's wall
        time so far) and the phases (seconds, rounded to the millisecond), in :data:`PHASES` order."""

        def rounded(d: dict[str, float]) -> dict[str, float]:
            return {k: round(d[k], 3) for k in PHASES if k in d}

        with self._lock:
            out: dict[str, Any] = {
                "started": self.started,
                "finished": _now(),
                "seconds": round(self.elapsed(), 3),
                "phases": rounded(self.seconds),
                "phases_by_analysis": {a: rounded(d) for a, d in self.by_analysis.items()},
            }
            if self.other_threads:
                out["phases_other_threads"] = rounded(self.other_threads)
        return out


@contextlib.contextmanager
def clock() -> Iterator[Clock]:
    """Open the run's clock (the one :func:`phase` records into) for the ``with`` block; a clock
    already open (a run inside a run, or another thread's run) stays the one."""
    global _CURRENT
    if _CURRENT is not None:
        yield _CURRENT
        return
    _CURRENT = c = Clock()
    try:
        yield c
    finally:
        _CURRENT = None


def current() -> Clock | None:
    """The open clock, if this thread opened it."""
    c = _CURRENT
    return c if c is not None and c.owner == threading.get_ident() else None


@contextlib.contextmanager
def phase(name: str, label: str | None = None) -> Iterator[None]:
    """Count the ``with`` block's wall time as phase ``name`` (of analysis ``label``) on the open clock, if any."""
    c = _CURRENT
    if c is None:
        yield
        return
    with c.phase(name, label):
        yield
