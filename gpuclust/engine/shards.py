"""Parted results: spill keyed partials per partition, reduce them one shard at a time, write parts.

For an analysis with ``parted`` tables (:mod:`gpuclust.parted`, e.g. overcommit's machine x
bucket table) the engine never gathers the keyed partials or the parted rows on the client:

1. each partition task splits its partial (``Analysis.kinds``: its sharded ``Keyed`` fields): the
   keyed partials are saved as
   ``.npy`` files in the run's spill folder (:func:`spill`), only the small rest and the spill
   folder's path travel back and through the merge tree (:class:`Spilled`);
2. after the merge, one task per shard (``Analysis.shards``) memory-maps its key range of every
   partition's spill, merges them in partition order (into dense accumulators over the shard's
   key range: linear in the spills, whatever their number), finalizes the shard's rows
   (``Analysis.finalize_shard``) and writes them as ``<key>/<table>/part-NNNNN.parquet``
   (:func:`reduce_shard`); it returns the file name, row count and a small extra;
3. ``Analysis.finalize_parted`` builds the other tables on the client from the rest, the extras
   and the written tables (read back a batch at a time).

Shards run on the local thread pool or as dask tasks (the spill folder must then be visible to
every worker: the same machine for ``local:N``, a shared file system for a remote cluster).

On the local path an analysis whose keyed partials span few keys (``Keyed(dense=...)``, e.g.
machine-utilization's machines x buckets up to a few million) is not spilled: the client merges
each partition's keyed partials, in partition order as they come back, into dense accumulators
over their key ranges (:class:`DenseKeys`), and the shards read their ranges from those.  The
sums are those of the spilled path (the same additions in the same order, see :class:`_Dense`);
what it saves is writing every partition's keyed partials to files and reading them back (at
6.4e7 windows, machine-utilization spilled 1.5 GB: 2-3 s of system time on the dev VM).  On a
device backend the accumulators are in device memory, all the run's together within
:data:`DEVICE_DENSE_SHARE` of it (a :class:`DeviceRoom`): each partition's keyed partials are added
there without leaving the device, and the shards take their ranges there (copied out for an
analysis that finalizes on the host; :func:`dense_target`).
"""

from __future__ import annotations

import itertools
import shutil
import tempfile
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from gpuclust.analyses.base import Analysis, to_host
from gpuclust.backends import backend_of, device_free_bytes
from gpuclust.engine.memory import DEVICE_DENSE_SHARE, available_memory, default_limit
from gpuclust.parted import KeyedAppender, PartedTable, read_keyed_range, slice_keyed, write_keyed, write_part
from gpuclust.partials import merge_keyed

#: Largest key range of a shard merged into dense accumulators (else by insertion).
DENSE_KEYS = 1 << 24
#: Most of the host's available memory that a device study's dense accumulators may take there
#: (:func:`study_dense`: where they do not fit in the device's room).
HOST_DENSE_SHARE = 0.25

__all__ = [
    "DENSE_KEYS",
    "DEVICE_DENSE_SHARE",
    "HOST_DENSE_SHARE",
    "DenseKeys",
    "DeviceRoom",
    "KeptKeys",
    "SpillFolders",
    "SpillTarget",
    "Spilled",
    "as_spilled",
    "dense_plan",
    "dense_target",
    "dense_targets",
    "finalize_parted",
    "joined",
    "merge_spilled",
    "parted_tables",
    "reduce_shard",
    "reduce_shards",
    "rows_fit_on_device",
    "spill",
    "study_dense",
    "study_targets",
]


