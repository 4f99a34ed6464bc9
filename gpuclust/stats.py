"""The plausibility filter for CPI/MAI windows (:class:`CpiFilter`), shared by ``cpi``,
``data-quality`` and the first pass of ``cpi`` (:mod:`gpuclust.analyses._machine_cells`).

The statistics only ``cpi`` uses live beside it in :mod:`gpuclust.analyses.cpi`: weighted moments,
Pearson and exact Spearman correlation (:mod:`gpuclust.analyses.cpi.correlation`), the weighted
least-squares regression and the Borg effects (:mod:`gpuclust.analyses.cpi.regression`), the
mergeable Spearman grid (:mod:`gpuclust.analyses.cpi.binning`).  Defaults justified in
``docs/analyses/cpi-math.md``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = ["CpiFilter"]


#: Rejection reasons, in the order they are tested (a window is counted under the first it fails).
REJECT_REASONS: tuple[str, ...] = ("missing", "cpu_seconds", "cpi_range", "mai_range")


@dataclass(frozen=True)
class CpiFilter:
    """Plausibility filter for usage windows with CPI and MAI (defaults justified in docs/analyses/cpi-math.md).

    A window is kept iff CPI and MAI are both present (not NaN) and finite,
    ``cpi_min < CPI <= cpi_max``, ``mai_min <= MAI <= mai_max`` and
    ``cpu_seconds >= min_cpu_seconds`` (with ``cpu_seconds > 0`` always required: it is the weight).

    Attributes
    ----------
    cpi_min : float
        Exclusive lower CPI bound (default 0: a CPI must be positive).
    cpi_max : float
        Inclusive upper CPI bound (default 100).
    mai_min, mai_max : float
        Inclusive MAI bounds (default [0, 1]).
    min_cpu_seconds : float
        Minimum CPU time in the window, in the trace's normalised CPU-seconds (NCU-s:
        ``average_usage.cpus * window seconds``); default 0.01.

    Examples
    --------
    >>> import numpy as np
    >>> keep, counts = CpiFilter().mask(np, np.array([1.5, np.nan, 300.0, 1.2]), np.array([0.01, 0.01, 0.02, 2.0]),
    ...                                 np.array([3.0, 3.0, 3.0, 3.0]))
    >>> keep.tolist(), counts
    ([True, False, False, False], {'total': 4, 'kept': 1, 'missing': 1, 'cpu_seconds': 0, 'cpi_range': 1, 'mai_range': 1})
    """

    cpi_min: float = 0.0
    cpi_max: float = 100.0
    mai_min: float = 0.0
    mai_max: float = 1.0
    min_cpu_seconds: float = 0.01

    def __post_init__(self) -> None:
        if not (self.cpi_min < self.cpi_max and self.mai_min <= self.mai_max):
            raise ValueError(f"empty CPI or MAI range in {self}")
        if not self.min_cpu_seconds >= 0:
            raise ValueError(f"min_cpu_seconds must be >= 0, got {self.min_cpu_seconds}")

    def mask(self, xp: Any, cpi: Any, mai: Any, cpu_seconds: Any) -> tuple[Any, dict[str, int]]:
        """Keep mask (``xp`` bool array) and window counts per first rejection reason.

        Counts: ``total``, ``kept`` and one entry per :data:`REJECT_REASONS` (exclusive, in that
        order: ``missing`` = CPI or MAI NaN/inf, ``cpu_seconds`` = CPU time NaN, ``<= 0`` or below
        the minimum, then the CPI and MAI ranges); they add up to ``total``.
        """
        cpi = xp.asarray(cpi)
        mai = xp.asarray(mai)
        cs = xp.asarray(cpu_seconds)
        # Successive passes: each stage keeps the rows that passed the previous ones, so a stage's
        # rejections are the drop in the count (the first reason a row fails).
        with np.errstate(invalid="ignore"):
            ok = xp.isfinite(cpi)
            ok &= xp.isfinite(mai)
            n_present = int(xp.count_nonzero(ok))
            ok &= cs > 0  # with the next two: finite, > 0 and >= the minimum (False for NaN)
            ok &= cs < np.inf
            ok &= cs >= self.min_cpu_seconds
            n_cs = int(xp.count_nonzero(ok))
            ok &= cpi > self.cpi_min
            ok &= cpi <= self.cpi_max
            n_cpi = int(xp.count_nonzero(ok))
            ok &= mai >= self.mai_min
            ok &= mai <= self.mai_max
            kept = int(xp.count_nonzero(ok))
        total = int(cpi.shape[0])
        counts = {"total": total, "kept": kept}
        for name, c in zip(
            REJECT_REASONS, (total - n_present, n_present - n_cs, n_cs - n_cpi, n_cpi - kept), strict=True
        ):
            counts[name] = c
        return ok, counts
