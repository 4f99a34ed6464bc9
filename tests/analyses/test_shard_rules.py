"""The shard rules of sharded partials (``Fields.shard_by``, gpuclust/analyses/kinds.py) against
what a shard must be: contiguous ranges that cover every coordinate once, each within its size
(counted by slow obvious code), a coordinate never cut, the device's larger shards only where
the partials' label says a device computed them."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuclust.analyses.kinds import Counted, Even, Fields, Keyed, Label, Sampled, Sum


def _covers(ranges: list[tuple[int, int]], n: int) -> None:
    assert ranges[0][0] == 0 and ranges[-1][1] == n
    assert all(a[1] == b[0] for a, b in zip(ranges, ranges[1:], strict=False))
    assert all(lo < hi for lo, hi in ranges) or ranges == [(0, 0)]


@settings(max_examples=80, deadline=None)
@given(st.integers(0, 500), st.integers(0, 40), st.integers(1, 300), st.booleans())
def test_even_ranges(n, weight, size, on_device):
    rule = Even(lambda ctx: n, lambda ctx: weight, size, device=4)
    got = rule.ranges(None, {}, on_device)
    _covers(got, n)
    cap = size * (4 if on_device else 1)
    per = max(1, cap // max(weight, 1))  # coordinates a shard may hold
    lengths = [hi - lo for lo, hi in got]
    assert max(lengths) <= per
    assert max(lengths) - min(lengths) <= 1  # of equal size, no small last one
    assert len(got) == max(1, -(-n // per))  # no more shards than it takes


@settings(max_examples=80, deadline=None)
@given(st.lists(st.integers(0, 30), max_size=40), st.integers(0, 10), st.integers(1, 60))
def test_counted_ranges(rows, extra, size):
    n = len(rows) + extra  # coordinates past the counted ones have no rows
    got = Counted(lambda ctx: n, "count", size).ranges(None, {"count": np.asarray(rows, np.int64)}, False)
    _covers(got, n)
    padded = rows + [0] * extra
    if not sum(rows):
        assert got == [(0, n)]
        return
    for lo, hi in got:
        total = sum(padded[lo:hi])
        assert total <= size or hi - lo == 1  # over the size only for one coordinate alone
        if hi < n:  # greedy: the next coordinate would not have fitted
            assert total + padded[hi] > size


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(-(2**40), 2**40), min_size=1, max_size=50), st.integers(1, 20), st.integers(1, 400))
def test_sampled_ranges(sample, size, n):
    lo, hi = np.iinfo(np.int64).min, np.iinfo(np.int64).max
    rest = {"n": n, "sample": np.asarray(sample, np.int64), "full": None}
    got = Sampled(size, whole="full").ranges(None, rest, False)
    assert got[0][0] == lo and got[-1][1] == hi
    assert all(a[1] == b[0] and a[0] < a[1] for a, b in zip(got, got[1:], strict=False))
    k = -(-n // size)
    assert len(got) <= max(k, 1)
    cuts = {b for _, b in got[:-1]}
    assert cuts <= set(sample)  # cut only at sampled keys
    if k > 1 and len(set(sample)) >= k:
        assert len(got) > 1
    assert Sampled(size, whole="full").ranges(None, {**rest, "full": {}}, False) == [(lo, hi)]


def test_fields_shards_by_where_the_partials_were_computed():
    """``Fields.shards`` asks the rule for a device's larger shards only when the rest's label
    (the backend the partials were computed on) is not the cpu."""
    f = Fields(
        {"k": Keyed({"v": np.float64}, per=lambda ctx: 1), "n": Sum(), "backend": Label()},
        shard_by=Even(lambda ctx: 64, lambda ctx: 1, 8, device=4),
    )
    assert len(f.shards(None, {"backend": "cpu", "n": 0})) == 8
    assert len(f.shards(None, {"backend": "gpu", "n": 0})) == 2
    no_rule = Fields({"k": Keyed({"v": np.float64}, per=lambda ctx: 1)})
    try:
        no_rule.shards(None, {})
    except TypeError as e:
        assert "shard_by" in str(e)
    else:
        raise AssertionError("a sharded partial without a rule was cut")
