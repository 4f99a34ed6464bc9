"""On a distributed scheduler each table's merge tree ends in the finalize, on a worker: the client
receives result tables, never the merged partials (usage-vs-request's per-task and job-usage's
per-job keyed partials grow with the data).  With a results folder (``gpuclust analyze --out``)
the workers write the tables there: the client receives handles on the files, and the folder is
the in-process run's, file for file."""

from __future__ import annotations

import gc
import json
import pickle
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from strategies import assert_results_same

from gpuclust.analyses.registry import create
from gpuclust.engine import run
from gpuclust.engine.finish import Finalized
from gpuclust.report.analyze import analyze
from gpuclust.report.writer import WrittenTable

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
from gen_canonical import make_dataset  # noqa: E402

pytestmark = [
    pytest.mark.filterwarnings("ignore:unclosed <socket:ResourceWarning"),
    pytest.mark.filterwarnings("ignore:Exception ignored in. <socket:pytest.PytestUnraisableExceptionWarning"),
]

#: overcommit is parted: its shards are reduced by their own tasks, its merged rest comes back
NAMES = ["usage-vs-request", "job-usage", "cell-usage", "machine-shapes", "overcommit"]


@pytest.fixture(scope="module")
def ds(tmp_path_factory):
    root = tmp_path_factory.mktemp("fin") / "ds"
    make_dataset(root, 20_000, seed=7)  # 500 jobs: job-usage's jobs table, a row per job
    return root


@pytest.fixture(scope="module")
def client():
    distributed = pytest.importorskip("distributed")
    with (
        distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=False, dashboard_address=":0") as c,
        distributed.Client(c) as cl,
    ):
        yield cl
    gc.collect()  # surface distributed's leaked sockets here, under this module's filters


def _spy(monkeypatch):
    """What :func:`gpuclust.engine.dask.compute_merged` hands the client, call by call."""
    import gpuclust.engine.dask as engine_dask

    calls = []
    real = engine_dask.compute_merged

    def spy(plans, analyses, *args, **kw):
        merged = real(plans, analyses, *args, **kw)
        calls.append((list(analyses), merged))
        return merged

    monkeypatch.setattr(engine_dask, "compute_merged", spy)
    return calls


def test_the_client_receives_result_tables_not_partials(ds, client, monkeypatch):
    ans = [create(n) for n in NAMES]
    ref = run(ds, ans, partitions=3)
    calls = _spy(monkeypatch)
    got = run(ds, ans, partitions=3, scheduler=client, tables="native")
    assert_results_same(ref, got, rtol=1e-9)
    analyses, merged = calls[-1]  # the run's own pass (after any prerequisite pass)
    assert [a.name for a in analyses] == NAMES
    for a, p in zip(analyses, merged, strict=True):
        if a.sharded:  # the rest of its partial only; the parted rows were written by the shard tasks
            assert not isinstance(p, Finalized), a.name
            continue
        assert isinstance(p, Finalized) and p.note is None, a.name
        assert p.tables.keys() == ref[a.name].keys()
    # job-usage's per-job partial stayed on its worker: what came back is its result, a row per job
    assert len(merged[1].tables["jobs"]) == len(ref["job-usage"]["jobs"]) >= 500


def test_on_the_threaded_scheduler_the_client_still_finalizes(ds, monkeypatch):
    calls = _spy(monkeypatch)
    run(ds, ["usage-vs-request"], partitions=3, scheduler="threads")
    assert not any(isinstance(p, Finalized) for _, merged in calls for p in merged)


@pytest.mark.parametrize("plots", [False, True])
def test_analyze_out_on_a_cluster_writes_on_the_workers(ds, client, tmp_path, monkeypatch, plots):
    names = NAMES if not plots else ["usage-vs-request", "job-usage"]
    ref = analyze(ds, names, out=tmp_path / "local", partitions=3, plots=plots, tables="native")
    calls = _spy(monkeypatch)
    got = analyze(ds, names, out=tmp_path / "cluster", partitions=3, scheduler=client, plots=plots, tables="native")
    analyses, merged = calls[-1]
    for a, p in zip(analyses, merged, strict=True):
        if a.sharded:
            continue
        # handles on the files and the summary paragraph: a few KiB, whatever the rows
        assert isinstance(p, Finalized) and len(pickle.dumps(p)) < 8192, a.name
        assert all(isinstance(t, WrittenTable) for t in p.tables.values()), a.name
        for t, h in got[a.name].items():  # relocated into the committed folder
            assert h.path == tmp_path / "cluster" / a.name / f"{t}.parquet" and h.num_rows == len(ref[a.name][t])
    assert got["job-usage"]["jobs"].num_rows >= 500
    if not plots:  # job-usage's answer: a fraction of its jobs table
        p = merged[[a.name for a in analyses].index("job-usage")]
        assert len(pickle.dumps(p)) < sum(t.nbytes for t in ref["job-usage"].values()) / 4
    # the same folder: the same files, summary and tables
    files = [json.loads((tmp_path / d / "_run.json").read_text())["files"] for d in ("local", "cluster")]
    assert files[0] == files[1] and ("usage-vs-request/usage-vs-request.png" in files[0]) == plots
    assert sorted(p.relative_to(tmp_path / "local") for p in (tmp_path / "local").rglob("*")) == sorted(
        p.relative_to(tmp_path / "cluster") for p in (tmp_path / "cluster").rglob("*")
    )
    assert (tmp_path / "local" / "summary.txt").read_text() == (tmp_path / "cluster" / "summary.txt").read_text()
    for f in files[0]:
        if f.endswith(".parquet"):
            a, b = (pq.read_table(tmp_path / d / f) for d in ("local", "cluster"))
            assert_results_same({"t": {"t": a}}, {"t": {"t": b}}, rtol=1e-9)
    assert not list(tmp_path.glob(".cluster.gpuclust-*"))  # no temporary sibling left


