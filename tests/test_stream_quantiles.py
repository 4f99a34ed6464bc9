"""gpuclust.stream_quantiles: equal to np.quantile bit for bit, in few passes and bounded memory."""

from __future__ import annotations

import doctest
import math
import tracemalloc

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from strategies import examples

from gpuclust import stream_quantiles as sq_mod
from gpuclust.stream_quantiles import stream_quantiles

INF = float("inf")
SPECIAL = [
    0.0,
    -0.0,
    INF,
    -INF,
    1.0,
    -1.0,
    0.5,
    5e-324,
    -5e-324,
    2.2250738585072014e-308,
    1.7976931348623157e308,
    -1.7976931348623157e308,
    1e-300,
    3.0,
]


class Counted:
    """``batches`` callable over fixed splits of an array, counting its calls (passes)."""

    def __init__(self, x: np.ndarray, cuts: list[int]):
        self.parts = np.split(x, sorted(cuts))
        self.calls = 0

    def __call__(self):
        self.calls += 1
        return iter(self.parts)


def same(got: np.ndarray, want: np.ndarray, x: np.ndarray) -> bool:
    """Bit for bit, except the sign of a zero result when x holds both zeros (documented)."""
    if got.dtype != np.float64 or got.shape != want.shape:
        return False
    zeros = x[x == 0]
    if np.signbit(zeros).any() and not np.signbit(zeros).all():
        return bool(np.all((got == want) | (np.isnan(got) & np.isnan(want))))
    return np.array_equal(got.view(np.int64), want.view(np.int64))


def test_doctests():
    assert doctest.testmod(sq_mod, optionflags=doctest.ELLIPSIS).failed == 0


@settings(max_examples=examples(300), deadline=None)
@given(
    x=st.lists(
        st.one_of(st.sampled_from(SPECIAL), st.floats(allow_nan=False), st.integers(-3, 3).map(float)),
        min_size=1,
        max_size=80,
    ),
    cuts=st.lists(st.integers(0, 80), max_size=6),
    qs=st.lists(st.one_of(st.just(0.0), st.just(1.0), st.floats(0, 1)), min_size=1, max_size=6),
    bins_bits=st.integers(1, 16),
    max_candidates=st.integers(1, 8),
)
def test_equals_np_quantile(x, cuts, qs, bins_bits, max_candidates):
    x = np.array(x, dtype=np.float64)
    b = Counted(x, [c for c in cuts if c <= x.size])
    with np.errstate(invalid="ignore", over="ignore"):  # inf - inf -> nan, max - (-max) -> inf: as in NumPy
        want = np.quantile(x, qs)
        got = stream_quantiles(b, qs, bins_bits=bins_bits, max_candidates=max_candidates)
    assert same(got, want, x), (got, want)
    assert b.calls <= (1 if x.size <= max_candidates else math.ceil(64 / bins_bits) + 1)


@pytest.mark.parametrize("max_candidates", [1, 3, 100])
def test_edge_qs_and_zeros(max_candidates):
    for x in ([-0.0] * 5, [-0.0, 2.0, -0.0, 1.0, -0.0], [0.0, -1.0, 0.0], [-0.0, 0.0, -0.0, 0.0, 7.0]):
        x = np.array(x)
        for qs in ([0, 1], [0.0, 0.25, 0.5, 1.0], np.array([0.5, 0.3], np.float32), []):
            got = stream_quantiles(lambda x=x: iter([x[:2], x[2:]]), qs, bins_bits=5, max_candidates=max_candidates)
            assert same(got, np.quantile(x, qs), x), (x, qs, got)
    x = np.array([-0.0] * 9)  # NumPy's lerp itself gives 0.0 here (-0.0 + 0.0)
    got = stream_quantiles(lambda: iter([x]), [0.0, 0.5, 1.0], max_candidates=2)
    assert np.array_equal(got.view(np.int64), np.quantile(x, [0.0, 0.5, 1.0]).view(np.int64))


@pytest.mark.parametrize("bins_bits", [4, 8, 12, 16])
def test_passes_and_peak_memory(bins_bits):
    rng = np.random.default_rng(bins_bits)
    x = np.round(rng.lognormal(size=400_000), 3)  # many ties
    x[::50] = 1.0
    b = Counted(x, list(range(10_000, 400_000, 10_000)))
    qs = [0.0, 0.5, 0.9, 0.99, 1.0]
    stream_quantiles(b, qs, bins_bits=3, max_candidates=100)  # NumPy's lazy imports happen outside the trace
    b.calls = 0
    tracemalloc.start()
    try:
        got = stream_quantiles(b, qs, bins_bits=bins_bits, max_candidates=100)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert np.array_equal(got.view(np.int64), np.quantile(x, qs).view(np.int64))
    assert 2 <= b.calls <= 1 + math.ceil(64 / bins_bits) + 1
    # a few batch-sized temporaries and one histogram per needed bin, never all values
    assert peak < 10 * b.parts[0].nbytes + 2 * len(qs) * (8 << bins_bits) + 200_000
    if bins_bits <= 12:
        assert peak < x.nbytes / 2


