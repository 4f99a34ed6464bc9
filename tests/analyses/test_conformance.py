"""Conformance checks applied to every registered analysis (and every choice of its options).

For each analysis: ``empty`` is a merge identity; ``merge`` is commutative and associative; the
result does not depend on how the table is cut (between instances, for an analysis that needs
whole instances: ``Analysis.whole_instances``); empty, all-NULL and single-row (single-instance)
inputs work.  Float
sums are not bitwise order-invariant, so results are compared to 1e-12 relative.  Runs on every
backend (the gpu case is marked ``gpu``); the empty and single-row checks (every cut of a
table, so every small selection) also on the device-shaped backend (``tests/device_backend.py``: the gpu backend's code paths on NumPy arrays
that refuse what CuPy and its arrays refuse), so edge cases that would fail only on a device fail
in CI.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from strategies import cell, examples

from gpuclust.analyses import REGISTRY, create
from gpuclust.analyses.base import Analysis, to_host
from gpuclust.analyses.kinds import Fields, Kind, Shards
from gpuclust.backends import get_backend
from gpuclust.engine import TableSource
from gpuclust.engine.local import context_of
from gpuclust.engine.partition import column_to_numpy
from gpuclust.tables import as_pandas


def instances():
    out = {}
    for name, entry in REGISTRY.items():
        out[name] = create(name)
        for opt in entry.options:
            # the first two choices of every option (time budget); of a tier map, one (the maps are
            # data, each checked in tests/test_tiers.py: the laws here do not depend on which)
            for choice in (opt.choices or ())[: 1 if opt.name == "tier_map" else 2]:
                a = create(name, **{opt.name: choice})
                out[a.label] = a
    return out


INSTANCES = instances()
#: 12 cells for each analysis and option under the ``dev`` profile, 6 under ``ci`` (x36 instances:
#: about 220 random cells per law, new ones every run), 60 under ``thorough``.
SETTINGS = settings(
    max_examples=examples(12, least=6),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


def partial_of(a, t: pa.Table, ctx, backend):
    cols = {c: backend.asarray(column_to_numpy(t.column(c))) for c in a.columns}
    return to_host(a.partial(cols, ctx, backend))


def host_frames(r):
    """A result's tables as :func:`assert_results_equal` compares them (prepared once when one
    result is compared with several): an Arrow table as it is, anything else as a pandas
    DataFrame with a fresh index."""
    return {k: v if isinstance(v, pa.Table) else as_pandas(v).reset_index(drop=True) for k, v in r.items()}


def assert_results_equal(r1, r2, rtol=1e-12):
    """Two results have the same tables, each with the same columns (in order) and rows: float
    columns to ``rtol`` (NaN where NaN, NULL read as NaN), the others exactly."""
    assert r1.keys() == r2.keys()
    f1, f2 = host_frames(r1), host_frames(r2)
    for k in r1:
        a, b = f1[k], f2[k]
        if isinstance(a, pa.Table) and isinstance(b, pa.Table) and a.schema.types == b.schema.types:
            _assert_arrow_equal(k, a, b, rtol)
            continue
        a, b = (as_pandas(x).reset_index(drop=True) if isinstance(x, pa.Table) else x for x in (a, b))
        assert list(a.columns) == list(b.columns)
        assert len(a) == len(b), (k, a, b)
        for (c, x), (_, y) in zip(a.items(), b.items(), strict=True):  # the same columns, in order
            if x.dtype.kind == "f":
                _assert_close(x.to_numpy(), y.to_numpy(), rtol)
            else:
                assert x.tolist() == y.tolist(), (k, c)


def _assert_close(x: np.ndarray, y: np.ndarray, rtol: float) -> None:
    """``assert_allclose`` to ``rtol`` (NaN where NaN), after the quick test that passes arrays
    equal bit for bit (the common case here: it skips the assertion's overhead)."""
    if x.dtype.kind == y.dtype.kind == "f" and x.shape == y.shape and np.array_equal(x, y, equal_nan=True):
        return
    np.testing.assert_allclose(x, y, rtol=rtol, atol=1e-300, equal_nan=True)


def _assert_arrow_equal(k, a: pa.Table, b: pa.Table, rtol: float) -> None:
    """Two Arrow tables of the same column types, compared in Arrow (converting each to pandas
    cost more than the analyses' finalize): a float column as NumPy (NULL as NaN) to ``rtol``,
    any other (integers too, with or without NULLs) exactly, NULL where NULL."""
    assert a.column_names == b.column_names
    assert a.num_rows == b.num_rows, (k, a, b)
    for c, x, y in zip(a.column_names, a.columns, b.columns, strict=True):
        if pa.types.is_floating(x.type):
            _assert_close(x.to_numpy(zero_copy_only=False), y.to_numpy(zero_copy_only=False), rtol)
        else:
            assert x.equals(y) or x.to_pylist() == y.to_pylist(), (k, c)


def cuttable(analysis, t: pa.Table) -> tuple[pa.Table, list[int]]:
    """``t`` and the row positions it may be cut at: anywhere, or, for an analysis that needs
    whole instances, between instances of ``t`` grouped by instance (a stable sort: each
    instance's rows keep their order)."""
    n = t.num_rows
    if not analysis.whole_instances:
        return t, list(range(n + 1))
    keys = list(getattr(analysis, "key_columns", ("collection_id", "instance_index")))
    t = t.take(pc.sort_indices(t, sort_keys=[(k, "ascending") for k in keys]))
    rows = list(zip(*(t.column(k).to_pylist() for k in keys), strict=True))
    return t, [0, *(k for k in range(1, n) if rows[k] != rows[k - 1]), n]


@pytest.fixture(params=sorted(INSTANCES))
def analysis(request):
    return INSTANCES[request.param]


@pytest.fixture(params=["cpu", "device-shaped", pytest.param("gpu", marks=pytest.mark.gpu)])
def edge_backend(request):  # type: ignore[no-untyped-def]
    """``backend``'s cases and the device-shaped one (tests/device_backend.py: the gpu backend's
    code paths on NumPy arrays that refuse what CuPy arrays and CuPy refuse)."""
    if request.param == "device-shaped":
        from device_backend import DEVICE, resolve_gpu_to_device

        resolve_gpu_to_device(request.getfixturevalue("monkeypatch"))
        return DEVICE
    return request.getfixturevalue("gpu_backend") if request.param == "gpu" else get_backend("cpu")


def test_registry_covers_instances():
    assert {a.name for a in INSTANCES.values()} == set(REGISTRY)


#: The merge-side methods an analysis no longer writes: the engine derives them from ``kinds``.
RETIRED = ("merge", "merge_rest", "split", "key_range", "dense_keys", "keyed_rows", "empty", "shards")


def test_partials_are_declared_as_kinds():
    """Every analysis (each option choice) declares its partial as a ``Fields`` whose every entry
    is a known kind; it writes none of the retired merge methods; its tables that grow with the
    cell (``parted``) come with sharded keyed partials and a rule that cuts their shards, and the
    empty partial splits into them."""
    for label, a in INSTANCES.items():
        f = a.kinds
        assert isinstance(f, Fields) and f.kinds, label
        assert all(isinstance(k, Kind) for k in f.kinds.values()), label
        for cls in type(a).__mro__[:-1]:
            if cls is not Analysis and issubclass(cls, Analysis):
                assert not set(RETIRED) & set(vars(cls)), (label, cls, set(RETIRED) & set(vars(cls)))
        assert not a.parted or a.sharded, label
        assert isinstance(f.shard_by, Shards) == bool(a.sharded), label
        e = a.empty()
        if a.sharded:
            rest, keyed = f.split(e)
            assert set(keyed) == set(f.sharded) and all("key" in k for k in keyed.values()), label
            assert not set(keyed) & set(rest), label


#: The protocol (issue 34: at most 8 hooks).  What an analysis declares (data, or a function of
#: its options and the source that returns data) ...
DECLARATIONS = ("columns", "context_columns", "side_inputs", "needed_tables", "auto_rows", "prerequisites", "kinds")
#: ... and what it does: the behaviour hooks the engine calls.
HOOKS = ("context", "bind", "partial", "finalize", "client_partial", "finalize_shard", "finalize_parted", "summary")


def test_analyses_define_only_the_protocol():
    """An analysis overrides of :class:`Analysis` only its class variables, the declarations and
    at most 8 behaviour hooks; what the engine derives (``empty``, ``sharded``, ``label``, the
    options' checks) it never overrides."""
    assert len(HOOKS) <= 8
    base = {n for n in vars(Analysis) if not n.startswith("__")}
    class_vars = set(Analysis.__annotations__)
    assert set(DECLARATIONS) | set(HOOKS) <= base
    allowed = class_vars | set(DECLARATIONS) | set(HOOKS)
    for label, a in INSTANCES.items():
        for cls in type(a).__mro__[:-1]:
            if cls is not Analysis and issubclass(cls, Analysis):
                over = (set(vars(cls)) & (base | {"__post_init__"})) - allowed
                assert not over, (label, cls, over)


@SETTINGS
@given(tables=cell(), data=st.data())
def test_merge_laws_and_partition_invariance(analysis, backend, tables, data):
    src = TableSource(tables)
    ctx = context_of(analysis, src)
    t = tables[analysis.table]
    n = t.num_rows
    whole = partial_of(analysis, t, ctx, backend)
    # keyed rows: at most one per row read (the bound the engine keeps them on a device by)
    for name in analysis.kinds.rows:
        assert analysis.kinds.split(to_host(whole))[1][name]["key"].shape[0] <= n, name
    t, cuts = cuttable(analysis, t)
    full = host_frames(analysis.finalize(whole, ctx))  # prepared once, compared five times
    e = to_host(analysis.empty(backend))
    # identity
    assert_results_equal(analysis.finalize(analysis.kinds.merge(e, whole), ctx), full)
    assert_results_equal(analysis.finalize(analysis.kinds.merge(whole, e), ctx), full)
    # partition invariance, commutativity, associativity
    c1, c2 = sorted(data.draw(st.lists(st.sampled_from(cuts), min_size=2, max_size=2)))
    pa_, pb, pc = (partial_of(analysis, t.slice(lo, hi - lo), ctx, backend) for lo, hi in ((0, c1), (c1, c2), (c2, n)))
    left = analysis.kinds.merge(analysis.kinds.merge(pa_, pb), pc)
    right = analysis.kinds.merge(pa_, analysis.kinds.merge(pb, pc))
    swapped = analysis.kinds.merge(pc, analysis.kinds.merge(pb, pa_))
    for p in (left, right, swapped):
        assert_results_equal(analysis.finalize(p, ctx), full)


def test_empty_input(analysis, edge_backend):
    src = TableSource({})
    ctx = context_of(analysis, src)
    t = src.read(analysis.table)
    r_empty = analysis.finalize(to_host(analysis.empty(edge_backend)), ctx)
    r_part = analysis.finalize(partial_of(analysis, t, ctx, edge_backend), ctx)
    assert_results_equal(r_empty, r_part)
    assert all(len(df) == 0 for k, df in r_empty.items() if k != "info")


@SETTINGS
@given(tables=cell())
def test_all_null_input(analysis, backend, tables):
    nulled = {}
    for name, t in tables.items():
        cols = [pa.nulls(t.num_rows, f.type) if f.nullable else t.column(f.name) for f in t.schema]
        nulled[name] = pa.Table.from_arrays(cols, schema=t.schema)
    src = TableSource(nulled)
    ctx = context_of(analysis, src)
    res = analysis.finalize(partial_of(analysis, nulled[analysis.table], ctx, backend), ctx)
    assert all(isinstance(df, (pd.DataFrame, pa.Table)) for df in res.values())  # gpuclust.tables
    for df in map(as_pandas, res.values()):
        for c in ("cpu", "mem"):
            if c in df:
                assert df[c].isna().all()  # NULL capacity -> undefined normalisation


@SETTINGS
@given(tables=cell())
def test_single_rows(analysis, edge_backend, tables):
    src = TableSource(tables)
    ctx = context_of(analysis, src)
    t, cuts = cuttable(analysis, tables[analysis.table])
    acc = to_host(analysis.empty(edge_backend))
    for lo, hi in zip(cuts, cuts[1:], strict=False):
        acc = analysis.kinds.merge(acc, partial_of(analysis, t.slice(lo, hi - lo), ctx, edge_backend))
    assert_results_equal(
        analysis.finalize(acc, ctx), analysis.finalize(partial_of(analysis, t, ctx, edge_backend), ctx)
    )


def _leaves(obj):
    """The values of a partial's nested dicts / lists / tuples."""
    if isinstance(obj, dict):
        obj = list(obj.values())
    if isinstance(obj, (list, tuple)):
        return [leaf for v in obj for leaf in _leaves(v)]
    return [obj]


@settings(
    max_examples=examples(4),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(tables=cell(), gpu=st.booleans())
def test_device_partial_finalizes_where_it_is(analysis, tables, gpu, monkeypatch):
    """An analysis with ``device_partial`` finalizes a partial whose arrays are still on the device
    (as a local gpu study leaves it, nothing having merged it): the cpu's result, with no implicit
    conversion of a device array.  Marked as computed on the gpu, it finalizes there; marked cpu
    (a client without a device), on the host."""
    from device_backend import DEVICE, resolve_gpu_to_device

    if not analysis.device_partial:
        pytest.skip("its partials always reach finalize in host memory")
    src = TableSource(tables)
    ctx = context_of(analysis, src)
    t = tables[analysis.table]
    want = analysis.finalize(partial_of(analysis, t, ctx, get_backend("cpu")), ctx)
    with monkeypatch.context() as mp:
        resolve_gpu_to_device(mp)
        p = analysis.partial({c: DEVICE.asarray(column_to_numpy(t.column(c))) for c in analysis.columns}, ctx, DEVICE)
        assert any(hasattr(v, "__cuda_array_interface__") for v in _leaves(p))
        if "backend" in p:  # (a partial that says where it was computed)
            p = {**p, "backend": "gpu" if gpu else "cpu"}
        got = analysis.finalize(p, ctx)
    assert_results_equal(got, want)


@settings(
    max_examples=examples(4),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(tables=cell())
def test_finalize_on_the_device_shaped_backend(analysis, tables, monkeypatch):
    """A partial marked as computed on the gpu finalizes on the gpu backend (peak-prediction's
    simulation, overcommit's dense tables, the mixture inversion): with the gpu backend made the
    device-shaped one (tests/device_backend.py), the cpu's result."""
    from device_backend import resolve_gpu_to_device

    if "backend" not in analysis.empty():
        pytest.skip("finalized on the host whatever backend computed the partial")
    src = TableSource(tables)
    ctx = context_of(analysis, src)
    p = partial_of(analysis, tables[analysis.table], ctx, get_backend("cpu"))
    want = analysis.finalize(p, ctx)
    with monkeypatch.context() as mp:
        resolve_gpu_to_device(mp)
        got = analysis.finalize({**p, "backend": "gpu"}, ctx)
    assert_results_equal(got, want)
