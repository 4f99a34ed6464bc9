"""The engine: partitioning, shared reads, local/threaded/distributed schedulers, CLI, GPU parity.

Results must be identical (to 1e-12 relative: float sums are not bitwise order-invariant) for
1, 2 and 7 partitions, random cut points, the threaded scheduler and a 2-worker LocalCluster.
"""

from __future__ import annotations

import argparse
import gc
import pickle

import numpy as np
import pyarrow as pa
import pytest
from strategies import assert_results_same, random_cell, write_dataset

from gpuclust.analyses import CellUsage, MachineShapes
from gpuclust.backends import BackendUnavailable, gpu_available
from gpuclust.dataset import Dataset
from gpuclust.engine import TableSource, plan_partitions, read_partition, reading, run
from gpuclust.engine.local import context_of
from gpuclust.engine.tasks import partition_partials

# distributed (2026.8) leaks the socket it uses to pick a free port (distributed/node.py); the
# ResourceWarning surfaces as an "unraisable" warning in whichever test runs at GC time.
pytestmark = [
    pytest.mark.filterwarnings("ignore:unclosed <socket:ResourceWarning"),
    pytest.mark.filterwarnings("ignore:Exception ignored in. <socket:pytest.PytestUnraisableExceptionWarning"),
]

ANALYSES = [CellUsage(mode="notebook"), CellUsage(mode="exact"), MachineShapes()]


def assert_same(r1, r2, rtol=1e-12):
    assert_results_same(r1, r2, rtol)


@pytest.fixture(scope="module")
def tables():
    return random_cell(11, n_windows=6000)


@pytest.fixture(scope="module")
def dataset(tables, tmp_path_factory):
    return Dataset(write_dataset(tmp_path_factory.mktemp("ds"), tables, files=3, row_group_size=450))


@pytest.fixture(scope="module")
def reference(dataset):
    return run(dataset, ANALYSES)


def test_results_keyed_by_name_or_label(reference):
    assert set(reference) == {"cell-usage[mode=notebook]", "cell-usage[mode=exact]", "machine-shapes"}
    assert set(reference["cell-usage[mode=exact]"]) == {"usage", "info"}
    assert len(reference["cell-usage[mode=exact]"]["usage"]) > 0


@pytest.mark.parametrize("partitions", [1, 2, 7])
def test_partition_counts(dataset, tables, reference, partitions):
    assert_same(run(dataset, ANALYSES, partitions=partitions), reference)
    assert_same(run(tables, ANALYSES, partitions=partitions), reference)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_random_cut_points(dataset, tables, reference, seed):
    rng = np.random.default_rng(seed)
    cuts = {t: sorted(rng.integers(0, tables[t].num_rows + 1, rng.integers(1, 9)).tolist()) for t in tables}
    assert_same(run(dataset, ANALYSES, cut_points=cuts), reference)
    assert_same(run(tables, ANALYSES, cut_points=cuts), reference)


def test_plan_partitions_cover_rows(dataset, tables):
    t = tables["instance_usage"]
    for parts in (1, 2, 5, 7, 40):
        specs = plan_partitions(dataset, "instance_usage", parts)
        assert len(specs) == parts
        got = pa.concat_tables([pa.table(read_partition(s, ["start_time", "collection_id"])) for s in specs])
        assert got.column("start_time").to_pylist() == t.column("start_time").to_pylist()
        assert got.column("collection_id").to_pylist() == t.column("collection_id").to_pylist()
    # with few partitions the cuts fall on Parquet row-group boundaries
    specs = plan_partitions(dataset, "instance_usage", 3)
    assert all(p.start % 450 == 0 or p.start == 0 for s in specs for p in s.pieces)
    assert len(plan_partitions(dataset, "instance_usage", "auto")) == 1
    with pytest.raises(ValueError, match="partitions"):
        plan_partitions(dataset, "instance_usage", 0)
    specs = plan_partitions(dataset, "instance_usage", cut_points=[1, 2, 999, 5000])
    assert [s.num_rows for s in specs] == [1, 1, 997, 4001, t.num_rows - 5000]


