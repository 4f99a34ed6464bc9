"""Finalize at the merge tree's root, on the dask worker that merges it (a distributed scheduler).

The last task of each table's tree (:func:`gpuclust.engine.dask.compute_merged`) merges the
root's inputs and then finalizes each analysis whose partial is not spilled (a parted analysis'
shards are reduced by their own tasks, :mod:`gpuclust.engine.shards`), so the client receives
result tables, never the merged partials (usage-vs-request's per-task, job-usage's per-job keyed
partials grow with the data).  With a ``writer`` (:class:`gpuclust.report.writer.AnalysisWriter`:
``gpuclust analyze --out DIR``) the worker also writes the tables into the results folder being
built and returns handles on the files, so the client's memory does not grow with the result rows
either.  The merges are the tree's own (the same groups, in partition order), so the results are
those of the local run.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["Finalized", "finalize_root", "finalized", "finalized_or_on_host", "received"]


@dataclass
class Finalized:
    """An analysis' result finalized on a worker: its tables (handles on the written files with a
    writer) and what the writer returns for the client (``note``, see :func:`received`)."""

    tables: dict[str, Any]
    note: Any = None


def finalize_root(
    analyses: Sequence[Any],
    ctxs: Sequence[Any],
    finalize: Sequence[bool],
    keys: Sequence[str],
    writer: Any,
    *lists: list[Any],
) -> list[Any]:
    """The root of one table's merge tree: ``lists`` (its inputs, in partition order) merged as
    :func:`gpuclust.engine.tasks.merge_lists` does, then each analysis with ``finalize`` set
    finalized with its (unbound) context, as :class:`Finalized`; the others' merged partials as
    they are.  ``writer(key, analysis, tables) -> (tables, note)``: run on each result (``None``:
    the tables are returned)."""
    from gpuclust.engine.contexts import unbound
    from gpuclust.engine.tasks import merge_lists

    merged = merge_lists(analyses, *lists) if len(lists) > 1 else list(lists[0])
    out: list[Any] = []
    for j, a in enumerate(analyses):
        p, merged[j] = merged[j], None  # each merged partial dropped once finalized (the worker's peak)
        if not finalize[j]:
            out.append(p)
            continue
        tables = finalized(a, p, unbound(ctxs[j]))
        del p
        out.append(Finalized(tables) if writer is None else Finalized(*writer(keys[j], a, tables)))
    return out


def finalized(a: Any, p: Any, ctx: Any) -> dict[str, Any]:
    """``a.finalize`` of its merged partial ``p``: as it is for an analysis whose finalize takes
    device arrays (``Analysis.device_partial``), else copied to the host first (``p`` may have been
    merged in device memory, :func:`gpuclust.engine.tasks.merged_on_device`)."""
    from gpuclust.analyses.base import to_host

    return a.finalize(p if a.device_partial else to_host(p), ctx)


def finalized_or_on_host(a: Any, p: Any, ctx: Any, backend: Any, on_host: list[str]) -> dict[str, Any]:
    """:func:`finalized` on ``backend``'s device, and where that runs out of device memory, again on
    the host (:func:`gpuclust.backends.finalizing_on_host`; ``a``'s label added to ``on_host``):
    an out-of-core study's finalizes, some of which take device memory in proportion to the data
    (overcommit's intervals), while others work a shard or chunk at a time (peak-prediction's
    simulation: 50 s on the host against ~1 s on an H200 at 3·10^7 windows).  A finalize reads its
    merged partial without changing it, so the second try starts from the same one."""
    from gpuclust.backends import finalizing_on_host, release_pool

    try:
        return finalized(a, p, ctx)
    except MemoryError:  # (CuPy's OutOfMemoryError is one) the failed try's arrays freed on leaving
        pass
    release_pool(backend)
    on_host.append(a.label)
    with finalizing_on_host():
        return finalized(a, p, ctx)


def received(key: str, p: Any, writer: Any) -> dict[str, Any] | None:
    """On the client: the tables of result ``key`` if its partial ``p`` came back finalized (the
    writer told what its worker wrote, :meth:`gpuclust.report.writer.AnalysisWriter.keep`),
    else ``None`` (finalize it here)."""
    if not isinstance(p, Finalized):
        return None
    if p.note is not None and writer is not None:
        writer.keep(key, p.note)
    return p.tables