def test_small_input_one_pass():
    x = np.arange(10.0)
    b = Counted(x, [3, 7])
    assert np.array_equal(stream_quantiles(b, [0.5, 0.95], max_candidates=10), np.quantile(x, [0.5, 0.95]))
    assert b.calls == 1


def test_errors():
    with pytest.raises(ValueError, match=r"^stream_quantiles: NaN in the input$"):
        stream_quantiles(lambda: iter([np.array([1.0]), np.array([2.0, np.nan])]), [0.5])
    for empty in ([], [np.array([]), np.zeros(0)]):
        with pytest.raises(ValueError, match=r"^stream_quantiles: no values$"):
            stream_quantiles(lambda empty=empty: iter(empty), [0.5])
    for qs in ([-0.1], [0.5, 1.1], [float("nan")]):
        with pytest.raises(ValueError, match=r"^stream_quantiles: qs must be a sequence of numbers in \[0, 1\]"):
            stream_quantiles(lambda: iter([np.array([1.0])]), qs)
    calls = iter(range(100))
    with pytest.raises(RuntimeError, match="batches\\(\\) gave other values"):
        stream_quantiles(lambda: iter([np.arange(20.0) * next(calls)]), [0.5], bins_bits=2, max_candidates=3)


def test_two_million_values():
    rng = np.random.default_rng(8)
    x = np.concatenate([rng.gamma(2.0, 0.4, 1_500_000), np.ones(400_000), rng.uniform(0, 4, 100_000)])
    rng.shuffle(x)
    qs = [0.0, 0.5, 0.9, 0.99, 0.999999, 1.0]
    b = Counted(x, list(range(100_000, 2_000_000, 100_000)))
    got = stream_quantiles(b, qs, max_candidates=1000)
    assert np.array_equal(got.view(np.int64), np.quantile(x, qs).view(np.int64))
    assert b.calls <= 1 + math.ceil(64 / 16) + 1


def test_big_tie_resolved_without_fixing_all_bits():
    x = np.zeros(50_000)
    x[::1000] = np.arange(50) / 7.0
    b = Counted(x, [20_000, 40_000])
    qs = [0.0, 0.5, 0.9995, 1.0]
    got = stream_quantiles(b, qs, bins_bits=8, max_candidates=100)
    assert np.array_equal(got.view(np.int64), np.quantile(x, qs).view(np.int64))
    assert b.calls == 2  # histogram; then 0.0's bin is seen to hold one value, the others are collected


@settings(max_examples=examples(200), deadline=None)
@given(
    values=st.lists(st.floats(-1e12, 1e12, allow_nan=False, allow_subnormal=False), min_size=1, max_size=60),
    qs=st.lists(st.one_of(st.floats(0, 1), st.sampled_from([0.0, 0.5, 0.9, 0.99, 0.999, 1.0])), min_size=1, max_size=6),
)
def test_sorted_quantiles_are_numpys(values, qs):
    """``sorted_quantiles`` of sorted values is ``np.quantile`` (linear), value for value."""
    from gpuclust.stream_quantiles import sorted_quantiles

    x = np.array(values, np.float64)
    got = sorted_quantiles(np.sort(x), qs)
    want = np.quantile(x, np.array(qs, np.float64))
    assert np.array_equal(got, want), (got, want)


def test_sorted_quantiles_refuse_no_values():
    from gpuclust.stream_quantiles import sorted_quantiles

    with pytest.raises(ValueError, match="no values"):
        sorted_quantiles(np.zeros(0), [0.5])


@settings(max_examples=examples(150), deadline=None)
@given(
    xs=st.lists(
        st.lists(st.one_of(st.sampled_from(SPECIAL), st.floats(allow_nan=False)), max_size=40), min_size=1, max_size=4
    ),
    n_batches=st.integers(1, 4),
    qs=st.lists(st.one_of(st.just(0.0), st.just(1.0), st.floats(0, 1)), min_size=1, max_size=5),
    bins_bits=st.integers(1, 16),
    max_candidates=st.integers(1, 12),
)
def test_many_streams_equal_np_quantile_each(xs, n_batches, qs, bins_bits, max_candidates):
    """Row j of ``stream_quantiles_many`` is ``np.quantile`` of stream j (NaN for an empty stream),
    in the passes of the stream that needs most, each pass one read of the shared batches."""
    from gpuclust.stream_quantiles import stream_quantiles_many

    arrays = [np.array(x, dtype=np.float64) for x in xs]
    parts = [np.array_split(a, n_batches) for a in arrays]
    calls = []

    def batches():
        calls.append(1)
        return iter([tuple(p[i] for p in parts) for i in range(n_batches)])

    with np.errstate(invalid="ignore", over="ignore"):
        got = stream_quantiles_many(batches, len(arrays), qs, bins_bits=bins_bits, max_candidates=max_candidates)
        for j, a in enumerate(arrays):
            if a.size == 0:
                assert np.isnan(got[j]).all()
            else:
                assert same(got[j], np.quantile(a, qs), a), (j, got[j], np.quantile(a, qs))
    assert got.shape == (len(arrays), len(qs))
    assert len(calls) <= 1 + math.ceil(64 / bins_bits) + 1


