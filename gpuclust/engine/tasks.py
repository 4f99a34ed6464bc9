"""What one partition task does, and how its results are merged.

:func:`partition_partials` reads one partition once (the union of the analyses' columns), filters it
by the run's time selection and returns each analysis' partial on the host; :func:`merge_lists` and
:class:`MergeTree` merge those lists in partition order, by the same tree on the local path
(:mod:`gpuclust.engine.local`) and on dask (:mod:`gpuclust.engine.dask`); :class:`Prefetch` reads
the local path's first partitions while its contexts are computed.
"""

from __future__ import annotations

import contextvars
import threading
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from gpuclust._memory import tune_allocator
from gpuclust._parallel import threads
from gpuclust.analyses.base import Analysis, to_host
from gpuclust.backends import Backend, device_free_bytes, get_backend
from gpuclust.engine import memory as _memory
from gpuclust.engine import partition as _partition
from gpuclust.engine import reading as _reading
from gpuclust.engine import selection as _selection
from gpuclust.engine import shards as _shards
from gpuclust.engine import staging as _staging
from gpuclust.engine.contexts import PerPartition, bind_all
from gpuclust.engine.memory import device_bytes
from gpuclust.engine.timing import phase

__all__ = [
    "DeviceHold",
    "Prefetch",
    "MergeTree",
    "device_hold",
    "kept_in_memory",
    "merge_lists",
    "merged_on_device",
    "partition_columns",
    "partition_partials",
    "placed",
    "staying",
]


def partition_columns(spec: _partition.PartitionSpec, analyses: Sequence[Analysis]) -> list[str]:
    """The columns :func:`partition_partials` reads from ``spec`` for ``analyses``."""
    return sorted({c for a in analyses for c in a.columns} | _selection.extra_columns(spec, analyses))


def partition_partials(
    spec: _partition.PartitionSpec,
    analyses: Sequence[Analysis],
    ctxs: Sequence[Any],
    backend: Backend | str,
    spills: Sequence[_shards.SpillTarget | None] | None = None,
    host: dict[str, Any] | None = None,
    load_threads: int = 1,
    keep: set[int] | frozenset[int] = frozenset(),
    hold: DeviceHold | None = None,
) -> list[Any]:
    """Read one partition once (the union of the analyses' columns) and return each analysis'
    partial, moved to host memory so it can be merged or shipped to another worker (``spills``:
    per analysis, the folder its keyed partials are spilled to, for one with parted tables; see
    :mod:`gpuclust.engine.shards`; ``host``: the partition already read by
    the local path's read-ahead, :func:`gpuclust.engine.reading.read_partition`; ``load_threads``:
    on a device backend, the threads that decode its Parquet row groups and copy them to the
    device, as a study loads; ``keep``: the ids of the analyses whose partials stay in backend
    memory, see :attr:`gpuclust.analyses.base.Analysis.device_partial`, as far as ``hold``
    admits those merged on the device)."""
    be = get_backend(backend)
    tune_allocator()  # once per process (dask workers too); see gpuclust/_memory.py
    columns = partition_columns(spec, analyses)

    def read() -> dict[str, Any]:
        nonlocal host
        with phase("read"):
            cols = None if host is not None else _reading.read_partition_device(spec, columns, be)  # cuDF (RAPIDS)
            if cols is None and host is None and be.name != "cpu":
                # decoded on the host and copied through pinned buffers on a copy stream, as a study loads
                # (a pageable copy runs at a fraction of the bus's rate: 8 against 55 GB/s on an H100 node)
                cols = _staging.load_partitions([[spec]], columns, be, threads=load_threads)[0]
            if cols is None:
                if host is None:
                    host = _reading.read_partition(spec, columns)
                cols = {c: be.asarray(v) for c, v in host.items()}
                host = None
            return cols

    if be.name == "cpu" or host is not None or not any(isinstance(c, PerPartition) for c in ctxs):
        bound = bind_all(analyses, ctxs, spec)
        cols = read()
    else:  # a device: the partition loads while the task's host threads bind its analyses
        cols, bound = _read_beside(be, read, lambda: bind_all(analyses, ctxs, spec, max(threads(), load_threads)))
    masks: dict[str, Any] = {}  # selection (--from/--to): rows filtered per analysis rule, one mask per rule
    out = []
    for a, ctx in zip(analyses, bound, strict=True):
        with phase("partials", a.label):
            p = a.partial(_selection.columns_for(spec, a, cols, be, masks), ctx, be)
            out.append(placed(a, p, id(a) in keep, hold))
    for k, folder in enumerate(spills or ()):
        if folder is not None:
            out[k] = _shards.spill(analyses[k], out[k], folder)
    return out


