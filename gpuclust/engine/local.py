"""The engine's run: plan partitions, compute contexts once, one partial per partition, merge, finalize.

:func:`run` is the entry point for both the local path (``scheduler=None``: partitions are
processed in this process, by a pool of threads on the cpu backend: :func:`merge_local`) and dask
(any other ``scheduler``, see :mod:`gpuclust.engine.dask`).  Several analyses that stream the same
table share one read per partition.  The steps live beside it: the plan in
:mod:`gpuclust.engine.planning`, the contexts in :mod:`gpuclust.engine.contexts`, what a partition
task does and the merge tree in :mod:`gpuclust.engine.tasks`.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpuclust._memory import run_memory, tune_allocator
from gpuclust._parallel import client_threads, map_ordered, usable_cores
from gpuclust.analyses.base import Analysis, to_host
from gpuclust.backends import ENGINE_THREAD_PREFIX, Backend, device_free_bytes, get_backend
from gpuclust.engine import memory as _memory
from gpuclust.engine import partition as _partition
from gpuclust.engine import selection as _selection
from gpuclust.engine import shards as _shards
from gpuclust.engine.contexts import contexts, per_partition, resolve_analyses, result_keys, unbound
from gpuclust.engine.finish import finalized, finalized_or_on_host, received
from gpuclust.engine.key_passes import KeyPasses, finalize_order, key_passes
from gpuclust.engine.planning import auto_rows_of, device_rows_of, plan_tables
from gpuclust.engine.progress import PassProgress
from gpuclust.engine.staging import LOAD_THREADS
from gpuclust.engine.tasks import (
    DeviceHold,
    MergeTree,
    Prefetch,
    device_hold,
    kept_in_memory,
    merge_lists,
    partition_partials,
    staying,
)
from gpuclust.engine.timing import phase
from gpuclust.parted import PartedTable
from gpuclust.tables import check_kind, convert

__all__ = [
    "context_of",
    "default_workers",
    "finalize_all",
    "host_threads",
    "merge_local",
    "run",
]


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
    writer: Any = None,
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
        the partitions in flight fit half of it (on a device backend run locally, the device's
        free memory sizes them instead: :func:`gpuclust.engine.memory.device_partition_rows`),
        and a ``local:N`` cluster's workers get an
        equal share each as their dask ``memory_limit`` (spilling to disk near it).
    time_from, time_to
        A time selection ``[time_from, time_to)``: trace time (``"1d"``, ``"86400s"``, integer
        microseconds) or wall-clock in the cell's time zone (``"2019-05-02"``); see
        :mod:`gpuclust.engine.selection` and docs/analyses/README.md ("Time selections").  Only the
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
    writer
        On a distributed scheduler (``"local:N"``, ``"cuda"``, an address or a client), where
        each analysis is finalized on a worker: ``writer(key, analysis, tables) -> (tables,
        note)`` is called there on its result, and the client gets those tables
        (:class:`gpuclust.report.writer.AnalysisWriter`: the tables written into a results
        folder, handles on the files returned; ``writer.keep(key, note)`` on the client).
        Ignored on the other schedulers.

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
        on_device = scheduler is None and be.name != "cpu"  # (a dask run's arrays are on its workers)
        with run_memory(device_free_bytes(be) if on_device else limit, on_device):  # for analyses' own choices
            if scheduler is None:
                st = _Settings(
                    be,
                    partitions,
                    None,
                    cut_points,
                    split_every,
                    nthreads,
                    rows=(
                        (lambda pre, s: auto_rows_of(pre, limit, nthreads, s))
                        if be.name == "cpu"  # on a device: as large as its memory allows
                        else (lambda pre, s: device_rows_of(pre, device_free_bytes(be), nthreads, s))
                    ),
                    limit=limit,
                )
                res = _run(src, ans, st, progress, folders=folders)
            else:
                from gpuclust.engine.dask import open_scheduler, workers_of

                # one cluster for every pass of the run
                with open_scheduler(scheduler, be.name, memory_limit=limit) as kw:
                    in_flight = workers_of(kw["scheduler"], nthreads)
                    st = _Settings(
                        be,
                        partitions,
                        kw["scheduler"],
                        cut_points,
                        split_every,
                        nthreads,
                        label=scheduler if isinstance(scheduler, str) else type(scheduler).__name__,
                        rows=lambda pre, s: auto_rows_of(pre, limit, in_flight, s),
                        limit=limit,
                    )
                    res = _run(src, ans, st, progress, folders=folders, writer=writer)
            if folders.own:  # no parts_dir: parted tables come back as DataFrames
                res = {
                    key: {t: v.read() if isinstance(v, PartedTable) else v for t, v in tabs.items()}
                    for key, tabs in res.items()
                }
            return convert(res, tables)
    finally:
        folders.close()


@dataclass(frozen=True)
class _Settings:
    """What every pass of one run shares: backend, partitioning, scheduler, threads, memory budget."""

    be: Backend
    partitions: int | str
    scheduler: Any  # None: local
    cut_points: Any
    split_every: int
    nthreads: int
    label: str = ""
    rows: Any = None
    limit: int | None = None

    @property
    def client(self) -> int:
        """Threads for the client's own work (contexts, finalize)."""
        return host_threads(self.be, self.nthreads) if self.scheduler is None else default_workers("cpu")


