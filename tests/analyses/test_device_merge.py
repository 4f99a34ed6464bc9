"""Merges of partials whose arrays are on the device, on the device (issue 34): keyed partials
(:func:`gpuclust.partials.merge_keyed`), keyed rows, concatenations and ragged sums
(:mod:`gpuclust.analyses.kinds`) on the device-shaped backend (tests/device_backend.py) give the
host merge's arrays bit for bit and slow obvious code's values (a dict per key, Python's stable
sort), leave every array on the device, and read nothing on the host but the one count a keyed
merge sizes its union by.  Whole partials of real analyses computed there merge as on the host.
The last tests do the same on CuPy arrays (``gpu``: skipped without a device)."""

from __future__ import annotations

import numpy as np
import pytest
from device_backend import DEVICE, DeviceArray, counting_device_work, resolve_gpu_to_device
from hypothesis import given, settings
from hypothesis import strategies as st
from strategies import examples, random_cell

from gpuclust.analyses.base import to_host
from gpuclust.analyses.kinds import Concat, Keyed, Max, Merged, Min, Sum
from gpuclust.analyses.registry import create
from gpuclust.backends import backend_of
from gpuclust.engine import TableSource
from gpuclust.engine.local import context_of
from gpuclust.engine.partition import column_to_numpy
from gpuclust.partials import merge_keyed

#: Float values a keyed field takes: NULLs, infinities, signed zeros, and ordinary numbers.
SPECIAL = (np.nan, np.inf, -np.inf, -0.0, 0.0, 1.5, -2.25, 1e300, -1e-300)
#: Fields of a keyed partial: float sums (float64, float32), an int32 count, an int64 and a
#: float maximum, and 2-D float and int sums.
MAXIMA = ("m", "fm")


@pytest.fixture(autouse=True)
def _device_is_gpu(request, monkeypatch):
    """``backend_of`` a device-shaped array: the device-shaped backend (as a CuPy one's: the gpu),
    but in the tests on a real device; sums of the largest finite floats (infinities as merged)
    overflow to infinity, and maxima of NaN are NaN, quietly."""
    if request.node.get_closest_marker("gpu") is None:
        resolve_gpu_to_device(monkeypatch)
    with np.errstate(over="ignore", invalid="ignore"):
        yield


def _floats(r: np.random.Generator, n: int, shape: tuple[int, ...] = ()) -> np.ndarray:
    pick = r.integers(0, len(SPECIAL) + 1, (n, *shape))
    return np.where(
        pick < len(SPECIAL), np.asarray(SPECIAL)[np.minimum(pick, len(SPECIAL) - 1)], r.normal(size=(n, *shape))
    )


def _keyed(keys: np.ndarray, seed: int, two_d: bool = True) -> dict[str, np.ndarray]:
    r = np.random.default_rng(seed)
    n = keys.shape[0]
    p = {
        "key": keys.astype(np.int64),
        "s": _floats(r, n),
        "f32": _floats(r, n).clip(-1e38, 1e38).astype(np.float32),
        "n": r.integers(-50, 50, n).astype(np.int32),
        "m": r.integers(-(2**40), 2**40, n),
        "fm": np.where(r.random(n) < 0.2, np.nan, r.normal(size=n) * 1e3),  # no signed zeros: max(-0, 0) is either
    }
    if two_d:
        p["v2"] = _floats(r, n, (3,))
        p["i2"] = r.integers(-9, 9, (n, 2))
    return p


def _float_sums(p: dict[str, np.ndarray]) -> list[str]:
    return [f for f in p if p[f].dtype.kind == "f" and f not in MAXIMA]


