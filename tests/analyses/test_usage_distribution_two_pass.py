"""``usage-distribution``'s ``exact-two-pass`` strategy: the same tables as the one-pass ``exact``
strategy (quantiles to 1e-9 relative, sums to 1e-12, counts equal), a second-pass partial that
grows with the distinct knots inside the brackets and not with the windows, and ``auto`` never
falling back to the bounded sketch.

The data of ``make_cell`` (tests/analyses/test_usage_distribution.py): point masses (idle lower
halves at 0, one-point windows), zero-weight windows (sample rate 0, zero length), NULL rates,
NULL percentiles, windows crossing time buckets, groups of one window.
"""

from __future__ import annotations

from pathlib import Path

import by_path
import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from strategies import examples, table

import gpuclust.engine as engine
from gpuclust.analyses import _hybrid_summary as hs
from gpuclust.analyses import _usage_distribution_refine as rf
from gpuclust.analyses import _usage_distribution_two_pass as tp
from gpuclust.analyses import mixture_summary as ms
from gpuclust.analyses.base import to_host
from gpuclust.analyses.usage_distribution import UsageDistribution
from gpuclust.backends import get_backend
from gpuclust.engine import TableSource
from gpuclust.engine.local import context_of
from gpuclust.engine.partition import column_to_numpy

CPU = get_backend("cpu")

# the sibling test module's make_cell
mix_ref = by_path.load("gpuclust_mixture_reference", Path(__file__).resolve().parents[1] / "mixture" / "reference.py")
make_cell = by_path.load(
    "gpuclust_test_usage_distribution", Path(__file__).with_name("test_usage_distribution.py")
).make_cell
BYS = [("machine",), ("tier",), ("cell",), ("machine", "time")]


@pytest.fixture(scope="module")
def cell():
    return make_cell(2, n_windows=400, n_instances=40)


def assert_same(got, want):
    """The ``quantiles`` and ``naive`` tables equal: same columns, groups and counts; quantiles
    and the naive table to 1e-9 relative, other floats to 1e-12."""
    for name in ("quantiles", "naive"):
        a, b = got[name], want[name]
        assert list(a.columns) == list(b.columns) and len(a) == len(b) > 0
        for c in a.columns:
            if a[c].dtype.kind == "f":
                rt = 1e-9 if (c.startswith("q") or name == "naive") else 1e-12
                np.testing.assert_allclose(a[c].to_numpy(), b[c].to_numpy(), rtol=rt, atol=1e-300, equal_nan=True)
            else:
                assert a[c].tolist() == b[c].tolist(), (name, c)


def _run(src, a, **kw):
    return engine.run(src, [a], **kw)[a.name]


@pytest.mark.parametrize("by", BYS)
def test_two_pass_equals_exact(cell, by):
    src = TableSource(cell)
    exact = _run(src, UsageDistribution(by=by, bucket_s=1800, strategy="exact"), partitions=3)
    if "time" in by:
        assert exact["quantiles"]["q0"].isna().any()  # a group without weight (NaN row)
    # bracket_k=8: every group with weight is a bounded summary in the first pass (wide brackets,
    # many pieces); 64 keeps the small groups exact there (closed brackets); auto = the default
    for k, kw in ((8, dict(partitions=7)), (64, dict(partitions=4, scheduler="threads", split_every=2)), (0, {})):
        a = UsageDistribution(by=by, bucket_s=1800, strategy="auto", exact_max_windows=0, bracket_k=k)
        got = _run(src, a, **({"partitions": 3} | kw))
        assert_same(got, exact)
        info = got["info"].iloc[0]
        assert info["strategy"] == "exact-two-pass" and info["strategy_option"] == "auto"
        assert info["max_cdf_error_bound"] == 0 and info["k"] == a.first_pass_k
        assert (got["quantiles"]["cdf_error_bound"] == 0).all()
        if k == 8:
            assert "strategy exact-two-pass (exact)" in a.summary(got)


def test_second_pass_in_blocks_of_windows(cell, monkeypatch):
    """A level's windows in blocks of 37 (``BLOCK_ROWS``: groups cut between blocks): the same tables."""
    monkeypatch.setattr(tp, "BLOCK_ROWS", 37)
    src = TableSource(cell)
    by = ("machine", "time")
    want = _run(src, UsageDistribution(by=by, bucket_s=1800, strategy="exact"), partitions=2)
    assert_same(_run(src, UsageDistribution(by=by, bucket_s=1800, strategy="exact-two-pass", bracket_k=8)), want)


