"""The analyses of a run and their contexts.

Which analyses a run holds (:func:`resolve_analyses`) and the keys of their results
(:func:`result_keys`); each analysis' context, computed once on the client before any partition
runs (:func:`contexts`: its prerequisite passes first), and bound to its side inputs there or, for
a bucketed source, in each partition task (:class:`PerPartition`, :func:`bind_partition`).
"""

from __future__ import annotations

import contextvars
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

from gpuclust._parallel import client_threads, map_ordered, threads
from gpuclust.analyses.base import Analysis
from gpuclust.engine import partition as _partition
from gpuclust.engine import reading as _reading
from gpuclust.engine.timing import phase
from gpuclust.parted import map_large_arrays

__all__ = [
    "THREADS_PER_CONTEXT",
    "PerPartition",
    "bind_all",
    "bind_partition",
    "contexts",
    "per_partition",
    "resolve_analyses",
    "result_keys",
    "unbound",
]


#: Client threads each context has at least where a run computes several at once
#: (:func:`contexts`' ``at_once``: a device run, whose engine leaves the host's cores to spare).
THREADS_PER_CONTEXT = 4


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
    side = {t: _reading.side_table(None, t, spec) for t in a.side_inputs}
    return a.bind(ctx.ctx, side, spec.grain)


def bind_all(
    analyses: Sequence[Analysis], ctxs: Sequence[Any], spec: _partition.PartitionSpec, n: int = 0
) -> list[Any]:
    """Each analysis' context bound to partition ``spec`` (:func:`bind_partition`), with ``n``
    host threads (default :func:`gpuclust._parallel.threads`, what the engine lends the task).
    Where those are several :data:`THREADS_PER_CONTEXT` (a device run's partition task, whose
    engine thread leaves the host's cores to it) and several analyses bind, they bind several at a
    time, each on a thread of its own in a copy of this thread's context variables, as
    :func:`contexts` computes the contexts; the results are those of one at a time.  The device
    CLI's binds (every instance event of a one-partition table, read and sorted per analysis) took
    4.9 of its 17.4 s one after another on the H200 (2026-11-30, 3.05e7 windows)."""
    n = n or threads()
    todo = [k for k, c in enumerate(ctxs) if isinstance(c, PerPartition)]
    many = n // THREADS_PER_CONTEXT

    def one(k: int, n_threads: int) -> Any:
        with phase("contexts", analyses[k].label), client_threads(n_threads):
            return bind_partition(analyses[k], ctxs[k], spec)

    if many <= 1 or len(todo) <= 1:
        return [one(k, n) for k in range(len(analyses))]
    each = max(THREADS_PER_CONTEXT, n // len(todo))
    copies = {k: contextvars.copy_context() for k in todo}
    with phase("contexts"):  # (the threads' own phases are theirs, by analysis)
        done = dict(
            zip(todo, map_ordered(lambda k: copies[k].run(one, k, each), todo, many, name="gpuclust-bind"), strict=True)
        )
    return [done[k] if k in done else ctxs[k] for k in range(len(analyses))]


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
    at_once: bool = False,
) -> list[Any]:
    """Each analysis' context, in order: its prerequisite passes run by ``run_pass(analyses) ->
    results`` (the caller's engine: same backend, partitions and scheduler), the context computed
    on the client from their results (with ``scratch``, a folder: its large arrays memory-mapped
    from files there, so they travel to tasks as file names, see
    :func:`gpuclust.parted.map_large_arrays`), then bound to its side inputs there (the whole
    tables), or wrapped in :class:`PerPartition` for the analyses in ``per_partition`` (bound in
    each partition task to its buckets).  The context and its binding may use ``threads``
    threads (:func:`gpuclust._parallel.client_threads`: e.g. the instance lookups sort their
    events a row group per thread).  ``at_once``: the contexts of the analyses without
    prerequisite passes are computed several at a time, on threads of their own
    (:data:`THREADS_PER_CONTEXT` of ``threads`` each); those with passes after them, one at a
    time (their passes run the engine)."""
    many = threads // THREADS_PER_CONTEXT if at_once else 1
    free = [k for k, a in enumerate(ans) if not a.prerequisites(src)] if many > 1 else []

    def one(k: int, threads: int) -> Any:
        a = ans[k]
        with phase("contexts", a.label):  # a prerequisite pass's own phases apart
            pre = a.prerequisites(src)
            prior = None
            if pre:
                if run_pass is None:
                    raise ValueError(
                        f"{a.label} needs a pass over the data before its context; no engine given to run it"
                    )
                if progress is not None:
                    progress.phase(f"pass: {', '.join(p.label for p in pre.values())} (for {a.label})")
                res = run_pass(list(pre.values()))
                keys = result_keys(list(pre.values()))
                prior = {name: res[key] for name, key in zip(pre, keys, strict=True)}
            if progress is not None:
                progress.phase(f"context: {a.label}")
            with client_threads(threads):  # an analysis with prerequisites takes their results as `prior`
                ctx = a.context(src) if prior is None else cast(Any, a).context(src, prior)
            if scratch is not None:
                ctx = map_large_arrays(ctx, scratch)
            if per_partition is not None and k in per_partition:
                return PerPartition(ctx)
            side = {t: _reading.side_table(src, t) for t in a.side_inputs}
            with client_threads(threads):
                return a.bind(ctx, side, None)

    out: dict[int, Any] = {}
    if len(free) > 1:
        each = max(THREADS_PER_CONTEXT, threads // len(free))
        # each thread in a copy of this one's context variables (the run's memory, see gpuclust._memory)
        copies = {k: contextvars.copy_context() for k in free}
        with phase("contexts"):  # (the threads' own phases are theirs, by analysis)
            done = map_ordered(lambda k: copies[k].run(one, k, each), free, many, name="gpuclust-contexts")
            out.update(zip(free, done, strict=True))
    return [out[k] if k in out else one(k, threads) for k in range(len(ans))]
