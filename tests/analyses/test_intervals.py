"""``gpuclust.analyses._intervals``: the pieces overcommit's interval partial is built from,
each against an independent reference.

* :func:`exact_prefix_sums` against exact rational prefix sums (``fractions.Fraction``);
* :func:`overlap_keyed` against the dense ``bucket_overlap`` op of the cpu backend (its own code:
  a bincount per first / last / inner bucket);
* :func:`distinct_keyed` against plain Python sets of instances per (machine, bucket);
* the running intervals and their sums on the GPU against the same on the CPU (marked ``gpu``).
"""

from __future__ import annotations

from collections import defaultdict
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from strategies import examples

from gpuclust.analyses._intervals import distinct_keyed, exact_prefix_sums, overlap_keyed, running_intervals
from gpuclust.backends import get_backend

CPU = get_backend("cpu")
HYP = settings(max_examples=examples(60), deadline=None, suppress_health_check=[HealthCheck.too_slow])
S = 1_000_000

MAGNITUDES = st.sampled_from([1e-12, 1e-3, 0.1, 1.0, 3.0, 1e6])


@st.composite
def value_rows(draw):
    """A row of values that partly cancel (each drawn value may come back negated later)."""
    n = draw(st.integers(1, 40))
    vals = []
    for _ in range(n):
        if vals and draw(st.booleans()):
            vals.append(-draw(st.sampled_from(vals)))
        else:
            vals.append(draw(st.floats(-1.0, 1.0, allow_nan=False)) * draw(MAGNITUDES))
    return np.array(vals, dtype=np.float64)


def test_exact_prefix_sums_of_a_subnormal_row() -> None:
    """A row bounded by a subnormal value scales by 2**1093, which as a float factor overflows."""
    v = np.array([[2.2253e-320, -2.2253e-320, 5e-324]])
    assert exact_prefix_sums(np, v, np.array([0, 1, 2])).tolist() == [[2.2253e-320, 0.0, 5e-324]]


@HYP
@given(rows=st.lists(value_rows(), min_size=1, max_size=3), data=st.data())
def test_exact_prefix_sums_against_rational_sums(rows, data):
    n = min(r.shape[0] for r in rows)
    v = np.stack([r[:n] for r in rows])
    at = np.array(sorted(data.draw(st.lists(st.integers(0, n - 1), min_size=1, max_size=n, unique=True))))
    got = exact_prefix_sums(np, v, at)
    for r in range(v.shape[0]):
        m = float(np.abs(v[r]).max())
        # each value loses at most what lies below 2**(E-62), E the exponent bounding the row
        lost = Fraction(2) ** (int(np.frexp(m)[1]) - 62) if m else Fraction(0)
        exact = np.cumsum([Fraction(float(x)) for x in v[r]]).tolist() if m else [Fraction(0)] * n
        for j, k in enumerate(at):
            want = exact[k]
            bound = lost * (k + 1) + abs(want) * Fraction(2) ** -52
            assert abs(Fraction(float(got[r, j])) - want) <= bound, (r, k, got[r, j], float(want))
            if want == 0:  # cancellation is exact: no drift left behind
                assert got[r, j] == 0.0


@st.composite
def pieces(draw):
    n_groups, n_buckets = draw(st.integers(1, 4)), draw(st.integers(1, 12))
    width = draw(st.sampled_from([7 * S, 300 * S]))
    origin = draw(st.sampled_from([0, 600 * S]))
    hi = origin + n_buckets * width
    n = draw(st.integers(0, 30))
    g = np.array([draw(st.integers(0, n_groups - 1)) for _ in range(n)], dtype=np.int64)
    ends = [sorted([draw(st.integers(origin, hi)), draw(st.integers(origin, hi))]) for _ in range(n)]
    s = np.array([a for a, _ in ends], dtype=np.int64).reshape(n)
    e = np.array([b for _, b in ends], dtype=np.int64).reshape(n)
    val = st.one_of(st.just(np.nan), st.sampled_from([0.0, 0.125, 0.3, 1.0, 7.5]))
    v = np.array([[draw(val) for _ in range(n)] for _ in range(2)], dtype=np.float64).reshape(2, n)
    inst = np.array([draw(st.integers(0, 3)) for _ in range(n)], dtype=np.int64)
    return dict(g=g, s=s, e=e, v=v, inst=inst, n_groups=n_groups, n_buckets=n_buckets, width=width, origin=origin)


@HYP
@given(p=pieces())
def test_overlap_keyed_against_dense_bucket_overlap(p):
    kw = dict(origin=p["origin"], width=p["width"], n_buckets=p["n_buckets"])
    key, sums = overlap_keyed(CPU, p["g"], p["s"], p["e"], p["v"], **kw)
    dense = CPU.ops.bucket_overlap(p["s"], p["e"], p["v"], p["g"].astype(np.int32), n_groups=p["n_groups"], **kw)
    seconds = CPU.ops.bucket_overlap(
        p["s"], p["e"], np.ones(p["s"].shape[0]), p["g"].astype(np.int32), n_groups=p["n_groups"], **kw
    ).reshape(-1)
    # the keys: exactly the (group, bucket) cells some piece overlaps for a positive time
    assert key.tolist() == np.flatnonzero(seconds > 0).tolist()
    flat = dense.reshape(2, -1)
    np.testing.assert_allclose(sums, flat[:, key], rtol=1e-12, atol=1e-9)
    rest = np.ones(flat.shape[1], bool)
    rest[key] = False
    assert (flat[:, rest] == 0).all()