@pytest.mark.parametrize("backend_name", ["generic", "device"])
def test_two_pass_on_the_gpu_shaped_backends(cell, backend_name, monkeypatch):
    """The partials of both passes on the generic backend (NumPy shaped like CuPy) and on the
    device-shaped one (arrays that refuse host operands): the cpu's tables."""
    from device_backend import DEVICE, resolve_gpu_to_device
    from generic_backend import GENERIC

    be = {"generic": GENERIC, "device": DEVICE}[backend_name]
    if be is DEVICE:
        resolve_gpu_to_device(monkeypatch)  # its arrays belong to the "gpu" backend
    src = TableSource(cell)
    by = ("machine", "time")
    a = UsageDistribution(by=by, bucket_s=1800, strategy="exact-two-pass", bracket_k=8)
    want = _run(src, a, partitions=3)
    assert_same(_run(src, a, partitions=3, backend=be), want)
    assert_same(want, _run(src, UsageDistribution(by=by, bucket_s=1800, strategy="exact"), partitions=2))


def test_auto_is_exact_at_any_size_and_bounded_is_a_choice(cell):
    src = TableSource(cell)
    n = cell["instance_usage"].num_rows
    for by in (("tier",), ("collection",), ("instance", "time")):
        for budget, want in ((n, "exact"), (n - 1, "exact-two-pass")):
            a = UsageDistribution(by=by, exact_max_windows=budget)
            assert bool(a.prerequisites(src)) == (want == "exact-two-pass")
            info = _run(src, a, partitions=2)["info"].iloc[0]
            assert info["strategy"] == want and info["strategy_option"] == "auto"
    b = UsageDistribution(strategy="bounded", exact_max_windows=0, k=64)
    assert not b.prerequisites(src)
    info = _run(src, b, partitions=3)["info"].iloc[0]
    assert info["strategy"] == "bounded" and info["max_cdf_error_bound"] > 0


def test_auto_on_a_device_has_no_row_limit_only_its_memory(cell, monkeypatch):
    """The row limit of ``auto``'s exact strategy was measured on 2 host cores (a tier inverted on
    one); on an H200 one pass took 2.10 s where auto's two passes took 8.87 s (3.05e7 windows by
    tier, warm).  A run on a device has no row limit: only its memory budget, the device's free
    memory, bounds the exact strategy; an ``exact_max_windows`` given still decides.  The engine
    and a study say so to the analysis (on the device-shaped backend under the gpu's name); the
    info table gives the limit in force (-1: none)."""
    from device_backend import DEVICE_GPU, mark_partials_gpu, resolve_gpu_to_device

    import gpuclust
    from gpuclust._memory import run_memory
    from gpuclust.analyses import usage_distribution as ud

    class Rows:
        def num_rows(self, table: str) -> int:
            return 30_529_240

    a, rows = UsageDistribution(), Rows()
    with run_memory(200 << 30, device=True):
        assert a.exact_rows_limit == -1 and a.resolved_strategy(rows) == "exact"
        assert UsageDistribution(exact_max_windows=5).resolved_strategy(rows) == "exact-two-pass"
    with run_memory(30_529_240 * a.exact_bytes_per_row - 1, device=True):  # its peak would not fit
        assert a.resolved_strategy(rows) == "exact-two-pass"
    with run_memory(200 << 30):  # on the host: the row limit
        assert a.exact_rows_limit == 2_000_000 and a.resolved_strategy(rows) == "exact-two-pass"

    monkeypatch.setattr(ud, "EXACT_MAX_WINDOWS", (10, 10))  # the small cell is "large" on the host
    src = TableSource(cell)
    host = _run(src, a, partitions=2)["info"].iloc[0]
    assert (host["strategy"], host["exact_max_windows"]) == ("exact-two-pass", 10)
    resolve_gpu_to_device(monkeypatch)
    mark_partials_gpu(monkeypatch)
    dev = _run(src, a, partitions=2, backend=DEVICE_GPU)["info"].iloc[0]
    assert (dev["strategy"], dev["exact_max_windows"]) == ("exact", -1)
    with gpuclust.open(src, backend=DEVICE_GPU) as study:
        assert study.run([a])[a.name]["info"].iloc[0]["strategy"] == "exact"
    with gpuclust.open(src, backend="cpu") as study:
        assert study.run([a])[a.name]["info"].iloc[0]["strategy"] == "exact-two-pass"