class _Dense:
    """One keyed partial merged into dense accumulators over its keys ``[first, end)``, a piece
    at a time: per key the values add in piece order, NaN as 0 (as
    :func:`gpuclust.partials.merge_keyed`); :meth:`take` gives the keys present in a range.  The
    accumulators are ``xp``'s arrays (a device's: pieces are added where they are, a host piece
    copied there first)."""

    def __init__(self, empty: dict[str, np.ndarray], first: int, end: int, xp: Any = np, clip: bool = False):
        n = end - first
        self.xp, self.first, self.end, self.clip = xp, first, end, clip
        self.seen = xp.zeros(n, dtype=bool)
        self.sums = {
            f: xp.zeros(n, dtype=np.float64 if v.dtype.kind == "f" else v.dtype) for f, v in empty.items() if f != "key"
        }

    def add(self, piece: dict[str, Any]) -> None:
        xp = self.xp
        if self.clip and self.end <= self.first:  # (a key pass' probe: takes no key)
            return
        if xp is not np:
            piece = {f: xp.asarray(v) for f, v in piece.items()}
        if self.clip:  # (key passes) only the piece's keys in range: a slice of its sorted keys
            piece = slice_keyed(piece, self.first, self.end)
        off = piece["key"] - self.first
        if off.shape[0] == 0:
            return
        if not self.clip:  # (a clipped piece is in range)
            n = int(off.shape[0])
            ends = to_host(off[xp.asarray([0, n - 1])]) if xp is not np else off[[0, n - 1]]  # one copy out
            if int(ends[0]) < 0 or int(ends[1]) >= self.seen.shape[0]:  # sorted keys: the ends suffice
                raise ValueError(f"keyed partial: keys outside [{self.first}, {self.end})")
        self.seen[off] = True
        for f, acc in self.sums.items():  # keys are unique within a piece: an indexed add is exact
            v = piece[f]
            if xp is not np:  # on a device without asking first (a sync): the same values
                acc[off] += xp.nan_to_num(v, nan=0.0).astype(acc.dtype, copy=False) if v.dtype.kind == "f" else v
                continue
            if v.dtype.kind == "f" and not bool(np.isfinite(v).all()):
                v = np.nan_to_num(v, nan=0.0)
            # acc[off] += v, the same additions; ``add.at`` of one dtype is twice as fast
            np.add.at(acc, off, v.astype(acc.dtype, copy=False))

    def take(self, first: int, end: int, release: bool = False) -> dict[str, Any]:
        """The keys present in ``[first, end)`` and their sums (``release``: drop each
        accumulator once copied, one accumulator and its compacted copy alive at a time)."""
        a, b = first - self.first, end - self.first
        idx = self.xp.flatnonzero(self.seen[a:b])
        out = {"key": (idx + first).astype(np.int64)}
        for f in list(self.sums):
            out[f] = (self.sums.pop(f) if release else self.sums[f])[a:b][idx]
        return out


class DenseKeys:
    """The spill target of a parted analysis on the local path when its keyed partials span few
    keys (:func:`dense_target`): the keyed partials are merged in memory, in partition order
    (:func:`merge_spilled`), into a :class:`_Dense` each instead of being written to files.
    ``clip``: each holds a part of its keys' range and takes only those of every partial (a pass
    of :mod:`gpuclust.engine.key_passes`)."""

    def __init__(self, a: Analysis, ranges: dict[str, tuple[int, int]], xp: Any = np, clip: bool = False):
        empty = a.kinds.split(a.empty())[1]
        self.on_device = xp is not np
        self.dense = {
            name: _Dense(empty[name], int(first), int(end), xp, clip) for name, (first, end) in ranges.items()
        }

    def add(self, keyed: dict[str, dict[str, np.ndarray]]) -> None:
        for name, piece in keyed.items():
            self.dense[name].add(piece)

    @property
    def nbytes(self) -> int:
        """Bytes of the accumulators."""
        return sum(int(d.seen.nbytes) + sum(int(v.nbytes) for v in d.sums.values()) for d in self.dense.values())

    def release(self) -> None:
        """Free the accumulators (their shards taken: a key pass' range done)."""
        for d in self.dense.values():
            d.sums, d.seen = {}, d.seen[:0]


class KeptKeys:
    """The spill target of a parted analysis on the local path of a device backend when its table
    is one partition: nothing merges its keyed partials, so they stay in memory as the partition
    task split them (no files written and read back; in device memory for an analysis whose
    partial stays there, ``Analysis.device_partial``) and each shard takes its key ranges of
    them (:func:`reduce_shard`).  ``across``: its table is several partitions, the keyed partials
    all disjoint rows that fit in device memory (:func:`rows_fit_on_device`): each partition's
    stay on the device, and a shard concatenates its ranges of them there, in partition order."""

    def __init__(self, across: bool = False):
        self.across = across


class DeviceRoom:
    """What a local device run's accumulators kept in device memory may take, all its analyses'
    together: :data:`DEVICE_DENSE_SHARE` of the device's free memory when the run places them
    (``total``); each placement takes its bytes from ``left``, in the analyses' order, and one
    that does not fit in what is left goes elsewhere (the host, key passes, spill files).

    >>> room = DeviceRoom(total=100)
    >>> room.take(60), room.take(50), room.take(40), room.left
    (True, False, True, 0)
    """

    def __init__(self, backend: Any = None, total: int | None = None):
        self.total = int(DEVICE_DENSE_SHARE * device_free_bytes(backend)) if total is None else int(total)
        self.left = self.total

    def take(self, nbytes: int) -> bool:
        """Whether ``nbytes`` fit in what is left (then taken)."""
        if nbytes > self.left:
            return False
        self.left -= int(nbytes)
        return True


