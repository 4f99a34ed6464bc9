"""The context of ``usage-distribution`` and its passes (:mod:`gpuclust.analyses.usage_distribution`):
what the client computes once and every partition task reads."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from gpuclust.analyses._lookup import InstanceLookup
from gpuclust.schema import TierMap
from gpuclust.tiers import TierNames

__all__ = ["UsageDistributionContext"]


@dataclass(frozen=True)
class UsageDistributionContext(TierNames):
    strategy: str
    rows: str
    total_rows: int
    levels: np.ndarray
    cell: str
    tier_map: TierMap | None
    #: (collection_id, instance_index, machine_id) -> tier code (``tier`` in ``by`` only; set by ``bind``)
    lookup: InstanceLookup = InstanceLookup.empty()
    #: every group's windows are in one partition (``by`` has ``instance`` and the layout buckets
    #: usage by instance): each partial finalizes its own groups (``bind`` sets it per partition)
    local_groups: bool = False
    #: ``exact-two-pass``: the first pass's groups (sorted keys) and their quantile brackets (G, L)
    br_key: np.ndarray | None = None
    br_lo: np.ndarray | None = None
    br_hi: np.ndarray | None = None
    #: the exact pass's pieces estimated per bracket (G, L), and the refinement passes that cut them
    br_est: np.ndarray | None = None
    refine: int = 0
    #: the first pass's summary size (``exact-two-pass``)
    bracket_k: int = 0
    #: a refinement pass's sub-bins per open bracket (0: it does not cut)
    refine_bins: int = 0
    #: a first pass in slices: ``(part, slices)``, the collections it reads (None: all); the
    #: exact pass's: the slices its first pass ran in
    slice_of: tuple[int, int] | None = None
    slices: int = 1
    #: ``auto``'s row limit of the exact strategy in force when the context was made (-1: none)
    row_limit: int = -1