def test_auto_on_cluster_workers_devices_keeps_within_the_least_of_their_memory(cell, monkeypatch):
    """A device study on a cluster's workers (an in-process ``distributed.LocalCluster``, sharing
    the device-shaped backend) decides as a device run, within the least free device memory of its
    workers (a tree's merged partial reaches one): on the H200 the dask step took two passes
    under the host limit and did not finish inside the check.  Too little there: two passes."""
    distributed = pytest.importorskip("distributed")
    from device_backend import DEVICE_GPU, mark_partials_gpu, resolve_gpu_to_device

    import gpuclust
    from gpuclust.analyses import usage_distribution as ud
    from gpuclust.engine import study_workers

    monkeypatch.setattr(ud, "EXACT_MAX_WINDOWS", (10, 10))  # the small cell is "large" on the host
    resolve_gpu_to_device(monkeypatch)
    mark_partials_gpu(monkeypatch)
    a, src = UsageDistribution(), TableSource(cell)
    want = _run(src, UsageDistribution(strategy="exact"), partitions=2)
    with (
        distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=False, dashboard_address=":0") as c,
        distributed.Client(c) as client,
    ):
        with gpuclust.open(src, backend=DEVICE_GPU, partitions=2, scheduler=client) as study:
            got = study.run([a])[a.name]
            assert (got["info"].iloc[0]["strategy"], got["info"].iloc[0]["exact_max_windows"]) == ("exact", -1)
            assert_same(got, want)
            rows = cell["instance_usage"].num_rows
            monkeypatch.setattr(study_workers, "device_free_bytes", lambda be: rows * a.exact_bytes_per_row - 1)
            b = UsageDistribution(k=100)  # (another analysis: the study caches a context per analysis)
            assert study.run([b])[b.name]["info"].iloc[0]["strategy"] == "exact-two-pass"


# --------------------------------------------------------------------------------------------
# memory: the second pass grows with the knots inside the brackets, not with the windows
# --------------------------------------------------------------------------------------------
def pool_cell(n: int, seed: int = 3):
    """``n`` five-minute windows on 3 machines, each window's percentiles one of 30 vectors (trace
    percentiles repeat: idle and saturated windows, float32 values); weights vary."""
    rng = np.random.default_rng(seed)
    pool = np.sort(rng.gamma(0.7, 1.0, (30, 20)), axis=1).astype(np.float32).astype(np.float64)
    pool[:8, :6] = 0.0
    q = pool[rng.integers(0, 30, n)]
    start = rng.integers(0, 10 * 3_600_000_000, n)
    cols = {
        "start_time": start,
        "end_time": start + 300_000_000,
        "collection_id": rng.integers(1, 50, n),
        "instance_index": np.zeros(n, np.int64),
        "machine_id": rng.integers(1, 4, n),
        "alloc_collection_id": np.zeros(n, np.int64),
        "sample_rate": rng.choice([1.0, 0.5, 0.25], n),
    }
    from gpuclust.schema import CPU_PERCENTILE_COLUMNS_SORTED

    cols.update({c: q[:, k] for k, c in enumerate(CPU_PERCENTILE_COLUMNS_SORTED)})
    return {"instance_usage": table("instance_usage", cols)}


def _merged_partial(a, tables, parts):
    src = TableSource(tables)
    ctx = context_of(a, src, partitions=parts)
    t = tables["instance_usage"]
    cpu = get_backend("cpu")
    cuts = np.linspace(0, t.num_rows, parts + 1).astype(int)
    out = a.empty(cpu)
    for lo, hi in zip(cuts[:-1], cuts[1:], strict=True):
        s = t.slice(lo, hi - lo)
        out = a.kinds.merge(out, to_host(a.partial({c: column_to_numpy(s.column(c)) for c in a.columns}, ctx, cpu)))
    return out


def _nbytes(obj) -> int:
    if isinstance(obj, dict):
        return sum(_nbytes(v) for v in obj.values())
    return int(getattr(obj, "nbytes", 0))


