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
#: Most usage windows a block may hold (an upper bound counted from the intervals' grid cells):
#: a block's columns and formatted text are in memory at once, in its worker and in the main
#: process's queue, so a cell with many machines gets blocks of fewer grid cells than
#: ``SynthConfig.block_cells`` (the longest block) and synth's peak memory stays flat as the cell
#: grows.  Cells of up to ~250 machines keep ``block_cells``-long blocks (about 380 windows a
#: machine and hour), so their random streams, and shards, are those of fixed blocks.
BLOCK_WINDOWS = 3 << 15
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


def windows_per_cell(iv: dict[str, np.ndarray], g_first: int, g_last: int, t_end: int) -> np.ndarray:
    """Per grid cell ``g_first..g_last-1``, the intervals running in it: an upper bound of its usage
    windows (:func:`gpuclust.synth.usage.enumerate_windows` drops pieces under a second)."""
    lo = max(g_first * _usage.CELL_US, _usage.TRACE_OFFSET_US)
    hi = min(g_last * _usage.CELL_US, t_end)
    sel = (iv["start"] < hi) & (iv["end"] > lo)
    c0 = np.maximum(iv["start"][sel], lo) // _usage.CELL_US - g_first
    c1 = (np.minimum(iv["end"][sel], hi) - 1) // _usage.CELL_US - g_first
    diff = np.zeros(g_last - g_first + 1, np.int64)
    np.add.at(diff, c0, 1)
    np.add.at(diff, c1 + 1, -1)
    return np.cumsum(diff[:-1])


def block_starts(per_cell: np.ndarray, g_first: int, longest: int, limit: int = BLOCK_WINDOWS) -> list[int]:
    """The first grid cell of each block: at most ``longest`` cells, and no more windows than
    ``limit`` by ``per_cell`` (:func:`windows_per_cell`) unless one cell has more."""
    starts, i, n = [], 0, int(per_cell.shape[0])
    while i < n:
        starts.append(g_first + i)
        j, total = i + 1, int(per_cell[i])
        while j < n and j - i < longest and total + int(per_cell[j]) <= limit:
            total += int(per_cell[j])
            j += 1
        i = j
    return starts


def _usage_blocks(ctx, blocks, g_last, seeds, workers: int, keep: bool):
    """Yield (columns, formatted chunks) per block (``blocks``: their first grid cells), in block
    order, serially or from a process pool."""
    global _WORKER_CTX
    ends = [*blocks[1:], g_last]
    jobs = [(g0, ends[i], seeds[i], keep) for i, g0 in enumerate(blocks)]
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
