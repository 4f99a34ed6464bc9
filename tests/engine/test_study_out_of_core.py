"""A study out of core: with a memory budget of an eighth of its data, a study keeps what fits
resident, streams the rest partition by partition on each run, and gives the in-memory run's
results bit for bit (issue 34: cpu backend and the device-shaped backend).

The dataset is laid out by key (``gpuclust.optimize``), as ingest leaves it, so the analyses
that need whole instances (data-quality, lifecycle, usage-change by instance) run per bucket; on a flat
layout such an analysis needs the table in one piece and the study says so instead.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from strategies import random_cell, write_dataset

import gpuclust
from gpuclust.analyses.registry import create, names
from gpuclust.dataset import Dataset
from gpuclust.engine.staging import column_bytes
from gpuclust.engine.study import StudyMemoryError
from gpuclust.optimize import optimize

PARTITIONS = 16
BENCH = Path(__file__).resolve().parents[2] / "bench"


@pytest.fixture(scope="module")
def bucketed(tmp_path_factory):
    flat = write_dataset(
        tmp_path_factory.mktemp("flat"),
        random_cell(41, n_machines=12, n_instances=600, n_windows=24_000),
        files=4,
        row_group_size=1000,
    )
    out = tmp_path_factory.mktemp("bucketed") / "ds"
    optimize(flat, buckets=PARTITIONS, out=out, progress=False, row_group_rows=1000)
    return Dataset(out)


@pytest.fixture(scope="module")
def on_cpu(bucketed):
    """The data's resident bytes and every analysis' results of a study on the cpu holding it all
    in memory (:func:`_data_and_results`): computed once, the reference of the tests below."""
    return _data_and_results(bucketed, "cpu")


def _exactly_equal(got: dict, want: dict) -> None:
    assert got.keys() == want.keys()
    for a in want:
        assert got[a].keys() == want[a].keys(), a
        for t in want[a]:
            pd.testing.assert_frame_equal(got[a][t], want[a][t], check_exact=True, obj=f"{a}/{t}")


def _data_and_results(ds: Dataset, backend) -> tuple[int, dict]:
    study = gpuclust.open(ds, backend=backend, partitions=PARTITIONS, workers=1).persist()
    assert not study.streamed_partitions
    out = study.resident_bytes, study.run(names())
    study.close()
    return out


def _out_of_core(ds: Dataset, backend, budget: int) -> tuple[gpuclust.engine.study.Study, dict]:
    study = gpuclust.open(ds, backend=backend, partitions=PARTITIONS, workers=1, memory_budget=budget).persist()
    return study, study.run(names())


@pytest.mark.parametrize("backend", ["cpu", "device-shaped"])
def test_an_eighth_of_the_memory_gives_the_same_bits(bucketed, on_cpu, backend, monkeypatch):
    if backend == "device-shaped":
        from device_backend import DEVICE, mark_partials_gpu, resolve_gpu_to_device

        resolve_gpu_to_device(monkeypatch)
        mark_partials_gpu(monkeypatch)  # the finalizes that run on a device run on the device-shaped backend
        backend = DEVICE
    data, want = on_cpu if backend == "cpu" else _data_and_results(bucketed, backend)
    budget = data // 8
    study, got = _out_of_core(bucketed, backend, budget)
    assert study.resident_bytes <= budget
    streamed = study.streamed_partitions["instance_usage"]
    assert streamed >= PARTITIONS - 2  # an eighth of the data: one or two partitions stay
    reads = study.partition_reads["instance_usage"]
    _exactly_equal(got, want)
    if backend != "cpu":  # the parted analyses' keyed sums: into dense accumulators, not the merge trees
        hold = study.last_run_hold
        assert hold["groups"] > 1, hold  # (in groups within the budget: the same bits)
        assert set(hold["dense"]) == {create(n).label for n in ("cpi", "machine-utilization", "overcommit")}, hold
        assert not set(hold["dense"]) & set(hold["merged_on_host"]), hold
    before = study.streamed_bytes
    study.run("cell-usage")  # every run reads the streamed partitions again, and only those
    assert study.partition_reads["instance_usage"] == reads + streamed
    # ... its read time (of its partials) and bytes counted: the streamed rows of its columns
    rows = sum(s.num_rows for i in study._streamed["instance_usage"] for s in study._plan("instance_usage")[i])
    a = create("cell-usage")
    assert study.streamed_bytes - before == rows * column_bytes("instance_usage", {*a.columns, *a.context_columns})
    assert 0 < study.last_run_seconds["read"] <= study.last_run_seconds["partials"]
    study.close()


def test_a_device_study_merges_the_buckets_partials_on_the_device(bucketed, on_cpu, monkeypatch):
    """On a by-key layout the analyses run per bucket (16 partitions); a study on a device merges
    their partials there (``kinds.merges_on_device``), resident or streamed while they fit in its
    share of the budget (``HOLD_SHARE``), so it copies out what a study in one partition does,
    the lifecycles' replay counts (5.8 MB whatever the events) included: before, 16 of them
    (93 MB); the cpu's bits (the device-shaped backend)."""
    from device_backend import DEVICE, counting_device_work, mark_partials_gpu, resolve_gpu_to_device

    resolve_gpu_to_device(monkeypatch)
    mark_partials_gpu(monkeypatch)
    want = on_cpu[1]
    some = ["lifecycle", "collection-lifecycle", "usage-vs-request", "job-usage"]
    with gpuclust.open(bucketed, backend=DEVICE, partitions=1, workers=1).persist() as study:
        data = study.resident_bytes
        with counting_device_work() as w:
            study.run(some)
        one = w["d2h_bytes"]
    with gpuclust.open(bucketed, backend=DEVICE, partitions=PARTITIONS, workers=1) as study:
        with counting_device_work() as w:
            got = study.persist().run(some)
    assert w["d2h_bytes"] <= 1.2 * one, (w["d2h_bytes"], one)
    _exactly_equal(got, {n: want[n] for n in some})
    # partitions streamed (a budget of twice the data, half of it for the merges), the per-task
    # rows and per-collection sums merged on the device; with no share for the merges, in what the
    # partitions and their work leave of the budget; with nothing allowed, on the host
    from gpuclust.engine import memory, tasks

    d2h = {}
    for case in ("share", "left", "none"):
        monkeypatch.setattr(memory, "HOLD_SHARE", 0.5 if case == "share" else 0.0)
        if case == "none":
            monkeypatch.setattr(tasks.DeviceHold, "allowance", lambda self: 0)
        with gpuclust.open(bucketed, backend=DEVICE, partitions=PARTITIONS, workers=1, memory_budget=2 * data) as study:
            study.persist()
            with counting_device_work() as w:
                got = study.run(some[2:])
            assert case != "share" or study.streamed_partitions["instance_usage"] >= PARTITIONS // 4
            hold = study.last_run_hold  # what the merge trees held on the device, and what went to the host
            assert hold["allowance"] >= (data if case == "share" else 0) and hold["peak"] <= hold["allowance"], hold
            assert sorted(hold["merged_on_host"]) == (sorted(some[2:]) if case == "none" else []), hold
            if case == "left":  # (the budget less the resident and streamed partitions and the work beside them)
                assert 0 < hold["allowance"] < 2 * data - study.resident_bytes, hold
        d2h[case] = w["d2h_bytes"]
        _exactly_equal(got, {n: want[n] for n in some[2:]})
    assert d2h["share"] <= 1.2 * one and d2h["left"] <= 1.2 * one and d2h["none"] > 10 * d2h["share"], (d2h, one)