def test_nulls_reach_partials_as_sentinels(tables):
    spec = plan_partitions(TableSource(tables), "instance_usage", 1)[0]
    cols = read_partition(spec, ["alloc_collection_id", "avg_cpu"])
    n_null = tables["instance_usage"].column("alloc_collection_id").null_count
    assert n_null > 0 and int((cols["alloc_collection_id"] == np.iinfo(np.int64).min).sum()) == n_null
    assert int(np.isnan(cols["avg_cpu"]).sum()) == tables["instance_usage"].column("avg_cpu").null_count


def test_one_read_per_partition_shared_by_analyses(dataset, monkeypatch):
    calls = []
    real = reading.read_partition

    def counting(spec, columns):
        calls.append((spec.table, spec.index, tuple(columns)))
        return real(spec, columns)

    monkeypatch.setattr(reading, "read_partition", counting)
    run(dataset, ANALYSES, partitions=3)
    assert sorted((t, i) for t, i, _ in calls) == sorted(
        [("instance_usage", i) for i in range(3)] + [("machine_events", i) for i in range(3)]
    )
    usage_cols = {c for t, _, cols in calls if t == "instance_usage" for c in cols}
    assert usage_cols == set(CellUsage().columns)  # column pruning: only what the analyses read
    calls.clear()
    run(dataset, ANALYSES, partitions=3, scheduler="threads")
    assert len(calls) == 6


def test_local_threads_are_bit_identical(dataset):
    """The local path's thread pool merges in partition order: any worker count gives exactly the
    result of one worker, for every registered analysis."""
    from gpuclust.analyses.registry import create, names

    ans = [create(n) for n in names()]
    one = run(dataset, ans, partitions=7, workers=1)
    assert_same(run(dataset, ans, partitions=7, workers=3), one, rtol=0)
    assert_same(run(dataset, ans, partitions=7), one, rtol=0)  # default: the usable cores
    with pytest.raises(ValueError, match="workers"):
        run(dataset, ans, workers=0)


def test_auto_partitions_round_to_the_thread_count(dataset, tables):
    n = tables["instance_usage"].num_rows
    assert len(plan_partitions(dataset, "instance_usage", "auto", multiple_of=4)) == 4
    assert len(plan_partitions(dataset, "instance_usage", "auto", multiple_of=n + 1)) == 1  # fewer rows than threads
    assert len(plan_partitions(dataset, "instance_usage", 3, multiple_of=4)) == 3  # explicit counts are kept


def test_threaded_scheduler(dataset, reference):
    assert_same(run(dataset, ANALYSES, partitions=7, scheduler="threads", split_every=2), reference)
    assert_same(run(dataset, ANALYSES, partitions=1, scheduler="sync"), reference)


def test_partials_are_host_and_picklable(dataset):
    spec = plan_partitions(dataset, "instance_usage", 2)[1]
    ans = ANALYSES[:2]
    parts = partition_partials(spec, ans, [context_of(a, dataset) for a in ans], "cpu")
    back = pickle.loads(pickle.dumps(parts))
    for p, q in zip(parts, back, strict=False):
        assert p.keys() == q.keys()
        for k in p:
            assert isinstance(p[k], np.ndarray)
            np.testing.assert_array_equal(p[k], q[k])


@pytest.fixture(scope="module")
def cluster():
    distributed = pytest.importorskip("distributed")
    with (
        distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=False, dashboard_address=":0") as c,
        distributed.Client(c) as client,
    ):
        yield c, client
    gc.collect()  # surface distributed's leaked sockets here, under this module's filters


def test_local_cluster_two_workers(cluster, dataset, tables, reference):
    c, client = cluster
    assert_same(run(dataset, ANALYSES, partitions=7, scheduler=client, split_every=3), reference)
    assert_same(run(tables, ANALYSES, partitions=2, scheduler=client), reference)
    # an existing scheduler by address
    assert_same(run(dataset, ANALYSES, partitions=2, scheduler=c.scheduler_address), reference)


def test_unknown_scheduler(dataset):
    with pytest.raises(ValueError, match="unknown scheduler"):
        run(dataset, ANALYSES[2:], scheduler="warp-drive")


