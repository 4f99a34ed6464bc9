"""Threads for work that NumPy and Arrow do without the GIL: an ordered thread map, and how many
threads the client may use for the work it does itself (an analysis' context).

The engine runs partitions on its own threads; the contexts (an instance lookup built from every
instance event, a sort of hundreds of millions of keys for one cell) are computed on the client
before any partition runs, on one thread unless the engine says how many it may use
(:func:`client_threads`, a context variable: a context bound inside a partition task, on an
engine thread or a dask worker, sees the default of one and stays serial there).
"""

from __future__ import annotations

import contextlib
import contextvars
import os
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

__all__ = ["client_threads", "map_ordered", "threads", "usable_cores"]

_T = TypeVar("_T")

_threads: contextvars.ContextVar[int] = contextvars.ContextVar("gpuclust_client_threads", default=1)


def usable_cores() -> int:
    """CPU cores this process may run on (its affinity mask: container and batch-job pinning
    respected; all the machine's cores where there is no mask)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # not on Linux
        return max(1, os.cpu_count() or 1)


@contextlib.contextmanager
def client_threads(n: int) -> Iterator[None]:
    """Within the block, :func:`threads` is ``n`` (at least 1) in this thread.

    >>> with client_threads(4):
    ...     threads()
    4
    >>> threads()
    1
    """
    token = _threads.set(max(1, int(n)))
    try:
        yield
    finally:
        _threads.reset(token)


def threads() -> int:
    """How many threads work done in this thread may use (see :func:`client_threads`)."""
    return _threads.get()


def map_ordered(
    fn: Callable[[Any], _T], items: Sequence[Any], threads: int, name: str = "gpuclust-map"
) -> Iterable[_T]:
    """``map(fn, items)`` on ``threads`` threads when there is more than one item, results in
    item order (``fn`` must release the GIL to gain: NumPy and Arrow kernels do).

    >>> list(map_ordered(lambda x: x * x, [1, 2, 3], threads=2))
    [1, 4, 9]
    """
    if threads <= 1 or len(items) <= 1:
        yield from map(fn, items)
        return
    with ThreadPoolExecutor(max_workers=min(threads, len(items)), thread_name_prefix=name) as pool:
        yield from pool.map(fn, items)