def rows_fit_on_device(a: Analysis, rows: int, room: DeviceRoom) -> bool:
    """Whether the sharded keyed partials of ``a`` over ``rows`` rows read may all stay in device
    memory until the shards (a table of several partitions): ``a``
    finalizes on the device, every one of them is disjoint rows (``Keyed(rows=True)``: at most a
    row per row read, concatenated, never summed), and at that bound their bytes fit in what is
    left of the run's ``room`` (then taken from it)."""
    names = a.kinds.sharded
    if not a.device_partial or not names or set(names) != set(a.kinds.rows):
        return False
    keyed = a.kinds.split(a.empty())[1]
    per_row = sum(v.dtype.itemsize * int(np.prod(v.shape[1:])) for k in keyed.values() for v in k.values())
    return room.take(rows * per_row)


#: Where a partition task puts a parted analysis' keyed partials: a spill folder or, on the
#: local path, a :class:`DenseKeys` or :class:`KeptKeys`.
SpillTarget = Path | DenseKeys | KeptKeys


def dense_plan(a: Analysis, ctx: Any, on_device: bool) -> tuple[dict[str, tuple[int, int]], int] | None:
    """The key ranges of ``a``'s keyed partials merged into dense accumulators (``a.kinds.dense_keys``,
    ``on_device`` or on the host) and the bytes of those accumulators (a byte a key seen, 8 a
    field); None where ``a`` has none, or where some keyed partial could not be merged there
    (rows, or one without a range)."""
    ranges = a.kinds.dense_keys(ctx, on_device=on_device)
    if not ranges:
        return None
    empty = a.kinds.split(a.empty())[1]
    if set(ranges) & set(a.kinds.rows) or set(ranges) != set(empty):
        return None
    return ranges, dense_bytes(a, ranges)


def dense_bytes(a: Analysis, ranges: dict[str, tuple[int, int]]) -> int:
    """The bytes of :class:`DenseKeys` over ``ranges`` of ``a``'s keyed partials (a byte a key
    seen, 8 a field)."""
    empty = a.kinds.split(a.empty())[1]
    return sum((end - first) * (1 + 8 * (len(empty[n]) - 1)) for n, (first, end) in ranges.items())


def dense_target(
    a: Analysis, ctx: Any, folder: SpillTarget | None, backend: Any = None, room: DeviceRoom | None = None
) -> SpillTarget | None:
    """The local path's spill target of analysis ``a``: :class:`DenseKeys` when ``a`` opts in
    (``a.kinds.dense_keys(ctx)``: the key range ``(first, end)`` of each of its keyed partials, or
    None) with summed keyed partials only; else ``folder`` (only where the client merges partials
    in partition order).  On a device ``backend`` the accumulators are in its memory where they
    fit in what is left of the run's ``room`` (the partials' keyed sums never leave it; the
    shards of an analysis that finalizes on the host copy their ranges out); else on the host,
    at most :data:`DENSE_KEYS` keys in all, where its kinds allow accumulators there
    (``Keyed(dense_host=...)``: overcommit's and cpi's grow with the cell: key passes, else
    spilled)."""
    if not isinstance(folder, Path):
        return folder
    on_device = backend is not None and backend.name != "cpu"
    for device in (True, False) if on_device else (False,):
        plan = dense_plan(a, ctx, device)
        if plan is None:
            continue
        ranges, need = plan
        if device:
            if (room if room is not None else DeviceRoom(backend)).take(need):
                return DenseKeys(a, ranges, backend.xp)
        elif sum(max(0, end - first) for first, end in ranges.values()) <= DENSE_KEYS:
            return DenseKeys(a, ranges)
    return folder