@pytest.mark.skipif(gpu_available(), reason="a GPU is present")
def test_gpu_backend_missing_raises(dataset):
    with pytest.raises(BackendUnavailable):
        run(dataset, ANALYSES, backend="gpu")


@pytest.mark.gpu
def test_gpu_matches_cpu(gpu_backend, dataset, reference):
    assert_same(run(dataset, ANALYSES, partitions=3, backend=gpu_backend), reference, rtol=1e-9)
    assert_same(run(dataset, ANALYSES, partitions=2, backend="gpu", scheduler="threads"), reference, rtol=1e-9)


@pytest.mark.gpu
@pytest.mark.slow
def test_local_cuda_cluster(gpu_backend, dataset, reference):
    pytest.importorskip("dask_cuda")
    assert_same(run(dataset, ANALYSES, partitions=4, backend="gpu", scheduler="cuda"), reference, rtol=1e-9)


@pytest.mark.parametrize("rmm", [True, False])
def test_scheduler_cuda_gives_workers_an_rmm_pool(monkeypatch, rmm):
    """``scheduler="cuda"`` starts its LocalCUDACluster with an RMM pool per worker that CuPy
    allocates from, where rmm is installed (here a LocalCluster stands in for it: no GPU)."""
    import sys
    import types

    import distributed

    import gpuclust.engine.dask as engine_dask

    seen: dict = {}

    def cluster(**kw):
        seen.update(kw)
        return distributed.LocalCluster(n_workers=1, processes=False, dashboard_address=kw["dashboard_address"])

    monkeypatch.setitem(sys.modules, "dask_cuda", types.SimpleNamespace(LocalCUDACluster=cluster))
    real = engine_dask.cuda_cluster_options
    monkeypatch.setattr(engine_dask, "cuda_cluster_options", lambda: real(rmm=rmm))
    with engine_dask.open_scheduler("cuda", "gpu") as kw:
        assert isinstance(kw["scheduler"], distributed.Client)
    pool = {"rmm_pool_size": 0.25, "rmm_maximum_pool_size": 0.9, "rmm_allocator_external_lib_list": ["cupy"]}
    assert {k: seen.get(k) for k in pool} == (pool if rmm else dict.fromkeys(pool))


def test_cli_analyze(dataset, tmp_path, capsys):
    import pandas as pd

    from gpuclust.engine.command import register

    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers(dest="command")
    register(sub)
    out = tmp_path / "out"
    args = parser.parse_args(
        [
            "analyze",
            str(dataset.path),
            "cell-usage",
            "machine-shapes",
            "--out",
            str(out),
            "--partitions",
            "2",
            "--mode",
            "exact",
            "--tier-map",
            "seed-002",
        ]
    )
    assert args.func(args) == 0
    captured = capsys.readouterr()
    assert (out / "summary.txt").read_text() == captured.out
    # progress on stderr (log mode: not a terminal): contexts, the partitions, finalize, done
    err = captured.err.splitlines()
    assert "analyze: context: cell-usage[mode=exact,tier_map=seed-002]" in err
    n_usage = dataset.num_rows("instance_usage")
    assert f"analyze: instance_usage: 2 partition(s), {n_usage:,} rows" in err
    assert any(line.startswith("analyze: instance_usage: partition 2/2") and "(100%)" in line for line in err)
    assert "analyze: finalize" in err and err[-2].startswith("analyze: done, ") and err[-1] == f"analyze: wrote {out}"
    usage = pd.read_parquet(out / "cell-usage" / "usage.parquet")
    assert set(usage["tier"]) <= {"free", "beb", "mid", "prod", "monitoring", "unknown"}
    assert (out / "cell-usage" / "info.parquet").is_file()
    assert (out / "machine-shapes" / "shapes.parquet").is_file()
    for png in (out / "cell-usage" / "cell-usage.png", out / "machine-shapes" / "machine-shapes.png"):
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert not list(out.rglob(".*.tmp")) and not list(out.rglob(".*.png"))
    want = run(dataset, [CellUsage(mode="exact", tier_map="seed-002")])["cell-usage"]["usage"]
    np.testing.assert_allclose(usage["cpu"].to_numpy(), want["cpu"].to_numpy(), rtol=1e-12)
    bad = parser.parse_args(["analyze", str(tmp_path / "missing"), "machine-shapes", "--out", str(out)])
    assert bad.func(bad) == 2


