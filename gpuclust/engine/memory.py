"""The memory budget of a run (``--memory-limit``): parse it, default it from the machine, and
turn it into partition sizes.

Peak memory of a streamed run is about ``threads x rows per partition x bytes per row`` (the
columns read, their Arrow decode buffers, and the partial's transient arrays) plus the merged
partials and contexts, which on a bucketed dataset do not grow with the cell
(docs/user/scale.md).  So the budget sets the rows per partition: half of it is given to the
partitions in flight, the other half is left to merged partials, contexts and finalize.  On a
``distributed.LocalCluster`` the budget is also split across the workers as their
``memory_limit`` (dask then spills to disk and pauses workers near it).

Bytes per row: what each analysis' partial allocates per streamed row at its peak
(``Analysis.row_bytes``, measured with ``tracemalloc`` on 10^6 windows, NumPy backend) plus the
columns it reads, twice (the Arrow table and its NumPy copy).
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from typing import Any

import numpy as np

from gpuclust.schema import SCHEMAS

__all__ = [
    "DEFAULT_SHARE",
    "DEVICE_PARTITION_ROWS",
    "DEVICE_DENSE_SHARE",
    "DEVICE_SHARE",
    "HOLD_SHARE",
    "MIN_PARTITION_ROWS",
    "array_bytes",
    "available_memory",
    "default_limit",
    "device_bytes",
    "device_partition_rows",
    "host_arrays",
    "machine_memory",
    "parse_size",
    "partition_rows",
    "preferred_rows",
    "row_bytes",
    "whole_table_rows",
]

#: Share of the machine's memory a run may use when no limit is given.
DEFAULT_SHARE = 0.75
#: Fewest rows per partition a budget may ask for (smaller partitions cost more than they save).
MIN_PARTITION_ROWS = 1 << 16
_UNITS = {
    "": 1,
    "b": 1,
    "k": 1000,
    "kb": 1000,
    "m": 1000**2,
    "mb": 1000**2,
    "g": 1000**3,
    "gb": 1000**3,
    "t": 1000**4,
    "tb": 1000**4,
    "kib": 1 << 10,
    "mib": 1 << 20,
    "gib": 1 << 30,
    "tib": 1 << 40,
}


def parse_size(value: Any) -> int | None:
    """Bytes from ``8GiB`` / ``512MB`` / ``2g`` / an integer; ``None`` / ``"auto"`` -> ``None``.

    Examples
    --------
    >>> parse_size("8GiB"), parse_size("1.5g"), parse_size(4096), parse_size("auto")
    (8589934592, 1500000000, 4096, None)
    """
    if value is None or (isinstance(value, str) and value.strip().lower() in ("", "auto")):
        return None
    if isinstance(value, (int, np.integer)):
        n = int(value)
    else:
        m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*", str(value))
        if m is None or m.group(2).lower() not in _UNITS:
            raise ValueError(f"memory limit {value!r}: give a size like 8GiB, 512MB or a number of bytes")
        n = int(float(m.group(1)) * _UNITS[m.group(2).lower()])
    if n <= 0:
        raise ValueError(f"memory limit {value!r} must be positive")
    return n


#: Where the cgroup's memory accounting is, under ``/sys/fs/cgroup``: v2, then v1 (limit, usage,
#: stat file, and the stat's inactive page cache, which the kernel reclaims first).
_CGROUP_FILES = (
    ("memory.max", "memory.current", "memory.stat", "inactive_file"),
    ("memory/memory.limit_in_bytes", "memory/memory.usage_in_bytes", "memory/memory.stat", "total_inactive_file"),
)
_CGROUP_ROOT = "/sys/fs/cgroup"


def machine_memory() -> int:
    """Physical memory, or the cgroup's limit when that is lower (containers, batch jobs)."""
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    for limit_name, *_ in _CGROUP_FILES:
        try:
            with open(os.path.join(_CGROUP_ROOT, limit_name)) as f:
                text = f.read().strip()
        except OSError:
            continue
        if text.isdigit() and 0 < int(text) < total:
            total = int(text)
    return int(total)


