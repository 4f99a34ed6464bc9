"""Shared pieces against obvious references, on every backend: ``segmented_last`` (the as-of joins
and life cycles use it) and ``bucket_pieces`` (windows cut at bucket edges) against loops,
``instance_order`` against a sort of (collection, instance, time, row) tuples,
``partials.log_bins`` (the ratio bins) against the binary search."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from strategies import examples

from gpuclust.analyses.grouping import FloatBins, bucket_pieces, instance_order, segmented_last


@settings(max_examples=examples(200), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(flags=st.lists(st.booleans(), max_size=60), cuts=st.sets(st.integers(1, 59), max_size=8))
def test_segmented_last_is_the_last_flag_of_the_run(backend, flags, cuts):
    xp = backend.xp
    n = len(flags)
    seg = [max([0, *(c for c in cuts if c <= i)]) for i in range(n)]
    want = [max([j for j in range(seg[i], i + 1) if flags[j]], default=-1) for i in range(n)]
    got = segmented_last(
        backend.ops, xp, backend.asarray(np.array(flags, dtype=bool)), backend.asarray(np.array(seg, np.int64))
    )
    assert backend.to_host(got).tolist() == want


@settings(max_examples=examples(200), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    wins=st.lists(st.tuples(st.integers(0, 10_000), st.integers(1, 2_500)), max_size=30),
    width=st.sampled_from([1, 7, 100, 300]),
)
def test_bucket_pieces_cover_each_window_once(backend, wins, width):
    xp = backend.xp
    s = np.array([a for a, _ in wins], np.int64)
    e = s + np.array([d for _, d in wins], np.int64)
    row, bucket, overlap = (
        backend.to_host(a) for a in bucket_pieces(xp, backend.asarray(s), backend.asarray(e), width)
    )
    want = [
        (r, b, min(e[r], (b + 1) * width) - max(s[r], b * width))
        for r in range(len(wins))
        for b in range(s[r] // width, (e[r] - 1) // width + 1)
    ]
    assert list(zip(row.tolist(), bucket.tolist(), overlap.tolist(), strict=True)) == want


@settings(max_examples=examples(300), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    rows=st.lists(
        st.tuples(st.sampled_from([0, 7, -3, 2**62, -(2**62), 41]), st.integers(-2, 4), st.integers(0, 6)), max_size=40
    ),
    time_sorted=st.booleans(),
    wide=st.sampled_from([0, 55, 58]),
    wide_time=st.booleans(),
)
def test_instance_order_is_the_stable_three_key_sort(backend, rows, time_sorted, wide, wide_time):
    """Rows by collection, instance, time, ties in row order: time-ordered input (the one-sort path),
    unordered input (a time rank first), instance indexes so wide that the key fits but not beside
    the row (2^55: the dense-rank path) or would overflow (2^58: the lexsort path), and times
    spanning 0 to 2^63-1 (the trace's sentinels: the time rank by argsort)."""
    if time_sorted:
        rows = sorted(rows, key=lambda r: r[2])
    c = np.array([r[0] for r in rows], np.int64)
    i = np.array([r[1] * 2**wide for r in rows], np.int64)
    t = np.array([(2**63 - 1 if r[2] == 6 else r[2] * 10**12) if wide_time else r[2] for r in rows], np.int64)
    want = sorted(range(len(rows)), key=lambda j: (c[j], i[j], t[j], j))
    got = instance_order(backend.xp, *(backend.asarray(a) for a in (c, i, t)))
    assert backend.to_host(got).tolist() == want


@settings(max_examples=examples(200), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(keys=st.lists(st.integers(0, 2**40), max_size=50), span_bits=st.integers(1, 63))
def test_packed_order_is_the_stable_argsort_or_declines(backend, keys, span_bits):
    """``packed_order`` is NumPy's stable argsort wherever ``key << bits | row`` fits in 63 bits,
    and ``None`` exactly where it does not."""
    from gpuclust.analyses.grouping import packed_order

    key = np.array(keys, np.int64) % (1 << min(span_bits, 40))
    span = 1 << span_bits
    got = packed_order(backend.xp, backend.asarray(key), span)
    bits = max(len(keys) - 1, 1).bit_length()
    if span_bits + bits > 63:
        assert got is None
    else:
        assert backend.to_host(got).tolist() == np.argsort(key, kind="stable").tolist()


@settings(max_examples=examples(200), deadline=None)
@given(
    hashes=st.lists(
        st.one_of(
            st.integers(0, 2**64 - 1), st.builds(lambda t, lo: (t << 60) | lo, st.integers(0, 15), st.integers(0, 255))
        ),
        max_size=60,
    )
)
def test_hash_order_sorts_hashes_sharing_their_top_bits(hashes):
    """``hash_order`` against a plain sort: full-range hashes, and hashes drawn to share their top
    bits (the packed sort's key) and differ below them, in any order (the stable fix-up)."""
    from gpuclust.analyses.grouping import hash_order

    h = np.array(hashes, dtype=np.uint64)
    got = hash_order(h)
    assert sorted(got.tolist()) == list(range(len(hashes)))
    assert h[got].tolist() == sorted(hashes)


@settings(max_examples=examples(200), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    values=st.lists(
        st.one_of(
            st.integers(-(2**63), 2**63 - 1),
            st.sampled_from([0, 1, 2**62, -(2**63), 2**63 - 1]),
            st.builds(lambda t, lo: (t << 58) | lo, st.integers(0, 15), st.integers(0, 3)),
        ),
        max_size=50,
    )
)
def test_dense_rank_is_the_rank_among_distinct_values(backend, values):
    """``dense_rank`` is ``np.unique``'s inverse and count, for values of any range: narrow (the
    packed sort) and up to the whole int64 range (argsort), values sharing their top bits included."""
    from gpuclust.analyses.grouping import dense_rank

    a = np.array(values, np.int64)
    uniq, inv = np.unique(a, return_inverse=True)
    got, k = dense_rank(backend.xp, backend.asarray(a))
    assert backend.to_host(got).tolist() == inv.reshape(-1).tolist() and k == uniq.shape[0]


def test_log_bins_equal_the_binary_search_on_the_ratio_edges(backend):
    """``partials.log_bins`` (usage-change, usage-vs-request, data-quality) is ``searchsorted(...,
    side="right")`` exactly: every edge, its neighbours in float64, 0, negatives, NaN, infinities
    and random ratios."""
    from gpuclust.analyses.data_quality import RATIO_EDGES as DQ_EDGES
    from gpuclust.analyses.usage_change import RATIO_EDGES
    from gpuclust.partials import log_bins

    rng = np.random.default_rng(5)
    for edges in (RATIO_EDGES, DQ_EDGES):
        v = np.concatenate(
            [
                edges,
                np.nextafter(edges, 0),
                np.nextafter(edges, np.inf),
                np.exp(rng.normal(0, 6, 50_000)),
                [0.0, -1.0, np.nan, np.inf, -np.inf, 1e-300, 1e300],
            ]
        )
        got = backend.to_host(log_bins(backend.xp, backend.asarray(edges), backend.asarray(v)))
        assert np.array_equal(got, np.searchsorted(edges, v, side="right"))


@settings(max_examples=examples(60), deadline=None)
@given(st.lists(st.floats(allow_nan=False, width=64), min_size=1, max_size=200), st.integers(0, 10**6))
def test_float_bins_equal_a_binary_search(xs: list[float], seed: int) -> None:
    """FloatBins against searchsorted, at random values and at, just below and just above every edge."""

    rng = np.random.default_rng(seed)
    edges = np.sort(rng.choice(10.0 ** (np.arange(-60, 101) / 20), 40, replace=False))  # 1e-3 .. 1e5
    fb = FloatBins(edges, bits=8, lo=2.0**-11, hi=2.0**18)
    near = np.concatenate([edges, np.nextafter(edges, -np.inf), np.nextafter(edges, np.inf)])
    x = np.concatenate([np.array(xs), near, [0.0, -0.0, np.inf, -np.inf, 2.0**-11, 2.0**18]])
    assert (fb.bins(np, x) == np.searchsorted(edges, x, side="right")).all()


def test_float_bins_refuse_cells_wider_than_the_edges() -> None:

    with pytest.raises(AssertionError, match="cells too wide"):
        FloatBins(np.array([1.0, 1.05, 1.1, 2.0]), bits=2, lo=1.0, hi=4.0)  # two edges inside the cell [1, 1.25)
    with pytest.raises(AssertionError, match="cells too wide"):
        FloatBins(np.array([1.0, 10.0]), bits=2, lo=1.0, hi=8.0)  # an edge at or above hi