@pytest.mark.slow
def test_local_process_cluster_string(dataset, reference):
    """``scheduler="local:2"``: two worker *processes*, so partials really cross process borders."""
    assert_same(run(dataset, ANALYSES, partitions=4, scheduler="local:2"), reference)
    gc.collect()


def test_a_local_cluster_does_not_try_port_8787():
    """The clusters gpuclust starts put the scheduler's HTTP server on a free port.  With
    ``dashboard_address=None`` distributed still listens on 8787 and, when that is taken (a
    second run, another process), warns, retries on another port and leaves the failed socket
    open: a ResourceWarning, an error under this suite's filters (seen as a flaky failure of two
    ``local:2`` tests run at once).  With 8787 taken here, no cluster of ours may find it so."""
    import socket
    import warnings

    from gpuclust.engine.dask import open_scheduler

    blocker = socket.socket()
    try:
        blocker.bind(("0.0.0.0", 8787))
        blocker.listen(1)
    except OSError:
        pass  # taken already: the case under test either way
    try:
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            with open_scheduler("local:1", "cpu") as kw:
                client = kw["scheduler"]
                assert client.submit(sum, [1, 2]).result() == 3
                assert ":8787/" not in client.dashboard_link
        gc.collect()
    finally:
        blocker.close()
    assert not [w for w in seen if "already in use" in str(w.message)]


def test_device_read_does_not_apply_on_cpu(dataset):
    from gpuclust.backends import get_backend

    spec = plan_partitions(dataset, "instance_usage", 2)[1]
    assert reading.read_partition_device(spec, ["start_time"], get_backend("cpu")) is None


@pytest.mark.gpu
def test_cudf_device_read_matches_host_read(gpu_backend, dataset, tables):
    """The thin cuDF path (only where RAPIDS is installed) gives the host path's arrays."""
    pytest.importorskip("cudf")
    cols = ["start_time", "end_time", "alloc_collection_id", "avg_cpu", "instance_index", "cpi"]
    for spec in plan_partitions(dataset, "instance_usage", cut_points=[1, 451, 3000]):
        dev = reading.read_partition_device(spec, cols, gpu_backend)
        host = read_partition(spec, cols)
        assert dev is not None and set(dev) == set(host)
        for c in cols:
            got = gpu_backend.xp.asnumpy(dev[c])
            assert got.dtype == host[c].dtype, c
            np.testing.assert_array_equal(got, host[c], err_msg=c)


class _CudfStandIn:
    """The few cuDF calls :func:`reading.read_partition_device` makes, on Arrow (cuDF's semantics:
    ``read_parquet(row_groups=...)`` reads those row groups in order, columns keep their NULLs
    through ``astype`` until ``fillna``, ``to_cupy`` gives a device array), so that the path's own
    logic (which row groups, the offsets into them, the joins, dtypes and fills) runs on a machine
    without RAPIDS."""

    class Series:
        def __init__(self, arr: pa.ChunkedArray) -> None:
            self.arr = arr

        def astype(self, dt: np.dtype) -> _CudfStandIn.Series:
            return _CudfStandIn.Series(self.arr.cast(pa.from_numpy_dtype(dt), safe=False))

        def fillna(self, v: float) -> _CudfStandIn.Series:
            return _CudfStandIn.Series(self.arr.fill_null(pa.scalar(v, self.arr.type)))

        def to_cupy(self):
            from device_backend import XP

            assert self.arr.null_count == 0  # as cuDF: a column with NULLs has no CuPy view
            return XP.asarray(self.arr.to_numpy())

    class Frame:
        def __init__(self, t: pa.Table) -> None:
            self.t = t
            self.iloc = self

        def __getitem__(self, k):
            if isinstance(k, slice):
                a, b = k.start or 0, self.t.num_rows if k.stop is None else k.stop
                return _CudfStandIn.Frame(self.t.slice(a, b - a))
            return _CudfStandIn.Series(self.t.column(k))

    @staticmethod
    def read_parquet(path, columns, row_groups):
        import pyarrow.parquet as pq

        return _CudfStandIn.Frame(pq.ParquetFile(path).read_row_groups(row_groups, columns=columns))

    @staticmethod
    def concat(frames, ignore_index):
        assert ignore_index
        return _CudfStandIn.Frame(pa.concat_tables([f.t for f in frames]))


