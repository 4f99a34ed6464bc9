"""The engine on a key-partitioned (bucketed) source: partitions of whole buckets, side inputs
bound per partition, per-instance groups finalized where they are complete, and results equal to
the flat layout's (the flat results carry the analyses' own independent references)."""

from __future__ import annotations

import pickle
import sys
from pathlib import Path

import numpy as np
import pytest
from strategies import assert_results_same, ref_bucket

from gpuclust.analyses.registry import create, names
from gpuclust.analyses.usage_distribution import UsageDistribution
from gpuclust.dataset import Dataset
from gpuclust.engine import run
from gpuclust.engine.contexts import PerPartition, contexts, per_partition
from gpuclust.engine.partition import TableSource, plan_partitions
from gpuclust.engine.planning import plan_tables
from gpuclust.layout import KEYS, ORDER
from gpuclust.schema import TABLES

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
from gen_canonical import make_dataset  # noqa: E402

N_BUCKETS = 7


@pytest.fixture(scope="module")
def tables(tmp_path_factory: pytest.TempPathFactory) -> dict:
    d = tmp_path_factory.mktemp("canon")
    make_dataset(d, 30_000, seed=3)
    ds = Dataset(d)
    return {
        "tables": {t: ds.read(t) for t in TABLES if ds.num_rows(t)},
        "tier_map": ds.tier_map_name,
        "trace_version": ds.trace_version,
    }


def _source(tables: dict, buckets: int | None) -> TableSource:
    return TableSource(
        tables["tables"], tier_map=tables["tier_map"], trace_version=tables["trace_version"], buckets=buckets
    )


def test_every_row_sits_in_its_hash_bucket_in_time_order(tables: dict) -> None:
    src = _source(tables, N_BUCKETS)
    for t in KEYS:
        if t not in src.tables:
            continue
        slices = src.bucket_slices(t)
        assert len(slices) == N_BUCKETS and sum(s.num_rows for s in slices) == tables["tables"][t].num_rows
        for b, s in enumerate(slices):
            keys = [s.column(c).to_pylist() for c in KEYS[t]]
            for row in list(zip(*keys, strict=True))[:200]:
                assert ref_bucket(tuple(int(v) for v in row), N_BUCKETS) == b
            times = np.asarray(s.column(ORDER[t]).to_numpy(zero_copy_only=False))
            assert (np.diff(times) >= 0).all()


def test_partitions_hold_whole_buckets_with_their_side_buckets(tables: dict) -> None:
    src = _source(tables, N_BUCKETS)
    for p in (1, 2, 3, N_BUCKETS, 20):
        specs = plan_partitions(src, "instance_usage", p)
        assert 1 <= len(specs) <= min(p, N_BUCKETS)
        assert sorted(b for s in specs for b in s.buckets) == list(range(N_BUCKETS))
        assert all(s.grain == "instance" for s in specs)
        assert sum(s.num_rows for s in specs) == tables["tables"]["instance_usage"].num_rows
    ans = [create("cell-usage")]
    plans = plan_tables(src, ans, 3)
    ((_, specs),) = plans.values()
    for s in specs:
        ((name, pieces),) = s.side
        assert name == "instance_events"
        ev_rows = sum(p.stop - p.start for p in pieces)
        assert ev_rows == sum(src.bucket_slices("instance_events")[b].num_rows for b in s.buckets)


def _analyses() -> list:
    return [
        *(create(n) for n in names()),
        UsageDistribution(by="instance"),
        UsageDistribution(by="instance,tier"),
        UsageDistribution(by="machine,tier"),
        create("cell-usage", mode="exact"),
        create("cpi", by="tier"),
    ]


@pytest.fixture(scope="module")
def flat_results(tables: dict) -> dict:
    """:func:`_analyses` on the flat layout in 3 partitions: the reference of the bucketed runs."""
    return run(_source(tables, None), _analyses(), partitions=3)


