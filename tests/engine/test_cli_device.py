"""``gpuclust analyze --backend gpu`` end to end without a device: the device-shaped backend
(tests/device_backend.py) under the gpu's name, so the command takes the gpu's path (partitions
decoded on several threads and copied through pinned buffers, partials computed on "the device",
finalizes run there) and meets the device's refusals (a host array beside a device one, an
implicit conversion).  Its result folder equals ``--backend cpu``'s."""

from __future__ import annotations

import json

import numpy as np
import pytest
from device_backend import DeviceArray, counting_device_work, resolve_gpu_to_device
from strategies import assert_results_same, random_cell, write_dataset

from gpuclust import cli, load_results
from gpuclust.analyses.registry import create, names
from gpuclust.optimize import optimize
from gpuclust.parted import PartedTable


def test_analyze_backend_gpu_equals_cpu(tmp_path, monkeypatch):
    """In three partitions a table (partials merged on the host) and in its default partitions (one
    a table here: device partials kept on the device, see the next test).  Outputs are written
    once (issue 34): a gpu run opens no table it wrote and streams none (the summaries' quantiles
    are of values the shards kept on the device, :mod:`gpuclust.analyses._kept`); a cpu run
    streams only the tables whose values it takes quantiles of, in bounded memory."""
    ds = write_dataset(tmp_path / "cell", random_cell(29, n_machines=12, n_windows=6000), files=3, row_group_size=500)
    args = ["analyze", str(ds), *names(), "--no-plots", "--quiet"]
    seen = _spy_table_reads(monkeypatch, *(tmp_path / b for b in ("cpu", "gpu", "gpu-auto")))
    assert cli.main([*args, "--partitions", "3", "--out", str(tmp_path / "cpu"), "--backend", "cpu"]) == 0
    # (peak-prediction scores no machine-step on this cell: its summary takes no quantile)
    assert {"machine-utilization", "overcommit"} <= {f.split(" ")[0].split("/")[0] for f in seen} <= QUANTILED
    seen.clear()
    resolve_gpu_to_device(monkeypatch)
    with counting_device_work() as w:
        assert cli.main([*args, "--partitions", "3", "--out", str(tmp_path / "gpu"), "--backend", "gpu"]) == 0
    assert w["ops"] > 1000 and w["kernels"] > 0 and w["h2d_bytes"] > 0
    assert cli.main([*args, "--out", str(tmp_path / "gpu-auto"), "--backend", "gpu"]) == 0
    assert seen == []
    res = {b: _tables(load_results(tmp_path / b)) for b in ("cpu", "gpu", "gpu-auto")}
    for b in ("gpu", "gpu-auto"):
        assert json.loads((tmp_path / b / "_run.json").read_text())["backend"] == "gpu"
        assert res[b].keys() == res["cpu"].keys() == set(names())
        for a in names():  # (a table that grows with the cell may be cut in other parts: larger shards on a device)
            assert res[b][a].keys() == res["cpu"][a].keys(), a
        assert_results_same(res["cpu"], res[b], rtol=1e-9)


def test_analyze_backend_gpu_keeps_partials_on_the_device(tmp_path, monkeypatch):
    """With its default partitions a gpu run takes each table as one partition (as large as the
    device's memory allows), so the partials of the analyses that finalize on the device reach
    their finalize in device memory, never copied out and back in (issue 34): whole, or for a
    parted analysis its keyed partials, which its shards take there.  With several partitions
    the partials are merged on the host, but for the keyed sums that are merged into device
    accumulators (overcommit's, cpi's and machine-utilization's, ``Keyed(dense=...)``) and the
    partials whose every field merges there (usage-vs-request's per-task rows, usage-distribution's
    mixture summaries, job-usage's per-collection sums)."""
    resolve_gpu_to_device(monkeypatch)
    kept = [a for a in names() if create(a).device_partial]
    assert {
        "usage-distribution",
        "usage-vs-request",
        "cpi",
        "overcommit",
        "peak-prediction",
        "machine-utilization",
    } <= set(kept)
    where: dict[str, set[str]] = {}
    for a in kept:
        cls = type(create(a))
        if create(a).sharded:  # the keyed partials a shard is given

            def spy_shard(self, keyed, rest, ctx, lo, hi, _real=cls.finalize_shard):
                where.setdefault(self.name, set()).update(_kinds(keyed))
                return _real(self, keyed, rest, ctx, lo, hi)

            monkeypatch.setattr(cls, "finalize_shard", spy_shard)
        else:

            def spy(self, partial, ctx, _real=cls.finalize):
                where.setdefault(self.name, set()).update(_kinds(partial))
                return _real(self, partial, ctx)

            monkeypatch.setattr(cls, "finalize", spy)
    ds = write_dataset(tmp_path / "cell", random_cell(31, n_machines=12, n_windows=4000), files=3, row_group_size=500)
    optimize(ds, buckets=4)  # laid out by key: overcommit's intervals come with the partitions (no client partial)
    dense = {"cpi", "overcommit", "machine-utilization"}  # keyed sums merged into device accumulators
    merged_there = {a for a in kept if not create(a).sharded and create(a).kinds.merges_on_device}
    # (usage-vs-request's per-task partial and job-usage's per-collection sums: merged by a device
    # sort-merge; usage-distribution's summaries by their merge, which runs where they are)
    assert merged_there == {"usage-vs-request", "usage-distribution", "job-usage"}
    rows = {"peak-prediction"}  # its keyed rows kept there, every partition's (shards.KeptKeys(across=True))
    for parts, kind in ((["--partitions", "3"], "host"), ([], "device")):
        where.clear()
        args = ["analyze", str(ds), *kept, "--no-plots", "--quiet", "--out", str(tmp_path / kind), *parts]
        assert cli.main([*args, "--backend", "gpu"]) == 0
        assert where == {a: {"device" if a in dense | merged_there | rows else kind} for a in kept}, (parts, where)