def test_the_default_budget_streams_what_the_free_memory_cannot_hold(bucketed, on_cpu, monkeypatch):
    """Without a budget the study takes a share of the free memory: with little free, it streams
    instead of refusing."""
    import gpuclust.engine.study as study_mod

    _, want = on_cpu
    monkeypatch.setattr(study_mod, "available_bytes", lambda backend: 200_000)
    study = gpuclust.open(bucketed, partitions=PARTITIONS, workers=1).persist()
    assert study.resident_bytes <= 0.8 * 200_000 and study.streamed_partitions["instance_usage"] > 0
    _exactly_equal(study.run(names()), want)


def test_whole_instances_on_a_flat_table_out_of_core_is_refused_with_the_way_out(tmp_path):
    ds = write_dataset(tmp_path, random_cell(5, n_windows=4000), files=4, row_group_size=500)
    study = gpuclust.open(ds, partitions=4, workers=1, memory_budget=1)  # nothing fits
    with pytest.raises(StudyMemoryError, match=r"data-quality.*gpuclust optimize"):
        study.run("data-quality")
    assert study.run("cell-usage")["cell-usage"]  # what needs no whole instances streams


def test_device_memory_counts_each_buffer_once_while_it_lives():
    from device_backend import XP, DeviceOutOfMemoryError, device_memory

    with device_memory(cap=10_000) as mem:
        a = XP.zeros(500)  # 4000 bytes
        v = a[100:200]  # a view: no new buffer
        b = a + 1  # a new one
        assert mem["live_bytes"] == 8000
        del a, b
        assert mem["live_bytes"] == 4000  # the view keeps its buffer
        del v
        assert mem["live_bytes"] == 0 and mem["peak_live_bytes"] == 8000
        with pytest.raises(DeviceOutOfMemoryError, match="allocating 12,000 bytes"):
            XP.asarray(np.zeros(1500))


