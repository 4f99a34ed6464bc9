from __future__ import annotations

import doctest
import importlib

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from strategies import examples

from gpuclust.analyses.base import to_host
from gpuclust.backends import get_backend
from gpuclust.partials import keyed_reduce, merge_keyed, merge_moments

DOCTEST_MODULES = [
    "gpuclust.analyses.base",
    "gpuclust.analyses.cell_usage",
    "gpuclust.analyses.machine_shapes",
    "gpuclust.analyses.registry",
    "gpuclust.backends",
    "gpuclust.backends.cpu",
    "gpuclust.engine.local",
    "gpuclust.engine.partition",
    "gpuclust.engine.reading",
    "gpuclust.engine.tasks",
    "gpuclust.trace_time",
    "gpuclust.analyses._lookup",
    "gpuclust.engine.progress",
    "gpuclust._cache",
    "gpuclust.partials",
    "gpuclust.analyses.grouping",
    "gpuclust.analyses.kinds",
    "gpuclust.backends.array_cpu",
    "gpuclust.tables",
    "gpuclust._memory",
    "gpuclust.analyses._usage_distribution_slices",
    "gpuclust.analyses._overcommit_figure",
    "gpuclust.report.overcommit_plots",
    "gpuclust.claims.model",
    "gpuclust.schema",
    "gpuclust.engine.study",
]


@pytest.mark.parametrize("modname", DOCTEST_MODULES)
def test_doctests(modname):
    res = doctest.testmod(importlib.import_module(modname), optionflags=doctest.ELLIPSIS)
    assert res.failed == 0


def test_merge_moments_matches_numpy():
    rng = np.random.default_rng(0)
    x = rng.normal(5, 2, 1001)
    parts = np.split(x, [0, 10, 11, 500])
    acc = (0, 0.0, 0.0)
    for p in parts:
        acc = merge_moments(acc, (p.size, p.mean() if p.size else 0.0, ((p - p.mean()) ** 2).sum() if p.size else 0.0))
    n, mean, m2 = acc
    assert n == x.size
    assert mean == pytest.approx(x.mean(), rel=1e-13)
    assert m2 / n == pytest.approx(x.var(), rel=1e-12)


def test_keyed_reduce_and_merge(backend):
    xp = backend.xp
    key = xp.asarray(np.array([5, -3, 5, 7, -3, 5], dtype=np.int64))
    val = xp.asarray(np.array([1.0, 2.0, np.nan, 4.0, 8.0, 16.0]))
    p = to_host(keyed_reduce(backend, key, {"v": val}, {"n": None}))
    assert p["key"].tolist() == [-3, 5, 7]
    assert p["v"].tolist() == [10.0, 17.0, 4.0]
    assert p["n"].tolist() == [2, 3, 1]
    q = merge_keyed(p, {"key": np.array([0, 7]), "v": np.array([1.0, 1.0]), "n": np.array([1, 1])})
    assert q["key"].tolist() == [-3, 0, 5, 7] and q["v"].tolist() == [10.0, 1.0, 17.0, 5.0]
    assert q["n"].tolist() == [2, 1, 3, 2]


_rows = st.lists(st.tuples(st.integers(-5, 30), st.floats(-1e3, 1e3), st.integers(-3, 3)), max_size=25)


def _partial(rows, shuffle_seed):
    """A keyed partial (unique keys, as keyed_reduce makes), in sorted or shuffled key order."""
    df = pd.DataFrame(rows, columns=["key", "v", "n"]).astype({"key": np.int64, "v": np.float64, "n": np.int64})
    df = df.groupby("key", as_index=False).agg(v=("v", "sum"), n=("n", "sum"))
    if shuffle_seed is not None:
        df = df.sample(frac=1.0, random_state=shuffle_seed)
    return {"key": df["key"].to_numpy(np.int64), "v": df["v"].to_numpy(np.float64), "n": df["n"].to_numpy(np.int64)}


