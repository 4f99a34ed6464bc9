"""Studies: a dataset opened once, its partitions resident in backend memory, any number of analyses.

A study runs many analyses over the same cell.  :func:`open_study` (``gpuclust.open``) returns a
:class:`Study`; :meth:`Study.persist` reads each partition of the streamed tables **once** into the
backend's memory (NumPy arrays on ``cpu``, device arrays on ``gpu``: decode on a few host threads,
host->device copies through pinned buffers on their own streams, see
:mod:`gpuclust.engine.staging`), and :meth:`Study.run` runs analyses over the resident columns
without reading Parquet again.  Side inputs are computed once per study as well: every
``source.read(table, columns)`` an analysis' context makes is cached, and so is each analysis'
context.

On the gpu backend the resident partitions are large (up to :data:`GPU_RUN_ROWS` rows: each is
filled by several smaller loads, so decode and copies still overlap), so an analysis runs as few,
large kernel launches and its host-side merges are few.  Results are those of
:func:`gpuclust.engine.run` over the same data (the cpu study with the same partitions gives the
same bits).

With ``scheduler=`` the resident partitions live on a dask cluster's workers (a
``LocalCUDACluster``: one per GPU), each loaded and kept by one worker
(:mod:`gpuclust.engine.study_workers`); the results are the same.
"""

from __future__ import annotations

import contextlib
import math
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np
import pyarrow as pa

from gpuclust._lazy import pandas as pd
from gpuclust._memory import tune_allocator
from gpuclust.analyses.base import Analysis
from gpuclust.backends import Backend, get_backend
from gpuclust.engine import partition as _partition
from gpuclust.engine.local import contexts, default_workers, finalize_all, host_threads, merge_local, resolve_analyses
from gpuclust.engine.memory import available_memory
from gpuclust.engine.staging import LOAD_THREADS, column_dtypes, load_partitions
from gpuclust.engine.study_workers import WorkerResidency, partials_of
from gpuclust.schema import SCHEMAS
from gpuclust.tables import convert

__all__ = ["GPU_RUN_ROWS", "Study", "StudyMemoryError", "open_study"]

#: Most rows in one resident partition on the gpu backend.
GPU_RUN_ROWS = 1 << 26
#: Share of free memory (device memory on gpu, available RAM on cpu) a persist may take.
MEMORY_SHARE = 0.8


class StudyMemoryError(MemoryError):
    """The columns asked for do not fit in the backend's free memory."""