def test_a_pandas_caller_on_a_cluster_gets_dataframes(ds, client, tmp_path):
    got = analyze(ds, ["usage-vs-request"], out=tmp_path / "r", partitions=3, scheduler=client, plots=False)
    assert type(got["usage-vs-request"]["hist"]).__name__ == "DataFrame"


def _where_finalized(monkeypatch, names):
    """Per analysis name, where each of its ``finalize`` calls ran: ``True`` on a dask worker,
    ``False`` on the client (the cluster's workers are threads of this process)."""
    from distributed import get_worker

    where: dict[str, list[bool]] = {}
    for name in names:
        cls = type(create(name))
        real = cls.finalize

        def spy(self, partial, ctx, _real=real):
            try:
                get_worker()
                on_worker = True
            except ValueError:
                on_worker = False
            where.setdefault(self.name, []).append(on_worker)
            return _real(self, partial, ctx)

        monkeypatch.setattr(cls, "finalize", spy)
    return where


#: the in-memory analyses of the entry points below (a study finalizes parted ones in memory too)
SMALL = ["usage-vs-request", "job-usage", "cell-usage", "machine-shapes"]


def test_a_study_on_a_cluster_finalizes_on_the_workers(ds, client, monkeypatch):
    import gpuclust

    with gpuclust.open(ds, partitions=3) as study:
        ref = study.run(SMALL)
    where = _where_finalized(monkeypatch, SMALL)
    with gpuclust.open(ds, partitions=3, scheduler=client) as study:
        got = study.run(SMALL)
    assert where == {n: [True] for n in SMALL}  # never the client's
    assert_results_same(ref, got, rtol=0.0)  # the same merge tree: the same bits


def test_analyze_cells_on_a_cluster_finalizes_on_the_workers(ds, client, tmp_path, monkeypatch):
    import shutil

    for c in ("a", "b"):  # the same dataset as two cells
        shutil.copytree(ds, tmp_path / "cells" / c)
        manifest = tmp_path / "cells" / c / "manifest.json"
        manifest.write_text(json.dumps({**json.loads(manifest.read_text()), "cell": c}))
    ref = analyze(tmp_path / "cells", SMALL, cells="a,b", partitions=3, plots=False)
    where = _where_finalized(monkeypatch, SMALL)
    got = analyze(tmp_path / "cells", SMALL, cells="a,b", partitions=3, plots=False, scheduler=client)
    assert where == {n: [True, True] for n in SMALL}  # a run per cell, each finalized on a worker
    assert_results_same(ref, got, rtol=1e-9)


def test_a_study_lists_the_workers_from_the_scheduler_not_the_clients_cache(client, monkeypatch):
    """The client's ``scheduler_info()`` answers from a cache whose periodic refresh carries no
    workers when its own query fails (a CI run: ``workers must be >= 1, got 0``); the study asks
    the scheduler."""
    from gpuclust.engine.study_workers import WorkerResidency

    monkeypatch.setattr(type(client), "scheduler_info", lambda self, *a, **k: {"workers": {}})
    assert len(WorkerResidency(client).workers) == 2


def test_a_cluster_without_workers_is_waited_for_then_refused_by_name():
    distributed = pytest.importorskip("distributed")
    from gpuclust.engine.study_workers import WorkerResidency

    with (
        distributed.LocalCluster(n_workers=0, processes=False, dashboard_address=":0") as c,
        distributed.Client(c) as cl,
    ):
        with pytest.raises(ValueError, match=r"has no workers after 0.2 s"):
            WorkerResidency(cl, wait_s=0.2)
        c.scale(1)
        assert len(WorkerResidency(cl, wait_s=30).workers) == 1
    gc.collect()
