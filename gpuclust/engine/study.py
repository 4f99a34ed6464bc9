"""Studies: a dataset opened once, its partitions resident in backend memory, any number of analyses.

A study runs many analyses over the same cell.  :func:`open_study` (``gpuclust.open``) returns a
:class:`Study`; :meth:`Study.persist` reads each partition of the streamed tables **once** into the
backend's memory (NumPy arrays on ``cpu``, device arrays on ``gpu``: decode on a few host threads,
host->device copies through pinned buffers on their own streams, see
:mod:`gpuclust.engine.staging`), and :meth:`Study.run` runs analyses over the resident columns
without reading Parquet again.  Side inputs are computed once per study as well: every
``source.read(table, columns)`` an analysis' context makes is cached, and so is each analysis'
context.

On the gpu backend the resident partitions are large (up to :data:`GPU_RUN_ROWS` rows, filled by
smaller loads whose decode and copies overlap): an analysis runs as few, large kernel launches.
Results are :func:`gpuclust.engine.run`'s over the same data (a cpu study's: the same bits).

Residency is a policy, not a promise: the study keeps partitions resident while its memory
budget allows (``memory_budget``; by default a share of the backend's free memory) and streams
the rest, each run reading those partitions again into backend memory one at a time (out of
core).  A streamed partition is the same partition a resident one would be, loaded the same way,
so the results are the same bits whatever the budget.

With ``scheduler=`` the resident partitions live on a dask cluster's workers (a ``LocalCUDACluster``:
one per GPU), each loaded and kept by one worker (:mod:`gpuclust.engine.study_workers`); same results.
"""

from __future__ import annotations

import contextlib
import math
import threading
import time
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from gpuclust._cache import forget
from gpuclust._lazy import pandas as pd
from gpuclust._memory import run_memory, tune_allocator
from gpuclust.analyses.base import Analysis
from gpuclust.backends import Backend, get_backend
from gpuclust.engine import memory as _memory
from gpuclust.engine import partition as _partition
from gpuclust.engine.contexts import contexts, resolve_analyses
from gpuclust.engine.local import default_workers, finalize_all, host_threads, merge_local
from gpuclust.engine.memory import DEVICE_PARTITION_ROWS, array_bytes, host_arrays, parse_size
from gpuclust.engine.shards import joined, spill, study_targets
from gpuclust.engine.staging import LOAD_THREADS, column_bytes, load_partitions
from gpuclust.engine.study_plans import (
    StudyMemoryError,
    available_bytes,
    budget_groups,
    check_whole_fits,
    columns_by_table,
    combined_hold,
    context_kept,
    dense_room,
    row_bytes_of,
    run_hold,
    run_in_groups,
    table_plans,
    whole_plans,
)
from gpuclust.engine.study_workers import WorkerResidency, partials_of
from gpuclust.engine.tasks import device_hold, staying
from gpuclust.schema import SCHEMAS
from gpuclust.tables import convert

__all__ = ["GPU_RUN_ROWS", "Study", "StudyMemoryError", "open_study"]

#: Most rows in one resident partition on the gpu backend.
GPU_RUN_ROWS = DEVICE_PARTITION_ROWS
#: Share of free memory (device memory on gpu, available RAM on cpu) a persist may take.
MEMORY_SHARE = 0.8


