"""Result tables that grow with the cell, written part by part (issue 8, docs/user/scale.md "Outputs").

An analysis whose result has a row per machine x time bucket (overcommit's ``machine`` table: ~1e8
rows for one 2019 cell) lists those tables in ``Analysis.parted``.  Their rows are never gathered
whole: the engine reduces the analysis' *keyed* partial one key range (a *shard*) at a time and each
shard's rows are written as one Parquet file, ``<analysis>/<table>/part-NNNNN.parquet``, in key
order (so the files, read in name order, are the table).

This module holds what analyses and the engine share:

* :class:`PartedTable` (the files of a written table) and :class:`FrameParts` (the same table
  held in memory): both give ``batches(columns)`` (one DataFrame per part), ``read(columns)`` and
  ``num_rows``, so a ``finalize`` that summarizes a parted table streams it either way;
* :func:`frames`: the batches of a DataFrame or of either of the above;
* the spill of keyed partials (:func:`write_keyed`, :func:`read_keyed_range`): each partition's
  keyed arrays saved as ``.npy`` files, later memory-mapped so a shard reads only its key range;
  :class:`KeyedAppender` writes one such spill chunk by chunk (a flat source's client partial);
* :func:`write_part`: one part file, written to a temporary name and renamed (a reader never sees
  half a part).
"""

from __future__ import annotations

import os
import secrets
import shutil
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from gpuclust._lazy import pandas as pd
from gpuclust._parallel import map_ordered, threads
from gpuclust.arrow_numpy import to_numpy
from gpuclust.tables import as_arrow, as_pandas, column, is_frame, parquet_options

__all__ = [
    "FrameParts",
    "KeyedAppender",
    "MappedArray",
    "PartedTable",
    "array_batches",
    "column_batches",
    "finalize_in_memory",
    "key_bounds",
    "map_large_arrays",
    "mapped_npy",
    "frames",
    "part_name",
    "read_keyed_range",
    "relocated",
    "slice_keyed",
    "write_keyed",
    "write_part",
]


def part_name(index: int) -> str:
    """The file name of part ``index`` (sorts in part order)."""
    return f"part-{int(index):05d}.parquet"


@dataclass
class PartedTable:
    """A result table written as Parquet parts in ``folder`` (``files``: in table order)."""

    folder: Path
    files: list[str] = field(default_factory=list)
    num_rows: int = 0

    def batches(self, columns: Sequence[str] | None = None) -> Iterator[pd.DataFrame]:
        """The table, one row group at a time (``columns``: only those).  The row groups are the
        frames the shards yielded, so a sum over batches adds in the same order as over a
        :class:`FrameParts` of the same run."""
        cols = None if columns is None else list(columns)
        for f in self.files:
            pf = pq.ParquetFile(self.folder / f)
            for i in range(pf.num_row_groups):
                yield pf.read_row_group(i, columns=cols).to_pandas()

    def read(self, columns: Sequence[str] | None = None) -> pd.DataFrame:
        """The whole table (memory grows with it: for tests and small results)."""
        parts = list(self.batches(columns))
        if not parts:
            return pd.DataFrame(columns=list(columns or []))
        return pd.concat(parts, ignore_index=True) if len(parts) > 1 else parts[0]

    def __len__(self) -> int:
        return self.num_rows

    def relocated(self, old: str | Path, new: str | Path) -> PartedTable:
        """The same table once the folder ``old`` it was written under is renamed to ``new``."""
        return PartedTable(Path(new) / self.folder.relative_to(old), list(self.files), self.num_rows)


def relocated(results: dict[str, dict[str, Any]], old: str | Path, new: str | Path) -> dict[str, dict[str, Any]]:
    """Run results whose parted tables (and tables written by dask workers,
    :class:`gpuclust.report.writer.WrittenTable`) were written under the folder ``old``, now
    renamed to ``new``."""
    return {
        key: {t: v.relocated(old, new) if hasattr(v, "relocated") else v for t, v in tables.items()}
        for key, tables in results.items()
    }


