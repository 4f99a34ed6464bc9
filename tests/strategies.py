"""Hypothesis strategies and helpers that build canonical tables, including the ugly cases.

Ugly cases covered: NULL capacity (and NULL cpu with non-NULL memory), capacity changes (UPDATE),
time 0 and 2^63-1, ids above 2^53 and above 2^32, windows crossing hour boundaries and spanning
several hours, zero-length windows, windows shorter than 5 minutes, alloc rows (alloc_collection_id
non-zero), NULL alloc_collection_id, NULL avg usage, NULL / negative priorities, instances with no
event row, and event rows inside allocs.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from hypothesis import settings
from hypothesis import strategies as st

from gpuclust.dataset import new_manifest, write_json_atomic
from gpuclust.schema import CPU_PERCENTILE_COLUMNS_SORTED as _SORTED_P
from gpuclust.schema import SCHEMAS, TABLES, TIME_AFTER_TRACE

HOUR = 3_600_000_000
BIG_IDS = [1, 2, 3, 2**32 + 7, 2**53 + 1, 2**62 + 12345, 2**63 - 2]

#: The environment variable that names the Hypothesis profile (``ci``, ``dev`` or ``thorough``;
#: tests/conftest.py registers them and loads ``ci`` when it is unset).
PROFILE_ENV = "GPUCLUST_HYPOTHESIS_PROFILE"
#: The ``max_examples`` of the profile under which a test runs the count written at it (``dev``).
EXAMPLES_AT = 100
#: The fewest examples :func:`examples` scales a count down to (a smaller count stays as written).
MIN_EXAMPLES = 20


def examples(n: int, least: int = MIN_EXAMPLES) -> int:
    """A test's ``n`` examples under the loaded Hypothesis profile: scaled by the profile's
    ``max_examples`` over :data:`EXAMPLES_AT` (``dev``: ``n``; ``ci``: fewer, but never fewer
    than ``least`` or ``n``; ``thorough``: more).  Write ``@settings(max_examples=examples(n))``;
    a lower ``least`` is for a test run once per analysis and option (the conformance suite), whose
    examples add up over the registry."""
    return max(round(n * settings.default.max_examples / EXAMPLES_AT), min(n, least))


def table(name: str, cols: dict[str, Any]) -> pa.Table:
    """A canonical table from column lists; missing nullable columns are NULL."""
    schema = SCHEMAS[name]
    n = len(next(iter(cols.values()))) if cols else 0
    arrays = []
    for f in schema:
        if f.name in cols:
            arrays.append(pa.array(cols[f.name], type=f.type))
        else:
            assert f.nullable, f.name
            arrays.append(pa.nulls(n, type=f.type))
    return pa.Table.from_arrays(arrays, schema=schema)


def write_dataset(
    path: Path,
    tables: dict[str, pa.Table],
    *,
    files: int = 1,
    row_group_size: int | None = None,
    tier_map: str | None = "notebook",
    trace_version: str = "v3",
) -> Path:
    """Write canonical tables as ``<table>/part-*.parquet`` plus a complete manifest."""
    path = Path(path)
    m = new_manifest(trace_version=trace_version, tier_map=tier_map, complete=True, cell="test")
    for name in TABLES:
        t = tables.get(name, SCHEMAS[name].empty_table())
        d = path / name
        d.mkdir(parents=True, exist_ok=True)
        n = t.num_rows
        k = max(1, min(files, n)) if n else 1
        edges = np.linspace(0, n, k + 1).round().astype(int)
        rel = []
        for j in range(k):
            f = f"{name}/part-{j:05d}.parquet"
            pq.write_table(
                t.slice(edges[j], edges[j + 1] - edges[j]), path / f, row_group_size=row_group_size or max(1, n)
            )
            rel.append(f)
        m["tables"][name] = {"rows": n, "files": rel}
    write_json_atomic(path / "manifest.json", m)
    return path


times = st.one_of(
    st.integers(0, 800 * HOUR),
    st.sampled_from([0, 600_000_000, HOUR - 1, HOUR, 2 * HOUR + 1]),
)
cap = st.one_of(st.none(), st.sampled_from([0.25, 0.5, 0.5, 1.0, -0.0, 0.0]), st.floats(0, 1, width=32))


_MACHINE_ROWS = st.integers(1, 3)
_MACHINE_TIME = st.sampled_from([0, 1, 2**40, TIME_AFTER_TRACE])
_MACHINE_UPDATE = st.sampled_from([2, 3])


@st.composite
def machine_events(draw: Any, max_machines: int = 6) -> pa.Table:
    ids = draw(st.lists(st.sampled_from(BIG_IDS + [10, 11, 12]), min_size=0, max_size=max_machines, unique=True))
    rows: dict[str, list[Any]] = {k: [] for k in ("time", "machine_id", "type", "cap_cpu", "cap_mem")}
    for mid in ids:
        for k in range(draw(_MACHINE_ROWS)):
            rows["time"].append(draw(_MACHINE_TIME))
            rows["machine_id"].append(mid)
            rows["type"].append(1 if k == 0 else draw(_MACHINE_UPDATE))
            rows["cap_cpu"].append(draw(cap))
            rows["cap_mem"].append(draw(cap))
    return table("machine_events", rows)


#: cell()'s strategies that depend on nothing drawn, built once (a strategy built inside the draw
#: loop is validated again on every draw: most of cell()'s time; the same draws either way).
_EVENTS_PER_INSTANCE = st.integers(0, 3)
_EVENT_TYPE = st.sampled_from([0, 3, 6])
_PRIORITY = st.one_of(
    st.sampled_from([0, 99, 100, 115, 116, 119, 120, 200, 360, 450]), st.none(), st.just(-1), st.integers(0, 500)
)
_EVENT_ALLOC = st.one_of(st.none(), st.just(0), st.just(0), st.just(2**40 + 3))
_WINDOW_KIND = st.sampled_from(["5min", "5min", "5min", "short", "zero", "long", "cross"])
_SHORT = st.integers(1, 299_999_999)
_LONG = st.integers(300_000_000, 5 * HOUR)
_WINDOW_ALLOC = st.one_of(st.none(), st.just(0), st.just(0), st.just(0), st.just(2**33 + 1))
_AVG = st.one_of(st.none(), st.floats(0, 2, width=32))


@cache
def _event_machine(m: int) -> st.SearchStrategy[int | None]:
    """An event row's machine: its instance's ``m`` (twice as likely), NULL or 0."""
    return st.one_of(st.just(m), st.just(m), st.none(), st.just(0))


@st.composite
def cell(draw: Any, max_instances: int = 8, max_windows: int = 30) -> dict[str, pa.Table]:
    """A small cell: machine_events, instance_events and instance_usage that join in ugly ways (and
    collection_events with the instance events' collection-level columns)."""
    me = draw(machine_events())
    machines = me.column("machine_id").to_pylist() or [5]
    inst = draw(
        st.lists(
            st.tuples(st.sampled_from(BIG_IDS), st.integers(0, 3), st.sampled_from(machines)),
            min_size=0,
            max_size=max_instances,
            unique=True,
        )
    )
    ev: dict[str, list[Any]] = {
        k: []
        for k in ("time", "type", "collection_id", "instance_index", "machine_id", "priority", "alloc_collection_id")
    }
    for c, i, m in inst:
        for _ in range(draw(_EVENTS_PER_INSTANCE)):  # 0 events: the instance has usage but no event row
            ev["time"].append(draw(times))
            ev["type"].append(draw(_EVENT_TYPE))
            ev["collection_id"].append(c)
            ev["instance_index"].append(i)
            ev["machine_id"].append(draw(_event_machine(m)))
            ev["priority"].append(draw(_PRIORITY))
            ev["alloc_collection_id"].append(draw(_EVENT_ALLOC))
    us: dict[str, list[Any]] = {
        k: []
        for k in (
            "start_time",
            "end_time",
            "collection_id",
            "instance_index",
            "machine_id",
            "alloc_collection_id",
            "avg_cpu",
            "avg_mem",
        )
    }
    if inst:
        which = st.sampled_from(inst)
        for _ in range(draw(st.integers(0, max_windows))):
            c, i, m = draw(which)
            s = draw(times)
            kind = draw(_WINDOW_KIND)
            length = {
                "5min": 300_000_000,
                "short": draw(_SHORT),
                "zero": 0,
                "long": draw(_LONG),
                "cross": 300_000_000,
            }[kind]
            if kind == "cross":
                s = (s // HOUR + 1) * HOUR - draw(_SHORT)
            us["start_time"].append(s)
            us["end_time"].append(s + length)
            us["collection_id"].append(c)
            us["instance_index"].append(i)
            us["machine_id"].append(m)
            us["alloc_collection_id"].append(draw(_WINDOW_ALLOC))
            us["avg_cpu"].append(draw(_AVG))
            us["avg_mem"].append(draw(_AVG))
    coll = {k: ev[k] for k in ("time", "type", "collection_id", "priority", "alloc_collection_id")}
    return {
        "machine_events": me,
        "instance_events": table("instance_events", ev),
        "instance_usage": table("instance_usage", us),
        "collection_events": table("collection_events", coll),
    }


def random_cell(
    seed: int, n_machines: int = 40, n_instances: int = 300, n_windows: int = 5000, *, measures: bool = False
) -> dict[str, pa.Table]:
    """A larger random cell (numpy RNG) for partition / dask / reference tests.  ``measures``: the
    usage windows also carry maxima, assigned memory, CPI / MAI, sample rates and percentile
    vectors, and the events requests and scheduling classes (for the analyses that read them:
    cpi, usage-distribution, peak-prediction, overcommit, usage-vs-request, data-quality), drawn after the rest from their own
    generator, so the other columns are those of the same cell without them."""
    rng = np.random.default_rng(seed)
    mids = rng.choice(np.array([*BIG_IDS, *range(100, 100 + n_machines)], dtype=np.int64), n_machines, replace=False)
    shapes = np.array([[0.5, 0.25], [0.25, 0.125], [1.0, 1.0], [0.5, 0.5]], dtype=np.float32)
    mrow = np.repeat(mids, 2)
    sh = shapes[rng.integers(0, len(shapes), mrow.size)]
    capc = [None if rng.random() < 0.05 else float(x) for x in sh[:, 0]]
    capm = [None if rng.random() < 0.05 else float(x) for x in sh[:, 1]]
    me = table(
        "machine_events",
        {
            "time": rng.integers(0, 2**40, mrow.size),
            "machine_id": mrow,
            "type": np.where(np.arange(mrow.size) % 2 == 0, 1, 3).astype(np.int8),
            "cap_cpu": capc,
            "cap_mem": capm,
        },
    )
    ic = rng.choice(np.array([3, 2**40 + 1, 2**53 + 3, 2**62 + 9], dtype=np.int64), n_instances)
    ii = rng.integers(0, 50, n_instances).astype(np.int32)
    im = rng.choice(mids, n_instances)
    k = rng.integers(0, 3, n_instances)  # events per instance (0 = no event row)
    er = np.repeat(np.arange(n_instances), k)
    prio = rng.choice(np.array([0, 25, 100, 103, 116, 119, 120, 200, 360, -1]), er.size)
    ev = table(
        "instance_events",
        {
            "time": rng.integers(0, 700 * HOUR, er.size),
            "type": np.full(er.size, 3, np.int8),
            "collection_id": ic[er],
            "instance_index": ii[er],
            "machine_id": im[er],
            "priority": [None if rng.random() < 0.03 else int(p) for p in prio],
            "alloc_collection_id": [None if r < 0.3 else (0 if r < 0.95 else 2**35) for r in rng.random(er.size)],
        },
    )
    w = rng.integers(0, n_instances, n_windows)
    start = rng.integers(0, 48 * HOUR, n_windows)
    length = rng.choice(np.array([300_000_000, 300_000_000, 120_000_000, 0, 2 * HOUR + 17]), n_windows)
    us = table(
        "instance_usage",
        {
            "start_time": start,
            "end_time": start + length,
            "collection_id": ic[w],
            "instance_index": ii[w],
            "machine_id": im[w],
            "alloc_collection_id": [None if r < 0.3 else (0 if r < 0.9 else 2**35 + 1) for r in rng.random(n_windows)],
            "avg_cpu": [
                None if r < 0.02 else float(v)
                for r, v in zip(rng.random(n_windows), rng.random(n_windows), strict=False)
            ],
            "avg_mem": rng.random(n_windows).astype(np.float32),
        },
    )
    if measures:
        ev, us = _with_measures(np.random.default_rng([seed, 1]), ev, us)
    coll = ev.select(["time", "type", "collection_id", "priority", "alloc_collection_id"])
    coll = table("collection_events", {k: coll.column(k).to_pylist() for k in coll.column_names})
    return {"machine_events": me, "instance_events": ev, "instance_usage": us, "collection_events": coll}


def _with_measures(rng: np.random.Generator, ev: pa.Table, us: pa.Table) -> tuple[pa.Table, pa.Table]:
    """``random_cell``'s events with scheduling classes and its windows with the measures (a few
    NULLs in each; percentile vectors sorted, some idle, some NULL)."""
    n = us.num_rows
    avg = np.nan_to_num(us.column("avg_cpu").to_numpy(zero_copy_only=False).astype(float))
    q = np.sort(rng.gamma(0.7, 1.0, (n, 20)), axis=1) * np.exp(rng.normal(-2, 1.0, n))[:, None]
    q[rng.random(n) < 0.2, :8] = 0.0
    null_q = rng.random(n) < 0.05

    def nulls(v: np.ndarray, share: float) -> list[float | None]:
        return [None if r < share else float(x) for r, x in zip(rng.random(v.size), v, strict=True)]

    cols = {
        "max_cpu": nulls(avg * (1 + rng.random(n)), 0.02),
        "max_mem": nulls(rng.random(n), 0.02),
        "assigned_mem": nulls(rng.random(n) * 0.5, 0.02),
        "cpi": nulls(np.exp(rng.normal(0.3, 0.4, n)), 0.1),
        "mai": nulls(np.exp(rng.normal(-6, 1.0, n)), 0.1),
        "sample_rate": nulls(rng.choice(np.array([1.0, 1.0, 0.5]), n), 0.02),
        **{c: [None if z else float(x) for z, x in zip(null_q, q[:, k], strict=True)] for k, c in enumerate(_SORTED_P)},
    }
    for c, v in cols.items():
        us = _set(us, c, v)
    m = ev.num_rows
    ev = _set(ev, "req_cpu", nulls(rng.gamma(1.0, 0.05, m), 0.03))
    ev = _set(ev, "req_mem", nulls(rng.gamma(1.0, 0.03, m), 0.03))
    return _set(ev, "scheduling_class", rng.integers(0, 4, m).tolist()), us


def _set(t: pa.Table, name: str, values: list[Any]) -> pa.Table:
    i = t.schema.get_field_index(name)
    return t.set_column(i, t.schema.field(i), pa.array(values, type=t.schema.field(i).type))


#: Columns that say how a run went on its backend, not what it found: usage-distribution's row
#: limit of ``auto``'s exact strategy in force (none, -1, in a run on a device).
HOW_IT_RAN = {("usage-distribution", "info", "exact_max_windows")}


def assert_results_same(r1: dict[str, Any], r2: dict[str, Any], rtol: float = 1e-12) -> None:
    """Two ``run`` results ({analysis: {table: DataFrame or Arrow table}}) are the same: names,
    columns, lengths; float columns to ``rtol`` (NaN where NaN), others exactly (but
    :data:`HOW_IT_RAN`)."""
    from gpuclust.tables import as_pandas

    assert r1.keys() == r2.keys()
    for k in r1:
        assert r1[k].keys() == r2[k].keys(), k
        for t in r1[k]:
            a, b = as_pandas(r1[k][t]).reset_index(drop=True), as_pandas(r2[k][t]).reset_index(drop=True)
            assert list(a.columns) == list(b.columns) and len(a) == len(b), (k, t)
            for c in a.columns:
                if (k.split("[")[0], t, c) in HOW_IT_RAN:
                    continue
                if a[c].dtype.kind == "f":
                    np.testing.assert_allclose(
                        a[c].to_numpy(), b[c].to_numpy(), rtol=rtol, atol=1e-300, equal_nan=True, err_msg=f"{k}/{t}/{c}"
                    )
                else:  # exact; a missing value (None / NaN) only matches a missing value
                    na, nb = a[c].isna().to_numpy(), b[c].isna().to_numpy()
                    assert (na == nb).all(), (k, t, c)
                    assert a[c][~na].tolist() == b[c][~nb].tolist(), (k, t, c)


# The documented bucket hash (docs/user/dataset.md, "Bucketed layout"), one row at a time in plain
# Python integers: the reference the bucketed layout and engine tests check gpuclust.layout with.
MASK = (1 << 64) - 1


def _mix(x: int) -> int:
    x ^= x >> 30
    x = (x * 0xBF58476D1CE4E5B9) & MASK
    x ^= x >> 27
    x = (x * 0x94D049BB133111EB) & MASK
    return x ^ (x >> 31)


def ref_bucket(key: tuple[int, ...], n: int) -> int:
    h = _mix((key[0] & MASK) ^ 0x2545F4914F6CDD1D)
    for c in key[1:]:
        h = _mix(h ^ (c & MASK))
    return h % n
