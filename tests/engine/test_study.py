"""Studies (gpuclust.open): partitions read once and kept resident, any number of analyses over them.

The reference for every result is :func:`gpuclust.engine.run` over the same dataset (itself tested
against DuckDB SQL and slow obvious code in tests/analyses); the study must give the same bits on
the cpu backend with the same partitions, and agree to the backends' tolerance on the gpu.  Reads
are counted at pyarrow's entry points, so any path that reads Parquet behind the study's back is
caught.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections import Counter
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from strategies import assert_results_same, random_cell, write_dataset

import gpuclust
from gpuclust.analyses.registry import create, names
from gpuclust.dataset import Dataset
from gpuclust.engine import run, study_plans
from gpuclust.engine import study as study_mod
from gpuclust.engine.partition import plan_partitions
from gpuclust.engine.reading import read_partition, row_group_pieces
from gpuclust.schema import SCHEMAS

pytestmark = [
    pytest.mark.filterwarnings("ignore:unclosed <socket:ResourceWarning"),
]


def assert_same(r1, r2, rtol=0.0):
    assert_results_same(r1, r2, rtol)


@pytest.fixture(scope="module")
def tables():
    return random_cell(23, n_machines=12, n_windows=9000)


@pytest.fixture(scope="module")
def dataset(tables, tmp_path_factory):
    return Dataset(write_dataset(tmp_path_factory.mktemp("ds"), tables, files=3, row_group_size=500))


@pytest.fixture(scope="module")
def reference(dataset):
    return {n: run(dataset, n, partitions=4, workers=2)[n] for n in names()}


@pytest.fixture
def read_log(monkeypatch):
    """Every Parquet read: ("<table>", "row_groups") counts row-group reads, ("table/file", "table") whole-file reads."""
    log: Counter[tuple[str, str]] = Counter()
    real_groups, real_table = pq.ParquetFile.read_row_groups, pq.read_table

    def groups(self, *a, **kw):  # type: ignore[no-untyped-def]
        table = next(t for t, sch in SCHEMAS.items() if sch.names == self.schema_arrow.names)
        log[(table, "row_groups")] += 1
        return real_groups(self, *a, **kw)

    def table(source, *a, **kw):  # type: ignore[no-untyped-def]
        log[("/".join(Path(str(source)).parts[-2:]), "table")] += 1
        return real_table(source, *a, **kw)

    monkeypatch.setattr(pq.ParquetFile, "read_row_groups", groups)
    monkeypatch.setattr(pq, "read_table", table)
    return log


def test_cpu_study_is_bit_identical_to_run(dataset, reference):
    study = gpuclust.open(dataset, backend="cpu", partitions=4, workers=2).persist()
    for n in names():
        assert_same(study.run(n), {n: reference[n]})
    # every analysis at once, twice: the same again
    both = study.run(names())
    assert_same(both, reference)
    assert_same(study.run(names()), reference)


def test_a_studys_context_is_the_one_its_runs_keep(dataset):
    """``Study.context``: what a run of the analysis computed and kept (the same object), by name
    or instance; before any run, computed and kept the same way (cpi's prerequisite pass run)."""
    from gpuclust.engine.local import context_of
    from gpuclust.engine.shards import dense_plan

    study = gpuclust.open(dataset, backend="cpu", partitions=4, workers=2)
    study.run("overcommit")
    kept = study.context("overcommit")
    assert study.context(create("overcommit")) is kept and study.context("overcommit") is kept
    cpi = study.context("cpi")  # (no run yet)
    assert study.context(create("cpi")) is cpi
    for n, ctx in (("overcommit", kept), ("cpi", cpi)):  # the plans of the contexts a run computes
        assert dense_plan(create(n), ctx, True) == dense_plan(create(n), context_of(create(n), dataset), True)


def test_study_on_the_generic_backend_matches_run(dataset, reference):
    """Every analysis of a study on the generic backend (the gpu backend's code paths on NumPy
    shaped like CuPy: tests/generic_backend.py) against ``run`` on the cpu: what CuPy would refuse
    in a study's partials, context passes or merges fails here."""
    from generic_backend import GENERIC

    study = gpuclust.open(dataset, backend=GENERIC, partitions=4).persist()
    assert_same(study.run(names()), reference, rtol=1e-9)


def _on_device(obj) -> bool:
    """Whether a partial (nested dicts / lists / tuples) holds any device array."""
    if isinstance(obj, dict):
        obj = list(obj.values())
    if isinstance(obj, (list, tuple)):
        return any(_on_device(v) for v in obj)
    return hasattr(obj, "__cuda_array_interface__")


#: The analyses whose partials a device study merges on the device (``kinds.merges_on_device``).
MERGED_THERE = [
    "cpi",
    "job-usage",
    "machine-utilization",
    "overcommit",
    "peak-prediction",
    "usage-distribution",
    "usage-vs-request",
]
#: Merged on the device as well (every field of theirs merges there), their finalize reading host
#: arrays: the engine copies the merged partial to the host once, for it.
MERGED_FOR_THE_HOST = ["cell-usage", "collection-lifecycle", "data-quality", "lifecycle", "usage-change"]


@pytest.mark.parametrize("partitions", [1, 3])
def test_device_partials_stay_on_the_device_to_their_finalize(dataset, reference, monkeypatch, partitions):
    """On a device (the device-shaped backend), the partials of the analyses with
    ``Analysis.device_partial`` (cpi, job-usage, machine-utilization, overcommit,
    peak-prediction, usage-distribution, usage-vs-request) reach finalize in device memory, whether their table is
    one resident partition or several whose partials the merge tree merges there (every field of
    theirs merges on the device: ``kinds.merges_on_device``); every other analysis' in host
    memory; the results are ``run``'s on the cpu either way."""
    from device_backend import DEVICE, mark_partials_gpu, resolve_gpu_to_device

    from gpuclust.analyses.registry import create

    resolve_gpu_to_device(monkeypatch)
    seen: dict[str, bool] = {}
    shards: dict[str, list[bool]] = {}
    classes = {type(create(n)) for n in names()}
    for cls in classes:

        def spy(self, partial, ctx, real=cls.finalize):
            seen[self.name] = _on_device(partial)
            return real(self, partial, ctx)

        def spy_shard(self, keyed, rest, ctx, lo, hi, real=cls.finalize_shard):
            shards.setdefault(self.name, []).append(_on_device(keyed))
            return real(self, keyed, rest, ctx, lo, hi)

        monkeypatch.setattr(cls, "finalize", spy)
        monkeypatch.setattr(cls, "finalize_shard", spy_shard)
    mark_partials_gpu(monkeypatch)  # so they finalize on the device-shaped backend, as a gpu study's
    study = gpuclust.open(dataset, backend=DEVICE, partitions=partitions, workers=1).persist()
    got = study.run(names())
    stay = set(MERGED_THERE)
    assert {n for n in names() if create(n).device_partial} == stay
    assert {n for n in names() if create(n).kinds.merges_on_device} == stay | set(MERGED_FOR_THE_HOST)
    assert seen == {n: n in stay for n in names()}
    # the keyed sums reach the shards where they were left; usage-distribution's mixture state
    # alone stays on the device, its group rows come to the host
    device_shards = {n for n, on in shards.items() if all(on)}
    assert device_shards == {"cpi", "machine-utilization", "overcommit", "peak-prediction"}
    assert_same(got, reference, rtol=1e-9)


def _d2h_per_analysis(dataset, monkeypatch, partitions: int, holds=None, **kw) -> tuple[dict[str, int], dict]:
    """Device bytes read on the host by a study's run of each analysis (device-shaped backend),
    and the results of all of them (``holds``: filled with each run's ``last_run_hold``)."""
    from device_backend import DEVICE, counting_device_work, mark_partials_gpu, resolve_gpu_to_device

    resolve_gpu_to_device(monkeypatch)
    mark_partials_gpu(monkeypatch)
    d2h, got = {}, {}
    with gpuclust.open(dataset, backend=DEVICE, partitions=partitions, workers=1, **kw).persist() as study:
        for n in [*MERGED_THERE, *MERGED_FOR_THE_HOST]:
            with counting_device_work() as w:
                got.update(study.run(n))
            d2h[n] = w["d2h_bytes"]
            if holds is not None:
                holds[n] = study.last_run_hold
    return d2h, got


def test_a_device_study_in_partitions_copies_out_what_one_partition_does(dataset, reference, monkeypatch):
    """Issue 34, item 3, for studies: a study on a device in 4 resident partitions merges the
    partials of the analyses whose every field merges on the device there, as one partition
    leaves them there, so it copies to the host what one partition does (the results' rows), not
    4 partials' worth (cpi's first pass too: the Spearman grid's histograms, 32 KiB).  Before: the partials were copied out and merged on the host (on the
    4e5-window replicas in 8 partitions: usage-vs-request 7.2 MB against 0.34 MB in one partition,
    cpi 10.9 MB against 38 kB, overcommit 38.5 against 14.2 MB, the lifecycles 46 against 5.8 MB;
    and, before the engine merged those whose finalize reads host arrays there too, cell-usage
    342 kB against 43 kB and usage-change 855 against 107 kB).  data-quality's partials read
    their counters (a few bytes each) as they are made, ~1 kB a partition."""
    one, _ = _d2h_per_analysis(dataset, monkeypatch, 1)
    four, got = _d2h_per_analysis(dataset, monkeypatch, 4)
    for n in [*MERGED_THERE, *MERGED_FOR_THE_HOST]:
        assert four[n] <= 1.2 * one[n] + 4096, (n, four[n], one[n])
    assert_same(got, {n: reference[n] for n in got}, rtol=1e-9)


def test_a_device_study_on_cluster_workers_merges_on_their_devices(dataset, reference, monkeypatch):
    """On the workers of a cluster (an in-process ``distributed.LocalCluster`` here, so that they
    share the device-shaped backend) the partials of the analyses a worker finalizes stay on its
    device through the tree, as in-process: 4 resident partitions copy out what one does (before,
    each partition's partials were copied out on its worker: usage-vs-request 1.52 MB in 4
    partitions against 0.83 MB in one, cell-usage and usage-change 2x), the reference's results.
    (The sharded analyses' merged partials go to the client, which finalizes them, as a run's.)"""
    distributed = pytest.importorskip("distributed")
    from device_backend import DEVICE_GPU, counting_device_work, mark_partials_gpu, resolve_gpu_to_device

    resolve_gpu_to_device(monkeypatch)
    mark_partials_gpu(monkeypatch)
    on_workers = [n for n in [*MERGED_THERE, *MERGED_FOR_THE_HOST] if not create(n).sharded]
    assert {"usage-vs-request", "cell-usage", "job-usage", "lifecycle"} <= set(on_workers)
    d2h: dict[int, dict[str, int]] = {}
    with (
        distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=False, dashboard_address=":0") as c,
        distributed.Client(c) as client,
    ):
        for parts in (1, 4):
            with gpuclust.open(dataset, backend=DEVICE_GPU, partitions=parts, scheduler=client).persist() as study:
                d2h[parts] = {}
                for n in on_workers:
                    with counting_device_work() as w:
                        assert_same(study.run(n), {n: reference[n]}, rtol=1e-9)
                    d2h[parts][n] = w["d2h_bytes"]
    for n in on_workers:
        assert d2h[4][n] <= 1.2 * d2h[1][n] + 4096, (n, d2h)


