"""Sources and partitions: what the engine reads, and how a table is cut into partitions.

A *source* is anything with ``read(table, columns) -> pyarrow.Table`` (used for analysis
contexts) and, for partitioned reads, either Parquet part files (:class:`gpuclust.dataset.Dataset`)
or in-memory Arrow tables (:class:`TableSource`).

A table is cut at global row offsets ("cut points").  By default the cuts are spread evenly by
rows and snapped to Parquet row-group boundaries when there are enough row groups; explicit cut
points may fall anywhere (a partition then reads the row groups it overlaps and slices them).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import pyarrow as pa

from gpuclust._parallel import map_ordered
from gpuclust.arrow_numpy import to_numpy
from gpuclust.dataset import open_parquet, reading
from gpuclust.layout import HASH_NAME, KEYS, ORDER, bucket_ids, key_name
from gpuclust.schema import SCHEMAS

__all__ = [
    "PartitionSpec",
    "Piece",
    "SideTable",
    "TableSource",
    "as_source",
    "bucket_pieces",
    "column_to_numpy",
    "copartitioned",
    "layout_key",
    "plan_partitions",
    "whole_instance_plan",
    "read_arrow",
    "read_partition",
    "read_partition_device",
    "read_piece",
    "row_group_pieces",
    "side_table",
    "with_side",
]

_T = TypeVar("_T")


class TableSource:
    """In-memory canonical tables presented like a dataset.

    Parameters
    ----------
    tables
        Table name -> :class:`pyarrow.Table` (or anything ``pyarrow.table()`` accepts).  Missing
        canonical tables read as empty.
    tier_map, trace_version
        What a manifest would say (used to choose the default tier map).

    Examples
    --------
    >>> import pyarrow as pa
    >>> src = TableSource({"machine_events": pa.table({"machine_id": pa.array([1], pa.int64())})})
    >>> src.read("machine_events", ["machine_id"]).num_rows
    1
    """

    def __init__(
        self,
        tables: Mapping[str, Any],
        *,
        tier_map: str | None = None,
        trace_version: str | None = None,
        buckets: int | None = None,
    ):
        unknown = sorted(set(tables) - set(SCHEMAS))
        if unknown:
            raise KeyError(f"unknown tables {unknown}; tables are {list(SCHEMAS)}")
        self.tables = {k: v if isinstance(v, pa.Table) else pa.table(v) for k, v in tables.items()}
        self.tier_map_name = tier_map
        self.trace_version = trace_version
        #: ``{table: row offsets of its buckets}`` (``buckets + 1`` offsets) of the bucketed tables
        self._bucket_offsets: dict[str, np.ndarray] = {}
        self.buckets = None if buckets is None else int(buckets)
        if self.buckets is not None:
            for name in list(self.tables):
                if name in KEYS:
                    self.tables[name], self._bucket_offsets[name] = _bucketize(self.tables[name], name, self.buckets)

    def layout(self, table: str) -> dict[str, Any] | None:
        """The table's bucketed layout (as a bucketed dataset's manifest records it), or ``None``."""
        if table not in self._bucket_offsets:
            return None
        return {"key": list(KEYS[table]), "buckets": self.buckets, "hash": HASH_NAME, "order": ORDER[table]}

    def bucket_slices(self, table: str) -> list[pa.Table]:
        """The rows of each bucket of a bucketed table, in bucket order."""
        off, t = self._bucket_offsets[table], self.tables[table]
        return [t.slice(int(off[b]), int(off[b + 1] - off[b])) for b in range(off.shape[0] - 1)]

    def read(self, table: str, columns: Sequence[str] | None = None) -> pa.Table:
        schema = SCHEMAS[table]
        cols = list(columns) if columns is not None else schema.names
        t = self.tables.get(table)
        sub = pa.schema([schema.field(c) for c in cols])
        if t is None:
            return sub.empty_table()
        missing = [c for c in cols if c not in t.column_names]
        if missing:
            raise KeyError(f"in-memory table {table} has no columns {missing}")
        return t.select(cols).cast(sub)

    def num_rows(self, table: str) -> int:
        t = self.tables.get(table)
        return 0 if t is None else t.num_rows


def _bucketize(t: pa.Table, table: str, n: int) -> tuple[pa.Table, np.ndarray]:
    """``t`` with its rows grouped by bucket (in bucket order) and ordered by time inside each
    bucket (stable), and the bucket row offsets: what ``gpuclust optimize`` writes, in memory."""
    keys = [column_to_numpy(t.column(c)) for c in KEYS[table]]
    b = bucket_ids(np, keys, n) if t.num_rows else np.zeros(0, np.int32)
    tcol = column_to_numpy(t.column(ORDER[table])) if ORDER[table] in t.column_names else np.zeros(t.num_rows, np.int64)
    order = np.lexsort((tcol, b))
    off = np.zeros(n + 1, np.int64)
    np.cumsum(np.bincount(b, minlength=n), out=off[1:])
    return t.take(pa.array(order)), off


def as_source(obj: Any) -> Any:
    """A path / :class:`~gpuclust.dataset.Dataset` / dict of tables / source -> a source."""
    from gpuclust.dataset import Dataset

    if isinstance(obj, (str, Path)):
        return Dataset(obj)
    if isinstance(obj, Mapping):
        return TableSource(obj)
    if hasattr(obj, "read"):
        return obj
    raise TypeError(f"cannot read data from {type(obj).__name__}; pass a dataset path, Dataset or dict of tables")


@dataclass(frozen=True)
class Piece:
    """Rows ``[start, stop)`` of one Parquet file, or of an in-memory table slice."""

    start: int
    stop: int
    file: str | None = None
    data: pa.Table | None = None


@dataclass(frozen=True)
class PartitionSpec:
    """One partition of one table: a tuple of pieces (picklable; shipped to dask workers).

    A partition of a bucketed table holds whole ``buckets``: ``grain`` names the key whose groups
    are complete inside it (``"instance"``: every window of an instance it holds), ``side`` the
    pieces of the same buckets of the co-partitioned tables the analyses join with
    (:func:`with_side`).
    """

    table: str
    index: int
    pieces: tuple[Piece, ...]
    grain: str | None = None
    buckets: tuple[int, ...] = ()
    side: tuple[tuple[str, tuple[Piece, ...]], ...] = ()

    @property
    def num_rows(self) -> int:
        return sum(p.stop - p.start for p in self.pieces)


def _units(source: Any, table: str) -> tuple[list[tuple[str | None, int, pa.Table | None]], list[int]]:
    """(file-or-table units with row counts) and the global row-group boundaries."""
    if isinstance(source, TableSource):
        t = source.tables.get(table)
        n = 0 if t is None else t.num_rows
        return [(None, n, t)], [0, n]
    files = source.files(table)
    units: list[tuple[str | None, int, Any | None]] = []
    bounds, off = [0], 0
    for f in files:
        md = open_parquet(f).metadata
        units.append((str(f), md.num_rows, None))
        for g in range(md.num_row_groups):
            off += md.row_group(g).num_rows
            bounds.append(off)
    return units, sorted(set(bounds))


#: Target rows per partition for ``partitions="auto"``.
AUTO_PARTITION_ROWS = 1 << 22


def _snap_cuts(ideal: Sequence[int], bounds: np.ndarray) -> list[int]:
    """Each of the increasing ``ideal`` cuts moved to a row-group boundary of ``bounds`` (sorted,
    at least as many as cuts): the nearest one (the lower on a tie) that keeps the cuts strictly
    increasing and leaves a boundary for every later cut.  Where the nearest boundaries are all
    distinct they are the result; otherwise a partition would start or end inside a row group,
    and a row group shared by two partitions is read and decoded by both."""
    k, nb = len(ideal), int(bounds.shape[0])
    out, lo = [], 0
    for j, c in enumerate(ideal):
        hi = nb - (k - j)  # the last boundary this cut may take
        at = int(np.searchsorted(bounds, c))
        cands = sorted({min(max(x, lo), hi) for x in (at - 1, at)})
        best = min(cands, key=lambda x: abs(int(bounds[x]) - c))
        out.append(int(bounds[best]))
        lo = best + 1
    return out


def plan_partitions(
    source: Any,
    table: str,
    partitions: int | str = 1,
    cut_points: Sequence[int] | None = None,
    multiple_of: int = 1,
    auto_rows: int = AUTO_PARTITION_ROWS,
) -> list[PartitionSpec]:
    """Cut ``table`` of ``source`` into partitions.

    Parameters
    ----------
    partitions
        Number of partitions (ignored when ``cut_points`` is given), or ``"auto"``: about
        ``auto_rows`` (default :data:`AUTO_PARTITION_ROWS`) rows each, rounded up to a multiple of ``multiple_of`` (the
        local engine's thread count, so every thread gets the same share).  Partitions may be empty.
    cut_points
        Global row offsets where partitions start (0 and the row count are implied).
    """
    if layout_key(source, table) is not None and cut_points is None:
        return _plan_buckets(source, table, partitions, multiple_of, auto_rows)
    units, rg_bounds = _units(source, table)
    total = sum(n for _, n, _ in units)
    if partitions == "auto":
        partitions = max(1, -(-total // auto_rows))
        if total >= multiple_of > 1:
            partitions = -(-partitions // multiple_of) * multiple_of
    if not isinstance(partitions, int) or partitions < 1:
        raise ValueError(f"partitions must be an integer >= 1 or 'auto', got {partitions!r}")
    if cut_points is not None:
        cuts = sorted({int(c) for c in cut_points if 0 < int(c) < total})
        edges = [0, *cuts, total]
    else:
        ideal = [round(j * total / partitions) for j in range(partitions + 1)]
        inner = rg_bounds[1:-1]
        if len(inner) >= partitions - 1 and partitions > 1:
            ideal = [0, *_snap_cuts(ideal[1:-1], np.asarray(inner)), total]
        edges = ideal
    specs = []
    offs = np.cumsum([0] + [n for _, n, _ in units])
    for k in range(len(edges) - 1):
        lo, hi = edges[k], edges[k + 1]
        pieces = []
        for (f, n, data), u0 in zip(units, offs[:-1], strict=False):
            s, e = max(lo, int(u0)), min(hi, int(u0) + n)
            if e > s:
                pieces.append(
                    Piece(s - int(u0), e - int(u0), f, None if data is None else data.slice(s - int(u0), e - s))
                )
        specs.append(PartitionSpec(table, k, tuple(pieces)))
    return specs


def layout_key(source: Any, table: str) -> str | None:
    """``"instance"`` / ``"machine"`` when ``table`` of ``source`` is bucketed by that key, else ``None``."""
    fn = getattr(source, "layout", None)
    lay = fn(table) if fn is not None else None
    if not lay:
        return None
    if lay.get("hash") != HASH_NAME:
        raise ValueError(f"{table}: bucket hash {lay.get('hash')!r}, this gpuclust reads {HASH_NAME!r}")
    return key_name(lay["key"])


def copartitioned(source: Any, table: str, other: str) -> bool:
    """True when bucket ``i`` of ``other`` holds exactly the keys of bucket ``i`` of ``table``
    (same key, same bucket count, same hash)."""
    k1, k2 = layout_key(source, table), layout_key(source, other)
    return k1 is not None and k1 == k2 and int(source.layout(table)["buckets"]) == int(source.layout(other)["buckets"])


def bucket_pieces(source: Any, table: str) -> list[list[Piece]]:
    """The pieces (whole Parquet files, or in-memory slices) of each bucket of a bucketed table."""
    if isinstance(source, TableSource):
        return [[Piece(0, t.num_rows, None, t)] if t.num_rows else [] for t in source.bucket_slices(table)]
    return [
        [Piece(0, open_parquet(f).metadata.num_rows, str(f)) for f in files] for files in source.bucket_files(table)
    ]


def _plan_buckets(
    source: Any, table: str, partitions: int | str, multiple_of: int, auto_rows: int = AUTO_PARTITION_ROWS
) -> list[PartitionSpec]:
    """Partitions of whole, consecutive buckets, balanced by rows: ``partitions`` of them (or
    fewer: never more than the buckets; ``"auto"``: about :data:`AUTO_PARTITION_ROWS` rows each,
    rounded up to a multiple of ``multiple_of``)."""
    per = bucket_pieces(source, table)
    rows = np.asarray([sum(p.stop - p.start for p in ps) for ps in per], dtype=np.int64)
    total = int(rows.sum())
    if partitions == "auto":
        partitions = max(1, -(-total // auto_rows))
        if total >= multiple_of > 1:
            partitions = -(-partitions // multiple_of) * multiple_of
    if not isinstance(partitions, int) or partitions < 1:
        raise ValueError(f"partitions must be an integer >= 1 or 'auto', got {partitions!r}")
    # bucket b goes to the partition its row midpoint falls in
    mid = np.cumsum(rows) - rows / 2.0
    part = np.minimum((mid * partitions / max(total, 1)).astype(np.int64), partitions - 1)
    grain = layout_key(source, table)
    specs: list[PartitionSpec] = []
    # part is non-decreasing: its distinct values are where it changes (np.unique imports numpy.ma)
    for k in part[np.flatnonzero(np.r_[True, part[1:] != part[:-1]])]:
        g = [int(b) for b in np.flatnonzero(part == k)]
        specs.append(PartitionSpec(table, len(specs), tuple(p for b in g for p in per[b]), grain, tuple(g)))
    return specs


def whole_instance_plan(
    source: Any,
    table: str,
    specs: list[PartitionSpec],
    names: Sequence[str],
    max_rows: int,
    row_bytes: int | None = None,
    limit: int | None = None,
) -> list[PartitionSpec]:
    """``specs`` for analyses that need every row of an instance in one partition (``names``;
    :attr:`gpuclust.analyses.base.Analysis.whole_instances`): kept when they are buckets of an
    instance-bucketed table (or at most one holds rows); else the table as one partition, for
    every analysis streaming it, whatever partition count was asked for.  A table of more than
    ``max_rows`` rows (what one partition may hold under the memory budget ``limit``, at
    ``row_bytes`` a row: :func:`gpuclust.engine.memory.whole_table_rows`) cannot be processed so:
    a :class:`ValueError` gives the numbers and says to lay it out by instance."""
    if (specs and specs[0].grain is not None) or sum(1 for sp in specs if sp.num_rows) <= 1:
        return specs  # buckets of the table's own key: whole instances (whole collections for collection events)
    total = sum(sp.num_rows for sp in specs)
    if total > max_rows:
        need = "" if row_bytes is None else f" ({total:,} rows x {row_bytes:,} B = {total * row_bytes / 2**30:.1f} GiB)"
        budget = (
            f"{max_rows:,} rows" if limit is None else f"{max_rows:,} rows: half of the {limit / 2**30:.1f} GiB budget"
        )
        raise ValueError(
            f"{', '.join(names)}: needs every row of an instance in one partition, but {table} is not "
            f"bucketed by instance and the whole table{need} is more than one partition may hold "
            f"({budget}); lay the dataset out by instance first (`gpuclust optimize DATASET`), or give "
            "a larger --memory-limit"
        )
    return plan_partitions(source, table, 1)


def with_side(source: Any, specs: Sequence[PartitionSpec], tables: Sequence[str]) -> list[PartitionSpec]:
    """``specs`` (partitions of a bucketed table) with the pieces of their buckets of each
    co-partitioned table in ``tables``."""
    per = {t: bucket_pieces(source, t) for t in tables}
    return [
        PartitionSpec(
            sp.table,
            sp.index,
            sp.pieces,
            sp.grain,
            sp.buckets,
            tuple((t, tuple(p for b in sp.buckets for p in per[t][b])) for t in tables),
        )
        for sp in specs
    ]


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


def column_to_numpy(arr: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """An Arrow column as a contiguous NumPy array; NULL -> NaN (floats) / dtype minimum (ints)."""
    return np.ascontiguousarray(to_numpy(arr))


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