class Study:
    """A dataset opened for many analyses (see the module docstring).

    Parameters
    ----------
    source
        A dataset path, :class:`~gpuclust.dataset.Dataset`, dict of canonical Arrow tables or
        :class:`~gpuclust.engine.TableSource`.
    backend
        ``"cpu"``, ``"gpu"`` or ``"auto"``.
    partitions
        Partitions per streamed table, as in :func:`gpuclust.engine.run`; default ``"auto"``
        (about 4 Mi rows each) for loading.  On the gpu backend consecutive loaded partitions
        are joined into resident partitions of up to :data:`GPU_RUN_ROWS` rows.
    workers
        Threads that run partials on the cpu backend (default: one per usable core).
    load_threads
        Partitions decoded at once by :meth:`persist`.
    run_rows
        Join consecutive loaded partitions into resident partitions of up to this many rows
        (each analysis then runs once per resident partition).  Default: :data:`GPU_RUN_ROWS` on
        the gpu backend; none on the cpu backend (its partitions feed ``workers`` threads).
    progress
        A :class:`gpuclust.engine.progress.RunProgress` (or alike), told about loading and runs.
    scheduler
        ``None`` (default): the resident partitions are in this process' memory.  Else a dask
        cluster whose workers hold them (:mod:`gpuclust.engine.study_workers`): ``"cuda"`` (a
        ``LocalCUDACluster``, one worker per GPU, with ``backend="gpu"``), ``"local:N"`` (N CPU
        worker processes), an address or a ``distributed.Client`` (left open).  Each resident
        partition is loaded and kept by one worker, round robin; on the gpu backend the
        partitions are sized so that every worker gets one at least.  A cluster the study
        started is closed by :meth:`close` (or ``with``).  The memory check is the workers'
        own (dask's ``memory_limit``); the workers keep every partition.
    memory_budget
        Bytes of backend memory (``"8GiB"``, a number) the resident partitions may take, with
        room for the partitions streamed at once.  Partitions that do not fit are streamed: each
        run reads them again, one at a time per engine thread (out of core), with the same
        results.  Default: :data:`MEMORY_SHARE` of the backend's free memory when a column is
        first persisted (device memory on gpu, available RAM on cpu).  Given, on a device, it
        also covers the contexts' device copies and the partials' working memory
        (:meth:`_device_extra`): a run's analyses that do not fit in it at once run in groups,
        each streaming the data (:meth:`_budget_groups`); a run that streams finalizes on the host what
        runs out of device memory.

    Attributes
    ----------
    partition_reads
        ``{table: partitions read from the source}``, every :meth:`persist` and every streamed
        partition of a run counted.
    streamed_partitions
        ``{table: partitions streamed}`` (not resident: read again by each run).
    load_seconds, loaded_bytes
        Wall time spent in :meth:`persist` and the bytes it made resident.
    last_run_seconds
        Where the wall time of the last :meth:`run` went: ``contexts`` (built on first use),
        ``partials`` (the analyses' partials over the resident partitions, their copy back to the
        host included, summed over the engine threads; of it ``read``, loading the streamed
        partitions, whose bytes :attr:`streamed_bytes` counts), ``merge`` (the merge phase's wall time
        less ``partials``: exact with one engine thread, as on the gpu backend), ``finalize`` and
        ``convert`` (to pandas).
    last_run_hold
        On a device, what the last :meth:`run`'s merge trees held there (``DeviceHold``):
        ``allowance`` and ``peak`` bytes, the analyses ``merged_on_host`` for want of room, and
        ``dense``: ``{label: on the device}`` of those whose keyed sums went to dense accumulators.
    """

    def __init__(
        self,
        source: Any,
        *,
        backend: str | Backend = "cpu",
        partitions: int | str = "auto",
        workers: int | None = None,
        load_threads: int = LOAD_THREADS,
        run_rows: int | None = None,
        progress: Any = None,
        scheduler: Any = None,
        memory_budget: int | str | None = None,
    ):
        tune_allocator()
        self.source = _partition.CachingSource(_partition.as_source(source))
        self.backend = get_backend(backend)
        self._exit = contextlib.ExitStack()
        self._remote: WorkerResidency | None = None
        if scheduler is not None:
            self._remote = self._open_cluster(scheduler)
            workers = len(self._remote.workers) if workers is None else workers
        self.workers = default_workers(self.backend) if workers is None else int(workers)
        if self.workers < 1:
            raise ValueError(f"workers must be >= 1, got {workers!r}")
        self.partitions = partitions
        self.load_threads = load_threads
        self.run_rows = run_rows if run_rows is not None else (GPU_RUN_ROWS if self.backend.name != "cpu" else 0)
        self.progress = progress
        self.partition_reads: dict[str, int] = {}
        self.load_seconds = 0.0
        self.streamed_bytes = 0  # read by runs from streamed partitions, in all
        self.loaded_bytes = 0
        self.last_run_seconds: dict[str, float] = {}
        self.last_run_hold: dict[str, Any] = {}
        self._groups: dict[str, list[list[_partition.PartitionSpec]]] = {}
        self._resident: dict[str, list[dict[str, Any]]] = {}
        self._remote_columns: dict[str, set[str]] = {}
        self._contexts: dict[Analysis, Any] = {}
        self.memory_budget = parse_size(memory_budget)
        #: per table: the persisted columns (resident in the resident partitions, read on each run
        #: by the streamed ones) and the indices of the streamed partitions
        self._columns: dict[str, set[str]] = {}
        self._streamed: dict[str, set[int]] = {}

    def _open_cluster(self, scheduler: Any) -> WorkerResidency:
        from gpuclust.engine.dask import open_scheduler

        kw = self._exit.enter_context(open_scheduler(scheduler, self.backend.name))
        client = kw["scheduler"]
        if isinstance(client, str):
            self._exit.close()
            raise ValueError(
                f"a study's scheduler keeps partitions on workers: use 'cuda', 'local:N', an address "
                f"or a distributed.Client, not {scheduler!r}"
            )
        try:
            return WorkerResidency(client)
        except BaseException:
            self._exit.close()
            raise

    def close(self) -> None:
        """Release everything and close the cluster the study started (if any)."""
        self.release()
        self._exit.close()

    def __enter__(self) -> Study:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # -- residency ------------------------------------------------------------------------
    def _plan(self, table: str) -> list[list[_partition.PartitionSpec]]:
        groups = self._groups.get(table)
        if groups is None:
            multiple = self.workers if self.backend.name == "cpu" else 1
            auto_rows = _partition.AUTO_PARTITION_ROWS
            cap = self.run_rows
            if self.memory_budget is not None:  # partitions of at most a quarter of the budget
                fit = max(1, self.memory_budget // (4 * row_bytes_of(table)))
                auto_rows = min(auto_rows, fit)
                cap = min(cap, fit) if cap > 0 else 0
            specs = _partition.plan_partitions(
                self.source.inner, table, self.partitions, multiple_of=multiple, auto_rows=auto_rows
            )
            if self._remote is not None and cap > 0:  # a resident partition for every worker at least
                cap = min(cap, max(1, math.ceil(sum(s.num_rows for s in specs) / max(1, self.workers))))
            if cap <= 0:
                groups = [[s] for s in specs]
            else:
                groups, rows = [], cap
                for s in specs:
                    if not groups or rows + s.num_rows > cap:
                        groups.append([])
                        rows = 0
                    groups[-1].append(s)
                    rows += s.num_rows
            self._groups[table] = groups
            self._resident[table] = [{} for _ in groups]
        return groups

    def resident_columns(self, table: str) -> list[str]:
        """Columns of ``table`` persisted: in backend memory (here or on the workers), but in
        the partitions streamed for want of memory, which each run reads again."""
        if self._remote is not None:
            return sorted(self._remote_columns.get(table, ()))
        return sorted(self._columns.get(table, ()))

    @property
    def streamed_partitions(self) -> dict[str, int]:
        return {t: len(s) for t, s in self._streamed.items() if s}

    @property
    def resident_bytes(self) -> int:
        """Bytes of resident columns."""
        if self._remote is not None:
            rows = {t: sum(s.num_rows for g in self._groups[t] for s in g) for t in self._remote_columns}
            return sum(rows[t] * column_bytes(t, cols) for t, cols in self._remote_columns.items())
        return sum(int(a.nbytes) for parts in self._resident.values() for p in parts for a in p.values())

    def persist(self, columns: Sequence[str] | Mapping[str, Sequence[str]] | None = None) -> Study:
        """Make columns resident in backend memory, reading each partition once per call; returns
        this study.  Partitions beyond the memory budget are streamed instead (see :class:`Study`).

        Parameters
        ----------
        columns : list of str, {table: list of str} or None
            ``instance_usage`` columns, ``{table: columns}``, or ``None`` for every column any
            registered analysis (or a pass it runs first) streams.  Resident ones are not read again.

        Examples
        --------
        >>> study = open_study("cell/ds").persist(["start_time", "end_time", "avg_cpu"])  # doctest: +SKIP
        """
        from gpuclust.analyses.registry import create, names

        if columns is None:
            want: dict[str, set[str]] = {}
            for n in names():
                a = create(n)
                for b in (a, *a.prerequisites(self.source).values()):  # and the passes it runs first
                    want.setdefault(b.table, set()).update(b.columns, b.context_columns)
        elif isinstance(columns, Mapping):
            want = {t: set(c) for t, c in columns.items()}
        else:
            want = {"instance_usage": set(columns)}
        # the smaller tables first: under a memory budget the largest is the one streamed
        for table, cols in sorted(want.items(), key=lambda tc: sum(s.num_rows for g in self._plan(tc[0]) for s in g)):
            schema = SCHEMAS[table]
            unknown = sorted(c for c in cols if c not in schema.names)
            if unknown:
                raise KeyError(f"{table} has no columns {unknown}")
            missing = [c for c in schema.names if c in cols and c not in self.resident_columns(table)]
            if missing:
                self._load(table, missing)
        return self

    def _budget(self) -> int:
        """Bytes the resident partitions may take (:attr:`memory_budget`, else a share of the
        free memory now, resident bytes counted as free)."""
        if self.memory_budget is not None:
            return self.memory_budget
        return int(MEMORY_SHARE * available_bytes(self.backend)) + self.resident_bytes

    def _device_extra(self, ctxs: Sequence[Any] = (), ans: Sequence[Analysis] | None = None) -> int:
        """Device memory beside the partitions, counted against an explicit :attr:`memory_budget`
        on a device backend: the arrays of the contexts (``ctxs``, a run's, else every one kept),
        which the partials copy there (those of the analyses not in a run are dropped there,
        :meth:`_contexts_of`), the partials' transient arrays, ``Analysis.row_bytes`` a row of
        the largest partition (per engine thread; of the table whose analyses take most: the
        registered ones, or ``ans``), and :data:`~gpuclust.engine.memory.HOLD_SHARE` of the
        budget for the partials merged on the device (:meth:`_room`)."""
        if self.memory_budget is None or self._remote is not None or self.backend.xp is np:
            return 0
        at_once = self.workers if self.backend.name == "cpu" else 1
        rows = {t: max((sum(s.num_rows for s in g) for g in gs), default=0) for t, gs in self._groups.items()}
        if ans is None:
            per_row = {t: row_bytes_of(t, work=True) for t in rows}
        else:
            per_row = {t: max((int(a.row_bytes) for a in ans if a.table == t), default=0) for t in rows}
        work = max((at_once * n * per_row[t] for t, n in rows.items()), default=0)
        held = ctxs or list(self._contexts.values())  # (a run's own: the others' device copies are dropped)
        return work + array_bytes(held) + int(_memory.HOLD_SHARE * self.memory_budget)

    def _stream_beyond_budget(self, table: str, columns: list[str], extra: int = 0) -> None:
        """Mark the last resident partitions of ``table`` streamed (dropping what they hold)
        until the resident bytes, with ``columns`` added, room for the partitions streamed at
        once (one per engine thread) and ``extra`` bytes, fit in the budget."""
        groups = self._plan(table)
        streamed = self._streamed.setdefault(table, set())
        row_bytes = column_bytes(table, {*self._columns.get(table, ()), *columns})
        new_bytes = column_bytes(table, columns)
        rows = [sum(s.num_rows for s in g) for g in groups]
        resident = [i for i in range(len(groups)) if i not in streamed]
        total = self.resident_bytes + sum(rows[i] for i in resident) * new_bytes
        budget = self._budget()
        while resident and total + self._reserve(table, row_bytes) + extra > budget:
            i = resident.pop()
            streamed.add(i)
            total -= int(sum(int(a.nbytes) for a in self._resident[table][i].values())) + rows[i] * new_bytes
            self._resident[table][i] = {}

    def _reserve(self, table: str, row_bytes: int) -> int:
        """Bytes of the largest partitions of ``table`` streamed at once (one per engine thread on
        the host, one on a device), at ``row_bytes`` a row."""
        streamed, groups = self._streamed.get(table, set()), self._plan(table)
        at_once = self.workers if self.backend.name == "cpu" else 1
        return sum(sorted((sum(s.num_rows for s in groups[i]) for i in streamed), reverse=True)[:at_once]) * row_bytes

    def _room(self, ans: list[Analysis], ctxs: Sequence[Any]) -> int | None:
        """Device bytes a run may keep beside its partitions (merged partials, dense accumulators):
        with a :attr:`memory_budget`, :data:`~gpuclust.engine.memory.HOLD_SHARE` of it (kept out of
        the resident partitions' room, :meth:`_device_extra`) and what the resident partitions, the
        partitions streamed at once and the work and contexts of ``ans`` leave of the rest; else None."""
        if self.memory_budget is None:
            return None
        streamed = [t for t, v in self._streamed.items() if v]
        streaming = max((self._reserve(t, column_bytes(t, self._columns.get(t, ()))) for t in streamed), default=0)
        left = self.memory_budget - self.resident_bytes - streaming - self._device_extra(ctxs, ans)
        return int(_memory.HOLD_SHARE * self.memory_budget) + max(0, left)

    def _load(self, table: str, columns: list[str]) -> None:
        groups = self._plan(table)
        if self._remote is None:
            self._stream_beyond_budget(table, columns, self._device_extra())
        streamed = self._streamed.get(table, set())
        keep = [i for i in range(len(groups)) if i not in streamed]
        groups = [groups[i] for i in keep]
        rows = sum(s.num_rows for g in groups for s in g)
        need = rows * column_bytes(table, columns)
        self._columns.setdefault(table, set()).update(columns)
        if not groups:
            return
        prog = self.progress
        if prog is not None:
            prog.phase(f"persist: {len(columns)} column(s) of {table} on {self.backend.name}")
            prog.partitions(table, sum(len(g) for g in groups), rows)
        t0 = time.perf_counter()
        on_done = None if prog is None else (lambda s: prog.partition_done(s.table, s.num_rows))
        if self._remote is not None:
            self._remote.load(table, groups, columns, self.backend.name, self.load_threads, on_done)
            self._remote_columns.setdefault(table, set()).update(columns)
        else:
            loaded = load_partitions(groups, columns, self.backend, threads=self.load_threads, on_done=on_done)
            for i, cols in zip(keep, loaded, strict=True):
                self._resident[table][i].update(cols)
        self.load_seconds += time.perf_counter() - t0
        self.loaded_bytes += need
        self.partition_reads[table] = self.partition_reads.get(table, 0) + sum(len(g) for g in groups)

    def release(self) -> None:
        """Drop every resident column and cached context (frees the memory)."""
        self._resident = {t: [{} for _ in g] for t, g in self._groups.items()}
        self._columns.clear()
        self._streamed.clear()
        if self._remote is not None:
            self._remote.release()
            self._remote_columns.clear()
        self._contexts.clear()
        self.source = _partition.CachingSource(self.source.inner)

    # -- running --------------------------------------------------------------------------
    def _contexts_of(self, ans: list[Analysis]) -> list[Any]:
        """Each analysis' context, kept for the study's life where its options are hashable; those
        not kept yet computed together on the host's threads (several at once on a device)."""
        todo = [a for a in ans if not context_kept(self._contexts, a)]
        threads, device = host_threads(self.backend, self.workers), self.backend.name != "cpu"
        new = contexts(todo, self.source, self.progress, run_pass=self._stream, threads=threads, at_once=device)
        made = {id(a): c for a, c in zip(todo, new, strict=True)}
        for a, c in zip(todo, new, strict=True):
            with contextlib.suppress(TypeError):  # (options that are not hashable: computed each time)
                self._contexts[a] = c
        if self.memory_budget is not None and self._remote is None and self.backend.xp is not np:  # (device)
            forget(host_arrays([c for a, c in self._contexts.items() if a not in ans]))  # others' device copies
        return [made[id(a)] if id(a) in made else self._contexts[a] for a in ans]

    def context(self, analysis: Analysis | str) -> Any:
        """The context ``analysis`` runs with in this study: computed as a run computes it (its
        prerequisite passes over the resident columns) and kept, or the one a run kept."""
        return self._contexts_of(resolve_analyses(analysis))[0]

    def run(self, analyses: Analysis | str | Iterable[Analysis | str]) -> dict[str, dict[str, pd.DataFrame]]:
        """Run analyses over the resident columns (persisting any they need that is not resident
        yet); returns what :func:`gpuclust.engine.run` returns, ``{name: {table: DataFrame}}``.
        On a device the analyses' own choices (usage-distribution's ``auto``) keep within the
        device memory free now (the least of a cluster's workers') and :attr:`memory_budget`.

        Parameters
        ----------
        analyses : Analysis, str or iterable of them
            Registry names (``"cell-usage"``) or configured analyses (``create("cpi", by="tier")``).

        Examples
        --------
        >>> res = open_study("cell/ds").run(["cell-usage", "cpi"])["cell-usage"]["usage"]  # doctest: +SKIP
        """
        choices = run_memory(None)
        if self.backend.name != "cpu":
            remote = self._remote
            free = available_bytes(self.backend) if remote is None else remote.device_free(self.backend.name)
            choices = run_memory(min(free, self.memory_budget or free), device=True)
        with choices:
            ans = resolve_analyses(analyses)
            clock = time.perf_counter()
            groups = self._budget_groups(ans)  # (under a budget it computes the contexts: their time)
            seconds: Counter[str] = Counter({"contexts": time.perf_counter() - clock})
            holds: list[dict[str, Any]] = []

            def one(sub: list[Analysis]) -> dict[str, dict[str, pd.DataFrame]]:
                res = self._run(sub, self.progress)
                seconds.update(self.last_run_seconds)
                holds.append(self.last_run_hold)
                return res

            out = run_in_groups(ans, groups, one)
            self.last_run_seconds = dict(seconds)
            self.last_run_hold = holds[0] if len(holds) == 1 else combined_hold(holds)
            return out

    def _budget_groups(self, ans: list[Analysis]) -> list[list[int]]:
        """``ans`` (by index) in groups run one after another, each streaming its tables: on a
        device under a :attr:`memory_budget`, as many at once as their contexts and work fit in it
        beside the largest partition of their tables' columns; else all in one."""
        if self.memory_budget is None or self._remote is not None or self.backend.xp is np or len(ans) < 2:
            return [list(range(len(ans)))]
        ctxs, budget = self._contexts_of(ans), self.memory_budget

        def fits(idx: list[int]) -> bool:
            cols = columns_by_table([ans[k] for k in idx])
            rows = {t: max((sum(s.num_rows for s in g) for g in self._plan(t)), default=0) for t in cols}
            part = max(rows[t] * column_bytes(t, c) for t, c in cols.items())
            return part + self._device_extra([ctxs[k] for k in idx], [ans[k] for k in idx]) <= budget

        return budget_groups(len(ans), fits)

    def _stream(self, analyses: list[Analysis]) -> dict[str, dict[str, pd.DataFrame]]:
        return self._run(resolve_analyses(analyses), None)

    def _run(self, ans: list[Analysis], progress: Any) -> dict[str, dict[str, pd.DataFrame]]:
        need = columns_by_table(ans)
        self.persist({t: sorted(c) for t, c in need.items()})
        clock = time.perf_counter()
        ctxs = self._contexts_of(ans)
        seconds = {"contexts": time.perf_counter() - clock, "partials": 0.0, "read": 0.0}
        if beside := self._device_extra(ctxs):  # the contexts known now: streams more where they do not fit
            for table in sorted(need, key=lambda t: -sum(s.num_rows for g in self._plan(t) for s in g)):
                self._stream_beyond_budget(table, [], beside)
        plans = table_plans(ans, self._plan)
        be, resident, remote, lock = self.backend, self._resident, self._remote, threading.Lock()
        whole = whole_plans(ans, plans, self._plan)
        check_whole_fits(ans, whole, self._streamed, self._plan)
        streamed = {t: set(v) for t, v in self._streamed.items() if v}
        load_threads = max(1, self.load_threads // max(1, self.workers))
        # on a device: parted analyses' keyed sums into dense accumulators (on the device within the
        # room, else the host), the rest by merge trees, on the device within what is left (DeviceHold)
        here = remote is None and be.xp is not np  # a local run on a device
        room = self._room(ans, ctxs) if here else None
        at_most = dense_room(be, room) if here else None
        dense = study_targets(plans.values(), ans, ctxs, be, at_most or 0) if here else [None] * len(ans)
        stay = self._staying(ans, plans, whole, dense)
        kept = sum(d.nbytes for d in dense if d is not None and d.on_device)
        trees = [*plans.values(), *whole.values()]
        hold = device_hold(trees, ans, dense, be, None if room is None else max(0, room - kept)) if here else None
        shipped = {} if remote is None else dict(zip(map(id, ctxs), remote.scatter(ctxs), strict=True))

        def partials(
            spec: _partition.PartitionSpec, sub: Sequence[Analysis], sub_ctxs: Sequence[Any], _spills: Any = None
        ) -> list[Any]:
            start = time.perf_counter()
            if remote is not None:  # on the worker holding the partition
                out = remote.partials(spec.table, spec.index, sub, [shipped[id(c)] for c in sub_ctxs], be.name)
            elif spec.index in streamed.get(spec.table, ()):  # out of core: read again, dropped after
                group = self._plan(spec.table)[spec.index]
                loaded = load_partitions([group], sorted(need[spec.table]), be, threads=load_threads)[0]
                with lock:
                    self.partition_reads[spec.table] = self.partition_reads.get(spec.table, 0) + len(group)
                    self.streamed_bytes += sum(int(a.nbytes) for a in loaded.values())
                    seconds["read"] += time.perf_counter() - start
                out = partials_of(loaded, sub, sub_ctxs, be, [id(a) in stay for a in sub], hold)
                del loaded
            else:  # index -1: the table's resident partitions as one (whole instances on a flat table)
                cols = resident[spec.table][spec.index] if spec.index >= 0 else list(resident[spec.table])
                out = partials_of(cols, sub, sub_ctxs, be, [id(a) in stay for a in sub], hold)
            with lock:
                seconds["partials"] += time.perf_counter() - start
            return [
                p if t is None else spill(a, p, t)
                for a, p, t in zip(sub, out, _spills or [None] * len(sub), strict=True)
            ]

        clock = time.perf_counter()
        if remote is not None:  # reduced and finalized on the workers: result tables come back (sharded: partials)
            every: dict[Any, Any] = {**plans, **{("whole", t): v for t, v in whole.items()}}
            merged = remote.reduce_plans(every, ans, [shipped[id(c)] for c in ctxs], be.name, stay, progress)
            seconds["partials"] = time.perf_counter() - clock
        else:
            merged = merge_local(plans, ans, ctxs, be, self.workers, progress, partials, dense, hold=hold)
            merged = [joined(a, m) for a, m in zip(ans, merged, strict=True)]
            if whole:
                extra = merge_local(whole, ans, ctxs, be, 1, progress, partials, hold=hold)
                merged = [m if e is None else e for m, e in zip(merged, extra, strict=True)]
        seconds["merge"] = max(0.0, time.perf_counter() - clock - seconds["partials"])
        clock = time.perf_counter()
        # out of core on a device: a finalize whose memory grows with the data (overcommit's) runs
        # again on the host where it runs out of the device's
        on_host: list[str] = []
        fallback = (be, on_host) if here and any(streamed.get(a.table) for a in ans) else None
        done = finalize_all(ans, merged, ctxs, progress, threads=host_threads(be, self.workers), on_host=fallback)
        seconds["finalize"] = time.perf_counter() - clock
        clock = time.perf_counter()
        out = convert(done, "pandas")  # as engine.run's default
        seconds["convert"] = time.perf_counter() - clock
        self.last_run_seconds = seconds
        self.last_run_hold = run_hold(hold, on_host, ans, dense)
        return out

    def _staying(
        self, ans: list[Analysis], plans: dict[str, tuple[list[int], list[Any]]], whole: dict[Any, Any], dense: Any
    ) -> set[int]:
        """The ids of the analyses whose partials stay in device memory (:func:`staying`; a study
        spills nothing, ``dense``: its dense accumulators): partials nothing merges (their table is
        one partition) of the analyses whose finalize takes them there (``Analysis.device_partial``),
        those merged on the device, and those whose keyed sums are added to accumulators there.
        On the workers of a cluster, those finalized there (not ``sharded``), on the workers' devices."""
        if self.backend.xp is np:
            return set()
        out = staying((*plans.values(), *whole.values()), ans, dense)
        return out if self._remote is None else {id(a) for a in ans if id(a) in out and not a.sharded}

    def __repr__(self) -> str:
        res = {t: self.resident_columns(t) for t in self._resident}
        return (
            f"Study(backend={self.backend.name!r}, resident={ {t: len(c) for t, c in res.items()} }, "
            f"{self.resident_bytes / 2**20:.1f} MiB)"
        )


def open_study(source: Any, *, backend: str | Backend = "cpu", **kw: Any) -> Study:
    """Open a dataset for a study: ``gpuclust.open(ds, backend="gpu").persist()`` then any
    number of ``.run(...)`` calls (see :class:`Study`).

    Parameters
    ----------
    source : path, Dataset, dict of Arrow tables or TableSource
        The data, as :class:`Study` takes it (nothing is read until a persist or run).
    backend : {"cpu", "gpu", "auto"} or Backend
        Where the columns are kept and the analyses run.
    **kw
        The rest of :class:`Study`'s parameters (``memory_budget``, ``scheduler``, ...).

    Examples
    --------
    >>> study = open_study("cell/ds", backend="gpu").persist()            # doctest: +SKIP
    >>> res = study.run(["cell-usage", "overcommit", "usage-distribution"])  # doctest: +SKIP
    """
    return Study(source, backend=backend, **kw)