@settings(max_examples=examples(200), deadline=None)
@given(_rows, _rows, st.one_of(st.none(), st.integers(0, 9)), st.one_of(st.none(), st.integers(0, 9)))
def test_merge_keyed_matches_pandas(ra, rb, sa, sb):
    """Sorted partials take the insert path, shuffled ones the grouping path: both agree with a
    pandas groupby-sum of the two."""
    a, b = _partial(ra, sa), _partial(rb, sb)
    got = merge_keyed(a, b)
    both = pd.DataFrame({k: np.concatenate([a[k], b[k]]) for k in a})
    want = both.groupby("key").agg(v=("v", "sum"), n=("n", "sum")).reset_index()
    if not len(a["key"]) or not len(b["key"]):  # one side empty: the other comes back as it is
        assert sorted(got["key"].tolist()) == want["key"].tolist()
        return
    assert got["key"].tolist() == want["key"].tolist()
    np.testing.assert_allclose(got["v"], want["v"].to_numpy(), rtol=1e-12, atol=1e-9)
    assert got["n"].tolist() == want["n"].tolist() and got["n"].dtype == np.int64


@settings(max_examples=examples(200), deadline=None)
@given(_rows, _rows, st.one_of(st.none(), st.integers(0, 9)), st.one_of(st.none(), st.integers(0, 9)))
def test_merge_keyed_maxima_match_pandas(ra, rb, sa, sb):
    """A field named in ``maxima`` merges by maximum on both paths (insert and grouping); the
    others still sum."""
    a, b = _partial(ra, sa), _partial(rb, sb)
    got = merge_keyed(a, b, maxima=("n",))
    both = pd.DataFrame({k: np.concatenate([a[k], b[k]]) for k in a})
    want = both.groupby("key").agg(v=("v", "sum"), n=("n", "max")).reset_index()
    order = np.argsort(got["key"], kind="stable")
    assert got["key"][order].tolist() == want["key"].tolist()
    np.testing.assert_allclose(got["v"][order], want["v"].to_numpy(), rtol=1e-12, atol=1e-9)
    assert got["n"][order].tolist() == want["n"].tolist() and got["n"].dtype == np.int64


def test_stage_is_identity_on_cpu():
    a = np.arange(3)
    assert get_backend("cpu").stage(a) is a


@settings(max_examples=examples(100), deadline=None)
@given(
    st.lists(st.integers(-(2**63) + 1, 2**63 - 1), unique=True, max_size=30),
    st.lists(st.integers(-50, 50), max_size=30),
    st.booleans(),
)
def test_id_index_matches_dict(ids, extra, nonneg):
    """Sorted int64 ids: the hash path (all ids >= 0) and the binary-search path agree with a dict."""
    from gpuclust.analyses._lookup import id_index

    ids = sorted({abs(i) for i in ids} if nonneg else set(ids))
    arr = np.array(ids, dtype=np.int64)
    q = np.array(extra + ids[::2], dtype=np.int64)
    pos, found = id_index(get_backend("cpu"), arr, q)
    where = {v: k for k, v in enumerate(ids)}
    assert found.tolist() == [int(v) in where for v in q.tolist()]
    assert pos.tolist() == [where.get(int(v), 0) for v in q.tolist()]