@HYP
@given(p=pieces())
def test_distinct_keyed_against_sets(p):
    kw = dict(origin=p["origin"], width=p["width"], n_buckets=p["n_buckets"])
    key, count = distinct_keyed(CPU, p["g"], p["inst"], p["s"], p["e"], **kw)
    seen = defaultdict(set)
    for g, i, s, e in zip(p["g"].tolist(), p["inst"].tolist(), p["s"].tolist(), p["e"].tolist(), strict=True):
        for b in range(p["n_buckets"]):
            lo, hi = p["origin"] + b * p["width"], p["origin"] + (b + 1) * p["width"]
            if min(e, hi) > max(s, lo):
                seen[g * p["n_buckets"] + b].add(i)
    want = sorted(seen)
    assert key.tolist() == want
    assert count.tolist() == [len(seen[k]) for k in want]


def _events(seed: int, n_inst: int = 300, per: int = 8) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    n = n_inst * per
    nullmin = np.iinfo(np.int64).min
    c = rng.integers(1, n_inst // 3 + 2, n)
    return {
        "time": rng.integers(0, 4000 * S, n),
        "type": rng.choice([0, 3, 3, 4, 5, 6, 7, 8, 10, 10], n),
        "collection_id": c,
        "instance_index": rng.integers(0, 3, n),
        "machine_id": rng.choice([0, -1, 5, 9, 11, nullmin], n),
        "alloc_collection_id": rng.choice([0, 0, 0, nullmin, 77], n),
        "priority": np.where(rng.random(n) < 0.2, np.nan, rng.choice([0, 105, 117, 200], n).astype(float)),
        "req_cpu": np.where(rng.random(n) < 0.3, np.nan, rng.random(n)),
        "req_mem": np.where(rng.random(n) < 0.3, np.nan, rng.random(n) / 3),
    }


@pytest.mark.gpu
def test_running_intervals_and_sums_gpu_equal_cpu(gpu_backend):
    ev = _events(3)
    start, end = 100 * S, 3900 * S
    kw = dict(origin=0, width=300 * S, n_buckets=13)
    want = running_intervals(CPU, ev, start, end)
    got = running_intervals(gpu_backend, {k: gpu_backend.asarray(v) for k, v in ev.items()}, start, end)
    assert got.stats == want.stats and want.stats["pieces"] > 100
    for f in ("instance", "machine_id", "start", "end", "req_cpu", "req_mem", "priority"):
        np.testing.assert_array_equal(gpu_backend.to_host(getattr(got, f)), getattr(want, f), err_msg=f)
    code = np.abs(want.machine_id) % 4
    vals = np.stack([want.req_cpu, want.req_mem])
    k1, s1 = overlap_keyed(CPU, code, want.start, want.end, vals, **kw)
    x = gpu_backend.asarray
    k2, s2 = overlap_keyed(gpu_backend, x(code), x(want.start), x(want.end), x(vals), **kw)
    np.testing.assert_array_equal(gpu_backend.to_host(k2), k1)
    np.testing.assert_allclose(gpu_backend.to_host(s2), s1, rtol=1e-12)
    d1, c1 = distinct_keyed(CPU, code, want.instance, want.start, want.end, **kw)
    d2, c2 = distinct_keyed(gpu_backend, x(code), x(want.instance), x(want.start), x(want.end), **kw)
    np.testing.assert_array_equal(gpu_backend.to_host(d2), d1)
    np.testing.assert_array_equal(gpu_backend.to_host(c2), c1)


def test_machine_events_of_unknown_type_change_no_capacity() -> None:
    """A v3 machine event of type 0 (UNKNOWN, TRACE_NOTES: accepted at ingest) neither adds,
    removes nor resizes a machine: the pieces are those of the same events without it, and it is
    counted as ignored.  Worked by hand: machine 7 added at 10 s with 0.5 CPU, updated to 0.25 at
    30 s, removed at 40 s; the UNKNOWN at 20 s (0.9 CPU) and the one at 50 s (a re-add it is not)."""
    from gpuclust.analyses._intervals import capacity_intervals

    def cols(rows):
        t, m, typ, c = (np.array(x) for x in zip(*rows, strict=True))
        return {
            "time": t * S,
            "machine_id": m,
            "type": typ,
            "cap_cpu": c.astype(float),
            "cap_mem": np.full(len(t), 0.5),
        }

    known = [(10, 7, 1, 0.5), (30, 7, 3, 0.25), (40, 7, 2, np.nan)]
    unknown = [(20, 7, 0, 0.9), (50, 7, 0, 1.0)]
    got = capacity_intervals(cols(sorted(known + unknown)), 0, 100 * S)
    want = capacity_intervals(cols(known), 0, 100 * S)
    for f in ("machine_id", "start", "end", "cap_cpu"):
        assert getattr(got, f).tolist() == getattr(want, f).tolist(), f
    assert [(int(a) // S, int(b) // S, float(c)) for a, b, c in zip(got.start, got.end, got.cap_cpu, strict=True)] == [
        (10, 30, 0.5),
        (30, 40, 0.25),
    ]
    assert got.stats["machine_events_ignored"] == 2
