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
    SideTable}``, see :class:`gpuclust.engine.reading.SideTable`: ``batches(columns)`` /
    ``read(columns)``).  When the dataset's layout co-partitions them with :attr:`table`
    (docs/user/scale.md), the engine calls ``bind`` in each partition task with the rows of that
    partition's buckets and ``grain="instance"`` (the partition then holds every row of each
    instance it holds, so per-instance groups are complete in it); otherwise once on the client
    with the whole tables and ``grain=None``.  Nothing proportional to the data is then built on
    the client or shipped in a task graph for a bucketed dataset.
``partial(cols, ctx, backend)``
    The partial result of one partition.  ``cols`` maps column name -> 1-D ``backend.xp`` array;
    NULLs arrive as NaN (float columns) or the dtype's minimum (integer columns, see
    :func:`null_int`).  Only ``backend.xp`` and ``backend.ops`` may be used.
``kinds``
    How the partial merges, declared field by field (a :class:`gpuclust.analyses.kinds.Fields`
    of :class:`~gpuclust.analyses.kinds.Sum`, :class:`~gpuclust.analyses.kinds.Keyed`,
    :class:`~gpuclust.analyses.kinds.Merged`, ...): the engine merges, splits and shards
    partials from it, so no analysis writes a merge; the kinds also declare the merge identity
    (shapes, dtypes), so :meth:`Analysis.empty` is derived too.  Partials are *host-resident*
    when merged: the engine moves each partition's partial to NumPy (:func:`to_host`) before it
    is merged or crosses workers.  Every kind's merge is associative and commutative (up to
    float rounding: float sums are not bitwise order-invariant).
``finalize(partial, ctx) -> dict[str, pandas.DataFrame]``
    Named result tables.

``parted`` tables (results that grow with the data, e.g. a row per machine x bucket)
    Not finalized whole: the partial's *sharded* keyed partials (a ``Keyed`` with ``per``: keys
    per shard coordinate) are spilled per partition while the rest merges by the tree; the
    engine then reduces them one *shard* (ranges of the coordinate, cut as ``kinds.shard_by``
    declares: :class:`~gpuclust.analyses.kinds.Even`, ...) at a time with
    ``finalize_shard``, writing each shard's rows as one Parquet part, and ends with
    ``finalize_parted`` (streams the parted tables for summaries).  ``finalize`` of such an
    analysis is the same in memory (:func:`gpuclust.parted.finalize_in_memory`).  See
    :mod:`gpuclust.parted`.

Partial shapes and their merges (:func:`gpuclust.partials.keyed_reduce`,
:func:`gpuclust.partials.merge_keyed`, moments as ``(n, mean, M2)`` or
:class:`gpuclust.partials.Moments`, never raw sums of squares) live in :mod:`gpuclust.partials`;
the kinds that declare them in :mod:`gpuclust.analyses.kinds`.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from gpuclust._lazy import pandas as pd
from gpuclust.analyses.options import Relation, check_options, with_parameters_doc

if TYPE_CHECKING:
    from gpuclust.analyses.kinds import Fields

__all__ = [
    "Analysis",
    "fmt",
    "host_or_device",
    "is_null_int",
    "nan_sum",
    "null_int",
    "to_host",
]


def fmt(v: Any, spec: str = ".4g", scale: float = 1.0, unit: str = "") -> str:
    """A number for a summary line; NULL / NaN (not measured) prints as ``unknown``, never as 0
    or ``nan`` (docs/user/dataset.md, "Result tables: names and missing values")."""
    try:
        x = float(v)
    except (TypeError, ValueError):
        return "unknown"
    if x != x:
        return "unknown"
    return f"{x * scale:{spec}}{unit}"


def nan_sum(v: Any) -> float:
    """SQL ``SUM``: the sum of the values that are not NaN (NULL); NaN when there is none
    (pandas' ``sum(min_count=1)``).

    >>> nan_sum(np.array([1.0, np.nan, 2.0])), nan_sum(np.array([np.nan]))
    (3.0, nan)
    """
    v = np.asarray(v, dtype=np.float64)
    ok = ~np.isnan(v)
    return float(np.where(ok, v, 0.0).sum()) if ok.any() else float("nan")  # pandas' summation order


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


