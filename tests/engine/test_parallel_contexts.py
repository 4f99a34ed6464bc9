"""Contexts built on several client threads: the ordered thread map, side tables split at row
groups, and instance lookups equal to the one-thread build."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from gpuclust import _parallel
from gpuclust.analyses import _lookup as L
from gpuclust.engine.partition import Piece
from gpuclust.engine.reading import SideTable
from gpuclust.schema import SCHEMAS, tier_map


def test_client_threads_is_per_thread_and_restored() -> None:
    seen = []
    with _parallel.client_threads(3):
        assert _parallel.threads() == 3
        t = threading.Thread(target=lambda: seen.append(_parallel.threads()))
        t.start()
        t.join()
        with _parallel.client_threads(0):  # at least one
            assert _parallel.threads() == 1
        assert _parallel.threads() == 3
    assert _parallel.threads() == 1
    assert seen == [1]  # another thread (an engine or dask worker thread) keeps the default


@pytest.mark.parametrize("threads", [1, 2, 4])
def test_map_ordered_keeps_item_order(threads: int) -> None:
    names = set()

    def fn(x: int) -> int:
        names.add(threading.current_thread().name)
        return x * 10

    assert list(_parallel.map_ordered(fn, list(range(9)), threads, name="t-map")) == [x * 10 for x in range(9)]
    assert all(n.startswith("t-map") for n in names) == (threads > 1)


def _events(rng: np.random.Generator, n: int) -> pa.Table:
    def nulls(a: np.ndarray, frac: float, typ: pa.DataType) -> pa.Array:
        return pa.array(a, type=typ, mask=rng.random(n) < frac)

    cols = {
        "time": pa.array(np.sort(rng.integers(0, 10**9, n)), pa.int64()),
        "type": pa.array(rng.integers(0, 11, n), pa.int8()),
        "collection_id": pa.array(rng.integers(0, 60, n), pa.int64()),
        "instance_index": pa.array(rng.integers(0, 40, n), pa.int32()),
        "machine_id": nulls(rng.integers(1, 7, n) * 1000, 0.05, pa.int64()),
        "priority": nulls(rng.integers(0, 400, n), 0.2, pa.int32()),
        "alloc_collection_id": nulls(np.where(rng.random(n) < 0.2, rng.integers(1, 9, n), 0), 0.3, pa.int64()),
    }
    schema = SCHEMAS["instance_events"]
    return pa.table({f.name: cols.get(f.name, pa.nulls(n, f.type)) for f in schema}, schema=schema)


def _files(tmp_path: Path, rng: np.random.Generator) -> list[Path]:
    out = []
    for k, (n, rg) in enumerate([(3000, 700), (1, 1), (2500, 2500), (1800, 256)]):
        f = tmp_path / f"part-{k}.parquet"
        pq.write_table(_events(rng, n), f, row_group_size=rg)
        out.append(f)
    return out


def test_row_group_pieces_cover_the_same_rows(tmp_path: Path) -> None:
    files = _files(tmp_path, np.random.default_rng(1))
    mem = _events(np.random.default_rng(2), 40)
    pieces = [
        Piece(0, 3000, str(files[0])),
        Piece(0, 1, str(files[1])),
        Piece(100, 2400, str(files[2])),
        Piece(300, 1500, str(files[3])),
        Piece(0, 40, None, mem),
    ]
    side = SideTable("instance_events", pieces)
    split = side.row_group_pieces()
    assert sum(p.stop - p.start for p in split) == side.num_rows
    assert len(split) == 5 + 1 + 1 + 5 + 1  # 700-row groups: 5; 256-row groups over [300, 1500): 5
    cols = ["collection_id", "machine_id", "priority"]
    whole = side.read(cols)
    for threads in (1, 2, 3):
        parts = side.map(lambda t: t, cols, threads=threads)
        assert pa.concat_tables(parts).equals(whole)
    assert len(side.map(lambda t: t, cols, threads=2)) == len(split)


@pytest.mark.parametrize("top_level_only", [True, False])
def test_lookups_on_threads_equal_one_thread(tmp_path: Path, top_level_only: bool) -> None:
    """tier and priority lookups built a row group per thread: the arrays of the one-thread
    build, which the grouped path (pandas-free reference, `_max_priorities`) checks in turn."""
    files = _files(tmp_path, np.random.default_rng(3))
    side = SideTable("instance_events", [Piece(0, pq.ParquetFile(f).metadata.num_rows, str(f)) for f in files])
    tm = tier_map("notebook")

    def build(threads: int) -> tuple[L.InstanceLookup, L.InstanceLookup]:
        with _parallel.client_threads(threads):
            return (
                L.tier_lookup(side, tm, top_level_only=top_level_only, unmatched=9, what="t"),
                L.priority_lookup(side, top_level_only=top_level_only, what="t"),
            )

    one, two = build(1), build(2)
    ref = L._max_priorities(side, top_level_only)
    assert ref is not None
    for a, b in zip(one, two, strict=True):
        assert len(a) == len(ref) > 100
        for f in ("hash", "collection", "instance", "machine", "code"):
            assert getattr(a, f).dtype == getattr(b, f).dtype
            np.testing.assert_array_equal(getattr(a, f), getattr(b, f), err_msg=f)
    order = np.argsort(L.triple_hash(np, ref["c"].to_numpy(), ref["i"].to_numpy(), ref["m"].to_numpy()))
    np.testing.assert_array_equal(two[1].code, L._priority_codes(ref["p"].to_numpy(np.float64))[order])


def test_engine_builds_contexts_on_its_threads(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The local engine lets the client's context work use its threads; results equal the
    one-thread run."""
    from gpuclust import engine
    from gpuclust.synth import SynthConfig, synthesize

    ds = tmp_path / "ds"
    synthesize(SynthConfig(machines=12, hours=1.0, seed=5), tmp_path / "raw", dataset=ds, progress=None)
    seen: list[int] = []
    orig = L._sorted_max_priorities

    def spy(events: object, top_level_only: bool) -> object:
        seen.append(_parallel.threads())
        return orig(events, top_level_only)

    monkeypatch.setattr(L, "_sorted_max_priorities", spy)
    two = engine.run(ds, "cell-usage", workers=2)["cell-usage"]
    one = engine.run(ds, "cell-usage", workers=1)["cell-usage"]
    assert seen == [2, 1]
    for name, df in one.items():
        assert df.equals(two[name]), name


