"""Checks of a dataset against the analyses asked of it, before anything is computed.

Each analysis says which tables it needs and which it reads when present, *with the options it
was given* (:meth:`gpuclust.analyses.base.Analysis.needed_tables`: ``cpi`` needs machine_events for
``by=platform`` only).  A required table with no rows is an error (:class:`MissingTableError`):
the analysis would compute nothing and report empty results as if they were real.  A missing
optional table and a tier map from the other trace version give notes.

Examples
--------
>>> import pyarrow as pa
>>> from gpuclust.analyses import Cpi
>>> from gpuclust.engine import TableSource
>>> src = TableSource({"instance_usage": pa.table({"start_time": [0]})})  # usage rows, no machine_events
>>> try:
...     preflight(src, [Cpi()])
... except MissingTableError as e:
...     print(*str(e).split("; "), sep="\\n")  # one line, cut here to fit
cpi needs table(s) machine_events (by=platform: the machines' platforms
by=cell, machine, collection, tier do not), which the dataset does not have (0 rows)
>>> preflight(src, [Cpi(by="cell", regression="none")])
[]
>>> print(*preflight(src, [Cpi(by="cell")]))
note: cpi[by=cell]: the dataset has no machine_events rows; the results that depend on it (the regression: machine capacities) are empty
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


def _why(table: str, why: str) -> str:
    return f"{table} ({why})" if why else table


def tier_map_note(name: str | None, src: Any) -> str | None:
    """A warning when tier map ``name`` belongs to the other trace version than ``src``'s."""
    from gpuclust.schema import TIER_MAP_TRACE

    version = getattr(src, "trace_version", None)
    made_for = TIER_MAP_TRACE.get(name or "")
    if not (version and made_for) or made_for == version:
        return None
    return (
        f"warning: tier map {name!r} is for {made_for} traces but the dataset is {version} "
        f"(priorities differ: v2 0-11, v3 0-450); its tiers will not mean what they say"
    )


def preflight(src: Any, analyses: Sequence[Any]) -> list[str]:
    """Check ``src`` for ``analyses``: raise :class:`MissingTableError` when a required table is
    empty or absent; return notes (optional tables missing, tier maps of the other version)."""
    notes: list[str] = []
    errors: list[str] = []
    manifest = getattr(src, "manifest", None)
    chosen = manifest.get("selection") if isinstance(manifest, dict) else None
    if isinstance(chosen, dict):
        notes.append(
            f"note: this dataset is a selection of its cell: {chosen.get('text')} (chosen at ingest); "
            "its results describe that selection, not the whole cell"
        )
    for a in analyses:
        required, optional = a.needed_tables()
        missing = [_why(t, required[t]) for t in required if _rows(src, t) == 0]
        if missing:
            errors.append(f"{a.label} needs table(s) {', '.join(missing)}, which the dataset does not have (0 rows)")
        for t, why in optional.items():
            if _rows(src, t) == 0:
                notes.append(
                    f"note: {a.label}: the dataset has no {t} rows; the results that depend on it"
                    f"{f' ({why})' if why else ''} are empty"
                )
        if not hasattr(a, "tier_map"):
            continue
        note = tier_map_note(a.tier_map or getattr(src, "tier_map_name", None), src)
        if note and note not in notes:
            notes.append(note)
    if errors:
        raise MissingTableError("; ".join(errors))
    return notes