class CachingSource:
    """A source whose ``read(table, columns)`` results are kept: contexts read side tables once
    per study.  Other attributes (``tier_map_name``, ``files``, ...) are the wrapped source's."""

    def __init__(self, source: Any):
        self.inner = source
        self._reads: dict[tuple[str, tuple[str, ...] | None], pa.Table] = {}

    def read(self, table: str, columns: Sequence[str] | None = None) -> pa.Table:
        key = (table, None if columns is None else tuple(columns))
        t = self._reads.get(key)
        if t is None:
            t = self._reads[key] = self.inner.read(table, columns)
        return t

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def _available_bytes(backend: Backend) -> int:
    if backend.name != "cpu":
        free, _ = backend.xp.cuda.Device().mem_info
        return int(free)
    avail = available_memory()
    return 1 << 62 if avail is None else avail  # not on Linux: no check


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
        own (dask's ``memory_limit``), not :class:`StudyMemoryError`.

    Attributes
    ----------
    partition_reads
        ``{table: partitions read from the source}``, every :meth:`persist` counted.
    load_seconds, loaded_bytes
        Wall time spent in :meth:`persist` and the bytes it made resident.
    last_run_seconds
        Where the wall time of the last :meth:`run` went: ``contexts`` (built on first use),
        ``partials`` (the analyses' partials over the resident partitions, their copy back to the
        host included, summed over the engine threads), ``merge`` (the merge phase's wall time
        less ``partials``: exact with one engine thread, as on the gpu backend), ``finalize`` and
        ``convert`` (to pandas).
    """

    def __init__(self, source: Any, *, backend: str | Backend = "cpu", partitions: int | str = "auto",
                 workers: int | None = None, load_threads: int = LOAD_THREADS, run_rows: int | None = None,
                 progress: Any = None, scheduler: Any = None):
        tune_allocator()
        self.source = CachingSource(_partition.as_source(source))
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
        self.loaded_bytes = 0
        self.last_run_seconds: dict[str, float] = {}
        self._groups: dict[str, list[list[_partition.PartitionSpec]]] = {}
        self._resident: dict[str, list[dict[str, Any]]] = {}
        self._remote_columns: dict[str, set[str]] = {}
        self._contexts: dict[Analysis, Any] = {}

    def _open_cluster(self, scheduler: Any) -> WorkerResidency:
        from gpuclust.engine.dask import open_scheduler

        kw = self._exit.enter_context(open_scheduler(scheduler, self.backend.name))
        client = kw["scheduler"]
        if isinstance(client, str):
            self._exit.close()
            raise ValueError(f"a study's scheduler keeps partitions on workers: use 'cuda', 'local:N', an address "
                             f"or a distributed.Client, not {scheduler!r}")
        return WorkerResidency(client)

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
            specs = _partition.plan_partitions(self.source.inner, table, self.partitions, multiple_of=multiple)
            cap = self.run_rows
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
        """Columns of ``table`` resident in backend memory (here or on the workers)."""
        if self._remote is not None:
            return sorted(self._remote_columns.get(table, ()))
        parts = self._resident.get(table)
        return sorted(parts[0]) if parts else []

    @property
    def resident_bytes(self) -> int:
        """Bytes of resident columns."""
        if self._remote is not None:
            return sum(sum(s.num_rows for g in self._groups[t] for s in g) * d.itemsize
                       for t, cols in self._remote_columns.items() for d in column_dtypes(t, sorted(cols)).values())
        return sum(int(a.nbytes) for parts in self._resident.values() for p in parts for a in p.values())

    def persist(self, columns: Sequence[str] | Mapping[str, Sequence[str]] | None = None) -> Study:
        """Make columns resident in backend memory, reading each partition once per call.

        ``columns``: a list of ``instance_usage`` columns, ``{table: columns}``, or ``None`` for
        every column any registered analysis (or a pass it runs first) streams from the tables they stream.  Columns
        already resident are not read again.  Raises :class:`StudyMemoryError` (and loads
        nothing) when they would not fit in the backend's free memory.
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
        for table, cols in want.items():
            schema = SCHEMAS[table]
            unknown = sorted(c for c in cols if c not in schema.names)
            if unknown:
                raise KeyError(f"{table} has no columns {unknown}")
            missing = [c for c in schema.names if c in cols and c not in self.resident_columns(table)]
            if missing:
                self._load(table, missing)
        return self

    def _load(self, table: str, columns: list[str]) -> None:
        groups = self._plan(table)
        rows = sum(s.num_rows for g in groups for s in g)
        need = rows * sum(d.itemsize for d in column_dtypes(table, columns).values())
        free = _available_bytes(self.backend) if self._remote is None else None  # workers: their own limits
        if free is not None and need > MEMORY_SHARE * free:
            raise StudyMemoryError(
                f"persisting {len(columns)} column(s) of {table} ({rows:,} rows) needs {need / 2**30:.2f} GiB of "
                f"{self.backend.name} memory; {free / 2**30:.2f} GiB are free. Persist fewer columns, or run "
                "the analyses without a study (gpuclust.run streams partitions instead of keeping them)")
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
            for dest, cols in zip(self._resident[table], loaded, strict=True):
                dest.update(cols)
        self.load_seconds += time.perf_counter() - t0
        self.loaded_bytes += need
        self.partition_reads[table] = self.partition_reads.get(table, 0) + sum(len(g) for g in groups)

    def release(self) -> None:
        """Drop every resident column and cached context (frees the memory)."""
        self._resident = {t: [{} for _ in g] for t, g in self._groups.items()}
        if self._remote is not None:
            self._remote.release()
            self._remote_columns.clear()
        self._contexts.clear()
        self.source = CachingSource(self.source.inner)

    # -- running --------------------------------------------------------------------------
    def _context(self, a: Analysis) -> Any:
        try:
            hash(a)
        except TypeError:  # options that are not hashable: computed each time
            return contexts([a], self.source, self.progress, run_pass=self._stream)[0]
        if a not in self._contexts:
            self._contexts[a] = contexts([a], self.source, self.progress, run_pass=self._stream)[0]
        return self._contexts[a]

    def run(self, analyses: Analysis | str | Iterable[Analysis | str]) -> dict[str, dict[str, pd.DataFrame]]:
        """Run analyses over the resident columns (persisting any column they need that is not
        resident yet); returns what :func:`gpuclust.engine.run` returns."""
        return self._run(resolve_analyses(analyses), self.progress)

    def _stream(self, analyses: list[Analysis]) -> dict[str, dict[str, pd.DataFrame]]:
        return self._run(resolve_analyses(analyses), None)

    def _run(self, ans: list[Analysis], progress: Any) -> dict[str, dict[str, pd.DataFrame]]:
        need: dict[str, set[str]] = {}
        for a in ans:
            need.setdefault(a.table, set()).update(a.columns, a.context_columns)
        self.persist({t: sorted(c) for t, c in need.items()})
        clock = time.perf_counter()
        ctxs = [self._context(a) for a in ans]
        seconds = {"contexts": time.perf_counter() - clock, "partials": 0.0}
        lock = threading.Lock()
        plans: dict[str, tuple[list[int], list[_partition.PartitionSpec]]] = {}
        for k, a in enumerate(ans):
            idx, _ = plans.setdefault(a.table, ([], [
                _partition.PartitionSpec(a.table, i, tuple(p for s in g for p in s.pieces))
                for i, g in enumerate(self._plan(a.table))]))
            idx.append(k)
        be, resident, remote = self.backend, self._resident, self._remote
        whole = self._whole_instance_plans(ans, plans)
        # partials nothing merges (their table is one resident partition) stay in device memory
        # for the analyses whose finalize takes them there (Analysis.device_partial)
        stay: set[int] = set()
        if remote is None and be.xp is not np:
            for idx, specs in (*plans.values(), *whole.values()):
                if len(specs) == 1:
                    stay.update(id(ans[k]) for k in idx if ans[k].device_partial)
        shipped = {} if remote is None else dict(zip(map(id, ctxs), remote.scatter(ctxs), strict=True))

        def partials(spec: _partition.PartitionSpec, sub: Sequence[Analysis], sub_ctxs: Sequence[Any], _spills: Any = None) -> list[Any]:
            start = time.perf_counter()
            if remote is not None:  # on the worker holding the partition
                out = remote.partials(spec.table, spec.index, sub, [shipped[id(c)] for c in sub_ctxs], be.name)
            else:  # index -1: the table's resident partitions as one (whole instances on a flat table)
                cols = resident[spec.table][spec.index] if spec.index >= 0 else list(resident[spec.table])
                out = partials_of(cols, sub, sub_ctxs, be, [id(a) in stay for a in sub])
            with lock:
                seconds["partials"] += time.perf_counter() - start
            return out

        clock = time.perf_counter()
        merged = merge_local(plans, ans, ctxs, be, self.workers, progress, partials)
        if whole:
            extra = merge_local(whole, ans, ctxs, be, 1, progress, partials)
            merged = [m if e is None else e for m, e in zip(merged, extra, strict=True)]
        seconds["merge"] = max(0.0, time.perf_counter() - clock - seconds["partials"])
        clock = time.perf_counter()
        done = finalize_all(ans, merged, ctxs, progress, threads=host_threads(be, self.workers))
        seconds["finalize"] = time.perf_counter() - clock
        clock = time.perf_counter()
        out = convert(done, "pandas")  # as engine.run's default
        seconds["convert"] = time.perf_counter() - clock
        self.last_run_seconds = seconds
        return out

    def _whole_instance_plans(self, ans: list[Analysis], plans: dict[str, tuple[list[int], list[Any]]]
                              ) -> dict[str, tuple[list[int], list[Any]]]:
        """Take the analyses that need whole instances (``Analysis.whole_instances``) out of
        ``plans`` where their table's resident partitions are not whole instance buckets: they
        run over the table's partitions joined into one (index -1)."""
        out = {}
        for table, (idx, specs) in list(plans.items()):
            need = [k for k in idx if ans[k].whole_instances]
            groups = self._plan(table)
            # buckets of the table's own key hold whole instances (whole collections for collection events)
            if not need or len(groups) <= 1 or all(s.grain is not None for g in groups for s in g):
                continue
            rest = [k for k in idx if k not in need]
            if rest:
                plans[table] = (rest, specs)
            else:
                del plans[table]
            out[table] = (need, [_partition.PartitionSpec(table, -1, tuple(p for sp in specs for p in sp.pieces))])
        return out

    def __repr__(self) -> str:
        res = {t: self.resident_columns(t) for t in self._resident}
        return (f"Study(backend={self.backend.name!r}, resident={ {t: len(c) for t, c in res.items()} }, "
                f"{self.resident_bytes / 2**20:.1f} MiB)")


def open_study(source: Any, *, backend: str | Backend = "cpu", **kw: Any) -> Study:
    """Open a dataset for a study: ``gpuclust.open(ds, backend="gpu").persist()`` then any
    number of ``.run(...)`` calls (see :class:`Study`).

    Examples
    --------
    >>> study = open_study("cell/ds", backend="gpu").persist()            # doctest: +SKIP
    >>> res = study.run(["cell-usage", "overcommit", "usage-distribution"])  # doctest: +SKIP
    """
    return Study(source, backend=backend, **kw)
