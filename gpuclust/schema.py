"""The canonical gpuclust dataset: Arrow schemas, code tables, sentinels and tier maps.

Everything that names a column, a code or a sentinel lives here, once.  Readers normalise every
source format (v3 JSON / Parquet exports, v2 CSV, the Kaggle layout) to these schemas; analyses
read only these schemas.  ``docs/user/dataset.md`` documents every column (its v2 and v3 source field,
unit, and what NULL means) and is checked against this module by the tests.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

#: Version of the on-disk dataset layout (folders, schemas, manifest keys).
DATASET_FORMAT_VERSION = 1

# --------------------------------------------------------------------------------------------
# Sentinels (v3 spec, "Common techniques" and the proto's Constants enum)
# --------------------------------------------------------------------------------------------
#: Event time 0 means "before the trace window".
TIME_BEFORE_TRACE = 0
#: Event time 2^63-1 means "after the trace window".
TIME_AFTER_TRACE = 2**63 - 1
#: Trace times are microseconds since 600 s before the trace start.
TRACE_OFFSET_US = 600_000_000
NO_MACHINE = 0
DEDICATED_MACHINE = -1
NO_ALLOC_COLLECTION = 0
NO_ALLOC_INDEX = -1
US_PER_S = 1_000_000


class EventType(enum.IntEnum):
    """Instance and collection event types, v3 numbering (the canonical one)."""

    SUBMIT = 0
    QUEUE = 1
    ENABLE = 2
    SCHEDULE = 3
    EVICT = 4
    FAIL = 5
    FINISH = 6
    KILL = 7
    LOST = 8
    UPDATE_PENDING = 9
    UPDATE_RUNNING = 10


#: Events that end a running interval.
TERMINAL_EVENTS = (EventType.EVICT, EventType.FAIL, EventType.FINISH, EventType.KILL, EventType.LOST)


class MachineEventType(enum.IntEnum):
    """Machine event types, v3 numbering."""

    UNKNOWN = 0
    ADD = 1
    REMOVE = 2
    UPDATE = 3


class MissingType(enum.IntEnum):
    """Why a scheduler event was synthesised, v3 numbering."""

    NONE = 0
    SNAPSHOT_BUT_NO_TRANSITION = 1
    NO_SNAPSHOT_OR_TRANSITION = 2
    EXISTS_BUT_NO_CREATION = 3
    TRANSITION_MISSING_STEP = 4
    TOO_MANY_EVENTS = 5


class MissingDataReason(enum.IntEnum):
    """Machine events: why data may be missing (v3 only)."""

    NONE = 0
    SNAPSHOT_BUT_NO_TRANSITION = 1


class CollectionType(enum.IntEnum):
    JOB = 0
    ALLOC_SET = 1


class Relation(enum.IntEnum):
    """Constraint comparison operators (v3 proto; v2 codes 0-3 coincide)."""

    EQUAL = 0
    NOT_EQUAL = 1
    LESS_THAN = 2
    GREATER_THAN = 3
    LESS_THAN_EQUAL = 4
    GREATER_THAN_EQUAL = 5
    PRESENT = 6
    NOT_PRESENT = 7


class VerticalScaling(enum.IntEnum):
    VERTICAL_SCALING_SETTING_UNKNOWN = 0
    VERTICAL_SCALING_OFF = 1
    VERTICAL_SCALING_CONSTRAINED = 2
    VERTICAL_SCALING_FULLY_AUTOMATED = 3


class Scheduler(enum.IntEnum):
    SCHEDULER_DEFAULT = 0
    SCHEDULER_BATCH = 1


# v2 (2011) -> v3 code maps.  Index = v2 code, value = v3 code.
V2_EVENT_TYPE_TO_V3 = np.array(
    [
        EventType.SUBMIT,
        EventType.SCHEDULE,
        EventType.EVICT,
        EventType.FAIL,
        EventType.FINISH,
        EventType.KILL,
        EventType.LOST,
        EventType.UPDATE_PENDING,
        EventType.UPDATE_RUNNING,
    ],
    dtype=np.int8,
)
V2_MACHINE_EVENT_TO_V3 = np.array(
    [MachineEventType.ADD, MachineEventType.REMOVE, MachineEventType.UPDATE], dtype=np.int8
)
V2_MISSING_TYPE_TO_V3 = np.array(
    [
        MissingType.SNAPSHOT_BUT_NO_TRANSITION,
        MissingType.NO_SNAPSHOT_OR_TRANSITION,
        MissingType.EXISTS_BUT_NO_CREATION,
    ],
    dtype=np.int8,
)

# --------------------------------------------------------------------------------------------
# CPU percentile columns
# --------------------------------------------------------------------------------------------
#: Percentile levels of ``cpu_usage_distribution`` (11) followed by ``tail_cpu_usage_distribution``
#: (9), in source order (how the readers map the two lists; the canonical ``instance_usage``
#: schema holds the columns in numeric order, :data:`CPU_PERCENTILE_COLUMNS_SORTED`).
CPU_PERCENTILES_SOURCE_ORDER = (0, 10, 20, 30, 40, 50, 60, 70, 80, 90, 100, 91, 92, 93, 94, 95, 96, 97, 98, 99)
CPU_PERCENTILE_COLUMNS = tuple(f"cpu_p{p}" for p in CPU_PERCENTILES_SOURCE_ORDER)
#: The same 20 levels sorted ascending (as fractions), and the matching column names.
CPU_PERCENTILE_LEVELS_SORTED = tuple(p / 100 for p in sorted(CPU_PERCENTILES_SOURCE_ORDER))
CPU_PERCENTILE_COLUMNS_SORTED = tuple(f"cpu_p{p}" for p in sorted(CPU_PERCENTILES_SOURCE_ORDER))

# --------------------------------------------------------------------------------------------
# Arrow schemas of the canonical tables
# --------------------------------------------------------------------------------------------
_i8, _i32, _i64, _f32, _str, _bool = pa.int8(), pa.int32(), pa.int64(), pa.float32(), pa.string(), pa.bool_()


def _f(name: str, typ: pa.DataType, nullable: bool = True) -> pa.Field:
    return pa.field(name, typ, nullable=nullable)


_COMMON_EVENT = [
    _f("time", _i64, False),
    _f("type", _i8, False),
    _f("collection_id", _i64, False),
    _f("scheduling_class", _i8),
    _f("missing_type", _i8),
    _f("collection_type", _i8),
    _f("priority", _i32),
    _f("alloc_collection_id", _i64),
]

SCHEMAS: dict[str, pa.Schema] = {
    "instance_usage": pa.schema(
        [
            _f("start_time", _i64, False),
            _f("end_time", _i64, False),
            _f("collection_id", _i64, False),
            _f("instance_index", _i32, False),
            _f("machine_id", _i64, False),
            _f("alloc_collection_id", _i64),
            _f("alloc_instance_index", _i32),
            _f("collection_type", _i8),
            _f("avg_cpu", _f32),
            _f("avg_mem", _f32),
            _f("max_cpu", _f32),
            _f("max_mem", _f32),
            _f("sample_cpu", _f32),
            _f("assigned_mem", _f32),
            _f("page_cache_mem", _f32),
            _f("cpi", _f32),
            _f("mai", _f32),
            _f("sample_rate", _f32),
            # in numeric order (cpu_p90, cpu_p91 ... cpu_p99, cpu_p100), not the source's
            # (docs/user/dataset.md); the readers map the source lists by name
            *[_f(c, _f32) for c in CPU_PERCENTILE_COLUMNS_SORTED],
        ]
    ),
    "instance_events": pa.schema(
        [
            *_COMMON_EVENT,
            _f("instance_index", _i32, False),
            _f("machine_id", _i64),
            _f("alloc_instance_index", _i32),
            _f("req_cpu", _f32),
            _f("req_mem", _f32),
        ]
    ),
    "collection_events": pa.schema(
        [
            *_COMMON_EVENT,
            _f("user", _str),
            _f("collection_name", _str),
            _f("collection_logical_name", _str),
            _f("parent_collection_id", _i64),
            _f("start_after_collection_ids", pa.list_(_i64)),
            _f("max_per_machine", _i32),
            _f("max_per_switch", _i32),
            _f("vertical_scaling", _i8),
            _f("scheduler", _i8),
        ]
    ),
    "machine_events": pa.schema(
        [
            _f("time", _i64, False),
            _f("machine_id", _i64, False),
            _f("type", _i8, False),
            _f("switch_id", _str),
            _f("cap_cpu", _f32),
            _f("cap_mem", _f32),
            _f("platform_id", _str),
            _f("missing_data_reason", _i8),
        ]
    ),
    "machine_attributes": pa.schema(
        [
            _f("time", _i64, False),
            _f("machine_id", _i64, False),
            _f("name", _str, False),
            _f("value", _str),
            _f("deleted", _bool),
        ]
    ),
    "instance_constraints": pa.schema(
        [
            _f("time", _i64, False),
            _f("collection_id", _i64, False),
            _f("instance_index", _i32, False),
            _f("name", _str),
            _f("value", _str),
            _f("relation", _i8),
        ]
    ),
}

TABLES: tuple[str, ...] = tuple(SCHEMAS)

#: Where the v3 spec defines a "none" value, a NULL (an omitted JSON key, a Parquet null, an
#: empty v2 CSV field) is that value.  Everywhere else NULL stays NULL.
NULL_MEANS: dict[str, dict[str, int]] = {
    "instance_usage": {"alloc_collection_id": NO_ALLOC_COLLECTION, "alloc_instance_index": NO_ALLOC_INDEX},
    "instance_events": {
        "alloc_collection_id": NO_ALLOC_COLLECTION,
        "alloc_instance_index": NO_ALLOC_INDEX,
        "machine_id": NO_MACHINE,
        "missing_type": MissingType.NONE,
    },
    "collection_events": {"alloc_collection_id": NO_ALLOC_COLLECTION, "missing_type": MissingType.NONE},
    "machine_events": {"missing_data_reason": MissingDataReason.NONE},
    "machine_attributes": {},
    "instance_constraints": {},
}

#: Valid ranges of the code columns, checked by the normaliser (out of range = rejected row).
CODE_RANGES: dict[str, tuple[int, int]] = {
    "type": (0, 10),
    "missing_type": (0, 5),
    "collection_type": (0, 1),
    "scheduling_class": (0, 3),
    "relation": (0, 7),
    "vertical_scaling": (0, 3),
    "scheduler": (0, 1),
    "missing_data_reason": (0, 1),
}
#: ``type`` in machine_events has its own range.
MACHINE_EVENT_TYPE_RANGE = (0, 3)

# --------------------------------------------------------------------------------------------
# Priority tier maps: named and selectable, because the sources disagree
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TierMap:
    """An ordered partition of priorities into named tiers.

    ``bounds[i]`` is the lowest priority of tier ``names[i]``; tiers are contiguous and the last
    one is open-ended.  Applied by :mod:`gpuclust.tiers` (which map an analysis uses, the tier
    code of a priority on any backend, the tier names).
    """

    name: str
    names: tuple[str, ...]
    bounds: tuple[int, ...]
    source: str

    def to_json(self) -> dict[str, object]:
        return {"name": self.name, "tiers": dict(zip(self.names, self.bounds, strict=True)), "source": self.source}


TIER_MAPS: dict[str, TierMap] = {
    m.name: m
    for m in (
        TierMap(
            "notebook",
            ("free", "beb", "mid", "prod"),
            (0, 100, 116, 120),
            "Google's cluster-data analysis notebook (2019): free 0-99, best-effort batch 100-115, "
            "mid 116-119, production >= 120",
        ),
        TierMap(
            "v3-doc",
            ("free", "mid", "prod", "monitoring"),
            (0, 100, 120, 201),
            "Google cluster-usage traces v3 document: free < 100, mid-SLO 100-119, "
            "production 120-200, monitoring > 200",
        ),
        TierMap(
            "seed-002",
            ("free", "beb", "mid", "prod", "monitoring"),
            (0, 100, 116, 120, 360),
            "v3 restatement (seed 002): free 0-99, batch 100-115, mid 116-119, production 120-359, monitoring >= 360",
        ),
        TierMap(
            "v2",
            ("free", "middle", "prod"),
            (0, 2, 9),
            "2011 trace (v2) format document: free 0-1, middle 2-8, production 9-11",
        ),
    )
}
DEFAULT_TIER_MAP = {"v3": "notebook", "v2": "v2"}
#: The trace version whose priorities each tier map partitions.
TIER_MAP_TRACE = {"notebook": "v3", "v3-doc": "v3", "seed-002": "v3", "v2": "v2"}


def tier_map(name: str) -> TierMap:
    """Look up a tier map (how priorities group into tiers) by name.

    Parameters
    ----------
    name : str
        One of :data:`TIER_MAPS`: ``notebook`` (the default for 2019 datasets), ``v3-doc``,
        ``seed-002`` or ``v2`` (the default for 2011 datasets).

    Returns
    -------
    TierMap
        Its tier ``names`` and the lowest priority of each (``bounds``), with its ``source``.

    Raises
    ------
    ValueError
        For an unknown name; the message lists the choices.

    Examples
    --------
    >>> tm = tier_map("notebook")
    >>> tm.names, tm.bounds
    (('free', 'beb', 'mid', 'prod'), (0, 100, 116, 120))
    >>> tier_map("prod")
    Traceback (most recent call last):
    ...
    ValueError: unknown tier map 'prod'; choose one of ['notebook', 'seed-002', 'v2', 'v3-doc']
    """
    try:
        return TIER_MAPS[name]
    except KeyError:
        raise ValueError(f"unknown tier map {name!r}; choose one of {sorted(TIER_MAPS)}") from None


def empty_table(table: str) -> pa.Table:
    """A zero-row table with the canonical schema of ``table``."""
    return SCHEMAS[table].empty_table()
