"""CpiFilter: boundaries, NaN handling, exclusive rejection counts that add up."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from strategies import examples

from gpuclust.stats import REJECT_REASONS, CpiFilter

nan = np.nan


def test_defaults_and_frozen() -> None:
    f = CpiFilter()
    assert (f.cpi_min, f.cpi_max, f.mai_min, f.mai_max, f.min_cpu_seconds) == (0.0, 100.0, 0.0, 1.0, 0.01)
    with pytest.raises(dataclasses.FrozenInstanceError):
        f.cpi_max = 5.0  # type: ignore[misc]
    with pytest.raises(ValueError):
        CpiFilter(cpi_min=2.0, cpi_max=1.0)
    with pytest.raises(ValueError):
        CpiFilter(min_cpu_seconds=-1.0)


def test_boundaries() -> None:
    f = CpiFilter()
    cpi = np.array([0.0, 1e-9, 100.0, 100.0000001, 1.5, 1.5, 1.5, 1.5, 1.5, 1.5])
    mai = np.array([0.5, 0.5, 0.5, 0.5, 0.0, 1.0, -1e-12, 1.0000001, 0.01, 0.01])
    cs = np.array([1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 0.01, 0.00999])
    keep, c = f.mask(np, cpi, mai, cs)
    # CPI (0, 100]; MAI [0, 1]; CPU-seconds >= 0.01
    assert keep.tolist() == [False, True, True, False, True, True, False, False, True, False]
    assert c == {"total": 10, "kept": 5, "missing": 0, "cpu_seconds": 1, "cpi_range": 2, "mai_range": 2}


def test_missing_and_first_reason_wins() -> None:
    f = CpiFilter(cpi_max=10.0)
    cpi = np.array([nan, 1.0, np.inf, 50.0, 50.0, 1.0, 1.0], dtype=np.float32)
    mai = np.array([0.1, nan, 0.1, 0.1, 3.0, 3.0, 0.2], dtype=np.float32)
    cs = np.array([1.0, 1.0, 1.0, 0.0, 1.0, nan, 5.0])
    keep, c = f.mask(np, cpi, mai, cs)
    assert keep.tolist() == [False] * 6 + [True]
    assert c == {"total": 7, "kept": 1, "missing": 3, "cpu_seconds": 2, "cpi_range": 1, "mai_range": 0}


@settings(max_examples=examples(50), deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from([nan, -1.0, 0.0, 0.5, 1.58, 99.0, 150.0]),
            st.sampled_from([nan, -0.1, 0.0, 0.01, 1.0, 2.0]),
            st.sampled_from([nan, -1.0, 0.0, 0.005, 0.01, 300.0]),
        ),
        max_size=40,
    )
)
def test_counts_add_up_and_match_rule(rows: list[tuple[float, float, float]]) -> None:
    a = np.array(rows, dtype=np.float64).reshape(-1, 3)
    f = CpiFilter()
    keep, c = f.mask(np, a[:, 0], a[:, 1], a[:, 2])
    assert sum(c[r] for r in REJECT_REASONS) + c["kept"] == c["total"] == len(rows)
    expect = [bool(0 < p <= 100 and 0 <= m <= 1 and s >= 0.01 and s > 0) for p, m, s in rows]
    assert keep.tolist() == expect
