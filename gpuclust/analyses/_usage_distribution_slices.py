"""The first pass of ``usage-distribution``'s ``exact-two-pass`` in slices of the collections.

By ``instance`` or ``collection`` the first pass's state grows with the groups, which grow with
the cell: a group keeps its windows exactly up to ``(bracket_k + 1) // 22`` of them (176 bytes
each) and a bounded summary of ``bracket_k`` knots above, so a cell of mostly small collections
keeps nearly every window.  Option ``slices`` runs that pass once per slice of the collections:
slice ``r`` of ``R`` reads the windows whose ``collection_id`` hashes to bucket ``r`` (the layout's
bucket hash, :func:`gpuclust.layout.bucket_ids`), so each pass holds about ``1/R`` of the state;
each slice's brackets are added to those of the slices before it.  A group's windows all fall in
one slice and its summary depends on its own windows only, so the brackets, and the exact pass
after them, are those of one unsliced pass, bit for bit.  The price is ``R`` reads of the columns.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from gpuclust.layout import bucket_ids

__all__ = [
    "MAX_SLICES",
    "SLICE_STATE_BYTES",
    "STATE_BYTES_PER_WINDOW",
    "in_slice",
    "joined",
    "slices_for",
]

#: The first pass's state per window it keeps exactly (20 percentiles, weight and key: 176 bytes),
#: twice over: a merge holds both sides and its result (measured by collection on the canonical
#: cell of 1.6e7 windows, 400,000 collections: 4.3 GB merged state, 7 GB peak).
STATE_BYTES_PER_WINDOW = 352
#: The state one slice may hold: ``slices`` = -1 plans as many slices as the rows need at
#: :data:`STATE_BYTES_PER_WINDOW` (an upper bound: every window kept exactly), at most
#: :data:`MAX_SLICES` (each slice reads the columns once more).
SLICE_STATE_BYTES = 1 << 29
MAX_SLICES = 16


def slices_for(total_rows: int, by: Sequence[str], option: int = -1) -> int:
    """The first pass's slices: 1 unless ``by`` has ``instance`` or ``collection`` (other groups
    span collections); else ``option`` when it is at least 1, and for -1 (auto) enough that
    each holds :data:`SLICE_STATE_BYTES` at :data:`STATE_BYTES_PER_WINDOW` a row, at most
    :data:`MAX_SLICES`.

    >>> slices_for(16_000_000, ("collection",)), slices_for(16_000_000, ("machine",), 4)
    (11, 1)
    """
    if not {"instance", "collection"} & set(by):
        return 1
    if int(option) >= 1:
        return int(option)
    need = math.ceil(float(total_rows) * STATE_BYTES_PER_WINDOW / SLICE_STATE_BYTES)
    return int(min(MAX_SLICES, max(1, need)))


def in_slice(xp: Any, collection_id: Any, part: int, slices: int) -> Any:
    """Which rows (by their ``collection_id``) slice ``part`` of ``slices`` reads."""
    return bucket_ids(xp, [collection_id], int(slices)) == int(part)


def joined(before: dict[str, Any] | None, own: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The brackets of the slices before (``None``: none) and of this one (``key``, ``lo``,
    ``hi``, ``est``; disjoint groups), by key."""
    if before is None or before["key"].shape[0] == 0:
        return own
    key = np.concatenate([before["key"], own["key"]])
    order = np.argsort(key, kind="stable")
    return {f: np.concatenate([before[f], own[f]])[order] for f in ("key", "lo", "hi", "est")}