def _assert_sums_within_rounding(got: dict, want: dict, a: dict, b: dict) -> None:
    """``got``'s float sums equal ``want``'s (a merge of ``a`` and ``b``) up to the rounding of
    adding in another order: per key at most (rows - 1) eps of the sum of the magnitudes as
    merged (NaN as 0, infinities clipped: both sums within half that of the exact one); keys
    whose magnitudes overflow are not compared."""
    ones = lambda p: {"key": p["key"], "n": np.ones(p["key"].shape[0], np.int64)}  # noqa: E731
    n = merge_keyed(ones(a), ones(b))
    for f in _float_sums(want):
        mag = merge_keyed(*({"key": p["key"], f: np.abs(np.nan_to_num(p[f]))} for p in (a, b)))
        assert np.array_equal(mag["key"], want["key"]) and np.array_equal(n["key"], want["key"])
        rows = (n["n"] - 1).reshape(-1, *([1] * (mag[f].ndim - 1)))
        ok = np.isfinite(mag[f])
        assert (np.abs(got[f] - want[f])[ok] <= (rows * np.finfo(np.float64).eps * mag[f])[ok]).all(), f


def test_every_merge_path_gives_the_same_sums_up_to_their_order():
    """The grouped path (keys not sorted unique) sums as the sorted one (NaN as 0, infinities
    clipped to the largest finite values, ``partials._summable``; before, it summed infinities as
    they were: inf and NaN where the sorted path gave the largest floats): the same rows in
    another order, one row a key a side, give the same values.  With keys repeated, the grouped
    path's sums in two orders of the rows stay within the bound the gpu test below holds a
    device's grouped sums to (its bincount adds in any order); large terms cancel in these sums,
    so the orders differ by far more than a relative 1e-12 in some keys.  2-D fields take a
    bincount a column.  (Float maxima still differ: the sorted paths take NaN as 0 there too, the
    grouped one keeps NaN.)"""
    r = np.random.default_rng(5)
    far = 0
    for seed in range(30):
        ka, kb = np.unique(r.integers(0, 40, 30)), np.unique(r.integers(0, 40, 25))
        a, b = _keyed(ka, seed), _keyed(kb, seed + 99)
        want = merge_keyed(a, b, maxima=MAXIMA)  # the sorted path
        ia, ib = r.permutation(ka.shape[0]), r.permutation(kb.shape[0])
        got = merge_keyed({k: v[ia] for k, v in a.items()}, {k: v[ib] for k, v in b.items()}, maxima=MAXIMA)
        for f in (f for f in want if f != "fm"):  # (-0.0 == 0.0: a sum from 0 has no negative zero)
            np.testing.assert_array_equal(got[f], want[f], err_msg=f)
        a, b = _keyed(r.integers(0, 30, 200), seed, two_d=False), _keyed(r.integers(0, 30, 150), seed + 99, two_d=False)
        ia, ib = r.permutation(200), r.permutation(150)
        got = merge_keyed({k: v[ia] for k, v in a.items()}, {k: v[ib] for k, v in b.items()}, maxima=MAXIMA)
        want = merge_keyed(a, b, maxima=MAXIMA)
        _assert_sums_within_rounding(got, want, a, b)
        far += sum(not np.allclose(got[f], want[f], rtol=1e-12, atol=0, equal_nan=True) for f in _float_sums(want))
    assert far > 0


def _dev(p: dict[str, np.ndarray]) -> dict[str, DeviceArray]:
    return {k: DEVICE.asarray(v) for k, v in p.items()}


def _host(p: dict) -> dict[str, np.ndarray]:
    return {k: v.get() if isinstance(v, DeviceArray) else v for k, v in p.items()}


def _assert_bits(got: dict[str, np.ndarray], want: dict[str, np.ndarray]) -> None:
    """The same fields, dtypes, shapes and bytes (NaN and signed zeros included)."""
    assert set(got) == set(want)
    for k in want:
        g, w = np.ascontiguousarray(got[k]), np.ascontiguousarray(want[k])
        assert (g.dtype, g.shape) == (w.dtype, w.shape), k
        assert g.tobytes() == w.tobytes(), (k, g, w)


def _summable(x: np.ndarray) -> np.ndarray:
    """A float as merged: NaN as 0, infinities as the largest finite values of its own type."""
    if x.dtype.kind != "f":
        return x
    info = np.finfo(x.dtype)
    x = np.where(np.isnan(x), x.dtype.type(0), x)
    return np.clip(x, info.min, info.max).astype(np.float64)


