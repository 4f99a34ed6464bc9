"""The columns of the Kaggle ``borg_traces_data.csv`` layout: the published header, the columns
the reader needs, those it reads but does not ingest, and the values a usage row gets for its
unknown instance and machine (see :mod:`gpuclust.ingest.readers.kaggle_csv` and
``docs/user/formats-v2-kaggle.md``).
"""

from __future__ import annotations

#: The header of the published file, in order.  Columns are found by name, so a file written
#: without the pandas index column (``Unnamed: 0``) or with extra columns reads the same.
KAGGLE_COLUMNS: tuple[str, ...] = (
    "Unnamed: 0",
    "time",
    "instance_events_type",
    "collection_id",
    "scheduling_class",
    "collection_type",
    "priority",
    "alloc_collection_id",
    "instance_index",
    "machine_id",
    "resource_request",
    "constraint",
    "collections_events_type",
    "collection_id_1",
    "user",
    "collection_name",
    "collection_logical_name",
    "start_after_collection_ids",
    "vertical_scaling",
    "scheduler",
    "start_time",
    "end_time",
    "collection_id_2",
    "average_usage",
    "maximum_usage",
    "random_sample_usage",
    "assigned_memory",
    "page_cache_memory",
    "cycles_per_instruction",
    "memory_accesses_per_instruction",
    "sample_rate",
    "cpu_usage_distribution",
    "tail_cpu_usage_distribution",
    "cluster",
    "event",
    "failed",
)

#: Columns the reader needs (``collection_id_1`` / ``collection_id_2`` are checked if present).
REQUIRED_COLUMNS: tuple[str, ...] = (
    "time",
    "instance_events_type",
    "collection_id",
    "scheduling_class",
    "collection_type",
    "priority",
    "alloc_collection_id",
    "instance_index",
    "machine_id",
    "resource_request",
    "constraint",
    "start_time",
    "end_time",
    "average_usage",
    "maximum_usage",
    "random_sample_usage",
    "assigned_memory",
    "page_cache_memory",
    "cycles_per_instruction",
    "memory_accesses_per_instruction",
    "sample_rate",
    "cpu_usage_distribution",
    "tail_cpu_usage_distribution",
)

#: Columns that are read but not ingested (see the docs for why).
DROPPED_COLUMNS: tuple[str, ...] = (
    "Unnamed: 0",
    "collections_events_type",
    "user",
    "collection_name",
    "collection_logical_name",
    "start_after_collection_ids",
    "vertical_scaling",
    "scheduler",
    "cluster",
    "event",
    "failed",
)

#: instance_index of a usage row whose instance is unknown (the layout joined usage on the
#: collection only).
UNKNOWN_INSTANCE_INDEX = -1
#: machine_id of a usage row whose machine is unknown.
UNKNOWN_MACHINE_ID = 0

_INT_COLUMNS = (
    "time",
    "instance_events_type",
    "collection_id",
    "scheduling_class",
    "collection_type",
    "priority",
    "alloc_collection_id",
    "instance_index",
    "machine_id",
    "start_time",
    "end_time",
    "collection_id_1",
    "collection_id_2",
)
_FLOAT_TEXT_COLUMNS = (
    "assigned_memory",
    "page_cache_memory",
    "cycles_per_instruction",
    "memory_accesses_per_instruction",
    "sample_rate",
)
_USAGE_PRESENCE = (
    "start_time",
    "end_time",
    "collection_id_2",
    "average_usage",
    "maximum_usage",
    "random_sample_usage",
    "assigned_memory",
    "page_cache_memory",
    "cycles_per_instruction",
    "memory_accesses_per_instruction",
    "sample_rate",
    "cpu_usage_distribution",
    "tail_cpu_usage_distribution",
)
