"""Run plans: the partitions of each streamed table, and how many rows each holds.

:func:`plan_tables` groups the analyses by the table they stream and cuts each table into partitions
(:func:`gpuclust.engine.partition.plan_partitions`; whole instances for the analyses that need them,
the co-partitioned side tables of a bucketed source); :func:`auto_rows_of` sizes the partitions of
``partitions="auto"`` to the memory budget (:mod:`gpuclust.engine.memory`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from gpuclust.analyses.base import Analysis
from gpuclust.engine import memory as _memory
from gpuclust.engine import partition as _partition

__all__ = ["auto_rows_of", "device_rows_of", "plan_tables"]


def auto_rows_of(ans: Sequence[Analysis], memory_limit: int, in_flight: int, source: Any = None) -> dict[str, int]:
    """Rows per partition of each streamed table so that ``in_flight`` partitions fit the budget
    (:func:`gpuclust.engine.memory.partition_rows`; ``source``: what the analyses may size their
    preference by, see :meth:`gpuclust.analyses.base.Analysis.auto_rows`)."""
    return {
        t: _memory.partition_rows(memory_limit, in_flight, sub, t, _partition.AUTO_PARTITION_ROWS, source)
        for t, sub in _by_table(ans).items()
    }


def device_rows_of(ans: Sequence[Analysis], free: int, in_flight: int, source: Any = None) -> dict[str, int]:
    """Rows per partition of each streamed table on a device with ``free`` bytes
    (:func:`gpuclust.engine.memory.device_partition_rows`; ``source``: the tables' rows, where
    a whole table may be one partition)."""
    rows = (lambda t: None) if source is None else source.num_rows
    return {t: _memory.device_partition_rows(free, in_flight, sub, t, rows(t)) for t, sub in _by_table(ans).items()}


def _by_table(ans: Sequence[Analysis]) -> dict[str, list[Analysis]]:
    """The analyses by the table they stream."""
    by_table: dict[str, list[Analysis]] = {}
    for a in ans:
        by_table.setdefault(a.table, []).append(a)
    return by_table


def plan_tables(
    src: Any,
    ans: Sequence[Analysis],
    partitions: int | str,
    cut_points: dict[str, Sequence[int]] | Sequence[int] | None = None,
    multiple_of: int = 1,
    auto_rows: dict[str, int] | None = None,
    memory_limit: int | None = None,
) -> dict[str, tuple[list[int], list[_partition.PartitionSpec]]]:
    """``{table: (indices of the analyses streaming it, its partitions)}`` (``auto_rows``: the
    rows per partition of ``partitions="auto"`` per table, see :func:`auto_rows_of`;
    ``memory_limit``: the budget a whole table in one partition must fit, for the analyses that
    need whole instances of a table not laid out by instance)."""
    by_table: dict[str, list[int]] = {}
    for k, a in enumerate(ans):
        by_table.setdefault(a.table, []).append(k)
    plans = {}
    for table, idx in by_table.items():
        cp = cut_points.get(table) if isinstance(cut_points, dict) else cut_points
        specs = _partition.plan_partitions(
            src,
            table,
            partitions,
            cp,
            multiple_of=multiple_of,
            auto_rows=(auto_rows or {}).get(table, _partition.AUTO_PARTITION_ROWS),
        )
        whole = [ans[k].label for k in idx if ans[k].whole_instances]
        if whole and memory_limit is not None:
            sub = [ans[k] for k in idx if ans[k].whole_instances]
            specs = _partition.whole_instance_plan(
                src,
                table,
                specs,
                whole,
                _memory.whole_table_rows(memory_limit, sub, table),
                _memory.row_bytes(sub, table),
                memory_limit,
            )
        elif whole:
            rows = (auto_rows or {}).get(table, _partition.AUTO_PARTITION_ROWS)
            specs = _partition.whole_instance_plan(src, table, specs, whole, rows * max(1, multiple_of))
        if specs and specs[0].grain is not None:
            side = sorted({t for k in idx for t in ans[k].side_inputs if _partition.copartitioned(src, table, t)})
            specs = _partition.with_side(src, specs, side)
        plans[table] = (idx, specs)
    return plans
