"""The cpu backend's slot table of :class:`InstanceLookup` (one gather per query) against the
generic path (``hash_index`` + records, what the gpu backend runs): same rows, same codes."""

from __future__ import annotations

import numpy as np
import pytest

from gpuclust.analyses._lookup import InstanceLookup, _SlotTable
from gpuclust.backends import get_backend


def _generic(lk: InstanceLookup, c: np.ndarray, i: np.ndarray, m: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    be = get_backend("cpu")
    found, pos, code = lk._probe(be, (lk.hash, lk._records()), c, i, m)
    return np.where(found, pos, -1), np.where(found, code, 0)


@pytest.mark.parametrize("n", [1, 2, 7, 1000, 50_000])
def test_slot_table_matches_generic_path(n: int) -> None:
    rng = np.random.default_rng(n)
    # few distinct values per column: many keys share parts, and slots collide (long probe runs)
    c = rng.integers(-5, 5, n * 3).astype(np.int64) * (1 << 40) + rng.integers(0, 50, n * 3)
    i = rng.integers(-(1 << 31), (1 << 31) - 1, n * 3, dtype=np.int64).astype(np.int32)
    i[::3] = rng.integers(-2, 3, i[::3].shape[0])
    m = rng.integers(0, 4, n * 3).astype(np.int64) * 997
    keys = np.unique(np.stack([c, i.astype(np.int64), m], axis=1), axis=0)[:n]
    code = rng.integers(-3, 1000, keys.shape[0]).astype(np.int32)
    lk = InstanceLookup.build(keys[:, 0], keys[:, 1].astype(np.int32), keys[:, 2], code)
    # queries: every key, keys with one field changed, and random triples
    qc = np.concatenate([keys[:, 0], keys[:, 0] + 1, keys[:, 0], keys[:, 0], c])
    qi = np.concatenate([keys[:, 1], keys[:, 1], keys[:, 1] ^ 1, keys[:, 1], i.astype(np.int64)]).astype(np.int32)
    qm = np.concatenate([keys[:, 2], keys[:, 2], keys[:, 2], keys[:, 2] + 997, m])
    order = rng.permutation(qc.shape[0])
    qc, qi, qm = qc[order], qi[order], qm[order]
    be = get_backend("cpu")
    assert lk._slot_table() is not None
    want_pos, want_code = _generic(lk, qc, qi, qm)
    np.testing.assert_array_equal(lk.index(be, qc, qi, qm), want_pos)
    found, got = lk.find(be, qc, qi, qm)
    np.testing.assert_array_equal(found, want_pos >= 0)
    np.testing.assert_array_equal(got, want_code)
    assert found[np.argsort(order)][: keys.shape[0]].all()  # every key is found
    rows = np.flatnonzero(rng.random(qc.shape[0]) < 0.5)
    np.testing.assert_array_equal(lk.index(be, qc, qi, qm, rows=rows), want_pos[rows])


def test_empty_slot_never_matches() -> None:
    """An empty slot holds zeros and the empty bit: a query (0, 0, 0) is not found in it."""
    lk = InstanceLookup.build(np.array([5]), np.array([1], np.int32), np.array([9]), np.array([3]))
    t = lk._slot_table()
    assert isinstance(t, _SlotTable)
    found, _ = lk.find(get_backend("cpu"), np.zeros(4, np.int64), np.zeros(4, np.int32), np.zeros(4, np.int64))
    assert not found.any()


def test_wide_instance_queries_use_generic_path() -> None:
    """int64 instance queries (not canonical) are compared whole, as before: 2^32 + 1 is not 1."""
    lk = InstanceLookup.build(np.array([5]), np.array([1], np.int32), np.array([9]), np.array([3]))
    found, _ = lk.find(get_backend("cpu"), np.array([5, 5]), np.array([1, (1 << 32) + 1], np.int64), np.array([9, 9]))
    assert found.tolist() == [True, False]


class _Batches:
    def __init__(self, tables):
        self.tables = tables

    def batches(self, columns):
        for t in self.tables:
            yield t.select(list(columns))


def _events(rng: np.random.Generator, n: int):
    import pyarrow as pa

    def nulls(a, frac, typ):
        mask = rng.random(n) < frac
        return pa.array(a, type=typ, mask=mask)

    return pa.table(
        {
            "collection_id": pa.array(rng.integers(0, 40, n), pa.int64()),
            "instance_index": pa.array(rng.integers(-2, 30, n), pa.int32()),
            "machine_id": nulls(rng.integers(0, 5, n) * 1000, 0.05, pa.int64()),
            "priority": nulls(rng.integers(0, 400, n), 0.2, pa.int32()),
            "alloc_collection_id": nulls(np.where(rng.random(n) < 0.2, rng.integers(1, 9, n), 0), 0.3, pa.int64()),
        }
    )


@pytest.mark.parametrize("top_level_only", [True, False])
@pytest.mark.parametrize("sizes", [[0], [1], [500], [300, 0, 700, 50]])
def test_fused_lookups_equal_grouped_path(top_level_only: bool, sizes: list[int]) -> None:
    """tier_lookup / priority_lookup from the hash-sorted groups: the same lookup as grouping by
    first appearance and building it again (arrays equal, dtypes too)."""
    from gpuclust.analyses import _lookup as L
    from gpuclust.schema import tier_map
    from gpuclust.tiers import tier_codes

    rng = np.random.default_rng(sum(sizes) + top_level_only)
    ev = _Batches([_events(rng, k) for k in sizes])
    tm = tier_map("notebook")
    old = L._max_priorities(ev, top_level_only)

    def build(codes):
        if old is None:
            return InstanceLookup.empty()
        return InstanceLookup.build(
            old["c"].to_numpy(np.int64), old["i"].to_numpy(np.int32), old["m"].to_numpy(np.int64), codes
        )

    p = None if old is None else old["p"].to_numpy(np.float64)
    for got, want in (
        (
            L.tier_lookup(ev, tm, top_level_only=top_level_only, unmatched=9, what="t"),
            build(None if p is None else tier_codes(np, tm, p, 9).astype(np.int32)),
        ),
        (
            L.priority_lookup(ev, top_level_only=top_level_only, what="t"),
            build(None if p is None else L._priority_codes(p)),
        ),
    ):
        for f in ("hash", "collection", "instance", "machine", "code"):
            a, b = getattr(got, f), getattr(want, f)
            if len(want) == 0:
                assert len(got) == 0
                continue
            assert a.dtype == b.dtype, f
            np.testing.assert_array_equal(a, b, err_msg=f)