def dense_targets(
    ans: Sequence[Analysis],
    ctxs: Sequence[Any],
    folders: Sequence[SpillTarget | None],
    backend: Any,
    room: DeviceRoom | None,
) -> list[SpillTarget | None]:
    """:func:`dense_target` of each analysis, on a device those with the largest accumulators
    placed first in ``room`` (an analysis that does not fit in what is left runs in key passes,
    each a further read of its columns: the largest are the analyses with the most to read, and
    what is left is best filled by the smaller ones)."""
    on_device = backend is not None and backend.name != "cpu"

    def need(k: int) -> int:
        plan = dense_plan(ans[k], ctxs[k], True) if on_device and isinstance(folders[k], Path) else None
        return 0 if plan is None else plan[1]

    out = list(folders)
    for k in sorted(range(len(ans)), key=lambda k: -need(k)):
        out[k] = dense_target(ans[k], ctxs[k], folders[k], backend, room)
    return out


def study_dense(a: Analysis, ctx: Any, backend: Any, device_room: int) -> DenseKeys | None:
    """Where a study on a device ``backend`` merges ``a``'s keyed partials (a parted analysis
    whose keyed sums have dense key ranges, in a table of several partitions): dense
    accumulators in device memory when they take at most ``device_room`` bytes, else in host
    memory within :data:`HOST_DENSE_SHARE` of what it has available (a study has no spill
    folder: its alternative is the merge tree's sort-merges, on the host once the partials
    outgrow the device's hold, whose merged partial is as large), else None (the merge tree).
    Per key the values add in partition order wherever the accumulators are: the same bits."""
    plan = dense_plan(a, ctx, True)
    if plan is None:
        return None
    ranges, need = plan
    if need <= device_room:
        return DenseKeys(a, ranges, backend.xp)
    if need <= HOST_DENSE_SHARE * (available_memory() or default_limit()):
        return DenseKeys(a, ranges)
    return None


def study_targets(
    plans: Iterable[tuple[list[int], Sequence[Any]]],
    ans: Sequence[Analysis],
    ctxs: Sequence[Any],
    backend: Any,
    room: int,
) -> list[DenseKeys | None]:
    """Per analysis of a study's local run on a device ``backend``: its :func:`study_dense`
    accumulators (a parted analysis in a table of several partitions: ``plans``, the analyses by
    index and the partitions of each table), those on the device within ``room`` bytes in all."""
    out: list[DenseKeys | None] = [None] * len(ans)
    left = room
    for idx, specs in plans:
        for k in idx if len(specs) > 1 else ():
            if ans[k].sharded:
                out[k] = d = study_dense(ans[k], ctxs[k], backend, left)
                left -= d.nbytes if d is not None and d.on_device else 0
    return out


def joined(a: Analysis, merged: Any) -> Any:
    """A study's merged partial of ``a`` whole again: a :class:`Spilled` whose keyed partials were
    merged into a :class:`DenseKeys` (:func:`study_dense`) gives its rest and the keys present
    in the accumulators (dropped as they are taken); anything else as it is."""
    if not isinstance(merged, Spilled) or merged.dense is None:
        return merged
    merged.flush()  # (a partition's partial that was never merged)
    keyed = {name: d.take(d.first, d.end, release=True) for name, d in merged.dense.dense.items()}
    return a.kinds.join(merged.rest, keyed)


@dataclass
class Spilled:
    """A parted analysis' partial past its partition task: the small ``rest`` (merged by the
    tree) and the spill folders of its keyed partials, in partition order; or, on the local
    path, the :class:`DenseKeys` they are merged into (``pending``: a partition's keyed
    partials not merged into it yet)."""

    rest: Any
    spills: list[Path] = field(default_factory=list)
    dense: DenseKeys | None = None
    pending: dict[str, dict[str, np.ndarray]] | None = None
    #: keyed partials kept in memory (:class:`KeptKeys`), in partition order
    kept: list[dict[str, dict[str, np.ndarray]]] = field(default_factory=list)

    def flush(self) -> None:
        """Add the ``pending`` keyed partials to the :class:`DenseKeys` they wait for."""
        if self.pending is not None and self.dense is not None:
            self.dense.add(self.pending)
            self.pending = None


def spill(a: Analysis, partial: Any, folder: SpillTarget) -> Spilled:
    """Split a host partial and save its keyed partials under ``folder`` (a :class:`DenseKeys`:
    kept, to be merged into it by :func:`merge_spilled`)."""
    rest, keyed = a.kinds.split(partial)
    if isinstance(folder, DenseKeys):
        return Spilled(rest, dense=folder, pending=keyed)
    if isinstance(folder, KeptKeys):
        return Spilled(rest, kept=[keyed])
    return Spilled(rest, [write_keyed(folder, keyed)])