def test_the_cudf_read_path_on_a_stand_in_gives_the_host_arrays(dataset, monkeypatch):
    """The thin cuDF path's logic, without RAPIDS: on partitions cut inside and across row groups
    and files (450-row groups), its arrays (NULLs filled) are the Arrow path's, bit for bit."""
    import sys
    import types

    from device_backend import DEVICE_GPU

    monkeypatch.setitem(
        sys.modules, "cudf", types.SimpleNamespace(**{k: getattr(_CudfStandIn, k) for k in ("read_parquet", "concat")})
    )
    monkeypatch.delenv("GPUCLUST_NO_CUDF", raising=False)
    cols = ["start_time", "end_time", "alloc_collection_id", "avg_cpu", "instance_index", "cpi", "machine_id"]
    specs = plan_partitions(dataset, "instance_usage", cut_points=[1, 451, 899, 900, 3000, 5999])
    assert any(len(s.pieces) > 1 for s in specs)  # a partition across files
    for spec in specs:
        dev = reading.read_partition_device(spec, cols, DEVICE_GPU)
        host = read_partition(spec, cols)
        assert dev is not None and set(dev) == set(host)
        for c in cols:
            got = dev[c].get()
            assert got.dtype == host[c].dtype, c
            np.testing.assert_array_equal(got, host[c], err_msg=f"{c} of partition {spec.index}")
    monkeypatch.setenv("GPUCLUST_NO_CUDF", "1")  # asked not to: the Arrow path
    assert reading.read_partition_device(specs[0], cols, DEVICE_GPU) is None


def test_progress_terminal_mode_redraws_one_line(dataset):
    import io

    from gpuclust.engine.progress import RunProgress

    out = io.StringIO()
    run(dataset, ANALYSES, partitions=3, progress=RunProgress(out, tty=True, min_interval=0))
    text = out.getvalue()
    assert "\r" in text and "partition 3/3" in text
    assert text.endswith("\n") and text.rstrip("\n").split("\r")[-1].startswith("analyze: done, ")


_ARENAS = (
    "import ctypes, os, tempfile; import gpuclust, numpy, pandas, pyarrow.parquet; "
    "from concurrent.futures import ThreadPoolExecutor as T; "
    "list(T(4).map(lambda k: numpy.ones(1 << 12).sum() + len(bytearray(1 << 10)), range(8))); "
    "libc = ctypes.CDLL(None); libc.fopen.restype = ctypes.c_void_p; "
    "libc.fopen.argtypes = [ctypes.c_char_p, ctypes.c_char_p]; "
    "libc.malloc_info.argtypes = [ctypes.c_int, ctypes.c_void_p]; libc.fclose.argtypes = [ctypes.c_void_p]; "
    "fd, p = tempfile.mkstemp(); os.close(fd); f = libc.fopen(p.encode(), b'w'); libc.malloc_info(0, f); "
    "libc.fclose(f); print(open(p).read().count('<heap nr=')); os.unlink(p)"
)


def test_import_caps_malloc_at_one_arena_before_pyarrow_makes_a_second():
    """``import gpuclust`` caps glibc at one malloc arena before it imports pyarrow, whose import
    starts a thread that makes a second arena (gpuclust/_memory.py): with the cap, imports and
    threads after it leave one arena; without the tuning, pyarrow's thread and the others have their own."""
    import platform
    import subprocess
    import sys

    if platform.libc_ver()[0] != "glibc":
        pytest.skip("malloc arenas are glibc's")
    import os

    base = {k: v for k, v in os.environ.items() if k not in ("MALLOC_ARENA_MAX", "GPUCLUST_MALLOC_TUNING")}
    count = lambda env: subprocess.run(  # noqa: E731
        [sys.executable, "-c", _ARENAS], capture_output=True, text=True, check=True, env=env
    ).stdout.strip()
    assert count(base) == "1"
    assert int(count({**base, "GPUCLUST_MALLOC_TUNING": "0"})) > 1  # (pyarrow's thread and the pool's: their own)
    assert count({**base, "MALLOC_ARENA_MAX": "3"}) == "3"  # the user's word, glibc's variable, kept


