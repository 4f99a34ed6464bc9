"""Reading partitions: a partition's columns into host arrays, or straight into device memory.

:func:`read_partition` reads the columns of one :class:`~gpuclust.engine.partition.PartitionSpec`
into NumPy arrays (row group by row group, into arrays allocated once; NULL -> NaN / dtype minimum),
:func:`read_partition_device` with cuDF into device arrays where RAPIDS is installed.  An analysis'
side inputs are read through :class:`SideTable` (:func:`side_table`: the whole table, or the
buckets of one partition).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import numpy as np
import pyarrow as pa

from gpuclust._parallel import map_ordered
from gpuclust.arrow_numpy import to_numpy
from gpuclust.dataset import open_parquet, reading
from gpuclust.engine.partition import PartitionSpec, Piece, TableSource, column_to_numpy
from gpuclust.schema import SCHEMAS

__all__ = [
    "SideTable",
    "read_arrow",
    "read_partition",
    "read_partition_device",
    "read_piece",
    "row_group_pieces",
    "side_table",
]

_T = TypeVar("_T")


class SideTable:
    """Rows of a table an analysis joins with (see :meth:`gpuclust.analyses.base.Analysis.bind`):
    the whole table, or the buckets of one partition when the layout co-partitions it.

    ``batches(columns)`` yields it piece by piece (a Parquet file or a bucket at a time) so a
    reduction never holds the whole table; ``read(columns)`` returns it as one Arrow table.
    """

    def __init__(self, table: str, pieces: Sequence[Piece]):
        self.table = table
        self.pieces = tuple(pieces)

    @property
    def num_rows(self) -> int:
        return sum(p.stop - p.start for p in self.pieces)

    def batches(self, columns: Sequence[str]) -> Any:
        for p in self.pieces:
            yield read_piece(p, self.table, columns)

    def map(self, fn: Callable[[pa.Table], _T], columns: Sequence[str], threads: int = 1) -> list[_T]:
        """``[fn(batch) for batch in self.batches(columns)]``; with ``threads`` > 1, a Parquet row
        group per batch, read and handed to ``fn`` on ``threads`` threads (results in row order)
        so that a reduction of one large file uses every core (``fn`` must release the GIL to
        gain: Arrow's reader and NumPy's kernels do)."""
        if threads <= 1:
            return [fn(b) for b in self.batches(columns)]
        return list(
            map_ordered(
                lambda p: fn(read_piece(p, self.table, columns)), self.row_group_pieces(), threads, name="gpuclust-side"
            )
        )

    def row_group_pieces(self) -> list[Piece]:
        """The pieces split at their files' row group boundaries (see :func:`row_group_pieces`)."""
        return row_group_pieces(self.pieces)

    def read(self, columns: Sequence[str]) -> pa.Table:
        parts = list(self.batches(columns))
        if not parts:
            return pa.schema([SCHEMAS[self.table].field(c) for c in columns]).empty_table()
        return pa.concat_tables(parts) if len(parts) > 1 else parts[0]


def side_table(source: Any, table: str, spec: PartitionSpec | None = None) -> SideTable:
    """The rows of ``table`` a partition joins with: its buckets (``spec`` given and carrying
    them), else the whole table (file by file)."""
    if spec is not None:
        for name, pieces in spec.side:
            if name == table:
                return SideTable(table, pieces)
    if isinstance(source, TableSource):
        t = source.tables.get(table)
        return SideTable(table, [] if t is None or not t.num_rows else [Piece(0, t.num_rows, None, t)])
    if hasattr(source, "files"):
        return SideTable(table, [Piece(0, open_parquet(f).metadata.num_rows, str(f)) for f in source.files(table)])
    t = source.read(table)
    return SideTable(table, [Piece(0, t.num_rows, None, t)] if t.num_rows else [])


