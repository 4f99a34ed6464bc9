"""The ``cpi`` analysis' constants (option choices, the partials' counters and keyed sums) and
its context: the side inputs broadcast to every partition (:class:`CpiContext`) and the helpers
that build them from machine_events and the dataset's manifest (client side)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from gpuclust.analyses._lookup import InstanceLookup, machine_capacities
from gpuclust.analyses._machine_cells import CELL_US
from gpuclust.arrow_numpy import valid as arrow_valid
from gpuclust.schema import TierMap
from gpuclust.stats import CpiFilter
from gpuclust.tiers import TierNames

__all__ = [
    "BY",
    "COUNTERS",
    "CpiContext",
    "K_BINS",
    "KEYED",
    "REGRESSIONS",
    "SHARD_KEYS",
    "SPEARMAN",
    "UTIL_BIN",
    "UTIL_BINS",
]

BY = ("platform", "machine", "collection", "tier", "cell")
REGRESSIONS = ("platform-fixed-effects", "per-platform", "pooled", "none")
SPEARMAN = ("grid", "exact", "none")
#: Counters kept in every partial, in this order.
COUNTERS = (
    "total",
    "kept",
    "missing",
    "cpu_seconds",
    "cpi_range",
    "mai_range",
    "regression_used",
    "no_capacity",
    "no_machine_cell",
    "unknown_util",
    "unknown_platform",
)
#: Utilisation bins of the ``binned`` table (width, count; the last bin is open-ended).
UTIL_BIN = 0.05
UTIL_BINS = 40
#: Task counts k above this share the last bin of the ``binned`` table.
K_BINS = 1024
_BIN_BITS = 16
#: Keyed sums of a partition (spilled, reduced by machine-range shards): ``c``: per (machine,
#: cell) over the top-level rows; ``w``: per (machine, cell, platform) over the kept windows.
KEYED = {"c": ("k", "cpu_seconds", "bad"), "w": ("n", "W", "S", "Q")}
#: (machine, cell, platform) keys per shard (dense accumulators of this many entries).
SHARD_KEYS = 1 << 21
#: ``stats``: top-level rows outside the cell range, machine-cells, machine-cells of unknown util.
_STATS = ("bad_cell_rows", "machine_cells", "machine_cells_unknown_util")
_BY_COLUMN = {
    "platform": "platform_id",
    "machine": "machine_id",
    "collection": "collection_id",
    "tier": "tier",
    "cell": "cell",
}


@dataclass(frozen=True)
class CpiContext(TierNames):
    """Side inputs broadcast to every partition (all host NumPy arrays)."""

    filter: CpiFilter
    tier_map: TierMap | None
    #: platform lookup "as of the window": machines of machine_events, platform names, events
    pm_ids: np.ndarray
    platforms: tuple[str, ...]
    pe_times: np.ndarray
    pe_key: np.ndarray
    pe_machine: np.ndarray
    pe_code: np.ndarray
    pm_first: np.ndarray
    #: machines with a known positive CPU capacity (sorted) and that capacity
    cap_ids: np.ndarray
    cap_val: np.ndarray
    #: cells per machine in the keyed sums' keys (cells ``[0, cell_span)``; 0 without regression)
    cell_span: int
    #: per pm_ids entry: its index in cap_ids (-1: no known capacity)
    pm_cap: np.ndarray
    #: Spearman grid cuts
    cpi_cuts: np.ndarray
    mai_cuts: np.ndarray
    #: the first pass's fine histogram edges and, per fine bin (``partials.log_bins``), its grid bin (the
    #: cuts are fine edges); empty when the cuts are not all fine edges (then searchsorted)
    cpi_edges: np.ndarray
    mai_edges: np.ndarray
    cpi_lut: np.ndarray
    mai_lut: np.ndarray
    #: per-instance tier lookup (by="tier" only), sorted by hash
    #: (collection_id, instance_index, machine_id) -> tier code (``by="tier"`` only)
    lookup: InstanceLookup
    trace_window_us: tuple[int, int] | None
    info: dict[str, Any]

    @property
    def unknown_platform(self) -> int:
        return len(self.platforms)

    @property
    def n_platforms(self) -> int:
        """Platform codes in the keys: the platforms and ``unknown_platform``."""
        return len(self.platforms) + 1


def _cell_span(last_start: int | None, machines: int, n_platforms: int) -> int:
    """Cells per machine in the keyed sums: up to the cell of the latest window start (from
    Parquet statistics), at most 2^32 and small enough that (machine, cell, platform) keys fit
    an int64."""
    cells = last_start // CELL_US + 1 if last_start is not None and last_start >= 0 else 1
    return int(max(1, min(cells, 1 << 32, (1 << 62) // max(machines * n_platforms, 1))))


def _trace_window(source: Any) -> tuple[int, int] | None:
    man = getattr(source, "manifest", None) or {}
    win = man.get("trace_window_us") or (man.get("synthetic") or {}).get("trace_window_us")
    if win and len(win) == 2:
        return int(win[0]), int(win[1])
    return None


def _cell_seconds(xp: Any, cell: Any, window: tuple[int, int] | None) -> Any:
    """Length in seconds of each 300 s cell inside the trace window (300 when it is unknown)."""
    if window is None:
        return xp.full(cell.shape, CELL_US / 1e6)
    lo = xp.maximum(cell * CELL_US, window[0])
    hi = xp.minimum((cell + 1) * CELL_US, window[1])
    return xp.maximum(hi - lo, 0).astype(xp.float64) / 1e6


def _platform_lookup(me: Any) -> dict[str, Any]:
    """Arrays for the as-of-window platform lookup from a machine_events Arrow table."""
    mid = me.column("machine_id").to_numpy().astype(np.int64)
    t = me.column("time").to_numpy().astype(np.int64)
    plat = me.column("platform_id")
    pm_ids = np.unique(mid)
    valid = arrow_valid(plat)
    names = np.asarray(plat.to_pylist(), dtype=object)
    platforms = tuple(sorted({str(p) for p in names[valid]}))
    code_of = {p: i for i, p in enumerate(platforms)}
    mid_v, t_v = mid[valid], t[valid]
    code_v = np.array([code_of[str(p)] for p in names[valid]], dtype=np.int32)
    times = np.unique(t_v)
    T = times.shape[0]
    m2 = np.searchsorted(pm_ids, mid_v)
    order = np.lexsort((np.arange(m2.shape[0]), t_v, m2))  # by machine, time, then file order
    m2, t_v, code_v = m2[order], t_v[order], code_v[order]
    key = m2.astype(np.int64) * (T + 1) + np.searchsorted(times, t_v) + 1
    first = np.full(pm_ids.shape[0], len(platforms), dtype=np.int32)
    if m2.shape[0]:
        is_first = np.ones(m2.shape[0], dtype=bool)
        is_first[1:] = m2[1:] != m2[:-1]
        first[m2[is_first]] = code_v[is_first]
    return {
        "pm_ids": pm_ids,
        "platforms": platforms,
        "pe_times": times,
        "pe_key": key,
        "pe_machine": m2.astype(np.int64),
        "pe_code": code_v,
        "pm_first": first,
    }


def _capacities(me: Any) -> tuple[np.ndarray, np.ndarray]:
    """Sorted machine ids with a positive CPU capacity and that capacity: MAX(cap_cpu) per machine
    over its events (NULLs ignored), as cell-usage (:func:`machine_capacities`)."""
    ids, cpu, _ = machine_capacities(me)
    pos = cpu > 0
    return ids[pos], cpu[pos]
