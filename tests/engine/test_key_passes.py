"""Parted analyses in passes over key ranges (gpuclust/engine/key_passes.py): on a device whose
room for dense keyed sums is a fraction of what they need, the local path runs each such analysis
in passes of one range of machines each, spills nothing, and gives the bits of one pass."""

from __future__ import annotations

import numpy as np
import pytest
from device_backend import DEVICE_GPU, resolve_gpu_to_device
from strategies import assert_results_same, random_cell, write_dataset

from gpuclust.analyses import cpi, overcommit
from gpuclust.analyses.kinds import Fields
from gpuclust.analyses.registry import create
from gpuclust.engine import key_passes, local, shards
from gpuclust.engine.local import context_of, run
from gpuclust.parted import PartedTable

DENSE = ("overcommit", "cpi", "machine-utilization")


def _read(res):
    return {a: {t: v.read() if isinstance(v, PartedTable) else v for t, v in tabs.items()} for a, tabs in res.items()}


def _cell(tmp_path_factory, machines: int):
    cell = random_cell(41, n_machines=machines, n_windows=6000)
    return write_dataset(tmp_path_factory.mktemp("cell"), cell, files=3, row_group_size=500)


@pytest.fixture(scope="module")
def cell(tmp_path_factory):
    """The cell the tests read (each run writes its tables under its own folder): 8 machines, so
    that 4 passes of whole machines each take a 4th of them."""
    return _cell(tmp_path_factory, 8)


@pytest.fixture(scope="module")
def cell_20(tmp_path_factory):
    """A cell of 20 machines: 5 passes of whole machines take a 5th of them each, 4 passes a 4th
    (so that a first pass fits beside the room's other accumulators)."""
    return _cell(tmp_path_factory, 20)


@pytest.fixture(scope="module")
def one_pass():
    """The tables of a run with room for every dense sum, by the settings it ran with: the same run
    is the reference of the cases that differ only in the room they are given."""
    return {}


@pytest.fixture(params=["device-shaped", pytest.param("gpu", marks=pytest.mark.gpu)])
def device(request, monkeypatch):
    """The device backend and how close its two runs' tables must be: the device-shaped one's
    are the same bits; a GPU's kernels add with atomics, in no set order."""
    if request.param == "gpu":
        return request.getfixturevalue("gpu_backend"), 1e-9
    resolve_gpu_to_device(monkeypatch)
    return DEVICE_GPU, 0.0


@pytest.mark.parametrize("from_context", [True, False])
@pytest.mark.parametrize(("name", "parts"), [("overcommit", 5), ("cpi", 4)])
def test_dense_sums_past_the_device_room_run_in_passes_with_the_same_bits(
    cell_20, one_pass, tmp_path, monkeypatch, device, name, parts, from_context, request
):
    """The device's room for dense sums (four tenths of its free memory) made a ``parts``-th of
    what ``name``'s need (overcommit's 78 MB, cpi's 0.67 MB here) beside the smaller accumulators
    placed before it (overcommit's: cpi's and machine-utilization's): ``name`` runs in that many passes
    (the others on the device where they fit, else machine-utilization's on the host and
    overcommit's spilled, where it would take more than the most passes), nothing of it spilled,
    and every table has the bits of a run with room for them all (on a GPU: to 1e-9).  Its shards
    follow from its context, so the run's own stream takes the first pass' keys: ``parts - 1``
    streams run again.  (``from_context``: a shard rule that reads the rest, where the run's
    stream takes no key and every pass streams again.)"""
    be, rtol = device
    monkeypatch.setattr(overcommit, "SHARD_CELLS", 1)  # a machine a shard (20; 1 << 18 cells by default)
    monkeypatch.setattr(cpi, "SHARD_KEYS", 1)
    if not from_context:
        monkeypatch.setattr(Fields, "context_shards", lambda self, ctx, on_device: None)
    key = (request.node.callspec.params["device"], from_context)  # (the run does not depend on name or parts)
    if key not in one_pass:
        one_pass[key] = _read(run(cell_20, list(DENSE), backend=be, partitions=3, parts_dir=tmp_path / "one"))
    one = one_pass[key]
    a = create(name)
    need = {n: shards.dense_plan(create(n), context_of(create(n), cell_20), True)[1] for n in DENSE}
    # the room: a parts-th of name's need, beside the smaller accumulators placed before its first pass
    beside = sum(v for n, v in need.items() if n != name and v <= need[name] / parts)
    free = int((need[name] / parts + beside) / shards.DEVICE_DENSE_SHARE) + 1
    monkeypatch.setattr(shards, "device_free_bytes", lambda be: free)
    passes, streams, spilled = {}, {}, []
    real_finalize, real_write = key_passes.KeyPasses.finalize, shards.write_keyed

    def spy_finalize(self, a, *args, **kw):
        real_stream = self.stream
        self.stream = lambda target: streamed.append(target) or real_stream(target)
        try:
            return real_finalize(self, a, *args, **kw)
        finally:
            passes[a.name], streams[a.name] = self.passes, self.streams

    monkeypatch.setattr(key_passes.KeyPasses, "finalize", spy_finalize)
    monkeypatch.setattr(shards, "write_keyed", lambda *a: spilled.append(a) or real_write(*a))
    streamed = []
    got = _read(run(cell_20, list(DENSE), backend=be, partitions=3, parts_dir=tmp_path / "passes"))
    assert passes == {name: parts} and streams == {name: parts - from_context}
    # nothing of it spilled (with cpi's room, overcommit's partials would take 470 passes: spilled)
    assert [sorted(keyed) for _, keyed in spilled] == ([] if name == "overcommit" else [["inst", "req", "usage"]] * 3)
    assert len(streamed) == parts - from_context and all(
        t.dense and all(d.clip for d in t.dense.values()) for t in streamed
    )
    assert_results_same(one, got, rtol=rtol)
    for t in a.parted:  # its parted tables in machine order across the passes, as in one pass
        x, y = (np.asarray(r[name][t]["machine_id"]) for r in (one, got))
        np.testing.assert_array_equal(x, y)