@pytest.mark.parametrize("partitions", [1, 2, 7])
def test_bucketed_results_equal_flat_results(tables: dict, flat_results: dict, partitions: int) -> None:
    got = run(_source(tables, N_BUCKETS), _analyses(), partitions=partitions)
    assert_results_same(flat_results, got, rtol=1e-9)


def test_dask_on_a_bucketed_source_equals_local(tables: dict) -> None:
    bucketed = _source(tables, N_BUCKETS)
    ans = _analyses()
    assert_results_same(
        run(bucketed, ans, partitions=3), run(bucketed, ans, partitions=3, scheduler="threads"), rtol=1e-9
    )


def test_side_inputs_are_bound_per_partition_to_its_buckets_only(tables: dict, monkeypatch: pytest.MonkeyPatch) -> None:
    bucketed = _source(tables, N_BUCKETS)
    ans = [create("cell-usage"), UsageDistribution(by="tier")]
    plans = plan_tables(bucketed, ans, 3)
    ctxs = contexts(ans, bucketed, per_partition=per_partition(bucketed, ans, plans))
    assert all(isinstance(c, PerPartition) for c in ctxs)
    # the client's contexts hold no per-instance lookup: small, whatever the data size
    assert all(len(c.ctx.lookup) == 0 for c in ctxs)
    flat_ctxs = contexts(ans, _source(tables, None))
    assert len(pickle.dumps(ctxs)) * 20 < len(pickle.dumps(flat_ctxs))
    seen: list[int] = []
    real = type(ans[0]).bind

    def spy(self, ctx, side, grain):  # type: ignore[no-untyped-def]
        assert grain == "instance"
        seen.append(side["instance_events"].num_rows)
        return real(self, ctx, side, grain)

    monkeypatch.setattr(type(ans[0]), "bind", spy)
    run(bucketed, ans[:1], partitions=3)
    total = tables["tables"]["instance_events"].num_rows
    assert len(seen) == len(plans["instance_usage"][1]) == 3 and sum(seen) == total and max(seen) < total


def test_instances_are_exact_at_any_size_on_a_bucketed_source(tables: dict) -> None:
    """``strategy=auto`` runs two passes above ``exact_max_windows``; with usage bucketed by
    instance every instance is whole in its partition, so it stays one exact pass."""
    bucketed = _source(tables, N_BUCKETS)
    got = run(bucketed, UsageDistribution(by="instance", exact_max_windows=0), partitions=3)["usage-distribution"]
    ref = run(_source(tables, None), UsageDistribution(by="instance", strategy="exact"), partitions=3)[
        "usage-distribution"
    ]
    assert got["info"]["strategy"].iloc[0] == "exact" and got["info"]["max_cdf_error_bound"].iloc[0] == 0
    assert_results_same({"u": {"q": ref["quantiles"]}}, {"u": {"q": got["quantiles"]}}, rtol=1e-9)
    # flat and over the budget: exact in two passes, and said so
    flat = run(_source(tables, None), UsageDistribution(by="instance", exact_max_windows=0), partitions=3)
    assert flat["usage-distribution"]["info"]["strategy"].iloc[0] == "exact-two-pass"
    assert_results_same(
        {"u": {"q": ref["quantiles"]}}, {"u": {"q": flat["usage-distribution"]["quantiles"]}}, rtol=1e-9
    )


def test_a_time_selection_on_a_bucketed_source_equals_it_on_the_flat_one(tables: dict) -> None:
    flat, bucketed = _source(tables, None), _source(tables, N_BUCKETS)
    ans = _analyses()
    kw = {"time_from": "1h", "time_to": "3h"}
    ref = run(flat, ans, partitions=3, **kw)
    got = run(bucketed, ans, partitions=2, **kw)
    assert_results_same(ref, got, rtol=1e-9)
    assert_results_same(got, run(bucketed, ans, partitions=2, scheduler="threads", **kw), rtol=1e-9)