def test_analyze_backend_gpu_merges_per_task_partials_on_the_device(tmp_path, monkeypatch):
    """usage-vs-request's per-task partial (a row per task) merges on the device across partitions
    (its kinds all merge there): a run in 4 partitions copies out what a run in one does, its
    result tables, not each partition's task rows; and its tables are the cpu run's."""
    ds = write_dataset(tmp_path / "cell", random_cell(53, n_windows=8000), files=4, row_group_size=500)
    args = ["analyze", str(ds), "usage-vs-request", "--no-plots", "--quiet"]
    assert cli.main([*args, "--out", str(tmp_path / "cpu"), "--backend", "cpu"]) == 0
    d2h = _d2h_in_1_and_4_partitions(tmp_path, monkeypatch, args)
    assert d2h[4] <= d2h[1] + 1024, d2h  # a few merges' key counts more
    # the merge tree may hold nothing on the device (engine.tasks.DeviceHold): each partition's
    # task rows are copied out and merged on the host, to the same tables
    from gpuclust.engine import memory

    monkeypatch.setattr(memory, "HOLD_SHARE", 0.0)
    held = _d2h_in_1_and_4_partitions(tmp_path, monkeypatch, args, "held")
    assert held[4] > 2 * d2h[4], (held, d2h)


def test_analyze_backend_gpu_merges_on_the_device_for_a_finalize_on_the_host(tmp_path, monkeypatch):
    """cell-usage's (hour, tier) sums and usage-change's counts merge on the device too (every
    field of theirs does), though their finalize reads host arrays: the engine copies the merged
    partial out once (``engine.local.finalize_all``), so 4 partitions copy out what one does (before:
    each partition's partial, cell-usage 4x and usage-change 4x here); the cpu run's tables."""
    ds = write_dataset(tmp_path / "cell", random_cell(59, n_windows=8000), files=4, row_group_size=500)
    names_ = ["cell-usage", "usage-change"]
    assert not any(create(a).device_partial for a in names_) and all(create(a).kinds.merges_on_device for a in names_)
    args = ["analyze", str(ds), *names_, "--no-plots", "--quiet"]
    assert cli.main([*args, "--out", str(tmp_path / "cpu"), "--backend", "cpu"]) == 0
    d2h = _d2h_in_1_and_4_partitions(tmp_path, monkeypatch, args)
    assert d2h[4] <= d2h[1] + 1024, d2h


def test_analyze_backend_gpu_on_dask_merges_on_the_device(tmp_path, monkeypatch):
    """On dask's merge tree (``--scheduler threads``) the partials of the analyses whose fields all
    merge on a device stay there from their partition task to the finalize: 4 partitions copy out
    what one does (before, each partition task copied its partials out: usage-vs-request,
    cell-usage and job-usage 2.92 MB in 4 partitions against 0.84 MB in one, now 0.35 MB in both);
    the cpu run's tables."""
    ds = write_dataset(tmp_path / "cell", random_cell(53, n_windows=8000), files=4, row_group_size=500)
    args = ["analyze", str(ds), "usage-vs-request", "cell-usage", "job-usage", "--no-plots", "--quiet"]
    assert cli.main([*args, "--out", str(tmp_path / "cpu"), "--backend", "cpu"]) == 0
    d2h = _d2h_in_1_and_4_partitions(tmp_path, monkeypatch, [*args, "--scheduler", "threads"])
    assert d2h[4] <= d2h[1] + 1024 and d2h[1] < 400_000, d2h