def _read_beside(be: Backend, read: Callable[[], Any], bind: Callable[[], Any]) -> tuple[Any, Any]:
    """``(read(), bind())``, ``read`` on a thread of its own (on this thread's device, in a copy of
    its context variables) while this thread runs ``bind``: a device task's load (decode on its
    loading threads, copies on their streams) overlaps its analyses' binds (side tables read and
    sorted on the host).  An error in ``bind`` waits for the read to end, then is raised."""
    device = be.xp.cuda.Device().id
    ctx = contextvars.copy_context()

    def on_device() -> Any:
        with be.xp.cuda.Device(device):
            return read()

    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="gpuclust-read") as pool:
        fut = pool.submit(ctx.run, on_device)
        bound = bind()
        with phase("read"):  # (the wait; the read's own time is its thread's)
            return fut.result(), bound


def kept_in_memory(
    plans: dict[str, tuple[list[int], list[_partition.PartitionSpec]]],
    spills: list[Any],
    be: Backend,
    analyses: Sequence[Analysis],
    room: _shards.DeviceRoom | None = None,
) -> list[Any]:
    """On a device backend, the spill targets with a table of one partition replaced by
    :class:`gpuclust.engine.shards.KeptKeys`: nothing merges that partition's keyed partials, so
    they stay in memory for the shards instead of being written to files and read back; and those
    with a table of several partitions whose keyed partials are rows that fit in what is left of
    the run's ``room`` (:func:`gpuclust.engine.shards.rows_fit_on_device`: peak-prediction's), by
    one that keeps every partition's there."""
    if be.name == "cpu":
        return spills
    room = room if room is not None else _shards.DeviceRoom(be)
    out = list(spills)
    for idx, specs in plans.values():
        rows = sum(int(s.num_rows) for s in specs)
        for k in idx:
            if not isinstance(out[k], Path):
                continue
            if len(specs) == 1:
                out[k] = _shards.KeptKeys()
            elif _shards.rows_fit_on_device(analyses[k], rows, room):
                out[k] = _shards.KeptKeys(across=True)
    return out


def staying(
    plans: Iterable[tuple[list[int], Sequence[Any]]], ans: Sequence[Analysis], spills: Sequence[Any] | None = None
) -> set[int]:
    """The ids of the analyses whose partials stay in device memory until their finalize
    (``Analysis.device_partial``): their table is one partition (``plans``: the analyses by
    index and the partitions of each table), so nothing merges them, and they are not spilled to
    files (``spills``: the run's spill targets, ``None`` each where it has none, as in a study;
    kept whole, or their keyed partials kept for the shards, :class:`gpuclust.engine.shards.KeptKeys`),
    or keyed rows kept there in every partition of a table of several (``KeptKeys(across=True)``);
    or those :func:`merged_on_device`; or, in any number of partitions and for any analysis, their
    keyed partials are merged into device accumulators (a :class:`gpuclust.engine.shards.DenseKeys`
    on the device; the rest of each partial goes to the host).  For a device backend (its callers check)."""
    out = merged_on_device(plans, ans, spills)
    for idx, specs in plans:
        for k in idx:
            a, target = ans[k], None if spills is None else spills[k]
            if isinstance(target, _shards.DenseKeys) and target.on_device:
                out.add(id(a))
            elif a.device_partial and len(specs) == 1 and (target is None or isinstance(target, _shards.KeptKeys)):
                out.add(id(a))
            elif isinstance(target, _shards.KeptKeys) and target.across:
                out.add(id(a))
    return out


def merged_on_device(
    plans: Iterable[tuple[list[int], Sequence[Any]]], ans: Sequence[Analysis], spills: Sequence[Any] | None
) -> set[int]:
    """The ids of the analyses whose partials a merge tree merges in device memory: in a table of
    several partitions, with nothing spilled (``spills`` given, ``None`` for the analysis), and
    every field merging on the device (``kinds.merges_on_device``: a per-task partial by a device
    sort-merge).  How much of them the tree holds there is bounded by a :class:`DeviceHold`; the
    merged partial of one whose finalize takes host arrays (not ``Analysis.device_partial``) is
    copied to the host once, for its finalize (:func:`gpuclust.engine.local.finalize_all`)."""
    if spills is None:
        return set()
    return {
        id(ans[k])
        for idx, specs in plans
        if len(specs) > 1
        for k in idx
        if spills[k] is None and ans[k].kinds.merges_on_device
    }


