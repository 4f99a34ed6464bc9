"""A spill of the bounded strategy tabulates its groups a slice of rows at a time
(``_hybrid_summary.TABULATE_ROWS``): the same counts, weights and means, knots within the bound
each group reports (against the exact mixture), that bound the depth of the slices' merge tree,
and memory that follows the slice, not the partition."""

from __future__ import annotations

import math
import tracemalloc

import gpuclust_mixture_reference as ref
import numpy as np
import pytest

from gpuclust.analyses import _hybrid_summary as hs
from gpuclust.analyses import mixture_summary as ms
from gpuclust.schema import CPU_PERCENTILE_LEVELS_SORTED

LV = np.asarray(CPU_PERCENTILE_LEVELS_SORTED, dtype=np.float64)


def _rows(seed: int, sizes: list[int]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Grouped rows of float32 percentiles (sorted: repaired), some weightless, the last group all."""
    rng = np.random.default_rng(seed)
    n = sum(sizes)
    q = np.sort(rng.gamma(0.6, 0.3, (n, LV.shape[0])).astype(np.float32), axis=1).astype(np.float64)
    q[rng.random(n) < 0.2] = 0.0  # idle windows: a gap in each group's CDF
    w = rng.choice([300.0, 60.0, 0.0], n)
    keys = np.repeat(np.arange(len(sizes), dtype=np.int64) * 7 + 3, sizes)
    w[keys == keys[-1]] = 0.0
    return q, w, keys


def test_sliced_spill_is_within_the_bound_of_its_merge_depth(monkeypatch):
    sizes, k = [400, 3, 250, 97, 60], 64
    q, w, keys = _rows(5, sizes)
    whole = hs.leaf(q, w, keys, k, repaired=True)
    monkeypatch.setattr(hs, "TABULATE_ROWS", 37)
    sliced = hs.leaf(q, w, keys, k, repaired=True)
    b, b1 = sliced["bounded"], whole["bounded"]
    assert b["key"].tolist() == b1["key"].tolist() == [3, 17, 24]  # 3 windows, or none usable: exact
    for s in ("n_windows", "n_repaired", "n_null", "weight", "wmean"):
        np.testing.assert_array_equal(b[s], b1[s], err_msg=s)
    assert sliced["exact"]["key"].tolist() == whole["exact"]["key"].tolist() == [10, 31]
    usable = int(((w > 0) & np.isin(keys, [3, 17, 24])).sum())
    depth = math.ceil(math.log2(math.ceil(usable / 37)))
    assert (b1["err"] == 1 / k).all()
    assert (b["err"] > 1 / k).all() and (b["err"] <= (1 + depth) / k + 1e-12).all()
    res = hs.finalize(sliced, LV)
    for i, g in enumerate(res["key"].tolist()):
        sel = (keys == g) & (w > 0)
        eps = float(res["err_bound"][i])
        if not sel.any():
            continue
        lo = ref.group_quantiles(q[sel], w[sel], np.clip(LV - eps - 1e-9, 0, 1))
        hi = ref.group_quantiles(q[sel], w[sel], np.clip(LV + eps + 1e-9, 0, 1))
        x = res["quantiles"][i]
        assert np.all(x >= lo - 1e-9 * np.abs(lo)) and np.all(x <= hi + 1e-9 * np.abs(hi)), g


def test_a_big_groups_spill_takes_the_memory_of_a_slice(monkeypatch):
    """One group of 2^18 windows, tabulated whole and in slices of 2^15: the peak of the slices
    (traced NumPy allocations above the inputs) is under a third of the whole's."""
    q, w, keys = _rows(9, [1 << 18])
    w[:] = 60.0
    peaks = {}
    for rows in (1 << 20, 1 << 15):
        monkeypatch.setattr(hs, "TABULATE_ROWS", rows)
        tracemalloc.start()
        try:
            hs.leaf(q, w, keys, 1024, repaired=True)
            peaks[rows] = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
    assert peaks[1 << 15] < peaks[1 << 20] / 3, peaks


@pytest.mark.parametrize("n_slices", [2, 3, 5])
def test_slices_merge_as_a_balanced_tree(monkeypatch, n_slices):
    """The merges a sliced spill makes: ceil(log2 slices) levels (a left fold would make
    slices - 1), counted on one group."""
    q, w, keys = _rows(2, [60 * n_slices])
    w[:] = 1.0
    monkeypatch.setattr(hs, "TABULATE_ROWS", 60)
    depth: list[int] = []
    merge = ms.merge

    def counted(a, b):
        out = merge(a, b)
        out["_depth"] = 1 + max(a.get("_depth", 0), b.get("_depth", 0))
        depth.append(out["_depth"])
        return out

    monkeypatch.setattr(ms, "merge", counted)
    hs.leaf(q, w, keys, 64, repaired=True)
    assert len(depth) == n_slices - 1 and max(depth) == math.ceil(math.log2(n_slices))


def test_sliced_spill_on_the_device_shaped_backend_is_the_hosts(monkeypatch):
    """The slices and their merges on device arrays (the device-shaped backend: arrays that refuse
    host operands and implicit copies, as CuPy's do): the host's leaf, bit for bit."""
    from device_backend import DEVICE, resolve_gpu_to_device

    from gpuclust.analyses.base import to_host

    resolve_gpu_to_device(monkeypatch)
    monkeypatch.setattr(hs, "TABULATE_ROWS", 37)
    q, w, keys = _rows(7, [300, 2, 180, 50])
    want = hs.leaf(q, w, keys, 64, repaired=True)
    got = to_host(hs.leaf(DEVICE.asarray(q), DEVICE.asarray(w), DEVICE.asarray(keys), 64, repaired=True))
    for part in ("exact", "bounded"):
        assert set(got[part]) == set(want[part])
        for f, v in want[part].items():
            if isinstance(v, np.ndarray):
                np.testing.assert_array_equal(got[part][f], v, err_msg=f"{part} {f}")