def test_dask_workers_merge_on_their_devices_and_finalize_there(tmp_path, monkeypatch):
    """On a distributed cluster each table's tree ends in the finalize on a worker
    (:mod:`gpuclust.engine.finish`): the partials merged on the workers' devices reach it there,
    and one whose finalize reads host arrays (cell-usage's) is copied out once, for it.  4
    partitions copy out what one does; every analysis' results are the cpu run's."""
    distributed = pytest.importorskip("distributed")
    from device_backend import DEVICE_GPU

    from gpuclust.engine import run

    ds = write_dataset(tmp_path / "cell", random_cell(53, n_machines=12, n_windows=8000), files=4, row_group_size=500)
    ans = ["usage-vs-request", "cell-usage", "job-usage"]
    assert not create("cell-usage").device_partial
    ref = run(ds, names(), backend="cpu", partitions=4)
    resolve_gpu_to_device(monkeypatch)
    d2h = {}
    with (
        distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=False, dashboard_address=":0") as c,
        distributed.Client(c) as client,
    ):
        for parts in (1, 4):
            with counting_device_work() as w:
                got = run(ds, [create(a) for a in ans], backend=DEVICE_GPU, partitions=parts, scheduler=client)
            d2h[parts] = w["d2h_bytes"]
            assert_results_same({a: ref[a] for a in ans}, got, rtol=1e-9)
        assert_results_same(ref, run(ds, names(), backend=DEVICE_GPU, partitions=4, scheduler=client), rtol=1e-9)
    assert d2h[4] <= d2h[1] + 1024 and d2h[1] < 400_000, d2h


def test_analyze_backend_gpu_merges_the_lifecycles_on_the_device(tmp_path, monkeypatch):
    """The lifecycles' replay counts (a few MB whatever the events) merge on the device across
    the buckets of a by-key layout, and the merged one is copied out once for their finalize: 4
    partitions copy out what one does (before, one replay partial a bucket); the cpu's tables."""
    ds = write_dataset(tmp_path / "cell", random_cell(61, n_windows=8000), files=4, row_group_size=500)
    optimize(ds, buckets=4)  # (whole instances in each partition)
    args = ["analyze", str(ds), "lifecycle", "collection-lifecycle", "--no-plots", "--quiet"]
    assert cli.main([*args, "--out", str(tmp_path / "cpu"), "--backend", "cpu"]) == 0
    d2h = _d2h_in_1_and_4_partitions(tmp_path, monkeypatch, args)
    assert d2h[1] > 1 << 20 and d2h[4] <= d2h[1] + 4096, d2h  # (a few merges' key counts more)


def test_data_quality_counts_where_the_rows_are(tmp_path, monkeypatch):
    """data-quality's checks, and its event tables' profiles, are counted into a device array
    where the rows are: a partition's partial reads back only what sizes its work (key ranges,
    the CPI filter's counts, the rows without events), not a value per check (before: 79 syncs
    for a usage partial, 31-36 for a profile's); the cpu run's tables, in 1 and 4 partitions."""
    import device_backend

    from gpuclust.analyses import _quality
    from gpuclust.analyses.data_quality import DataQuality

    syncs: dict[str, list[int]] = {}
    for cls in (DataQuality, _quality.TableProfile):

        def spy(self, cols, ctx, be, _real=cls.partial, _name=cls.__name__):
            before = device_backend.WORK["syncs"]
            out = _real(self, cols, ctx, be)
            syncs.setdefault(_name, []).append(device_backend.WORK["syncs"] - before)
            return out

        monkeypatch.setattr(cls, "partial", spy)
    ds = write_dataset(tmp_path / "cell", random_cell(31, n_windows=8000), files=4, row_group_size=500)
    optimize(ds, buckets=4)  # (whole instances in each partition)
    args = ["analyze", str(ds), "data-quality", "--no-plots", "--quiet"]
    assert cli.main([*args, "--out", str(tmp_path / "cpu"), "--backend", "cpu"]) == 0
    syncs.clear()
    _d2h_in_1_and_4_partitions(tmp_path, monkeypatch, args)
    assert len(syncs["DataQuality"]) == 5 and len(syncs["TableProfile"]) >= 12, syncs
    assert max(syncs["DataQuality"]) <= 24 and max(syncs["TableProfile"]) <= 24, syncs