class DeviceHold:
    """How much a merge tree holds in device memory: the partials of the analyses ``ids`` (see
    :func:`merged_on_device`) are merged there while the device bytes of them that the tree holds
    and the partitions' partials on their way to it take stay within ``allowance`` (bytes, or a
    function giving them, asked once any is held).  An analysis whose partial does not fit beside
    them is moved to the host: that partial and its held ones are copied there, and its later
    ones as they are made, so its merges run on the host from then on (the same merges; on a GPU
    the host's sums may differ from the device's in the last bits, as cpu and gpu runs do).
    One hold serves a run's trees, one table after another: the merged partials of a finished
    tree stay on the device until finalize (:meth:`finish`), so they count against the trees
    after it.  ``moved``: the labels of the analyses moved; ``peak``: the most device bytes held
    after a merge (the current tree's and the finished trees' results)."""

    def __init__(self, ids: Iterable[int], allowance: int | Callable[[], int]):
        self.ids, self._allowance = set(ids), allowance
        self.moved: list[str] = []
        self.peak = 0
        self._host: set[int] = set()
        self._held = 0  # device bytes held after the last merge: the tree's and ``_kept``
        self._kept = 0  # device bytes of the finished trees' merged partials (kept until finalize)
        self._made = 0  # device bytes of the partials admitted and not yet added to the tree
        self._lock = threading.Lock()

    def allowance(self) -> int:
        if callable(self._allowance):
            self._allowance = self._allowance()
        return max(0, int(self._allowance))

    def summary(self) -> dict[str, Any]:
        """``allowance`` (bytes; ``None`` if never asked: nothing was held), ``peak`` and
        ``merged_on_host`` (:attr:`moved`)."""
        asked = not callable(self._allowance)
        return {"allowance": self.allowance() if asked else None, "peak": self.peak, "merged_on_host": list(self.moved)}

    def admit(self, a: Analysis, p: Any) -> Any:
        """``a``'s partial of a partition as it is made: left on the device where it fits, else
        copied to the host (and ``a`` moved there)."""
        if id(a) not in self.ids:
            return p
        with self._lock:
            if id(a) not in self._host:
                n = device_bytes([p])
                if not n or self._held + self._made + n <= self.allowance():
                    self._made += n
                    return p
                self._host.add(id(a))
                self.moved.append(a.label)
        return to_host(p)

    def add(self, tree: MergeTree, sub: Sequence[Analysis], item: list[Any]) -> None:
        """``tree.add(item)`` (a partition's partials of ``sub``), those of the analyses moved to
        the host copied there first, with what the tree holds of them; then what the tree holds
        on the device counted (the partials made next are admitted beside it)."""
        with self._lock:
            moved = {k for k, a in enumerate(sub) if id(a) in self._host}
            ours = [k for k, a in enumerate(sub) if id(a) in self.ids]
            self._made = max(0, self._made - device_bytes([item[k] for k in ours]))

        def host(item: list[Any]) -> list[Any]:
            return [to_host(p) if k in moved else p for k, p in enumerate(item)]

        if moved:
            tree.map_held(host)
        tree.add(host(item))
        kept = [k for k, a in enumerate(sub) if id(a) in self.ids and k not in moved]
        total = device_bytes([item[k] for item in tree.held() for k in kept])
        with self._lock:
            self._held = self._kept + total
            self.peak = max(self.peak, self._held)

    def finish(self, sub: Sequence[Analysis], merged: Sequence[Any] | None) -> None:
        """A tree of the analyses ``sub`` is done: its ``merged`` partials stay where they are
        until finalize, and those on the device count against the trees after it."""
        with self._lock:
            if merged is not None:
                ours = [p for a, p in zip(sub, merged, strict=True) if id(a) in self.ids and id(a) not in self._host]
                self._kept += device_bytes(ours)
            self._held = self._kept
            self.peak = max(self.peak, self._held)


def placed(a: Analysis, p: Any, stay: bool, hold: DeviceHold | None) -> Any:
    """``a``'s partial ``p`` as a partition task returns it: left in backend memory if ``stay``
    (:func:`staying`) and as far as ``hold`` admits it, else copied to the host."""
    if not stay:
        return to_host(p)
    return p if hold is None else hold.admit(a, p)


def device_hold(
    plans: Iterable[tuple[list[int], Sequence[Any]]],
    ans: Sequence[Analysis],
    spills: Sequence[Any] | None,
    be: Backend,
    allowance: int | None = None,
) -> DeviceHold | None:
    """The :class:`DeviceHold` of a device run's merge trees (``None`` where none merges on the
    device): ``allowance`` bytes, by default :data:`gpuclust.engine.memory.HOLD_SHARE` of the
    device's free memory when the trees first hold device arrays."""
    ids = merged_on_device(plans, ans, spills)
    if not ids:
        return None
    return DeviceHold(
        ids, (lambda: int(_memory.HOLD_SHARE * device_free_bytes(be))) if allowance is None else allowance
    )


