"""The partial kinds (gpuclust/analyses/kinds.py) against slow obvious code: per-key dicts,
padded sums, Python's stable sort; and where a split leaves each field (host or device)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuclust.analyses.kinds import Concat, Fields, Flat, Keyed, Label, Max, Merged, Min, Sum
from tests.device_backend import DEVICE

keys = st.lists(st.integers(0, 40), max_size=30)


def _keyed(ks: list[int], seed: int) -> dict[str, np.ndarray]:
    """Sorted unique keys with a float sum, an int count and an int maximum per key."""
    u = np.unique(np.asarray(ks, np.int64))
    r = np.random.default_rng(seed)
    return {
        "key": u,
        "s": r.normal(size=u.shape[0]),
        "n": r.integers(0, 9, u.shape[0]).astype(np.int32),
        "m": r.integers(0, 99, u.shape[0]),
    }


def _by_key(p: dict[str, np.ndarray]) -> dict[int, tuple[float, int, int]]:
    return {int(k): (float(p["s"][i]), int(p["n"][i]), int(p["m"][i])) for i, k in enumerate(p["key"])}


@settings(max_examples=60, deadline=None)
@given(keys, keys, st.integers(0, 2**16))
def test_keyed_sums_maxima_and_cast_per_key(ka, kb, seed):
    a, b = _keyed(ka, seed), _keyed(kb, seed + 1)
    out = Keyed(maxima=("m",), cast={"n": np.int64}).merge(a, b)
    want: dict[int, list[float]] = {}
    for p in (a, b):
        for k, (s, n, m) in _by_key(p).items():
            w = want.setdefault(k, [0.0, 0, -1])
            w[0], w[1], w[2] = w[0] + s, w[1] + n, max(w[2], m)
    assert out["key"].tolist() == sorted(want)
    assert out["n"].dtype == np.int64  # widened before adding: no int32 wrap-around
    for i, k in enumerate(out["key"].tolist()):
        assert out["s"][i] == pytest.approx(want[k][0], abs=1e-12)
        assert (int(out["n"][i]), int(out["m"][i])) == (want[k][1], want[k][2])


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 9), max_size=20), st.lists(st.integers(0, 9), max_size=20))
def test_keyed_rows_are_a_stable_merge(ka, kb):
    a = {"key": np.sort(np.asarray(ka, np.int64)), "v": np.arange(len(ka), dtype=np.float64)}
    b = {"key": np.sort(np.asarray(kb, np.int64)), "v": 100.0 + np.arange(len(kb))}
    out = Keyed(rows=True).merge(a, b)
    rows = sorted(
        [(int(k), float(v)) for k, v in zip(a["key"], a["v"], strict=True)]
        + [(int(k), float(v)) for k, v in zip(b["key"], b["v"], strict=True)],
        key=lambda r: r[0],
    )  # Python's sort is stable: a's rows before b's for equal keys
    assert list(zip(out["key"].tolist(), out["v"].tolist(), strict=True)) == rows


@pytest.mark.parametrize(("la", "lb"), [(0, 3), (3, 0), (2, 5), (5, 2), (4, 4)])
def test_ragged_sum_pads_the_shorter(la, lb):
    a, b = np.arange(2 * la, dtype=float).reshape(2, la), 10 + np.arange(2 * lb, dtype=float).reshape(2, lb)
    n = max(la, lb)
    pa, pb = np.zeros((2, n)), np.zeros((2, n))
    pa[:, :la], pb[:, :lb] = a, b
    np.testing.assert_array_equal(Sum(ragged=True).merge(a, b), pa + pb)
    np.testing.assert_array_equal(a, np.arange(2 * la, dtype=float).reshape(2, la))  # inputs untouched


def _fields() -> Fields:
    return Fields(
        {
            "dense": Sum(),
            "lo": Min(),
            "hi": Max(),
            "backend": Label(),
            "sample": Concat(),
            "pairs": Merged(lambda x, y: sorted(set(x) | set(y))),
            "w": Flat(Keyed(per=lambda ctx: ctx * 2, dense=lambda ctx: 50), "w_", ("key", "s", "n", "m")),
            "rows": Keyed(rows=True, per=lambda ctx: 1),
            "small": Keyed(),
        },
        stays=("dense",),
    )


def _partial(seed: int, backend: str, xp=np) -> dict:
    r = np.random.default_rng(seed)
    w = _keyed(list(r.integers(0, 30, 8)), seed)
    return {
        "dense": xp.asarray(r.integers(0, 5, (2, 3))),
        "lo": xp.asarray(r.integers(0, 5, 4)),
        "hi": xp.asarray(r.integers(0, 5, 4)),
        "backend": backend,
        "sample": xp.asarray(r.integers(0, 5, 3)),
        "pairs": [seed, seed % 3],
        **{"w_" + f: xp.asarray(v) for f, v in w.items()},
        "rows": {"key": xp.asarray(np.sort(r.integers(0, 9, 5))), "v": xp.asarray(r.normal(size=5))},
        "small": {k: xp.asarray(v) for k, v in _keyed(list(r.integers(0, 5, 3)), seed + 7).items()},
    }


def test_fields_merge_each_field_by_its_kind():
    f, a, b = _fields(), _partial(1, "cpu"), _partial(2, "gpu")
    out = f.merge(a, b)
    assert set(out) == set(a)
    np.testing.assert_array_equal(out["dense"], a["dense"] + b["dense"])
    np.testing.assert_array_equal(out["lo"], np.minimum(a["lo"], b["lo"]))
    np.testing.assert_array_equal(out["hi"], np.maximum(a["hi"], b["hi"]))
    assert out["backend"] == "gpu"
    assert out["sample"].tolist() == a["sample"].tolist() + b["sample"].tolist()
    assert out["pairs"] == sorted({1, 2})
    wa, wb = ({k: p["w_" + k] for k in ("key", "s", "n", "m")} for p in (a, b))
    got = {k: out["w_" + k] for k in ("key", "s", "n", "m")}
    want = {**_by_key(wa)}
    for k, (s, n, m) in _by_key(wb).items():
        s0, n0, m0 = want.get(k, (0.0, 0, 0))
        want[k] = (s0 + s, n0 + n, m0 + m)
    assert {k: (pytest.approx(s), n, m) for k, (s, n, m) in _by_key(got).items()} == want


def test_split_places_fields_and_merge_rest_skips_the_sharded():
    f, p = _fields(), _partial(3, "gpu", DEVICE.xp)
    assert f.sharded == ("w", "rows") and f.rows == ("rows",)
    rest, keyed = f.split(p)
    assert set(keyed) == {"w", "rows"} and set(keyed["w"]) == {"key", "s", "n", "m"}
    on_device = lambda v: hasattr(v, "__cuda_array_interface__")  # noqa: E731
    assert all(on_device(v) for k in keyed.values() for v in k.values())  # left where they are
    assert on_device(rest["dense"])  # stays
    assert not any(on_device(v) for k, v in rest.items() if k not in ("dense", "small"))
    assert not any(on_device(v) for v in rest["small"].values())  # an unsharded keyed partial: to the host
    assert not any(k.startswith("w_") or k == "rows" for k in rest)
    other, _ = f.split(_partial(4, "cpu"))
    merged = f.merge_rest({**rest, "dense": np.asarray(rest["dense"].get())}, other)
    assert set(merged) == set(rest) and merged["backend"] == "gpu"


def test_key_ranges_and_dense_keys():
    f = _fields()
    assert f.key_range(5, "w", 3, 7) == (30, 70)  # per = ctx * 2
    assert f.key_range(5, "rows", -(2**63), 2**63 - 1) == (-(2**63), 2**63 - 1)
    with pytest.raises(KeyError):
        f.key_range(5, "small", 0, 1)
    assert f.dense_keys(5) is None  # rows are never merged densely
    g = Fields(
        {"w": Keyed(per=lambda ctx: 4, dense=lambda ctx: ctx), "u": Keyed(per=lambda ctx: 1, dense=lambda ctx: 9)}
    )
    assert g.dense_keys(12) == {"w": (0, 12), "u": (0, 9)}
    assert g.dense_keys(None) is None  # one of them too large (its dense says None): spilled
    # accumulators that may only be in a device's memory (they grow with the cell)
    h = Fields({"w": Keyed(per=lambda ctx: 4, dense=lambda ctx: ctx, dense_host=False)})
    assert h.dense_keys(12) == h.dense_keys(12, on_device=True) == {"w": (0, 12)}
    assert h.dense_keys(12, on_device=False) is None and g.dense_keys(12, on_device=False) == g.dense_keys(12)


def test_which_analyses_merge_keyed_sums_in_host_memory():
    """On the host only machine-utilization's (and usage-change's by machine) keyed sums go into
    dense accumulators, within their own cap; overcommit's and cpi's only on a device."""
    from gpuclust.analyses.registry import create

    dense = {n: create(n).kinds for n in ("cpi", "machine-utilization", "overcommit")}
    assert all(any(f.kinds[k].keyed.dense is not None for k in f.sharded) for f in dense.values())
    assert {n for n, f in dense.items() if _host_dense(f)} == {"machine-utilization"}


def _host_dense(f: Fields) -> bool:
    return any(f.kinds[n].keyed.dense is not None and f.kinds[n].keyed.dense_host for n in f.sharded)


def test_identities_are_merge_identities_on_the_host_and_the_backend():
    f = Fields(
        {
            "dense": Sum((2, 3), np.int64),
            "lo": Min((4,), np.int64),
            "hi": Max((4,), np.int64, fill=-1),
            "flo": Min((2,)),
            "backend": Label(),
            "sample": Concat(np.int64),
            "pairs": Merged(lambda x, y: sorted(set(x) | set(y)), empty=lambda xp: []),
            "w": Flat(Keyed({"s": np.float64, "n": np.int32, "m": np.int64}), "w_", ("key", "s", "n", "m")),
            "rows": Keyed({"v": np.float64, "q": (np.float64, (3,))}, rows=True),
        }
    )
    e = f.empty()
    assert e["backend"] == "cpu" and e["pairs"] == [] and e["hi"].tolist() == [-1] * 4
    assert e["lo"].tolist() == [np.iinfo(np.int64).max] * 4 and e["flo"].tolist() == [np.inf] * 2
    assert e["rows"]["q"].shape == (0, 3) and e["w_n"].dtype == np.int32 and e["w_key"].dtype == np.int64
    assert not any(hasattr(v, "__cuda_array_interface__") for v in e.values())
    d = f.empty(DEVICE, on_backend=True)
    assert hasattr(d["dense"], "__cuda_array_interface__") and hasattr(d["rows"]["v"], "__cuda_array_interface__")
    assert d["backend"] == DEVICE.name
    p = _partial(5, "gpu")
    p = {
        **p,
        "dense": p["dense"].astype(np.int64),
        "flo": np.array([1.5, -2.0]),
        "sample": p["sample"].astype(np.int64),
        "rows": {**p["rows"], "q": np.ones((5, 3))},
        "w_n": p["w_n"].astype(np.int32),
        "pairs": sorted(p["pairs"]),
    }
    del p["small"]
    for got in (f.merge(e, p), f.merge(p, e)):
        assert set(got) == set(p)
        for k, v in p.items():
            if isinstance(v, dict):
                assert all(np.array_equal(got[k][c], v[c]) for c in v), k
            else:
                assert np.array_equal(np.asarray(got[k]), np.asarray(v)), k