def available_memory(meminfo: str = "/proc/meminfo", cgroup: str = _CGROUP_ROOT) -> int | None:
    """Bytes that can be allocated now without swapping: the kernel's ``MemAvailable`` (free
    memory plus the page cache and other memory it can reclaim), or the room left under the
    cgroup's limit when that is less; ``None`` where neither can be read (not Linux).

    Free memory alone (``SC_AVPHYS_PAGES``) is not it: after reading a dataset most of a machine's
    memory is page cache, which reads as used (a 24 GiB VM with 23 GiB available showed 2.7 GiB free).
    """
    avail = None
    try:
        with open(meminfo) as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    avail = int(line.split()[1]) * 1024
                    break
    except (OSError, ValueError, IndexError):
        pass
    if avail is None:
        try:
            avail = int(os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
        except (ValueError, OSError, AttributeError):
            return None
    # the cgroup's limit less its usage, the usage less its inactive page cache (its "working set")
    for limit_name, usage_name, stat_name, cache_key in _CGROUP_FILES:
        try:
            with open(os.path.join(cgroup, limit_name)) as f:
                limit = f.read().strip()
            with open(os.path.join(cgroup, usage_name)) as f:
                used = int(f.read().strip())
        except (OSError, ValueError):
            continue
        try:
            with open(os.path.join(cgroup, stat_name)) as f:
                stat = dict(line.split()[:2] for line in f if len(line.split()) >= 2)
            used -= int(stat.get(cache_key, 0))
        except (OSError, ValueError):
            pass
        if limit.isdigit():
            avail = min(avail, max(0, int(limit) - max(0, used)))
        break
    return int(avail)


def default_limit() -> int:
    """The budget when none is given: :data:`DEFAULT_SHARE` of :func:`machine_memory`."""
    return int(DEFAULT_SHARE * machine_memory())


def row_bytes(analyses: Sequence[Any], table: str) -> int:
    """Peak bytes per streamed row of ``table`` for ``analyses`` sharing one read (see the module
    docstring)."""
    schema = SCHEMAS[table]
    cols = {c for a in analyses for c in a.columns}
    read = sum(np.dtype(schema.field(c).type.to_pandas_dtype()).itemsize for c in cols)
    return int(2 * read + sum(int(getattr(a, "row_bytes", 512)) for a in analyses))


def preferred_rows(analyses: Sequence[Any], cap: int, source: Any = None) -> int:
    """``cap``, or less where every analysis sharing the read names its own target
    (``auto_rows(source)``: ``auto_partition_rows`` unless it depends on the data; the largest of them).  Analyses whose
    per-row work is a few cheap passes (cell-usage, cpi) gain nothing from partitions larger than a
    Parquet row group (1 Mi rows): smaller ones keep less in flight (peak memory) and let the
    allocator reuse the same heap blocks partition after partition (no fresh pages to fault in)."""
    hints = [a.auto_rows(source) for a in analyses]
    if not hints or any(h is None for h in hints):
        return int(cap)
    return int(min(cap, max(int(h) for h in hints if h is not None)))  # none is None here


#: Most rows of a partition on a device backend.  A partition costs the same launches and syncs
#: at any size, so a device run takes its partitions as large as its memory allows, up to this.
DEVICE_PARTITION_ROWS = 1 << 26
#: Share of the device's free memory a device run's partitions may take, beside its accumulators
#: (:data:`DEVICE_DENSE_SHARE`) and its merge trees' hold (:data:`HOLD_SHARE`): on an H200, 2.3e7
#: rows of all 13 analyses' instance_usage columns a partition (~3 kB a row at their peak,
#: :func:`row_bytes`).  A table whose rows all fit in the first two shares together is one
#: partition, which neither merges nor keeps accumulators (:func:`device_partition_rows`).
DEVICE_SHARE = 0.5
#: Most of the device's free memory that a local device run's accumulators kept across its
#: partitions may take, all its analyses' together (:class:`gpuclust.engine.shards.DeviceRoom`).
#: A dense sum past what is left of it runs in key passes (:mod:`gpuclust.engine.key_passes`),
#: each a further read of its columns, where a smaller partition costs only its launches: at a
#: 2019 cell's size (12,500 machines, 31 days) overcommit's accumulators take ~52 GB and cpi's
#: ~25 GB, of which four tenths of an H200 hold overcommit's (cpi's: a read more).
DEVICE_DENSE_SHARE = 0.4
#: Share of the device's free memory (or of a study's memory budget, with what the run leaves of
#: the rest) that a device run's merge trees may hold in partials merged on the device
#: (:class:`gpuclust.engine.tasks.DeviceHold`); an analysis whose partial does not fit is merged
#: on the host from then on.
HOLD_SHARE = 0.1


def device_partition_rows(
    free: int, in_flight: int, analyses: Sequence[Any], table: str, table_rows: int | None = None
) -> int:
    """Rows per partition of ``table`` on a device with ``free`` bytes: ``in_flight`` partitions,
    at :func:`row_bytes` each row, within :data:`DEVICE_SHARE` of them (the host holds no more
    than a row group of a partition: it is decoded straight into the device's arrays), or the
    whole table (``table_rows``) where it fits within that share and :data:`DEVICE_DENSE_SHARE`
    together (one partition keeps no accumulators across partitions); at most
    :data:`DEVICE_PARTITION_ROWS`, at least :data:`MIN_PARTITION_ROWS`.

    >>> from gpuclust.analyses import CellUsage
    >>> device_partition_rows(80 << 30, 1, [CellUsage()], "instance_usage") == DEVICE_PARTITION_ROWS
    True
    >>> device_partition_rows(1 << 30, 1, [CellUsage()], "instance_usage")
    2684354
    >>> device_partition_rows(1 << 30, 1, [CellUsage()], "instance_usage", table_rows=4_000_000)
    4000000
    """
    per = max(1, row_bytes(analyses, table)) * max(1, int(in_flight))
    rows = int(DEVICE_SHARE * free) // per
    if table_rows is not None and int(table_rows) * per <= (DEVICE_SHARE + DEVICE_DENSE_SHARE) * free:
        rows = max(rows, int(table_rows))
    return int(min(DEVICE_PARTITION_ROWS, max(MIN_PARTITION_ROWS, rows)))


def partition_rows(
    limit: int, in_flight: int, analyses: Sequence[Any], table: str, cap: int, source: Any = None
) -> int:
    """Rows per partition so that ``in_flight`` partitions fit in half of ``limit``; at most
    ``cap`` (the engine's usual target) or the analyses' own target (:func:`preferred_rows`), at
    least :data:`MIN_PARTITION_ROWS`."""
    per = max(1, row_bytes(analyses, table)) * max(1, int(in_flight))
    return int(min(preferred_rows(analyses, cap, source), max(MIN_PARTITION_ROWS, (limit // 2) // per)))


def whole_table_rows(limit: int, analyses: Sequence[Any], table: str) -> int:
    """Most rows of ``table`` that one partition may hold when it is the only one in flight (an
    analysis that needs the whole table in one partition): half of ``limit`` over
    :func:`row_bytes`, with no preferred size."""
    return int(max(MIN_PARTITION_ROWS, (limit // 2) // max(1, row_bytes(analyses, table))))


def array_bytes(objs: Sequence[Any], depth: int = 4) -> int:
    """Bytes of the NumPy arrays in ``objs`` (contexts: dataclass fields, dicts, lists, tuples,
    ``depth`` levels down), each array counted once however often it is reached: at most what the
    partials copy to a device of the contexts' arrays (``Backend.stage``, kept while they live).

    >>> array_bytes([{"a": np.zeros(4), "b": (np.zeros(2, np.int32),)}])
    40
    """
    return _bytes_of(objs, lambda x: isinstance(x, np.ndarray), depth)


def device_bytes(objs: Sequence[Any], depth: int = 8) -> int:
    """Bytes of the device arrays (``__cuda_array_interface__``) in ``objs`` (partials: dataclass
    fields, dicts, lists, tuples, ``depth`` levels down), each counted once.

    >>> device_bytes([{"a": np.zeros(4)}])  # host arrays do not count
    0
    """
    return _bytes_of(objs, lambda x: hasattr(x, "__cuda_array_interface__") and hasattr(x, "nbytes"), depth)


def host_arrays(objs: Sequence[Any], depth: int = 4) -> list[np.ndarray]:
    """The NumPy arrays in ``objs`` (as :func:`array_bytes` finds them), each once."""
    return _arrays_in(objs, lambda x: isinstance(x, np.ndarray), depth)


def _bytes_of(objs: Sequence[Any], is_array: Any, depth: int) -> int:
    return sum(int(x.nbytes) for x in _arrays_in(objs, is_array, depth))


def _arrays_in(objs: Sequence[Any], is_array: Any, depth: int) -> list[Any]:
    import dataclasses

    seen: dict[int, Any] = {}

    def walk(x: Any, left: int) -> None:
        if is_array(x):
            seen.setdefault(id(x), x)
        elif left <= 0 or isinstance(x, (str, bytes, np.ndarray)):
            return
        elif dataclasses.is_dataclass(x) and not isinstance(x, type):
            for f in dataclasses.fields(x):
                walk(getattr(x, f.name), left - 1)
        elif isinstance(x, dict):
            for v in x.values():
                walk(v, left - 1)
        elif isinstance(x, (list, tuple)):
            for v in x:
                walk(v, left - 1)

    for o in objs:
        walk(o, depth)
    return list(seen.values())
