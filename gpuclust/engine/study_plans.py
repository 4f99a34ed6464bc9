"""How a study's run is planned: each table's partitions, the analyses that need whole instances,
and the groups of analyses a device's memory budget holds at once (:mod:`gpuclust.engine.study`)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from gpuclust.analyses.base import Analysis
from gpuclust.backends import Backend, device_free_bytes
from gpuclust.engine import partition as _partition
from gpuclust.engine.contexts import result_keys
from gpuclust.engine.memory import available_memory
from gpuclust.engine.staging import column_bytes

__all__ = [
    "STUDY_DENSE_SHARE",
    "StudyMemoryError",
    "available_bytes",
    "budget_groups",
    "check_whole_fits",
    "columns_by_table",
    "combined_hold",
    "context_kept",
    "dense_room",
    "row_bytes_of",
    "run_hold",
    "run_in_groups",
    "table_plans",
    "whole_plans",
]

#: ``{table: ([analysis index], [partition])}``
Plans = dict[str, tuple[list[int], list[_partition.PartitionSpec]]]
#: A table's resident groups of pieces (``Study._plan``).
Groups = Callable[[str], list[list[_partition.PartitionSpec]]]


def row_bytes_of(table: str, work: bool = False) -> int:
    """Bytes of a row of ``table`` in backend memory, in the columns the registered analyses read
    (``work``: the most any of them allocates a row in its partial, ``Analysis.row_bytes``)."""
    from gpuclust.analyses.registry import create, names

    ans = [a for n in names() for a in [create(n)] if a.table == table]
    if work:
        return max((int(a.row_bytes) for a in ans), default=0)
    return max(1, column_bytes(table, {c for a in ans for c in (*a.columns, *a.context_columns)}))


def context_kept(contexts: dict[Analysis, Any], a: Analysis) -> bool:
    """Whether a study keeps ``a``'s context (an analysis with unhashable options: never)."""
    try:
        return a in contexts
    except TypeError:
        return False


#: Share of the device's free memory after a persist (a study without a memory budget) that a
#: run's dense accumulators may take there, all its analyses' together (the rest: the resident
#: partitions' partials as they are computed and the merge trees' hold).
STUDY_DENSE_SHARE = 0.1


def available_bytes(backend: Backend) -> int:
    """Free memory of the backend: the device's, or the host's available RAM (no check where
    that is not known)."""
    if backend.name != "cpu":
        return device_free_bytes(backend)
    avail = available_memory()
    return 1 << 62 if avail is None else avail


def dense_room(backend: Backend, room: int | None) -> int:
    """The device bytes a study's run may give its dense accumulators, all its analyses' together:
    ``room`` (what its memory budget leaves, :meth:`gpuclust.engine.study.Study._room`), or
    without a budget :data:`STUDY_DENSE_SHARE` of the device's free memory."""
    return int(STUDY_DENSE_SHARE * available_bytes(backend)) if room is None else room


class StudyMemoryError(MemoryError):
    """A run cannot go out of core: its analyses need a flat table's rows in one piece (whole
    instances) and that table's partitions do not all fit in the memory budget."""


def columns_by_table(ans: Sequence[Analysis]) -> dict[str, set[str]]:
    """The columns ``ans`` read, their contexts' passes included, per table."""
    out: dict[str, set[str]] = {}
    for a in ans:
        out.setdefault(a.table, set()).update(a.columns, a.context_columns)
    return out


def table_plans(ans: Sequence[Analysis], groups: Groups) -> Plans:
    """Per table: the analyses (by index) that read it and one partition per resident group."""
    plans: Plans = {}
    for k, a in enumerate(ans):
        if a.table not in plans:
            specs = [
                _partition.PartitionSpec(a.table, i, tuple(p for s in g for p in s.pieces))
                for i, g in enumerate(groups(a.table))
            ]
            plans[a.table] = ([], specs)
        plans[a.table][0].append(k)
    return plans


