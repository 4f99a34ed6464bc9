"""Priority tiers: which tier map an analysis uses, the tier code of a priority on any array
backend, and the tier names its codes index.

The named tier maps themselves (:class:`~gpuclust.schema.TierMap`, :data:`~gpuclust.schema.TIER_MAPS`,
the trace versions' defaults) are part of the dataset vocabulary in :mod:`gpuclust.schema`; this
module is the one place that applies them:

* :func:`resolve_tier_map`: an analysis' ``tier_map`` option, else the dataset manifest's, else
  the default of the dataset's trace version (``notebook`` for v3, ``v2`` for v2);
* :func:`tier_codes`: priority -> tier code on NumPy or CuPy arrays (the tier whose range holds
  the priority; ``unknown`` for a NULL/NaN or negative priority);
* :func:`tier_names` (and :class:`TierNames` for contexts): the map's tier names, then
  ``"unknown"``, the labels tier codes index;
* :data:`TIER_SLOTS` and :func:`check_tier_slots`: the tier slots of an analysis' dense per-tier
  arrays, and the check that a map's tiers fit them.

``tests/test_code_rules.py`` keeps copies of these out of the rest of the package.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from gpuclust.schema import DEFAULT_TIER_MAP, TierMap, tier_map

__all__ = ["TIER_SLOTS", "UNKNOWN", "TierNames", "check_tier_slots", "resolve_tier_map", "tier_codes", "tier_names"]

#: The name of the tier of a priority no tier covers (NULL, negative) or of an instance without one.
UNKNOWN = "unknown"
#: Tier slots of an analysis' dense per-tier arrays: the most tiers a tier map may have (16), plus
#: :data:`UNKNOWN`.
TIER_SLOTS = 17


def check_tier_slots(analysis: str, tm: TierMap, slots: int = TIER_SLOTS) -> TierMap:
    """``tm`` when its tiers and :data:`UNKNOWN` fit ``slots`` tier slots (default
    :data:`TIER_SLOTS`); else a ValueError that names ``analysis``."""
    if len(tm.names) + 1 > slots:
        raise ValueError(f"{analysis}: tier map {tm.name!r} has more than {slots - 1} tiers")
    return tm


def resolve_tier_map(explicit: str | None, source: Any) -> TierMap:
    """The tier map an analysis uses: its own option ``explicit``, else the dataset manifest's
    (``source.tier_map_name``), else the default of the dataset's trace version
    (:data:`gpuclust.schema.DEFAULT_TIER_MAP`; ``notebook`` when the version is unknown)."""
    if explicit is not None:
        return tier_map(explicit)
    name = getattr(source, "tier_map_name", None)
    if name:
        return tier_map(name)
    return tier_map(DEFAULT_TIER_MAP.get(getattr(source, "trace_version", None) or "v3", "notebook"))


def tier_codes(xp: Any, tm: TierMap, priority: Any, unknown: int = -1) -> Any:
    """Tier code (int64) per priority, on the array module ``xp`` (NumPy or CuPy; ``priority`` an
    array of it, integer or float): the index in ``tm.names`` of the tier whose range holds the
    priority (``tm.bounds[i]`` is tier ``i``'s lowest priority, the last tier open-ended), or
    ``unknown`` where the priority is NaN or below the first tier (negative: every map starts at
    0).  Float priorities are truncated to integers."""
    p = xp.asarray(priority)
    ok = None
    if p.dtype.kind == "f":
        ok = ~xp.isnan(p)
        p = xp.where(ok, p, -1.0)
    bounds = xp.asarray(np.asarray(tm.bounds, dtype=np.int64))
    code = xp.searchsorted(bounds, p.astype(xp.int64), side="right") - 1
    known = code >= 0 if ok is None else ok & (code >= 0)
    return xp.where(known, code, unknown).astype(xp.int64)


def tier_names(tm: TierMap | None, unknown: bool = True) -> tuple[str, ...]:
    """The labels of tier codes: ``tm``'s tier names (none without a map), then :data:`UNKNOWN`
    (unless ``unknown`` is false)."""
    names = tm.names if tm is not None else ()
    return (*names, UNKNOWN) if unknown else tuple(names)


class TierNames:
    """Mixin of an analysis context with a ``tier_map`` (a :class:`TierMap`, or None where the
    analysis does not split by tier): ``tier_names``, the labels its tier codes index (the
    map's tiers, then ``unknown``)."""

    tier_map: TierMap | None

    def has_unknown_tier(self) -> bool:
        """Whether the codes have an ``unknown`` tier after the map's (a context may say not)."""
        return True

    @property
    def tier_names(self) -> tuple[str, ...]:
        return tier_names(self.tier_map, self.has_unknown_tier())