def test_usable_cores_follow_the_affinity_mask_else_the_machine(monkeypatch):
    import os

    from gpuclust import _parallel
    from gpuclust.engine import staging

    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 3, 5}, raising=False)
    assert _parallel.usable_cores() == 3

    def no_mask(pid):
        raise AttributeError("sched_getaffinity")  # not on Linux

    monkeypatch.setattr(os, "sched_getaffinity", no_mask, raising=False)
    monkeypatch.setattr(os, "cpu_count", lambda: 7)
    assert _parallel.usable_cores() == 7
    monkeypatch.setattr(os, "cpu_count", lambda: None)
    assert _parallel.usable_cores() == 1
    assert 2 <= staging.LOAD_THREADS <= 16


def _threads_of(monkeypatch: pytest.MonkeyPatch, method: str) -> dict[str, set[str]]:
    """Per analysis label, the names of the threads its ``method`` (``context``, ``bind``) runs
    on from now on (every registered analysis class spied on)."""
    from gpuclust.analyses.registry import create, names

    seen: dict[str, set[str]] = {}
    for cls in {type(create(n)) for n in names()}:
        real = getattr(cls, method)

        def spy(self, *args, real=real, **kw):
            seen.setdefault(self.label, set()).add(threading.current_thread().name)
            return real(self, *args, **kw)

        monkeypatch.setattr(cls, method, spy)
    return seen