@pytest.fixture(scope="module")
def replicas(tmp_path_factory):
    """A dataset shaped as the gpu check's (``gpu_check.make_data``: time-shifted replicas of a
    canonical cell, laid out by instance), 4e5 windows over 32 buckets."""
    sys.path.insert(0, str(BENCH))
    try:
        from gpu_check import make_data
    finally:
        sys.path.remove(str(BENCH))
    root = tmp_path_factory.mktemp("replicas")
    out = root / "opt"
    optimize(make_data(root, 100_000, 4, 50), buckets=32, out=out, progress=False)
    return Dataset(out)


def test_a_device_of_a_quarter_of_the_data_holds_the_study(replicas, monkeypatch):
    """The H200 check of 2026-11-28 (bench/results/h200-2026-11-28/call3): device memory capped at
    a quarter of the data (CuPy's pool limit), ``memory_budget`` half of that, the analyses all at
    once: out of memory.  The same on the device-shaped backend, its device bytes counted and
    capped alike: the study counts the contexts' device copies and the partials' working memory
    (``Analysis.row_bytes``) in its budget, streaming what does not fit beside them, and finalizes
    on the host (some finalizes take memory in proportion to the data), running the analyses in
    groups whose contexts and work fit the budget at once (``study_plans.budget_groups``: at a fifth
    of the data the study ran out of device memory all at once; at a quarter its peak was 99% of the
    cap, 84% in groups; the same bits: test_an_eighth_of_the_memory_gives_the_same_bits).  Before: 1.56x the cap in the
    partials, 14x in peak-prediction's finalize."""
    from device_backend import DEVICE, POOL_RELEASES, device_memory, mark_partials_gpu, resolve_gpu_to_device

    resolve_gpu_to_device(monkeypatch)
    mark_partials_gpu(monkeypatch)
    with gpuclust.open(replicas, backend=DEVICE, partitions=32, workers=1).persist() as study:
        data = study.resident_bytes
        want = study.run(names())
    cap = data // 4
    released = POOL_RELEASES[0]
    with device_memory(cap) as mem:
        study = gpuclust.open(replicas, backend=DEVICE, partitions=32, workers=1, memory_budget=cap // 2).persist()
        got = study.run(names())
        assert study.streamed_partitions["instance_usage"] == 32
        assert 0 < mem["peak_live_bytes"] <= cap, (mem["peak_live_bytes"], cap)
        # the analyses whose contexts and work do not fit the budget at once run in groups
        assert study.last_run_hold["groups"] > 1, study.last_run_hold
        # finalized on the device but where that runs out of its memory: then on the host, the
        # pool's cached blocks given back first (at this cap, 17 MB, peak-prediction's oracle
        # chunk of 2^23 cells on a device does not fit either; the other ten finalize there)
        on_host = study.last_run_hold["finalized_on_host"]
        assert sorted(on_host) == ["overcommit", "peak-prediction", "usage-distribution"], on_host
        assert POOL_RELEASES[0] - released == len(on_host)
        study.close()
    _exactly_equal(got, want)


def test_a_budgeted_device_study_keeps_on_the_device_only_its_runs_contexts(bucketed, monkeypatch):
    """Under a memory budget on a device, a run keeps there the copies of its own analyses'
    contexts only (``Backend.stage``): those of the analyses run before it are dropped (staged
    again when used), so a study that runs its analyses one at a time, as the H200 check does,
    does not pile them up, and the budget counts the run's own alone.  Without a budget they stay."""
    from device_backend import DEVICE, mark_partials_gpu, resolve_gpu_to_device

    from gpuclust.analyses.registry import create
    from gpuclust.backends import _staged
    from gpuclust.engine.memory import host_arrays

    resolve_gpu_to_device(monkeypatch)
    mark_partials_gpu(monkeypatch)
    big = create("usage-vs-request")
    for budget in (1 << 20, None):
        with gpuclust.open(bucketed, backend=DEVICE, partitions=PARTITIONS, memory_budget=budget) as st:
            st.run(big)
            arrays = host_arrays([st._contexts[big]])
            assert any(a in _staged for a in arrays)  # its device copies, while it runs and after
            st.run("machine-shapes")
            assert any(a in _staged for a in arrays) == (budget is None), budget
            st.run(big)  # staged again, the same results


def test_a_finalize_that_runs_out_of_device_memory_runs_again_on_the_host(monkeypatch):
    """``finish.finalized_or_on_host``: a finalize that fits stays on the device; one that runs
    out of device memory there (CuPy's OutOfMemoryError is a MemoryError) runs again, from the
    same partial, on the host (``finalize_backend`` gives the cpu), after the pool's cached blocks
    are given back, and is named in the list the study reports (``finalized_on_host``)."""
    from device_backend import DEVICE, POOL_RELEASES, resolve_gpu_to_device

    from gpuclust.analyses.base import to_host
    from gpuclust.backends import finalize_backend
    from gpuclust.engine.finish import finalized_or_on_host

    resolve_gpu_to_device(monkeypatch)
    tries = []

    class Finalize:
        device_partial = True

        def __init__(self, label, device_bytes):
            self.label, self.device_bytes = label, device_bytes

        def finalize(self, p, ctx):
            be = finalize_backend("gpu")
            tries.append((self.label, be.name))
            if be.xp is not np and self.device_bytes > ctx:
                raise MemoryError("out of device memory")
            return {"sum": float(to_host(p).sum()), "on": be.name}

    on_host, released = [], POOL_RELEASES[0]
    p = DEVICE.asarray(np.arange(4.0))
    fits = finalized_or_on_host(Finalize("fits", 10), p, 100, DEVICE, on_host)
    grows = finalized_or_on_host(Finalize("grows", 1000), p, 100, DEVICE, on_host)
    assert fits == {"sum": 6.0, "on": "gpu"} and grows == {"sum": 6.0, "on": "cpu"}
    assert tries == [("fits", "gpu"), ("grows", "gpu"), ("grows", "cpu")]
    assert on_host == ["grows"] and POOL_RELEASES[0] == released + 1
