"""The v2 (2011) tables' columns as canonical columns: one mapper per table from the raw string
columns (by v2 field name) to the canonical ones, v2 codes translated by :func:`parse_code`."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from gpuclust.ingest import arrays
from gpuclust.schema import (
    NO_ALLOC_COLLECTION,
    NO_ALLOC_INDEX,
    V2_EVENT_TYPE_TO_V3,
    V2_MACHINE_EVENT_TO_V3,
    V2_MISSING_TYPE_TO_V3,
    CollectionType,
)

__all__ = ["MAPPERS", "V2_RELATION_TO_V3", "parse_code"]

#: v2 comparison operators 0-3 (EQUAL, NOT_EQUAL, LESS_THAN, GREATER_THAN) are the v3 codes.
V2_RELATION_TO_V3 = np.arange(4, dtype=np.int8)

_INT_TEXT = r"^[+-]?[0-9]{1,18}$"


def parse_code(
    arr: pa.Array,
    code_map: np.ndarray,
    col: str,
    what: str,
    bad: np.ndarray,
    why: list[str | None],
) -> pa.Array:
    """Translate a string column of v2 codes through ``code_map`` (index = v2 code).

    NULL stays NULL.  Text that is not an integer, or a code outside ``0..len(code_map)-1``,
    marks the row bad with a reason (the first reason per row is kept).
    """
    stripped = pc.utf8_trim_whitespace(arr)
    ok = pc.match_substring_regex(stripped, _INT_TEXT)
    valid = arrays.valid(stripped)
    okn = arrays.values(ok, fill=False)
    notint = valid & ~okn
    ints = pc.cast(pc.if_else(ok, stripped, pa.nulls(1, pa.string())[0]), pa.int64())
    v = arrays.values(ints)  # (read only where isint: not NULL there)
    isint = valid & okn
    oor = isint & ((v < 0) | (v >= len(code_map)))
    good = isint & ~oor
    if notint.any() or oor.any():
        texts = arr.to_pylist()
        for i in np.flatnonzero((notint | oor) & ~bad):
            if notint[i]:
                why[i] = f"column {col}: cannot read {texts[i]!r} as a v2 {what} code"
            else:
                why[i] = f"column {col}: v2 {what} code {int(v[i])} outside 0..{len(code_map) - 1}"
        bad |= notint | oor
    mapped = code_map[np.where(good, v, 0)].astype(np.int8)
    return arrays.from_numpy(mapped, pa.int8(), mask=~good)


def _const(value: int, typ: pa.DataType, n: int) -> pa.Array:
    return arrays.from_numpy(np.full(n, value), typ)


# ---------------------------------------------------------------------------------------------
# Per-table mapping: raw string columns (by v2 field name) -> canonical columns
# ---------------------------------------------------------------------------------------------

_Mapper = Callable[[dict[str, pa.Array], int, np.ndarray, list], dict[str, pa.Array]]


def _map_task_usage(r: dict[str, pa.Array], n: int, bad: np.ndarray, why: list) -> dict[str, pa.Array]:
    return {
        "start_time": r["start time"],
        "end_time": r["end time"],
        "collection_id": r["job ID"],
        "instance_index": r["task index"],
        "machine_id": r["machine ID"],
        "alloc_collection_id": _const(NO_ALLOC_COLLECTION, pa.int64(), n),
        "alloc_instance_index": _const(NO_ALLOC_INDEX, pa.int32(), n),
        "collection_type": _const(CollectionType.JOB, pa.int8(), n),
        "avg_cpu": r["CPU rate"],
        "avg_mem": r["canonical memory usage"],
        "assigned_mem": r["assigned memory usage"],
        "page_cache_mem": r["total page cache"],
        "max_mem": r["maximum memory usage"],
        "max_cpu": r["maximum CPU rate"],
        "cpi": r["cycles per instruction"],
        "mai": r["memory accesses per instruction"],
        # v2 sampled at a nominal 1 Hz: the portion of expected samples = samples per second.
        "sample_rate": r["sample portion"],
        "sample_cpu": r["sampled CPU usage"],
    }


def _map_task_events(r: dict[str, pa.Array], n: int, bad: np.ndarray, why: list) -> dict[str, pa.Array]:
    return {
        "time": r["time"],
        "type": parse_code(r["event type"], V2_EVENT_TYPE_TO_V3, "event type", "event type", bad, why),
        "collection_id": r["job ID"],
        "scheduling_class": r["scheduling class"],
        "missing_type": parse_code(r["missing info"], V2_MISSING_TYPE_TO_V3, "missing info", "missing info", bad, why),
        "collection_type": _const(CollectionType.JOB, pa.int8(), n),
        "priority": r["priority"],
        "alloc_collection_id": _const(NO_ALLOC_COLLECTION, pa.int64(), n),
        "instance_index": r["task index"],
        "machine_id": r["machine ID"],  # empty -> NO_MACHINE (0) via NULL_MEANS
        "alloc_instance_index": _const(NO_ALLOC_INDEX, pa.int32(), n),
        "req_cpu": r["CPU request"],
        "req_mem": r["memory request"],
    }


def _map_job_events(r: dict[str, pa.Array], n: int, bad: np.ndarray, why: list) -> dict[str, pa.Array]:
    return {
        "time": r["time"],
        "type": parse_code(r["event type"], V2_EVENT_TYPE_TO_V3, "event type", "event type", bad, why),
        "collection_id": r["job ID"],
        "scheduling_class": r["scheduling class"],
        "missing_type": parse_code(r["missing info"], V2_MISSING_TYPE_TO_V3, "missing info", "missing info", bad, why),
        "collection_type": _const(CollectionType.JOB, pa.int8(), n),
        # priority: v2 jobs carry none (it is a task field) -> NULL
        "user": r["user"],
        "collection_name": r["job name"],
        "collection_logical_name": r["logical job name"],
    }


def _map_machine_events(r: dict[str, pa.Array], n: int, bad: np.ndarray, why: list) -> dict[str, pa.Array]:
    return {
        "time": r["time"],
        "machine_id": r["machine ID"],
        "type": parse_code(r["event type"], V2_MACHINE_EVENT_TO_V3, "event type", "machine event type", bad, why),
        "platform_id": r["platform ID"],
        "cap_cpu": r["CPUs"],
        "cap_mem": r["Memory"],
    }


def _map_machine_attributes(r: dict[str, pa.Array], n: int, bad: np.ndarray, why: list) -> dict[str, pa.Array]:
    return {
        "time": r["time"],
        "machine_id": r["machine ID"],
        "name": r["attribute name"],
        "value": r["attribute value"],
        "deleted": r["attribute deleted"],
    }


def _map_task_constraints(r: dict[str, pa.Array], n: int, bad: np.ndarray, why: list) -> dict[str, pa.Array]:
    return {
        "time": r["time"],
        "collection_id": r["job ID"],
        "instance_index": r["task index"],
        "relation": parse_code(
            r["comparison operator"], V2_RELATION_TO_V3, "comparison operator", "comparison operator", bad, why
        ),
        "name": r["attribute name"],
        "value": r["attribute value"],
    }


MAPPERS: dict[str, _Mapper] = {
    "task_usage": _map_task_usage,
    "task_events": _map_task_events,
    "job_events": _map_job_events,
    "machine_events": _map_machine_events,
    "machine_attributes": _map_machine_attributes,
    "task_constraints": _map_task_constraints,
}