def _d2h_in_1_and_4_partitions(tmp_path, monkeypatch, args: list[str], name: str = "gpu") -> dict[int, int]:
    """The device-to-host bytes of ``gpuclust analyze *args`` on the device-shaped backend in 1 and
    in 4 partitions, each run's tables checked against the cpu run's in ``tmp_path / "cpu"``."""
    resolve_gpu_to_device(monkeypatch)
    d2h = {}
    for parts in (1, 4):
        with counting_device_work() as w:
            out = tmp_path / f"{name}-{parts}"
            assert cli.main([*args, "--partitions", str(parts), "--out", str(out), "--backend", "gpu"]) == 0
        d2h[parts] = w["d2h_bytes"]
        assert_results_same(_tables(load_results(tmp_path / "cpu")), _tables(load_results(out)), rtol=1e-9)
    return d2h


@pytest.mark.parametrize(
    "analysis",
    [["job-usage"], ["cpi", "-O", "by=machine"], ["cpi", "-O", "by=machine", "-O", "regression=none"]],
    ids=["job-usage", "cpi-by-machine", "cpi-by-machine-unsharded"],
)
def test_analyze_backend_gpu_merges_per_group_partials_on_the_device(tmp_path, monkeypatch, analysis):
    """job-usage's per-collection sums (a device sort-merge) and cpi's per-group moments and
    Spearman grids (regrouped by key) merge on the device across partitions: a run in 4
    partitions copies out what a run in one does (job-usage 42.4 against 42.2 kB, 148.7 kB when
    they were merged on the host; cpi by machine 41.7 against 40.1 kB, 1.1 MB when merged on the
    host, 140 kB while its first pass's histograms were), and its tables are the cpu run's."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
    try:
        import gen_canonical
    finally:
        sys.path.pop(0)
    monkeypatch.setattr(gen_canonical, "ROW_GROUP", 4096)  # partitions snap to row groups
    ds = gen_canonical.make_dataset(tmp_path / "cell", 40_000, seed=3)
    args = ["analyze", str(ds), *analysis, "--no-plots", "--quiet"]
    assert cli.main([*args, "--out", str(tmp_path / "cpu"), "--backend", "cpu", "--partitions", "4"]) == 0
    d2h = _d2h_in_1_and_4_partitions(tmp_path, monkeypatch, args)
    assert 0 < d2h[4] <= d2h[1] + 2048, d2h  # (and a few counters a partition)


@pytest.mark.gpu
def test_partials_kept_on_a_device_across_partitions_as_the_cpu(tmp_path, gpu_backend, synth_cell_40):
    """The same on a real device (CuPy): in 4 partitions, usage-vs-request's per-task partials and
    job-usage's per-collection sums merged there (searchsorted placement), usage-distribution's
    mixture states and cpi's per-group moments merged there, and peak-prediction's keyed rows
    kept there and concatenated by its shards; the cpu's tables."""
    ds = synth_cell_40 / "ds"
    kept = ["usage-vs-request", "peak-prediction", "job-usage", "usage-distribution", "cpi"]
    args = ["analyze", str(ds), *kept, "--no-plots", "--quiet", "--partitions", "4"]
    for b in ("cpu", "gpu"):
        assert cli.main([*args, "--out", str(tmp_path / b), "--backend", b]) == 0
    res = [_tables(load_results(tmp_path / b)) for b in ("cpu", "gpu")]
    assert_results_same(res[0], res[1], rtol=1e-9)


def test_analyze_backend_gpu_merges_keyed_sums_on_the_device(tmp_path, monkeypatch):
    """In several partitions, the keyed sums of overcommit, cpi and machine-utilization are added
    into accumulators in device memory, partition by partition: no spill files, and the copies
    out of the device are the partials' small rests and the results (machine-utilization's
    shards copy their merged ranges out: it finalizes on the host), not each partition's keyed
    sums (which the same run with the device accumulators refused copies out: overcommit and cpi
    spill, machine-utilization merges on the host); the results are the cpu run's."""
    import gpuclust.engine.shards as shards

    args = _dense_run_on_cpu(tmp_path, 41)
    resolve_gpu_to_device(monkeypatch)
    where = _dense_spy(monkeypatch)
    written = []  # the bytes of each partition's keyed partials written to a spill
    real = shards.write_keyed

    def spy(folder, keyed):
        written.append(sum(v.nbytes for k in keyed.values() for v in k.values()))
        return real(folder, keyed)

    monkeypatch.setattr(shards, "write_keyed", spy)
    d2h, spilled, on = {}, 0, shards.DEVICE_DENSE_SHARE
    for share in (on, 0.0):
        monkeypatch.setattr(shards, "DEVICE_DENSE_SHARE", share)
        written.clear()
        where.clear()
        with counting_device_work() as w:
            assert cli.main([*args, "--out", str(tmp_path / f"gpu-{share}"), "--backend", "gpu"]) == 0
        d2h[share], spilled = w["d2h_bytes"], spilled + sum(written)
        assert bool(written) == (share == 0.0), share
        want = (
            {"overcommit": True, "cpi": True, "machine-utilization": True} if share else {"machine-utilization": False}
        )
        assert where == want, (share, where)
        res = _tables(load_results(tmp_path / f"gpu-{share}"))
        assert_results_same(_tables(load_results(tmp_path / "cpu")), res, rtol=1e-9)
    # what is no longer copied out: each partition's keyed sums (the spills' bytes)
    assert spilled > 0 and d2h[0.0] - d2h[on] >= 0.9 * spilled, (d2h, spilled)