@dataclass
class FrameParts:
    """A parted table held in memory (a direct ``finalize`` call, no results folder): its parts,
    DataFrames or Arrow tables."""

    parts: list[Any] = field(default_factory=list)

    @property
    def num_rows(self) -> int:
        return sum(p.num_rows if isinstance(p, pa.Table) else len(p) for p in self.parts)

    def batches(self, columns: Sequence[str] | None = None) -> Iterator[pd.DataFrame]:
        """The parts as DataFrames (``columns`` at least; a DataFrame part not copied)."""
        for p in self.parts:
            yield as_pandas(p)

    def read(self, columns: Sequence[str] | None = None) -> pd.DataFrame:
        arrow = [p for p in self.parts if isinstance(p, pa.Table)]
        if len(arrow) > 1 and len(arrow) == len(self.parts) and all(t.schema.equals(arrow[0].schema) for t in arrow):
            # Arrow parts of one schema (a finalize's row groups): one conversion of the chunked
            # table, not a DataFrame a part and a pandas concatenation of them (about twice as fast)
            return as_pandas(pa.concat_tables(arrow))
        parts = list(self.batches(columns))
        if len(parts) == 1:
            return parts[0]
        return pd.concat(parts, ignore_index=True) if parts else pd.DataFrame(columns=list(columns or []))

    def __len__(self) -> int:
        return self.num_rows


def frames(table: Any, columns: Sequence[str] | None = None) -> Iterator[pd.DataFrame]:
    """The batches of a :class:`PartedTable` or a :class:`FrameParts`, or a DataFrame (itself) or
    an Arrow table, as DataFrames (at least ``columns``: a part read from Parquet holds only those,
    a frame in memory is not copied)."""
    if isinstance(table, (PartedTable, FrameParts)):
        yield from table.batches(columns)
    else:  # not copied: the caller reads ``columns`` of it
        yield as_pandas(table)


def column_batches(table: Any, name: str) -> Iterator[np.ndarray]:
    """Column ``name`` of a parted table, a batch at a time, as NumPy arrays (see :func:`array_batches`)."""
    for b in array_batches(table, [name]):
        yield b[name]


def array_batches(table: Any, names: Sequence[str]) -> Iterator[dict[str, np.ndarray]]:
    """Columns ``names`` of a parted table (a :class:`PartedTable`: a row group at a time, read
    without pandas; a :class:`FrameParts`: a part at a time), a DataFrame or an Arrow table, as
    NumPy arrays by name (NULL as NaN or the integer minimum, see
    :func:`gpuclust.arrow_numpy.to_numpy`)."""
    names = list(names)
    if isinstance(table, PartedTable):
        for f in table.files:
            pf = pq.ParquetFile(table.folder / f)
            for i in range(pf.num_row_groups):
                t = pf.read_row_group(i, columns=names)
                yield {c: to_numpy(t.column(c)) for c in names}
    else:
        for p in table.parts if isinstance(table, FrameParts) else [table]:
            yield {c: column(p, c) for c in names}


def _one_part(rows: Any) -> bool:
    return isinstance(rows, pa.Table) or is_frame(rows)


def write_part(folder: Path, index: int, rows: Any) -> tuple[str, int]:
    """Write part ``index`` of a table into ``folder`` (created if needed) atomically: a DataFrame
    or an Arrow table, or an iterable of them, one row group each (consumed one at a time);
    returns ``(file name, rows)``."""
    folder.mkdir(parents=True, exist_ok=True)
    name = part_name(index)
    tmp = folder / f".{name}.{os.getpid()}-{secrets.token_hex(4)}.tmp"
    n = 0
    try:
        writer = None
        try:
            for df in [rows] if _one_part(rows) else rows:
                t = as_arrow(df)
                if writer is None:
                    writer = pq.ParquetWriter(tmp, t.schema, **parquet_options(t.schema))
                writer.write_table(t, row_group_size=max(t.num_rows, 1))
                n += t.num_rows
        finally:
            if writer is not None:
                writer.close()
        if writer is None:
            raise ValueError(f"{folder / name}: no rows and no columns to write")
        os.replace(tmp, folder / name)
    finally:
        if tmp.exists():
            tmp.unlink()
    return name, n


def write_keyed(folder: Path, keyed: dict[str, dict[str, np.ndarray]]) -> Path:
    """Save keyed partials ``{name: {"key": sorted int64, field: values}}`` as ``.npy`` files in
    a new sub-folder of ``folder``; returns it (what :func:`read_keyed_range` reads)."""
    out = folder / secrets.token_hex(8)
    tmp = folder / f".{out.name}.tmp"
    tmp.mkdir(parents=True)
    for name, arrays in keyed.items():
        for f, v in arrays.items():
            np.save(tmp / f"{name}.{f}.npy", np.ascontiguousarray(v), allow_pickle=False)
    os.replace(tmp, out)
    return out