def _run(
    src: Any,
    ans: list[Analysis],
    st: _Settings,
    progress: Any,
    folders: _shards.SpillFolders | None = None,
    writer: Any = None,
) -> dict[str, dict[str, Any]]:
    """:func:`run` with the scheduler open (``st.scheduler``, ``None``: local): prerequisite passes
    (recursively, with the same settings and selection), contexts, partials (parted analyses spill
    to ``folders``), merges, shards, finalize (on a distributed scheduler, of the analyses not
    spilled: on the workers, by each tree's last task, with ``writer``).  A prerequisite pass
    runs with ``folders=None``: in memory, as its results feed a context."""

    def run_pass(pre: list[Analysis]) -> dict[str, dict[str, Any]]:
        _, pre = _selection.attach(src, pre)  # the run's selection applies to its passes too
        # contexts read their passes' tables as finalized (DataFrames or Arrow tables: see
        # gpuclust.tables.column), so a pass does not import pandas for them
        return convert(_run(src, pre, st, None if progress is None else PassProgress(progress)), "native")

    plans = _plan(src, ans, st, progress)
    if st.scheduler is None:
        ctxs, spills, merged = _merge_here(src, ans, plans, st, progress, run_pass, folders)
    else:
        ctxs, spills = _contexts_and_spills(src, ans, plans, st, progress, run_pass, folders)
        merged = _merge_on_dask(plans, ans, ctxs, spills, st, progress, writer)
    return finalize_all(
        ans,
        merged,
        [unbound(c) for c in ctxs],
        progress,
        folders=folders,
        run_tasks=_shard_runner(st),
        spills=spills,
        threads=st.client,
        writer=writer,
    )


def _plan(
    src: Any, ans: list[Analysis], st: _Settings, progress: Any
) -> dict[str, tuple[list[int], list[_partition.PartitionSpec]]]:
    """The run's partitions per table, pruned to the row groups its time selection can hold."""
    multiple = st.nthreads if st.scheduler is None else 1
    base = _selection.unwrap(src)
    with phase("plan"):
        auto_rows = st.rows(ans, base) if st.rows is not None else None
        plans = plan_tables(
            base, ans, st.partitions, st.cut_points, multiple_of=multiple, auto_rows=auto_rows, memory_limit=st.limit
        )
        return _selection.prune_plans(
            src,
            plans,
            ans,
            st.partitions,
            st.cut_points,
            multiple,
            progress,  # row-group pushdown
            auto_rows=auto_rows,
        )


def _contexts_and_spills(
    src: Any,
    ans: list[Analysis],
    plans: dict[str, tuple[list[int], list[_partition.PartitionSpec]]],
    st: _Settings,
    progress: Any,
    run_pass: Any,
    folders: _shards.SpillFolders | None,
) -> tuple[list[Any], list[_shards.SpillTarget | None]]:
    """The analyses' contexts (prerequisite passes by ``run_pass``) and where each spills its partials."""
    ctxs = contexts(
        ans,
        src,
        progress,
        per_partition=per_partition(src, ans, plans),
        run_pass=run_pass,
        scratch=None if folders is None else folders.spill / "context",
        threads=st.client,
        at_once=st.be.name != "cpu",  # (a device run: the host's cores are the contexts' to use)
    )
    spills: list[_shards.SpillTarget | None] = [
        folders.for_analysis(k) if a.sharded and folders is not None else None for k, a in enumerate(ans)
    ]
    return ctxs, spills