@pytest.mark.gpu
def test_analyze_on_a_device_merges_keyed_sums_there_as_the_cpu(tmp_path, gpu_backend):
    """The same on a real device (CuPy): in 3 partitions the keyed sums of overcommit, cpi and
    machine-utilization are added into device accumulators, the results the cpu run's."""
    args = _dense_run_on_cpu(tmp_path, 43)
    with pytest.MonkeyPatch.context() as mp:
        seen = _dense_spy(mp)
        assert cli.main([*args, "--out", str(tmp_path / "gpu"), "--backend", "gpu"]) == 0
    assert seen == {"cpi": True, "machine-utilization": True, "overcommit": True}
    res = [_tables(load_results(tmp_path / b)) for b in ("cpu", "gpu")]
    assert_results_same(res[0], res[1], rtol=1e-9)


def test_analyze_backend_gpu_spills_only_where_the_device_has_no_room(tmp_path, monkeypatch):
    """A parted analysis' keyed partials are spilled to files to be merged across partitions
    where the device has no room for them (no share of its memory for them here); with room,
    in several partitions they stay there (device accumulators, or peak-prediction's rows kept),
    and with one partition a table (a gpu run's default here) they stay in memory for the
    shards.  The results are the same in every case."""
    import gpuclust.engine.shards as shards

    resolve_gpu_to_device(monkeypatch)
    written = []
    real = shards.write_keyed
    monkeypatch.setattr(shards, "write_keyed", lambda *a: written.append(1) or real(*a))
    sharded = [a for a in names() if create(a).sharded]
    assert {"overcommit", "cpi", "peak-prediction"} <= set(sharded)
    ds = write_dataset(tmp_path / "cell", random_cell(37, n_machines=12, n_windows=3000), files=3, row_group_size=500)
    room = shards.DEVICE_DENSE_SHARE
    for name, parts, share, spilled in (
        ("none", ["--partitions", "3"], 0.0, True),
        ("room", ["--partitions", "3"], room, False),
        ("one", [], 0.0, False),
    ):
        written.clear()
        monkeypatch.setattr(shards, "DEVICE_DENSE_SHARE", share)
        args = ["analyze", str(ds), *sharded, "--no-plots", "--quiet", "--out", str(tmp_path / name), *parts]
        assert cli.main([*args, "--backend", "gpu"]) == 0
        assert bool(written) == spilled, (name, len(written))
    same = [_tables(load_results(tmp_path / b)) for b in ("none", "room", "one")]
    assert_results_same(same[0], same[1], rtol=1e-9)
    assert_results_same(same[0], same[2], rtol=1e-9)


def test_analyze_backend_gpu_keeps_keyed_rows_on_the_device_across_partitions(tmp_path, monkeypatch, synth_cell_40):
    """peak-prediction's keyed rows (a row per used window, 24 B) stay on the device in every
    partition when the device has room for them (shards.rows_fit_on_device), and its shards
    concatenate their ranges there: a run in 4 partitions copies out about what a run in one does
    (each partition's counters apart), against the rows it copied out to spill without room; the
    tables are the cpu run's either way."""
    import gpuclust.engine.shards as shards

    args = ["analyze", str(synth_cell_40 / "ds"), "peak-prediction", "--no-plots", "--quiet"]
    assert cli.main([*args, "--out", str(tmp_path / "cpu"), "--backend", "cpu"]) == 0
    cpu = _tables(load_results(tmp_path / "cpu"))
    resolve_gpu_to_device(monkeypatch)
    written = []
    real = shards.write_keyed
    monkeypatch.setattr(
        shards,
        "write_keyed",
        lambda f, k: written.append(sum(v.nbytes for x in k.values() for v in x.values())) or real(f, k),
    )
    d2h = {}
    for name, parts, share in (
        ("one", 1, shards.DEVICE_DENSE_SHARE),
        ("kept", 4, shards.DEVICE_DENSE_SHARE),
        ("spilled", 4, 0.0),
    ):
        monkeypatch.setattr(shards, "DEVICE_DENSE_SHARE", share)
        written.clear()
        with counting_device_work() as w:
            cmd = [*args, "--partitions", str(parts), "--out", str(tmp_path / name), "--backend", "gpu"]
            assert cli.main(cmd) == 0
        d2h[name] = w["d2h_bytes"]
        assert bool(written) == (name == "spilled"), name
        assert_results_same(cpu, _tables(load_results(tmp_path / name)), rtol=1e-9)
    rows = sum(written)
    assert rows > 0 and d2h["spilled"] - d2h["kept"] >= 0.9 * rows, (d2h, rows)
    assert d2h["kept"] <= d2h["one"] + 64 * 1024, d2h  # 3 more partitions' counters and stats


