"""job-usage's cpu path (gpuclust/analyses/_job_groups.py): the key table against a dict, the
partial against the generic path (``JobUsage._by_code`` / ``_by_sort``, what the gpu backend
runs) bit for bit, the dense partials' merges, and whole runs against the generic path."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest
from generic_backend import CPU, GENERIC
from hypothesis import given, settings
from hypothesis import strategies as st
from strategies import examples, random_cell, write_dataset

import gpuclust.analyses._job_groups as jg
from gpuclust.analyses import job_usage as ju
from gpuclust.analyses._job_stats import by_usage
from gpuclust.analyses._lookup import InstanceLookup
from gpuclust.analyses.job_usage import JobUsage, JobUsageContext
from gpuclust.dataset import Dataset
from gpuclust.engine import run
from gpuclust.schema import tier_map
from gpuclust.tables import convert

IDS = st.sampled_from([0, 1, 2, 3, -1, 2**40 + 1, 2**62 + 9, -(2**63), 2**63 - 1])


@settings(max_examples=examples(80), deadline=None)
@given(
    keys=st.lists(st.tuples(IDS, st.integers(-3, 3), IDS), max_size=40, unique=True),
    queries=st.lists(st.tuples(IDS, st.integers(-3, 3), IDS), max_size=60),
    spare=st.integers(0, 2),
    shuffle=st.randoms(use_true_random=False),
)
def test_key_table_finds_exactly_the_keys(keys, queries, spare, shuffle):
    """Every query finds its key's collection code and position, and nothing else (keys of 0, of
    extreme ids and of colliding home slots included, in any order); the priorities are the
    maxima over the marked keys, -1 for codes without keys (``spare`` codes after the keys')."""
    shuffle.shuffle(keys)
    c = np.array([k[0] for k in keys], np.int64)
    i = np.array([k[1] for k in keys], np.int32)
    m = np.array([k[2] for k in keys], np.int64)
    colls, code = np.unique(c, return_inverse=True)
    prio = np.arange(len(keys), dtype=np.int32) % 5 - 1
    t = jg.KeyTable(c, i, m, code.reshape(-1), prio, colls.shape[0] + spare)
    q = queries + keys
    qc = np.array([k[0] for k in q], np.int64)
    qi = np.array([k[1] for k in q], np.int32)
    qm = np.array([k[2] for k in q], np.int64)
    got, pos = t.find(qc, qi, qm)
    want = {k: int(code.reshape(-1)[j]) for j, k in enumerate(keys)}
    assert got.tolist() == [want.get(k, -1) for k in q]
    assert (pos[got < 0] == t.n).all()  # the sentinel
    for j in np.flatnonzero(got >= 0):
        r = t.keys[pos[j]]
        assert (int(r["c"]), int(r["i"]), int(r["m"])) == q[j]
    marked = np.zeros(t.n, dtype=bool)
    marked[pos[got >= 0]] = True
    pr = t.priorities(marked)
    key_prio = {k: int(prio[j]) for j, k in enumerate(keys)}
    hit = {q[j] for j in np.flatnonzero(got >= 0)}
    assert pr.shape == (colls.shape[0] + spare,) and (pr[colls.shape[0] :] == -1).all()
    for cc, coll in enumerate(colls.tolist()):
        assert pr[cc] == max([key_prio[k] for k in hit if k[0] == coll], default=-1)


def test_key_table_small_blocks_and_probes(monkeypatch):
    """Many keys in a small table (long probe runs), queried a few rows per block."""
    rng = np.random.default_rng(3)
    keys = np.unique(
        np.stack([rng.integers(0, 300, 3000), rng.integers(0, 4, 3000), rng.integers(0, 9, 3000)], 1), axis=0
    )
    colls, code = np.unique(keys[:, 0], return_inverse=True)
    t = jg.KeyTable(
        keys[:, 0],
        keys[:, 1].astype(np.int32),
        keys[:, 2],
        code.reshape(-1),
        np.zeros(keys.shape[0], np.int32),
        colls.shape[0],
    )
    q = np.stack([rng.integers(0, 320, 5000), rng.integers(0, 5, 5000), rng.integers(0, 10, 5000)], 1)
    got, _ = t.find(q[:, 0], q[:, 1].astype(np.int32), q[:, 2])
    index = {tuple(k): int(cc) for k, cc in zip(keys.tolist(), code.reshape(-1).tolist(), strict=True)}
    assert got.tolist() == [index.get(tuple(k), -1) for k in q.tolist()]


def _ctx(seed: int, n_keys: int = 400) -> JobUsageContext:
    rng = np.random.default_rng(seed)
    keys = np.unique(
        np.stack([rng.integers(0, 60, n_keys), rng.integers(0, 5, n_keys), rng.integers(1, 9, n_keys)], axis=1), axis=0
    )
    prio = np.where(rng.random(keys.shape[0]) < 0.2, -1, rng.integers(0, 400, keys.shape[0])).astype(np.int32)
    lk = InstanceLookup.build(keys[:, 0], keys[:, 1], keys[:, 2], prio)
    colls, key_coll = np.unique(lk.collection, return_inverse=True)
    return JobUsageContext(tier_map("notebook"), lk, colls, key_coll.reshape(-1).astype(np.int64))


def _cols(seed: int, n: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed + 100)
    s = rng.integers(0, 10**12, n)
    e = s + rng.choice(np.array([300_000_000, 0, -5, 7_200_000_017]), n, p=[0.85, 0.05, 0.05, 0.05])
    e[rng.random(n) < 0.02] = 2**63 - 1
    cpu = rng.gamma(0.5, 0.3, n).astype(np.float32)
    cpu[rng.random(n) < 0.05] = np.nan
    cpu[rng.random(n) < 0.01] = np.inf
    mem = rng.gamma(0.5, 0.3, n).astype(np.float32)
    mem[rng.random(n) < 0.03] = np.nan
    ct = rng.choice(np.array([0, 1], np.int8), n, p=[0.9, 0.1])
    alloc = np.where(rng.random(n) < 0.7, 0, 2**35).astype(np.int64)
    alloc[rng.random(n) < 0.2] = np.iinfo(np.int64).min  # NULL
    return {
        "start_time": s,
        "end_time": e,
        "collection_id": rng.integers(0, 80, n),  # 60..79: no events
        "instance_index": rng.integers(0, 6, n).astype(np.int32),  # instance 5: no events
        "machine_id": rng.integers(1, 10, n),
        "collection_type": ct,
        "alloc_collection_id": alloc,
        "avg_cpu": cpu,
        "avg_mem": mem,
    }


def _compact(p: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """A partial's collections with windows, as the generic path keys them (extras merged in)."""
    keep = p["windows"] > 0
    out = {f: np.asarray(p[f])[keep] for f in ju._FIELDS}
    if p["xkey"].shape[0]:
        from gpuclust.partials import merge_keyed

        out = merge_keyed(out, {f: p["x" + f] for f in ju._FIELDS}, maxima=("prio",))
    return out


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("rows", ["jobs", "top-level"])
@pytest.mark.parametrize("block", [64, jg.BLOCK])
def test_partial_equals_generic_path(seed, rows, block, monkeypatch):
    """The cpu path's partial holds the generic path's sums, windows and priorities bit for bit
    (NULL and infinite averages, bad durations, rows of other types or inside allocs, keys and
    collections without events), a block of rows at a time or in one block."""
    monkeypatch.setattr(jg, "BLOCK", block)
    ctx = _ctx(seed)
    cols = _cols(seed, 3000)
    a = JobUsage(rows=rows)
    fast = a.partial(cols, ctx, CPU)
    slow = a.partial(cols, ctx, GENERIC)
    assert fast["key"] is ctx.collections  # dense: every code of the lookup
    assert fast["xkey"].shape[0] > 0 and slow["xkey"].shape[0] == 0
    np.testing.assert_array_equal(fast["stats"], slow["stats"])
    got = _compact(fast)
    for f in ju._FIELDS:
        assert got[f].dtype == slow[f].dtype, f
        np.testing.assert_array_equal(got[f], slow[f], err_msg=f)
    # every row counting (no gathers)
    every = {k: v for k, v in cols.items()}
    every["end_time"] = every["start_time"] + 1000
    every["collection_type"] = np.zeros(3000, np.int8)
    every["alloc_collection_id"] = np.zeros(3000, np.int64)
    fast, slow = a.partial(every, ctx, CPU), a.partial(every, ctx, GENERIC)
    assert int(fast["stats"][1]) == 3000
    got = _compact(fast)
    for f in ju._FIELDS:
        np.testing.assert_array_equal(got[f], slow[f], err_msg=f)


def test_dense_partials_merge_and_finalize_as_keyed_ones():
    """Partials of the cpu path (dense over the lookup, extras apart), of the generic path and of
    no rows merge in any order to the same result as the generic path's."""
    ctx = _ctx(5)
    a = JobUsage()
    parts = [_cols(s, n) for s, n in ((1, 2000), (2, 1500), (3, 2500))]
    parts.append({k: v[:0] for k, v in parts[0].items()})  # an empty partition
    fast = [a.partial(p, ctx, CPU) for p in parts]
    slow = [a.partial(p, ctx, GENERIC) for p in parts]
    want = a.empty()
    for p in slow:
        want = a.kinds.merge(want, p)
    want = convert({"r": a.finalize(want, ctx)}, "pandas")["r"]
    for seq in (fast, fast[::-1], [fast[0], slow[1], fast[2], slow[3]], [slow[0], fast[1], slow[2], fast[3]]):
        acc = a.empty()
        for p in seq:
            acc = a.kinds.merge(acc, p)
        got = convert({"r": a.finalize(acc, ctx)}, "pandas")["r"]
        for k in want:
            pd.testing.assert_frame_equal(got[k], want[k], check_exact=False, rtol=1e-12)
    # in partition order, as the engine merges: bit for bit, the dense partials added elementwise
    # (their key array kept: not merge_keyed's copy)
    acc = a.empty()
    for p in fast:
        acc = a.kinds.merge(acc, p)
    assert acc["key"] is ctx.collections and acc["xkey"].shape[0] > 0
    got = convert({"r": a.finalize(acc, ctx)}, "pandas")["r"]
    for k in want:
        pd.testing.assert_frame_equal(got[k], want[k], check_exact=True)


def _events_missing(tables: dict[str, pa.Table], seed: int) -> dict[str, pa.Table]:
    """Drop the events of about a third of the collections (their windows: collections absent
    from the lookup) and of some instances."""
    ev = tables["instance_events"]
    rng = np.random.default_rng(seed)
    c = ev.column("collection_id").to_numpy()
    drop = set(rng.choice(np.unique(c), max(1, len(np.unique(c)) // 3), replace=False).tolist())
    keep = np.array([int(x) not in drop for x in c]) & (rng.random(len(c)) < 0.9)
    return {**tables, "instance_events": ev.filter(pa.array(keep))}


@pytest.mark.parametrize("seed, rows", [(1, "jobs"), (2, "top-level")])
def test_runs_equal_generic_path(tmp_path, seed, rows, monkeypatch):
    """Whole runs (several partitions on two threads) give the generic path's tables exactly."""
    tables = random_cell(seed, n_windows=6000)
    u = tables["instance_usage"]
    rng = np.random.default_rng(seed)
    ct = [None if r < 0.01 else int(r < 0.2) for r in rng.random(u.num_rows)]  # jobs, alloc sets, NULL
    idx = u.schema.get_field_index("collection_type")
    tables["instance_usage"] = u.set_column(idx, u.schema.field(idx), pa.array(ct, type=pa.int8()))
    tables = _events_missing(tables, seed)
    ds = Dataset(write_dataset(tmp_path / "ds", tables, files=3, row_group_size=700))
    a = JobUsage(rows=rows, tail=0.3)
    got = run(ds, a, partitions=5, workers=2)["job-usage"]
    monkeypatch.setattr(ju, "_MAX_TABLE_KEYS", 0)  # the generic path
    want = run(ds, a, partitions=5, workers=2)["job-usage"]
    assert (got["jobs"]["tier"] == "unknown").any()
    for k in want:
        pd.testing.assert_frame_equal(got[k], want[k], check_exact=True)


def test_no_events_at_all(tmp_path):
    """Without instance_events every collection's tier is unknown (the generic path runs)."""
    tables = random_cell(4, n_windows=2000)
    tables.pop("instance_events")
    ds = Dataset(write_dataset(tmp_path / "ds", tables))
    res = run(ds, JobUsage(rows="top-level"), partitions=2)["job-usage"]
    assert len(res["jobs"]) > 0 and (res["jobs"]["tier"] == "unknown").all()


@settings(max_examples=examples(80), deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from([0.0, -0.0, 1.0, 2.5, 3.0, float("nan"), float("inf")]), st.integers(-(2**63), 2**63 - 1)
        ),
        max_size=30,
        unique_by=lambda t: t[1],
    )
)
def test_order_by_usage_is_pandas_sort(rows):
    cpu = np.array([r[0] for r in rows], np.float64)
    key = np.array([r[1] for r in rows], np.int64)
    want = pd.DataFrame({"k": key, "x": cpu}).sort_values(["x", "k"], ascending=[False, True], kind="stable")
    assert by_usage(cpu, key).tolist() == want.index.tolist()
    from device_backend import DEVICE, resolve_gpu_to_device

    with pytest.MonkeyPatch.context() as mp:
        resolve_gpu_to_device(mp)  # (the device arrays' backend)
        on_device = by_usage(DEVICE.asarray(cpu), DEVICE.asarray(key))  # the same order where a gpu run sorts
    assert on_device.get().tolist() == want.index.tolist()


def test_columns_follow_the_rows_rule():
    assert "alloc_collection_id" not in JobUsage().columns and "collection_type" in JobUsage().columns
    top = JobUsage(rows="top-level").columns
    assert "alloc_collection_id" in top and "collection_type" not in top


def test_merge_of_same_keys_is_merge_keyed():
    """Partials over one key array merge elementwise, keeping the array (no copies), as
    merge_keyed merges them: NaN sums counted as 0, infinities, priorities by maximum; a partial
    without keys gives the other."""
    from gpuclust.partials import merge_keyed

    key = np.array([2, 5, 9, 11], np.int64)
    a = {
        "key": key,
        "cpu": np.array([1.0, np.nan, 2.0, np.inf]),
        "mem": np.array([0.5, 1.0, 0.0, 3.0]),
        "windows": np.array([1, 2, 0, 4], np.int64),
        "prio": np.array([-1, 3, 7, 0], np.int64),
    }
    b = {
        "key": key,
        "cpu": np.array([0.25, 1.0, np.nan, -np.inf]),
        "mem": np.array([1.0, 2.0, 3.0, 4.0]),
        "windows": np.array([0, 1, 2, 3], np.int64),
        "prio": np.array([5, 2, -1, 0], np.int64),
    }
    for x, y in ((a, b), (b, a), (a, a)):
        with np.errstate(over="ignore", invalid="ignore"):  # merge_keyed: an infinity as the largest float
            got = ju._merge_same_keys(x, y)
            want = merge_keyed(
                {k: v.copy() for k, v in x.items()}, {k: v.copy() for k, v in y.items()}, maxima=("prio",)
            )
        assert got is not None and got["key"] is key
        for f in ju._FIELDS:
            assert got[f].dtype == want[f].dtype, f
            np.testing.assert_array_equal(got[f], want[f], err_msg=f)
    empty = {f: v[:0] for f, v in a.items()}
    assert ju._merge_same_keys(empty, a)["cpu"] is a["cpu"] and ju._merge_same_keys(b, empty)["cpu"] is b["cpu"]
    assert ju._merge_same_keys(a, {**b, "key": key.copy()}) is None  # another key array: merge_keyed's work
