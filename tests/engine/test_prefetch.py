"""The local path reads its first partitions while the contexts are computed
(gpuclust/engine/tasks.py ``Prefetch``): each partition still read once, same results."""

from __future__ import annotations

import pytest
from strategies import assert_results_same, random_cell, write_dataset

from gpuclust.dataset import Dataset
from gpuclust.engine import local, planning, reading, run, tasks
from gpuclust.engine import partition as P


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Dataset:
    return Dataset(
        write_dataset(
            tmp_path_factory.mktemp("prefetch"), random_cell(11, n_windows=20_000), files=2, row_group_size=2_000
        )
    )


def test_each_partition_is_read_once_and_results_match(dataset: Dataset, monkeypatch: pytest.MonkeyPatch) -> None:
    names = ["cell-usage", "machine-shapes", "job-usage"]
    want = run(dataset, names, partitions=6, workers=1)
    reads: list[tuple[str, int]] = []
    popped: list[bool] = []
    read, pop = reading.read_partition, tasks.Prefetch.pop

    def counting_read(spec, columns):  # type: ignore[no-untyped-def]
        reads.append((spec.table, spec.index))
        return read(spec, columns)

    def counting_pop(self, spec):  # type: ignore[no-untyped-def]
        got = pop(self, spec)
        popped.append(got is not None)
        return got

    monkeypatch.setattr(reading, "read_partition", counting_read)
    monkeypatch.setattr(tasks.Prefetch, "pop", counting_pop)
    got = run(dataset, names, partitions=6, workers=2)
    assert_results_same(got, want)
    assert len(set(reads)) == len(reads)  # every partition read once
    assert sorted(i for t, i in reads if t == "instance_usage") == list(range(6))
    assert popped.count(True) == 2  # the first two came from the prefetch


def test_no_prefetch_with_one_thread_or_a_prerequisite_pass(dataset: Dataset) -> None:
    from gpuclust.analyses.registry import create
    from gpuclust.backends import get_backend

    src = P.as_source(dataset)
    be = get_backend("cpu")
    ans = [create("cell-usage")]
    plans = planning.plan_tables(src, ans, 4)
    assert tasks.Prefetch.start(plans, ans, src, be, 1) is None
    pre = [a for a in (create("cpi"), create("data-quality")) if a.prerequisites(src)]
    assert pre
    assert tasks.Prefetch.start(planning.plan_tables(src, pre, 4), pre, src, be, 2) is None
    pf = tasks.Prefetch.start(plans, ans, src, be, 2)
    assert pf is not None
    pf.close()  # unused reads dropped, threads ended


def test_an_error_in_the_contexts_ends_the_prefetch(dataset: Dataset, monkeypatch: pytest.MonkeyPatch) -> None:
    closed: list[bool] = []
    close = tasks.Prefetch.close

    def counting_close(self):  # type: ignore[no-untyped-def]
        closed.append(True)
        close(self)

    def boom(*a, **k):  # type: ignore[no-untyped-def]
        raise RuntimeError("context failed")

    monkeypatch.setattr(tasks.Prefetch, "close", counting_close)
    monkeypatch.setattr(local, "contexts", boom)
    with pytest.raises(RuntimeError, match="context failed"):
        run(dataset, "cell-usage", partitions=4, workers=2)
    assert closed == [True]


def test_engine_thread_prefix_is_the_mixture_ops_one() -> None:
    from gpuclust.backends.mixture_cpu import ENGINE_THREAD_PREFIX

    assert local.ENGINE_THREAD_PREFIX == ENGINE_THREAD_PREFIX