def _kinds(x) -> set[str]:
    """Where the arrays in a partial are: ``device`` (DeviceArray), ``host`` (NumPy)."""
    if isinstance(x, DeviceArray):
        return {"device"}
    if isinstance(x, np.ndarray) and x.ndim:
        return {"host"}
    if isinstance(x, dict):
        x = list(x.values())
    if isinstance(x, (list, tuple)):
        return set().union(*(_kinds(v) for v in x)) if x else set()
    return set()


def _tables(results: dict) -> dict:
    return {a: {t: v.read() if isinstance(v, PartedTable) else v for t, v in ts.items()} for a, ts in results.items()}


def test_device_free_bytes_within_the_pool_limit():
    """A device run sizes its partitions by what the device can still give: its free memory, or
    less under CuPy's pool limit (``CUPY_GPU_MEMORY_LIMIT``; the test backend's cap stands for it)."""
    from device_backend import DEVICE_GPU, device_memory

    from gpuclust.analyses import CellUsage
    from gpuclust.backends import device_free_bytes
    from gpuclust.engine.memory import DEVICE_SHARE, device_partition_rows

    assert device_free_bytes(DEVICE_GPU) == 16 << 30  # the test device, nothing live
    with device_memory(cap=64 << 20):
        held = DEVICE_GPU.xp.zeros(1 << 20)  # 8 MiB live
        assert device_free_bytes(DEVICE_GPU) == (64 << 20) - held.data.nbytes
        rows = device_partition_rows(device_free_bytes(DEVICE_GPU), 1, [CellUsage()], "instance_usage")
        assert rows == int(DEVICE_SHARE * ((64 << 20) - (8 << 20))) // 200  # cell-usage: 200 B a row


def test_a_table_within_the_partitions_and_the_rooms_shares_is_one_partition(tmp_path, monkeypatch):
    """A device run's partitions take half its free memory, its accumulators kept across
    partitions four tenths; a table whose rows fit in both together is one partition (which keeps
    none), one row more and it is cut at the partitions' half.  ``gpuclust.run(partitions="auto")``
    on the device-shaped backend plans so: 3,000 windows of cell-usage (200 B a row) on a device
    whose free memory holds them within 0.9 but not within 0.5 are one partition, and the results
    are those of the cpu backend."""
    from device_backend import DEVICE_GPU, device_memory

    import gpuclust.engine.memory as memory
    import gpuclust.engine.partition as partition
    from gpuclust.analyses import CellUsage
    from gpuclust.engine.local import run
    from gpuclust.engine.memory import DEVICE_DENSE_SHARE, DEVICE_SHARE, device_partition_rows

    free = 64 << 20
    half, both = int(DEVICE_SHARE * free) // 200, int((DEVICE_SHARE + DEVICE_DENSE_SHARE) * free) // 200
    assert device_partition_rows(free, 1, [CellUsage()], "instance_usage", both) == both > half
    assert device_partition_rows(free, 1, [CellUsage()], "instance_usage", both + 1) == half
    resolve_gpu_to_device(monkeypatch)
    monkeypatch.setattr(memory, "MIN_PARTITION_ROWS", 100)  # (65,536 rows at least, else)
    ds = write_dataset(tmp_path / "cell", random_cell(29, n_windows=3000), files=3, row_group_size=500)
    planned = []
    real = partition.plan_partitions
    monkeypatch.setattr(
        partition, "plan_partitions", lambda *a, **k: planned.append(k.get("auto_rows")) or real(*a, **k)
    )
    cap = int(3000 * 200 / 0.7)  # the table takes 0.7 of it: past the partitions' half, within 0.9
    with device_memory(cap=cap):
        got = run(ds, ["cell-usage"], backend=DEVICE_GPU, partitions="auto")
    assert planned == [3000], planned
    assert_results_same(run(ds, ["cell-usage"], backend="cpu"), got, rtol=1e-12)


