"""``overcommit`` on a key-partitioned (bucketed) source: running intervals built per partition
from its buckets of instance_events (on the GPU too, marked ``gpu``), results equal to the flat layout's (whose results carry the
independent references of ``test_overcommit.py``), a client context that holds nothing
proportional to the instances, and finalize's memory per machine-bucket measured in a child."""

from __future__ import annotations

import json
import pickle
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from strategies import assert_results_same, random_cell, table

from gpuclust.analyses.overcommit import Overcommit, OvercommitContext
from gpuclust.dataset import Dataset
from gpuclust.engine import run
from gpuclust.engine.contexts import PerPartition, contexts, per_partition
from gpuclust.engine.partition import TableSource
from gpuclust.engine.planning import plan_tables
from gpuclust.schema import TABLES

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))
from gen_canonical import make_dataset  # noqa: E402

N_BUCKETS = 7


def _lifecycle_cell(seed: int) -> dict:
    """A random cell with lifecycles: a third of the events FINISH, some requests NULL."""
    tables = random_cell(seed, n_machines=12, n_instances=150, n_windows=3000)
    ev = tables["instance_events"].to_pandas()
    ev.loc[ev.index % 3 == 2, "type"] = 6
    ev.loc[ev.index % 11 == 5, "type"] = 10  # UPDATE_RUNNING
    ev["req_cpu"] = np.where(ev.index % 5 == 0, np.nan, (ev.index % 7 + 1) / 50.0)
    ev["req_mem"] = (ev.index % 4 + 1) / 40.0
    cols = (
        "time",
        "type",
        "collection_id",
        "instance_index",
        "machine_id",
        "priority",
        "alloc_collection_id",
        "req_cpu",
        "req_mem",
    )
    tables["instance_events"] = table(
        "instance_events",
        {c: [None if isinstance(v, float) and np.isnan(v) else v for v in ev[c].tolist()] for c in cols},
    )
    return tables


@pytest.fixture(scope="module")
def canonical(tmp_path_factory: pytest.TempPathFactory) -> dict:
    d = tmp_path_factory.mktemp("canon")
    make_dataset(d, 60_000, seed=5)
    ds = Dataset(d)
    return {t: ds.read(t) for t in TABLES if ds.num_rows(t)}


@pytest.mark.parametrize("partitions", [1, 2, 7])
@pytest.mark.parametrize("which", ["lifecycle", "canonical"])
def test_bucketed_equals_flat(canonical: dict, which: str, partitions: int) -> None:
    tables = _lifecycle_cell(4) if which == "lifecycle" else canonical
    a = Overcommit(bucket_s=600)
    ref = run(TableSource(tables, tier_map="notebook"), [a], partitions=3)
    got = run(TableSource(tables, tier_map="notebook", buckets=N_BUCKETS), [a], partitions=partitions)
    assert ref["overcommit"]["info"].iloc[0]["pieces"] > 0
    assert_results_same(ref, got, rtol=1e-9)


def _unplaced_cell(seed: int) -> dict:
    """:func:`_lifecycle_cell` with some events on no machine (NULL) or a dedicated one (-1)."""
    tables = _lifecycle_cell(seed)
    ev = tables["instance_events"]
    m = ev.column("machine_id").to_pylist()
    m = [None if k % 13 == 1 else -1 if k % 17 == 2 else v for k, v in enumerate(m)]
    tables["instance_events"] = ev.set_column(
        ev.schema.get_field_index("machine_id"), "machine_id", pa.array(m, ev.schema.field("machine_id").type)
    )
    return tables


def _sparse_cell(seed: int) -> dict:
    """:func:`_unplaced_cell` whose instances run on half of the machines only."""
    import pyarrow.compute as pc

    tables = _unplaced_cell(seed)
    ev = tables["instance_events"]
    m = ev.column("machine_id")
    half = sorted(set(m.drop_null().to_pylist()) - {-1})[::2]
    keep = pc.or_(pc.is_null(m), pc.is_in(m, value_set=pa.array([-1, *half], m.type)))
    tables["instance_events"] = ev.filter(keep)
    return tables