def _by_key(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Slow obvious merge of two partials with sorted unique keys: a dict per key, a key's value
    that of its one side, or a's plus (or max) b's, floats made summable; an empty side the
    identity (the other side as it is)."""
    if not a["key"].shape[0] or not b["key"].shape[0]:
        return b if not a["key"].shape[0] else a
    rows: dict[int, dict[str, np.ndarray]] = {}
    for p in (a, b):
        for i, k in enumerate(p["key"].tolist()):
            row = {f: _summable(np.asarray(v[i])) for f, v in p.items() if f != "key"}
            if k in rows:
                old = rows[k]
                row = {f: (np.maximum(old[f], row[f]) if f in MAXIMA else old[f] + row[f]) for f in row}
            rows[k] = row
    keys = sorted(rows)
    out = {"key": np.asarray(keys, np.int64).reshape(-1)}
    for f, v in a.items():
        if f != "key":
            dtype = np.float64 if v.dtype.kind == "f" else v.dtype
            out[f] = np.asarray([rows[k][f] for k in keys], dtype).reshape((len(keys), *v.shape[1:]))
    return out


key_lists = st.lists(st.integers(0, 60), max_size=25)


@settings(max_examples=examples(60), deadline=None)
@given(
    key_lists, key_lists, st.sampled_from(["overlap", "disjoint", "same", "a empty", "b empty"]), st.integers(0, 2**16)
)
def test_merge_keyed_on_the_device_is_the_host_merge(ka, kb, how, seed):
    """Sorted unique keys, overlapping, disjoint, the same or one side empty: the device merge
    is the host's bit for bit and the slow merge's, on the device, reading one count (8 bytes)
    on the host when both sides have keys, nothing when one is empty, and copying nothing in."""
    ka_ = np.unique(np.asarray(ka, np.int64))
    kb_ = {
        "overlap": np.unique(np.asarray(kb, np.int64)),
        "disjoint": np.unique(np.asarray(kb, np.int64)) + 100,
        "same": ka_,
        "a empty": np.unique(np.asarray(kb, np.int64)),
        "b empty": np.zeros(0, np.int64),
    }[how]
    if how == "a empty":
        ka_ = np.zeros(0, np.int64)
    a, b = _keyed(ka_, seed), _keyed(kb_, seed + 1)
    host = merge_keyed(a, b, maxima=MAXIMA)
    _assert_bits(host, _by_key(a, b))
    da, db = _dev(a), _dev(b)
    with counting_device_work() as w:
        dev = merge_keyed(da, db, maxima=MAXIMA, xp=backend_of(da["key"]).xp)
    assert all(isinstance(v, DeviceArray) for v in dev.values())
    both = ka_.shape[0] > 0 and kb_.shape[0] > 0
    assert (w["syncs"], w["d2h_bytes"], w["h2d_bytes"]) == ((1, 8, 0) if both else (0, 0, 0))
    _assert_bits(_host(dev), host)


def _grouped_oracle(cat: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Rows with repeated, unordered keys grouped as the host groups them: floats summed in row
    order from 0 with NaN left out and infinities clipped to the largest finite values of their
    own type (as the sorted paths merge), integers summed, maxima by maximum (NaN if any)."""
    keys = sorted(set(cat["key"].tolist()))
    out: dict[str, list] = {"key": keys}
    for f, v in cat.items():
        if f == "key":
            continue
        col = []
        for k in keys:
            vals = v[cat["key"] == k]
            if f in MAXIMA:
                col.append(np.nan if v.dtype.kind == "f" and np.isnan(vals).any() else vals.max())
            elif v.dtype.kind == "f":
                s, top = 0.0, float(np.finfo(v.dtype).max)
                for x in vals.astype(np.float64).tolist():
                    if x == x:
                        s += min(max(x, -top), top)
                col.append(s)
            else:
                col.append(vals.sum(dtype=v.dtype))
        out[f] = col
    return {
        f: np.asarray(c, np.float64 if cat[f].dtype.kind == "f" and f not in MAXIMA else cat[f].dtype)
        for f, c in out.items()
    }


@settings(max_examples=examples(40), deadline=None)
@given(
    st.lists(st.integers(0, 12), min_size=1, max_size=40),
    st.lists(st.integers(0, 12), min_size=1, max_size=40),
    st.integers(0, 2**16),
)
def test_merge_keyed_of_unsorted_rows_on_the_device_is_the_host_grouping(ka, kb, seed):
    """Keys repeated and out of order (the grouped path; 1-D fields, as on the host): the host's
    groups bit for bit (floats summed in the host's order), the slow grouping's, on the device."""
    ka = [*ka, ka[0]]  # a key repeated: the grouped path whatever the keys
    a, b = _keyed(np.asarray(ka), seed, two_d=False), _keyed(np.asarray(kb), seed + 1, two_d=False)
    host = merge_keyed(a, b, maxima=MAXIMA)
    cat = {f: np.concatenate([a[f], b[f]]) for f in a}
    _assert_bits(host, _grouped_oracle(cat))
    da, db = _dev(a), _dev(b)
    with counting_device_work() as w:
        dev = merge_keyed(da, db, maxima=MAXIMA, xp=backend_of(da["key"]).xp)
    assert all(isinstance(v, DeviceArray) for v in dev.values())
    assert (w["syncs"], w["h2d_bytes"]) == (2, 0)  # the merge's one read, and unique's size
    _assert_bits(_host(dev), host)


def test_merge_keyed_refuses_a_host_and_a_device_partial_and_device_arrays_without_their_module():
    a = _keyed(np.arange(3), 1)
    with pytest.raises(TypeError, match="one partial on the host"):
        merge_keyed(a, _dev(_keyed(np.arange(2), 2)), xp=DEVICE.xp)
    with pytest.raises(TypeError, match="pass their module"):
        merge_keyed(_dev(a), _dev(a))
    got = merge_keyed(_keyed(np.zeros(0, np.int64), 3), _dev(a))  # an empty host side (an identity) is dropped
    assert all(isinstance(v, DeviceArray) for v in got.values())


@settings(max_examples=examples(60), deadline=None)
@given(st.lists(st.integers(0, 9), max_size=20), st.lists(st.integers(0, 9), max_size=20), st.booleans())
def test_keyed_rows_merge_on_the_device_is_a_stable_merge(ka, kb, cast):
    """Disjoint rows with sorted, repeated keys: Python's stable sort of a's rows then b's, the
    host merge's arrays bit for bit, on the device with nothing read on the host."""
    kind = Keyed(rows=True, cast={"n": np.int64} if cast else {})
    a = {
        "key": np.sort(np.asarray(ka, np.int64)),
        "v": np.arange(len(ka), dtype=np.float64),
        "n": np.arange(len(ka), dtype=np.int32),
    }
    b = {
        "key": np.sort(np.asarray(kb, np.int64)),
        "v": 100.0 + np.arange(len(kb)),
        "n": 100 + np.arange(len(kb), dtype=np.int32),
    }
    host = kind.merge(a, b)
    rows = sorted(
        [(k, v) for k, v in zip(a["key"].tolist(), a["v"].tolist(), strict=True)]
        + [(k, v) for k, v in zip(b["key"].tolist(), b["v"].tolist(), strict=True)],
        key=lambda r: r[0],
    )
    assert [(int(k), float(v)) for k, v in zip(host["key"], host["v"], strict=True)] == rows
    assert host["n"].dtype == (np.int64 if cast else np.int32)
    da, db = _dev(a), _dev(b)
    with counting_device_work() as w:
        dev = kind.merge(da, db)
    assert all(isinstance(v, DeviceArray) for v in dev.values())
    assert (w["syncs"], w["d2h_bytes"], w["h2d_bytes"]) == (0, 0, 0)
    _assert_bits(_host(dev), host)


@settings(max_examples=examples(40), deadline=None)
@given(st.integers(0, 6), st.integers(0, 6), st.integers(0, 3), st.integers(0, 2**16))
def test_concat_and_ragged_sum_on_the_device(na, nb, row, seed):
    """Concat: a's rows then b's; a ragged sum: the shorter padded with zeros; on the device, the
    host's arrays bit for bit, nothing read on the host; an empty host side (an identity) dropped."""
    r = np.random.default_rng(seed)
    shape = (row,) if row else ()
    a, b = r.normal(size=(na, *shape)), r.normal(size=(nb, *shape))
    host = Concat(row=shape).merge(a, b)
    assert host.tolist() == a.tolist() + b.tolist()
    da, db = DEVICE.asarray(a), DEVICE.asarray(b)
    with counting_device_work() as w:
        dev = Concat(row=shape).merge(da, db)
        empty_side = Concat(row=shape).merge(np.zeros((0, *shape)), db)
    assert isinstance(dev, DeviceArray) and isinstance(empty_side, DeviceArray)
    assert (w["syncs"], w["d2h_bytes"], w["h2d_bytes"]) == (0, 0, 0)
    _assert_bits({"c": dev.get(), "e": empty_side.get()}, {"c": host, "e": b})

    sa, sb = r.normal(size=(2, na)), r.normal(size=(2, nb))
    host = Sum(shape=(2, 0), ragged=True).merge(sa, sb)
    width = max(na, nb)
    pad = lambda x: np.concatenate([x, np.zeros((2, width - x.shape[1]))], axis=1)  # noqa: E731
    np.testing.assert_array_equal(host, pad(sa) + pad(sb))
    da, db = DEVICE.asarray(sa), DEVICE.asarray(sb)
    with counting_device_work() as w:
        dev = Sum(shape=(2, 0), ragged=True).merge(da, db)
    assert isinstance(dev, DeviceArray)
    assert (w["syncs"], w["d2h_bytes"], w["h2d_bytes"]) == (0, 0, 0)
    _assert_bits({"s": dev.get()}, {"s": host})


def test_dense_sums_minima_and_maxima_merge_on_the_device():
    """Sum, Min and Max merge device arrays elementwise (their ufuncs dispatch to the arrays' module)."""
    r = np.random.default_rng(5)
    a, b = _floats(r, 7, (2,)), _floats(r, 7, (2,))
    da, db = DEVICE.asarray(a), DEVICE.asarray(b)
    with counting_device_work() as w:
        got = {"sum": Sum(shape=(7, 2)).merge(da, db), "min": Min(shape=(7, 2)).merge(da, db)}
        got["max"] = Max(shape=(7, 2)).merge(da, db)
    assert all(isinstance(v, DeviceArray) for v in got.values())
    assert (w["syncs"], w["d2h_bytes"], w["h2d_bytes"]) == (0, 0, 0)
    _assert_bits(_host(got), {"sum": a + b, "min": np.minimum(a, b), "max": np.maximum(a, b)})


def _leaves(obj) -> list:
    if isinstance(obj, dict):
        return [x for v in obj.values() for x in _leaves(v)]
    if isinstance(obj, (list, tuple)):
        return [x for v in obj for x in _leaves(v)]
    return [obj]


def _assert_same_partial(got, want) -> None:
    if isinstance(want, dict):
        assert set(got) == set(want)
        for k in want:
            _assert_same_partial(got[k], want[k])
    elif isinstance(want, np.ndarray):
        g = np.asarray(got)
        assert (g.dtype, g.shape) == (want.dtype, want.shape)
        assert np.ascontiguousarray(g).tobytes() == np.ascontiguousarray(want).tobytes()
    else:
        assert got == want


@pytest.mark.parametrize(
    "name",
    ["usage-vs-request", "peak-prediction", "overcommit", "lifecycle", "usage-change", "machine-utilization", "cpi"],
)
def test_fields_merge_of_real_partials_on_the_device(name):
    """Two partitions' partials of a real analysis computed on the device-shaped backend merge
    there (their keyed partials, keyed rows, concatenations, ragged sums, minima and maxima;
    nothing copied in, a sync at most per keyed merge) to the host merge of the same partials moved
    to the host, bit for bit.  (job-usage's and usage-distribution's own merges, ``Merged``, still
    take host arrays.)"""
    a = create(name)
    tables = random_cell(3, n_windows=3000)
    ctx = context_of(a, TableSource(tables))
    t = tables[a.table]
    half = t.num_rows // 2
    parts = [
        a.partial({c: DEVICE.asarray(column_to_numpy(s.column(c))) for c in a.columns}, ctx, DEVICE)
        for s in (t.slice(0, half), t.slice(half))
    ]
    assert any(isinstance(v, DeviceArray) for v in _leaves(parts[0]))
    want = a.kinds.merge(to_host(parts[0]), to_host(parts[1]))
    with counting_device_work() as w:
        got = a.kinds.merge(*parts)
    assert w["h2d_bytes"] == 0
    kinds = [getattr(k, "inner", k) for k in a.kinds.kinds.values()]
    if not any(isinstance(k, Merged) for k in kinds):  # (a merge of its own may read more)
        assert w["syncs"] <= sum(1 for k in kinds if isinstance(k, Keyed) and not k.rows)  # one per keyed merge
    for name, kind in a.kinds.kinds.items():  # nothing left the device (but by a merge of its own)
        if not isinstance(getattr(kind, "inner", kind), Merged):
            on_device = [isinstance(v, DeviceArray) for v in _leaves(kind.take(parts[0], name))]
            assert [isinstance(v, DeviceArray) for v in _leaves(kind.take(got, name))] == on_device, name
    _assert_same_partial(to_host(got), want)


# ------------------------------------------------------------------------------- on a device


@pytest.mark.gpu
def test_merges_on_cupy_arrays_are_the_host_merges(gpu_backend):
    """The same on CuPy arrays: keyed merges (sorted paths bit for bit; the grouped path's float
    sums up to rounding: a device's bincount adds in any order), keyed rows, Concat and ragged
    Sum, every result a CuPy array."""
    cp = gpu_backend.xp
    dev = lambda p: {k: cp.asarray(v) for k, v in p.items()}  # noqa: E731
    get = lambda p: {k: cp.asnumpy(v) for k, v in p.items()}  # noqa: E731
    r = np.random.default_rng(11)
    for ka, kb in [
        (np.arange(0, 400, 3), np.arange(0, 400, 5)),
        (np.arange(50), np.arange(50)),
        (np.arange(20), np.arange(100, 130)),
        (np.zeros(0, np.int64), np.arange(7)),
    ]:
        a, b = _keyed(ka, int(r.integers(1 << 16))), _keyed(kb, int(r.integers(1 << 16)))
        got = merge_keyed(dev(a), dev(b), maxima=MAXIMA, xp=cp)
        assert all(isinstance(v, cp.ndarray) for v in got.values())
        _assert_bits(get(got), merge_keyed(a, b, maxima=MAXIMA))
    a, b = _keyed(r.integers(0, 30, 200), 1, two_d=False), _keyed(r.integers(0, 30, 150), 2, two_d=False)
    got, want = get(merge_keyed(dev(a), dev(b), maxima=MAXIMA, xp=cp)), merge_keyed(a, b, maxima=MAXIMA)
    _assert_sums_within_rounding(got, want, a, b)
    _assert_bits(
        {f: got[f] for f in want if f not in _float_sums(want)},
        {f: want[f] for f in want if f not in _float_sums(want)},
    )
    rows_a = {"key": np.sort(r.integers(0, 40, 300)), "v": r.normal(size=300)}
    rows_b = {"key": np.sort(r.integers(0, 40, 200)), "v": r.normal(size=200)}
    _assert_bits(get(Keyed(rows=True).merge(dev(rows_a), dev(rows_b))), Keyed(rows=True).merge(rows_a, rows_b))
    x, y = r.normal(size=(30, 2)), r.normal(size=(3, 2))
    _assert_bits({"c": cp.asnumpy(Concat(row=(2,)).merge(cp.asarray(x), cp.asarray(y)))}, {"c": np.concatenate([x, y])})
    s, t = r.normal(size=(2, 9)), r.normal(size=(2, 4))
    got_s = Sum(shape=(2, 0), ragged=True).merge(cp.asarray(s), cp.asarray(t))
    _assert_bits({"s": cp.asnumpy(got_s)}, {"s": Sum(shape=(2, 0), ragged=True).merge(s, t)})
