"""The dask engine: one delayed partial per partition, a tree of merges, one finalize.

On a distributed scheduler the finalize is the last task of each table's tree, on a worker
(:mod:`gpuclust.engine.finish`): the client receives result tables (or, from
``gpuclust analyze --out``, handles on the files the workers wrote), not the merged partials.
On dask's threaded and synchronous schedulers the client finalizes, as the local path does.

Built only from public dask API (``dask.delayed``, ``dask.compute``, ``distributed.Client``);
never reaches into graph internals.  Contexts are wrapped in one delayed object so they are
shipped to each worker once, not embedded in every task.  Partials are host (NumPy) objects by the
time they leave a partition task (see :func:`gpuclust.analyses.base.to_host`), so they serialise
with pickle between processes and machines; on a device backend, those of the analyses whose
partials merge in device memory (:func:`gpuclust.engine.tasks.staying`) stay on the worker's
device instead, are merged there by the tree (dask-cuda moves them between workers, and to host
memory past its ``device_memory_limit``), and leave it as the finalized result.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator
from typing import Any

from gpuclust.engine.tasks import merge_lists, partition_partials

__all__ = [
    "FREE_PORT",
    "RMM_POOL",
    "compute_merged",
    "compute_tasks",
    "cuda_cluster_options",
    "local_workers",
    "open_scheduler",
    "workers_of",
]

#: The scheduler HTTP server's address for clusters gpuclust starts: any free port (see open_scheduler).
FREE_PORT = ":0"


#: Each ``LocalCUDACluster`` worker's RMM pool, as fractions of its GPU's memory: the pool it
#: starts with and the most it grows to.
RMM_POOL = (0.25, 0.9)


def cuda_cluster_options(rmm: bool | None = None) -> dict[str, Any]:
    """The ``dask_cuda.LocalCUDACluster`` options of ``scheduler="cuda"``: where the ``rmm``
    package is installed (``rmm``: whether it is; None: look), each worker allocates its device
    memory, CuPy's included, from an RMM pool (:data:`RMM_POOL`), so that partitions, partials and
    temporaries reuse pooled memory instead of calling ``cudaMalloc`` / ``cudaFree``; without it,
    CuPy's own pool.  Either way dask-cuda moves the device objects dask holds for a worker
    to host memory past 80% of its GPU (its ``device_memory_limit`` default).

    >>> cuda_cluster_options(rmm=True)["rmm_allocator_external_lib_list"], cuda_cluster_options(rmm=False)
    (['cupy'], {})
    """
    if rmm is None:
        try:  # (imported, not only found: a package whose libraries do not load counts as absent)
            import rmm as _rmm  # noqa: F401

            rmm = True
        except Exception:  # any failure to load it (a missing library, CUDA bindings of another version)
            rmm = False
    if not rmm:
        return {}
    start, most = RMM_POOL
    return {"rmm_pool_size": start, "rmm_maximum_pool_size": most, "rmm_allocator_external_lib_list": ["cupy"]}


def local_workers(scheduler: str) -> int:
    """The worker processes of the scheduler ``"local:N"`` (``"local"``: 2); a :class:`ValueError`
    saying what N must be when it is not a positive integer.

    >>> local_workers("local:4"), local_workers("local")
    (4, 2)
    >>> local_workers("local:abc")
    Traceback (most recent call last):
    ValueError: scheduler 'local:abc': N in local:N is the number of worker processes, an integer >= 1, not 'abc'
    """
    if scheduler == "local":
        return 2
    text = scheduler.split(":", 1)[1]
    n = int(text) if text.strip().isdigit() else 0
    if n < 1:
        raise ValueError(
            f"scheduler {scheduler!r}: N in local:N is the number of worker processes, an integer >= 1, not {text!r}"
        )
    return n


@contextlib.contextmanager
def open_scheduler(scheduler: Any, backend_name: str, memory_limit: int | None = None) -> Iterator[dict[str, Any]]:
    """Yield the keyword arguments for ``dask.compute`` that select ``scheduler``.

    ``memory_limit`` (bytes, the run's budget) is split equally across the workers of a
    ``local:N`` cluster as their dask ``memory_limit`` (spill to disk, pause, restart near it).

    Clusters this function creates (``local:N``, ``cuda``) and clients it opens (addresses) are
    closed on exit; a ``distributed.Client`` passed in is left open.
    """
    if isinstance(scheduler, str) and scheduler in ("threads", "sync", "synchronous", "single-threaded"):
        yield {"scheduler": scheduler}
        return
    import dask
    import distributed

    from gpuclust._memory import worker_environ

    if isinstance(scheduler, distributed.Client):
        yield {"scheduler": scheduler}
        return
    if not isinstance(scheduler, str):
        raise TypeError(f"unknown scheduler {scheduler!r}")
    if scheduler.startswith("local:") or scheduler == "local":
        n = local_workers(scheduler)
        if backend_name == "gpu":
            raise ValueError("scheduler 'local:N' runs CPU workers; use scheduler='cuda' with backend='gpu'")
        per_worker = "auto" if memory_limit is None else max(1, int(memory_limit) // n)
        # silence_logs: a worker's heartbeat can race the cluster's shutdown and log a traceback
        # ("Failed to communicate with scheduler during heartbeat") after the results are in; a
        # failing task still raises in the client, so nothing the user needs is hidden.
        # dashboard_address=":0": the scheduler's HTTP server on a free port.  With None it still
        # listens, on 8787; a second cluster (another run, another process) then finds the port
        # taken, and distributed retries on another port but leaves the failed socket open.
        # each worker process starts with one malloc arena, as the client has (gpuclust._memory);
        # the nannies read distributed's pre-spawn environment when the cluster makes them, and
        # put it in this process' environment too, where it is taken out again afterwards
        spawn_env = worker_environ()
        try:
            with (
                dask.config.set({f"distributed.nanny.pre-spawn-environ.{k}": v for k, v in spawn_env.items()}),
                distributed.LocalCluster(
                    n_workers=n,
                    threads_per_worker=1,
                    processes=True,
                    memory_limit=per_worker,
                    dashboard_address=FREE_PORT,
                    silence_logs=logging.CRITICAL,
                ) as cluster,
                distributed.Client(cluster) as client,
            ):
                yield {"scheduler": client}
        finally:
            for k in spawn_env:
                os.environ.pop(k, None)
        return
    if scheduler == "cuda":
        try:
            from dask_cuda import LocalCUDACluster
        except ImportError as e:
            raise RuntimeError(
                "scheduler 'cuda' needs dask-cuda (pip install 'gpuclust[gpu-cu12]' or '[gpu-cu13]', matching your CuPy)"
            ) from e
        with (
            LocalCUDACluster(dashboard_address=FREE_PORT, **cuda_cluster_options()) as cluster,
            distributed.Client(cluster) as client,
        ):
            yield {"scheduler": client}
        return
    if "://" in scheduler or ":" in scheduler:
        with distributed.Client(scheduler) as client:
            yield {"scheduler": client}
        return
    raise ValueError(f"unknown scheduler {scheduler!r}: use threads, sync, local:N, cuda, or an address")


def workers_of(scheduler: Any, threads: int) -> int:
    """Partitions a scheduler works on at once: its worker threads (a ``distributed.Client``),
    ``threads`` for dask's threaded scheduler, 1 for the synchronous one."""
    if isinstance(scheduler, str):
        return 1 if scheduler in ("sync", "synchronous", "single-threaded") else max(1, threads)
    try:
        return max(1, sum(scheduler.nthreads().values()))
    except Exception:  # not a distributed client: assume one at a time
        return 1


def _done_callback(keys: dict[Any, Any], on_done: Any) -> Any:
    """A dask local-scheduler callback calling ``on_done(spec)`` as each partition task finishes."""
    from dask.callbacks import Callback

    def posttask(key: Any, result: Any, dsk: Any, state: Any, worker_id: Any) -> None:
        spec = keys.get(key)
        if spec is not None:
            on_done(spec)

    return Callback(posttask=posttask)


def _partials(
    spec: Any, analyses: list[Any], ctxs: list[Any], backend_name: str, spills: list[Any], stay: list[bool]
) -> list[Any]:
    """A partition task: :func:`gpuclust.engine.tasks.partition_partials`, the partials of the
    analyses marked in ``stay`` left in the worker's backend memory (the analyses are this task's
    copies, so they are named by position, not by the client's ids)."""
    keep = {id(a) for a, s in zip(analyses, stay, strict=True) if s}
    return partition_partials(spec, analyses, ctxs, backend_name, spills, keep=keep)


def compute_tasks(fn: Any, args: list[tuple[Any, ...]], scheduler: Any) -> list[Any]:
    """``[fn(*a) for a in args]`` as dask tasks on ``scheduler`` (results in order)."""
    import dask

    with open_scheduler(scheduler, "cpu") as kw:
        return list(dask.compute(*[dask.delayed(fn, pure=False)(*a) for a in args], **kw))


def compute_merged(
    plans: dict[str, tuple[list[int], list[Any]]],
    analyses: list[Any],
    ctxs: list[Any],
    backend_name: str,
    scheduler: Any,
    split_every: int = 8,
    on_done: Any = None,
    spills: list[Any] | None = None,
    finalize: list[bool] | None = None,
    keys: list[str] | None = None,
    writer: Any = None,
    stay: list[bool] | None = None,
) -> list[Any]:
    """Build one merge tree per table and compute all of them in one ``dask.compute`` call.

    ``on_done(spec)`` is called for each partition: as its task finishes on dask's local
    schedulers (threads, sync), after the compute on distributed ones (the tasks run in other
    processes).  ``spills``: per analysis, where a parted analysis' partition tasks spill
    (:func:`gpuclust.engine.tasks.partition_partials`).

    ``finalize``: per analysis, whether its tree's last task finalizes it on the worker that
    merges the root (:func:`gpuclust.engine.finish.finalize_root`: the root's merge followed by
    ``finalize``; a distributed scheduler's run, so that the client receives result tables, not
    the merged partials); it comes back as a :class:`gpuclust.engine.finish.Finalized`.
    ``keys``: the analyses' result keys; ``writer``: called there on each finalized result,
    ``writer(key, analysis, tables) -> (tables, note)`` (:class:`gpuclust.report.writer.AnalysisWriter`:
    the tables written into the results folder, handles on the files returned).  ``stay``: per
    analysis, whether its partials stay in the backend's (device) memory, merged there
    (:func:`_partials`; default: all copied to the host).
    """
    import dask

    from gpuclust.engine.finish import finalize_root

    if split_every < 2:
        raise ValueError("split_every must be >= 2")
    roots, order = [], []
    task_spec: dict[Any, Any] = {}
    for idx, specs in plans.values():
        sub = [analyses[k] for k in idx]
        sub_d = dask.delayed(sub, traverse=False)
        ctx_d = dask.delayed([ctxs[k] for k in idx], traverse=False)
        sub_spills = [spills[k] if spills else None for k in idx]
        sub_stay = [bool(stay[k]) if stay else False for k in idx]
        level = [
            dask.delayed(_partials)(
                dask.delayed(spec, traverse=False), sub_d, ctx_d, backend_name, sub_spills, sub_stay
            )
            for spec in specs
        ]
        task_spec.update((d.key, spec) for d, spec in zip(level, specs, strict=True))
        if not level:
            level = [dask.delayed([a.empty() for a in sub], traverse=False)]
        fin = [bool(finalize[k]) for k in idx] if finalize else []
        while len(level) > (split_every if any(fin) else 1):  # the same groups as without the finalize
            level = [
                dask.delayed(merge_lists, pure=True)(sub_d, *level[i : i + split_every])
                for i in range(0, len(level), split_every)
            ]
        if any(fin):  # the root's merge and the finalize: one task
            sub_keys = [keys[k] if keys else str(k) for k in idx]
            level = [dask.delayed(finalize_root, pure=False)(sub_d, ctx_d, fin, sub_keys, writer, *level)]
        roots.append(level[0])
        order.append(idx)
    with open_scheduler(scheduler, backend_name) as kw:
        local = isinstance(kw["scheduler"], str)
        if on_done is not None and local:
            with _done_callback(task_spec, on_done):
                results = dask.compute(*roots, **kw)
        else:
            results = dask.compute(*roots, **kw)
    if on_done is not None and not local:
        for spec in task_spec.values():
            on_done(spec)
    merged: list[Any] = [None] * len(analyses)
    for idx, res in zip(order, results, strict=False):
        for k, p in zip(idx, res, strict=False):
            merged[k] = p
    return merged
