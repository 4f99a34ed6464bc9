"""The analysis protocol, and the partial shapes analyses are built from.

An analysis is declared **once**, as a small frozen dataclass (never a CPU class and a GPU class):

``name``, ``table``, ``columns``
    What it is called, which canonical table it streams, and which columns it reads (column
    pruning; several analyses over the same table share one read per partition).
``prerequisites(source) -> {name: Analysis}``
    Passes over the data that must run before the context (cpi's machine x 5-minute load): the
    engine runs them first, with the user's backend, partitions and scheduler (in a study, over
    its resident columns), and hands their finalized results to ``context`` as ``prior``.  No
    analysis runs the engine itself.  ``context_columns`` names the columns of :attr:`table`
    those passes read (a study keeps them resident).
``context(source[, prior]) -> ctx``
    Small inputs computed once on the client (cell capacity, tier map, ...; never anything
    proportional to the data).  ``source`` is anything with ``read(table, columns) ->
    pyarrow.Table`` plus ``tier_map_name`` / ``trace_version`` (a
    :class:`gpuclust.dataset.Dataset` or :class:`gpuclust.engine.TableSource`); ``prior`` (only
    for an analysis with prerequisites) maps each prerequisite's name to its result tables.
``side_inputs`` and ``bind(ctx, side, grain) -> ctx``
    Per-instance side inputs (a priority lookup from instance_events, ...): ``side_inputs``
    names the tables and columns, ``bind`` builds what the partial needs from ``side`` (``{table:
    SideTable}``, see :class:`gpuclust.engine.partition.SideTable`: ``batches(columns)`` /
    ``read(columns)``).  When the dataset's layout co-partitions them with :attr:`table`
    (docs/scale.md), the engine calls ``bind`` in each partition task with the rows of that
    partition's buckets and ``grain="instance"`` (the partition then holds every row of each
    instance it holds, so per-instance groups are complete in it); otherwise once on the client
    with the whole tables and ``grain=None``.  Nothing proportional to the data is then built on
    the client or shipped in a task graph for a bucketed dataset.
``empty(backend)``
    The merge identity.
``partial(cols, ctx, backend)``
    The partial result of one partition.  ``cols`` maps column name -> 1-D ``backend.xp`` array;
    NULLs arrive as NaN (float columns) or the dtype's minimum (integer columns, see
    :func:`null_int`).  Only ``backend.xp`` and ``backend.ops`` may be used.
``merge(a, b)``
    Combine two partials.  Partials are small and *host-resident*: the engine moves each
    partition's partial to NumPy (:func:`to_host`) before it is merged or crosses workers, so
    ``merge`` works on NumPy arrays.  It must be associative and commutative (up to float
    rounding: float sums are not bitwise order-invariant).
``finalize(partial, ctx) -> dict[str, pandas.DataFrame]``
    Named result tables.

``parted`` tables (results that grow with the data, e.g. a row per machine x bucket)
    Not finalized whole: ``split`` separates a partial's keyed partials from the rest; the engine
    spills each partition's keyed partials, merges the rest by its tree, then reduces the keyed
    partials one *shard* (``shards``, ``key_range``) at a time with ``finalize_shard``, writing
    each shard's rows as one Parquet part, and ends with ``finalize_parted`` (streams the parted
    tables for summaries).  ``finalize`` of such an analysis is the same in memory
    (:func:`gpuclust.parted.finalize_in_memory`).  See :mod:`gpuclust.parted`.

Partial shapes: *dense* (fixed-shape arrays when the key space is known) merge elementwise;
*keyed* (sorted unique int64 keys + value arrays) merge by concatenate + group
(:func:`keyed_reduce` / :func:`merge_keyed`); moments merge as ``(n, mean, M2)``
(:func:`merge_moments`), never as raw sums of squares.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
import pandas as pd

from gpuclust.schema import DEFAULT_TIER_MAP, TierMap, tier_map

__all__ = [
    "Analysis",
    "fmt",
    "is_null_int",
    "keyed_reduce",
    "merge_keyed",
    "merge_moments",
    "null_int",
    "resolve_tier_map",
    "to_host",
]


def resolve_tier_map(explicit: str | None, source: Any) -> TierMap:
    """The tier map an analysis uses: its own option, else the dataset manifest's, else the
    default of the dataset's trace version (``schema.DEFAULT_TIER_MAP``)."""
    if explicit is not None:
        return tier_map(explicit)
    name = getattr(source, "tier_map_name", None)
    if name:
        return tier_map(name)
    return tier_map(DEFAULT_TIER_MAP.get(getattr(source, "trace_version", None) or "v3", "notebook"))


