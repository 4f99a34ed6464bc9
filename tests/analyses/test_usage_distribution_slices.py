"""``usage-distribution``'s first pass in slices of the collections (``exact-two-pass`` by
instance or collection, option ``slices``): the same brackets and tables as one unsliced pass,
bit for bit; each slice reads only its collections, every collection in exactly one slice, so
each pass's state is its share of the unsliced one; ``slices`` = -1 plans slices as the rows grow,
only where the groups are collections or instances.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import by_path
import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import gpuclust.engine as engine
from gpuclust.analyses import _usage_distribution_slices as sl
from gpuclust.analyses import _usage_distribution_two_pass as tp
from gpuclust.analyses.usage_distribution import STATS, UsageDistribution, UsageDistributionBrackets
from gpuclust.backends import get_backend
from gpuclust.engine import TableSource
from gpuclust.engine.local import context_of
from gpuclust.engine.partition import column_to_numpy
from gpuclust.layout import bucket_ids

CPU = get_backend("cpu")
make_cell = by_path.load(
    "gpuclust_test_usage_distribution", Path(__file__).with_name("test_usage_distribution.py")
).make_cell


@pytest.fixture(scope="module")
def cell():
    """The sibling module's cell (point masses, zero weights, NULL rates and percentiles, bad
    times), its windows spread over 80 collections of ids of every size."""
    t = make_cell(3, n_windows=900, n_instances=60)
    rng = np.random.default_rng(4)
    ids = np.concatenate([rng.integers(-(2**63), 2**63 - 1, 76), [0, 1, 2**62 + 9, -(2**63)]]).astype(np.int64)
    u = t["instance_usage"]
    new = pa.array(ids[rng.integers(0, ids.shape[0], u.num_rows)], pa.int64())
    return {**t, "instance_usage": u.set_column(u.schema.get_field_index("collection_id"), "collection_id", new)}


def _run(src, a, **kw):
    return engine.run(src, [a], **kw)[a.name]


@pytest.mark.parametrize("by", [("collection",), ("instance",), ("collection", "time"), ("machine", "collection")])
def test_sliced_runs_equal_one_pass_bit_for_bit(cell, by):
    src = TableSource(cell)
    kw = dict(by=by, bucket_s=1800, strategy="exact-two-pass", bracket_k=64)
    want = _run(src, UsageDistribution(**kw, slices=1), partitions=3)
    assert want["quantiles"].shape[0] > 40
    for n in (2, 7):
        got = _run(src, UsageDistribution(**kw, slices=n), partitions=3)
        for t in ("quantiles", "naive"):
            assert got[t].equals(want[t]), (n, t)
        assert got["info"]["slices"].iloc[0] == n and want["info"]["slices"].iloc[0] == 1


def test_the_brackets_of_the_slices_are_those_of_one_pass(cell):
    src = TableSource(cell)
    one = _run(src, UsageDistributionBrackets(by="collection", strategy="bounded", k=64), partitions=4)["brackets"]
    last = UsageDistributionBrackets(by="collection", strategy="bounded", k=64, slices=5, part=4)
    assert last.prerequisites(src)["brackets"].prerequisites(src)["brackets"].part == 2
    got = _run(src, last, partitions=4)["brackets"]
    assert got.equals(one)
    # each slice's own brackets: its collections only, every collection in one slice
    keys = []
    orig = tp.brackets_of_partial
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(tp, "brackets_of_partial", lambda *a, **k: keys.append(orig(*a, **k)) or keys[-1])
        _run(src, last, partitions=4)
    keys = [b["key"] for b in keys]  # each slice's own, in order
    assert len(keys) == 5
    cat = np.concatenate(keys)
    assert np.array_equal(np.sort(cat), np.asarray(one["key"])) and np.unique(cat).shape[0] == cat.shape[0]
    assert max(k.shape[0] for k in keys) < 0.5 * cat.shape[0]  # each slice a share of the state


def test_each_slice_reads_its_collections_only(cell):
    a = UsageDistribution(by="collection", strategy="exact")
    ctx = context_of(a, TableSource(cell), partitions=1)
    t = cell["instance_usage"]
    cols = {c: column_to_numpy(t.column(c)) for c in a.columns}
    whole = a.partial(cols, ctx, CPU)
    stats = dict(zip(STATS, whole["stats"].tolist(), strict=True))
    seen, used = [], 0
    for r in range(3):
        part = a.partial(cols, replace(ctx, slice_of=(r, 3)), CPU)
        coll = part["groups"]["kc"][:, 0]
        assert (bucket_ids(np, [coll], 3) == r).all() and 0 < coll.shape[0] < whole["groups"]["kc"].shape[0]
        seen.append(coll)
        used += dict(zip(STATS, part["stats"].tolist(), strict=True))["used_windows"]
    assert np.array_equal(np.sort(np.concatenate(seen)), np.sort(whole["groups"]["kc"][:, 0]))
    assert used == stats["used_windows"]


@settings(max_examples=40, deadline=None)
@given(
    ids=st.lists(st.integers(-(2**63), 2**63 - 1), min_size=1, max_size=60),
    n=st.integers(1, 9),
)
def test_every_collection_is_in_exactly_one_slice(ids, n):
    c = np.asarray(ids, np.int64)
    hits = np.stack([sl.in_slice(np, c, r, n) for r in range(n)])
    assert (hits.sum(axis=0) == 1).all()
    same = c[:, None] == c[None, :]  # the same id, the same slice
    where = hits.argmax(axis=0)
    assert (where[:, None] == where[None, :])[same].all()


def test_slices_are_planned_by_the_rows_for_collections_and_instances():
    assert sl.slices_for(10**9, ("machine",)) == sl.slices_for(10**9, ("tier", "time")) == 1
    got = [sl.slices_for(n, ("collection",)) for n in (0, 10**5, 10**6, 4 * 10**6, 16 * 10**6, 10**8, 3 * 10**9)]
    assert got == sorted(got) and got[0] == got[1] == 1 and got[-1] == sl.MAX_SLICES
    per = sl.SLICE_STATE_BYTES / sl.STATE_BYTES_PER_WINDOW  # windows a slice holds
    assert sl.slices_for(int(5 * per), ("instance",)) == 5 and sl.slices_for(int(5 * per) + 1, ("instance",)) == 6
    a, b = UsageDistribution(by="collection"), UsageDistribution(by="collection", slices=3)

    class Src:
        def num_rows(self, table):
            return 16 * 10**6

    assert a.slices_of(Src()) == sl.slices_for(16 * 10**6, ("collection",)) > 1 and b.slices_of(Src()) == 3
    first = a.prerequisites(Src())["brackets"]  # exact-two-pass (above exact_max_windows)
    while not isinstance(first, UsageDistributionBrackets):
        first = first.prerequisites(Src())["brackets"]
    assert (first.slices, first.part) == (a.slices_of(Src()), a.slices_of(Src()) - 1)
    unsliced = UsageDistribution(by="machine").prerequisites(Src())["brackets"]
    while not isinstance(unsliced, UsageDistributionBrackets):
        unsliced = unsliced.prerequisites(Src())["brackets"]
    assert unsliced.part == 0 and unsliced.label == UsageDistributionBrackets(
        by="machine", strategy="bounded", k=unsliced.k
    ).label.replace("usage-distribution-brackets", unsliced.name)


def test_slices_is_checked():
    with pytest.raises(ValueError):
        UsageDistribution(slices=-2)
    with pytest.raises(ValueError):
        UsageDistributionBrackets(part=-1)