def row_group_pieces(pieces: Sequence[Piece]) -> list[Piece]:
    """``pieces`` split at their files' row group boundaries, in row order: each reads at most one
    row group, so that readers can decode them on several threads (in-memory pieces as they are).

    >>> import pyarrow as pa, pyarrow.parquet as pq, tempfile, os
    >>> f = os.path.join(tempfile.mkdtemp(), "t.parquet")
    >>> pq.write_table(pa.table({"x": list(range(10))}), f, row_group_size=4)
    >>> [(p.start, p.stop) for p in row_group_pieces([Piece(2, 9, f)])]
    [(2, 4), (4, 8), (8, 9)]
    """
    out = []
    for p in pieces:
        if p.file is None:
            out.append(p)
            continue
        md = open_parquet(p.file).metadata
        off = 0
        for g in range(md.num_row_groups):
            n = md.row_group(g).num_rows
            lo, hi = max(p.start, off), min(p.stop, off + n)
            if lo < hi:
                out.append(Piece(lo, hi, p.file))
            off += n
    return out


def read_piece(p: Piece, table: str, columns: Sequence[str]) -> pa.Table:
    """``columns`` of the rows of one piece as an Arrow table of canonical types."""
    schema = SCHEMAS[table]
    sub = pa.schema([schema.field(c) for c in columns])
    if p.data is not None:
        return _as_schema(p.data.select(list(columns)), sub)
    pf = open_parquet(p.file)
    groups, first = _row_groups(pf.metadata, p)
    if not groups:
        return sub.empty_table()
    # use_threads=False: the engine already runs one partition per core; Arrow's own pool on top
    # of that oversubscribes the cores (2-3x the wall time and much system time on 2 cores)
    with reading(p.file):
        t = pf.read_row_groups(groups, columns=list(columns), use_threads=False)
    return _as_schema(t.slice(p.start - first, p.stop - p.start), sub)


def _as_schema(t: pa.Table, sub: pa.Schema) -> pa.Table:
    """``t`` cast to the canonical ``sub`` schema (no cast when it already is)."""
    return t if t.schema.equals(sub) else t.cast(sub)


def _piece_blocks(p: Piece, table: str, columns: Sequence[str]) -> Any:
    """The rows ``[p.start, p.stop)`` of a piece as Arrow tables of canonical types, one Parquet
    row group at a time (so at most one row group's Arrow data is alive)."""
    schema = SCHEMAS[table]
    sub = pa.schema([schema.field(c) for c in columns])
    if p.data is not None:
        yield _as_schema(p.data.select(list(columns)), sub)
        return
    pf = open_parquet(p.file)
    groups, first = _row_groups(pf.metadata, p)
    off = first
    for g in groups:
        n = pf.metadata.row_group(g).num_rows
        lo, hi = max(p.start, off) - off, min(p.stop, off + n) - off
        with reading(p.file):
            t = pf.read_row_group(g, columns=list(columns), use_threads=False)
        yield _as_schema(t.slice(lo, hi - lo) if (lo, hi) != (0, n) else t, sub)
        off += n


def _fixed_width(t: pa.DataType) -> bool:
    return pa.types.is_integer(t) or pa.types.is_floating(t)


def _fill_chunk(out: np.ndarray, at: int, arr: pa.Array) -> None:
    """Copy one Arrow chunk of a fixed-width column into ``out[at:]`` (NULL -> NaN / dtype minimum,
    as :func:`column_to_numpy`)."""
    n = len(arr)
    # without NULLs to_numpy is a view of the Arrow buffer (one copy)
    out[at : at + n] = to_numpy(arr, out.dtype)


def _row_groups(md: Any, p: Piece) -> tuple[list[int], int]:
    """The row groups of a Parquet file that hold rows ``[p.start, p.stop)``, and the file row
    offset of the first of them."""
    groups, starts, off = [], [], 0
    for g in range(md.num_row_groups):
        n = md.row_group(g).num_rows
        if off < p.stop and off + n > p.start:
            groups.append(g)
            starts.append(off)
        off += n
    return groups, (starts[0] if starts else 0)


def read_arrow(spec: PartitionSpec, columns: Sequence[str]) -> pa.Table:
    """Read ``columns`` of one partition as one Arrow table (canonical types; one chunk per row
    group read)."""
    schema = SCHEMAS[spec.table]
    sub = pa.schema([schema.field(c) for c in columns])
    parts = [read_piece(p, spec.table, columns) for p in spec.pieces]
    return pa.concat_tables(parts) if parts else sub.empty_table()


