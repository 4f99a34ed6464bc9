"""Parted analyses in passes over key ranges: a device run whose dense keyed sums outgrow its memory.

A parted analysis whose keyed sums have a dense key range (``Keyed(dense=...)``: overcommit's
machines x tiers x buckets, cpi's, machine-utilization's) merges them on the local path into
dense accumulators where they fit (:func:`gpuclust.engine.shards.dense_target`); past that its
keyed partials are spilled to files, whose bytes grow with the windows, not with the result
(overcommit: ~78 B a window, about 210 GB for a 2019 cell, past the scratch disk of many GPU
nodes; its accumulators for a cell, ~52 GB, and cpi's, ~25 GB, past an H200's room for both).  On a device the engine runs
such an analysis in passes instead (:func:`key_passes`): each pass adds only the keys of one
range of the shard coordinate (machine codes) into dense accumulators in device memory (a
clipping :class:`~gpuclust.engine.shards.DenseKeys`), then reduces and writes that range's shards
(:func:`~gpuclust.engine.shards.reduce_shards`); the accumulators take that range's memory,
whatever the data's size, and nothing is spilled.  The run's own stream is the first pass where
the shards follow from the context; each further pass streams the analysis' partitions again.
Per key the values add in partition order, as in one pass: the same bits.  The price is a read
of the analysis' columns per further pass.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from gpuclust.analyses.base import Analysis
from gpuclust.backends import Backend
from gpuclust.engine import shards as _shards

__all__ = ["MAX_PASSES", "KeyPasses", "finalize_order", "key_passes"]

#: Most passes an analysis' keyed sums are split into (beyond: spilled to files).
MAX_PASSES = 64


class KeyPasses:
    """The spill target of a parted analysis run in passes: ``step`` coordinates a pass (or one
    shard's), ``probe``, the target of the run's own stream, and ``stream(target)``, which streams
    the analysis' partitions again with its keyed partials merged into ``target`` and returns the
    merged partial.  Where the shards follow from the context (``first``: the coordinates of the
    first pass) the run's own stream is the first pass (``probe`` takes its keys); else ``probe``
    takes none and the stream gives the merged rest, hence the shards.  ``passes``: the key
    ranges taken, ``streams``: the streams run again for them."""

    def __init__(
        self,
        a: Analysis,
        ctx: Any,
        step: int,
        xp: Any,
        stream: Callable[[Any], Any],
        first: tuple[int, int] | None = None,
    ):
        self.step, self.xp, self.stream, self.first = step, xp, stream, first
        dense = a.kinds.dense_keys(ctx) or {}
        self.probe = _shards.DenseKeys(a, _key_ranges(a, ctx, dense, *(first or (0, 0))), xp, clip=True)
        self.passes = self.streams = 0

    def finalize(
        self,
        a: Analysis,
        ctx: Any,
        merged: Any,
        out: Path,
        run_tasks: Callable[[list[tuple[Any, ...]]], list[Any]],
        progress: Any = None,
    ) -> dict[str, Any]:
        """``a``'s result from the run's stream (``merged``: its rest, so its shards, as in one
        pass; and the first pass' keys where ``first`` is set), then a pass per further run of
        consecutive shards of at most ``step`` coordinates (at least one shard): its
        accumulators, its partitions streamed, those shards reduced and written; then the parted
        tables.  Every pass merges the same rest, and the shards, their parts and extras are those
        of one pass: the same bits."""
        dense = a.kinds.dense_keys(ctx) or {}
        rest, shards, results = _shards.reduce_shards(
            a, ctx, merged, out, self.probe, run_tasks, progress, within=self.first or _NONE
        )
        runs = _runs(shards, self.step)
        if self.first is not None:
            if not runs or runs[0] != self.first:
                raise RuntimeError(f"{a.label}: its shards are not those of its context (internal error)")
            self.passes, runs = 1, runs[1:]
        self.probe.release()  # (the first pass' accumulators freed before the next's)
        for start, end in runs:
            target = _shards.DenseKeys(a, _key_ranges(a, ctx, dense, start, end), self.xp, clip=True)
            self.passes += 1
            self.streams += 1
            if progress is not None:
                progress.phase(f"{a.label}: keys pass {self.passes} (coordinates {start}-{end} of {shards[-1][1]})")
            again, cut, got = _shards.reduce_shards(
                a, ctx, self.stream(target), out, target, run_tasks, progress, within=(start, end)
            )
            if cut != shards:
                raise RuntimeError(f"{a.label}: a pass over its keys cut other shards (internal error)")
            results += got
            rest = again
            del target  # (this pass' accumulators freed before the next's)
        return _shards.parted_tables(a, ctx, rest, out, results)


#: An empty coordinate range: no shard lies within it.
_NONE = (1, 0)


def _runs(shards: list[tuple[int, int]], step: int) -> list[tuple[int, int]]:
    """Consecutive ``shards`` joined into ranges of at most ``step`` coordinates (a wider shard
    alone).

    >>> _runs([(0, 3), (3, 5), (5, 9), (9, 20), (20, 21)], 6)
    [(0, 5), (5, 9), (9, 20), (20, 21)]
    """
    out: list[tuple[int, int]] = []
    for lo, hi in shards:
        if out and hi - out[-1][0] <= step:
            out[-1] = (out[-1][0], hi)
        else:
            out.append((lo, hi))
    return out


def _key_ranges(
    a: Analysis, ctx: Any, dense: dict[str, tuple[int, int]], start: int, end: int
) -> dict[str, tuple[int, int]]:
    """Each dense keyed partial's keys of the coordinates ``[start, end)``, within its range."""
    out = {}
    for name, (first, last) in dense.items():
        lo, hi = a.kinds.key_range(ctx, name, start, end)
        lo = min(max(first, lo), last)
        out[name] = (lo, max(lo, min(last, hi)))
    return out


def key_passes(
    ans: Sequence[Analysis],
    ctxs: Sequence[Any],
    spills: Sequence[Any],
    be: Backend,
    stream: Callable[[int, Any], Any],
    room: _shards.DeviceRoom | None = None,
) -> list[Any]:
    """The local path's spill targets, a :class:`KeyPasses` in place of a spill folder where an
    analysis' dense keyed sums (:func:`~gpuclust.engine.shards.dense_plan`) take at most
    :data:`MAX_PASSES` times the device's room for them (``room``, the run's
    :class:`~gpuclust.engine.shards.DeviceRoom`: its ``total`` a pass; a device backend only).
    The run's own stream takes an analysis' first pass where what is left of the room holds it
    (all its keys, where one pass takes them: plain accumulators); its other passes stream its
    partitions again at its finalize, after the other analyses' (:func:`finalize_order`), whose
    accumulators are freed by then.  ``stream(k, target)``: analysis ``k``'s partitions streamed
    into ``target``."""
    out = list(spills)
    if be.name == "cpu":
        return out
    room = room if room is not None else _shards.DeviceRoom(be)
    for k, (a, ctx, target) in enumerate(zip(ans, ctxs, spills, strict=True)):
        plan = _shards.dense_plan(a, ctx, True) if isinstance(target, Path) else None
        coords = a.kinds.coordinates(ctx) if plan is not None else 0
        n = math.ceil(plan[1] / room.total) if plan is not None and room.total > 0 else MAX_PASSES + 1
        if plan is None or n > MAX_PASSES or n > coords:
            continue
        step = -(-coords // n)
        shards = a.kinds.context_shards(ctx, on_device=True)
        runs = None if shards is None else _runs(shards, step)
        first = None
        if runs is not None:  # the run's stream takes the first pass where what is left has it
            whole = len(runs) == 1  # one pass takes every key
            need = plan[1] if whole else _shards.dense_bytes(a, _key_ranges(a, ctx, plan[0], *runs[0]))
            took = room.take(need)
            if whole and (took or n > 1):  # n > 1: one shard wider than a pass, whose pass takes every
                if not took:  # key: the run's stream takes them, past the room (none left)
                    room.left = 0
                out[k] = _shards.DenseKeys(a, plan[0], be.xp)
                continue
            first = runs[0] if took and not whole else None
        out[k] = KeyPasses(a, ctx, step, be.xp, functools.partial(stream, k), first)
    return out


def finalize_order(spills: Sequence[Any]) -> list[int]:
    """The order a run finalizes its analyses in (by index): those in :class:`KeyPasses` last,
    so that their further passes find the other analyses' accumulators freed.

    >>> finalize_order([None, KeyPasses.__new__(KeyPasses), None])
    [0, 2, 1]
    """
    return sorted(range(len(spills)), key=lambda k: isinstance(spills[k], KeyPasses))
