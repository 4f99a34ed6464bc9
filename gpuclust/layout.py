"""The key-partitioned ("bucketed") dataset layout: which key each table is bucketed by, and the
one hash that assigns a row to a bucket.

In a bucketed dataset every instance's usage windows and events sit in the same numbered bucket
(a hash of ``collection_id, instance_index``), machine-keyed tables are bucketed by a hash of
``machine_id`` and collection events by a hash of ``collection_id``; inside a bucket, rows are
ordered by time.  Per-instance work (priorities,
running intervals, exact per-instance distributions) is then local to a bucket, and joins are
bucket ``i`` of one table with bucket ``i`` of another (docs/user/scale.md).

The bucket of a row is ``splitmix64 chain of its key columns mod n_buckets`` (see
:func:`bucket_ids`; the chain is :func:`gpuclust.keys.hash64`); the same function runs on NumPy
and CuPy arrays.  A bucketed dataset stores
the bucket number in its folder names (``instance_usage/bucket=17/part-*.parquet``, hive style),
so DuckDB, pandas and polars read it as a plain column without recomputing the hash.

Examples
--------
>>> import numpy as np
>>> b = bucket_ids(np, [np.array([7, 7, 8]), np.array([0, 0, 1], np.int32)], 16)
>>> bool(b[0] == b[1]), b.dtype.name
(True, 'int32')
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from gpuclust.keys import hash64

__all__ = [
    "BUCKET_COLUMN",
    "HASH_NAME",
    "KEYS",
    "ORDER",
    "LayoutError",
    "bucket_ids",
    "bucket_of_path",
    "check_layouts",
    "key_name",
    "layout_entry",
]

#: The hive-style folder key of a bucket (``<table>/bucket=<k>/``).
BUCKET_COLUMN = "bucket"
#: Name and version of the bucket hash, recorded in the manifest (a reader refuses another).
HASH_NAME = "splitmix64-chain-v1"

#: The bucketing key of each table a bucketed dataset lays out by key.  Tables with the same key
#: and the same bucket count are co-partitioned.
KEYS: dict[str, tuple[str, ...]] = {
    "instance_usage": ("collection_id", "instance_index"),
    "instance_events": ("collection_id", "instance_index"),
    "machine_events": ("machine_id",),
    "machine_attributes": ("machine_id",),
    "collection_events": ("collection_id",),
}
#: The time column rows are ordered by inside a bucket.
ORDER: dict[str, str] = {
    "instance_usage": "start_time",
    "instance_events": "time",
    "machine_events": "time",
    "machine_attributes": "time",
    "collection_events": "time",
}
_KEY_NAMES = {
    ("collection_id", "instance_index"): "instance",
    ("machine_id",): "machine",
    ("collection_id",): "collection",
}


def key_name(columns: Sequence[str]) -> str:
    """``instance`` / ``machine`` / ``collection`` for a bucketing key's columns."""
    return _KEY_NAMES[tuple(columns)]


def bucket_ids(xp: Any, key_columns: Sequence[Any], n_buckets: int) -> Any:
    """The bucket (int32 in ``[0, n_buckets)``) of each row, from its key columns:
    :func:`gpuclust.keys.hash64` mod ``n_buckets``.  A NULL key (dtype minimum, as the engine hands NULLs
    over) is hashed like any value: its rows land in one bucket together."""
    n = int(n_buckets)
    if n < 1:
        raise ValueError(f"n_buckets must be >= 1, got {n_buckets!r}")
    return (hash64(xp, key_columns) % xp.uint64(n)).astype(xp.int32)


class LayoutError(ValueError):
    """A manifest's ``layout`` entries cannot be used (unknown hash, key or bucket count)."""


def layout_entry(table: str, n_buckets: int) -> dict[str, Any]:
    """The manifest ``layout`` entry of ``table`` bucketed into ``n_buckets``."""
    return {"key": list(KEYS[table]), "buckets": int(n_buckets), "hash": HASH_NAME, "order": ORDER[table]}


def bucket_of_path(rel: str) -> int | None:
    """The bucket number of a part from its relative path (``<table>/bucket=<k>/<file>``), or
    ``None`` when the path has no ``bucket=`` folder.

    >>> bucket_of_path("instance_usage/bucket=17/part-ab-00000.parquet"), bucket_of_path("t/part-0.parquet")
    (17, None)
    """
    parts = rel.replace("\\", "/").split("/")
    prefix = f"{BUCKET_COLUMN}="
    for seg in parts[1:-1]:
        if seg.startswith(prefix):
            v = seg[len(prefix) :]
            if v.isdigit() and (v == "0" or not v.startswith("0")):
                return int(v)
            raise LayoutError(f"{rel}: bucket folder {seg!r} is not {prefix}<unpadded decimal>")
    return None


def check_layouts(tables: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Validate the ``layout`` entries of a manifest's ``tables``; returns ``{table: layout}``.

    Raises :class:`LayoutError` for an unknown hash, a table that cannot be bucketed, a key
    other than :data:`KEYS`, a bad bucket count, a listed part outside its ``bucket=<k>``
    folder (or ``k`` out of range), and for co-keyed tables (same key) with different counts.
    """
    found: dict[str, dict[str, Any]] = {}
    for table, entry in sorted(tables.items()):
        lay = entry.get("layout") if isinstance(entry, dict) else None
        if lay is None:
            continue
        if not isinstance(lay, dict):
            raise LayoutError(f"table {table}: layout must be an object, got {lay!r}")
        if lay.get("hash") != HASH_NAME:
            raise LayoutError(
                f"table {table}: bucket hash {lay.get('hash')!r} is unknown to this gpuclust (it knows {HASH_NAME!r}); "
                "re-run `gpuclust optimize` with this gpuclust"
            )
        if table not in KEYS:
            raise LayoutError(f"table {table}: cannot be bucketed (bucketed tables are {sorted(KEYS)})")
        if tuple(lay.get("key") or ()) != KEYS[table]:
            raise LayoutError(f"table {table}: bucketing key {lay.get('key')!r}, expected {list(KEYS[table])}")
        n = lay.get("buckets")
        if not isinstance(n, int) or isinstance(n, bool) or n < 1:
            raise LayoutError(f"table {table}: bucket count must be an integer >= 1, got {n!r}")
        for rel in entry.get("files", []):
            k = bucket_of_path(rel)
            if k is None or not 0 <= k < n:
                raise LayoutError(f"table {table}: part {rel} is not in a {BUCKET_COLUMN}=<0..{n - 1}> folder")
        found[table] = lay
    by_key: dict[tuple[str, ...], dict[str, int]] = {}
    for table, lay in found.items():
        by_key.setdefault(KEYS[table], {})[table] = lay["buckets"]
    for key, counts in by_key.items():
        if len(set(counts.values())) > 1:
            raise LayoutError(
                f"tables keyed by {key_name(key)} ({', '.join(key)}) must have the same bucket count to be "
                f"co-partitioned, but the manifest has {counts}; re-run `gpuclust optimize`"
            )
    return found