def colocated(a: Any, b: Any) -> tuple[Any, Any]:
    """``a`` and ``b`` (arrays, or dicts of them; :func:`host_or_device` each) on one module to
    merge: where they are when every non-empty array of both is on the host, or every one on the
    device; else both on the host (an empty array, a merge identity's, does not count).

    >>> a, b = colocated([1.0, 2.0], {"k": np.zeros(0)})
    >>> type(a).__name__, type(b["k"]).__name__
    ('ndarray', 'ndarray')
    """
    a, b = ({k: host_or_device(v) for k, v in x.items()} if isinstance(x, dict) else host_or_device(x) for x in (a, b))
    values = [v for x in (a, b) for v in (x.values() if isinstance(x, dict) else (x,))]
    places = {hasattr(v, "__cuda_array_interface__") for v in values if int(getattr(v, "size", 1))}
    return (to_host(a), to_host(b)) if len(places) > 1 else (a, b)


def host_or_device(v: Any) -> Any:
    """``v`` as a NumPy array, unless it is a device array (left where it is): the fields of a
    sharded keyed partial that a split hands to the shards, which may still be on the device
    (:attr:`Analysis.device_partial`)."""
    return v if hasattr(v, "__cuda_array_interface__") else np.asarray(v)


@dataclass(frozen=True)
class Analysis:
    """Base class of every analysis (see the module docstring for the protocol)."""

    name: ClassVar[str] = ""
    table: ClassVar[str] = ""
    #: Tables without which the analysis has nothing to compute, whatever its options
    #: (``gpuclust analyze`` refuses a dataset that lacks one); :attr:`table` is one of them
    #: unless listed as optional.
    requires: ClassVar[tuple[str, ...]] = ()
    #: Tables it reads when present, or that only some options read (:meth:`needed_tables` says
    #: which, per instance); a dataset without one gets a note, not an error.
    optional_tables: ClassVar[tuple[str, ...]] = ()
    #: ``{table: the options that read it}`` for the tables only some options read (the "reads"
    #: column of the capability table, :func:`gpuclust.analyses.registry.capability_table`).
    table_uses: ClassVar[dict[str, str]] = {}
    #: Peak bytes its partial allocates per streamed row (measured: ``tracemalloc`` over 10^6
    #: windows, NumPy backend; sizes partitions to a memory budget, see gpuclust/engine/memory.py).
    row_bytes: ClassVar[int] = 512
    #: Result tables that grow with the data (a row per machine x bucket, ...), written part by
    #: part (:mod:`gpuclust.parted`): an analysis listing any declares their keyed partials
    #: sharded in :attr:`kinds` (with their ``shard_by``) and implements :meth:`finalize_shard`
    #: and :meth:`finalize_parted`.
    parted: ClassVar[tuple[str, ...]] = ()
    #: Whether :meth:`partial` needs every row of each instance it sees (per-instance sequences,
    #: e.g. ``lifecycle``): the engine then streams :attr:`table` by the buckets of an
    #: instance-bucketed dataset, or as one partition of a flat one (never cut: see
    #: :func:`gpuclust.engine.partition.whole_instance_plan`).
    whole_instances: ClassVar[bool] = False
    #: Whether :meth:`finalize` takes a partial whose arrays are still in device memory (it moves
    #: to the host what it reads there).  A device run or study keeps such an analysis' partial
    #: on the device when nothing merges it (its table is one partition), instead of copying it
    #: to the host and, for a finalize on the device, back again.  (Any analysis whose every
    #: field merges on the device, :attr:`kinds`' ``merges_on_device``, is merged there while it
    #: fits; without this flag the engine copies the merged partial to the host for finalize.)
    device_partial: ClassVar[bool] = False
    #: Rows per partition it prefers for ``partitions="auto"`` (None: the engine's target; see
    #: :func:`gpuclust.engine.memory.preferred_rows` and :meth:`auto_rows`).
    auto_partition_rows: ClassVar[int | None] = None
    #: Rules between its options (``cpi_min < cpi_max``); each option's own checks are in its
    #: declaration (:func:`gpuclust.analyses.options.option`).
    option_relations: ClassVar[tuple[Relation, ...]] = ()

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """The class docstring gets the ``Parameters`` section of its options (from their
        declarations, :func:`gpuclust.analyses.options.with_parameters_doc`)."""
        super().__init_subclass__(**kwargs)
        with_parameters_doc(cls)

    def __post_init__(self) -> None:
        """Every option checked (and normalized) by its declaration, then the
        :attr:`option_relations` (:func:`gpuclust.analyses.options.check_options`): an analysis
        never checks its options itself."""
        check_options(self)

    def needed_tables(self) -> tuple[dict[str, str], dict[str, str]]:
        """``(required, optional)``: the tables this instance reads *with its options*, each as
        ``{table: what reads it}`` (``""``: the analysis itself).  A dataset lacking a required
        one is refused, an optional one gets a note (:func:`gpuclust.engine.checks.preflight`).
        Default: :attr:`requires` and :attr:`optional_tables`; an analysis whose options decide
        which tables it reads narrows them, so that a table is required only by the options that
        read it (cpi with ``by=cell`` needs no machine_events)."""
        return dict.fromkeys(self.requires, ""), dict.fromkeys(self.optional_tables, "")

    def auto_rows(self, source: Any) -> int | None:
        """Rows per partition it prefers for ``partitions="auto"`` on ``source`` (a dataset or
        in-memory source; ``None``: not known): :attr:`auto_partition_rows` unless the best size
        depends on the data."""
        return self.auto_partition_rows

    @property
    def sharded(self) -> bool:
        """Whether the engine spills the sharded keyed partials of :attr:`kinds` (a ``Keyed`` with
        ``per``) and reduces them by shards (:mod:`gpuclust.engine.shards`): analyses with
        :attr:`parted` tables, and those whose keyed partials grow with the cell but reduce to
        small tables (cpi's machine-cell sums; then :meth:`finalize_shard` returns no rows, only
        its extra)."""
        return bool(self.kinds.sharded)

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
        """The merge identity, from :attr:`kinds` (host arrays; the backend's name as its label)."""
        return self.kinds.empty(backend)

    def partial(self, cols: dict[str, Any], ctx: Any, backend: Any) -> Any:
        raise NotImplementedError

    @property
    def kinds(self) -> Fields:
        """How its partial merges, splits and shards, declared field by field (the engine's only
        way to combine partials; see :mod:`gpuclust.analyses.kinds`)."""
        raise NotImplementedError

    def finalize(self, partial: Any, ctx: Any) -> dict[str, pd.DataFrame]:
        raise NotImplementedError

    # ------------------------------------------------ sharded partials (cut by ``kinds.shard_by``)
    def client_partial(self, ctx: Any) -> Iterable[Any]:
        """Partials computed on the client from what :meth:`bind` bound there (a flat source),
        merged with the partitions' before shards are reduced: chunks whose keyed rows come in
        ascending, disjoint key ranges, so that the engine spills each as it comes (none need be
        whole in memory); default: none."""
        return ()

    def finalize_shard(
        self, keyed: dict[str, dict[str, np.ndarray]], rest: Any, ctx: Any, lo: int, hi: int
    ) -> tuple[dict[str, Any], Any]:
        """The rows of the parted tables for shard ``[lo, hi)`` (``keyed``: the merged keyed
        partials of its key ranges; ``rest``: the merged small part) and a small *extra* that
        :meth:`finalize_parted` gets (one per shard, in shard order).  A table's rows are a
        DataFrame or an iterator of DataFrames (each written as a row group as it comes, so a
        shard need not hold all its rows); the extra may be completed while they are consumed."""
        raise NotImplementedError

    def finalize_parted(
        self, rest: Any, ctx: Any, tables: dict[str, Any], extras: list[Any]
    ) -> dict[str, pd.DataFrame]:
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