def _spill_client(a: Analysis, sp: Spilled, chunks: Iterable[Any], folder: SpillTarget) -> Spilled:
    """``sp`` merged with the client's partial (a flat source; :meth:`Analysis.client_partial`),
    chunk by chunk: into one spill written as the chunks come (a folder: no chunk is kept), or
    each chunk as a partition's (a target in memory)."""
    if not isinstance(folder, Path):
        for cp in chunks:
            sp = merge_spilled(a, sp, spill(a, cp, folder))
        return sp
    out, rest = None, None
    try:
        for cp in chunks:
            r, keyed = a.kinds.split(cp)
            out = out or KeyedAppender(folder, a.kinds.split(a.empty())[1])
            out.add(to_host(keyed))
            rest = r if rest is None else a.kinds.merge_rest(rest, r)
    except BaseException:
        if out is not None:
            out.discard()
        raise
    return sp if out is None else merge_spilled(a, sp, Spilled(rest, [out.close()]))


def as_spilled(a: Analysis, p: Any) -> Spilled:
    """``p`` as a :class:`Spilled` (an empty partial, the merge identity, has nothing to spill)."""
    if isinstance(p, Spilled):
        return p
    rest, keyed = a.kinds.split(p)
    if any(k["key"].shape[0] for k in keyed.values()):
        raise RuntimeError(f"{a.label}: a partial with keyed rows reached the merge without being spilled")
    return Spilled(rest)


def merge_spilled(a: Analysis, x: Any, y: Any) -> Spilled:
    """``x`` then ``y`` (keyed partials kept for a :class:`DenseKeys` are added to it here, ``x``'s
    first: the local path merges in partition order)."""
    x, y = as_spilled(a, x), as_spilled(a, y)
    x.flush()
    y.flush()
    return Spilled(a.kinds.merge_rest(x.rest, y.rest), x.spills + y.spills, x.dense or y.dense, kept=x.kept + y.kept)


def _merge_dense(
    empty: dict[str, np.ndarray], pieces: Iterable[dict[str, np.ndarray]], first: int, end: int
) -> dict[str, np.ndarray]:
    """Merge keyed pieces whose keys lie in ``[first, end)`` into dense accumulators, one piece
    at a time (O(pieces + range), however many partitions touch the shard; every partition may
    touch every key of it).  Per key the values add in piece order, NaN as 0 (as
    :func:`gpuclust.partials.merge_keyed`); returns the keys present in any piece."""
    acc = _Dense(empty, first, end)
    for piece in pieces:
        acc.add(piece)
    return acc.take(first, end, release=True)


def reduce_shard(
    a: Analysis,
    ctx: Any,
    rest: Any,
    index: int,
    lo: int,
    hi: int,
    spills: Sequence[Path],
    out: Path,
    dense: DenseKeys | None = None,
    kept: Sequence[dict[str, dict[str, np.ndarray]]] = (),
) -> tuple[dict[str, tuple[str, int]], Any]:
    """Shard ``index`` (``[lo, hi)``): its key ranges of every spill, then of the keyed partials
    ``kept`` in memory, merged in order (or taken from ``dense``, the keyed partials merged in
    memory), finalized, each parted table's rows written as part ``index`` under
    ``out/<table>/``; returns ``({table: (file name, rows)}, extra)``."""
    keyed = {}
    empty = a.kinds.split(a.empty())[1]  # the keyed partials' names, fields and dtypes
    for name in empty:
        fields = [f for f in empty[name] if f != "key"]
        first, end = a.kinds.key_range(ctx, name, lo, hi)
        pieces = itertools.chain(
            (read_keyed_range(p, name, fields, first, end) for p in spills),
            (to_host(slice_keyed(k[name], first, end)) for k in kept),
        )
        on_device = bool(kept) and not spills and not any(isinstance(k[name]["key"], np.ndarray) for k in kept)
        if len(kept) == 1 and on_device:
            # one partition's keyed partial left on the device: nothing to merge; its range as a
            # study's in-memory finalize takes it (gpuclust.parted.finalize_in_memory)
            keyed[name] = slice_keyed(kept[0][name], first, end)
        elif on_device and name in a.kinds.rows:  # several partitions' rows: concatenated there, in order
            got = [slice_keyed(k[name], first, end) for k in kept]
            xp = backend_of(got[0]["key"]).xp
            keyed[name] = {f: xp.concatenate([g[f] for g in got]) for f in empty[name]}
        elif dense is not None and name in dense.dense:
            if spills:
                raise RuntimeError(f"{a.label}: keyed partials both spilled and merged in memory")
            merged = dense.dense[name].take(first, end)
            keyed[name] = merged if a.device_partial else to_host(merged)
        elif name in a.kinds.rows:  # disjoint rows: concatenated in partition order
            got = [empty[name], *pieces]
            keyed[name] = {f: np.concatenate([g[f] for g in got]) for f in empty[name]}
        elif end - first <= DENSE_KEYS:
            keyed[name] = _merge_dense(empty[name], pieces, first, end)
        else:  # a left fold by insertion: the shard's merged rows plus one partition's
            acc = empty[name]
            for piece in pieces:
                acc = merge_keyed(acc, piece)
            keyed[name] = acc
    rows, extra = a.finalize_shard(keyed, rest, ctx, lo, hi)
    return {t: write_part(out / t, index, df) for t, df in rows.items()}, extra


