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
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import pyarrow as pa

from gpuclust._lazy import pandas as pd
from gpuclust._memory import tune_allocator
from gpuclust.analyses.base import Analysis, to_host
from gpuclust.backends import Backend, get_backend
from gpuclust.engine import partition as _partition
from gpuclust.engine.local import contexts, default_workers, finalize_all, merge_local, resolve_analyses
from gpuclust.engine.staging import LOAD_THREADS, column_dtypes, load_partitions
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
    try:
        return int(os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
    except (ValueError, OSError, AttributeError):  # not on Linux: no check
        return 1 << 62


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

    Attributes
    ----------
    partition_reads
        ``{table: partitions read from the source}``, every :meth:`persist` counted.
    load_seconds, loaded_bytes
        Wall time spent in :meth:`persist` and the bytes it made resident.
    """

    def __init__(self, source: Any, *, backend: str | Backend = "cpu", partitions: int | str = "auto",
                 workers: int | None = None, load_threads: int = LOAD_THREADS, run_rows: int | None = None,
                 progress: Any = None):
        tune_allocator()
        self.source = CachingSource(_partition.as_source(source))
        self.backend = get_backend(backend)
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
        self._groups: dict[str, list[list[_partition.PartitionSpec]]] = {}
        self._resident: dict[str, list[dict[str, Any]]] = {}
        self._contexts: dict[Analysis, Any] = {}

    # -- residency ------------------------------------------------------------------------
    def _plan(self, table: str) -> list[list[_partition.PartitionSpec]]:
        groups = self._groups.get(table)
        if groups is None:
            multiple = self.workers if self.backend.name == "cpu" else 1
            specs = _partition.plan_partitions(self.source.inner, table, self.partitions, multiple_of=multiple)
            if self.run_rows <= 0:
                groups = [[s] for s in specs]
            else:
                groups, rows = [], self.run_rows
                for s in specs:
                    if not groups or rows + s.num_rows > self.run_rows:
                        groups.append([])
                        rows = 0
                    groups[-1].append(s)
                    rows += s.num_rows
            self._groups[table] = groups
            self._resident[table] = [{} for _ in groups]
        return groups

    def resident_columns(self, table: str) -> list[str]:
        """Columns of ``table`` resident in backend memory."""
        parts = self._resident.get(table)
        return sorted(parts[0]) if parts else []

    @property
    def resident_bytes(self) -> int:
        """Bytes of resident columns."""
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
        free = _available_bytes(self.backend)
        if need > MEMORY_SHARE * free:
            raise StudyMemoryError(
                f"persisting {len(columns)} column(s) of {table} ({rows:,} rows) needs {need / 2**30:.2f} GiB of "
                f"{self.backend.name} memory; {free / 2**30:.2f} GiB are free. Persist fewer columns, or run "
                "the analyses without a study (gpuclust.run streams partitions instead of keeping them)")
        prog = self.progress
        if prog is not None:
            prog.phase(f"persist: {len(columns)} column(s) of {table} on {self.backend.name}")
            prog.partitions(table, sum(len(g) for g in groups), rows)
        t0 = time.perf_counter()
        loaded = load_partitions(groups, columns, self.backend, threads=self.load_threads,
                                 on_done=None if prog is None else (lambda s: prog.partition_done(s.table, s.num_rows)))
        self.load_seconds += time.perf_counter() - t0
        self.loaded_bytes += need
        self.partition_reads[table] = self.partition_reads.get(table, 0) + sum(len(g) for g in groups)
        for dest, cols in zip(self._resident[table], loaded, strict=True):
            dest.update(cols)

    def release(self) -> None:
        """Drop every resident column and cached context (frees the memory)."""
        self._resident = {t: [{} for _ in g] for t, g in self._groups.items()}
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
        ctxs = [self._context(a) for a in ans]
        plans: dict[str, tuple[list[int], list[_partition.PartitionSpec]]] = {}
        for k, a in enumerate(ans):
            idx, _ = plans.setdefault(a.table, ([], [
                _partition.PartitionSpec(a.table, i, tuple(p for s in g for p in s.pieces))
                for i, g in enumerate(self._plan(a.table))]))
            idx.append(k)
        be, resident = self.backend, self._resident
        whole = self._whole_instance_plans(ans, plans)

        def partials(spec: _partition.PartitionSpec, sub: Sequence[Analysis], sub_ctxs: Sequence[Any], _spills: Any = None) -> list[Any]:
            if spec.index >= 0:
                cols = resident[spec.table][spec.index]
            else:  # the table's resident partitions as one (whole instances on a flat table)
                need = sorted({c for a in sub for c in a.columns})
                cols = {c: be.xp.concatenate([r[c] for r in resident[spec.table]]) for c in need}
            return [to_host(a.partial({c: cols[c] for c in a.columns}, ctx, be))
                    for a, ctx in zip(sub, sub_ctxs, strict=True)]

        merged = merge_local(plans, ans, ctxs, be, self.workers, progress, partials)
        if whole:
            extra = merge_local(whole, ans, ctxs, be, 1, progress, partials)
            merged = [m if e is None else e for m, e in zip(merged, extra, strict=True)]
        return convert(finalize_all(ans, merged, ctxs, progress), "pandas")  # as engine.run's default

    def _whole_instance_plans(self, ans: list[Analysis], plans: dict[str, tuple[list[int], list[Any]]]
                              ) -> dict[str, tuple[list[int], list[Any]]]:
        """Take the analyses that need whole instances (``Analysis.whole_instances``) out of
        ``plans`` where their table's resident partitions are not whole instance buckets: they
        run over the table's partitions joined into one (index -1)."""
        out = {}
        for table, (idx, specs) in list(plans.items()):
            need = [k for k in idx if ans[k].whole_instances]
            groups = self._plan(table)
            if not need or len(groups) <= 1 or all(s.grain == "instance" for g in groups for s in g):
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