def read_partition(spec: PartitionSpec, columns: Sequence[str]) -> dict[str, np.ndarray]:
    """Read ``columns`` of one partition into host NumPy arrays (see :func:`column_to_numpy`).

    Fixed-width columns are copied row group by row group into arrays allocated once for the
    partition, so the partition's Arrow data is never alive whole beside its NumPy copy (half
    the peak memory of reading it all, then concatenating).  A partition of one row group (or
    one in-memory slice) is not copied: its columns without NULLs are read-only NumPy views of
    the decoded Arrow buffers."""
    fields = [SCHEMAS[spec.table].field(c) for c in columns]
    if not all(_fixed_width(f.type) for f in fields):
        t = read_arrow(spec, columns)
        return {c: column_to_numpy(t.column(c)) for c in columns}
    if _single_block(spec):
        # one row group (or in-memory slice): its columns as NumPy views of the Arrow buffers
        # where they have no NULLs (read-only; no copy), else filled copies, as column_to_numpy
        t = next(_piece_blocks(spec.pieces[0], spec.table, columns))
        return {c: column_to_numpy(t.column(c)) for c in columns}
    n = sum(p.stop - p.start for p in spec.pieces)
    out = {f.name: np.empty(n, dtype=np.dtype(f.type.to_pandas_dtype())) for f in fields}
    at = 0
    for p in spec.pieces:
        for block in _piece_blocks(p, spec.table, columns):
            for f in fields:
                pos = at
                for chunk in block.column(f.name).chunks:
                    _fill_chunk(out[f.name], pos, chunk)
                    pos += len(chunk)
            at += block.num_rows
            del block
    if at != n:
        raise RuntimeError(f"{spec.table} partition {spec.index}: read {at} rows, expected {n}")
    return out


def _single_block(spec: PartitionSpec) -> bool:
    """Whether the partition is read as one block by :func:`_piece_blocks` (one piece: an
    in-memory slice, or rows of a single Parquet row group)."""
    if len(spec.pieces) != 1:
        return False
    p = spec.pieces[0]
    return p.data is not None or len(_row_groups(open_parquet(p.file).metadata, p)[0]) == 1


def _cudf_wanted() -> bool:
    if os.environ.get("GPUCLUST_NO_CUDF", "") == "1":
        return False
    try:
        import cudf  # noqa: F401
    except Exception:
        return False
    return True


def read_partition_device(spec: PartitionSpec, columns: Sequence[str], backend: Any) -> dict[str, Any] | None:
    """The thin cuDF path: read a partition's Parquet row groups straight into device memory.

    Applies only on the gpu backend, where RAPIDS (``cudf``) is installed (and
    ``GPUCLUST_NO_CUDF=1`` is not set), for file-backed partitions of numeric columns; returns
    ``None`` otherwise and the caller uses :func:`read_partition` (Arrow on the host, then one
    copy to the device).  Same arrays as that path: canonical dtypes, NULL -> NaN / dtype minimum.
    """
    if getattr(backend, "name", None) != "gpu" or not spec.pieces or not _cudf_wanted():
        return None
    fields = [SCHEMAS[spec.table].field(c) for c in columns]
    if any(p.data is not None for p in spec.pieces) or not all(
        pa.types.is_integer(f.type) or pa.types.is_floating(f.type) for f in fields
    ):
        return None
    import cudf

    frames = []
    for p in spec.pieces:
        groups, first = _row_groups(open_parquet(p.file).metadata, p)
        if groups:
            df = cudf.read_parquet(p.file, columns=list(columns), row_groups=groups)
            frames.append(df.iloc[p.start - first : p.stop - first])
    xp = backend.xp
    out: dict[str, Any] = {}
    df = (cudf.concat(frames, ignore_index=True) if len(frames) > 1 else frames[0]) if frames else None
    for c, f in zip(columns, fields, strict=True):
        dt = np.dtype(f.type.to_pandas_dtype())
        if df is None:
            out[c] = xp.zeros(0, dtype=dt)
            continue
        col = df[c].astype(dt)
        fill = float("nan") if dt.kind == "f" else int(np.iinfo(dt).min)
        out[c] = xp.ascontiguousarray(col.fillna(fill).to_cupy())
    return out