def test_past_the_most_passes_the_keyed_partials_are_spilled(cell, tmp_path, monkeypatch):
    resolve_gpu_to_device(monkeypatch)
    monkeypatch.setattr(shards, "device_free_bytes", lambda be: 20)  # room for 8 bytes
    spilled = []
    real_write = shards.write_keyed
    monkeypatch.setattr(shards, "write_keyed", lambda *a: spilled.append(a) or real_write(*a))
    got = _read(run(cell, ["overcommit"], backend=DEVICE_GPU, partitions=3, parts_dir=tmp_path / "spilled"))
    assert len(spilled) == 3
    want = _read(run(cell, ["overcommit"], backend="cpu", partitions=3, parts_dir=tmp_path / "cpu"))
    assert_results_same(want, got, rtol=1e-9)


def test_where_one_shard_holds_every_key_the_sums_stay_dense_on_the_device(cell, tmp_path, monkeypatch):
    """A room short of overcommit's need, but its keys in one shard (its default size here): a
    pass would take them all, so they are added on the device as where they fit, in the run's
    one stream (no key passes, nothing spilled), with the same bits."""
    resolve_gpu_to_device(monkeypatch)
    one = _read(run(cell, ["overcommit"], backend=DEVICE_GPU, partitions=3, parts_dir=tmp_path / "one"))
    a = create("overcommit")
    ctx = context_of(a, cell)
    assert len(a.kinds.context_shards(ctx, on_device=True)) == 1
    free = int(shards.dense_plan(a, ctx, True)[1] / 3 / shards.DEVICE_DENSE_SHARE)
    monkeypatch.setattr(shards, "device_free_bytes", lambda be: free)
    targets = []
    real = key_passes.key_passes

    def spy(*args):
        out = real(*args)
        targets.extend(out)
        return out

    monkeypatch.setattr(local, "key_passes", spy)
    spilled = []
    real_write = shards.write_keyed
    monkeypatch.setattr(shards, "write_keyed", lambda *a: spilled.append(a) or real_write(*a))
    got = _read(run(cell, ["overcommit"], backend=DEVICE_GPU, partitions=3, parts_dir=tmp_path / "dense"))
    (target,) = [t for t in targets if t is not None]
    assert isinstance(target, shards.DenseKeys) and target.on_device and not spilled
    assert_results_same(one, got, rtol=0)


def test_the_shards_of_the_context_are_those_of_the_run():
    """``Fields.context_shards``: an ``Even`` rule's shards from the context alone are those
    ``shards`` cuts from a merged rest; a rule that reads the rest gives None."""
    from gpuclust.analyses.kinds import Counted, Even

    rule = Even(lambda ctx: 10, lambda ctx: 3, size=9, device=4)
    assert rule.ranges(None, {}, True) == rule.ranges(None, {"n": [1, 2]}, True) != rule.ranges(None, {}, False)
    assert Even.from_context and not Counted.from_context
    for name in DENSE:
        a = create(name)
        assert a.kinds.shard_by is not None and a.kinds.shard_by.from_context, name


