"""Sources and partitions: what the engine reads, and how a table is cut into partitions.

A *source* is anything with ``read(table, columns) -> pyarrow.Table`` (used for analysis
contexts) and, for partitioned reads, either Parquet part files (:class:`gpuclust.dataset.Dataset`)
or in-memory Arrow tables (:class:`TableSource`).

A table is cut at global row offsets ("cut points").  By default the cuts are spread evenly by
rows and snapped to Parquet row-group boundaries when there are enough row groups; explicit cut
points may fall anywhere (a partition then reads the row groups it overlaps and slices them).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import pyarrow as pa

from gpuclust.arrow_numpy import to_numpy
from gpuclust.dataset import open_parquet
from gpuclust.layout import HASH_NAME, KEYS, ORDER, bucket_ids, key_name
from gpuclust.schema import SCHEMAS

__all__ = [
    "CachingSource",
    "PartitionSpec",
    "Piece",
    "TableSource",
    "as_source",
    "bucket_pieces",
    "column_to_numpy",
    "copartitioned",
    "layout_key",
    "plan_partitions",
    "whole_instance_plan",
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


def column_to_numpy(arr: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """An Arrow column as a contiguous NumPy array; NULL -> NaN (floats) / dtype minimum (ints)."""
    return np.ascontiguousarray(to_numpy(arr))


class CachingSource:
    """A source whose ``read(table, columns)`` results are kept: contexts read side tables once
    per study.  Other attributes (``tier_map_name``, ``files``, ...) are the wrapped source's."""

    def __init__(self, source: Any):
        self.inner = source
        self._reads: dict[tuple[str, tuple[str, ...] | None], pa.Table] = {}

    def read(self, table: str, columns: Sequence[str] | None = None) -> pa.Table:
        key = (table, None if columns is None else tuple(columns))
        t = self._reads.get(key)
        if t is None:
            t = self._reads[key] = self.inner.read(table, columns)
        return t

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)