@pytest.mark.slow
def test_local_cluster_workers_start_with_one_arena():
    """The workers of ``scheduler="local:N"`` import distributed and pyarrow before gpuclust, so
    :func:`gpuclust._memory.cap_arenas` comes too late there: they are spawned with
    ``MALLOC_ARENA_MAX=1`` instead, and after pyarrow's threads and a pool's a worker has one arena
    (seen to have 4 when its environment was left as distributed sets it)."""
    import platform

    if platform.libc_ver()[0] != "glibc":
        pytest.skip("malloc arenas are glibc's")
    pytest.importorskip("distributed")
    import os

    from gpuclust.engine.dask import open_scheduler

    if os.environ.get("MALLOC_ARENA_MAX") or os.environ.get("GPUCLUST_MALLOC_TUNING") == "0":
        pytest.skip("the arena count is the user's choice here")
    count = "(lambda ns: (exec(" + repr(_ARENAS.replace("print(", "n = (")) + ", ns), ns['n'])[1])({})"
    with open_scheduler("local:1", "cpu") as kw:
        got = kw["scheduler"].run(eval, count)
    assert list(got.values()) == [1]
    assert "MALLOC_ARENA_MAX" not in os.environ  # distributed put it here to spawn; taken out again


def test_allocator_tuning_is_once_and_can_be_turned_off():
    import subprocess
    import sys

    code = (
        "from gpuclust._memory import tune_allocator as t; a = t(); b = t(); "
        "import gpuclust._memory as m; print(a, b, len(m._done))"
    )
    on = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    import platform

    glibc = platform.libc_ver()[0] == "glibc"
    assert on == [str(glibc), str(glibc), "1"]
    env = {**__import__("os").environ, "GPUCLUST_MALLOC_TUNING": "0"}
    off = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env
    ).stdout.split()
    assert off == ["False", "False", "1"]
    # NumPy's huge-page advice: off once tuned (the switch returns its previous state), unless the
    # user's NUMPY_MADVISE_HUGEPAGE chose, and left alone without the tuning
    hp = (
        "from gpuclust._memory import tune_allocator as t; t(); "
        "from numpy._core.multiarray import _set_madvise_hugepage as s; print(s(True))"
    )
    base = {
        k: v
        for k, v in __import__("os").environ.items()
        if k not in ("NUMPY_MADVISE_HUGEPAGE", "GPUCLUST_MALLOC_TUNING")
    }
    for extra, want in (
        ({}, str(not glibc)),
        ({"NUMPY_MADVISE_HUGEPAGE": "1"}, "True"),
        ({"GPUCLUST_MALLOC_TUNING": "0"}, "True"),
    ):
        got = subprocess.run(
            [sys.executable, "-c", hp], capture_output=True, text=True, check=True, env={**base, **extra}
        ).stdout.strip()
        assert got == want, extra


@pytest.mark.parametrize("fan", [2, 3, 8])
def test_local_merge_tree_is_dasks(fan):
    """MergeTree, fed the items one at a time, merges exactly as compute_merged's tree does
    (groups of ``fan`` in order, each folded left to right, level by level), for every count of
    items: the same merges of the same operands in the same order."""
    from functools import reduce

    from gpuclust.engine.tasks import MergeTree

    def merge(a, b):
        return (a, b)  # the nesting records which operands met, and in which order

    for n in range(0, 80):
        items = list(range(n))
        level = list(items)
        while len(level) > 1:  # compute_merged's loop
            level = [reduce(merge, level[i : i + fan]) for i in range(0, len(level), fan)]
        tree = MergeTree(merge, fan)
        for x in items:
            tree.add(x)
        assert tree.result() == (level[0] if level else None), n