def test_many_streams_check_their_batches():
    from gpuclust.stream_quantiles import stream_quantiles_many

    with pytest.raises(ValueError, match="a batch has 1 arrays, not 2"):
        stream_quantiles_many(lambda: iter([(np.array([1.0]),)]), 2, [0.5])
    with pytest.raises(ValueError, match="k must be at least 1"):
        stream_quantiles_many(lambda: iter([]), 0, [0.5])
    with pytest.raises(ValueError, match=r"^stream_quantiles: NaN in the input$"):
        stream_quantiles_many(lambda: iter([(np.array([1.0]), np.array([np.nan]))]), 2, [0.5])


@settings(max_examples=examples(60), deadline=None)
@given(
    values=st.lists(
        st.one_of(st.sampled_from(SPECIAL[2:]), st.floats(-1e6, 1e6, allow_nan=False)), min_size=1, max_size=300
    ),
    cuts=st.lists(st.integers(0, 300), max_size=4),
    qs=st.lists(st.floats(0, 1), min_size=1, max_size=6),
)
def test_backend_quantiles_equal_np_quantile_on_every_backend(values, cuts, qs):
    """On the device-shaped backend (the device path: one sort of the copied values, only the order
    statistics back) and the generic one, np.quantile's result, as stream_quantiles on the cpu.
    (Zeros of both signs are left out: their sign may differ, as documented.)"""
    from device_backend import DEVICE
    from generic_backend import GENERIC

    from gpuclust.backends import get_backend
    from gpuclust.stream_quantiles import backend_quantiles

    x = np.array(values, dtype=np.float64)
    parts = np.split(x, sorted(c for c in cuts if c <= x.size))
    with np.errstate(all="ignore"):  # next to an infinity or across the float range, as NumPy
        want = np.quantile(x, qs)
        for be in (get_backend("cpu"), GENERIC, DEVICE):
            got = backend_quantiles(be, lambda: iter(parts), qs)
            assert isinstance(got, np.ndarray)
            np.testing.assert_array_equal(got, want)


def test_backend_quantiles_refuse_nan_and_nothing():
    from device_backend import DEVICE

    from gpuclust.stream_quantiles import backend_quantiles

    with pytest.raises(ValueError, match="NaN"):
        backend_quantiles(DEVICE, lambda: iter([np.array([1.0, np.nan])]), [0.5])
    with pytest.raises(ValueError, match="no values"):
        backend_quantiles(DEVICE, lambda: iter([]), [0.5])


@settings(max_examples=examples(40), deadline=None)
@given(
    streams=st.lists(
        st.lists(st.one_of(st.sampled_from(SPECIAL[2:]), st.floats(-1e6, 1e6, allow_nan=False)), max_size=120),
        min_size=1,
        max_size=4,
    ),
    cuts=st.lists(st.integers(0, 120), max_size=3),
    qs=st.lists(st.floats(0, 1), min_size=1, max_size=5),
)
def test_backend_quantiles_many_equal_np_quantile_on_every_backend(streams, cuts, qs):
    """k streams at once, batch by batch: np.quantile of each stream (NaN rows for an empty one) on
    the cpu (stream_quantiles_many), the generic and the device-shaped backend (one pass, one
    sort a stream on the device)."""
    from device_backend import DEVICE
    from generic_backend import GENERIC

    from gpuclust.backends import get_backend
    from gpuclust.stream_quantiles import backend_quantiles_many

    xs = [np.array(v, dtype=np.float64) for v in streams]
    n = max(x.size for x in xs)
    bounds = [0, *sorted(c for c in cuts if c <= n), n]
    batches = [tuple(x[a:b] for x in xs) for a, b in zip(bounds[:-1], bounds[1:], strict=True)]
    with np.errstate(all="ignore"):
        want = np.array([np.quantile(x, qs) if x.size else np.full(len(qs), np.nan) for x in xs])
        for be in (get_backend("cpu"), GENERIC, DEVICE):
            got = backend_quantiles_many(be, lambda: iter(batches), len(xs), qs)
            assert isinstance(got, np.ndarray) and got.shape == (len(xs), len(qs))
            np.testing.assert_array_equal(got, want)