#: The analyses whose summaries take exact quantiles of a parted table's values.
QUANTILED = {"machine-utilization", "overcommit", "peak-prediction"}


def _spy_table_reads(monkeypatch, *outs) -> list[str]:
    """The Parquet files of results folders ``outs`` (or of their staging folders while the runs
    write them) opened from now on, as ``analysis/table/...``."""
    from pathlib import Path

    import pyarrow.parquet as pq

    opened: list[str] = []
    real = pq.ParquetFile.__init__

    def spy(self, source, *args, **kwargs):
        parts = Path(str(source)).parts
        for out in outs:
            i = len(out.parent.parts)
            if parts[:i] == out.parent.parts and len(parts) > i + 1:
                if parts[i] == out.name or parts[i].startswith(f".{out.name}.gpuclust-tmp-"):
                    opened.append("/".join(parts[i + 1 :]))
        real(self, source, *args, **kwargs)

    monkeypatch.setattr(pq.ParquetFile, "__init__", spy)
    # the summaries' streamed passes over their tables, on disk or in memory
    import gpuclust.analyses._overcommit_summary as oc
    import gpuclust.analyses._peak_metrics as pk
    import gpuclust.analyses.machine_utilization as mu

    for name, module in (("overcommit", oc), ("peak-prediction", pk), ("machine-utilization", mu)):
        real_batches = module.array_batches
        monkeypatch.setattr(
            module, "array_batches", lambda t, c, _n=name, _r=real_batches: opened.append(f"{_n} pass") or _r(t, c)
        )
    return opened


@pytest.mark.parametrize("mode", ["time-weighted", "notebook"])
def test_machine_utilization_finalizes_on_the_device(tmp_path, monkeypatch, synth_cell_40, mode):
    """machine-utilization's shards compute their machine-buckets where the partials were (the
    up-time sweep by the device's ``bucket_overlap``, the ratios, the series sums), and only
    the table's columns and the sums come back; the cpu's results in both modes."""
    import gpuclust.analyses.machine_utilization as mu

    args = ["analyze", str(synth_cell_40 / "ds"), "machine-utilization", "-O", f"mode={mode}", "--no-plots", "--quiet"]
    assert cli.main([*args, "--out", str(tmp_path / "cpu"), "--backend", "cpu"]) == 0
    resolve_gpu_to_device(monkeypatch)
    on: list[bool] = []
    real = mu.bincount
    monkeypatch.setattr(mu, "bincount", lambda xp, x, **kw: on.append(isinstance(x, DeviceArray)) or real(xp, x, **kw))
    assert cli.main([*args, "--out", str(tmp_path / "gpu"), "--backend", "gpu"]) == 0
    assert on and all(on)
    res = [_tables(load_results(tmp_path / b)) for b in ("cpu", "gpu")]
    assert_results_same(res[0], res[1], rtol=1e-9)


@pytest.mark.gpu
def test_a_run_on_a_device_never_reads_its_written_tables_back(tmp_path, monkeypatch, gpu_backend, synth_cell_40):
    """The same on a real device (CuPy): the three summaries' quantiles of the values kept there,
    no written table opened, the cpu's results."""
    args = ["analyze", str(synth_cell_40 / "ds"), *sorted(QUANTILED), "-O", "horizon_s=5400", "--no-plots", "--quiet"]
    assert cli.main([*args, "--out", str(tmp_path / "cpu"), "--backend", "cpu"]) == 0
    seen = _spy_table_reads(monkeypatch, tmp_path / "gpu")
    assert cli.main([*args, "--out", str(tmp_path / "gpu"), "--backend", "gpu"]) == 0
    assert seen == []
    res = [_tables(load_results(tmp_path / b)) for b in ("cpu", "gpu")]
    assert_results_same(res[0], res[1], rtol=1e-9)


