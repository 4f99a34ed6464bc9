"""Checks of a dataset against the analyses asked of it, before anything is computed.

Each analysis declares the tables it needs (``requires``) and those it reads when present
(``optional_tables``).  A required table with no rows is an error (:class:`MissingTableError`):
the analysis would compute nothing and report empty results as if they were real.  A missing
optional table and a tier map from the other trace version give notes.

Examples
--------
>>> import pyarrow as pa
>>> from gpuclust.analyses import Cpi
>>> from gpuclust.engine import TableSource
>>> from gpuclust.schema import SCHEMAS
>>> src = TableSource({"machine_events": SCHEMAS["machine_events"].empty_table()})
>>> preflight(src, [Cpi()])
Traceback (most recent call last):
...
gpuclust.engine.checks.MissingTableError: cpi needs table(s) instance_usage, machine_events, which the dataset does not have (0 rows)
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

__all__ = ["MissingTableError", "preflight", "tier_map_note"]


class MissingTableError(ValueError):
    """The dataset lacks a table an analysis requires."""


def _rows(src: Any, table: str) -> int:
    n = getattr(src, "num_rows", None)
    return int(n(table)) if n is not None else 1  # a source that cannot say: assume present


def tier_map_note(name: str | None, src: Any) -> str | None:
    """A warning when tier map ``name`` belongs to the other trace version than ``src``'s."""
    from gpuclust.schema import TIER_MAP_TRACE

    version = getattr(src, "trace_version", None)
    made_for = TIER_MAP_TRACE.get(name or "")
    if not (version and made_for) or made_for == version:
        return None
    return (f"warning: tier map {name!r} is for {made_for} traces but the dataset is {version} "
            f"(priorities differ: v2 0-11, v3 0-450); its tiers will not mean what they say")


def preflight(src: Any, analyses: Sequence[Any]) -> list[str]:
    """Check ``src`` for ``analyses``: raise :class:`MissingTableError` when a required table is
    empty or absent; return notes (optional tables missing, tier maps of the other version)."""
    notes: list[str] = []
    errors: list[str] = []
    manifest = getattr(src, "manifest", None)
    chosen = manifest.get("selection") if isinstance(manifest, dict) else None
    if isinstance(chosen, dict):
        notes.append(f"note: this dataset is a selection of its cell: {chosen.get('text')} (chosen at ingest); "
                     "its results describe that selection, not the whole cell")
    for a in analyses:
        missing = [t for t in a.requires if _rows(src, t) == 0]
        if missing:
            errors.append(f"{a.label} needs table(s) {', '.join(missing)}, which the dataset does not have (0 rows)")
        for t in a.optional_tables:
            if _rows(src, t) == 0:
                notes.append(f"note: {a.label}: the dataset has no {t} rows; the results that depend on it are empty")
        if not hasattr(a, "tier_map"):
            continue
        note = tier_map_note(a.tier_map or getattr(src, "tier_map_name", None), src)
        if note and note not in notes:
            notes.append(note)
    if errors:
        raise MissingTableError("; ".join(errors))
    return notes
