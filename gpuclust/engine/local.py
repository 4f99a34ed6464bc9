"""The engine core: plan partitions, compute contexts once, one partial per partition, merge, finalize.

:func:`run` is the entry point for both the local path (``scheduler=None``: partitions are
processed in this process, by a pool of threads on the cpu backend) and dask (any other ``scheduler``, see
:mod:`gpuclust.engine.dask`).  Several analyses that stream the same table share one read per
partition.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

from gpuclust._memory import tune_allocator
from gpuclust._parallel import client_threads, map_ordered, usable_cores
from gpuclust.analyses.base import Analysis, to_host
from gpuclust.backends import ENGINE_THREAD_PREFIX, Backend, get_backend
from gpuclust.engine import memory as _memory
from gpuclust.engine import partition as _partition
from gpuclust.engine import selection as _selection
from gpuclust.engine import shards as _shards
from gpuclust.engine import staging as _staging
from gpuclust.engine.progress import PassProgress
from gpuclust.parted import PartedTable, map_large_arrays
from gpuclust.tables import check_kind, convert

__all__ = [
    "PerPartition",
    "bind_partition",
    "context_of",
    "contexts",
    "default_workers",
    "finalize_all",
    "host_threads",
    "merge_local",
    "partition_partials",
    "per_partition",
    "plan_tables",
    "auto_rows_of",
    "resolve_analyses",
    "result_keys",
    "run",
    "unbound",
]


def resolve_analyses(analyses: Analysis | str | Iterable[Analysis | str]) -> list[Analysis]:
    """Analysis instances from instances and/or registered names."""
    from gpuclust.analyses.registry import create

    if isinstance(analyses, (Analysis, str)):
        analyses = [analyses]
    out = [create(a) if isinstance(a, str) else a for a in analyses]
    for a in out:
        if not isinstance(a, Analysis):
            raise TypeError(f"not an analysis: {a!r}")
    if not out:
        raise ValueError("no analyses given")
    return out


def result_keys(analyses: Sequence[Analysis]) -> list[str]:
    """Result names: the analysis name, or its label when the same name appears twice."""
    names = [a.name for a in analyses]
    keys = [a.name if names.count(a.name) == 1 else a.label for a in analyses]
    if len(set(keys)) != len(keys):
        raise ValueError(f"the same analysis is requested twice: {keys}")
    return keys


@dataclass(frozen=True)
class PerPartition:
    """A context still to be bound to each partition's side inputs (a bucketed source: see
    :meth:`gpuclust.analyses.base.Analysis.bind`)."""

    ctx: Any


def unbound(ctx: Any) -> Any:
    """The client-side context (what ``finalize`` gets)."""
    return ctx.ctx if isinstance(ctx, PerPartition) else ctx


def bind_partition(a: Analysis, ctx: Any, spec: _partition.PartitionSpec) -> Any:
    """The context ``a.partial`` runs with on partition ``spec``."""
    if not isinstance(ctx, PerPartition):
        return ctx
    side = {t: _partition.side_table(None, t, spec) for t in a.side_inputs}
    return a.bind(ctx.ctx, side, spec.grain)


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
) -> list[Any]:
    """Read one partition once (the union of the analyses' columns) and return each analysis'
    partial, moved to host memory so it can be merged or shipped to another worker (``spills``:
    per analysis, the folder its keyed partials are spilled to, for one with parted tables; see
    :mod:`gpuclust.engine.shards`; ``host``: the partition already read by
    :func:`gpuclust.engine.partition.read_partition`, see :class:`_Prefetch`)."""
    be = get_backend(backend)
    tune_allocator()  # once per process (dask workers too); see gpuclust/_memory.py
    columns = partition_columns(spec, analyses)
    bound = [bind_partition(a, ctx, spec) for a, ctx in zip(analyses, ctxs, strict=True)]
    cols = None if host is not None else _partition.read_partition_device(spec, columns, be)  # cuDF (RAPIDS)
    if cols is None and host is None and be.name != "cpu":
        # decoded on the host and copied through pinned buffers on a copy stream, as a study loads
        # (a pageable copy runs at a fraction of the bus's rate: 8 against 55 GB/s on an H100 node)
        cols = _staging.load_partitions([[spec]], columns, be, threads=1)[0]
    if cols is None:
        if host is None:
            host = _partition.read_partition(spec, columns)
        cols = {c: be.asarray(v) for c, v in host.items()}
        del host
    masks: dict[str, Any] = {}  # selection (--from/--to): rows filtered per analysis rule, one mask per rule
    out = [
        to_host(a.partial(_selection.columns_for(spec, a, cols, be, masks), ctx, be))
        for a, ctx in zip(analyses, bound, strict=True)
    ]
    for k, folder in enumerate(spills or ()):
        if folder is not None:
            out[k] = _shards.spill(analyses[k], out[k], folder)
    return out


def default_workers(backend: Backend | str) -> int:
    """Threads for the local path: the usable CPU cores on the cpu backend, 1 on the gpu backend."""
    if get_backend(backend).name != "cpu":
        return 1
    return usable_cores()


def host_threads(be: Backend, nthreads: int) -> int:
    """Threads for the host work of a local run or study on ``be`` with ``nthreads`` engine
    threads (contexts, finalize): those threads on the cpu backend; on the gpu backend, whose
    engine runs one thread, the usable CPU cores."""
    return nthreads if be.name == "cpu" else default_workers("cpu")


def _map_in_order(fn: Any, items: Sequence[Any], threads: int) -> Iterable[Any]:
    """``map(fn, items)``, on ``threads`` engine threads when there is more than one item; results
    come back in item order (at most ``threads`` items are being worked on at once)."""
    return map_ordered(fn, items, threads, name=ENGINE_THREAD_PREFIX)


def merge_lists(analyses: Sequence[Analysis], *lists: list[Any]) -> list[Any]:
    """Merge several per-partition partial lists analysis by analysis."""
    out = list(lists[0])
    for lst in lists[1:]:
        out = [
            _shards.merge_spilled(a, x, y)
            if isinstance(x, _shards.Spilled) or isinstance(y, _shards.Spilled)
            else a.merge(x, y)
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


def run(
    source: Any,
    analyses: Analysis | str | Iterable[Analysis | str],
    *,
    backend: str | Backend = "cpu",
    partitions: int | str = 1,
    scheduler: Any = None,
    cut_points: dict[str, Sequence[int]] | Sequence[int] | None = None,
    split_every: int = 8,
    workers: int | None = None,
    progress: Any = None,
    memory_limit: int | str | None = None,
    time_from: Any = None,
    time_to: Any = None,
    parts_dir: str | Path | None = None,
    tables: str = "pandas",
) -> dict[str, dict[str, Any]]:
    """Run analyses over a dataset or in-memory tables.

    Parameters
    ----------
    source
        A dataset path, :class:`~gpuclust.dataset.Dataset`, dict of canonical Arrow tables, or
        :class:`~gpuclust.engine.TableSource`.
    analyses
        Analysis instances and/or registered names (see :func:`gpuclust.analyses.names`).
    backend
        ``"cpu"``, ``"gpu"`` or ``"auto"`` (resolved once, on the client).
    partitions
        Partitions per table (Parquet row groups / files, or row slices of in-memory tables);
        ``"auto"``: about 4 Mi rows per partition (1 Mi for analyses that prefer it: `auto_partition_rows`), fewer under the memory budget.
    scheduler
        ``None``: local, in this process.  ``"threads"`` / ``"sync"``: dask's local schedulers.
        ``"local:N"``: a ``distributed.LocalCluster`` of N worker processes.  ``"cuda"``: a
        ``dask_cuda.LocalCUDACluster`` (one worker per GPU).  ``"tcp://host:port"``: an existing
        scheduler.  A ``distributed.Client`` is used as is.
    cut_points
        Explicit global row offsets where partitions start (per table as a dict, or one list
        for every table); overrides ``partitions``.
    split_every
        Fan-in of the merge tree (dask's; the local path merges by the same tree).
    workers
        Local path only: threads that process partitions at the same time (NumPy and Arrow
        release the GIL in their heavy loops).  Default: the usable CPU cores on the cpu
        backend, 1 on the gpu backend.  Partials are merged in partition order whatever the
        thread count, so the result is bit-for-bit that of ``workers=1``.  With
        ``partitions="auto"`` the partition count is rounded up to a multiple of ``workers``.
    progress
        A :class:`gpuclust.engine.progress.RunProgress` (or anything with its methods) told
        about contexts, partitions done and finalize; ``None``: silent.
    memory_limit
        The run's memory budget (bytes, or a size like ``"8GiB"``; default: 75% of the machine's
        memory, see :mod:`gpuclust.engine.memory`): ``partitions="auto"`` sizes partitions so
        the partitions in flight fit half of it, and a ``local:N`` cluster's workers get an
        equal share each as their dask ``memory_limit`` (spilling to disk near it).
    time_from, time_to
        A time selection ``[time_from, time_to)``: trace time (``"1d"``, ``"86400s"``, integer
        microseconds) or wall-clock in the cell's time zone (``"2019-05-02"``); see
        :mod:`gpuclust.engine.selection` and docs/analyses.md ("Time selections").  Only the
        Parquet row groups that can hold selected rows are read.
    parts_dir
        Where the tables that grow with the data (an analysis' ``parted`` tables, e.g.
        overcommit's ``machine``) are written, as ``<result key>/<table>/part-NNNNN.parquet``
        by the shard tasks: they are then returned as :class:`gpuclust.parted.PartedTable`
        (read by batches).  ``None``: a temporary folder, and those tables are read back into
        DataFrames (memory grows with them: for small data).
    tables
        ``"pandas"``: every result table a DataFrame; ``"arrow"``: a ``pyarrow.Table``;
        ``"native"``: as each analysis' ``finalize`` built it (see :mod:`gpuclust.tables`).

    Returns
    -------
    dict
        ``{analysis name: {table name: pandas.DataFrame}}`` (``tables``: another kind; an analysis requested twice with
        different options is keyed by its label, e.g. ``cell-usage[mode=exact]``; parted tables
        with ``parts_dir``: :class:`gpuclust.parted.PartedTable`).

    Examples
    --------
    >>> import pyarrow as pa
    >>> from gpuclust.schema import SCHEMAS
    >>> me = pa.table({"time": [0, 0], "machine_id": [1, 2], "type": [1, 1], "switch_id": ["a", "b"],
    ...                "cap_cpu": [0.5, 0.5], "cap_mem": [0.25, 0.25], "platform_id": ["p", "p"],
    ...                "missing_data_reason": [None, None]}, schema=SCHEMAS["machine_events"])
    >>> run({"machine_events": me}, "machine-shapes")["machine-shapes"]["shapes"].to_dict("records")
    [{'cap_cpu': 0.5, 'cap_mem': 0.25, 'machines': 2}]
    """
    check_kind(tables)
    tune_allocator()
    src = _partition.as_source(source)
    ans = resolve_analyses(analyses)
    src, ans = _selection.attach(src, ans, time_from, time_to)  # --from/--to: no-op without a selection
    be = get_backend(backend)
    nthreads = default_workers(be) if workers is None else int(workers)
    if nthreads < 1:
        raise ValueError(f"workers must be >= 1, got {workers!r}")
    limit = _memory.parse_size(memory_limit) or _memory.default_limit()
    folders = _shards.SpillFolders(parts_dir)  # spills of parted analyses, large context arrays
    try:
        if scheduler is None:
            res = _run(
                src,
                ans,
                be,
                partitions,
                None,
                cut_points,
                split_every,
                nthreads,
                progress,
                rows=lambda pre, s: auto_rows_of(pre, limit, nthreads, s),
                folders=folders,
                limit=limit,
            )
        else:
            from gpuclust.engine.dask import open_scheduler, workers_of

            with open_scheduler(scheduler, be.name, memory_limit=limit) as kw:  # one cluster for every pass of the run
                in_flight = workers_of(kw["scheduler"], nthreads)
                res = _run(
                    src,
                    ans,
                    be,
                    partitions,
                    kw["scheduler"],
                    cut_points,
                    split_every,
                    nthreads,
                    progress,
                    label=scheduler if isinstance(scheduler, str) else type(scheduler).__name__,
                    rows=lambda pre, s: auto_rows_of(pre, limit, in_flight, s),
                    folders=folders,
                    limit=limit,
                )
        if folders.own:  # no parts_dir: parted tables come back as DataFrames
            res = {
                key: {t: v.read() if isinstance(v, PartedTable) else v for t, v in tabs.items()}
                for key, tabs in res.items()
            }
        return convert(res, tables)
    finally:
        folders.close()


def _run(
    src: Any,
    ans: list[Analysis],
    be: Backend,
    partitions: int | str,
    scheduler: Any,
    cut_points: Any,
    split_every: int,
    nthreads: int,
    progress: Any,
    label: str = "",
    rows: Any = None,
    folders: _shards.SpillFolders | None = None,
    limit: int | None = None,
) -> dict[str, dict[str, Any]]:
    """:func:`run` with the scheduler open (``None``: local): prerequisite passes (recursively,
    with the same settings and selection), contexts, partials (parted analyses spill to
    ``folders``), merges, shards, finalize.  A prerequisite pass runs with ``folders=None``: in
    memory, as its results feed a context."""

    def run_pass(pre: list[Analysis]) -> dict[str, dict[str, Any]]:
        _, pre = _selection.attach(src, pre)  # the run's selection applies to its passes too
        # contexts read their passes' tables as finalized (DataFrames or Arrow tables: see
        # gpuclust.tables.column), so a pass does not import pandas for them
        return convert(
            _run(
                src,
                pre,
                be,
                partitions,
                scheduler,
                cut_points,
                split_every,
                nthreads,
                None if progress is None else PassProgress(progress),
                label,
                rows,
                limit=limit,
            ),
            "native",
        )

    multiple = nthreads if scheduler is None else 1
    client = host_threads(be, nthreads) if scheduler is None else default_workers("cpu")  # the client's own work
    base = _selection.unwrap(src)
    auto_rows = rows(ans, base) if rows is not None else None
    plans = plan_tables(
        base, ans, partitions, cut_points, multiple_of=multiple, auto_rows=auto_rows, memory_limit=limit
    )
    plans = _selection.prune_plans(
        src,
        plans,
        ans,
        partitions,
        cut_points,
        multiple,
        progress,  # row-group pushdown
        auto_rows=auto_rows,
    )
    # the local path reads its first partitions while the contexts are computed (see _Prefetch)
    prefetch = _Prefetch.start(plans, ans, src, be, nthreads) if scheduler is None else None
    try:
        ctxs = contexts(
            ans,
            src,
            progress,
            per_partition=per_partition(src, ans, plans),
            run_pass=run_pass,
            scratch=None if folders is None else folders.spill / "context",
            threads=client,
        )
        spills: list[_shards.SpillTarget | None] = [
            folders.for_analysis(k) if a.sharded and folders is not None else None for k, a in enumerate(ans)
        ]
        if scheduler is None:  # merged here in partition order: small keyed partials stay in memory
            spills = [_shards.dense_target(a, unbound(c), f) for a, c, f in zip(ans, ctxs, spills, strict=True)]
        if scheduler is None:
            merged = merge_local(
                plans,
                ans,
                ctxs,
                be,
                nthreads,
                progress,
                lambda spec, sub, sub_ctxs, sub_spills: partition_partials(
                    spec, sub, sub_ctxs, be, sub_spills, host=None if prefetch is None else prefetch.pop(spec)
                ),
                spills,
                split_every,
            )
    finally:
        if prefetch is not None:
            prefetch.close()
    if scheduler is not None:
        from gpuclust.engine.dask import compute_merged

        specs = [sp for _, table_specs in plans.values() for sp in table_specs]
        if progress is not None:
            progress.phase(f"dask ({label}): {len(specs)} partition(s), {sum(sp.num_rows for sp in specs):,} rows")
            for _, table_specs in plans.values():
                _announce(progress, table_specs)
        merged = compute_merged(
            plans,
            ans,
            ctxs,
            be.name,
            scheduler,
            split_every,
            on_done=None if progress is None else (lambda sp: progress.partition_done(sp.table, sp.num_rows)),
            spills=spills,
        )
    if scheduler is None:

        def run_tasks(args: list[tuple[Any, ...]]) -> list[Any]:
            return list(_map_in_order(lambda t: _shards.reduce_shard(*t), args, nthreads))
    else:

        def run_tasks(args: list[tuple[Any, ...]]) -> list[Any]:
            from gpuclust.engine.dask import compute_tasks

            return compute_tasks(_shards.reduce_shard, args, scheduler)

    return finalize_all(
        ans,
        merged,
        [unbound(c) for c in ctxs],
        progress,
        folders=folders,
        run_tasks=run_tasks,
        spills=spills,
        threads=client,
    )


class _Prefetch:
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
    ) -> _Prefetch | None:
        if be.name != "cpu" or threads < 2 or not plans or any(a.prerequisites(src) for a in ans):
            return None
        idx, specs = next(iter(plans.values()))  # merge_local runs the first table first
        ahead = specs[:threads]
        if len(specs) < 2 or not ahead:
            return None
        sub = [ans[k] for k in idx]
        pool = ThreadPoolExecutor(max_workers=len(ahead), thread_name_prefix="gpuclust-prefetch")
        futures = {id(sp): pool.submit(_partition.read_partition, sp, partition_columns(sp, sub)) for sp in ahead}
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


def auto_rows_of(ans: Sequence[Analysis], memory_limit: int, in_flight: int, source: Any = None) -> dict[str, int]:
    """Rows per partition of each streamed table so that ``in_flight`` partitions fit the budget
    (:func:`gpuclust.engine.memory.partition_rows`; ``source``: what the analyses may size their
    preference by, see :meth:`gpuclust.analyses.base.Analysis.auto_rows`)."""
    by_table: dict[str, list[Analysis]] = {}
    for a in ans:
        by_table.setdefault(a.table, []).append(a)
    return {
        t: _memory.partition_rows(memory_limit, in_flight, sub, t, _partition.AUTO_PARTITION_ROWS, source)
        for t, sub in by_table.items()
    }


def context_of(a: Analysis, source: Any, **run_kw: Any) -> Any:
    """The context ``a.partial`` runs with on ``source`` read whole (no per-partition binding), as
    :func:`run` computes it: prerequisite passes run by :func:`run` with ``run_kw``, side inputs
    bound on the client.  For calling an analysis' ``partial`` / ``finalize`` by hand."""
    src = _partition.as_source(source)
    return contexts([a], src, run_pass=lambda pre: run(src, pre, **run_kw))[0]


def per_partition(
    src: Any, ans: Sequence[Analysis], plans: dict[str, tuple[list[int], list[_partition.PartitionSpec]]]
) -> set[int]:
    """Indices of the analyses bound in each partition task: those streaming a bucketed table
    whose side inputs are all co-partitioned with it."""
    out: set[int] = set()
    for table, (idx, specs) in plans.items():
        if not specs or specs[0].grain is None:
            continue
        out.update(k for k in idx if all(_partition.copartitioned(src, table, t) for t in ans[k].side_inputs))
    return out


def contexts(
    ans: Sequence[Analysis],
    src: Any,
    progress: Any = None,
    per_partition: set[int] | None = None,
    run_pass: Any = None,
    scratch: Path | None = None,
    threads: int = 1,
) -> list[Any]:
    """Each analysis' context, in order: its prerequisite passes run by ``run_pass(analyses) ->
    results`` (the caller's engine: same backend, partitions and scheduler), the context computed
    on the client from their results (with ``scratch``, a folder: its large arrays memory-mapped
    from files there, so they travel to tasks as file names, see
    :func:`gpuclust.parted.map_large_arrays`), then bound to its side inputs there (the whole
    tables), or wrapped in :class:`PerPartition` for the analyses in ``per_partition`` (bound in
    each partition task to its buckets).  The context and its binding may use ``threads``
    threads (:func:`gpuclust._parallel.client_threads`: e.g. the instance lookups sort their
    events a row group per thread)."""
    ctxs = []
    for k, a in enumerate(ans):
        pre = a.prerequisites(src)
        if pre:
            if run_pass is None:
                raise ValueError(f"{a.label} needs a pass over the data before its context; no engine given to run it")
            if progress is not None:
                progress.phase(f"pass: {', '.join(p.label for p in pre.values())} (for {a.label})")
            res = run_pass(list(pre.values()))
            keys = result_keys(list(pre.values()))
            if progress is not None:
                progress.phase(f"context: {a.label}")
            with client_threads(threads):  # an analysis with prerequisites takes their results as `prior`
                ctx = cast(Any, a).context(src, {name: res[key] for name, key in zip(pre, keys, strict=True)})
        else:
            if progress is not None:
                progress.phase(f"context: {a.label}")
            with client_threads(threads):
                ctx = a.context(src)
        if scratch is not None:
            ctx = map_large_arrays(ctx, scratch)
        if per_partition is not None and k in per_partition:
            ctxs.append(PerPartition(ctx))
        else:
            side = {t: _partition.side_table(src, t) for t in a.side_inputs}
            with client_threads(threads):
                ctxs.append(a.bind(ctx, side, None))
    return ctxs


def plan_tables(
    src: Any,
    ans: Sequence[Analysis],
    partitions: int | str,
    cut_points: dict[str, Sequence[int]] | Sequence[int] | None = None,
    multiple_of: int = 1,
    auto_rows: dict[str, int] | None = None,
    memory_limit: int | None = None,
) -> dict[str, tuple[list[int], list[_partition.PartitionSpec]]]:
    """``{table: (indices of the analyses streaming it, its partitions)}`` (``auto_rows``: the
    rows per partition of ``partitions="auto"`` per table, see :func:`auto_rows_of`;
    ``memory_limit``: the budget a whole table in one partition must fit, for the analyses that
    need whole instances of a table not laid out by instance)."""
    by_table: dict[str, list[int]] = {}
    for k, a in enumerate(ans):
        by_table.setdefault(a.table, []).append(k)
    plans = {}
    for table, idx in by_table.items():
        cp = cut_points.get(table) if isinstance(cut_points, dict) else cut_points
        specs = _partition.plan_partitions(
            src,
            table,
            partitions,
            cp,
            multiple_of=multiple_of,
            auto_rows=(auto_rows or {}).get(table, _partition.AUTO_PARTITION_ROWS),
        )
        whole = [ans[k].label for k in idx if ans[k].whole_instances]
        if whole and memory_limit is not None:
            sub = [ans[k] for k in idx if ans[k].whole_instances]
            specs = _partition.whole_instance_plan(
                src,
                table,
                specs,
                whole,
                _memory.whole_table_rows(memory_limit, sub, table),
                _memory.row_bytes(sub, table),
                memory_limit,
            )
        elif whole:
            rows = (auto_rows or {}).get(table, _partition.AUTO_PARTITION_ROWS)
            specs = _partition.whole_instance_plan(src, table, specs, whole, rows * max(1, multiple_of))
        if specs and specs[0].grain is not None:
            side = sorted({t for k in idx for t in ans[k].side_inputs if _partition.copartitioned(src, table, t)})
            specs = _partition.with_side(src, specs, side)
        plans[table] = (idx, specs)
    return plans


def _announce(progress: Any, specs: Sequence[_partition.PartitionSpec]) -> None:
    progress.partitions(specs[0].table if specs else "", len(specs), sum(sp.num_rows for sp in specs))


def merge_local(
    plans: dict[str, tuple[list[int], list[_partition.PartitionSpec]]],
    ans: Sequence[Analysis],
    ctxs: Sequence[Any],
    be: Backend,
    nthreads: int,
    progress: Any,
    partials: Any,
    spills: Sequence[_shards.SpillTarget | None] | None = None,
    split_every: int = 8,
) -> list[Any]:
    """The local path: ``partials(spec, analyses, ctxs, spills)`` per partition on ``nthreads``
    threads, merged in partition order by dask's tree (:class:`MergeTree` of fan-in
    ``split_every``): bit-for-bit the result of one thread, and of the dask schedulers."""
    merged: list[Any] = [None] * len(ans)
    for idx, specs in plans.values():
        sub = [ans[k] for k in idx]
        tree = MergeTree(lambda x, y, sub=sub: merge_lists(sub, x, y), split_every)
        sub_ctxs = [ctxs[k] for k in idx]
        sub_spills = [spills[k] if spills else None for k in idx]
        if progress is not None:
            _announce(progress, specs)
        # threads no partition of this table can use (fewer partitions than threads: a flat table
        # that whole-instance analyses read as one) are lent to its partials (_parallel.threads)
        spare = max(1, nthreads // max(1, len(specs))) if be.name == "cpu" else 1

        def run_partials(
            spec: Any, sub: Any = sub, sub_ctxs: Any = sub_ctxs, sub_spills: Any = sub_spills, spare: int = spare
        ) -> Any:
            with client_threads(spare):
                return partials(spec, sub, sub_ctxs, sub_spills)

        for spec, parts in zip(specs, _map_in_order(run_partials, specs, nthreads), strict=True):
            tree.add(parts)
            if progress is not None:
                progress.partition_done(spec.table, spec.num_rows)
        acc = tree.result()
        if acc is None:
            acc = [to_host(a.empty(be)) for a in sub]
        for k, p in zip(idx, acc, strict=False):
            merged[k] = p
    return merged


def finalize_all(
    ans: Sequence[Analysis],
    merged: Sequence[Any],
    ctxs: Sequence[Any],
    progress: Any = None,
    folders: _shards.SpillFolders | None = None,
    run_tasks: Any = None,
    spills: Sequence[_shards.SpillTarget | None] | None = None,
    threads: int = 1,
) -> dict[str, dict[str, Any]]:
    """``{result key: finalized tables}`` (see :func:`result_keys`); an analysis whose partials
    were spilled (``spills``) gets its shards reduced by ``run_tasks`` and its parted tables
    written under ``folders.root`` (:func:`gpuclust.engine.shards.finalize_parted`).  The others'
    ``finalize`` may use ``threads`` host threads (``client_threads``: the shards of an in-memory
    parted finalize, :func:`gpuclust.parted.finalize_in_memory`)."""
    keys = result_keys(ans)
    if progress is not None:
        progress.phase("finalize")
    out = {}
    for k, (key, a, p, ctx) in enumerate(zip(keys, ans, merged, ctxs, strict=False)):
        folder = spills[k] if spills else None
        if folder is not None and folders is not None:
            out[key] = _shards.finalize_parted(a, ctx, p, folders.root / key, folder, run_tasks, progress)
        else:
            with client_threads(threads):
                out[key] = a.finalize(p, ctx)
    if progress is not None:
        progress.finish()
    return out