def fmt(v: Any, spec: str = ".4g", scale: float = 1.0, unit: str = "") -> str:
    """A number for a summary line; NULL / NaN (not measured) prints as ``unknown``, never as 0
    or ``nan`` (docs/dataset.md, "Result tables: names and missing values")."""
    try:
        x = float(v)
    except (TypeError, ValueError):
        return "unknown"
    if x != x:
        return "unknown"
    return f"{x * scale:{spec}}{unit}"


def null_int(dtype: Any) -> int:
    """The value that stands for NULL in an integer column handed to ``partial`` (dtype minimum)."""
    return int(np.iinfo(np.dtype(dtype)).min)


def is_null_int(xp: Any, a: Any) -> Any:
    """Boolean mask of NULLs in an integer column (see :func:`null_int`)."""
    return a == xp.asarray(null_int(a.dtype), dtype=a.dtype)


def to_host(obj: Any) -> Any:
    """Recursively copy device arrays in dicts / lists / tuples to NumPy (other values unchanged)."""
    if isinstance(obj, dict):
        return {k: to_host(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(to_host(v) for v in obj)
    if hasattr(obj, "__cuda_array_interface__") and hasattr(obj, "get"):
        return obj.get()
    return obj


def keyed_reduce(backend: Any, key: Any, sums: dict[str, Any], counts: dict[str, Any] | None = None) -> dict[str, Any]:
    """Group by ``key``: sorted unique keys, float64 sums of ``sums`` and int64 sums of ``counts``.

    ``sums`` values are float arrays (NaN ignored, as SQL's SUM ignores NULL); ``counts`` values
    are integer arrays (a weight per row).  Returns ``{"key": ..., **sums, **counts}``.
    """
    xp, ops = backend.xp, backend.ops
    n_rows = int(key.shape[0])
    if n_rows:
        kmin, kmax = int(key.min()), int(key.max())
        span = kmax - kmin + 1
        if span <= max(4 * n_rows, 1 << 16):
            # Compact key range (e.g. hour x tier): dense sums by bincount, O(n), no sort.
            # Same per-bin summation order as the sorted path below, so results are identical.
            off = xp.ascontiguousarray((key - kmin).astype(xp.int64))
            cnt = xp.bincount(off, minlength=span)
            present = xp.nonzero(cnt)[0]
            out = {"key": (present + kmin).astype(xp.int64)}
            for name, v in sums.items():
                out[name] = ops.grouped_sum(off, xp.ascontiguousarray(v), n_groups=span)[present]
            for name, c in (counts or {}).items():
                dense = cnt if c is None else xp.bincount(off, weights=c.astype(xp.float64), minlength=span).round()
                out[name] = dense[present].astype(xp.int64)
            return out
    uniq, inv = xp.unique(key, return_inverse=True)
    inv = xp.ascontiguousarray(inv.reshape(-1).astype(xp.int64))
    n = int(uniq.shape[0])
    out = {"key": uniq.astype(xp.int64)}
    for name, v in sums.items():
        out[name] = ops.grouped_sum(inv, xp.ascontiguousarray(v), n_groups=n)
    for name, c in (counts or {}).items():
        out[name] = xp.bincount(inv, weights=None, minlength=n).astype(xp.int64) if c is None else (
            xp.bincount(inv, weights=c.astype(xp.float64), minlength=n).round().astype(xp.int64))
    return out


def _sorted_unique(k: np.ndarray) -> bool:
    return bool(k.shape[0] < 2 or (k[1:] > k[:-1]).all())


def merge_keyed(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Merge two host keyed partials (same fields): one row per key, float fields summed (NaN
    ignored, as SQL's SUM), integer fields summed exactly; keys sorted.

    Partials from :func:`keyed_reduce` (and merges of them) have sorted unique keys; two such are
    merged in O(n + m log n) by inserting the new keys (no sort); anything else is grouped by
    concatenate + unique.  Both paths give the same sums (``a + b`` per shared key).
    """

    if a["key"].shape[0] == 0:
        return {k: v.copy() for k, v in b.items()}
    if b["key"].shape[0] == 0:
        return {k: v.copy() for k, v in a.items()}
    ka, kb = a["key"].astype(np.int64, copy=False), b["key"].astype(np.int64, copy=False)
    if _sorted_unique(ka) and _sorted_unique(kb):
        pos = np.searchsorted(ka, kb)
        hit = (pos < ka.shape[0]) & (ka[np.minimum(pos, ka.shape[0] - 1)] == kb)
        new = ~hit
        key = np.insert(ka, pos[new], kb[new])
        at = np.searchsorted(key, kb[hit])  # where b's shared keys landed
        out: dict[str, np.ndarray] = {"key": key}
        for k in a:
            if k == "key":
                continue
            va, vb = a[k], b[k]
            if va.dtype.kind == "f":
                va, vb = np.nan_to_num(va, nan=0.0), np.nan_to_num(vb, nan=0.0)
                va, vb = va.astype(np.float64, copy=False), vb.astype(np.float64, copy=False)
            v = np.insert(va, pos[new], vb[new], axis=0)
            v[at] += vb[hit]
            out[k] = v
        return out
    return _group_keyed({k: np.concatenate([a[k], b[k]]) for k in a})


def _group_keyed(cat: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Group concatenated keyed rows by key: float fields summed (NaN ignored), integers exactly."""
    from gpuclust.backends import get_backend

    fsum = {k: v for k, v in cat.items() if k != "key" and v.dtype.kind == "f"}
    isum = {k: v for k, v in cat.items() if k != "key" and v.dtype.kind in "iu"}
    uniq, inv = np.unique(cat["key"], return_inverse=True)
    inv = inv.reshape(-1).astype(np.int64)
    n = uniq.shape[0]
    ops = get_backend("cpu").ops
    out = {"key": uniq.astype(np.int64)}
    for k, v in fsum.items():
        out[k] = ops.grouped_sum(inv, v, n_groups=n)
    for k, v in isum.items():
        acc = np.zeros(n, dtype=v.dtype)
        np.add.at(acc, inv, v)
        out[k] = acc
    return out


def merge_moments(a: tuple[Any, Any, Any], b: tuple[Any, Any, Any]) -> tuple[Any, Any, Any]:
    """Merge ``(n, mean, M2)`` moment triples (Chan et al.); works elementwise on arrays.

    Examples
    --------
    >>> n, mean, m2 = merge_moments((2, 1.5, 0.5), (1, 3.0, 0.0))
    >>> (n, mean, round(m2 / n, 6))
    (3, 2.0, 0.666667)
    """
    na, ma, m2a = a
    nb, mb, m2b = b
    n = na + nb
    with np.errstate(invalid="ignore", divide="ignore"):
        delta = mb - ma
        wb = np.where(n > 0, nb / np.where(n > 0, n, 1), 0.0)
        mean = ma + delta * wb
        m2 = m2a + m2b + delta * delta * na * wb
    if np.ndim(mean) == 0:
        return n, float(mean), float(m2)
    return n, mean, m2


@dataclass(frozen=True)
class Analysis:
    """Base class of every analysis (see the module docstring for the protocol)."""

    name: ClassVar[str] = ""
    table: ClassVar[str] = ""
    #: Tables without which the analysis has nothing to compute (``gpuclust analyze`` refuses a
    #: dataset that lacks one); :attr:`table` is one of them unless listed as optional.
    requires: ClassVar[tuple[str, ...]] = ()
    #: Tables it reads when present; a dataset without one gets a note, not an error.
    optional_tables: ClassVar[tuple[str, ...]] = ()
    #: Peak bytes its partial allocates per streamed row (measured: ``tracemalloc`` over 10^6
    #: windows, NumPy backend; sizes partitions to a memory budget, see gpuclust/engine/memory.py).
    row_bytes: ClassVar[int] = 512
    #: Result tables that grow with the data (a row per machine x bucket, ...), written part by
    #: part (:mod:`gpuclust.parted`): an analysis listing any implements :meth:`split`,
    #: :meth:`shards`, :meth:`key_range`, :meth:`finalize_shard` and :meth:`finalize_parted`.
    parted: ClassVar[tuple[str, ...]] = ()
    #: Keyed partials of :meth:`split` that hold disjoint *rows* (sorted, possibly repeated keys;
    #: e.g. finished groups): a shard concatenates them in partition order instead of summing.
    keyed_rows: ClassVar[tuple[str, ...]] = ()

    @property
    def columns(self) -> tuple[str, ...]:
        """Columns of :attr:`table` that :meth:`partial` reads."""
        raise NotImplementedError

    @property
    def context_columns(self) -> tuple[str, ...]:
        """Columns of :attr:`table` that the :meth:`prerequisites` passes read."""
        return ()

    def prerequisites(self, source: Any) -> dict[str, Analysis]:
        """Passes the engine runs before :meth:`context` (their results arrive as its ``prior``);
        default: none."""
        return {}

    def context(self, source: Any) -> Any:
        """Small inputs computed once on the client (not proportional to the data); default: none."""
        return None

    @property
    def side_inputs(self) -> dict[str, tuple[str, ...]]:
        """``{table: columns}`` of the per-instance side inputs :meth:`bind` reads; default: none."""
        return {}

    def bind(self, ctx: Any, side: dict[str, Any], grain: str | None) -> Any:
        """The context a partial runs with, given the side-input rows (see the module docstring);
        default: ``ctx`` unchanged."""
        return ctx

    def empty(self, backend: Any = None) -> Any:
        raise NotImplementedError

    def partial(self, cols: dict[str, Any], ctx: Any, backend: Any) -> Any:
        raise NotImplementedError

    def merge(self, a: Any, b: Any) -> Any:
        raise NotImplementedError

    def finalize(self, partial: Any, ctx: Any) -> dict[str, pd.DataFrame]:
        raise NotImplementedError

    # ------------------------------------------------ parted results (only with ``parted`` tables)
    def split(self, partial: Any) -> tuple[Any, dict[str, dict[str, np.ndarray]]]:
        """``(rest, keyed)``: a host partial's small part (merged by the engine's tree) and its keyed
        partials (``{name: {"key": sorted unique int64, field: values}}``), which are spilled per
        partition and reduced one shard at a time."""
        raise NotImplementedError

    def shards(self, ctx: Any, rest: Any) -> list[tuple[int, int]]:
        """The shards: ranges ``[lo, hi)`` of a coordinate the keys are ordered by (machine code,
        ...), each small enough to finalize in memory; at least one (``rest``: the merged small
        part of :meth:`split`, e.g. a sample of the keys to place the boundaries)."""
        raise NotImplementedError

    def key_range(self, ctx: Any, name: str, lo: int, hi: int) -> tuple[int, int]:
        """The keys ``[first, end)`` of keyed partial ``name`` in shard ``[lo, hi)``."""
        raise NotImplementedError

    def merge_rest(self, a: Any, b: Any) -> Any:
        """Merge two ``rest`` parts of :meth:`split`."""
        raise NotImplementedError

    def client_partial(self, ctx: Any) -> Any:
        """A partial computed on the client by :meth:`bind` (a flat source), merged with the
        partitions' before shards are reduced; default: none."""
        return None

    def finalize_shard(self, keyed: dict[str, dict[str, np.ndarray]], rest: Any, ctx: Any, lo: int,
                       hi: int) -> tuple[dict[str, Any], Any]:
        """The rows of the parted tables for shard ``[lo, hi)`` (``keyed``: the merged keyed
        partials of its key ranges; ``rest``: the merged small part) and a small *extra* that
        :meth:`finalize_parted` gets (one per shard, in shard order).  A table's rows are a
        DataFrame or an iterator of DataFrames (each written as a row group as it comes, so a
        shard need not hold all its rows); the extra may be completed while they are consumed."""
        raise NotImplementedError

    def finalize_parted(self, rest: Any, ctx: Any, tables: dict[str, Any], extras: list[Any]) -> dict[str, pd.DataFrame]:
        """The result tables other than the parted ones, given those (``tables``: a
        :class:`gpuclust.parted.PartedTable` or :class:`gpuclust.parted.FrameParts` each, to be
        read by batches) and the shards' extras."""
        raise NotImplementedError

    def summary(self, result: dict[str, pd.DataFrame]) -> str:
        """A short human-readable summary of a finalized result."""
        lines = [f"{self.name}:"]
        for tname, df in result.items():
            lines.append(f"  {tname}: {len(df)} rows, columns {list(df.columns)}")
        return "\n".join(lines)

    @property
    def label(self) -> str:
        """Name plus non-default options, e.g. ``cell-usage[mode=exact]`` (derived from the option
        fields, see :func:`gpuclust.analyses.options.label_of`)."""
        from gpuclust.analyses.options import label_of

        return label_of(self)
