"""Allocator tuning for the engine's large temporary arrays (glibc only).

Every partition allocates and frees arrays of tens of MiB.  glibc serves allocations above its
mmap threshold (dynamic, starting at 128 KiB) with fresh ``mmap`` s and returns freed memory to
the kernel, so each partition pays for its pages again: minor faults, page zeroing and, with
transparent huge pages on ``madvise`` (NumPy asks for them), compaction.  With threads the
``munmap`` s also cost TLB shoot-downs.  On the 2-core dev VM this was a third of overcommit's CPU
time (2-3 s of system time per 10^7 windows).

:func:`tune_allocator` raises the mmap threshold to its maximum (32 MiB on 64-bit) and keeps up to
1 GiB of freed heap for reuse, once per process. gpuclust also caps glibc at one malloc arena: by default
every engine thread allocates from an arena of its own, and memory one thread freed (the context's
temporaries, another thread's last partition) is not reused by the others, which cost ~350 MB of
peak RSS on cell-usage at 1.6e7 windows on 2 threads (a few large allocations per partition: no
lock contention to speak of). The cap is set when gpuclust is imported (:func:`cap_arenas`), before
it imports pyarrow: pyarrow's import starts a thread that makes a second arena, to which glibc then
hands every other new thread (an engine thread among them) whatever the cap set later; with both
arenas keeping freed memory, peak RSS varied by ~100 MiB from run to run (usage-distribution by
instance, 2e6 windows, beside a busy core: 307-429 MiB over 14 runs, 300-345 over 16 with one). pyarrow's
decoding threads then share that arena's lock: on the 2-core VM, 23 usage columns of 8e6 windows
decoded at 0.91 GB/s against 0.96 with two arenas (medians of 11 interleaved runs; whole analysis
runs measured no slower). A program that imports pyarrow before gpuclust keeps that second arena
(``MALLOC_ARENA_MAX=1`` in its environment caps it from the start; a ``MALLOC_ARENA_MAX`` in the
environment is glibc's and left alone).  And it routes Arrow's allocations to the system
allocator (unless ``ARROW_DEFAULT_MEMORY_POOL`` chooses one): Arrow's default pool (mimalloc)
hands the decoded row groups' pages back to the kernel, about 1 s of system time per 1.6e7
windows in page faults, where glibc, tuned as above, reuses them.  And it stops NumPy asking for
transparent huge pages for its arrays (``madvise(MADV_HUGEPAGE)`` on every allocation of 4 MiB
or more; unless ``NUMPY_MADVISE_HUGEPAGE`` says otherwise): with THP on ``madvise`` each fault
then zeroes 2 MiB and may compact memory; without it job-usage at 6.4e7 windows took 1.1 s of
system time instead of 2.4-3.5 s (wall 7.7-8.6 s against 9.1-10.8 s), and every case at 1.6e7
measured less system time (bench/cpu_vs_duckdb.py, interleaved runs with and without it).  Results do not depend on it;
a process keeps its peak heap after a run.  ``GPUCLUST_MALLOC_TUNING=0`` turns it off; the glibc
part does nothing where the C library is not glibc.

:func:`run_memory` also holds the memory budget of the run in progress (``--memory-limit``, or
its default share of the machine; on a device, the device's free memory) and whether its arrays
live on a device, context variables the engine sets around a run, so that an analysis deciding on
the client how to run (usage-distribution's ``auto`` strategy) can keep within it;
:func:`memory_budget` is ``None`` and :func:`run_on_device` false outside a run.
"""

from __future__ import annotations

import contextlib
import contextvars
import ctypes
import os
import sys
import threading
from collections.abc import Iterator

__all__ = ["cap_arenas", "memory_budget", "run_memory", "run_on_device", "tune_allocator", "worker_environ"]

_budget: contextvars.ContextVar[int | None] = contextvars.ContextVar("gpuclust_run_memory", default=None)
_device: contextvars.ContextVar[bool] = contextvars.ContextVar("gpuclust_run_on_device", default=False)


