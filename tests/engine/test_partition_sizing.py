"""Partition planning and reading details behind the CPU-speed work (issue 8): cuts on row-group
boundaries, per-analysis partition targets, zero-copy single-row-group reads, the lookup's
group-by."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from strategies import random_cell, write_dataset

from gpuclust.analyses import CellUsage, Cpi, MachineShapes, _lookup
from gpuclust.dataset import Dataset
from gpuclust.engine import memory, partition, reading
from gpuclust.engine.partition import _snap_cuts, plan_partitions
from gpuclust.engine.reading import read_partition


def _nearest(ideal, bounds):
    return [int(bounds[np.abs(bounds - c).argmin()]) for c in ideal]


@pytest.mark.parametrize("seed", range(20))
def test_snap_cuts_increasing_boundaries_and_nearest_when_distinct(seed):
    rng = np.random.default_rng(seed)
    bounds = np.unique(rng.integers(1, 10_000, rng.integers(3, 40)))
    k = int(rng.integers(1, bounds.shape[0] + 1))
    ideal = sorted(int(x) for x in rng.integers(1, 10_000, k))
    cuts = _snap_cuts(ideal, bounds)
    assert len(cuts) == k and set(cuts) <= set(bounds.tolist())
    assert all(a < b for a, b in zip(cuts, cuts[1:], strict=False))
    near = _nearest(ideal, bounds)
    if len(set(near)) == k:  # what the planner did before: kept where it worked
        assert cuts == near


def test_snap_cuts_rows_groups_of_uneven_files():
    # 12 row groups of 2^20 rows, then 4 of 857,572 (bench/data/canonical-16000000): 16 partitions
    # are the 16 row groups (nearest-boundary snapping alone maps two cuts to one boundary)
    sizes = [1 << 20] * 12 + [857_572] * 4
    bounds = np.cumsum(sizes)[:-1]
    total = sum(sizes)
    ideal = [round(j * total / 16) for j in range(1, 16)]
    assert len(set(_nearest(ideal, bounds))) < 15
    assert _snap_cuts(ideal, bounds) == bounds.tolist()


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    tables = random_cell(5, n_windows=3000)
    return Dataset(write_dataset(tmp_path_factory.mktemp("ds"), tables, files=2, row_group_size=400))


def test_partitions_are_whole_row_groups(dataset):
    groups = []
    for f in dataset.files("instance_usage"):
        md = pq.ParquetFile(f).metadata
        groups += [md.row_group(g).num_rows for g in range(md.num_row_groups)]
    specs = plan_partitions(dataset, "instance_usage", len(groups))
    assert [sp.num_rows for sp in specs] == groups
    assert all(reading._single_block(sp) for sp in specs)


def test_single_row_group_reads_are_views_with_the_same_values(dataset):
    cols = list(CellUsage().columns)
    specs = plan_partitions(dataset, "instance_usage", "auto", auto_rows=400)
    one = [sp for sp in specs if reading._single_block(sp)]
    assert one
    whole = read_partition(plan_partitions(dataset, "instance_usage", 1)[0], cols)
    at = 0
    for sp in specs:
        got = read_partition(sp, cols)
        for c in cols:
            np.testing.assert_array_equal(got[c], whole[c][at : at + sp.num_rows])
            assert got[c].dtype == whole[c].dtype
        at += sp.num_rows
    assert at == whole["start_time"].shape[0]


def test_in_memory_slices_read_as_views():
    t = pa.table(
        {
            "start_time": pa.array(np.arange(10, dtype=np.int64)),
            "alloc_collection_id": pa.array([None, 1] * 5, type=pa.int64()),
        }
    )
    src = partition.TableSource({"instance_usage": t})
    sp = plan_partitions(src, "instance_usage", 2)[1]
    got = read_partition(sp, ["start_time", "alloc_collection_id"])
    assert got["start_time"].tolist() == list(range(5, 10))
    assert not got["start_time"].flags.writeable  # a view of the Arrow buffer
    assert got["alloc_collection_id"].tolist() == [1, np.iinfo(np.int64).min] * 2 + [1]


def test_preferred_rows_only_when_every_analysis_names_one():
    cap = 1 << 22
    assert memory.preferred_rows([CellUsage()], cap) == CellUsage.auto_partition_rows
    assert memory.preferred_rows([CellUsage(), Cpi()], cap) == max(
        CellUsage.auto_partition_rows, Cpi.auto_partition_rows
    )
    assert memory.preferred_rows([CellUsage(), MachineShapes()], cap) == cap
    assert memory.preferred_rows([CellUsage()], 1 << 10) == 1 << 10
    # the memory budget still wins when it asks for less
    assert memory.partition_rows(1 << 28, 2, [CellUsage()], "instance_usage", cap) < CellUsage.auto_partition_rows


def test_job_usage_partitions_follow_the_events():
    """job-usage's ``auto`` partitions: one 1 Mi-row row group while the events (a bound on its
    dense partials' collections) are at most that many, 2 Mi rows beyond; the run plans them so."""
    from gpuclust.analyses.job_usage import JobUsage
    from gpuclust.engine.planning import auto_rows_of

    class Counted:
        def __init__(self, events: int):
            self.events = events

        def num_rows(self, table: str) -> int:
            assert table == "instance_events"
            return self.events

    cap, a = 1 << 22, JobUsage()
    assert memory.preferred_rows([a], cap, Counted(800_000)) == 1 << 20
    assert memory.preferred_rows([a], cap, Counted(1 << 20)) == 1 << 20
    assert memory.preferred_rows([a], cap, Counted(3_200_000)) == 1 << 21
    assert memory.preferred_rows([a], cap) == JobUsage.auto_partition_rows  # no source: the declared size
    assert memory.preferred_rows([a, CellUsage()], cap, Counted(3_200_000)) == 1 << 21  # the largest
    assert auto_rows_of([a], 1 << 40, 2, Counted(10)) == {"instance_usage": 1 << 20}
    assert auto_rows_of([a], 1 << 40, 2, Counted(1 << 22)) == {"instance_usage": 1 << 21}


@pytest.mark.parametrize("collide", [False, True])
def test_group_max_matches_pandas(monkeypatch, collide):
    rng = np.random.default_rng(3)
    n = 5000
    c = rng.integers(0, 40, n).astype(np.int64)
    i = rng.integers(0, 5, n).astype(np.int32)
    m = rng.integers(0, 7, n).astype(np.int64)
    p = np.where(rng.random(n) < 0.2, np.nan, rng.integers(0, 400, n).astype(np.float64))
    if collide:  # every key shares one hash: the keys' own sort must take over
        monkeypatch.setattr(_lookup, "triple_hash", lambda xp, a, b, d: np.zeros(a.shape[0], np.uint64))
    got = _lookup._group_max(c, i, m, p)
    want = pd.DataFrame({"c": c, "i": i, "m": m, "p": p}).groupby(["c", "i", "m"], sort=False)["p"].max().reset_index()
    pd.testing.assert_frame_equal(got.reset_index(drop=True), want, check_dtype=False)
