"""Hypothesis strategies for usage-window percentile vectors and groups of them, with the ugly
cases real data has: flat runs (point masses), one-point windows, non-monotone vectors, NULLs,
zero weights, values from 1e-6 to 1e3 (and 0), weights spanning nine orders of magnitude."""

from __future__ import annotations

import numpy as np
from hypothesis import strategies as st

NL = 20
_ANCHORS = [0.0, 1e-6, 1e-3, 0.5, 1.0, 1e3]
value = st.one_of(st.sampled_from(_ANCHORS), st.floats(1e-6, 1e3, allow_nan=False, allow_infinity=False))
weight = st.one_of(st.just(0.0), st.sampled_from([1e-3, 1.0, 300.0, 1e6]), st.floats(1e-3, 1e6))


@st.composite
def window(draw: st.DrawFn, *, monotone: bool = True, allow_null: bool = False) -> np.ndarray:
    kind = draw(st.sampled_from(["random", "random", "few_values", "one_point", "scaled"]))
    if kind == "one_point":
        v = np.full(NL, draw(value))
    elif kind == "few_values":
        pool = draw(st.lists(value, min_size=1, max_size=3))
        v = np.array(draw(st.lists(st.sampled_from(pool), min_size=NL, max_size=NL)), dtype=np.float64)
    elif kind == "scaled":
        base = np.linspace(0.0, 1.0, NL) ** draw(st.sampled_from([0.5, 1.0, 3.0]))
        v = base * draw(st.floats(1e-6, 1e3)) + draw(st.sampled_from([0.0, 1e-6, 2.0]))
    else:
        v = np.array(draw(st.lists(value, min_size=NL, max_size=NL)), dtype=np.float64)
    if monotone:
        v = np.sort(v)
    if allow_null and draw(st.integers(0, 9)) == 0:
        v[draw(st.integers(0, NL - 1))] = np.nan
    return v


@st.composite
def groups(
    draw: st.DrawFn, *, max_windows: int = 6, max_groups: int = 3, monotone: bool = True, allow_null: bool = False
) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
    """``(q (n, 20), w (n,), group (n,) int64, n_groups)``; windows of a group may be duplicated."""
    n_groups = draw(st.integers(1, max_groups))
    n = draw(st.integers(1, max_windows))
    rows = [draw(window(monotone=monotone, allow_null=allow_null)) for _ in range(n)]
    if n > 1 and draw(st.booleans()):  # identical breakpoints across windows
        rows[-1] = rows[0].copy()
    q = np.ascontiguousarray(np.stack(rows))
    w = np.array([draw(weight) for _ in range(n)], dtype=np.float64)
    g = np.array([draw(st.integers(0, n_groups - 1)) for _ in range(n)], dtype=np.int64)
    return q, w, g, n_groups
