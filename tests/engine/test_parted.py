"""Parted results (issue 8, deliverable 3): overcommit's machine table reduced one shard at a time
from spilled keyed partials and written by the shard tasks as Parquet parts.

The reference is the same analysis with a single shard (the whole keyed partial finalized at
once: the code path whose results carry the independent references of
``tests/analyses/test_overcommit.py``); many shards must give the same tables, whatever the
scheduler, layout or partitioning, and the written parts must read back (DuckDB, pandas) as
that table."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from strategies import assert_results_same, random_cell

import gpuclust.analyses.overcommit as oc
from gpuclust.analyses.overcommit import Overcommit
from gpuclust.engine import run
from gpuclust.engine.partition import TableSource
from gpuclust.parted import PartedTable
from gpuclust.report.analyze import analyze

SHARD = 200  # machine-buckets per shard in the many-shard runs (12 machines x 241 buckets: 15 shards)


@pytest.fixture(scope="module")
def cell() -> dict:
    return random_cell(11, n_machines=12, n_instances=150, n_windows=3000)


@pytest.fixture(scope="module")
def canonical(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """A small canonical dataset (with CPU percentiles, which usage-distribution needs)."""
    import sys

    from gpuclust.dataset import Dataset
    from gpuclust.schema import TABLES

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
    from gen_canonical import make_dataset

    d = tmp_path_factory.mktemp("canon") / "ds"
    make_dataset(d, 30_000, seed=7)
    ds = Dataset(d)
    return {t: ds.read(t) for t in TABLES if ds.num_rows(t)}


@pytest.fixture(scope="module")
def reference(cell: dict) -> dict:
    a = Overcommit(bucket_s=300)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(oc, "SHARD_CELLS", 1 << 40)  # one shard
        res = run(TableSource(cell, tier_map="notebook"), [a], partitions=2)
    assert len(res["overcommit"]["machine"]) > 1000
    return res


def _shards(ctx_machines: int, buckets: int) -> int:
    step = max(1, SHARD // buckets)
    return -(-ctx_machines // step)


@pytest.mark.parametrize("buckets", [None, 5])
@pytest.mark.parametrize("scheduler", [None, "threads"])
def test_many_shards_equal_one(
    cell: dict, reference: dict, monkeypatch: pytest.MonkeyPatch, buckets: int | None, scheduler: str | None
) -> None:
    monkeypatch.setattr(oc, "SHARD_CELLS", SHARD)
    got = run(
        TableSource(cell, tier_map="notebook", buckets=buckets),
        [Overcommit(bucket_s=300)],
        partitions=3,
        scheduler=scheduler,
    )
    assert_results_same(reference, got, rtol=1e-9)


def test_in_memory_finalize_on_threads_gives_the_one_thread_bits(
    cell: dict, reference: dict, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A study (or a direct ``finalize``) finalizes a parted analysis in memory, its shards on the
    host threads that ``client_threads`` grants: the bits of one thread (parts and cell sums in
    shard order), and the shards really ran on several threads."""
    import threading

    from gpuclust._parallel import client_threads
    from gpuclust.analyses.base import to_host
    from gpuclust.backends import get_backend
    from gpuclust.engine.local import context_of
    from gpuclust.engine.partition import column_to_numpy
    from gpuclust.tables import as_pandas

    monkeypatch.setattr(oc, "SHARD_CELLS", SHARD)
    seen: set[str] = set()
    real = Overcommit.finalize_shard

    def spy(self, keyed, rest, ctx, lo, hi):  # type: ignore[no-untyped-def]
        seen.add(threading.current_thread().name)
        return real(self, keyed, rest, ctx, lo, hi)

    monkeypatch.setattr(Overcommit, "finalize_shard", spy)
    a = Overcommit(bucket_s=300)
    src = TableSource(cell, tier_map="notebook")
    ctx = context_of(a, src)
    be = get_backend("cpu")
    t = cell["instance_usage"]
    partial = to_host(a.partial({c: be.asarray(column_to_numpy(t.column(c))) for c in a.columns}, ctx, be))
    one = a.finalize(partial, ctx)
    assert len(seen) == 1
    seen.clear()
    with client_threads(4):
        many = a.finalize(partial, ctx)
    assert len(seen) > 1
    assert list(many) == list(one)
    for name in one:
        pd.testing.assert_frame_equal(as_pandas(many[name]), as_pandas(one[name]), check_exact=True)
    pd.testing.assert_frame_equal(
        as_pandas(one["machine"]), reference["overcommit"]["machine"], check_exact=False, rtol=1e-9
    )