def merge_lists(analyses: Sequence[Analysis], *lists: list[Any]) -> list[Any]:
    """Merge several per-partition partial lists analysis by analysis."""
    out = list(lists[0])
    for lst in lists[1:]:
        out = [
            _shards.merge_spilled(a, x, y)
            if isinstance(x, _shards.Spilled) or isinstance(y, _shards.Spilled)
            else a.kinds.merge(x, y)
            for a, x, y in zip(analyses, out, lst, strict=False)
        ]
    return out


class MergeTree:
    """The dask path's merge tree (:func:`gpuclust.engine.dask.compute_merged`), fed one item at a
    time: the items (per-partition partial lists, in partition order) in groups of ``fan``, each
    group folded left to right by :func:`merge_lists`, the groups' results grouped the same way at
    the next level, until one is left.  So the local path merges exactly as dask does (the same
    sums, bit for bit), and partials keyed by what they hold (collections, machines: each bucket's
    own) cost O(n log n) to merge instead of the O(n x partitions) of one running fold; at most
    ``fan - 1`` results per level wait.

    >>> t = MergeTree(lambda a, b: f"({a}{b})", 2)
    >>> for x in "abcde":
    ...     t.add(x)
    >>> t.result()
    '(((ab)(cd))e)'
    """

    def __init__(self, merge: Any, fan: int):
        if fan < 2:
            raise ValueError("split_every must be >= 2")
        self._merge, self._fan = merge, fan
        self._levels: list[list[Any]] = []  # per level: [fold of its open group, items in it, a group passed up]

    def add(self, item: Any, level: int = 0) -> None:
        while True:
            if level == len(self._levels):
                self._levels.append([None, 0, False])
            lv = self._levels[level]
            lv[0] = item if lv[1] == 0 else self._merge(lv[0], item)
            lv[1] += 1
            if lv[1] < self._fan:
                return
            item, lv[0], lv[1], lv[2] = lv[0], None, 0, True  # a full group: one item of the next level
            level += 1

    def held(self) -> list[Any]:
        """The items the tree holds now (each level's fold of its open group)."""
        return [lv[0] for lv in self._levels if lv[1]]

    def map_held(self, f: Any) -> None:
        """Replace each held item by ``f(item)``."""
        for lv in self._levels:
            if lv[1]:
                lv[0] = f(lv[0])

    def result(self) -> Any:
        """The root (``None`` for no item): each level's open group closes and goes up as the
        next level's last item; a level that never passed a group up is the top."""
        item = None
        for k, lv in enumerate(self._levels):
            if item is not None:
                lv[0] = item if lv[1] == 0 else self._merge(lv[0], item)
                lv[1] += 1
            item = lv[0] if lv[1] else None
            if not lv[2] and k == len(self._levels) - 1:
                break
        return item


class Prefetch:
    """The local path's first partitions, read while the client computes the contexts.

    The contexts (capacities, the instance lookups of cell-usage and cpi: a read of
    instance_events, a sort, a hash table) are computed on one core before any partial can run;
    meanwhile the other threads read the first partition each (Arrow's reader holds no GIL), so
    that work is off the partition phase.  At most ``threads`` partitions are read ahead: the
    partitions in flight that the memory budget already counts (``auto_rows_of``).  Only on the
    cpu backend, with more than one thread, and when no analysis has a prerequisite pass (which
    runs its own partitions before the contexts are done)."""

    def __init__(self, pool: ThreadPoolExecutor, futures: dict[int, Any]):
        self._pool = pool
        self._futures = futures

    @classmethod
    def start(
        cls,
        plans: dict[str, tuple[list[int], list[_partition.PartitionSpec]]],
        ans: Sequence[Analysis],
        src: Any,
        be: Backend,
        threads: int,
    ) -> Prefetch | None:
        if be.name != "cpu" or threads < 2 or not plans or any(a.prerequisites(src) for a in ans):
            return None
        idx, specs = next(iter(plans.values()))  # merge_local runs the first table first
        ahead = specs[:threads]
        if len(specs) < 2 or not ahead:
            return None
        sub = [ans[k] for k in idx]
        pool = ThreadPoolExecutor(max_workers=len(ahead), thread_name_prefix="gpuclust-prefetch")
        futures = {id(sp): pool.submit(_reading.read_partition, sp, partition_columns(sp, sub)) for sp in ahead}
        return cls(pool, futures)

    def pop(self, spec: _partition.PartitionSpec) -> dict[str, Any] | None:
        """The partition ``spec`` as read ahead (once), else None."""
        f = self._futures.pop(id(spec), None)
        return None if f is None else f.result()

    def close(self) -> None:
        """Drop what was not used (an error before the partitions ran) and end the threads."""
        for f in self._futures.values():
            f.cancel()
        self._futures.clear()
        self._pool.shutdown(wait=True)
