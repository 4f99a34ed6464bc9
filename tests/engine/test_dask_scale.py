"""Dask at scale on a bucketed dataset: the same plans on a ``distributed.LocalCluster`` with
capped workers give the local engine's results, and what the client ships in the task graph does
not grow with the data."""

from __future__ import annotations

import pickle
import sys
from pathlib import Path

import pytest
from strategies import assert_results_same

from gpuclust.analyses.registry import create, names
from gpuclust.analyses.usage_distribution import UsageDistribution
from gpuclust.dataset import Dataset
from gpuclust.engine import run
from gpuclust.engine.contexts import contexts, per_partition
from gpuclust.engine.planning import plan_tables
from gpuclust.optimize import optimize

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
from gen_canonical import make_dataset  # noqa: E402


def _bucketed(root: Path, windows: int) -> Dataset:
    make_dataset(root / "flat", windows, seed=7)
    optimize(root / "flat", buckets=8, out=root / "bk", progress=False)
    return Dataset(root / "bk")


@pytest.fixture(scope="module")
def small(tmp_path_factory: pytest.TempPathFactory) -> Dataset:
    return _bucketed(tmp_path_factory.mktemp("small"), 40_000)


@pytest.fixture(scope="module")
def large(tmp_path_factory: pytest.TempPathFactory) -> Dataset:
    return _bucketed(tmp_path_factory.mktemp("large"), 160_000)


def _analyses() -> list:
    return [*(create(n) for n in names()), UsageDistribution(by="instance"), UsageDistribution(by="tier,time")]


def test_a_capped_local_cluster_gives_the_local_results(small: Dataset) -> None:
    ans = _analyses()
    ref = run(small, ans, partitions=4, workers=2)
    got = run(small, ans, partitions=4, scheduler="local:2", memory_limit="3GiB")
    assert_results_same(ref, got, rtol=1e-9)


def _shipped_bytes(ds: Dataset, analysis: object) -> int:
    """Bytes of what the client puts in the task graph for ``analysis``: its context and the
    partition specs (file pieces and their side pieces)."""
    import tempfile

    ans = [analysis]
    plans = plan_tables(ds, ans, 4)
    with tempfile.TemporaryDirectory() as scratch:  # as run(): large context arrays travel as file names
        ctxs = contexts(
            ans,
            ds,
            per_partition=per_partition(ds, ans, plans),
            run_pass=lambda pre: run(ds, pre, partitions=4),
            scratch=Path(scratch),
        )
        return len(pickle.dumps(ctxs)) + len(pickle.dumps(plans))


@pytest.mark.parametrize(
    "analysis",
    [
        create("cell-usage"),
        UsageDistribution(by="tier"),
        UsageDistribution(by="instance"),
        create("overcommit"),
        create("machine-shapes"),
        # its machine x 5-minute table (the first pass' result) is memory-mapped
        # from the run's scratch folder: it travels as a file name
        create("cpi"),
    ],
    ids=lambda a: a.label,
)
def test_the_graph_does_not_grow_with_the_data(small: Dataset, large: Dataset, analysis: object) -> None:
    """4x the windows (4x the instances and hours; the same 50 machines: per-machine context is
    allowed, a cell has ~12k machines): the shipped bytes stay within 1.5x."""
    a, b = _shipped_bytes(small, analysis), _shipped_bytes(large, analysis)
    assert b <= 1.5 * a, (a, b)