def whole_plans(ans: Sequence[Analysis], plans: Plans, groups: Groups) -> Plans:
    """Take the analyses that need whole instances (``Analysis.whole_instances``) out of
    ``plans`` where their table's resident partitions are not whole instance buckets: they run
    over the table's partitions joined into one (index -1)."""
    out: Plans = {}
    for table, (idx, specs) in list(plans.items()):
        need = [k for k in idx if ans[k].whole_instances]
        parts = groups(table)
        # buckets of the table's own key hold whole instances (whole collections for collection events)
        if not need or len(parts) <= 1 or all(s.grain is not None for g in parts for s in g):
            continue
        plans[table] = ([k for k in idx if k not in need], specs)
        if not plans[table][0]:
            del plans[table]
        out[table] = (need, [_partition.PartitionSpec(table, -1, tuple(p for sp in specs for p in sp.pieces))])
    return out


def check_whole_fits(ans: Sequence[Analysis], whole: Plans, streamed: dict[str, set[int]], groups: Groups) -> None:
    """Raise :class:`StudyMemoryError` where a whole-instance plan's table is partly streamed."""
    for table in whole:
        if streamed.get(table):
            raise StudyMemoryError(
                f"{', '.join(ans[k].name for k in whole[table][0])} need(s) every row of an instance in one piece, "
                f"and {len(streamed[table])} of the {len(groups(table))} partitions of {table} (a flat "
                "table: instances spread over its partitions) do not fit in the study's memory budget. Lay the "
                "dataset out by key (`gpuclust optimize DATASET`), or give the study more memory (memory_budget=)"
            )


def budget_groups(n: int, fits: Callable[[list[int]], bool]) -> list[list[int]]:
    """The indices ``0 .. n-1`` in order, in groups that grow while ``fits(group)`` (one that does
    not fit alone is a group of its own).

    >>> budget_groups(5, lambda g: len(g) <= 2)
    [[0, 1], [2, 3], [4]]
    """
    out: list[list[int]] = []
    for k in range(n):
        if out and fits([*out[-1], k]):
            out[-1].append(k)
        else:
            out.append([k])
    return out


def run_in_groups(
    ans: Sequence[Analysis], groups: list[list[int]], run: Callable[[list[Analysis]], dict[str, Any]]
) -> dict[str, Any]:
    """``run`` of each group of ``ans`` (indices, :func:`budget_groups`) in turn, their results
    under the keys a run of all of them has (:func:`gpuclust.engine.contexts.result_keys`)."""
    keys = result_keys(ans)
    out: dict[str, Any] = {}
    for idx in groups:
        sub = [ans[k] for k in idx]
        res = run(sub)
        for k, key in zip(idx, result_keys(sub), strict=True):
            out[keys[k]] = res[key]
    return {key: out[key] for key in keys}


def run_hold(hold: Any, on_host: Sequence[str], ans: Sequence[Analysis], dense: Sequence[Any]) -> dict[str, Any]:
    """A run's ``last_run_hold``: its :class:`~gpuclust.engine.tasks.DeviceHold`'s summary (none:
    nothing held), the analyses ``finalized_on_host`` for want of device memory, and where each
    one's ``dense`` accumulators were (on the device or not)."""
    out: dict[str, Any] = {} if hold is None else hold.summary()
    if on_host:
        out["finalized_on_host"] = list(on_host)
    if any(d is not None for d in dense):
        out["dense"] = {a.label: d.on_device for a, d in zip(ans, dense, strict=True) if d}
    return out


def combined_hold(holds: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The ``last_run_hold`` of a run in groups, from each group's: the largest ``allowance`` and
    ``peak``, every ``merged_on_host``, ``finalized_on_host`` and ``dense`` entry, and ``groups``,
    their number.

    >>> combined_hold([{"allowance": 4, "peak": 1, "merged_on_host": ["a"]}, {"dense": {"b": True}}, {}])
    {'groups': 3, 'allowance': 4, 'peak': 1, 'merged_on_host': ['a'], 'dense': {'b': True}}
    """
    out: dict[str, Any] = {"groups": len(holds)}
    for h in holds:
        for k in ("allowance", "peak"):
            if h.get(k) is not None:
                out[k] = max(out.get(k, 0), h[k])
        for k in ("merged_on_host", "finalized_on_host"):
            if k in h:
                out[k] = [*out.get(k, []), *h[k]]
        if "dense" in h:
            out["dense"] = {**out.get("dense", {}), **h["dense"]}
    return out