def test_the_first_passes_the_runs_stream_takes_share_the_room(cell, tmp_path, monkeypatch):
    """Two analyses in passes (overcommit twice, 300 s and 301 s buckets: about the same need,
    3.5 rooms): the run's own stream takes the first pass of the first (7/8 of the room), not of
    the second (no room left): it streams every one of its passes.  The tables are those of a run
    with room for both, bit for bit."""
    from pathlib import Path

    from gpuclust.analyses.overcommit import Overcommit

    resolve_gpu_to_device(monkeypatch)
    monkeypatch.setattr(overcommit, "SHARD_CELLS", 1)
    ans = [Overcommit(), Overcommit(bucket_s=301)]
    one = _read(run(cell, ans, backend=DEVICE_GPU, partitions=3, parts_dir=tmp_path / "one"))
    ctxs = [context_of(a, cell) for a in ans]
    need = shards.dense_plan(ans[0], ctxs[0], True)[1]
    free = int(need / 3.5 / shards.DEVICE_DENSE_SHARE)
    monkeypatch.setattr(shards, "device_free_bytes", lambda be: free)
    targets = key_passes.key_passes(ans, ctxs, [Path("x"), Path("y")], DEVICE_GPU, lambda k, t: None)
    assert [type(t).__name__ for t in targets] == ["KeyPasses", "KeyPasses"]
    assert targets[0].first is not None and targets[1].first is None
    got = _read(run(cell, ans, backend=DEVICE_GPU, partitions=3, parts_dir=tmp_path / "passes"))
    assert_results_same(one, got, rtol=0)


def test_one_room_holds_every_dense_sum_the_largest_first(cell, tmp_path, monkeypatch):
    """The run's dense sums share one room: made to hold overcommit's and machine-utilization's
    but not cpi's beside them, the largest (overcommit's) is placed first, machine-utilization's
    in what is left, and cpi (which alone would fit) runs in a pass of its own, streamed again at
    its finalize, after the others have finalized.  The accumulators on the device never pass the
    room, and the tables are those of a run with room for all, bit for bit."""
    resolve_gpu_to_device(monkeypatch)
    ans = list(reversed(DENSE))  # (the smallest first: placed in that order, cpi's would take overcommit's room)
    one = _read(run(cell, ans, backend=DEVICE_GPU, partitions=3, parts_dir=tmp_path / "one"))
    need = {n: shards.dense_plan(create(n), context_of(create(n), cell), True)[1] for n in DENSE}
    total = need["overcommit"] + need["machine-utilization"] + (need["cpi"] - need["machine-utilization"]) // 2
    assert need["cpi"] < total and need["overcommit"] > need["cpi"] > need["machine-utilization"]
    free = int(total / shards.DEVICE_DENSE_SHARE) + 1
    monkeypatch.setattr(shards, "device_free_bytes", lambda be: free)
    targets, finalized = {}, []
    real_kp = local.key_passes

    def spy_kp(ans, ctxs, spills, be, stream, room):
        out = real_kp(ans, ctxs, spills, be, stream, room)
        if {a.name for a in ans} == set(DENSE):  # (not cpi's prerequisite pass)
            targets.update({a.name: t for a, t in zip(ans, out, strict=True)})
            assert room.total <= total and 0 <= room.left < need["cpi"]
        return out

    monkeypatch.setattr(local, "key_passes", spy_kp)
    for name in DENSE:  # the order the analyses finalize in
        cls = type(create(name))
        real = cls.finalize_shard
        monkeypatch.setattr(
            cls, "finalize_shard", lambda self, *a, _r=real, **k: finalized.append(self.name) or _r(self, *a, **k)
        )
    got = _read(run(cell, ans, backend=DEVICE_GPU, partitions=3, parts_dir=tmp_path / "room"))
    on_device = {n for n, t in targets.items() if isinstance(t, shards.DenseKeys) and t.on_device}
    assert on_device == {"overcommit", "machine-utilization"}
    assert isinstance(targets["cpi"], key_passes.KeyPasses) and targets["cpi"].first is None
    assert sum(targets[n].nbytes for n in on_device) <= total
    assert finalized and finalized[-1] == "cpi" and set(finalized[: finalized.index("cpi")]) == on_device
    assert_results_same(one, got, rtol=0)