def test_a_device_study_past_its_hold_merges_on_the_host_with_the_same_results(dataset, monkeypatch):
    """What the merge trees hold on the device is bounded (``engine.tasks.DeviceHold``: a tenth
    of the memory budget or of the free device memory): with none allowed, every partial is
    copied to the host as it is made and merged there, and the results are the same bits; with
    a budget, the device bytes held stay within its tenth.  The parted analyses' keyed sums go to
    dense accumulators instead (``engine.shards.study_dense``): on the device, or on the host
    where the device has no room for them, the same bits either way (the same additions in
    partition order)."""
    from device_backend import device_memory

    from gpuclust.engine import memory, tasks

    held, real = [], tasks.DeviceHold.add

    def spy(self, tree, sub, item):
        real(self, tree, sub, item)
        held.append((self.peak, self.allowance(), list(self.moved)))

    monkeypatch.setattr(tasks.DeviceHold, "add", spy)
    holds: dict[str, dict] = {}
    there, want = _d2h_per_analysis(dataset, monkeypatch, 4, holds)
    assert held and all(not moved for _, _, moved in held)
    dense = {"cpi", "machine-utilization", "overcommit"}
    assert {n for n, h in holds.items() if h.get("dense")} == dense
    assert all(holds[n]["dense"] == {create(n).label: True} for n in dense), holds
    monkeypatch.setattr(memory, "HOLD_SHARE", 0.0)
    monkeypatch.setattr(study_plans, "STUDY_DENSE_SHARE", 0.0)
    held.clear()
    host, got = _d2h_per_analysis(dataset, monkeypatch, 4, holds)
    # (one partition here, whole instances of a flat table: the lifecycles, data-quality)
    merged = {*MERGED_THERE, *MERGED_FOR_THE_HOST} - {"lifecycle", "collection-lifecycle", "data-quality"}
    labels = {create(n).label: n for n in merged - dense}
    assert {m for _, _, moved in held for m in moved} == set(labels) | {"_cpi-histograms"}  # (cpi's first pass)
    assert all(holds[n]["dense"] == {create(n).label: False} for n in dense), holds
    assert all(host[n] > there[n] for n in merged), (host, there)
    assert_same(got, want)
    # under a memory budget: a tenth of it
    monkeypatch.undo()
    monkeypatch.setattr(tasks.DeviceHold, "add", spy)
    held.clear()
    with device_memory() as mem:
        _d2h_per_analysis(dataset, monkeypatch, 4, memory_budget=1 << 22)
    assert all(peak <= allowance and allowance >= (1 << 22) // 10 for peak, allowance, _ in held), held
    assert mem["peak_live_bytes"] > 0


def test_each_partition_read_once_whatever_the_number_of_analyses(dataset, read_log):
    usage_specs = plan_partitions(dataset, "instance_usage", 4)
    one = gpuclust.open(dataset, partitions=4, workers=2).persist()
    one.run("cell-usage")
    reads_one = +read_log
    read_log.clear()
    study = gpuclust.open(dataset, partitions=4, workers=2).persist()
    study.run(names())
    first = +read_log
    for _ in range(3):  # many analyses, several times over: nothing is read again
        study.run(names())
        for n in names():
            study.run(n)
    assert +read_log == first
    assert study.partition_reads["instance_usage"] == len(usage_specs) == 4
    # streamed tables' row groups, each read once by the loader (instance_events, streamed by
    # lifecycle, is also a side input read by contexts)
    usage_reads = sum(v for (f, how), v in read_log.items() if how == "row_groups" and f != "instance_events")
    pieces = sum(
        len(row_group_pieces(s.pieces))
        for t, g in study._groups.items()
        if t != "instance_events"
        for grp in g
        for s in grp
    )
    assert pieces > sum(len(s.pieces) for s in usage_specs) and usage_reads == pieces
    # the streamed table is never read whole (contexts' passes use the resident columns)
    assert not any(f.startswith("instance_usage/") for (f, how) in read_log if how == "table"), read_log
    # and running one analysis read the streamed partitions exactly as often as running all
    assert sum(v for (f, how), v in reads_one.items() if how == "row_groups" and f != "instance_events") == usage_reads


def test_last_run_seconds_says_where_the_time_went(dataset, monkeypatch):
    """A partial and a finalize slowed by a known sleep show up in their own phase; the phases
    add up to no more than the run's wall time (one engine thread, so partials are wall time)."""
    from gpuclust.analyses.cell_usage import CellUsage

    study = gpuclust.open(dataset, partitions=4, workers=1).persist()
    study.run("cell-usage")
    assert set(study.last_run_seconds) == {"contexts", "partials", "read", "merge", "finalize", "convert"}
    assert study.last_run_seconds["read"] == 0.0 and study.streamed_bytes == 0  # (all resident)
    slow_partial, slow_finalize = CellUsage.partial, CellUsage.finalize

    def partial(self, *a, **k):
        time.sleep(0.05)
        return slow_partial(self, *a, **k)

    def finalize(self, *a, **k):
        time.sleep(0.3)
        return slow_finalize(self, *a, **k)

    monkeypatch.setattr(CellUsage, "partial", partial)
    monkeypatch.setattr(CellUsage, "finalize", finalize)
    t = time.perf_counter()
    study.run("cell-usage")
    wall = time.perf_counter() - t
    sec = study.last_run_seconds
    assert sec["partials"] >= 4 * 0.05 and sec["finalize"] >= 0.3, sec
    assert sec["merge"] < 0.2 and sec["contexts"] < 0.2, sec  # the context is built once, on the first run
    assert sum(v for k, v in sec.items() if k != "read") <= wall + 1e-3, (sec, wall)  # (read: of partials)


def test_joined_partitions_give_the_same_result(dataset, reference):
    """Consecutive loads filling one resident partition (the gpu layout) at the right offsets."""
    study = gpuclust.open(dataset, partitions=6, workers=1, run_rows=4000, load_threads=3).persist()
    groups = study._groups["instance_usage"]
    assert len(groups) > 1 and any(len(g) > 1 for g in groups)
    whole = read_partition(plan_partitions(dataset, "instance_usage", 1)[0], study.resident_columns("instance_usage"))
    for c, want in whole.items():
        got = np.concatenate([p[c] for p in study._resident["instance_usage"]])
        np.testing.assert_array_equal(got, want, err_msg=c)
    res = study.run(names())
    assert_same(res, reference, rtol=1e-12)


def test_persist_streams_what_does_not_fit(dataset, monkeypatch):
    """Nothing fits in 1,000 bytes: nothing is read at persist, every partition is streamed (read
    by each run; tests/engine/test_study_out_of_core.py checks the results)."""
    monkeypatch.setattr(study_mod, "available_bytes", lambda backend: 1000)
    study = gpuclust.open(dataset)
    study.persist(["avg_cpu", "machine_id"])
    assert study.resident_bytes == 0 and study.partition_reads == {}
    assert study.resident_columns("instance_usage") == ["avg_cpu", "machine_id"]
    assert study.streamed_partitions == {"instance_usage": len(study._plan("instance_usage"))}


def test_persist_validates_columns_and_runs_load_missing_ones(dataset):
    study = gpuclust.open(dataset, partitions=2, workers=1)
    with pytest.raises(KeyError, match="no columns"):
        study.persist(["not_a_column"])
    study.persist(["avg_cpu"])
    assert study.resident_columns("instance_usage") == ["avg_cpu"]
    study.run("cell-usage")  # loads what cell-usage needs besides avg_cpu, once
    assert set(create("cell-usage").columns) <= set(study.resident_columns("instance_usage"))
    assert study.partition_reads["instance_usage"] == 4
    study.run("cell-usage")
    assert study.partition_reads["instance_usage"] == 4
    study.release()
    assert study.resident_bytes == 0


@pytest.mark.gpu
@pytest.mark.parametrize("run_rows", [None, 4000])
def test_gpu_study_matches_cpu(gpu_backend, dataset, reference, monkeypatch, run_rows):
    from gpuclust.engine import staging

    monkeypatch.setattr(staging, "STAGING_BYTES", 4096)  # many staging round trips per column
    study = gpuclust.open(dataset, backend="gpu", partitions=6, run_rows=run_rows).persist()
    cp = gpu_backend.xp
    whole = read_partition(plan_partitions(dataset, "instance_usage", 1)[0], study.resident_columns("instance_usage"))
    for c, want in whole.items():
        got = np.concatenate([cp.asnumpy(p[c]) for p in study._resident["instance_usage"]])
        np.testing.assert_array_equal(got, want, err_msg=c)  # NULL sentinels too
    assert_same(study.run(names()), reference, rtol=1e-9)


# ------------------------------------------------------------------ partitions on a cluster's workers
def test_study_on_cluster_workers_is_bit_identical_to_run(dataset, reference, read_log, monkeypatch):
    """``scheduler="local:2"``: each resident partition is loaded by, and stays on, one worker
    process; runs compute its partials there and merge them on the workers, by the local run's
    tree: same partitions and merge tree as the local run, same bits, and the client merges
    nothing (it receives each table's results, finalized on a worker; overcommit's merged partial)."""
    from gpuclust.engine import tasks

    client_merges = []
    real_add = tasks.MergeTree.add
    monkeypatch.setattr(
        tasks.MergeTree, "add", lambda self, *a, **kw: client_merges.append(1) or real_add(self, *a, **kw)
    )
    with gpuclust.open(dataset, backend="cpu", partitions=4, scheduler="local:2") as study:
        study.persist()
        assert study.workers == 2 and study.partition_reads["instance_usage"] == 4
        remote = study._remote
        futs = remote.futures["instance_usage"]
        held = remote.client.who_has(futs)
        assert [list(held[f.key]) for f in futs] == [[remote.worker_of("instance_usage", i)] for i in range(4)]
        assert len({w for ws in held.values() for w in ws}) == 2  # round robin over both workers
        for _ in range(2):
            assert_same(study.run(names()), reference)
        assert_same(study.run("overcommit"), {"overcommit": reference["overcommit"]})
        assert study.partition_reads["instance_usage"] == 4  # nothing loaded again
        # the partials ran where the data is: no partition was copied to another worker
        assert remote.client.who_has(futs) == held
        assert study.resident_bytes == study.loaded_bytes > 0
        assert client_merges == []  # every merge ran on the workers
        # the client process never read the streamed table: the workers did
        assert not any(f == "instance_usage" or f.startswith("instance_usage/") for (f, _) in read_log), read_log
    assert remote.futures == {}  # closed: released, and the cluster it started is gone


class _Recorder:
    """A progress sink that records what it is told."""

    def __init__(self):
        self.done: Counter[str] = Counter()

    def partition_done(self, table, rows):  # type: ignore[no-untyped-def]
        self.done[table] += rows

    def __getattr__(self, name):  # phase, partitions, finish, ...: ignored
        return lambda *a, **kw: None


def test_cluster_study_persists_more_columns_on_the_same_workers(dataset, reference):
    prog = _Recorder()
    with gpuclust.open(dataset, partitions=4, scheduler="local:2", progress=prog) as study:
        study.persist(["avg_cpu"])
        assert prog.done["instance_usage"] == dataset.num_rows("instance_usage")  # every partition reported loaded
        first = list(study._remote.futures["instance_usage"])
        where = [study._remote.client.who_has([f])[f.key] for f in first]
        study.run("cell-usage")  # loads what else cell-usage needs, joined on the same workers
        assert set(create("cell-usage").columns) <= set(study.resident_columns("instance_usage"))
        now = study._remote.futures["instance_usage"]
        assert [study._remote.client.who_has([f])[f.key] for f in now] == where
        assert_same(study.run("cell-usage"), {"cell-usage": reference["cell-usage"]})


def test_cluster_study_refuses_a_scheduler_without_workers(dataset):
    with pytest.raises(ValueError, match="keeps partitions on workers"):
        gpuclust.open(dataset, scheduler="threads")


@pytest.mark.gpu
def test_gpu_study_on_cuda_workers_matches_cpu(gpu_backend, dataset, reference):
    pytest.importorskip("dask_cuda")
    with gpuclust.open(dataset, backend="gpu", partitions=6, scheduler="cuda") as study:
        study.persist()
        assert_same(study.run(names()), reference, rtol=1e-9)


def test_cluster_study_runs_where_a_retired_worker_left_its_partitions(dataset, reference):
    """A worker that retires hands its partitions to another: runs go there; one that died with
    them is reported."""
    with gpuclust.open(dataset, partitions=4, scheduler="local:2") as study:
        study.persist(create("cell-usage").columns)
        remote = study._remote
        client = remote.client
        gone = remote.worker_of("instance_usage", 1)
        client.retire_workers([gone], close_workers=True)
        held = client.who_has(remote.futures["instance_usage"])
        assert all(ws and gone not in ws for ws in held.values())
        assert_same(study.run("cell-usage"), {"cell-usage": reference["cell-usage"]})
        # a worker that dies takes its partitions with it
        lost = remote.futures["instance_usage"][0]
        dying = client.who_has([lost])[lost.key][0]
        with contextlib.suppress(Exception):  # the worker dies before it answers
            client.run(os._exit, 1, workers=[dying])
        deadline = time.monotonic() + 30
        while client.who_has([lost]).get(lost.key) and time.monotonic() < deadline:
            time.sleep(0.1)
        with pytest.raises(
            RuntimeError, match=r"left the cluster with its worker; call release\(\) and persist\(\) again"
        ):
            study.run("cell-usage")