@pytest.mark.parametrize(("which", "machines"), [("canonical", 5), ("unplaced", 1), ("sparse", 1)])
def test_flat_source_intervals_in_chunks_equal_bucketed(
    canonical: dict, monkeypatch: pytest.MonkeyPatch, which: str, machines: int
) -> None:
    """A flat source's interval partial (built on the client at finalize) comes in chunks of
    ``CLIENT_CELLS`` machine-buckets, each spilled as it comes into one spill: with chunks of 5
    machines (of 100) and of 1 (of 12, with pieces on no machine and dedicated ones, which the
    first chunk counts), the engine's result (spilled shards) and an in-memory finalize are the
    bucketed source's, whose partitions build the intervals."""
    import gpuclust.analyses.overcommit as oc

    tables = canonical if which == "canonical" else _unplaced_cell(4) if which == "unplaced" else _sparse_cell(4)
    a = Overcommit(bucket_s=600)
    ref = run(TableSource(tables, tier_map="notebook", buckets=N_BUCKETS), [a], partitions=3)
    info = ref["overcommit"]["info"].iloc[0]
    if which != "canonical":
        assert info["pieces_unplaced"] > 0 and info["pieces_dedicated"] > 0
    monkeypatch.setattr(oc, "CLIENT_CELLS", machines * int(info["buckets"]))
    flat = TableSource(tables, tier_map="notebook")
    chunks = list(a.client_partial(contexts([a], flat)[0]))
    assert 1 < len(chunks) <= -(-int(info["machines"]) // machines)  # (no chunk without a piece)
    if which == "sparse":
        assert len(chunks) < int(info["machines"])
    assert_results_same(ref, run(flat, [a], partitions=3), rtol=1e-9)
    from gpuclust.engine.local import finalize_all

    plans = plan_tables(flat, [a], 3)
    ctx = contexts([a], flat, per_partition=per_partition(flat, [a], plans))[0]
    in_memory = finalize_all([a], [run_partial(flat, a, ctx)], [ctx])
    assert_results_same(ref, in_memory, rtol=1e-9)


def test_a_chunk_that_fails_leaves_no_spill(canonical: dict, tmp_path: Path) -> None:
    """A flat source's client chunks are appended to one spill as they come: when one fails, the
    error reaches the caller and the half-written spill is removed (nothing left in the folder)."""
    from gpuclust.engine import shards

    a = Overcommit(bucket_s=600)
    first = next(iter(a.client_partial(contexts([a], TableSource(canonical, tier_map="notebook"))[0])))

    def chunks():  # type: ignore[no-untyped-def]
        yield first
        raise RuntimeError("chunk 2 failed")

    with pytest.raises(RuntimeError, match="chunk 2 failed"):
        shards._spill_client(a, shards.as_spilled(a, a.empty()), chunks(), tmp_path)
    assert list(tmp_path.iterdir()) == []


def run_partial(src: TableSource, a: Overcommit, ctx: OvercommitContext) -> dict:
    """``a``'s partial over the whole usage table of ``src``, in memory (no spill)."""
    from gpuclust.backends import get_backend
    from gpuclust.engine.partition import column_to_numpy

    usage = src.tables["instance_usage"]
    return a.partial({c: column_to_numpy(usage.column(c)) for c in a.columns}, ctx, get_backend("cpu"))


def test_bucketed_with_dask_threads_equals_flat() -> None:
    tables = _lifecycle_cell(6)
    a = Overcommit(bucket_s=300)
    ref = run(TableSource(tables, tier_map="notebook"), [a], partitions=2)
    got = run(TableSource(tables, tier_map="notebook", buckets=N_BUCKETS), [a], partitions=3, scheduler="threads")
    assert_results_same(ref, got, rtol=1e-9)


@pytest.mark.gpu
def test_bucketed_gpu_equals_cpu(gpu_backend) -> None:  # type: ignore[no-untyped-def]
    """On a bucketed source each partition's running intervals and their sums are built on the
    GPU (the partial, from the events bind read): the result equals the cpu backend's."""
    tables = _lifecycle_cell(9)
    a = Overcommit(bucket_s=600)
    src = TableSource(tables, tier_map="notebook", buckets=N_BUCKETS)
    ref = run(src, [a], partitions=3)
    assert ref["overcommit"]["info"].iloc[0]["pieces"] > 0
    assert_results_same(ref, run(src, [a], partitions=3, backend=gpu_backend.name), rtol=1e-9)


def test_bind_per_partition_covers_every_instance_once(monkeypatch: pytest.MonkeyPatch) -> None:
    tables = _lifecycle_cell(8)
    src = TableSource(tables, tier_map="notebook", buckets=N_BUCKETS)
    seen: list[tuple[str | None, int]] = []
    real = Overcommit.bind

    def spy(self, ctx, side, grain):  # type: ignore[no-untyped-def]
        seen.append((grain, side["instance_events"].num_rows))
        return real(self, ctx, side, grain)

    monkeypatch.setattr(Overcommit, "bind", spy)
    res = run(src, [Overcommit()], partitions=3)["overcommit"]
    total = tables["instance_events"].num_rows
    assert [g for g, _ in seen] == ["instance"] * 3 and sum(n for _, n in seen) == total
    assert res["info"].iloc[0]["event_rows"] == total


def _client_context(n_windows: int, tmp: Path, buckets: int | None) -> object:
    make_dataset(tmp, n_windows, machines=40, seed=1)
    ds = Dataset(tmp)
    src = TableSource(
        {t: ds.read(t) for t in TABLES if ds.num_rows(t)},
        tier_map=ds.tier_map_name,
        trace_version=ds.trace_version,
        buckets=buckets,
    )
    a = [Overcommit()]
    (ctx,) = contexts(a, src, per_partition=per_partition(src, a, plan_tables(src, a, 3)))
    return ctx


def test_client_context_on_a_bucketed_source_holds_nothing_per_instance(tmp_path: Path) -> None:
    small = _client_context(20_000, tmp_path / "s", N_BUCKETS)
    big = _client_context(160_000, tmp_path / "b", N_BUCKETS)
    for c in (small, big):
        assert isinstance(c, PerPartition)
        ctx = c.ctx
        assert isinstance(ctx, OvercommitContext)
        assert len(ctx.lookup) == 0 and ctx.events is None and ctx.client_events is None
    # 8x the instances and events: the shipped context does not grow (machines are the same 40)
    s, b = len(pickle.dumps(small)), len(pickle.dumps(big))
    assert b < 1.2 * s + 1024, (s, b)
    # the flat source binds on the client: the lookup and interval partial live there
    flat = _client_context(160_000, tmp_path / "f", None)
    assert not isinstance(flat, PerPartition) and len(flat.lookup) > 0 and flat.client_events is not None
    assert len(pickle.dumps(flat)) > 20 * b


@pytest.mark.slow
def test_finalize_memory_per_machine_bucket(tmp_path: Path) -> None:
    """Many machine-buckets (2,000 machines x 360 ten-second buckets): finalize writes the machine
    table as parts, a shard of 2^16 machine-buckets at a time, so its peak growth is a shard's
    keyed partials and a chunk of rows, not the table (~420 bytes a row; docs/analyses/overcommit.md,
    "Memory").  On a source bucketed by instance (here in memory, 2 buckets), whose partitions
    build the request intervals, and on the flat source, whose intervals the client builds at
    finalize a chunk of 2^16 machine-buckets at a time.  The child measures from the live memory
    (allocators' free memory released first), so the growth is what finalize allocates whatever
    the partials phase left free."""
    windows, machines = 200_000, 2000
    make_dataset(tmp_path / f"w{windows}_m{machines}", windows, machines=machines, seed=2)
    cells = ["--finalize-cells", str(1 << 15), "--shard-cells", str(1 << 16), "--client-cells", str(1 << 16)]
    for layout in (["--buckets", "2"], []):
        out = subprocess.run(
            [sys.executable, str(BENCH / "overcommit_memory.py"), "--child", "--windows", str(windows)]
            + ["--machines", str(machines), "--bucket-s", "10", "--partitions", "2", *cells, "--data", str(tmp_path)]
            + layout,
            capture_output=True,
            text=True,
            check=True,
        )
        m = json.loads(out.stdout.strip().splitlines()[-1])
        assert m["machine_buckets"] >= 700_000 and m["machine_parts"] >= 10
        # the machine table (~420 B a row, ~300 MB here) never is in memory: growth is a constant
        # (summary passes, pyarrow's writer; ~40 MiB) plus a shard's keyed partials while they are
        # merged (~365 B per machine-bucket of the shard): measured 55-67 MiB here with 2^16, 47
        # with 2^14, 129 with 2^18; a flat source adds a chunk of its intervals (~200 B per
        # machine-bucket of the chunk): 73-74 MiB with chunks of 2^16 (207 built whole)
        growth = m["finalize_growth_per_mb"] * m["machine_buckets"]
        why = f"{layout or 'flat'}: finalize grew {growth / 2**20:.1f} MiB: {m}"
        assert growth < 64 * 2**20 + (1 << 16) * (800 if layout else 1100), why
        assert growth < 0.4 * m["machine_rows"] * 420, why