def test_second_pass_partial_grows_with_the_knots_inside_brackets_not_windows(monkeypatch):
    """4x the windows with the same distribution (each window 4 times): the same second-pass
    partial (the same brackets, the same distinct pieces), where the one-pass partial is 4x."""
    two = UsageDistribution(by="machine", strategy="exact-two-pass")
    one = UsageDistribution(by="machine", strategy="exact")
    small = pool_cell(2000)
    big = {"instance_usage": pa.concat_tables([small["instance_usage"]] * 4)}
    tp_small, tp_big = (_merged_partial(two, c, 1)["tp"] for c in (small, big))
    ex_small, ex_big = (_nbytes(_merged_partial(one, c, 1)["ms"]) for c in (small, big))
    assert tp_small["state"]["p_pid"].shape[0] > 0  # knots inside the brackets
    assert _nbytes(tp_big) <= 1.5 * _nbytes(tp_small)
    assert ex_big >= 3.5 * ex_small  # the one-pass exact partial carries every window
    assert _nbytes(tp_big) < ex_big / 10
    # over 4 partitions, merges sum the copies of a piece (here from the first merges on)
    monkeypatch.setattr(tp, "SUM_PIECES_AT", 0)
    many = _merged_partial(two, big, 4)["tp"]
    assert many["state"]["p_pid"].shape[0] <= 3 * tp_big["state"]["p_pid"].shape[0]
    src = TableSource(big)
    assert_same(_run(src, two, partitions=4), _run(src, one, partitions=2))


def test_merges_sum_identical_pieces_once_they_have_doubled(monkeypatch):
    monkeypatch.setattr(tp, "SUM_PIECES_AT", 0)
    rng = np.random.default_rng(5)
    q = np.sort(rng.gamma(0.7, 1.0, (300, 20)), axis=1)
    w, keys = rng.random(300) + 0.5, np.zeros(300, np.int64)
    lv = np.array([0.1, 0.5, 0.9])
    br = tp.brackets(hs.leaf(q, w, keys, 16, repaired=True), lv)
    one = tp.second_partial(np, get_backend("cpu").ops, q, w, keys, br)
    d = int(one["p_pid"].shape[0])
    assert d > 10 and one["p_summed"] == d
    acc = tp.empty_state()
    sizes = []
    for _ in range(16):
        acc = tp.merge_state(acc, one)
        sizes.append(int(acc["p_pid"].shape[0]))
    assert max(sizes) <= 3 * d and min(sizes[1:]) >= d  # summed now and then, never one copy per merge
    np.testing.assert_allclose(tp.resolve(acc, br, lv, CPU), tp.resolve(one, br, lv, CPU), rtol=1e-12)
    np.testing.assert_allclose(acc["f_lo"], 16 * one["f_lo"], rtol=1e-12)


# --------------------------------------------------------------------------------------------
# the second-pass math alone, against the one-pass exact finalize
# --------------------------------------------------------------------------------------------
@settings(max_examples=examples(25), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    seed=st.integers(0, 2**32 - 1),
    k=st.sampled_from([2, 5, 16, 64]),
    n=st.integers(1, 120),
    parts=st.integers(1, 4),
)
def test_resolve_equals_the_exact_inversion(seed, k, n, parts):
    rng = np.random.default_rng(seed)
    q = np.sort(rng.gamma(0.7, 1.0, (n, 20)), axis=1) * np.exp(rng.normal(0, 2, n))[:, None]
    q[rng.random(n) < 0.3, :7] = 0.0  # point masses at 0
    one = rng.random(n) < 0.1
    q[one] = q[one, :1]  # one-point windows
    q[:, 12:15] = np.where(rng.random((n, 1)) < 0.2, q[:, 12:13], q[:, 12:15])  # point masses inside
    q = np.maximum.accumulate(q.astype(np.float32).astype(np.float64), axis=1)
    w = rng.choice([300.0, 30.0, 0.0, 1e-3, 7e5], n)
    keys = rng.integers(0, 4, n).astype(np.int64) * (2**40 + 1)
    lv = np.array([0.0, 0.005, 0.25, 0.5, 0.9, 0.99, 1.0])
    cuts = np.sort(rng.integers(0, n + 1, parts - 1))
    pieces = np.split(np.arange(n), cuts)
    h = hs.empty(k)
    for r in pieces:
        o = r[np.argsort(keys[r], kind="stable")]
        h = hs.merge(h, hs.leaf(q[o], w[o], keys[o], k, repaired=True))
    br = tp.brackets(h, lv)
    state = tp.empty_state()
    cpu = get_backend("cpu")
    for r in pieces:
        o = r[np.argsort(keys[r], kind="stable")]
        state = tp.merge_state(state, tp.second_partial(np, cpu.ops, q[o], w[o], keys[o], br))
    got = tp.resolve(state, br, lv, CPU)
    want = ms.finalize(ms.exact_partial(q, w, keys), lv)
    assert br["key"].tolist() == want["key"].tolist()
    exact = want["quantiles"]
    close = np.isclose(got, exact, rtol=1e-9, atol=1e-300, equal_nan=True)
    # where a quantile is ill-conditioned (almost no mass near it, so the last bits of F move x:
    # a median between a heavy point mass at 0 and a heavy window further up), the answer is to be
    # the exact quantile of a level within 1e-12 of p, by the reference CDF, as in docs/analyses/mixture.md
    for gi, li in zip(*np.nonzero(~close), strict=True):
        sel = keys == want["key"][gi]
        x = got[gi, li : li + 1]
        f, fl = (float(mix_ref.mixture_cdf_np(q[sel], w[sel], x, left=left)[0]) for left in (False, True))
        assert f >= lv[li] - 1e-12 and fl <= lv[li] + 1e-12, (gi, lv[li], got[gi, li], exact[gi, li], f, fl)