def finalize_parted(
    a: Analysis,
    ctx: Any,
    merged: Any,
    out: Path,
    spill_folder: SpillTarget,
    run_tasks: Callable[[list[tuple[Any, ...]]], list[Any]],
    progress: Any = None,
) -> dict[str, Any]:
    """The result of a parted analysis: the client's own partial (a flat source) spilled too
    (``spill_folder``: the partitions' spill target), the shards reduced by ``run_tasks`` (a list
    of :func:`reduce_shard` argument tuples -> their results, in order), the parted tables as
    :class:`gpuclust.parted.PartedTable` under ``out``."""
    rest, _, results = reduce_shards(a, ctx, merged, out, spill_folder, run_tasks, progress)
    return parted_tables(a, ctx, rest, out, results)


def reduce_shards(
    a: Analysis,
    ctx: Any,
    merged: Any,
    out: Path,
    spill_folder: SpillTarget,
    run_tasks: Callable[[list[tuple[Any, ...]]], list[Any]],
    progress: Any = None,
    within: tuple[int, int] | None = None,
) -> tuple[Any, list[tuple[int, int]], list[Any]]:
    """The merged rest, ``a``'s shards and the :func:`reduce_shard` results of those whose
    coordinates lie ``within`` a range (default: all of them), in order (part ``i`` is shard ``i``)."""
    sp = as_spilled(a, merged)
    sp.flush()  # (a partition's partial that was never merged)
    sp = _spill_client(a, sp, a.client_partial(ctx), spill_folder)
    shards = a.kinds.shards(ctx, sp.rest)
    picked = [(i, lo, hi) for i, (lo, hi) in enumerate(shards) if within is None or within[0] <= lo <= hi <= within[1]]
    if progress is not None:
        progress.phase(f"{a.label}: {len(picked)} shard(s) of {', '.join(a.parted) or 'keyed partials'}")
    args = [(a, ctx, sp.rest, i, lo, hi, sp.spills, out, sp.dense, sp.kept) for i, lo, hi in picked]
    return sp.rest, shards, run_tasks(args)


def parted_tables(a: Analysis, ctx: Any, rest: Any, out: Path, results: Sequence[Any]) -> dict[str, Any]:
    """A parted analysis' tables from its merged ``rest`` and its shards' ``results``, in order."""
    tables = {t: PartedTable(out / t) for t in a.parted}
    extras = []
    for files, extra in results:
        for t, (name, rows) in files.items():
            tables[t].files.append(name)
            tables[t].num_rows += rows
        extras.append(extra)
    return {**tables, **a.finalize_parted(rest, ctx, tables, extras)}


class SpillFolders:
    """The run's scratch folder (a sub-folder per parted analysis for its spills, ``context`` for
    memory-mapped context arrays) and where parted tables go: ``parts_dir`` (the results folder
    being written) or a temporary folder removed on :meth:`close`."""

    def __init__(self, parts_dir: str | Path | None):
        self.own = parts_dir is None
        self.root = Path(tempfile.mkdtemp(prefix="gpuclust-parts-")) if parts_dir is None else Path(parts_dir)
        self.root.mkdir(parents=True, exist_ok=True)
        self.spill = Path(tempfile.mkdtemp(prefix=".spill-", dir=self.root))

    def for_analysis(self, k: int) -> Path:
        p = self.spill / str(k)
        p.mkdir(exist_ok=True)
        return p

    def close(self) -> None:
        shutil.rmtree(self.spill, ignore_errors=True)
        if self.own:
            shutil.rmtree(self.root, ignore_errors=True)
