"""Trace time: ``--from`` / ``--to`` values read as trace microseconds, and the window they select.

A time is given as trace time (``86400s``, ``1d``, ``2h``, ``90min``, ``1500ms``, ``250us``, or a
plain integer of microseconds) or as wall-clock time (``2019-05-02``, ``2019-05-02T08:00``):
naive wall-clock is read in the **cell's time zone** (the v3 document's "Traces" table, by the
manifest's ``cell``); with an explicit UTC offset (``2019-05-02T08:00Z``, ``...+02:00``) it is
that instant.  Trace time ``t`` of an instant ``x`` is ``600 s + (x - trace start)``; the v3
traces start (t = 600 s) on 1 May 2019 00:00 PDT in every cell, the v2 trace on 1 May 2011
19:00 EDT.

A *source* here is anything with ``trace_version`` and ``manifest`` attributes (a dataset, the
engine's sources, or a stand-in at ingest).  What a selection keeps of each table, and the
Parquet pushdown, are the engine's (:mod:`gpuclust.engine.selection`); ``gpuclust ingest
--from/--to`` uses the same reading (:mod:`gpuclust.ingest.sampling`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from decimal import Decimal, InvalidOperation
from typing import Any

import numpy as np

__all__ = [
    "CELL_TIME_ZONES",
    "TRACE_START",
    "TRACE_START_US",
    "Selection",
    "SelectionError",
    "cell_time_zone",
    "parse_time",
    "selection_of",
]

US = 1_000_000
#: Trace time of the trace start (v3 document: timestamps count from 600 s before it).
TRACE_START_US = 600 * US
#: The instant of the trace start (t = 600 s), per trace version.
TRACE_START = {
    "v3": datetime(2019, 5, 1, 7, 0, tzinfo=timezone.utc),  # 1 May 2019 00:00 PDT (every 2019 cell)
    "v2": datetime(2011, 5, 1, 23, 0, tzinfo=timezone.utc),  # 1 May 2011 19:00 EDT
}
#: The cells' time zones (v3 document, "Traces": 2019-05-a ... 2019-05-h).
CELL_TIME_ZONES = {
    "a": "America/New_York",
    "b": "America/Chicago",
    "c": "America/New_York",
    "d": "America/New_York",
    "e": "Europe/Helsinki",
    "f": "America/Chicago",
    "g": "Asia/Singapore",
    "h": "Europe/Brussels",
}
_UNITS = {"us": 1, "ms": 1_000, "s": US, "min": 60 * US, "m": 60 * US, "h": 3600 * US, "d": 86400 * US}
_TRACE_TIME = re.compile(r"^\s*(\d+(?:\.\d*)?)\s*(us|ms|s|min|m|h|d)?\s*$")
_WALL = re.compile(r"^\s*\d{4}-\d{2}-\d{2}([T ]\d{2}:\d{2}(:\d{2}(\.\d{1,6})?)?)?\s*(Z|[+-]\d{2}:?\d{2})?\s*$")


class SelectionError(ValueError):
    """A ``--from`` / ``--to`` value that cannot be read, or cannot be placed in trace time."""


def cell_time_zone(source: Any) -> str:
    """The IANA zone of the source's cell (manifest ``cell`` ``a``..``h``, or as the v3 document
    names the traces, ``2019-05-a``, or their Cloud Storage buckets and BigQuery datasets,
    ``clusterdata_2019_a``); a :class:`SelectionError` saying why when there is none."""
    version = getattr(source, "trace_version", None)
    manifest = getattr(source, "manifest", None) or {}
    cell = manifest.get("cell") if isinstance(manifest, dict) else None
    if version != "v3":
        raise SelectionError(
            f"wall-clock time needs the cell's time zone, and only the v3 (2019) cells have one documented "
            f"(this dataset's trace version: {version or 'unknown'}); give trace time (e.g. 1d, 86400s) or a "
            "time with a UTC offset (e.g. 2011-05-02T00:00-04:00)"
        )
    key = re.split(r"[-_]", str(cell).lower())[-1] if cell else None
    if key not in CELL_TIME_ZONES:
        raise SelectionError(
            f"wall-clock time needs the cell's time zone, but the dataset's manifest names "
            f"{'no cell' if not cell else f'cell {cell!r}, not one of a-h'} (ingest with --cell a..h); give trace "
            "time (e.g. 1d, 86400s) or a time with a UTC offset (e.g. 2019-05-02T00:00-04:00)"
        )
    return CELL_TIME_ZONES[key]


def parse_time(value: Any, source: Any = None) -> int:
    """Trace microseconds of a ``--from`` / ``--to`` value.

    Examples
    --------
    >>> parse_time("1d"), parse_time("2h"), parse_time("86400s"), parse_time("1.5s"), parse_time(7)
    (86400000000, 7200000000, 86400000000, 1500000, 7)

    Wall-clock needs the trace start (and, without a UTC offset, the cell's time zone):

    >>> from types import SimpleNamespace
    >>> src = SimpleNamespace(trace_version="v3", manifest={})
    >>> parse_time("2019-05-01T00:00-07:00", src)   # the trace start: t = 600 s
    600000000
    """
    if isinstance(value, (int, np.integer)) and not isinstance(value, bool):
        return int(value)
    if not isinstance(value, str):
        raise SelectionError(f"a time must be an integer of microseconds or text, got {value!r}")
    m = _TRACE_TIME.match(value)
    if m:
        num, unit = m.group(1), m.group(2)
        if unit is None and "." in num:
            raise SelectionError(f"{value!r}: plain numbers are whole microseconds; add a unit (us ms s min h d)")
        try:
            us = Decimal(num) * _UNITS[unit or "us"]
        except InvalidOperation:
            raise SelectionError(f"cannot read time {value!r}") from None
        if us != us.to_integral_value():
            raise SelectionError(f"{value!r} is not a whole number of microseconds")
        return int(us)
    if _WALL.match(value):
        return _wall_clock(value.strip(), source)
    raise SelectionError(
        f"cannot read time {value!r}: expected trace time (86400s, 1d, 2h, 90min, 1500ms, 250us or integer "
        "microseconds) or wall-clock (2019-05-02, 2019-05-02T08:00, optionally with Z or +HH:MM)"
    )


def _wall_clock(text: str, source: Any) -> int:
    try:
        dt = datetime.fromisoformat(text.replace(" ", "T", 1) if len(text) > 10 else text)
    except ValueError as e:
        raise SelectionError(f"cannot read wall-clock time {text!r}: {e}") from None
    version = getattr(source, "trace_version", None)
    if version not in TRACE_START:
        raise SelectionError(
            f"wall-clock time {text!r} needs the trace start, and this dataset's trace version is "
            f"{version or 'unknown'}; give trace time (e.g. 1d, 86400s)"
        )
    if dt.tzinfo is None:
        from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

        zone = cell_time_zone(source)
        try:
            dt = dt.replace(tzinfo=ZoneInfo(zone))
        except ZoneInfoNotFoundError:
            raise SelectionError(
                f"time zone {zone} is not in this system's zone database (install the tzdata package)"
            ) from None
    delta = dt - TRACE_START[version]
    return TRACE_START_US + (delta // timedelta(microseconds=1))


@dataclass(frozen=True)
class Selection:
    """Trace time ``[start, end)`` in microseconds (``None``: unbounded on that side)."""

    start: int | None = None
    end: int | None = None
    #: what the user wrote, and the time zone naive wall-clock was read in (for ``_run.json``)
    given: tuple[str | None, str | None] = (None, None)
    time_zone: str | None = None

    def __post_init__(self) -> None:
        if self.start is not None and self.end is not None and self.end <= self.start:
            raise SelectionError(f"empty selection: --to ({self.end} us) is not after --from ({self.start} us)")

    def to_json(self) -> dict[str, Any]:
        return {
            "from_us": self.start,
            "to_us": self.end,
            "from": self.given[0],
            "to": self.given[1],
            "time_zone": self.time_zone,
        }


def selection_of(source: Any, time_from: Any = None, time_to: Any = None) -> Selection | None:
    """The :class:`Selection` of ``time_from`` / ``time_to`` on ``source`` (``None`` when neither)."""
    if time_from is None and time_to is None:
        return None
    zone = None
    for v in (time_from, time_to):
        if isinstance(v, str) and _WALL.match(v) and not re.search(r"(Z|[+-]\d{2}:?\d{2})\s*$", v.strip()[10:]):
            zone = cell_time_zone(source)
    start = None if time_from is None else parse_time(time_from, source)
    end = None if time_to is None else parse_time(time_to, source)
    return Selection(
        start, end, (None if time_from is None else str(time_from), None if time_to is None else str(time_to)), zone
    )