class KeyedAppender:
    """Keyed partials written chunk by chunk into one spill (what :func:`write_keyed` writes at
    once, read by :func:`read_keyed_range`): the chunks' keys of each name in ascending, disjoint
    ranges, so that their concatenation is sorted.  ``empty``: the keyed partials' names, fields
    and dtypes (every file exists, if empty).  Each ``.npy`` file is written with a header for no
    rows, the chunks' rows appended as they come, and its header rewritten for the rows at
    :meth:`close` (NumPy's headers leave room for the row count to grow); the folder appears
    under its name only then."""

    def __init__(self, folder: Path, empty: dict[str, dict[str, np.ndarray]]):
        self.out = folder / secrets.token_hex(8)
        self.tmp = folder / f".{self.out.name}.tmp"
        self.tmp.mkdir(parents=True)
        self.files: dict[tuple[str, str], tuple[Any, np.dtype, tuple[int, ...]]] = {}
        self.header: dict[tuple[str, str], int] = {}  # each file's header length, as first written
        self.rows = dict.fromkeys(empty, 0)
        self.last: dict[str, int | None] = dict.fromkeys(empty, None)
        for name, arrays in empty.items():
            for f, v in arrays.items():
                fh = open(self.tmp / f"{name}.{f}.npy", "wb")  # noqa: SIM115 (closed in close())
                self.files[name, f] = (fh, np.dtype(v.dtype), tuple(v.shape[1:]))
                self._header(name, f, 0)

    def _header(self, name: str, f: str, rows: int) -> None:
        fh, dt, rest = self.files[name, f]
        fh.seek(0)
        np.lib.format.write_array_header_1_0(
            fh, {"descr": np.lib.format.dtype_to_descr(dt), "fortran_order": False, "shape": (rows, *rest)}
        )
        if self.header.setdefault((name, f), fh.tell()) != fh.tell():  # (NumPy pads for 21 digits of rows)
            raise RuntimeError(f"the header of {fh.name} changed size")
        fh.seek(0, os.SEEK_END)

    def add(self, keyed: dict[str, dict[str, np.ndarray]]) -> None:
        for name, arrays in keyed.items():
            key = arrays["key"]
            if key.shape[0] == 0:
                continue
            if self.last[name] is not None and int(key[0]) <= int(self.last[name]):  # type: ignore[arg-type]
                raise ValueError(f"keyed chunk {name}: keys not above the previous chunk's")
            self.last[name] = int(key[-1])
            self.rows[name] += int(key.shape[0])
            for f, v in arrays.items():
                fh, dt, _ = self.files[name, f]
                fh.write(np.ascontiguousarray(v, dtype=dt).tobytes())

    def close(self) -> Path:
        for (name, f), (fh, _, _) in self.files.items():
            self._header(name, f, self.rows[name])
            fh.close()
        os.replace(self.tmp, self.out)
        return self.out

    def discard(self) -> None:
        """Close the files and remove what was written (a chunk failed: nothing is left behind)."""
        for fh, _, _ in self.files.values():
            fh.close()
        shutil.rmtree(self.tmp, ignore_errors=True)


#: Held while NumPy reads a ``.npy`` header (:func:`mapped_npy`): it parses the header with
#: ``ast.literal_eval``, and CPython 3.11 before 3.11.8 can raise a spurious ``SystemError: AST
#: constructor recursion depth mismatch`` when threads build ASTs at once (python/cpython#106905;
#: seen in a shard reduction's threads).  Only the header is parsed under it, not the data read.
_NPY_HEADER = threading.Lock()


def mapped_npy(path: Path | str) -> np.memmap:
    """The ``.npy`` file ``path`` memory-mapped read-only, its header parsed under :data:`_NPY_HEADER`."""
    with _NPY_HEADER:
        return np.load(path, mmap_mode="r")


def read_keyed_range(spill: Path, name: str, fields: Sequence[str], lo: int, hi: int) -> dict[str, np.ndarray]:
    """The rows of keyed partial ``name`` saved in ``spill`` whose key is in ``[lo, hi)`` (files
    memory-mapped: only the range is read)."""
    key = mapped_npy(spill / f"{name}.key.npy")
    a, b = (int(x) for x in np.searchsorted(key, [lo, hi]))
    out = {"key": np.array(key[a:b])}
    for f in fields:
        out[f] = np.array(mapped_npy(spill / f"{name}.{f}.npy")[a:b])
    return out