def _merge_here(
    src: Any,
    ans: list[Analysis],
    plans: dict[str, tuple[list[int], list[_partition.PartitionSpec]]],
    st: _Settings,
    progress: Any,
    run_pass: Any,
    folders: _shards.SpillFolders | None,
) -> tuple[list[Any], list[_shards.SpillTarget | None], list[Any]]:
    """The local path's contexts, spills and merged partials (:func:`merge_local`); its first
    partitions are read while the contexts are computed (see :class:`~gpuclust.engine.tasks.Prefetch`)."""
    prefetch = Prefetch.start(plans, ans, src, st.be, st.nthreads)
    # a device backend's engine threads (one by default) leave the host's cores to decode their
    # partitions' row groups (as a study loads; one thread decoded a partition at a time before)
    load_threads = 1 if st.be.name == "cpu" else max(1, min(LOAD_THREADS, usable_cores() // st.nthreads))
    try:
        ctxs, spills = _contexts_and_spills(src, ans, plans, st, progress, run_pass, folders)
        # merged here in partition order: small keyed partials stay in memory; on a device, within
        # one room for all the run's analyses (rows kept, then dense sums, the largest first)
        room = None if st.be.name == "cpu" else _shards.DeviceRoom(st.be)
        bare = [unbound(c) for c in ctxs]
        spills = kept_in_memory(plans, spills, st.be, ans, room)  # (one partition on a device: nothing to merge)
        spills = _shards.dense_targets(ans, bare, spills, st.be, room)

        def merge(plans: dict[str, tuple[list[int], list[Any]]], spills: list[Any]) -> list[Any]:
            keep = set() if st.be.name == "cpu" else staying(plans.values(), ans, spills)
            hold = None if st.be.name == "cpu" else device_hold(plans.values(), ans, spills, st.be)
            return merge_local(
                plans,
                ans,
                ctxs,
                st.be,
                st.nthreads,
                progress,
                lambda spec, sub, sub_ctxs, sub_spills: partition_partials(
                    spec,
                    sub,
                    sub_ctxs,
                    st.be,
                    sub_spills,
                    host=None if prefetch is None else prefetch.pop(spec),
                    load_threads=load_threads,
                    keep=keep,
                    hold=hold,
                ),
                spills,
                st.split_every,
                hold,
            )

        def one_pass(k: int, target: Any) -> Any:  # analysis k alone, its keyed partials into target
            alone = {t: ([k], specs) for t, (idx, specs) in plans.items() if k in idx}
            return merge(alone, [target if j == k else s for j, s in enumerate(spills)])[k]

        spills = key_passes(ans, bare, spills, st.be, one_pass, room)
        # (an analysis in key passes: its keyed sums dropped here, added by its passes at its finalize)
        merged = merge(plans, [s.probe if isinstance(s, KeyPasses) else s for s in spills])
    finally:
        if prefetch is not None:
            prefetch.close()
    return ctxs, spills, merged


def _merge_on_dask(
    plans: dict[str, tuple[list[int], list[_partition.PartitionSpec]]],
    ans: list[Analysis],
    ctxs: list[Any],
    spills: list[_shards.SpillTarget | None],
    st: _Settings,
    progress: Any,
    writer: Any,
) -> list[Any]:
    """The merged partials computed on the dask scheduler (finalized on the workers where distributed)."""
    from gpuclust.engine.dask import compute_merged

    keep = set() if st.be.name == "cpu" else staying(plans.values(), ans, spills)
    specs = [sp for _, table_specs in plans.values() for sp in table_specs]
    if progress is not None:
        progress.phase(f"dask ({st.label}): {len(specs)} partition(s), {sum(sp.num_rows for sp in specs):,} rows")
        for _, table_specs in plans.values():
            _announce(progress, table_specs)
    return compute_merged(
        plans,
        ans,
        ctxs,
        st.be.name,
        st.scheduler,
        st.split_every,
        on_done=None if progress is None else (lambda sp: progress.partition_done(sp.table, sp.num_rows)),
        spills=spills,
        # a distributed scheduler's client receives result tables (see gpuclust.engine.finish)
        finalize=[not isinstance(st.scheduler, str) and s is None for s in spills],
        keys=result_keys(ans),
        writer=writer,
        stay=None if st.be.name == "cpu" else [id(a) in keep for a in ans],
    )


#: Shards a local run on a device reduces at once (each holds its keyed ranges and a chunk of
#: rows in device memory): one's rows are encoded and written as Parquet on the host while the
#: others' are computed (one at a time, the device waited for the writer and the writer for it).
DEVICE_SHARD_THREADS = 4


def _shard_runner(st: _Settings) -> Any:
    """How the run's shard reductions are run: on the engine threads (cpu backend), on
    :data:`DEVICE_SHARD_THREADS` of the client's threads (a device, whose engine runs one), or as
    dask tasks."""
    scheduler = st.scheduler
    threads = st.nthreads if st.be.name == "cpu" else min(st.client, DEVICE_SHARD_THREADS)
    if scheduler is None:

        def run_tasks(args: list[tuple[Any, ...]]) -> list[Any]:
            return list(_map_in_order(lambda t: _shards.reduce_shard(*t), args, threads))
    else:

        def run_tasks(args: list[tuple[Any, ...]]) -> list[Any]:
            from gpuclust.engine.dask import compute_tasks

            return compute_tasks(_shards.reduce_shard, args, scheduler)

    return run_tasks


def context_of(a: Analysis, source: Any, **run_kw: Any) -> Any:
    """The context ``a.partial`` runs with on ``source`` read whole (no per-partition binding), as
    :func:`run` computes it: prerequisite passes run by :func:`run` with ``run_kw``, side inputs
    bound on the client.  For calling an analysis' ``partial`` / ``finalize`` by hand."""
    src = _partition.as_source(source)
    return contexts([a], src, run_pass=lambda pre: run(src, pre, **run_kw))[0]


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
    hold: DeviceHold | None = None,
) -> list[Any]:
    """The local path: ``partials(spec, analyses, ctxs, spills)`` per partition on ``nthreads``
    threads, merged in partition order by dask's tree (:class:`MergeTree` of fan-in
    ``split_every``): bit-for-bit the result of one thread, and of the dask schedulers.  ``hold``
    bounds the device memory the trees hold in partials merged there."""
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

        with phase("stream"):
            for spec, parts in zip(specs, _map_in_order(run_partials, specs, nthreads), strict=True):
                with phase("merge"):
                    if hold is None:
                        tree.add(parts)
                    else:
                        hold.add(tree, sub, parts)
                if progress is not None:
                    progress.partition_done(spec.table, spec.num_rows)
            with phase("merge"):
                acc = tree.result()
        if hold is not None:
            hold.finish(sub, acc)
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
    writer: Any = None,
    on_host: tuple[Backend, list[str]] | None = None,
) -> dict[str, dict[str, Any]]:
    """``{result key: finalized tables}`` (see :func:`result_keys`); an analysis whose partials
    were spilled (``spills``) gets its shards reduced by ``run_tasks`` and its parted tables
    written under ``folders.root`` (:func:`gpuclust.engine.shards.finalize_parted`).  The others'
    ``finalize`` may use ``threads`` host threads (``client_threads``: the shards of an in-memory
    parted finalize, :func:`gpuclust.parted.finalize_in_memory`); with ``on_host`` (a device
    backend and a list) they run again on the host where they run out of its memory, their
    labels added to the list (:func:`gpuclust.engine.finish.finalized_or_on_host`).  One
    finalized on a worker (:class:`gpuclust.engine.finish.Finalized`) is taken as it is
    (``writer``: told what its worker wrote, see :func:`gpuclust.engine.finish.received`)."""
    keys = result_keys(ans)
    if progress is not None:
        progress.phase("finalize")
    out = {}
    n = min(len(ans), len(merged), len(ctxs))
    for k in finalize_order((spills or [None] * n)[:n]):  # (key passes last: the others' accumulators freed)
        key, a, p, ctx = keys[k], ans[k], merged[k], ctxs[k]
        folder = spills[k] if spills else None
        done = received(key, p, writer)
        if done is not None:
            out[key] = done
        elif isinstance(folder, KeyPasses) and folders is not None:
            with phase("finalize", a.label):
                out[key] = folder.finalize(a, ctx, p, folders.root / key, run_tasks, progress)
        elif folder is not None and folders is not None:
            with phase("finalize", a.label):
                out[key] = _shards.finalize_parted(a, ctx, p, folders.root / key, folder, run_tasks, progress)
        else:
            with client_threads(threads), phase("finalize", a.label):
                out[key] = finalized(a, p, ctx) if on_host is None else finalized_or_on_host(a, p, ctx, *on_host)
    if progress is not None:
        progress.finish()
    return {key: out[key] for key in keys if key in out}
