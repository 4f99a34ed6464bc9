"""The custom-kernel ops: NumPy twins against slow loops, argument checks, and CPU/GPU parity."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from strategies import examples

from gpuclust.backends import cpu

HOUR = 3_600_000_000
MAXT = 2**63 - 1


def slow_bucket_overlap(start, end, value, group, n_groups, n_buckets, origin, width):
    out = np.zeros((n_groups, n_buckets))
    for s, e, v, g in zip(start.tolist(), end.tolist(), value.tolist(), group.tolist(), strict=False):
        if not (0 <= g < n_groups) or v != v:
            continue
        for b in range(n_buckets):
            lo, hi = origin + b * width, origin + (b + 1) * width
            ov = min(e, hi) - max(s, lo)
            if ov > 0:
                out[g, b] += float(v) * (ov / 1e6)
    return out


@st.composite
def intervals(draw):
    n = draw(st.integers(0, 40))
    width = draw(st.sampled_from([1, 7, 1_000_000, HOUR]))
    n_buckets = draw(st.integers(0, 12))
    origin = draw(st.sampled_from([0, -5 * width, 3 * width + 1, 2**40]))
    lo, hi = origin - 2 * width, origin + (n_buckets + 2) * width
    ts = st.one_of(st.integers(lo, hi), st.sampled_from([0, MAXT, origin, origin + width]))
    start = np.array(draw(st.lists(ts, min_size=n, max_size=n)), dtype=np.int64)
    kind = draw(st.lists(st.sampled_from(["len", "end", "zero"]), min_size=n, max_size=n))
    end = start.copy()
    for k in range(n):
        if kind[k] == "len":
            end[k] = min(MAXT, int(start[k]) + draw(st.integers(0, 3 * width)))
        elif kind[k] == "end":
            end[k] = draw(ts)
    dtype = draw(st.sampled_from([np.float32, np.float64]))
    vals = draw(st.lists(st.one_of(st.floats(-10, 10, width=32), st.just(float("nan"))), min_size=n, max_size=n))
    value = np.array(vals, dtype=dtype)
    n_groups = draw(st.integers(0, 4))
    group = np.array(draw(st.lists(st.integers(-1, 4), min_size=n, max_size=n)), dtype=np.int32)
    return start, end, value, group, n_groups, n_buckets, origin, width


@settings(max_examples=examples(150), deadline=None)
@given(intervals())
def test_bucket_overlap_twin_matches_slow_loop(args):
    start, end, value, group, n_groups, n_buckets, origin, width = args
    got = cpu.bucket_overlap(
        start, end, value, group, n_groups=n_groups, n_buckets=n_buckets, origin=origin, width=width
    )
    want = slow_bucket_overlap(start, end, value, group, n_groups, n_buckets, origin, width)
    assert got.dtype == np.float64 and got.shape == (n_groups, n_buckets)
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-9)


@settings(max_examples=examples(80), deadline=None)
@given(intervals(), st.integers(0, 3), st.data())
def test_bucket_overlap_2d_values_are_independent_series(args, k, data):
    """A (k, n) value gives k series over the same intervals; a NaN drops the row from its own series only."""
    start, end, value, group, n_groups, n_buckets, origin, width = args
    n = start.shape[0]
    rows = [
        data.draw(st.lists(st.one_of(st.floats(-10, 10, width=32), st.just(float("nan"))), min_size=n, max_size=n))
        for _ in range(k)
    ]
    vals = np.array(rows, dtype=value.dtype).reshape(k, n)
    kw = dict(n_groups=n_groups, n_buckets=n_buckets, origin=origin, width=width)
    got = cpu.bucket_overlap(start, end, vals, group, **kw)
    assert got.shape == (k, n_groups, n_buckets)
    for j in range(k):
        np.testing.assert_allclose(
            got[j],
            slow_bucket_overlap(start, end, vals[j], group, n_groups, n_buckets, origin, width),
            rtol=1e-12,
            atol=1e-9,
        )


def test_bucket_overlap_crossing_and_sentinels():
    start = np.array([HOUR - 60_000_000, 0, 5, 2 * HOUR], dtype=np.int64)
    end = np.array([HOUR + 240_000_000, MAXT, 5, 2 * HOUR], dtype=np.int64)
    value = np.array([1.0, 2.0, 9.0, 9.0])
    group = np.zeros(4, dtype=np.int32)
    out = cpu.bucket_overlap(start, end, value, group, n_groups=1, n_buckets=3, origin=0, width=HOUR)
    np.testing.assert_allclose(out[0], [60 + 2 * 3600, 240 + 2 * 3600, 2 * 3600])


@settings(max_examples=examples(100), deadline=None)
@given(
    st.lists(st.tuples(st.integers(-2, 6), st.one_of(st.floats(-1e6, 1e6), st.just(float("nan")))), max_size=50),
    st.integers(0, 6),
    st.sampled_from([np.int32, np.int64]),
    st.sampled_from([np.float32, np.float64]),
)
def test_grouped_sum_twin_matches_loop(rows, n_groups, cdt, vdt):
    codes = np.array([r[0] for r in rows], dtype=cdt)
    values = np.array([r[1] for r in rows], dtype=vdt)
    want = np.zeros(n_groups)
    for c, v in zip(codes.tolist(), values.tolist(), strict=False):
        if 0 <= c < n_groups and v == v:
            want[c] += v
    np.testing.assert_allclose(cpu.grouped_sum(codes, values, n_groups=n_groups), want, rtol=1e-12, atol=1e-6)


def test_argument_checks(backend):
    xp, ops = backend.xp, backend.ops
    i64 = xp.zeros(4, dtype=xp.int64)
    f64 = xp.zeros(4, dtype=xp.float64)
    g32 = xp.zeros(4, dtype=xp.int32)
    kw = dict(n_groups=1, n_buckets=1, origin=0, width=HOUR)
    with pytest.raises(TypeError, match="start"):
        ops.bucket_overlap(i64.astype(xp.int32), i64, f64, g32, **kw)
    with pytest.raises(TypeError, match="group"):
        ops.bucket_overlap(i64, i64, f64, g32.astype(xp.int64), **kw)
    with pytest.raises(ValueError, match="contiguous"):
        ops.bucket_overlap(xp.zeros(8, dtype=xp.int64)[::2], i64, f64, g32, **kw)
    with pytest.raises(ValueError, match="length"):
        ops.bucket_overlap(i64, i64[:3], f64, g32, **kw)
    with pytest.raises(ValueError, match="width"):
        ops.bucket_overlap(i64, i64, f64, g32, n_groups=1, n_buckets=1, origin=0, width=0)
    with pytest.raises(ValueError, match="int64"):
        ops.bucket_overlap(i64, i64, f64, g32, n_groups=1, n_buckets=2**40, origin=0, width=HOUR)
    with pytest.raises(TypeError, match="values"):
        ops.grouped_sum(g32, i64, n_groups=2)
    with pytest.raises(ValueError, match="columns"):
        ops.bucket_overlap(i64, i64, xp.zeros((2, 3)), g32, **kw)
    with pytest.raises(ValueError, match="contiguous"):
        ops.bucket_overlap(i64, i64, xp.zeros((4, 2)).T, g32, **kw)


# ------------------------------------------------------------------------------ GPU parity
def _rng_case(rng, n, n_groups, n_buckets, width, dtype, contention):
    origin = int(rng.integers(-3, 3)) * width
    span = n_buckets * width
    start = rng.integers(origin - width, origin + span + width, n).astype(np.int64)
    length = rng.choice(np.array([0, 1, width // 3, width, 3 * width + 5]), n)
    end = start + length
    end[rng.random(n) < 0.01] = MAXT
    start[rng.random(n) < 0.01] = 0
    value = rng.random(n).astype(dtype)
    value[rng.random(n) < 0.01] = np.nan
    group = rng.integers(-1, n_groups + 1, n).astype(np.int32)
    if contention:  # every interval in one (group, bucket) cell
        start[:] = origin + width // 4
        end[:] = origin + width // 2
        group[:] = 0
    return start, end, value, group, origin


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize(
    ("n", "n_groups", "n_buckets", "contention"),
    [
        (0, 3, 5, False),
        (1, 1, 1, False),
        (1000, 5, 24, False),  # shared-memory path
        (200_000, 5, 744, False),  # shared (5*744*8 < 48 KiB)
        (200_000, 6, 5000, False),  # global-atomics path
        (300_000, 1, 4, True),
        (300_000, 2, 20000, True),  # heavy contention, both paths
    ],
)
def test_bucket_overlap_gpu_parity(gpu_backend, dtype, n, n_groups, n_buckets, contention):
    cp = gpu_backend.xp
    rng = np.random.default_rng(n + n_buckets)
    width = HOUR
    start, end, value, group, origin = _rng_case(rng, n, n_groups, n_buckets, width, dtype, contention)
    kw = dict(n_groups=n_groups, n_buckets=n_buckets, origin=origin, width=width)
    want = cpu.bucket_overlap(start, end, value, group, **kw)
    got = gpu_backend.ops.bucket_overlap(cp.asarray(start), cp.asarray(end), cp.asarray(value), cp.asarray(group), **kw)
    np.testing.assert_allclose(
        cp.asnumpy(got), want, rtol=1e-9, atol=1e-9 * max(1.0, float(np.abs(want).max(initial=0)))
    )


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize(
    ("n", "n_groups", "n_buckets", "contention", "force_global"),
    [
        (100_000, 4, 300, False, False),  # 3 series: shared memory (3 x 4 x 300 doubles)
        (100_000, 4, 300, False, True),  # the same, global variant forced
        (100_000, 6, 2000, False, False),  # 3 x 6 x 2000 doubles: global
        (300_000, 1, 4, True, False),  # every interval in one cell, all series
    ],
)
def test_bucket_overlap_gpu_parity_2d(
    gpu_backend, monkeypatch, dtype, n, n_groups, n_buckets, contention, force_global
):
    """k series in one launch: each the 1-D sweep of its own values, a NaN dropping the interval
    from its own series only."""
    from gpuclust.backends import gpu

    if force_global:
        monkeypatch.setattr(gpu, "SHARED_BYTES", 0)
    cp = gpu_backend.xp
    rng = np.random.default_rng(n + n_buckets)
    start, end, value, group, origin = _rng_case(rng, n, n_groups, n_buckets, HOUR, dtype, contention)
    other = rng.random(n).astype(dtype)
    other[rng.random(n) < 0.1] = np.nan  # NaNs where the first series has none (and the reverse)
    vals = np.ascontiguousarray(np.stack([value, other, np.ones(n, dtype=dtype)]))
    kw = dict(n_groups=n_groups, n_buckets=n_buckets, origin=origin, width=HOUR)
    want = cpu.bucket_overlap(start, end, vals, group, **kw)
    got = gpu_backend.ops.bucket_overlap(cp.asarray(start), cp.asarray(end), cp.asarray(vals), cp.asarray(group), **kw)
    assert got.shape == (3, n_groups, n_buckets)
    for j in range(3):
        np.testing.assert_allclose(
            cp.asnumpy(got[j]), want[j], rtol=1e-9, atol=1e-9 * max(1.0, float(np.abs(want[j]).max(initial=0)))
        )
    # and each series is what its own 1-D sweep gives
    one = gpu_backend.ops.bucket_overlap(
        cp.asarray(start), cp.asarray(end), cp.asarray(vals[1]), cp.asarray(group), **kw
    )
    np.testing.assert_allclose(
        cp.asnumpy(got[1]), cp.asnumpy(one), rtol=1e-12, atol=1e-12 * max(1.0, float(abs(one).max()))
    )


@pytest.mark.gpu
@pytest.mark.parametrize(("cdt", "vdt"), [(np.int32, np.float32), (np.int64, np.float64)])
@pytest.mark.parametrize(("n", "n_groups"), [(0, 4), (1, 1), (100_000, 7), (500_000, 1), (200_000, 100_000)])
@pytest.mark.parametrize(("runs", "ordered"), [(False, False), (True, False), (False, True), (True, True)])
def test_grouped_sum_gpu_parity(gpu_backend, monkeypatch, cdt, vdt, n, n_groups, runs, ordered):
    """The kernels against the twin: codes out of range and NaN values add nothing; each warp's
    rows of a code added together by every lane of the code or by runs of consecutive rows
    (``gpu.WARP_RUNS``), on random and ordered codes."""
    from gpuclust.backends import gpu

    monkeypatch.setattr(gpu, "WARP_RUNS", runs)
    cp = gpu_backend.xp
    rng = np.random.default_rng(n + n_groups)
    codes = rng.integers(-1, n_groups + 1, n).astype(cdt)
    if ordered:
        codes.sort()
    values = rng.random(n).astype(vdt)
    values[rng.random(n) < 0.01] = np.nan
    want = cpu.grouped_sum(codes, values, n_groups=n_groups)
    got = gpu_backend.ops.grouped_sum(cp.asarray(codes), cp.asarray(values), n_groups=n_groups)
    np.testing.assert_allclose(cp.asnumpy(got), want, rtol=1e-9, atol=1e-12)


@pytest.mark.gpu
@pytest.mark.parametrize(
    ("cdt", "wdt"), [(np.int64, None), (np.int32, np.float32), (np.int64, np.float64), (np.uint8, np.int64)]
)
@pytest.mark.parametrize(
    ("n", "top", "minlength", "order"),
    [
        (1, 0, 0, "random"),
        (100_000, 6, 0, "random"),
        (100_000, 6, 40, "random"),  # minlength past the largest code
        (300_000, 4, 2, "sorted"),  # runs of a few codes (usage-distribution's level steps)
        (300_000, 0, 0, "random"),  # one bin: every row contends
        (200_000, 99_999, 0, "random"),  # past shared memory: the global variant
        (200_000, 9_000, 10, "sorted"),
    ],
)
def test_bincount_on_cupy_is_numpys(gpu_backend, cdt, wdt, n, top, minlength, order):
    """``gpuclust._xp.bincount`` on CuPy (grouped_sum.cu's bincount kernels) gives NumPy's
    ``bincount``: the length, the dtype (int64 counts, float64 sums), NaN weights kept, every
    code of a sorted or random order, in the shared-memory and the global variant."""
    from gpuclust._xp import bincount

    cp = gpu_backend.xp
    rng = np.random.default_rng(n + top)
    codes = rng.integers(0, min(top, np.iinfo(cdt).max) + 1, n).astype(cdt)
    if order == "sorted":
        codes.sort()
    w = None if wdt is None else (rng.random(n) * 100).astype(wdt)
    if wdt in (np.float32, np.float64):
        w[rng.random(n) < 0.001] = np.nan  # a NaN makes its bin NaN, as NumPy's does
    want = np.bincount(codes, weights=w, minlength=minlength)
    got = bincount(cp, cp.asarray(codes), None if w is None else cp.asarray(w), minlength)
    assert got.dtype == want.dtype and got.shape == want.shape
    if w is None:
        np.testing.assert_array_equal(cp.asnumpy(got), want)
    else:
        np.testing.assert_allclose(cp.asnumpy(got), want, rtol=1e-9, equal_nan=True)


def test_bincount_wrapper_launches_the_kernel_numpy_would_need(monkeypatch):
    """Without a device: ``gpuclust._kernels.bincount``'s host side (sizes, dtypes, the kernel
    and variant, its arguments in the declared order) against NumPy, with CuPy stood in for by
    NumPy and each kernel by a loop doing what its grouped_sum.cu mode says (the kernels
    themselves: nvcc here, ``test_bincount_on_cupy_is_numpys`` on a device)."""
    import sys
    import types

    from gpuclust import _kernels
    from gpuclust._xp import bincount

    class _Dev(np.ndarray):
        def get(self):
            return np.asarray(self)

    fake = types.ModuleType("cupy")
    fake.__dict__.update(
        stack=lambda a: np.stack(a).view(_Dev), zeros=np.zeros, ascontiguousarray=np.ascontiguousarray, bincount=None
    )
    launched = []

    def get_function(filename, template, targs):
        assert filename == "grouped_sum.cu"
        assert _kernels.name_expression(template, targs) in _kernels.name_expressions(filename)

        def kernel(grid, block, args, shared_mem=0):
            codes, values, n, n_groups, out = args
            launched.append((template.split("::")[1], shared_mem))
            assert isinstance(n, np.int64) and isinstance(n_groups, np.int64) and out.shape == (n_groups,)
            x = np.ones(n) if "bincount_count" in template else values.astype(np.float64)
            np.add.at(out, codes, x)

        return kernel

    monkeypatch.setitem(sys.modules, "cupy", fake)
    monkeypatch.setattr(_kernels, "get_function", get_function)
    monkeypatch.setattr(_kernels, "sm_count", lambda: 2)
    rng = np.random.default_rng(5)
    for codes, minlength in ((rng.integers(0, 7, 500), 0), (rng.integers(0, 3, 50).astype(np.uint8), 9)):
        w = rng.random(codes.shape[0])
        w[3] = np.nan
        for weights in (None, w, w.astype(np.float32), np.arange(codes.shape[0], dtype=np.int32) % 3):
            want = np.bincount(codes, weights=weights, minlength=minlength)
            got = bincount(fake, codes, weights, minlength)
            assert got.dtype == want.dtype
            np.testing.assert_array_equal(got, want)
    assert {k for k, _ in launched} == {"bincount_shared", "bincount_count_shared"}
    monkeypatch.setattr(_kernels, "SHARED_BYTES", 8)
    np.testing.assert_array_equal(bincount(fake, np.array([0, 5, 5])), [1, 0, 0, 0, 0, 2])
    assert launched[-1] == ("bincount_count_global", 0)
    with pytest.raises(ValueError, match="non-negative"):
        bincount(fake, np.array([0, -1]))
    # bounded (codes made in [0, minlength)): no read of their range, minlength bins
    monkeypatch.setattr(_kernels, "SHARED_BYTES", 48 * 1024)
    read = []
    fake.stack = lambda a: read.append(a) or np.stack(a).view(_Dev)
    np.testing.assert_array_equal(bincount(fake, np.array([0, 2, 2]), minlength=4, bounded=True), [1, 0, 2, 0])
    assert not read and launched[-1] == ("bincount_count_shared", 32)
    np.testing.assert_array_equal(bincount(np, np.array([0, 2, 2]), minlength=4, bounded=True), [1, 0, 2, 0])
    with pytest.raises(ValueError, match="bounded"):  # NumPy checks the word
        bincount(np, np.array([0, 5]), minlength=3, bounded=True)


@pytest.mark.gpu
def test_bincount_on_cupy_refuses_what_numpy_refuses(gpu_backend):
    from gpuclust._xp import bincount

    cp = gpu_backend.xp
    with pytest.raises(ValueError, match="non-negative"):
        bincount(cp, cp.asarray(np.array([0, -1, 2])))
    with pytest.raises(ValueError, match="weights"):
        bincount(cp, cp.asarray(np.array([0, 1])), cp.ones(3))
    with pytest.raises(TypeError, match="integer"):
        bincount(cp, cp.asarray(np.array([0.0, 1.0])))
    np.testing.assert_array_equal(cp.asnumpy(bincount(cp, cp.zeros(0, dtype=cp.int64), minlength=3)), [0, 0, 0])


# ------------------------------------------------------------------------------------------ hash_index
def slow_hash_index(keys, queries):
    where = {int(k): p for p, k in enumerate(keys.tolist())}
    return np.array([where.get(int(q), -1) for q in queries.tolist()], dtype=np.int64)


@settings(max_examples=examples(60), deadline=None)
@given(
    st.lists(st.integers(0, 2**64 - 1), unique=True, max_size=50),
    st.lists(st.integers(0, 2**64 - 1), max_size=50),
    st.data(),
)
def test_hash_index_matches_dict(keys, extra, data):
    k = np.sort(np.array(keys, dtype=np.uint64))
    hits = data.draw(st.lists(st.sampled_from(keys), max_size=30)) if keys else []
    q = np.array(extra + hits, dtype=np.uint64)
    np.testing.assert_array_equal(cpu.hash_index(k, q), slow_hash_index(k, q))


def test_hash_index_cache_follows_the_array():
    a = np.array([1, 5, 9], dtype=np.uint64)
    assert cpu.hash_index(a, np.array([9, 2], dtype=np.uint64)).tolist() == [2, -1]
    b = np.array([2, 9], dtype=np.uint64)  # a new array never reuses another's table
    assert cpu.hash_index(b, np.array([9, 2], dtype=np.uint64)).tolist() == [1, 0]
    with pytest.raises(TypeError, match="uint64"):
        cpu.hash_index(a.astype(np.int64), a)


@pytest.mark.gpu
def test_hash_index_gpu_parity(gpu_backend):
    cp = gpu_backend.xp
    rng = np.random.default_rng(5)
    keys = np.unique(rng.integers(0, 2**63, 200_000, dtype=np.uint64))
    q = np.concatenate(
        [
            rng.choice(keys, 300_000),
            rng.integers(0, 2**63, 100_000, dtype=np.uint64),
            keys[:1],
            keys[-1:],
            np.array([0, 2**64 - 1], dtype=np.uint64),
        ]
    )
    from gpuclust.backends import gpu

    got = gpu.hash_index(cp.asarray(keys), cp.asarray(q)).get()
    np.testing.assert_array_equal(got, cpu.hash_index(keys, q))
