"""The v3 (2019) source fields: each table's fields and their kinds, the Arrow types they are
parsed into, and the source-field -> canonical-column mapping.

Shared by the JSON reader (:mod:`gpuclust.ingest.readers.v3_json`), the Parquet reader
(:mod:`gpuclust.ingest.readers.v3_parquet`) and the flattening both use
(:mod:`gpuclust.ingest.readers.v3_canonical`), so both formats flatten identically.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa

from gpuclust.schema import (
    CPU_PERCENTILES_SOURCE_ORDER,
    CollectionType,
    EventType,
    MachineEventType,
    MissingDataReason,
    MissingType,
    Scheduler,
    VerticalScaling,
)

INT, FLOAT, STR, BOOL, RES, FLOATS, INTS, CONSTRAINTS = (
    "int",
    "float",
    "str",
    "bool",
    "res",
    "floats",
    "ints",
    "constraints",
)

_RES_TYPE = pa.struct([("cpus", pa.float64()), ("memory", pa.float64())])
_CONSTRAINT_TYPE = pa.struct([("name", pa.string()), ("value", pa.string()), ("relation", pa.string())])
#: Arrow type each kind of source field is parsed into (before ``conform``).
RAW_TYPES: dict[str, pa.DataType] = {
    INT: pa.string(),
    FLOAT: pa.float64(),
    STR: pa.string(),
    BOOL: pa.bool_(),
    RES: _RES_TYPE,
    FLOATS: pa.list_(pa.float64()),
    INTS: pa.list_(pa.string()),
    CONSTRAINTS: pa.list_(_CONSTRAINT_TYPE),
}

_EVENT_COMMON = {
    "time": INT,
    "type": INT,
    "collection_id": INT,
    "scheduling_class": INT,
    "missing_type": INT,
    "collection_type": INT,
    "priority": INT,
    "alloc_collection_id": INT,
}

#: Source fields of each v3 table, in the export's order.
SOURCE_FIELDS: dict[str, dict[str, str]] = {
    "instance_usage": {
        "start_time": INT,
        "end_time": INT,
        "collection_id": INT,
        "instance_index": INT,
        "machine_id": INT,
        "alloc_collection_id": INT,
        "alloc_instance_index": INT,
        "collection_type": INT,
        "average_usage": RES,
        "maximum_usage": RES,
        "random_sample_usage": RES,
        "assigned_memory": FLOAT,
        "page_cache_memory": FLOAT,
        "cycles_per_instruction": FLOAT,
        "memory_accesses_per_instruction": FLOAT,
        "sample_rate": FLOAT,
        "cpu_usage_distribution": FLOATS,
        "tail_cpu_usage_distribution": FLOATS,
    },
    "instance_events": {
        **_EVENT_COMMON,
        "instance_index": INT,
        "machine_id": INT,
        "alloc_instance_index": INT,
        "resource_request": RES,
        "constraint": CONSTRAINTS,
    },
    "collection_events": {
        **_EVENT_COMMON,
        "user": STR,
        "collection_name": STR,
        "collection_logical_name": STR,
        "parent_collection_id": INT,
        "start_after_collection_ids": INTS,
        "max_per_machine": INT,
        "max_per_switch": INT,
        "vertical_scaling": INT,
        "scheduler": INT,
    },
    "machine_events": {
        "time": INT,
        "machine_id": INT,
        "type": INT,
        "switch_id": STR,
        "capacity": RES,
        "platform_id": STR,
        "missing_data_reason": INT,
    },
    "machine_attributes": {"time": INT, "machine_id": INT, "name": STR, "value": STR, "deleted": BOOL},
}

#: canonical column -> (source field, sub-field or None), for the plainly renamed columns.
COLUMN_MAP: dict[str, dict[str, tuple[str, str | None]]] = {
    "instance_usage": {
        **{
            c: (c, None)
            for c in (
                "start_time",
                "end_time",
                "collection_id",
                "instance_index",
                "machine_id",
                "alloc_collection_id",
                "alloc_instance_index",
                "collection_type",
                "sample_rate",
            )
        },
        "avg_cpu": ("average_usage", "cpus"),
        "avg_mem": ("average_usage", "memory"),
        "max_cpu": ("maximum_usage", "cpus"),
        "max_mem": ("maximum_usage", "memory"),
        "sample_cpu": ("random_sample_usage", "cpus"),
        "assigned_mem": ("assigned_memory", None),
        "page_cache_mem": ("page_cache_memory", None),
        "cpi": ("cycles_per_instruction", None),
        "mai": ("memory_accesses_per_instruction", None),
    },
    "instance_events": {
        **{c: (c, None) for c in (*_EVENT_COMMON, "instance_index", "machine_id", "alloc_instance_index")},
        "req_cpu": ("resource_request", "cpus"),
        "req_mem": ("resource_request", "memory"),
    },
    "collection_events": {
        c: (c, None)
        for c in (
            *_EVENT_COMMON,
            "user",
            "collection_name",
            "collection_logical_name",
            "parent_collection_id",
            "max_per_machine",
            "max_per_switch",
            "vertical_scaling",
            "scheduler",
        )
    },
    "machine_events": {
        **{c: (c, None) for c in ("time", "machine_id", "type", "switch_id", "platform_id", "missing_data_reason")},
        "cap_cpu": ("capacity", "cpus"),
        "cap_mem": ("capacity", "memory"),
    },
    "machine_attributes": {c: (c, None) for c in ("time", "machine_id", "name", "value", "deleted")},
}

_EVENT_ENUMS: dict[str, type[Any]] = {
    "type": EventType,
    "missing_type": MissingType,
    "collection_type": CollectionType,
}
#: Enum fields whose names are accepted in place of their codes, per source table.
ENUMS: dict[str, dict[str, type[Any]]] = {
    "instance_usage": {"collection_type": CollectionType},
    "instance_events": dict(_EVENT_ENUMS),
    "collection_events": {**_EVENT_ENUMS, "vertical_scaling": VerticalScaling, "scheduler": Scheduler},
    "machine_events": {"type": MachineEventType, "missing_data_reason": MissingDataReason},
    "machine_attributes": {},
}

_CPU_DIST_LEVELS = CPU_PERCENTILES_SOURCE_ORDER[:11]
_TAIL_DIST_LEVELS = CPU_PERCENTILES_SOURCE_ORDER[11:]


def raw_schema(source_table: str) -> pa.Schema:
    """The Arrow schema v3 records of ``source_table`` are parsed into before ``conform``."""
    return pa.schema([pa.field(k, RAW_TYPES[kind]) for k, kind in SOURCE_FIELDS[source_table].items()])