def test_summaries_keep_their_values_on_the_device_or_read_their_tables_back(tmp_path, monkeypatch, synth_cell_40):
    """machine-utilization's, overcommit's and peak-prediction's summaries (a horizon within the
    3 h cell, so that peak-prediction scores its predictors): a cpu run streams their tables; a
    gpu run keeps the values on the device and reads nothing back, and nothing stays kept after
    it; where the device cannot spare the memory (``KEEP_SHARE`` 0 here) it reads the tables
    back; the same results every way.  A kept value pickled (a shard's extra from a dask worker)
    arrives empty."""
    import pickle

    from device_backend import DEVICE_GPU

    from gpuclust.analyses import _kept

    kept = _kept.KeptValues(DEVICE_GPU)
    kept.add("x", np.arange(3.0))
    assert kept.kept and not pickle.loads(pickle.dumps(kept)).kept
    kept.release()
    args = ["analyze", str(synth_cell_40 / "ds"), *sorted(QUANTILED), "-O", "horizon_s=5400", "--no-plots", "--quiet"]
    seen = _spy_table_reads(monkeypatch, *(tmp_path / b for b in ("cpu", "gpu", "gpu-refused")))
    passes = {f"{a} pass" for a in QUANTILED}
    assert cli.main([*args, "--out", str(tmp_path / "cpu"), "--backend", "cpu"]) == 0
    assert passes <= set(seen), seen
    seen.clear()
    resolve_gpu_to_device(monkeypatch)
    assert cli.main([*args, "--out", str(tmp_path / "gpu"), "--backend", "gpu"]) == 0
    assert seen == [] and _kept._kept[0] == 0
    monkeypatch.setattr(_kept, "KEEP_SHARE", 0.0)
    assert cli.main([*args, "--out", str(tmp_path / "gpu-refused"), "--backend", "gpu"]) == 0
    assert passes <= set(seen), seen
    assert _kept._kept[0] == 0
    res = [_tables(load_results(tmp_path / b)) for b in ("cpu", "gpu", "gpu-refused")]
    assert_results_same(res[0], res[1], rtol=1e-9)
    assert_results_same(res[0], res[2], rtol=1e-9)


def _dense_run_on_cpu(tmp_path, seed: int) -> list[str]:
    """A 6,000-window cell of 12 machines laid out by key (overcommit's intervals come with the
    partitions), overcommit, cpi and machine-utilization on it in 3 partitions on the cpu into
    ``cpu``; the command's arguments but ``--out`` and ``--backend``."""
    ds = write_dataset(tmp_path / "cell", random_cell(seed, n_machines=12, n_windows=6000), files=3, row_group_size=500)
    optimize(ds, buckets=4)
    args = ["analyze", str(ds), "overcommit", "cpi", "machine-utilization", "--no-plots", "--quiet"]
    args += ["--partitions", "3"]
    assert cli.main([*args, "--out", str(tmp_path / "cpu"), "--backend", "cpu"]) == 0
    return args


def _dense_spy(monkeypatch) -> dict[str, bool]:
    """Per analysis, whether the dense accumulators made for it are in device memory."""
    import gpuclust.engine.shards as shards

    where: dict[str, bool] = {}
    real = shards.DenseKeys.__init__

    def spy(self, a, ranges, xp=np):
        real(self, a, ranges, xp)
        where[a.name] = self.on_device

    monkeypatch.setattr(shards.DenseKeys, "__init__", spy)
    return where


def test_analyze_backend_gpu_reduces_shards_on_several_threads(tmp_path, monkeypatch):
    """A gpu run's engine is one thread, but its shards are reduced on up to
    ``DEVICE_SHARD_THREADS`` of the client's threads (a shard's rows are encoded and written while
    another's are computed); the tables are the cpu run's."""
    import threading
    import time

    import gpuclust.analyses.overcommit as oc
    import gpuclust.engine.local as local
    import gpuclust.engine.shards as shards
    from gpuclust.engine.local import default_workers

    monkeypatch.setattr(oc, "SHARD_CELLS", 1 << 15)  # several shards (3 machines each; 15 on a device)
    ds = write_dataset(tmp_path / "cell", random_cell(67, n_windows=2000), files=2, row_group_size=500)
    args = ["analyze", str(ds), "overcommit", "--no-plots", "--quiet", "--partitions", "2"]
    assert cli.main([*args, "--out", str(tmp_path / "cpu"), "--backend", "cpu"]) == 0
    resolve_gpu_to_device(monkeypatch)
    seen, real = set(), shards.reduce_shard

    def spy(*a, **k):
        seen.add(threading.current_thread().name)
        time.sleep(0.05)  # (a shard long enough that the others start meanwhile)
        return real(*a, **k)

    monkeypatch.setattr(shards, "reduce_shard", spy)
    assert cli.main([*args, "--out", str(tmp_path / "gpu"), "--backend", "gpu"]) == 0
    assert len(seen) == min(default_workers("cpu"), local.DEVICE_SHARD_THREADS), seen
    res = [_tables(load_results(tmp_path / b)) for b in ("cpu", "gpu")]
    assert_results_same(res[0], res[1], rtol=1e-9)
