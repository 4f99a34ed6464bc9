"""Usage windows block by block: generated and formatted serially or in a pool of worker processes."""

from __future__ import annotations

from typing import Any

import numpy as np

from gpuclust.synth import usage as _usage
from gpuclust.synth.tables import format_usage

_KEEP = (
    "k",
    "u",
    "cpi",
    "mai",
    "cpi_base",
    "avg_cpu",
    "dur",
    "has_cpi",
    "cpi_outlier",
    "top",
    "machine",
    "cell",
    "start_time",
    "end_time",
    "collection_id",
    "instance_index",
    "max_cpu",
    "pct",
    "sample_rate",
    "n",
    "in_alloc",
    "req_cpu",
    "priority",
    "exp_ratio",
    "collection_type",
)
#: Columns the main process needs from a block (the rest stays in the worker).
_SUMMARY = (
    "start_time",
    "avg_cpu",
    "dur",
    "top",
    "priority",
    "collection_type",
    "coll",
    "has_cpi",
    "cpi_outlier",
    "cpi",
    "cpi_base",
    "machine",
    "exp_ratio",
    "req_cpu",
    "iv",
    "cell",
)
_FMT_ROWS = 65536
_WORKER_CTX: _usage.UsageContext | None = None


def _block_job(args: tuple) -> tuple[dict[str, Any], list[tuple[bytes, np.ndarray]]]:
    """Generate and format one block of grid cells (runs in a worker process when workers > 1)."""
    g0, g1, seed, keep = args
    ctx = _WORKER_CTX
    assert ctx is not None
    cols = _usage.generate_block(ctx, g0, g1, np.random.default_rng(seed))
    W = cols["start_time"].size
    chunks = [format_usage(cols, slice(r0, min(W, r0 + _FMT_ROWS))) for r0 in range(0, W, _FMT_ROWS)]
    names = set(_SUMMARY) | (set(_KEEP) if keep else set())
    small: dict[str, Any] = {k: cols[k] for k in names}
    small["cells"] = (g0, g1)
    return small, chunks


def _init_worker(ctx: _usage.UsageContext) -> None:
    global _WORKER_CTX
    _WORKER_CTX = ctx


def _usage_blocks(ctx, blocks, g_last, seeds, workers: int, keep: bool):
    """Yield (columns, formatted chunks) per block, in block order, serially or from a process pool."""
    global _WORKER_CTX
    jobs = [(g0, min(g0 + ctx.cfg.block_cells, g_last), seeds[i], keep) for i, g0 in enumerate(blocks)]
    _WORKER_CTX = ctx
    try:
        if workers <= 1 or len(jobs) <= 1:
            for j in jobs:
                yield _block_job(j)
            return
        import multiprocessing as mp
        from collections import deque

        # spawn (not fork: forking a process that has threads is unsafe and warns on Python >= 3.12);
        # the context is pickled once per worker by the initializer
        pool = mp.get_context("spawn").Pool(workers, initializer=_init_worker, initargs=(ctx,))
        try:
            pending: deque = deque()
            it = iter(jobs)
            for j in it:
                pending.append(pool.apply_async(_block_job, (j,)))
                if len(pending) > workers:
                    break
            while pending:
                res = pending.popleft().get()
                nxt = next(it, None)
                if nxt is not None:
                    pending.append(pool.apply_async(_block_job, (nxt,)))
                yield res
        finally:
            pool.terminate()
            pool.join()
    finally:
        _WORKER_CTX = None