def key_bounds(key: Any, first: int, end: int) -> tuple[int, int]:
    """``(a, b)`` such that ``key[a:b]`` are the sorted keys ``key`` in ``[first, end)``; ``key``
    on the host or on the device (a partial a local gpu study left there:
    :attr:`gpuclust.analyses.base.Analysis.device_partial`).

    >>> key_bounds(np.array([1, 3, 3, 7]), 3, 7)
    (1, 3)
    """
    if isinstance(key, np.ndarray):
        a, b = np.searchsorted(key, [first, end])
        return int(a), int(b)
    from gpuclust.backends import backend_of

    xp = backend_of(key).xp
    ab = xp.searchsorted(key, xp.asarray(np.array([first, end], dtype=key.dtype)))
    return int(ab[0]), int(ab[1])


def slice_keyed(keyed: dict[str, Any], first: int, end: int) -> dict[str, Any]:
    """The rows of a keyed partial (sorted keys, on the host or the device) whose key is in
    ``[first, end)`` (rows of 2-D fields too)."""
    a, b = key_bounds(keyed["key"], first, end)
    return {f: v[a:b] for f, v in keyed.items()}


def finalize_in_memory(a: Any, partial: Any, ctx: Any, *, client: bool = True) -> dict[str, pd.DataFrame]:
    """``finalize`` of an analysis with ``parted`` tables, in memory: the same shards, parts and
    extras as the engine's spilled path, the parted tables concatenated (for direct calls and
    small data).  The shards are finalized on :func:`gpuclust._parallel.threads` threads (set by
    the caller with ``client_threads``; one by default), their parts and extras kept in shard
    order, so the result is the same bits on any number of threads.  ``client=False``: the
    caller has already added the analysis' :meth:`client_partial` to ``partial``."""
    for cp in a.client_partial(ctx) if client else ():
        partial = a.kinds.merge(partial, cp)
    rest, keyed = a.kinds.split(partial)

    def shard(bounds: tuple[int, int]) -> tuple[dict[str, list[Any]], Any]:
        lo, hi = bounds
        sub = {name: slice_keyed(k, *a.kinds.key_range(ctx, name, lo, hi)) for name, k in keyed.items()}
        rows, extra = a.finalize_shard(sub, rest, ctx, lo, hi)
        # the rows consumed here, on the shard's thread: the extra is complete once they are
        return {t: [f] if _one_part(f) else list(f) for t, f in rows.items()}, extra

    tables = {t: FrameParts() for t in a.parted}
    extras = []
    for rows, extra in map_ordered(shard, a.kinds.shards(ctx, rest), threads(), name="gpuclust-finalize"):
        for t, parts in rows.items():
            tables[t].parts.extend(parts)
        extras.append(extra)
    out = a.finalize_parted(rest, ctx, tables, extras)
    return {**{t: tp.read() for t, tp in tables.items()}, **out}


class MappedArray(np.memmap):
    """A read-only memory-mapped ``.npy`` file that pickles as its path, not its data: a large
    context array (cpi's machine x 5-minute table) travels to partition tasks and dask workers as
    a file name, and its pages are shared (and evictable) rather than copied per worker.  Views
    and results of operations pickle as ordinary arrays."""

    _gpuclust_path: str | None = None

    def __array_finalize__(self, obj: Any) -> None:
        super().__array_finalize__(obj)
        self._gpuclust_path = None

    def __reduce__(self) -> Any:
        if self._gpuclust_path is not None:
            return (_open_mapped, (self._gpuclust_path,))
        return np.asarray(self).__reduce__()


def _open_mapped(path: str) -> MappedArray:
    arr = mapped_npy(path).view(MappedArray)
    arr._gpuclust_path = path
    return arr


#: Context arrays at least this large are memory-mapped by :func:`map_large_arrays`.
MAP_MIN_BYTES = 1 << 16


def map_large_arrays(ctx: Any, folder: Path, min_bytes: int | None = None) -> Any:
    """``ctx`` (a dataclass) with every NumPy array field of at least ``min_bytes`` (default
    :data:`MAP_MIN_BYTES`) saved under ``folder`` and replaced by a :class:`MappedArray`; anything
    else unchanged."""
    import dataclasses

    if not dataclasses.is_dataclass(ctx) or isinstance(ctx, type):
        return ctx
    limit = MAP_MIN_BYTES if min_bytes is None else min_bytes
    new = {}
    for f in dataclasses.fields(ctx):
        v = getattr(ctx, f.name)
        if type(v) is np.ndarray and v.nbytes >= limit and v.dtype.kind in "biuf":
            folder.mkdir(parents=True, exist_ok=True)
            path = folder / f"{f.name}-{secrets.token_hex(6)}.npy"
            np.save(path, np.ascontiguousarray(v), allow_pickle=False)
            new[f.name] = _open_mapped(str(path))
    return dataclasses.replace(ctx, **new) if new else ctx
