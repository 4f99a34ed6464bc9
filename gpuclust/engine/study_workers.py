"""A study's resident partitions on the workers of a dask cluster (``scheduler=`` of
:class:`gpuclust.engine.study.Study`): a ``LocalCUDACluster`` (``"cuda"``: one worker per GPU, the
columns in device memory), ``"local:N"`` (CPU worker processes), an address or a
``distributed.Client``.

Each resident partition is loaded **by a task on one worker** (read once from Parquet there, by
:func:`gpuclust.engine.staging.load_partitions` on the worker's backend) and stays in that
worker's memory as the task's result; the client holds only its future.  Resident partitions go
to the workers round robin, and a run's partial task of a partition is pinned to the worker
holding it (left to itself, dask's scheduler was seen to run loads elsewhere and to copy
partitions between workers: twice the device memory); the contexts travel once per run,
scattered.  The workers merge the partials in the local path's tree (on a device backend, those
the in-process study keeps on the device stay in the worker's device memory) and finalize at its root
(:func:`gpuclust.engine.finish.finalize_root`, the task a distributed run's tree ends with): the
client receives result tables, not partials (but for the ``sharded`` analyses', which it
finalizes, as a run does), and the results are those of a local study with the same partitions.
Columns persisted later are loaded on the same worker and joined there.

Analyses that need whole instances on a flat table run over the partitions joined on one worker:
only the columns they read travel there, as copies (the local study joins them too).  A
partition a retiring worker handed to another runs where it now is; one that left the cluster
with its worker is gone, and the next run says so (``release()`` and ``persist()`` again).

On CPU workers this costs: a study of 4e6 windows on a ``local:2`` cluster of the 2-core VM took
1.8x the in-process study's time for all analyses at once (bench/results/study_cluster_s27.md:
serialised contexts and partials, worker processes beside the client on the same cores).  It is
for several GPUs (``scheduler="cuda"``) or machines.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from gpuclust.analyses.base import Analysis
from gpuclust.backends import device_free_bytes, get_backend
from gpuclust.engine import partition as _partition
from gpuclust.engine.local import _announce
from gpuclust.engine.staging import load_partitions
from gpuclust.engine.tasks import placed

#: How long a study waits for a cluster with no workers yet to get its first one.
WORKERS_WAIT_S = 60.0

__all__ = ["WorkerResidency", "partials_of"]


def partials_of(
    cols: Any,
    analyses: Sequence[Analysis],
    ctxs: Sequence[Any],
    backend: Any,
    keep: Sequence[bool] | None = None,
    hold: Any = None,
) -> list[Any]:
    """Each analysis' partial over resident columns, moved to host memory (but where ``keep``
    says to leave it in backend memory: see :attr:`Analysis.device_partial`; as far as ``hold``, a
    :class:`gpuclust.engine.tasks.DeviceHold`, admits those merged there).  ``cols``: one
    resident partition's ``{column: array}``, or a list of them, joined first (whole instances on a
    flat table: the partitions as one)."""
    if isinstance(cols, list):
        need = sorted({c for a in analyses for c in a.columns})
        cols = {c: backend.xp.concatenate([r[c] for r in cols]) for c in need}
    keep = keep or [False] * len(analyses)
    out = []
    for a, ctx, stay in zip(analyses, ctxs, keep, strict=True):
        p = a.partial({c: cols[c] for c in a.columns}, ctx, backend)
        out.append(placed(a, p, stay, hold))
    return out


def _load(
    group: Sequence[_partition.PartitionSpec], columns: Sequence[str], backend_name: str, threads: int
) -> dict[str, Any]:
    """On a worker: one resident partition's columns, read once into the worker's backend memory."""
    return load_partitions([group], columns, get_backend(backend_name), threads=threads)[0]


def _join(old: dict[str, Any], new: dict[str, Any]) -> dict[str, Any]:
    return {**old, **new}


def _select(cols: dict[str, Any], names: Sequence[str]) -> dict[str, Any]:
    return {c: cols[c] for c in names}


def _partials(
    cols: Any, analyses: Sequence[Analysis], ctxs: Sequence[Any], backend_name: str, stay: Sequence[bool] | None = None
) -> list[Any]:
    return partials_of(cols, analyses, ctxs, get_backend(backend_name), stay)


class WorkerResidency:
    """The futures of a study's resident partitions on a ``distributed.Client``'s workers."""

    def __init__(self, client: Any, wait_s: float = WORKERS_WAIT_S):
        self.client = client
        self.futures: dict[str, list[Any]] = {}
        if not self.workers:  # a cluster whose workers are still starting
            try:
                client.wait_for_workers(1, timeout=wait_s)
            except TimeoutError:
                raise ValueError(
                    f"the scheduler at {client.scheduler.address} has no workers after {wait_s:g} s"
                ) from None

    @property
    def workers(self) -> list[str]:
        """Worker addresses, sorted (the round robin's order).

        Asked of the scheduler each time (``Client.nthreads``): ``scheduler_info()`` answers from
        the client's cache, which its periodic refresh (no workers listed) may overwrite between
        the query and the read."""
        return sorted(self.client.nthreads())

    def worker_of(self, table: str, index: int) -> str:
        """The worker resident partition ``index`` is sent to (round robin)."""
        return self.workers[index % len(self.workers)]

    def load(
        self,
        table: str,
        groups: Sequence[Sequence[_partition.PartitionSpec]],
        columns: Sequence[str],
        backend_name: str,
        threads: int,
        on_done: Any = None,
    ) -> None:
        """Load ``columns`` of every group on its worker (joined there with the columns it holds)
        and wait for all of them; a failed load raises here."""
        import distributed

        old = self.futures.get(table)
        futs = []
        for gi, group in enumerate(groups):
            at = {"workers": [self.worker_of(table, gi)], "allow_other_workers": False, "pure": False}
            f = self.client.submit(_load, list(group), list(columns), backend_name, threads, **at)
            if old is not None:
                f = self.client.submit(_join, old[gi], f, **at)
            futs.append(f)
        index = {f.key: gi for gi, f in enumerate(futs)}
        for f in distributed.as_completed(futs):
            if f.status == "error":
                f.result()  # raises the worker's exception
            if on_done is not None:
                for spec in groups[index[f.key]]:
                    on_done(spec)
        self.futures[table] = futs  # the old futures are dropped, not cancelled: cancel would take the joins too

    def scatter(self, ctxs: Sequence[Any]) -> list[Any]:
        """Futures of the contexts (sent once per run, to the workers that need them)."""
        return self.client.scatter(list(ctxs), hash=False)

    def partials(
        self, table: str, index: int, analyses: Sequence[Analysis], ctxs: Sequence[Any], backend_name: str
    ) -> list[Any]:
        """The host partials of ``analyses`` over resident partition ``index`` of ``table``
        (``-1``: all of them as one), computed on the worker that holds it."""
        return self._partials_future(table, index, analyses, ctxs, backend_name).result()

    def reduce(
        self,
        table: str,
        indices: Sequence[int],
        analyses: Sequence[Analysis],
        ctxs: Sequence[Any],
        backend_name: str,
        split_every: int = 8,
        stay: Sequence[bool] | None = None,
    ) -> list[Any]:
        """The results of ``analyses`` over the resident partitions ``indices`` of ``table``: each
        partition's partials on the worker holding it, merged there by the engine's tree
        (:class:`gpuclust.engine.tasks.MergeTree`: groups of ``split_every`` in partition order,
        level by level, so the same bits as a local run), the root's merge and the ``finalize``
        of each analysis that is not :attr:`~gpuclust.analyses.base.Analysis.sharded` one task on
        a worker (:func:`gpuclust.engine.finish.finalize_root`, as a distributed run's tree ends):
        per analysis, a :class:`gpuclust.engine.finish.Finalized` (its tables), or a sharded
        one's merged partial (finalized on the client: overcommit's context holds events bound
        there), all that comes to the client.  ``stay``: per analysis, whether its partials stay in
        the worker's device memory, merged there by the tree (finalized there: not sharded)."""
        from gpuclust.engine.finish import finalize_root
        from gpuclust.engine.tasks import merge_lists

        level = [self._partials_future(table, i, analyses, ctxs, backend_name, stay) for i in indices]
        if not level:
            raise ValueError("no partitions to reduce")
        while len(level) > split_every:  # the root's merge is finalize_root's: the same groups
            level = [
                self.client.submit(merge_lists, list(analyses), *level[i : i + split_every], pure=False)
                for i in range(0, len(level), split_every)
            ]
        fin = [not a.sharded for a in analyses]  # as a run, whose sharded analyses spill and finalize on the client
        keys = [a.label for a in analyses]  # finalize_root's keys are for a writer; none here
        root = self.client.submit(finalize_root, list(analyses), list(ctxs), fin, keys, None, *level, pure=False)
        return root.result()

    def reduce_plans(
        self,
        plans: dict[Any, tuple[list[int], list[Any]]],
        analyses: Sequence[Analysis],
        ctxs: Sequence[Any],
        backend_name: str,
        stay: set[int],
        progress: Any = None,
    ) -> list[Any]:
        """Each plan's partials reduced and finalized on the workers holding its partitions
        (:meth:`reduce`; ``ctxs``: the analyses' contexts as scattered; ``stay``: the ids of the
        analyses whose partials stay in the workers' device memory); per analysis, its result as a
        worker finalized it (:class:`gpuclust.engine.finish.Finalized`, taken as it is by
        :func:`gpuclust.engine.local.finalize_all`), or a sharded analysis' merged partial."""
        merged: list[Any] = [None] * len(analyses)
        for idx, specs in plans.values():
            sub = [analyses[k] for k in idx]
            if progress is not None:
                _announce(progress, specs)
            acc = self.reduce(
                specs[0].table,
                [s.index for s in specs],
                sub,
                [ctxs[k] for k in idx],
                backend_name,
                stay=[id(a) in stay for a in sub],
            )
            for k, p in zip(idx, acc, strict=True):
                merged[k] = p
            if progress is not None:
                for s in specs:
                    progress.partition_done(s.table, s.num_rows)
        return merged

    def _partials_future(
        self,
        table: str,
        index: int,
        analyses: Sequence[Analysis],
        ctxs: Sequence[Any],
        backend_name: str,
        stay: Sequence[bool] | None = None,
    ) -> Any:
        parts = self.futures[table]
        at = {}
        for k in [index] if index >= 0 else range(len(parts)):
            held = self.client.who_has([parts[k]]).get(parts[k].key) or ()
            if not held:
                raise RuntimeError(
                    f"resident partition {k} of {table} left the cluster with its worker; "
                    "call release() and persist() again"
                )
            at[k] = {"workers": [held[0]], "allow_other_workers": False, "pure": False}
        if index >= 0:
            cols: Any = parts[index]
            where = at[index]
        else:  # whole instances: the partitions as one on one worker; only the columns needed travel
            need = sorted({c for a in analyses for c in a.columns})
            cols = [self.client.submit(_select, parts[k], need, **at[k]) for k in range(len(parts))]
            where = {"pure": False}
        return self.client.submit(_partials, cols, list(analyses), list(ctxs), backend_name, stay, **where)

    def device_free(self, backend_name: str) -> int:
        """The least memory any worker's device can still give (a tree's merged partial reaches
        one worker): the budget of a device study's own choices on the cluster."""
        return min(self.client.run(_device_free, backend_name).values())

    def release(self) -> None:
        for futs in self.futures.values():
            self.client.cancel(futs)
        self.futures.clear()


def _device_free(backend_name: str) -> int:
    """On a worker: what its device can still give (:func:`gpuclust.backends.device_free_bytes`)."""
    return device_free_bytes(get_backend(backend_name))