@contextlib.contextmanager
def run_memory(limit: int | None, device: bool = False) -> Iterator[None]:
    """Within the block, :func:`memory_budget` is ``limit`` (bytes) and :func:`run_on_device` is
    ``device`` (the run's arrays live on a device, ``limit`` is its memory) in this thread.

    >>> with run_memory(2 << 30):
    ...     memory_budget(), run_on_device()
    (2147483648, False)
    >>> memory_budget() is None
    True
    """
    token = _budget.set(None if limit is None else int(limit))
    on = _device.set(bool(device))
    try:
        yield
    finally:
        _device.reset(on)
        _budget.reset(token)


def memory_budget() -> int | None:
    """The memory budget of the run in progress, in bytes (``None``: no run has set one)."""
    return _budget.get()


def run_on_device() -> bool:
    """Whether the run in progress keeps its arrays on a device (false outside a run)."""
    return _device.get()


_M_TRIM_THRESHOLD = -1
_M_TOP_PAD = -2
_M_MMAP_THRESHOLD = -3
_M_ARENA_MAX = -8
MMAP_THRESHOLD = 32 << 20
TRIM_THRESHOLD = 1 << 30
TOP_PAD = 64 << 20

_lock = threading.Lock()
_done: list[bool] = []


def _numpy_hugepages(on: bool) -> None:
    """NumPy's ``madvise(MADV_HUGEPAGE)`` of its large arrays on or off (what the environment
    variable ``NUMPY_MADVISE_HUGEPAGE`` sets at import), where this NumPy has the switch."""
    try:
        from numpy._core import multiarray
    except ImportError:  # NumPy 1.x
        from numpy.core import multiarray  # type: ignore[no-redef]
    switch = getattr(multiarray, "_set_madvise_hugepage", None)
    if switch is not None:
        switch(bool(on))


def _tuning_on() -> bool:
    return os.environ.get("GPUCLUST_MALLOC_TUNING", "1") != "0" and sys.platform.startswith("linux")


def _glibc() -> ctypes.CDLL | None:
    """The C library when it is glibc (the process' own symbols: ctypes.util.find_library would
    import subprocess & co. and run ldconfig, ~15 ms of every start), else None."""
    try:
        libc = ctypes.CDLL(None)
    except OSError:
        return None
    return libc if hasattr(libc, "gnu_get_libc_version") and hasattr(libc, "mallopt") else None


def cap_arenas() -> bool:
    """Cap glibc at one malloc arena, for the threads made from now on (``import gpuclust`` calls
    it first thing; see the module docstring); returns whether the cap is set."""
    libc = _glibc() if _tuning_on() and not os.environ.get("MALLOC_ARENA_MAX") else None
    return bool(libc is not None and libc.mallopt(_M_ARENA_MAX, 1))


def worker_environ() -> dict[str, str]:
    """The environment a worker process gpuclust spawns (``scheduler="local:N"``) starts with, so
    that it keeps one malloc arena as the client does: ``MALLOC_ARENA_MAX=1``.  A worker imports
    distributed, and pyarrow with it, before its first task imports gpuclust, so :func:`cap_arenas`
    comes too late there; glibc reads the variable when the process starts.  Empty where the
    tuning is off or the variable is set already (the user's choice, inherited).  Measured on
    usage-distribution, job-usage and overcommit over 4e6 windows with ``local:2`` (3 interleaved
    runs each way): worker peaks 975-1,022 MiB against 950-1,041 with the 4 arenas a worker has
    without it, the same within the runs' spread; it is there so that a worker's allocator is the
    one the engine is tuned and measured with."""
    if not _tuning_on() or os.environ.get("MALLOC_ARENA_MAX") or _glibc() is None:
        return {}
    return {"MALLOC_ARENA_MAX": "1"}


def tune_allocator() -> bool:
    """Apply the tuning once per process; returns whether it is in effect."""
    with _lock:
        if _done:
            return _done[0]
        ok = False
        libc = _glibc() if _tuning_on() else None
        if libc is not None:
            ok = bool(
                libc.mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)
                & libc.mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD)
                & libc.mallopt(_M_TOP_PAD, TOP_PAD)
            )  # (the arena cap: :func:`cap_arenas`, at import)
            if ok and not os.environ.get("ARROW_DEFAULT_MEMORY_POOL"):
                import pyarrow as pa

                pa.set_memory_pool(pa.system_memory_pool())
            if ok and os.environ.get("NUMPY_MADVISE_HUGEPAGE") is None:
                _numpy_hugepages(False)
        _done.append(ok)
        return ok