@pytest.mark.parametrize(("by", "refine"), [(("tier",), 0), (("machine",), 0), (("machine",), 1)])
def test_on_a_device_the_work_does_not_grow_with_the_windows(by, refine, monkeypatch):
    """On a device (a gpu run on the device-shaped backend, one partition) a
    level's windows are one step of the second pass (:func:`tp.step_rows`), and of a refinement
    pass, and the quantiles are resolved where the second pass's state is: 4x the windows make
    the same launches and syncs, only the result tables' bytes come back, and the tables are the cpu's."""
    from device_backend import DEVICE_GPU, counting_device_work, mark_partials_gpu, resolve_gpu_to_device, result_bytes

    monkeypatch.setattr(rf, "PIECE_BUDGET", 0)  # the refinement pass cuts, whatever the pieces
    a = UsageDistribution(by=by, bucket_s=1800, strategy="exact-two-pass", bracket_k=8, refine=refine)
    cells = {n: TableSource(make_cell(5, n_windows=n, n_instances=n // 8)) for n in (2000, 8000)}
    want = {n: _run(src, a, partitions=1) for n, src in cells.items()}
    resolve_gpu_to_device(monkeypatch)  # the gpu backend: the device-shaped one, counted
    monkeypatch.setattr(tp, "BLOCK_ROWS", 1000)  # the host's steps: a device's are not bound by them
    mark_partials_gpu(monkeypatch)
    work = {}
    for n, src in cells.items():
        with counting_device_work() as w:
            got = _run(src, a, partitions=1, backend=DEVICE_GPU)
        assert_same(got, want[n])
        assert got["info"]["strategy"].iloc[0] == "exact-two-pass"
        work[n] = {**w, "result": result_bytes(got)}
    small, large = work[2000], work[8000]
    assert large["ops"] > 1000  # the second pass ran, a level at a time
    for kind in ("ops", "kernels", "syncs"):
        assert large[kind] == small[kind], (kind, small, large)
    growth = max(1.0, large["result"] / small["result"])
    assert large["d2h_bytes"] <= 1.2 * growth * small["d2h_bytes"] + (64 << 10), (small, large)


def test_the_first_pass_inverts_its_exact_groups_a_range_at_a_time(monkeypatch):
    """The first pass's small groups (kept exact) are inverted a range of groups at a time
    (``EXACT_ROWS`` windows, or one group): the same brackets, bit for bit."""
    rng = np.random.default_rng(3)
    n = 6000
    keys = np.sort(rng.integers(0, 600, n)).astype(np.int64) * 7
    q = np.sort(rng.gamma(0.7, 1.0, (n, 20)), axis=1)
    q[rng.random(n) < 0.2, :6] = 0.0
    w = rng.choice([1.0, 30.0, 0.0, 300.0], n)
    h = hs.empty(256)
    for r in np.array_split(np.arange(n), 3):
        h = hs.merge(h, hs.leaf(q[r], w[r], keys[r], 256, repaired=True))
    lv = np.array([0.0, 0.1, 0.5, 0.9, 0.99, 1.0])
    assert h["exact"]["row_key"].shape[0] > 1000  # many windows in exact groups
    want = tp.brackets(h, lv)
    for rows in (1000, 7):
        monkeypatch.setattr(tp, "EXACT_ROWS", rows)
        got = tp.brackets(h, lv)
        for f in ("key", "lo", "hi", "est"):
            np.testing.assert_array_equal(got[f], want[f])


@settings(max_examples=examples(25), deadline=None)
@given(seed=st.integers(0, 2**32 - 1), n=st.integers(1, 300))
def test_windows_wholly_beside_their_bracket_are_summed_without_their_knots(seed, n):
    # on the host a level's windows wholly below (last knot < lo) or above (first knot > hi) their
    # bracket take ww or 0 directly: the same bits as comparing every knot, brackets at knots,
    # between them and beyond them, point masses (equal knots) and ends equal to a bracket's
    rng = np.random.default_rng(seed)
    pool = np.round(rng.gamma(0.7, 1.0, 40), 1)  # few distinct values: knots equal to bracket ends
    y = np.sort(rng.choice(pool, (n, 20)), axis=1)
    ww = rng.choice([0.5, 1.0, 3e5, 7e-3], n)
    ends = np.sort(rng.choice(np.concatenate([pool, [-1.0, 99.0]]), (n, 2)), axis=1)
    lo, hi = ends[:, 0], ends[:, 1]
    side = rng.integers(0, 5, n)  # brackets just past a row's last knot, at it, at its first, before it
    lo = np.where(side == 1, y[:, 19] + 0.1, np.where(side == 2, y[:, 19], lo))
    hi = np.where(side == 1, lo + 1.0, np.where(side == 2, lo + 0.5, hi))
    hi = np.where(side == 3, y[:, 0], np.where(side == 4, y[:, 0] - 0.1, hi))
    lo = np.where(side == 3, hi - 0.5, np.where(side == 4, hi - 1.0, lo))
    sel = np.arange(0, 2 * n, 2)  # the rows a level selects: every other one of the partition's
    qr = np.empty((2 * n, 20))
    qr[sel], qr[sel + 1] = y, y[::-1] + 1.0
    for s in (sel, None):
        q = qr if s is not None else y
        edges = (np.ascontiguousarray(q[:, 0]), np.ascontiguousarray(q[:, 19]))
        got, r, yr = tp._level_rows(np, q, s, ww, lo, hi, edges=edges)
        want, r_all, yr_all = tp._level_rows(np, q, s, ww, lo, hi, edges=None)
        full, inside = tp._level_rows_of(np, y, ww, lo, hi)
        assert np.array_equal(r, r_all) and np.array_equal(r, np.flatnonzero(inside))
        assert (yr is None) == (yr_all is None) == (r.shape[0] == 0)
        assert yr is None or (np.array_equal(yr, yr_all) and np.array_equal(yr, y[r]))
        for g, w, f in zip(got, want, full, strict=True):
            assert g.dtype == w.dtype and np.array_equal(g, w) and np.array_equal(np.signbit(g), np.signbit(w))
            assert np.array_equal(w, f) and np.array_equal(np.signbit(w), np.signbit(f))
    beside = (y[:, 19] < lo) | (y[:, 0] > hi)
    assert beside.any() or not np.isin(side, (1, 4)).any()  # the shortcut is exercised


@pytest.mark.parametrize("by", [("machine",), ("machine", "time")])
def test_partials_on_a_device_merge_there(cell, by, monkeypatch):
    """On a device (the device-shaped backend), both passes' partials of several partitions merge
    where they are (issue 34: a cell's first-pass summaries by machine merged on the host cost
    ~7 ms a machine a merge on this VM): the copies out of the device are those of a run in one
    partition but for each partition's few counts, whatever the number of partitions (moved to
    the host to merge, the partials in 4 partitions copied out 1.35 MB against 5.5 kB), and the
    tables are the cpu's."""
    from device_backend import DEVICE_GPU, counting_device_work, resolve_gpu_to_device

    src = TableSource(cell)
    a = UsageDistribution(by=by, bucket_s=1800, strategy="exact-two-pass", bracket_k=8)
    want = _run(src, a, partitions=4)
    resolve_gpu_to_device(monkeypatch)
    d2h = {}
    for parts in (1, 4):
        with counting_device_work() as w:
            got = _run(src, a, partitions=parts, backend=DEVICE_GPU)
        d2h[parts] = w["d2h_bytes"]
        assert_same(got, want)
    assert 0 < d2h[4] <= 2 * d2h[1], d2h
