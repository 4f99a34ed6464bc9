from __future__ import annotations

import doctest
import importlib

import numpy as np
import pytest

from gpuclust.analyses.base import keyed_reduce, merge_keyed, merge_moments, to_host
from gpuclust.backends import get_backend

DOCTEST_MODULES = [
    "gpuclust.analyses.base", "gpuclust.analyses.cell_usage", "gpuclust.analyses.machine_shapes",
    "gpuclust.analyses.registry", "gpuclust.backends", "gpuclust.backends.cpu", "gpuclust.engine.local",
    "gpuclust.engine.partition",
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


def test_stage_is_identity_on_cpu():
    a = np.arange(3)
    assert get_backend("cpu").stage(a) is a