def test_a_device_run_computes_its_contexts_several_at_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A run on a device leaves the host's cores to its client: the contexts of the analyses
    without a prerequisite pass are computed several at a time (``contexts(at_once=True)``: at
    least ``THREADS_PER_CONTEXT`` client threads each), each in the run's context variables
    (usage-distribution's, in a thread of its own, still sees the device's memory: exact, no row
    limit, where the host's limit would take two passes), with the results of one at a time; a
    study's first run as well.
    The device CLI's contexts took 4.7 s one after another on the H200 (2026-11-29, 3.05e7
    windows; usage-vs-request 1.5 s the longest)."""
    from device_backend import DEVICE_GPU, mark_partials_gpu, resolve_gpu_to_device
    from strategies import assert_results_same, random_cell, write_dataset

    import gpuclust
    from gpuclust.analyses import usage_distribution as ud
    from gpuclust.analyses.registry import names
    from gpuclust.engine import local, run
    from gpuclust.engine.contexts import THREADS_PER_CONTEXT

    ds = write_dataset(tmp_path, random_cell(5, n_instances=80, n_windows=3000), files=2)
    resolve_gpu_to_device(monkeypatch)
    mark_partials_gpu(monkeypatch)
    monkeypatch.setattr(ud, "EXACT_MAX_WINDOWS", (10, 10))  # the host's limit would take two passes
    seen = _threads_of(monkeypatch, "context")
    one = run(ds, names(), backend=DEVICE_GPU, partitions=2)
    assert {t for s in seen.values() for t in s} == {"MainThread"}  # 2 cores: one at a time
    seen.clear()
    monkeypatch.setattr(local, "default_workers", lambda backend="cpu": 4 * THREADS_PER_CONTEXT)
    many = run(ds, names(), backend=DEVICE_GPU, partitions=2)
    on_threads = {label for label, s in seen.items() if all(t.startswith("gpuclust-contexts") for t in s)}
    assert {"overcommit", "usage-vs-request", "usage-distribution"} <= on_threads, seen
    assert seen["cpi"] == {"MainThread"}  # (its pass over the data first, then its context: one at a time)
    info = many["usage-distribution"]["info"].iloc[0]
    assert (info["strategy"], info["exact_max_windows"]) == ("exact", -1)
    assert_results_same(many, one, rtol=0)
    seen.clear()  # a study's first run: the same
    with gpuclust.open(ds, backend=DEVICE_GPU, partitions=2) as study:
        got = study.run(names())
    assert {label for label, s in seen.items() if all(t.startswith("gpuclust-contexts") for t in s)} == on_threads
    assert_results_same(got, one, rtol=1e-12)


def test_a_device_partition_binds_its_analyses_several_at_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """On a bucketed dataset each partition task binds the analyses to its buckets' side inputs.
    On a device the task's host threads (its loaders', ``load_threads``) do it several analyses at
    a time (``contexts.bind_all``: ``THREADS_PER_CONTEXT`` threads each, on threads of their own),
    while the partition loads on a thread of its own (each waits, here, until the other has begun:
    one after the other, neither would begin), with the results of one at a time; on the cpu, and
    with fewer threads, one at a time."""
    from device_backend import DEVICE_GPU, mark_partials_gpu, resolve_gpu_to_device
    from strategies import assert_results_same, random_cell, write_dataset

    from gpuclust.analyses.registry import names
    from gpuclust.engine import local, run, tasks
    from gpuclust.engine.contexts import THREADS_PER_CONTEXT
    from gpuclust.optimize import optimize

    ds = write_dataset(tmp_path, random_cell(7, n_instances=80, n_windows=3000), files=2)
    optimize(ds, buckets=2, progress=False)
    resolve_gpu_to_device(monkeypatch)
    mark_partials_gpu(monkeypatch)
    seen = _threads_of(monkeypatch, "bind")
    met: dict[str, list[bool]] = {"bind": [], "load": []}
    begun = {k: threading.Event() for k in met}

    def meeting(name: str, other: str, real: Any) -> Any:
        def spy(*args: Any, **kw: Any) -> Any:  # (the partition tasks' binds and loads only)
            begun[name].set()
            met[name].append(begun[other].wait(timeout=5))
            return real(*args, **kw)

        return spy

    monkeypatch.setattr(tasks, "bind_all", meeting("bind", "load", tasks.bind_all))
    monkeypatch.setattr(tasks._staging, "load_partitions", meeting("load", "bind", tasks._staging.load_partitions))
    one = run(ds, names(), backend=DEVICE_GPU, workers=1)
    assert met["bind"] and all(met["bind"]) and met["load"] and all(met["load"]), met  # at once
    bound = {"overcommit", "usage-vs-request", "cell-usage[mode=notebook]", "peak-prediction"}  # (side inputs)
    assert all(seen[label] == {"MainThread"} for label in bound), seen  # (2 cores: one at a time)
    seen.clear()
    monkeypatch.setattr(local, "usable_cores", lambda: 4 * THREADS_PER_CONTEXT)
    monkeypatch.setattr(local, "LOAD_THREADS", 4 * THREADS_PER_CONTEXT)
    many = run(ds, names(), backend=DEVICE_GPU, workers=1)
    on_threads = {label for label, s in seen.items() if all(t.startswith("gpuclust-bind") for t in s)}
    assert bound <= on_threads, seen
    assert_results_same(many, one, rtol=0)
    seen.clear()
    cpu = run(ds, names(), backend="cpu", workers=1)  # the cpu: its engine threads are its cores
    assert not any(t.startswith("gpuclust-bind") for s in seen.values() for t in s), seen
    assert_results_same(cpu, one, rtol=1e-9)