def test_grouping_buckets_and_by_lists():
    """The one bucket convention against the obvious loop, and group keys (``by`` lists are
    checked by their option declarations: tests/engine/test_cli_options.py)."""
    from gpuclust.analyses.grouping import bucket_grid, bucket_span, group_key

    W = 300
    s = np.array([0, 299, 300, 599, 1000, 50])
    e = np.array([300, 301, 300, 1200, 900, 50])
    b0, b1 = bucket_span(np, s, e, W)
    for k in range(s.shape[0]):
        touched = [b for b in range(10) if max(s[k], b * W) < min(e[k], (b + 1) * W)] or [s[k] // W]
        assert (b0[k], b1[k]) == (touched[0], touched[-1])
    assert bucket_grid(600, 601, W) == (600, 1) and bucket_grid(5, 5, W) == (0, 0) and bucket_grid(0, 900, W) == (0, 3)
    comps = [np.array([1, 1, 2]), np.array([5, 6, 5])]
    k = group_key(np, comps, 3)
    assert k.dtype == np.int64 and len(set(k.tolist())) == 3
    assert group_key(np, [], 2).tolist() == [0, 0] and group_key(np, comps[:1], 3).tolist() == [1, 1, 2]


@settings(max_examples=examples(100), deadline=None)
@given(
    _rows,
    st.lists(st.one_of(st.floats(-1e3, 1e3), st.just(float("nan"))), min_size=30, max_size=30),
    st.lists(st.integers(-3, 3), min_size=30, max_size=30),
)
def test_merge_keyed_same_keys_match_pandas(ra, vb, nb):
    """Two sorted partials over the same keys (the elementwise path): pandas' groupby of the two,
    NaN summed as 0, sums and maxima, dtypes kept."""
    a = _partial(ra, None)
    k = a["key"].shape[0]
    b = {"key": a["key"].copy(), "v": np.array(vb[:k], np.float64), "n": np.array(nb[:k], np.int64)}
    both = pd.DataFrame({f: np.concatenate([a[f], b[f]]) for f in a})
    for maxima, agg in (((), "sum"), (("n",), "max")):
        got = merge_keyed(a, b, maxima=maxima)
        want = both.groupby("key").agg(v=("v", "sum"), n=("n", agg)).reset_index()
        assert got["key"].tolist() == want["key"].tolist()
        np.testing.assert_allclose(got["v"], want["v"].to_numpy(), rtol=1e-12, atol=1e-9)
        assert got["n"].tolist() == want["n"].tolist() and got["n"].dtype == np.int64


def _merge_by_insertion(a, b, maxima=()):
    """The insert-and-add merge of two sorted keyed partials, field by field (np.insert; what
    merge_keyed did before it placed every row once): floats as float64 with NaN as 0."""
    ka, kb = a["key"], b["key"]
    pos = np.searchsorted(ka, kb)
    hit = (pos < ka.shape[0]) & (ka[np.minimum(pos, ka.shape[0] - 1)] == kb)
    key = np.insert(ka, pos[~hit], kb[~hit])
    at = np.searchsorted(key, kb[hit])
    out = {"key": key}
    for f in a:
        if f == "key":
            continue
        va, vb = a[f], b[f]
        if va.dtype.kind == "f":
            va, vb = np.nan_to_num(va, nan=0.0).astype(np.float64), np.nan_to_num(vb, nan=0.0).astype(np.float64)
        v = np.insert(va, pos[~hit], vb[~hit], axis=0)
        v[at] = np.maximum(v[at], vb[hit]) if f in maxima else v[at] + vb[hit]
        out[f] = v
    return out


_values = st.one_of(st.floats(-1e3, 1e3), st.just(float("nan")), st.just(float("inf")), st.just(-float("inf")))


@settings(max_examples=examples(200), deadline=None)
@given(
    st.lists(st.integers(-20, 60), unique=True, min_size=1, max_size=30),
    st.lists(st.integers(-20, 60), unique=True, min_size=1, max_size=30),
    st.lists(_values, min_size=60, max_size=60),
    st.lists(st.integers(-9, 9), min_size=60, max_size=60),
    st.booleans(),
)
def test_merge_keyed_places_rows_as_insertion_does(ka, kb, vals, ints, as_max):
    """The sorted path against the insert-and-add merge, bit for bit: NaN and infinities, float32,
    a 2-D field, integer and float maxima."""

    def part(keys, off):
        k = np.array(sorted(keys), dtype=np.int64)
        n = k.shape[0]
        v = np.array(vals[off : off + n], dtype=np.float64)
        return {
            "key": k,
            "v": v,
            "v32": v.astype(np.float32),
            "n": np.array(ints[off : off + n], dtype=np.int64),
            "two": np.stack([v, np.array(ints[off : off + n], dtype=np.float64)], axis=1),
        }

    a, b = part(ka, 0), part(kb, 30)
    maxima = ("n", "v") if as_max else ()
    with np.errstate(over="ignore"):  # infinities become the largest float; two of them overflow, in both
        got, want = merge_keyed(a, b, maxima=maxima), _merge_by_insertion(a, b, maxima=maxima)
    assert list(got) == list(want)
    for f in want:
        assert got[f].dtype == want[f].dtype and got[f].shape == want[f].shape, f
        np.testing.assert_array_equal(got[f], want[f], err_msg=f)