def test_shards_written_by_the_tasks(
    cell: dict, reference: dict, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(oc, "SHARD_CELLS", SHARD)
    calls: list[int] = []
    real = Overcommit.finalize_shard

    def spy(self, keyed, rest, ctx, lo, hi):  # type: ignore[no-untyped-def]
        calls.append(sum(int(k["key"].shape[0]) for k in keyed.values()))
        return real(self, keyed, rest, ctx, lo, hi)

    monkeypatch.setattr(Overcommit, "finalize_shard", spy)
    parts = tmp_path / "parts"
    got = run(
        TableSource(cell, tier_map="notebook", buckets=5), [Overcommit(bucket_s=300)], partitions=3, parts_dir=parts
    )
    machine = got["overcommit"]["machine"]
    info = reference["overcommit"]["info"].iloc[0]
    n = _shards(int(info["machines"]), int(info["buckets"]))
    assert isinstance(machine, PartedTable) and len(machine.files) == n == len(calls) > 10
    # each shard task saw only its key range: no shard holds the whole keyed partial
    assert max(calls) < sum(calls) / 4
    assert sorted(os.listdir(parts / "overcommit" / "machine")) == machine.files
    assert [p.name for p in parts.iterdir()] == ["overcommit"]  # the spill folder is gone
    ref = reference["overcommit"]["machine"]
    pd.testing.assert_frame_equal(machine.read(), ref, check_exact=False, rtol=1e-9)
    assert machine.num_rows == len(ref)
    # the folder is plain Parquet: pandas and DuckDB read it back in order
    pd.testing.assert_frame_equal(pd.read_parquet(parts / "overcommit" / "machine"), ref, check_exact=False, rtol=1e-9)
    duckdb = pytest.importorskip("duckdb")
    ((n_db, m_db),) = (
        duckdb.connect()
        .execute(
            f"SELECT count(*), count(DISTINCT machine_id) FROM read_parquet('{parts}/overcommit/machine/*.parquet')"
        )
        .fetchall()
    )
    assert (n_db, m_db) == (len(ref), ref["machine_id"].nunique())


def test_analyze_writes_parts_and_returns_them_in_place(
    cell: dict, reference: dict, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(oc, "SHARD_CELLS", SHARD)
    out = tmp_path / "out"
    res = analyze(cell, [Overcommit(bucket_s=300)], out=out, plots=True, tier_map="notebook")
    machine = res["overcommit"]["machine"]
    assert isinstance(machine, PartedTable) and machine.folder == out / "overcommit" / "machine"
    pd.testing.assert_frame_equal(machine.read(), reference["overcommit"]["machine"], check_exact=False, rtol=1e-9)
    for t in ("cell", "summary", "info"):
        pd.testing.assert_frame_equal(
            pd.read_parquet(out / "overcommit" / f"{t}.parquet"),
            reference["overcommit"][t],
            check_exact=False,
            rtol=1e-9,
            check_dtype=False,
        )
    assert (out / "overcommit" / "overcommit.png").stat().st_size > 0
    assert not [p for p in tmp_path.iterdir() if p.name != "out"]  # no temporary folder left beside it


def test_a_failing_shard_leaves_nothing(cell: dict, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(oc, "SHARD_CELLS", SHARD)
    real = Overcommit.finalize_shard

    def boom(self, keyed, rest, ctx, lo, hi):  # type: ignore[no-untyped-def]
        if lo > 0:
            raise OSError("disk full")
        return real(self, keyed, rest, ctx, lo, hi)

    monkeypatch.setattr(Overcommit, "finalize_shard", boom)
    with pytest.raises(OSError, match="disk full"):
        analyze(cell, [Overcommit(bucket_s=300)], out=tmp_path / "out", plots=False, tier_map="notebook")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow
def test_many_shards_on_a_dask_cluster(cell: dict, reference: dict, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("distributed")
    monkeypatch.setattr(oc, "SHARD_CELLS", SHARD)  # read on the client, where the shards are planned
    got = run(
        TableSource(cell, tier_map="notebook", buckets=5), [Overcommit(bucket_s=300)], partitions=3, scheduler="local:2"
    )
    assert_results_same(reference, got, rtol=1e-9)


def test_dense_and_insertion_merges_agree(cell: dict, reference: dict, monkeypatch: pytest.MonkeyPatch) -> None:
    """A shard merges its spills into dense accumulators over its key range; above DENSE_KEYS by a
    left fold of insertions (merge_keyed): both give the tables of the one-shard run."""
    import gpuclust.engine.shards as shards

    monkeypatch.setattr(oc, "SHARD_CELLS", SHARD)
    monkeypatch.setattr(shards, "DENSE_KEYS", 0)
    got = run(TableSource(cell, tier_map="notebook", buckets=5), [Overcommit(bucket_s=300)], partitions=4)
    assert_results_same(reference, got, rtol=1e-9)


@pytest.mark.parametrize("by", ["instance", "instance,time"])
def test_usage_distribution_by_instance_in_shards(
    canonical: dict, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, by: str
) -> None:
    """usage-distribution with instance in ``by``: on an instance-bucketed source every partition
    spills its finished groups as rows; shards are ranges of collection_id placed by the
    partitions' key samples, each written as a part, in the table's order.  The reference is the
    flat source (whose groups are merged and finalized whole: one shard)."""
    import gpuclust.analyses.usage_distribution as ud
    from gpuclust.analyses.usage_distribution import UsageDistribution

    a = UsageDistribution(by=by)
    ref = run(TableSource(canonical, tier_map="notebook"), [a], partitions=2)
    assert ref["usage-distribution"]["info"].iloc[0]["groups"] > 500
    monkeypatch.setattr(ud, "SHARD_GROUPS", 64)
    monkeypatch.setattr(ud, "SAMPLE_EVERY", 2)
    parts = tmp_path / "parts"
    got = run(TableSource(canonical, tier_map="notebook", buckets=5), [a], partitions=3, parts_dir=parts)
    key = "usage-distribution"
    q = got[key]["quantiles"]
    assert isinstance(q, PartedTable) and len(q.files) > 4
    assert got[key]["info"].iloc[0]["strategy"] == "exact" and ref[key]["info"].iloc[0]["strategy"] == "exact"
    read = {key: {t: v.read() if isinstance(v, PartedTable) else v for t, v in got[key].items()}}
    assert_results_same(ref, read, rtol=1e-12)
    # the summary streams the parts: the same lines as from the whole tables
    assert a.summary(got[key]) == a.summary(ref[key])
    assert sorted(p.name for p in (parts / key).iterdir()) == ["naive", "quantiles"]


@dataclass(frozen=True)
class _Ctx:
    big: Any
    small: Any
    n: int


def test_large_context_arrays_travel_as_file_names(tmp_path: Path) -> None:
    """map_large_arrays: a context's large arrays are saved and memory-mapped; pickled, the whole
    array is its file name (a view or a result of arithmetic is data), and it reads back equal."""
    import pickle

    import numpy as np

    from gpuclust.parted import MappedArray, map_large_arrays

    big = np.arange(1 << 16, dtype=np.int64)
    ctx = map_large_arrays(_Ctx(big, np.arange(10), 3), tmp_path)
    assert isinstance(ctx.big, MappedArray) and type(ctx.small) is np.ndarray and ctx.n == 3
    assert len(pickle.dumps(ctx)) < 1024 < big.nbytes
    back = pickle.loads(pickle.dumps(ctx))
    assert np.array_equal(back.big, big) and np.array_equal(back.small, np.arange(10))
    view = pickle.loads(pickle.dumps(ctx.big[5:9]))
    assert np.array_equal(view, [5, 6, 7, 8]) and len(pickle.dumps(ctx.big * 2)) > big.nbytes
    with pytest.raises(ValueError):
        ctx.big[0] = 1  # read-only: a context is never changed by a partition


def test_array_batches_read_every_kind_of_table_alike(tmp_path: Path) -> None:
    """A parted table's columns a batch at a time, without pandas for written parts: the same
    values from the Parquet parts, the parts in memory, a DataFrame and an Arrow table (NULL as NaN
    or the integer minimum), in table order."""
    import numpy as np
    import pyarrow as pa

    from gpuclust.parted import FrameParts, array_batches, column_batches, write_part

    parts = [
        pa.table({"a": pa.array([1, None, 3], pa.int64()), "x": pa.array([0.5, None, 2.0])}),
        pa.table({"a": pa.array([4], pa.int64()), "x": pa.array([float("nan")])}),
    ]
    files = [write_part(tmp_path / "t", i, p)[0] for i, p in enumerate(parts)]
    written = PartedTable(tmp_path / "t", files, 4)
    whole = pa.concat_tables(parts)
    want_a = np.array([1, np.iinfo(np.int64).min, 3, 4])
    for t in (written, FrameParts(parts), whole, whole.to_pandas()):
        got = list(array_batches(t, ["x", "a"]))
        assert all(list(b) == ["x", "a"] for b in got)
        a = np.concatenate([b["a"] for b in got])
        x = np.concatenate([b["x"] for b in got])
        if isinstance(t, pd.DataFrame):  # pandas holds the NULL int as float NaN
            assert np.array_equal(a[[0, 2, 3]], want_a[[0, 2, 3]]) and np.isnan(x[[1, 3]]).all()
        else:
            assert np.array_equal(a, want_a), (type(t), a)
        assert np.array_equal(x, [0.5, np.nan, 2.0, np.nan], equal_nan=True)
        assert np.array_equal(np.concatenate(list(column_batches(t, "x"))), x, equal_nan=True)
    assert len(list(array_batches(written, ["a"]))) == 2  # a row group at a time


def test_keyed_chunks_appended_read_as_one_spill(tmp_path: Path) -> None:
    """:class:`gpuclust.parted.KeyedAppender` writes chunks of keyed partials (ascending, disjoint
    keys) into one spill that reads as :func:`gpuclust.parted.write_keyed` of their concatenation
    (a 2-D field too); the folder appears only at ``close``; keys not above the previous chunk's
    are refused; ``discard`` leaves nothing behind."""
    import numpy as np

    from gpuclust.parted import KeyedAppender, read_keyed_range, write_keyed

    rng = np.random.default_rng(3)
    empty = {
        "a": {"key": np.zeros(0, np.int64), "x": np.zeros(0), "m": np.zeros((0, 3), np.int32)},
        "b": {"key": np.zeros(0, np.int64)},
    }
    keys = np.sort(rng.choice(10**6, 5000, replace=False)).astype(np.int64)
    whole = {
        "a": {"key": keys, "x": rng.random(5000), "m": rng.integers(0, 9, (5000, 3), dtype=np.int32)},
        "b": empty["b"],
    }
    w = KeyedAppender(tmp_path, empty)
    for lo, hi in [(0, 1200), (1200, 1200), (1200, 4999), (4999, 5000)]:
        w.add({"a": {f: v[lo:hi] for f, v in whole["a"].items()}, "b": empty["b"]})
    assert [p.name for p in tmp_path.iterdir() if not p.name.startswith(".")] == []
    with pytest.raises(ValueError, match="not above"):
        w.add({"a": {f: v[10:20] for f, v in whole["a"].items()}})
    got, want = w.close(), write_keyed(tmp_path, whole)
    for lo, hi in [(0, 10**6), (keys[7], keys[4000])]:
        for name, fields in (("a", ["x", "m"]), ("b", [])):
            g, e = (
                read_keyed_range(got, name, fields, int(lo), int(hi)),
                read_keyed_range(want, name, fields, int(lo), int(hi)),
            )
            assert g.keys() == e.keys() and all(np.array_equal(g[f], e[f]) and g[f].dtype == e[f].dtype for f in g)
    gone = KeyedAppender(tmp_path / "gone", empty)
    gone.add({"a": {f: v[:5] for f, v in whole["a"].items()}})
    gone.discard()
    assert list((tmp_path / "gone").iterdir()) == []


def test_npy_headers_are_parsed_one_thread_at_a_time(tmp_path, monkeypatch):
    """NumPy parses a ``.npy`` header with ``ast.literal_eval``, which CPython 3.11 (before 3.11.8)
    can fail with a spurious ``SystemError`` when threads build ASTs at once (python/cpython#106905:
    seen once in a fresh-clone CI run of test_analyze_writes_parts_and_returns_them_in_place, in a
    shard thread's ``read_keyed_range``): every ``np.load`` of the parted tables' spill files and
    mapped context arrays holds one lock."""
    import numpy as np

    import gpuclust.parted as parted

    held = []
    load = np.load

    def checked(*a, **kw):
        held.append(parted._NPY_HEADER.locked())
        return load(*a, **kw)

    monkeypatch.setattr(np, "load", checked)
    for f in ("key", "v"):
        np.save(tmp_path / f"p.{f}.npy", np.arange(10, dtype=np.int64) * (2 if f == "v" else 1))
    got = parted.read_keyed_range(tmp_path, "p", ["v"], 3, 7)
    assert got["key"].tolist() == [3, 4, 5, 6] and got["v"].tolist() == [6, 8, 10, 12]
    np.save(tmp_path / "ctx.npy", np.arange(1 << 14, dtype=np.float64))
    assert float(parted._open_mapped(str(tmp_path / "ctx.npy"))[5]) == 5.0  # (a mapped context array)
    assert held and all(held), held
